#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "api/client_access.hpp"
#include "distlock/error.hpp"
#include "distlock/ids.hpp"
#include "engine/engine.hpp"
#include "engine/thread_annotations.hpp"
#include "ids/next_call.hpp"
#include "ids/random_pool.hpp"
#include "ids/worker_mark.hpp"

namespace distlock::ids {

using distlock::detail::AnnotatedMutex;
using distlock::detail::LockGuard;
using distlock::detail::UniqueLock;

namespace {

constexpr int kSequenceBits = 12;
constexpr int kWorkerBits = 10;
constexpr std::int64_t kMaxTimestamp = (std::int64_t{1} << 41) - 1;
constexpr unsigned kMaxSequence = kSnowflakeSequencePerMs - 1;

std::string worker_lock_name(const std::string& prefix, unsigned n) {
  return fmt::format("idgen:{}:worker:{}", prefix, n);
}

}  // namespace

SnowflakeParts decode_snowflake(std::uint64_t id, std::int64_t epoch_ms) {
  if (id >> 63) {
    throw_error(make_error_code(errc::invalid_argument),
                fmt::format("{} is not a snowflake id: its sign bit is set", id));
  }
  SnowflakeParts p;
  p.unix_ms = static_cast<std::int64_t>(id >> (kSequenceBits + kWorkerBits)) + epoch_ms;
  p.worker = static_cast<unsigned>(id >> kSequenceBits) & (kSnowflakeWorkers - 1);
  p.sequence = static_cast<unsigned>(id) & kMaxSequence;
  return p;
}

struct SnowflakeGenerator::Impl {
  Client client;
  SnowflakeOptions opts;
  std::shared_ptr<WallClock> clock;
  std::unique_ptr<detail::WorkerMarkStore> marks;  // null: this backend keeps no marks
  std::uint64_t fork_gen = 0;                      // detail::fork_generation() at creation
  pid_t pid = 0;                                   // for messages

  mutable AnnotatedMutex mu;
  Lease lease DISTLOCK_GUARDED_BY(mu);
  std::stop_token lease_stop DISTLOCK_GUARDED_BY(mu);  // the lease's, kept to avoid a copy per id
  unsigned worker DISTLOCK_GUARDED_BY(mu) = 0;
  bool lost DISTLOCK_GUARDED_BY(mu) = false;     // sticky until relet()
  std::string lost_why DISTLOCK_GUARDED_BY(mu);  // why, when a mark refused us
  // Timestamp field of the last id (ms since the epoch), or the floor.
  std::int64_t last_ms DISTLOCK_GUARDED_BY(mu) = -1;
  unsigned sequence DISTLOCK_GUARDED_BY(mu) = 0;         // sequence field of the last id
  std::int64_t clock_seen DISTLOCK_GUARDED_BY(mu) = -1;  // the latest clock reading (ms since the epoch)
  std::int64_t checked_ms DISTLOCK_GUARDED_BY(mu) =
      -1;                                           // the millisecond in which the lease was last checked
  std::uint64_t token DISTLOCK_GUARDED_BY(mu) = 0;  // the worker lease's fencing token (0 without fencing)
  std::uint64_t nonce DISTLOCK_GUARDED_BY(mu) = 0;  // random, names this holder in the worker mark
  // Ids up to this position (unix ms * 4096 + seq) are reserved.
  std::int64_t mark_pos DISTLOCK_GUARDED_BY(mu) = 0;
  // Unix ms: after a failed extension, when to try again.
  std::int64_t retry_mark_at DISTLOCK_GUARDED_BY(mu) = 0;

  Impl(Client c, SnowflakeOptions o) : client(std::move(c)), opts(std::move(o)) {}

  std::int64_t ahead() const { return opts.mark_ahead.count(); }
  // A predecessor's ids further ahead of this host's clock than this are a clock that
  // went back (or hosts that disagree): refused, not waited for.
  std::int64_t floor_limit() const { return ahead() + opts.max_backward.count(); }
  // The mark position of id (ms since the epoch, sequence).
  std::int64_t pos_of(std::int64_t ms, unsigned seq) const {
    return (ms + opts.epoch_ms) * std::int64_t{kSnowflakeSequencePerMs} + seq;
  }
  // The reservation a holder makes at unix time `unix_now`: everything up to now + ahead.
  std::int64_t reserve_pos(std::int64_t unix_now) const {
    return (unix_now + ahead()) * std::int64_t{kSnowflakeSequencePerMs} + kMaxSequence;
  }

  bool forked() const { return detail::fork_generation() != fork_gen; }

  // The worker id, for the message of a forked child: mu is not taken there (a thread of the
  // parent may have held it at fork() and does not exist in the child, which is left with
  // the one thread that forked, so nothing else can be writing `worker`).
  unsigned worker_in_child() const DISTLOCK_NO_THREAD_SAFETY_ANALYSIS { return worker; }

