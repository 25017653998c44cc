// SegmentGenerator: ranges of a database row handed out from memory, the next range
// taken in the background (double buffering). The database's part — taking a range in
// one transaction — is a SegmentSource (ids/segment_source.hpp) from the backend's own
// folder, found by URL scheme (core/registry.cpp).
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <optional>
#include <thread>
#include <utility>

#include "distlock/error.hpp"
#include "distlock/ids.hpp"
#include "engine/scheme.hpp"
#include "engine/thread_annotations.hpp"
#include "engine/url.hpp"
#include "ids/next_call.hpp"
#include "ids/random_pool.hpp"
#include "ids/segment_source.hpp"

namespace distlock::ids {

using distlock::detail::AnnotatedMutex;
using distlock::detail::LockGuard;
using distlock::detail::UniqueLock;

namespace {

constexpr std::size_t kMaxTag = 128;
// Step of a row a generator creates when it asks for none (0: the row's step).
constexpr std::int64_t kDefaultSegmentStep = 1000;
// After a background take failed, the next one starts no sooner than this (a stopped
// server is not hammered while ids remain; a caller that ran out asks at once).
constexpr auto kRetryPause = std::chrono::milliseconds(100);

void check_step(std::int64_t step) {
  if (step < 0 || step > kMaxSegmentStep) {
    throw_error(make_error_code(errc::invalid_argument),
                fmt::format("segment step {} is outside [0, {}] (0: the row's step)", step, kMaxSegmentStep));
  }
}

void check_options(const SegmentOptions& o) {
  if (o.tag.empty() || o.tag.size() > kMaxTag) {
    throw_error(make_error_code(errc::invalid_argument),
                fmt::format("segment tag must be 1..{} bytes (got {})", kMaxTag, o.tag.size()));
  }
  const auto bad = std::find_if(o.tag.begin(), o.tag.end(), [](char c) { return c < 0x21 || c > 0x7e; });
  if (bad != o.tag.end()) {
    throw_error(make_error_code(errc::invalid_argument),
                fmt::format("segment tag has byte 0x{:02x} at offset {}: only printable ASCII without spaces",
                            static_cast<unsigned char>(*bad), bad - o.tag.begin()));
  }
  check_step(o.step);
  if (o.connect_timeout.count() <= 0 || o.command_timeout.count() <= 0) {
    throw_error(make_error_code(errc::invalid_argument),
                "segment connect and command timeouts must be positive");
  }
}

// A range of ids, first..last (inclusive).
struct Range {
  std::int64_t first = 0;
  std::int64_t last = -1;
  std::int64_t size() const { return last - first + 1; }
};

// The range a take stands for, (max_id - step, max_id], from what the database answered: the
// one place its numbers are checked. A step below 1 (the row's, an administrator's mistake:
// the take left max_id as it was) is errc::invalid_argument; a max_id below the step (the
// range would reach 0 or below, or the subtraction overflow) is errc::protocol_error.
distlock::detail::Error range_of(const detail::SegmentTake& t, const std::string& tag,
                                 const std::string& where, Range& out) {
  if (t.step <= 0) {
    return {
        make_error_code(errc::invalid_argument),
        fmt::format("the row of segment \"{}\" on {} has step {}; set a positive step", tag, where, t.step)};
  }
  if (t.max_id < t.step) {
    return {make_error_code(errc::protocol_error),
            fmt::format("segment \"{}\" on {}: max_id {} is below the step {} just added to it (was max_id "
                        "lowered?)",
                        tag, where, t.max_id, t.step)};
  }
  out.first = t.max_id - t.step + 1;
  out.last = t.max_id;
  return {};
}

}  // namespace

struct SegmentGenerator::Impl {
  using SteadyClock = std::chrono::steady_clock;

  SegmentOptions opts;
  std::unique_ptr<detail::SegmentSource> source;  // used by the constructor, then only by the fetcher
  std::string where;                              // source->describe()
  std::uint64_t fork_gen = 0;
  pid_t pid = 0;
  std::atomic<std::uint64_t> trips{0};
  std::atomic<std::int64_t> step{0};

