#include <fmt/format.h>

#include <algorithm>
#include <mutex>

#include "core/engine.hpp"
#include "distlock/error.hpp"
#include "distlock/ids.hpp"

namespace distlock::ids {

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

  mutable std::mutex mu;
  // Everything below is guarded by mu.
  Lease lease;
  std::stop_token lease_stop;  // the lease's, kept to avoid a copy per id
  unsigned worker = 0;
  bool lost = false;             // sticky until relet()
  std::int64_t last_ms = -1;     // timestamp field of the last id (ms since the epoch)
  unsigned sequence = 0;         // sequence field of the last id
  std::int64_t checked_ms = -1;  // the millisecond in which the lease was last checked

  Impl(Client c, SnowflakeOptions o) : client(std::move(c)), opts(std::move(o)) {}

  // Claims the first free worker id. Called with mu held (or before the object is shared).
  void lease_worker() {
    LockOptions lock_opts = opts.lease;
    lock_opts.wait = Millis(0);
    const auto& engine = client.engine();
    for (unsigned n = 0; n < kSnowflakeWorkers; ++n) {
      const std::string name = worker_lock_name(opts.prefix, n);
      // A worker lock this thread already holds through the same client (another
      // generator made on this thread) would be re-entered by try_acquire, not
      // refused: skip it, or two generators would share a worker id.
      if (auto mine = engine->held_by_this_thread(name); mine && mine->owns()) continue;
      std::optional<Lease> got = client.try_acquire(name, lock_opts);
      if (!got) continue;
      lease = std::move(*got);
      lease_stop = lease.stop_token();
      worker = n;
      lost = false;
      checked_ms = -1;
      return;
    }
    throw_error(make_error_code(errc::exhausted),
                fmt::format("all {} snowflake worker ids are leased (locks idgen:{}:worker:0..{} on {}); "
                            "stop a generator or use another prefix",
                            kSnowflakeWorkers, opts.prefix, kSnowflakeWorkers - 1, client.url()));
  }

  // Fills out[0..n) with consecutive ids. Each id's timestamp is the clock reading
  // taken for it or for the ids of its millisecond issued in the same call (one read
  // serves up to 4096 ids when n > 1). On error nothing more is filled; ids already
  // written were issued (their sequence numbers are never reused).
  std::error_code fill(std::uint64_t* out, std::size_t n, std::string& why) {
    std::unique_lock lk(mu);
    std::size_t filled = 0;
    while (filled < n) {
      if (lost || lease_stop.stop_requested()) {
        lost = true;
        why = fmt::format("the lease on snowflake worker id {} ({}) was lost; no ids until relet()", worker,
                          worker_lock_name(opts.prefix, worker));
        return make_error_code(errc::lost);
      }
      const std::int64_t now = clock->now_ms() - opts.epoch_ms;
      if (now < 0) {
        why = fmt::format("the wall clock ({} ms) is before the snowflake epoch ({} ms)", now + opts.epoch_ms,
                          opts.epoch_ms);
        return make_error_code(errc::clock_moved_backwards);
      }
      if (now < last_ms) {
        const std::int64_t behind = last_ms - now;
        if (behind > opts.max_backward.count()) {
          why = fmt::format("the wall clock moved back by {} ms (tolerated: {} ms); no id issued", behind,
                            opts.max_backward.count());
          return make_error_code(errc::clock_moved_backwards);
        }
        // Small step back (NTP slew, VM migration): wait until the clock is back at
        // the last timestamp. The mutex is released so leases and other threads go on.
        lk.unlock();
        clock->sleep_until_ms(last_ms + opts.epoch_ms);
        lk.lock();
        continue;
      }
      if (now == last_ms) {
        if (sequence >= kMaxSequence) {  // 4096 ids in this millisecond: wait for the next
          lk.unlock();
          clock->sleep_until_ms(last_ms + 1 + opts.epoch_ms);
          lk.lock();
          continue;
        }
        ++sequence;
      } else {
        if (now > kMaxTimestamp) {
          why = fmt::format("the 41-bit snowflake timestamp is full ({} ms after the epoch {} ms)", now,
                            opts.epoch_ms);
          return make_error_code(errc::exhausted);
        }
        // Once per millisecond, check the lease's local deadline too: the stop token
        // only fires when the renewer runs, but a process resumed after a long pause
        // must not issue a single id under a worker id that may have gone to someone else.
        if (now != checked_ms) {
          if (!lease.owns()) {
            lost = true;
            continue;
          }
          checked_ms = now;
        }
        last_ms = now;
        sequence = 0;
      }
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
  impl_->clock = o.clock ? o.clock : system_wall_clock();
  std::lock_guard lk(impl_->mu);
  impl_->lease_worker();
}

SnowflakeGenerator::~SnowflakeGenerator() = default;

std::uint64_t SnowflakeGenerator::next() {
  std::uint64_t id = 0;
  std::string why;
  if (const std::error_code ec = impl_->fill(&id, 1, why)) throw_error(ec, why);
  return id;
}

void SnowflakeGenerator::next_batch(std::span<std::uint64_t> out) {
  std::string why;
  if (const std::error_code ec = impl_->fill(out.data(), out.size(), why)) throw_error(ec, why);
}

std::uint64_t SnowflakeGenerator::next(std::error_code& ec) noexcept {
  std::uint64_t id = 0;
  std::string why;
  try {
    ec = impl_->fill(&id, 1, why);
  } catch (const std::system_error& e) {
    ec = e.code();
  } catch (...) {
    ec = make_error_code(errc::protocol_error);
  }
  return ec ? 0 : id;
}

void SnowflakeGenerator::relet() {
  std::lock_guard lk(impl_->mu);
  std::error_code ignored;  // errc::lost is expected: the old lease is gone
  impl_->lease.release(ignored);
  impl_->lease_worker();
  // The new worker id may be lower than the old one: make the next id use a later
  // millisecond so ids from this generator still increase.
  impl_->sequence = kMaxSequence;
}

unsigned SnowflakeGenerator::worker_id() const {
  std::lock_guard lk(impl_->mu);
  return impl_->worker;
}

bool SnowflakeGenerator::leased() const {
  std::lock_guard lk(impl_->mu);
  return !impl_->lost && impl_->lease.owns();
}

std::stop_token SnowflakeGenerator::stop_token() const {
  std::lock_guard lk(impl_->mu);
  return impl_->lease.stop_token();
}

const SnowflakeOptions& SnowflakeGenerator::options() const noexcept {
  return impl_->opts;
}

}  // namespace distlock::ids