  // Claims worker n's mark for the lease just taken. Returns false when the mark names a
  // newer holder (a larger token): the worker id is not usable.
  bool claim_mark(unsigned n) DISTLOCK_REQUIRES(mu) {
    const std::int64_t now = clock->now_ms();
    if (!marks) {
      // No mark on this backend: wait out the margin instead (start above the clock by
      // max_backward, so a predecessor on this host that stopped before we took the
      // worker id, with a clock stepped back at most that much, issued only below).
      floor_at(pos_of(now - opts.epoch_ms + opts.max_backward.count(), kMaxSequence));
      return true;
    }
    detail::MarkRecord prior;
    distlock::detail::Error err;
    const std::int64_t want = reserve_pos(now);
    const bool ok =
        marks->apply(detail::MarkOp::claim, worker_lock_name(opts.prefix, n), token, nonce, want, prior, err);
    if (err) throw_error(err, err.detail());
    if (!ok) return false;
    mark_pos = prior.found ? std::max(prior.pos, want) : want;
    if (prior.found) {
      floor_at(prior.pos);
    } else if (marks->may_lose_records()) {
      // No record: a worker id never used, or a store that lost it (Redis restarted
      // without persistence, a flush, an eviction). A holder that lost it reserved at
      // most mark_ahead past the clock: start above that.
      floor_at(want);
    }
    return true;
  }

  // The next id must be above mark position `pos`.
  void floor_at(std::int64_t pos) DISTLOCK_REQUIRES(mu) {
    const std::int64_t ms = pos / kSnowflakeSequencePerMs - opts.epoch_ms;
    const auto seq = static_cast<unsigned>(pos % kSnowflakeSequencePerMs);
    if (ms > last_ms || (ms == last_ms && seq > sequence)) {
      last_ms = ms;
      sequence = seq;
    }
  }

  // Claims the first free worker id.
  void lease_worker() DISTLOCK_REQUIRES(mu) {
    LockOptions lock_opts = opts.lease;
    lock_opts.wait = Millis(0);
    const auto& engine = distlock::detail::engine_of(client);
    std::uint8_t bytes[8];
    pool.fill(bytes, sizeof bytes);
    std::memcpy(&nonce, bytes, sizeof nonce);
    for (unsigned n = 0; n < kSnowflakeWorkers; ++n) {
      const std::string name = worker_lock_name(opts.prefix, n);
      // A worker lock this thread already holds through the same client (another
      // generator made on this thread) would be re-entered by try_acquire, not
      // refused: skip it, or two generators would share a worker id.
      if (auto mine = engine->held_by_this_thread(name); mine && mine->owns()) continue;
      std::optional<Lease> got = client.try_acquire(name, lock_opts);
      if (!got) continue;
      token = got->has_token() ? got->token() : 0;
      if (!claim_mark(n)) {  // the mark names a newer holder: leave this worker id
        std::error_code ignored;
        got->release(ignored);
        continue;
      }
      lease = std::move(*got);
      lease_stop = lease.stop_token();
      worker = n;
      lost = false;
      lost_why.clear();
      checked_ms = -1;
      retry_mark_at = 0;
      return;
    }
    throw_error(make_error_code(errc::exhausted),
                fmt::format("all {} snowflake worker ids are leased (locks idgen:{}:worker:0..{} on {}); "
                            "stop a generator or use another prefix",
                            kSnowflakeWorkers, opts.prefix, kSnowflakeWorkers - 1, client.url()));
  }

  // Lowers the worker mark to the last millisecond used, so the next holder starts right
  // above it. Before the lease is released; errors ignored (the mark then stays higher).
  void settle_mark() noexcept DISTLOCK_REQUIRES(mu) {
    if (!marks || lost || forked() || !lease.owns()) return;
    try {
      detail::MarkRecord prior;
      distlock::detail::Error ignored;
      marks->apply(detail::MarkOp::settle, worker_lock_name(opts.prefix, worker), token, nonce,
                   pos_of(last_ms, sequence), prior, ignored);
    } catch (...) {
    }
  }