  std::unique_ptr<std::thread> fetcher;  // started by the constructor, joined by the destructor

  AnnotatedMutex mu;
  std::condition_variable cv;  // waits on mu: a take asked for, a take done, stop
  // The current range is [next_id, end_id].
  std::int64_t next_id DISTLOCK_GUARDED_BY(mu) = 1;
  std::int64_t end_id DISTLOCK_GUARDED_BY(mu) = 0;
  std::int64_t range_size DISTLOCK_GUARDED_BY(mu) = 0;
  std::int64_t last_issued DISTLOCK_GUARDED_BY(mu) = 0;
  std::optional<Range> spare DISTLOCK_GUARDED_BY(mu);  // the next range, taken in the background
  bool fetching DISTLOCK_GUARDED_BY(mu) = false;       // a take is asked for or in flight
  bool want DISTLOCK_GUARDED_BY(mu) = false;           // the fetcher should start one
  bool stop DISTLOCK_GUARDED_BY(mu) = false;
  // The last take's failure (cleared by a success).
  distlock::detail::Error fetch_err DISTLOCK_GUARDED_BY(mu);
  SteadyClock::time_point retry_at DISTLOCK_GUARDED_BY(mu){};

  bool forked() const { return detail::fork_generation() != fork_gen; }

  distlock::detail::Error take(Range& r) {
    trips.fetch_add(1, std::memory_order_relaxed);
    const std::int64_t s = step.load(std::memory_order_relaxed);
    detail::SegmentTake t;
    if (auto err = source->take(opts.tag, s, s > 0 ? s : kDefaultSegmentStep, t)) return err;
    return range_of(t, opts.tag, where, r);
  }

  void fetch_loop() DISTLOCK_EXCLUDES(mu) {
    UniqueLock lk(mu);
    for (;;) {
      while (!stop && !want) cv.wait(lk.native());
      if (stop) return;
      want = false;
      lk.unlock();
      Range r;
      distlock::detail::Error err;
      try {
        err = take(r);
      } catch (const std::exception& e) {
        err.fail(errc::protocol_error, e.what());
      }
      lk.lock();
      fetching = false;
      if (err) {
        err.set_detail(fmt::format("segment \"{}\": cannot take the next range: {}", opts.tag, err.detail()));
        fetch_err = std::move(err);
        retry_at = SteadyClock::now() + kRetryPause;
      } else {
        fetch_err.clear();
        spare = r;
      }
      cv.notify_all();
    }
  }

  // Makes `r` the current range.
  distlock::detail::Error install(const Range& r) DISTLOCK_REQUIRES(mu) {
    if (r.first <= last_issued || r.last < r.first) {
      return {
          make_error_code(errc::protocol_error),
          fmt::format("segment \"{}\" on {} went back: the range [{}, {}] does not start above id {} this "
                      "generator issued (was max_id lowered or the row deleted?)",
                      opts.tag, where, r.first, r.last, last_issued)};
    }
    next_id = r.first;
    end_id = r.last;
    range_size = r.size();
    return {};
  }

  void ask_locked() DISTLOCK_REQUIRES(mu) {
    fetching = true;
    want = true;
    cv.notify_all();
  }

  distlock::detail::Error next(std::uint64_t& id) DISTLOCK_EXCLUDES(mu) {
    if (forked()) {
      return {
          make_error_code(errc::forked),
          fmt::format("this segment generator was made in process {}; after fork() the child ({}) must make "
                      "its own generator, or it would hand out ids of the parent's range",
                      pid, ::getpid())};
    }
    UniqueLock lk(mu);
    for (;;) {
      if (next_id <= end_id) {
        id = static_cast<std::uint64_t>(next_id);
        last_issued = next_id;
        if (next_id == end_id) {
          // Used up. Not next_id + 1: a range may end at 2^63 - 1, and the cursor would
          // overflow past it (the next call then handed out 2^63 onwards).
          next_id = 1;
          end_id = 0;
        } else {
          ++next_id;
        }
        // 10 % left (or less): take the next range in the background.
        if (!spare && !fetching && (end_id - next_id + 1) * 10 <= range_size &&
            (!fetch_err || SteadyClock::now() >= retry_at)) {
          ask_locked();
        }
        return {};
      }
      if (spare) {
        const Range r = *spare;
        spare.reset();
        if (auto err = install(r)) return err;
        continue;
      }
      if (!fetching) {
        if (fetch_err) {  // reported once; the next call asks again
          return std::exchange(fetch_err, {});
        }
        ask_locked();
      }
      // A take is bounded by the source's connect and statement timeouts.
      while (fetching) cv.wait(lk.native());
    }
  }
};

SegmentGenerator::SegmentGenerator(std::string_view url_text, SegmentOptions opts) {
  check_options(opts);
  distlock::detail::Url url;
  if (const auto err = distlock::detail::parse_url(url_text, url)) throw_error(err, err.detail());
  const auto factory = distlock::detail::find_segment_source(url.scheme);
  if (!factory) {
    const std::string have = distlock::detail::segment_schemes();
    throw_error(make_error_code(errc::invalid_url),
                fmt::format("segment ids need a database URL ({}); \"{}\" has scheme \"{}\"",
                            have.empty() ? "none in this build" : have, url.redacted(), url.scheme));
  }
  // The same query keys as a lock client's URL of that scheme, checked by the same table.
  if (auto err = distlock::detail::check_segment_url_query(url)) throw_error(err, err.detail());
  ClientOptions timeouts;
  timeouts.connect_timeout = opts.connect_timeout;
  timeouts.command_timeout = opts.command_timeout;
  if (const auto err = distlock::detail::apply_common_query(url, timeouts)) throw_error(err, err.detail());

  impl_ = std::make_unique<Impl>();
  Impl& m = *impl_;
  m.opts = std::move(opts);
  m.step.store(m.opts.step);
  m.fork_gen = detail::fork_generation();
  m.pid = ::getpid();
  distlock::detail::Error err;
  m.source = factory(url, timeouts.connect_timeout, timeouts.command_timeout, err);
  if (!m.source) throw_error(err ? err : make_error_code(errc::backend_unavailable), err.detail());
  m.where = m.source->describe();
  Range first;
  if ((err = m.take(first))) throw_error(err, err.detail());
  {
    LockGuard lk(m.mu);  // the fetcher does not run yet; install() is written for callers holding mu
    if ((err = m.install(first))) throw_error(err, err.detail());
  }
  m.fetcher = std::make_unique<std::thread>([&m] { m.fetch_loop(); });
}

SegmentGenerator::~SegmentGenerator() {
  if (!impl_) return;
  if (impl_->forked()) {
    // The fetcher thread and the connection are the parent's: the thread does not exist
    // here (joining it would hang) and closing the connection would end the parent's
    // session. Both are left alone (a small leak in the child).
    impl_->source->abandon();
    (void)impl_->source.release();
    (void)impl_->fetcher.release();
    (void)impl_.release();
    return;
  }
  {
    LockGuard lk(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  impl_->fetcher->join();  // a take in flight ends within the source's timeouts
}

std::uint64_t SegmentGenerator::next() {
  return detail::next_or_throw([&](std::uint64_t& id) { return impl_->next(id); });
}

std::uint64_t SegmentGenerator::next(std::error_code& ec) noexcept {
  return detail::next_or_code(ec, [&](std::uint64_t& id) { return impl_->next(id); });
}

void SegmentGenerator::set_step(std::int64_t step) {
  check_step(step);
  impl_->opts.step = step;                             // what options() reports
  impl_->step.store(step, std::memory_order_relaxed);  // what the fetcher thread reads
}

std::uint64_t SegmentGenerator::round_trips() const noexcept {
  return impl_->trips.load(std::memory_order_relaxed);
}

const SegmentOptions& SegmentGenerator::options() const noexcept {
  return impl_->opts;
}

}  // namespace distlock::ids