  // Makes sure id (ts, seq) is covered by the worker mark; `now` is the clock reading
  // (ms since the epoch) and ts <= now. Extends the mark to now + ahead once it
  // is less than ahead / 2 in front of the clock.
  distlock::detail::Error cover(std::int64_t ts, unsigned seq, std::int64_t now) DISTLOCK_REQUIRES(mu) {
    if (!marks) return {};
    const std::int64_t unix_now = now + opts.epoch_ms;
    const bool needed = pos_of(ts, seq) > mark_pos;
    const bool due = mark_pos < reserve_pos(unix_now - ahead() / 2 - 1);
    if (!needed && (!due || unix_now < retry_mark_at)) return {};
    detail::MarkRecord prior;
    distlock::detail::Error err;
    const std::string lock = worker_lock_name(opts.prefix, worker);
    const std::int64_t want = reserve_pos(unix_now);
    const bool ok = marks->apply(detail::MarkOp::extend, lock, token, nonce, want, prior, err);
    if (err) {
      retry_mark_at = unix_now + 50;
      if (!needed) return {};  // still covered; try again later
      err.set_detail(fmt::format("snowflake worker id {} cannot reserve more time in its mark on {}: {}",
                                 worker, marks->describe(), err.detail()));
      return err;
    }
    if (!ok) {
      lost = true;
      lost_why = fmt::format(
          "snowflake worker id {} ({}) was taken over: its mark on {} names another holder{}; no ids until "
          "relet()",
          worker, lock, marks->describe(), prior.found ? "" : " (or is gone: the store lost it)");
      return {make_error_code(errc::lost), lost_why};
    }
    mark_pos = std::max(prior.pos, want);
    return {};
  }

  // Fills out[0..n) with consecutive ids. Each id's timestamp is the clock reading
  // taken for it or for the ids of its millisecond issued in the same call (one read
  // serves up to 4096 ids when n > 1). On error nothing more is filled; ids already
  // written were issued (their sequence numbers are never reused).
  distlock::detail::Error fill(std::uint64_t* out, std::size_t n) DISTLOCK_EXCLUDES(mu) {
    if (forked()) {
      return {make_error_code(errc::forked),
              fmt::format(
                  "this snowflake generator (worker id {}) was made in process {}; after fork() the child "
                  "({}) must make its own generator with its own client, or it would issue the parent's ids",
                  worker_in_child(), pid, ::getpid())};
    }
    UniqueLock lk(mu);
    std::size_t filled = 0;
    while (filled < n) {
      if (lost || lease_stop.stop_requested()) {
        lost = true;
        return {make_error_code(errc::lost),
                !lost_why.empty()
                    ? lost_why
                    : fmt::format("the lease on snowflake worker id {} ({}) was lost; no ids until relet()",
                                  worker, worker_lock_name(opts.prefix, worker))};
      }
      const std::int64_t now = clock->now_ms() - opts.epoch_ms;
      if (now < 0) {
        return {make_error_code(errc::clock_moved_backwards),
                fmt::format("the wall clock ({} ms) is before the snowflake epoch ({} ms)",
                            now + opts.epoch_ms, opts.epoch_ms)};
      }
      if (now < clock_seen) {
        const std::int64_t behind = clock_seen - now;
        if (behind > opts.max_backward.count()) {
          return {make_error_code(errc::clock_moved_backwards),
                  fmt::format("the wall clock moved back by {} ms (tolerated: {} ms); no id issued", behind,
                              opts.max_backward.count())};
        }
        // Small step back (NTP slew, VM migration): wait until the clock is back at
        // the latest reading. The mutex is released so leases and other threads go on.
        const std::int64_t until_ms = clock_seen + opts.epoch_ms;  // read while mu is held
        lk.unlock();
        clock->sleep_until_ms(until_ms);
        lk.lock();
        continue;
      }
      clock_seen = now;
      if (last_ms - now > floor_limit()) {
        return {make_error_code(errc::clock_moved_backwards),
                fmt::format(
                    "snowflake worker id {}: ids up to {} ms may have been issued under it, {} ms ahead of "
                    "this host's clock (tolerated: {} ms); the clock was stepped back, or hosts disagree; "
                    "no id issued",
                    worker, last_ms + opts.epoch_ms, last_ms - now, floor_limit())};
      }
      if (last_ms > now) {
        // A predecessor's mark is ahead of this host's clock (it reserved time ahead and
        // stopped, or the store lost its record): ids carry the time they are made, so
        // wait for the clock (at most mark_ahead + max_backward).
        const std::int64_t until_ms = last_ms + opts.epoch_ms;  // read while mu is held
        lk.unlock();
        clock->sleep_until_ms(until_ms);
        lk.lock();
        continue;
      }
      std::int64_t ts = 0;
      unsigned seq = 0;
      if (now > last_ms) {
        ts = now;
      } else if (sequence < kMaxSequence) {
        ts = last_ms;
        seq = sequence + 1;
      } else {  // 4096 ids in this millisecond: wait for the next
        const std::int64_t until_ms = last_ms + 1 + opts.epoch_ms;  // read while mu is held
        lk.unlock();
        clock->sleep_until_ms(until_ms);
        lk.lock();
        continue;
      }
      if (ts > kMaxTimestamp) {
        return {make_error_code(errc::exhausted),
                fmt::format("the 41-bit snowflake timestamp is full ({} ms after the epoch {} ms)", ts,
                            opts.epoch_ms)};
      }
      // Once per millisecond, check the lease's local deadline too: the stop token
      // only fires when the renewer runs, but a process resumed after a long pause
      // must not issue a single id under a worker id that may have gone to someone else.
      if (ts != checked_ms) {
        if (!lease.owns()) {
          lost = true;
          continue;
        }
        checked_ms = ts;
      }
      if (auto err = cover(ts, seq, now)) return err;
      last_ms = ts;
      sequence = seq;
      // `sequence` is the first of this run; take as many more of this millisecond as wanted.
      const std::uint64_t base = static_cast<std::uint64_t>(last_ms) << (kSequenceBits + kWorkerBits) |
                                 static_cast<std::uint64_t>(worker) << kSequenceBits;
      const std::size_t run = std::min<std::size_t>(n - filled, kMaxSequence - sequence + 1);
      for (std::size_t i = 0; i < run; ++i) out[filled + i] = base | (sequence + i);
      sequence += static_cast<unsigned>(run - 1);
      filled += run;
    }
    return {};
  }

  detail::RandomPool pool;
};

SnowflakeGenerator::SnowflakeGenerator(Client client, SnowflakeOptions opts)
    : impl_(std::make_unique<Impl>(std::move(client), std::move(opts))) {
  auto& o = impl_->opts;
  if (o.max_backward.count() < 0 || o.max_backward > std::chrono::seconds(10)) {
    throw_error(make_error_code(errc::invalid_argument),
                fmt::format("snowflake max_backward {} ms is outside [0, 10000] ms", o.max_backward.count()));
  }
  if (o.epoch_ms < 0) {
    throw_error(make_error_code(errc::invalid_argument),
                fmt::format("snowflake epoch {} ms is before 1970", o.epoch_ms));
  }
  if (o.prefix.empty() || o.prefix.size() > 256 || o.prefix.find('\0') != std::string::npos) {
    throw_error(make_error_code(errc::invalid_argument),
                "snowflake prefix must be 1..256 bytes without NUL (got " + std::to_string(o.prefix.size()) +
                    " bytes)");
  }
  if (o.mark_ahead < Millis(10) || o.mark_ahead > std::chrono::seconds(60)) {
    throw_error(make_error_code(errc::invalid_argument),
                fmt::format("snowflake mark_ahead {} ms is outside [10, 60000] ms", o.mark_ahead.count()));
  }
  impl_->clock = o.clock ? o.clock : system_wall_clock();
  impl_->fork_gen = detail::fork_generation();
  impl_->pid = ::getpid();
  impl_->marks = detail::make_mark_store(impl_->client);
  LockGuard lk(impl_->mu);
  impl_->lease_worker();
}

SnowflakeGenerator::~SnowflakeGenerator() {
  if (!impl_) return;
  LockGuard lk(impl_->mu);
  impl_->settle_mark();
}

std::uint64_t SnowflakeGenerator::next() {
  return detail::next_or_throw([&](std::uint64_t& id) { return impl_->fill(&id, 1); });
}

void SnowflakeGenerator::next_batch(std::span<std::uint64_t> out) {
  if (const auto err = impl_->fill(out.data(), out.size())) throw_error(err, err.detail());
}

std::uint64_t SnowflakeGenerator::next(std::error_code& ec) noexcept {
  return detail::next_or_code(ec, [&](std::uint64_t& id) { return impl_->fill(&id, 1); });
}

void SnowflakeGenerator::relet() {
  if (impl_->forked()) {
    throw_error(
        make_error_code(errc::forked),
        fmt::format("snowflake relet() in a child of process {} after fork(): make a new generator with its "
                    "own client in the child",
                    impl_->pid));
  }
  LockGuard lk(impl_->mu);
  impl_->settle_mark();
  std::error_code ignored;  // errc::lost is expected: the old lease is gone
  impl_->lease.release(ignored);
  // The new worker id may be lower than the old one: make the next id use a later
  // millisecond so ids from this generator still increase.
  impl_->sequence = kMaxSequence;
  impl_->lease_worker();
}

unsigned SnowflakeGenerator::worker_id() const {
  LockGuard lk(impl_->mu);
  return impl_->worker;
}

bool SnowflakeGenerator::leased() const {
  LockGuard lk(impl_->mu);
  return !impl_->lost && impl_->lease.owns();
}

std::stop_token SnowflakeGenerator::stop_token() const {
  LockGuard lk(impl_->mu);
  return impl_->lease.stop_token();
}

const SnowflakeOptions& SnowflakeGenerator::options() const noexcept {
  return impl_->opts;
}

}  // namespace distlock::ids
