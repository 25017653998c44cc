#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <charconv>
#include <chrono>
#include <cstring>

#include "distlock/error.hpp"
#include "distlock/ids.hpp"
#include "engine/scheme.hpp"
#include "engine/thread_annotations.hpp"
#include "engine/url.hpp"
#include "ids/next_call.hpp"
#include "ids/random_pool.hpp"
#include "ids/time_math.hpp"
#include "redis/connection.hpp"
#include "redis/redis_scheme.hpp"

namespace distlock::ids {

namespace redis = distlock::detail::redis;

namespace {

using detail::floor_div;
using detail::kSecondsPerDay;
constexpr std::int64_t kMaxSecondsField = detail::kMaxRedisDailySeconds;
constexpr std::uint64_t kCounterLimit = std::uint64_t{1} << 32;  // first value that does not fit
constexpr std::uint32_t kMaxReserve = 1u << 20;
// A value of a reserved range is handed out in second s only if Redis confirmed the
// range's epoch (the day counter was not lost) at a clock reading in second s; values of
// an epoch are used only from its creation second + kEpochDelaySeconds on. So a counter
// recreated after data loss never hands out a value in a second in which a range of the
// lost counter may still be in use. kValidateMs: the confirmation accepted for a second
// held ahead of a clock that went back.
constexpr std::int64_t kValidateMs = 1000;
constexpr std::int64_t kEpochDelaySeconds = 1;

// INCRBY the day counter and read (creating it with the counter) its epoch key:
// "<creation unix ms>:<random hex>". Returns {last value, epoch}.
const redis::Script kReserveScript(R"lua(
local v = redis.call('INCRBY', KEYS[1], ARGV[1])
local e = redis.call('GET', KEYS[2])
if not e then
  e = ARGV[2]
  redis.call('SET', KEYS[2], e)
end
return {v, e}
)lua");

std::string epoch_key(const std::string& counter_key) {
  return counter_key + ":epoch";
}

// The creation time (unix ms) written at the head of an epoch value, or -1.
std::int64_t epoch_created_ms(std::string_view epoch) {
  std::int64_t ms = -1;
  const auto colon = epoch.find(':');
  if (colon == std::string_view::npos) return -1;
  if (std::from_chars(epoch.data(), epoch.data() + colon, ms).ec != std::errc()) return -1;
  return ms;
}

}  // namespace

struct RedisDailyGenerator::Impl {
  RedisDailyOptions opts;
  std::shared_ptr<WallClock> clock;

  std::uint64_t fork_gen = 0;  // detail::fork_generation() at creation
  pid_t pid = 0;
  std::atomic<std::uint64_t> round_trips{0};

  distlock::detail::AnnotatedMutex mu;
  // One connection: ids are handed out under the mutex anyway, and a reservation makes
  // round trips rare.
  redis::Connection conn DISTLOCK_GUARDED_BY(mu);
  std::int64_t last_seconds DISTLOCK_GUARDED_BY(mu) = -1;  // timestamp of the last id (unix seconds)
  // UTC day (days since 1970) the reserved range belongs to.
  std::int64_t range_day DISTLOCK_GUARDED_BY(mu) = -1;
  std::uint64_t range_next DISTLOCK_GUARDED_BY(mu) = 0;  // next counter value to hand out
  std::uint64_t range_end DISTLOCK_GUARDED_BY(mu) = 0;   // one past the last reserved value (<= 2^32)
  // Set when the day counter went back (Redis lost data: a restart without persistence,
  // a failover): ids of this second may carry the values now handed out again, so the
  // next id uses a later second. -1 when not set.
  std::int64_t reset_at_second DISTLOCK_GUARDED_BY(mu) = -1;
  std::string range_key DISTLOCK_GUARDED_BY(mu);    // the counter key the range came from
  std::string range_epoch DISTLOCK_GUARDED_BY(mu);  // its epoch key's value when the range was reserved
  // Values of that epoch are used from this second on.
  std::int64_t range_min_second DISTLOCK_GUARDED_BY(mu) = 0;
  // Wall clock read before Redis last confirmed range_epoch.
  std::int64_t validated_ms DISTLOCK_GUARDED_BY(mu) = 0;
  detail::RandomPool pool DISTLOCK_GUARDED_BY(mu);

  Impl(RedisDailyOptions o, redis::ConnectionOptions co) : opts(std::move(o)), conn(std::move(co)) {}

  // Takes `opts.reserve` counter values of `key` from Redis: [range_next, range_end).
  distlock::detail::Error reserve(const std::string& key, std::int64_t day) DISTLOCK_REQUIRES(mu) {
    const std::string amount = std::to_string(opts.reserve);
    const std::string ekey = epoch_key(key);
    std::uint8_t rnd[8];
    pool.fill(rnd, sizeof rnd);
    std::uint64_t r64 = 0;
    std::memcpy(&r64, rnd, sizeof r64);
    distlock::detail::Error ec;
    redis::Reply reply;
    std::int64_t sent_ms = 0;
    // One retry: the first command after a server restart meets the dead socket;
    // the connection then reconnects. A repeated INCRBY only skips values.
    for (int attempt = 0; attempt < 2; ++attempt) {
      round_trips.fetch_add(1, std::memory_order_relaxed);
      sent_ms = clock->now_ms();
      const std::string fresh_epoch = fmt::format("{}:{:016x}", sent_ms, r64);
      ec.clear();
      reply = kReserveScript.run(conn, {key, ekey}, {amount, fresh_epoch}, ec);
      if (ec != errc::backend_unavailable) break;
    }
    if (ec) {
      if (reply) {
        ec.set_detail(fmt::format("{}: INCRBY {} failed: {}", conn.options().describe(), key,
                                  redis::reply_str(reply.get())));
      }
      return ec;
    }
    if (!reply || reply->type != REDIS_REPLY_ARRAY || reply->elements != 2 ||
        reply->element[0]->type != REDIS_REPLY_INTEGER ||
        epoch_created_ms(redis::reply_str(reply->element[1])) < 0) {
      return {make_error_code(errc::protocol_error),
              fmt::format("{}: INCRBY {} (with its epoch {}) answered something unexpected",
                          conn.options().describe(), key, ekey)};
    }
    const long long last = reply->element[0]->integer;
    const std::string_view epoch = redis::reply_str(reply->element[1]);
    const long long first = last - static_cast<long long>(opts.reserve) + 1;
    if (first < 1) {
      return {make_error_code(errc::protocol_error),
              fmt::format("{}: day counter {} holds {} after INCRBY {} (it was set below zero by someone)",
                          conn.options().describe(), key, last, opts.reserve)};
    }
    if (static_cast<std::uint64_t>(first) >= kCounterLimit) {
      return {make_error_code(errc::exhausted),
              fmt::format("day counter {} reached {} (the 32-bit counter allows {} ids per day); "
                          "no more redis-daily ids under prefix \"{}\" until the next UTC day",
                          key, first, kCounterLimit - 1, opts.prefix)};
    }
    if (day == range_day && static_cast<std::uint64_t>(first) < range_next) {
      reset_at_second = last_seconds;
    }
    range_day = day;
    range_key = key;
    range_epoch.assign(epoch);
    range_min_second = floor_div(epoch_created_ms(epoch), 1000) + kEpochDelaySeconds;
    validated_ms = sent_ms;
    range_next = static_cast<std::uint64_t>(first);
    range_end = std::min<std::uint64_t>(static_cast<std::uint64_t>(last) + 1, kCounterLimit);
    return {};
  }

  distlock::detail::Error next(std::uint64_t& id) DISTLOCK_EXCLUDES(mu) {
    if (detail::fork_generation() != fork_gen) {
      return {
          make_error_code(errc::forked),
          fmt::format("this redis-daily generator was made in process {}; after fork() the child ({}) must "
                      "make its own generator, or it would hand out values of the parent's reserved range",
                      pid, ::getpid())};
    }
    distlock::detail::LockGuard lk(mu);
    for (int attempt = 0; attempt < 16; ++attempt) {
      bool again = false;
      if (auto err = next_locked(id, again)) return err;
      if (!again) return {};
    }
    return {make_error_code(errc::protocol_error),
            fmt::format(
                "{}: the day counter under prefix \"{}\" kept changing (lost or recreated) while reserving",
                conn.options().describe(), opts.prefix)};
  }

  // Confirms that the range's counter was not lost since it was reserved (its epoch key
  // still holds the same value). False: the range is dropped.
  distlock::detail::Error validate(bool& valid) DISTLOCK_REQUIRES(mu) {
    const std::string ekey = epoch_key(range_key);
    distlock::detail::Error ec;
    redis::Reply reply;
    std::int64_t sent_ms = 0;
    for (int attempt = 0; attempt < 2; ++attempt) {
      round_trips.fetch_add(1, std::memory_order_relaxed);
      sent_ms = clock->now_ms();
      ec.clear();
      reply = conn.command({"GET", ekey}, ec);
      if (ec != errc::backend_unavailable) break;
    }
    if (ec) {
      if (reply) {
        ec.set_detail(fmt::format("{}: GET {} failed: {}", conn.options().describe(), ekey,
                                  redis::reply_str(reply.get())));
      }
      return ec;
    }
    valid = reply && reply->type == REDIS_REPLY_STRING && redis::reply_str(reply.get()) == range_epoch;
    if (valid) {
      validated_ms = sent_ms;
    } else {
      // The counter was lost (a restart without persistence, a flush, an eviction) and
      // perhaps recreated: what is left of the range may be handed out by others.
      range_next = range_end;
      reset_at_second = last_seconds;
    }
    return {};
  }

  distlock::detail::Error next_locked(std::uint64_t& id, bool& again) DISTLOCK_REQUIRES(mu) {
    // The timestamp never goes back within a generator (ids keep increasing). That is
    // safe for uniqueness: a counter value is unique within its day's key, and the
    // timestamp used always lies in the day whose key the value came from.
    const std::int64_t now_ms = clock->now_ms();
    const std::int64_t now = floor_div(now_ms, 1000);
    std::int64_t floor_seconds = last_seconds;
    if (reset_at_second >= 0) {
      // After Redis lost data the counter values are handed out again: move to a later
      // second than any id issued before (running up to one second ahead of the clock
      // rather than blocking), where none of the old values were used.
      floor_seconds = std::max(floor_seconds, reset_at_second + 1);
    }
    const bool have_range = range_next < range_end;
    const std::int64_t seconds = std::max({now, floor_seconds, have_range ? range_min_second : now});
    const std::int64_t field = seconds - opts.epoch_seconds;
    if (field < 0) {
      return {make_error_code(errc::clock_moved_backwards),
              fmt::format("the wall clock ({} s) is before the redis-daily epoch ({} s)", seconds,
                          opts.epoch_seconds)};
    }
    if (field > kMaxSecondsField) {
      return {make_error_code(errc::exhausted),
              fmt::format("the 31-bit seconds field is full ({} s after the epoch {} s)", field,
                          opts.epoch_seconds)};
    }
    const std::int64_t day = floor_div(seconds, kSecondsPerDay);
    if (day != range_day || !have_range) {
      // A new day discards what is left of the old day's range: its values belong to
      // the old day's key and would collide with the new day's counter.
      if (auto err = reserve(redis_daily_key(opts.prefix, seconds), day)) return err;
      again = true;  // the second may change (a young epoch, a counter that went back)
      return {};
    }
    if (range_min_second > now) {
      // The counter's epoch was created in this second (the day's first reservation,
      // or a counter recreated after Redis lost it): a range of the lost counter may be
      // in use in this second elsewhere. Its values are used from the next second on,
      // confirmed in that second: wait for it (at most 1 s).
      const std::int64_t target = range_min_second * 1000;
      for (int i = 0; i < 100'000 && clock->now_ms() < target; ++i) clock->sleep_until_ms(target);
      again = true;
      return {};
    }
    // Redis must have confirmed the range's epoch in the second the value is used in (a
    // lost counter is recreated with an epoch whose values are used only in a later
    // second). A second held ahead of a clock that went back is accepted with a
    // confirmation less than kValidateMs old.
    const bool confirmed = seconds > now ? (now_ms >= validated_ms && now_ms - validated_ms < kValidateMs)
                                         : floor_div(validated_ms, 1000) >= seconds;
    if (!confirmed) {
      bool valid = false;
      if (auto err = validate(valid)) return err;
      again = true;  // dropped, or confirmed at a new clock reading: decide again
      return {};
    }
    reset_at_second = -1;
    last_seconds = seconds;
    id = static_cast<std::uint64_t>(field) << 32 | range_next++;
    return {};
  }
};

namespace {

redis::ConnectionOptions connection_options(std::string_view redis_url, const RedisDailyOptions& o) {
  distlock::detail::Url url;
  if (const auto err = distlock::detail::parse_url(redis_url, url)) throw_error(err, err.detail());
  if (url.scheme != "redis" && url.scheme != "rediss") {
    throw_error(make_error_code(errc::invalid_url),
                fmt::format("redis-daily ids need a redis:// URL (or rediss://); \"{}\" has scheme \"{}\"",
                            url.redacted(), url.scheme));
  }
  if (url.hosts.size() != 1) {
    throw_error(make_error_code(errc::invalid_url),
                fmt::format("redis-daily ids need exactly one host in \"{}\" (got {})", url.redacted(),
                            url.hosts.size()));
  }
  ClientOptions client;
  client.connect_timeout = o.connect_timeout;
  client.command_timeout = o.command_timeout;
  // The same query keys as a lock client's redis:// URL, checked by the same table.
  if (const auto err = distlock::detail::check_query(
          *distlock::detail::scheme_named(distlock::detail::redis_schemes(), url.scheme), url)) {
    throw_error(err, err.detail());
  }
  if (const auto err = distlock::detail::apply_common_query(url, client)) throw_error(err, err.detail());
  distlock::detail::Error ec;
  redis::ConnectionOptions co = redis::options_from_url(url, 0, client, ec);
  if (ec) throw_error(ec, ec.detail());
  return co;
}

void validate(const RedisDailyOptions& o, std::int64_t now_seconds) {
  const auto bad = [](const std::string& what) {
    throw_error(make_error_code(errc::invalid_argument), what);
  };
  if (o.prefix.empty() || o.prefix.size() > 256) {
    bad(fmt::format("redis-daily prefix must be 1..256 bytes (got {})", o.prefix.size()));
  }
  if (o.prefix.find_first_of(std::string_view("\0\r\n", 3)) != std::string::npos) {
    bad("redis-daily prefix contains NUL, CR or LF");
  }
  if (o.reserve < 1 || o.reserve > kMaxReserve) {
    bad(fmt::format("redis-daily reserve {} is outside [1, {}]", o.reserve, kMaxReserve));
  }
  if (o.epoch_seconds < 0 || o.epoch_seconds > now_seconds) {
    bad(fmt::format("redis-daily epoch {} s is not between 1970 and now ({} s)", o.epoch_seconds,
                    now_seconds));
  }
}

}  // namespace

RedisDailyGenerator::RedisDailyGenerator(std::string_view redis_url, RedisDailyOptions opts) {
  std::shared_ptr<WallClock> clock = opts.clock ? opts.clock : system_wall_clock();
  validate(opts, floor_div(clock->now_ms(), 1000));
  redis::ConnectionOptions co = connection_options(redis_url, opts);
  impl_ = std::make_unique<Impl>(std::move(opts), std::move(co));
  impl_->clock = std::move(clock);
  impl_->fork_gen = detail::fork_generation();
  impl_->pid = ::getpid();
  distlock::detail::Error ec;
  {
    distlock::detail::LockGuard lk(impl_->mu);
    impl_->conn.connect(ec);
  }
  if (ec) throw_error(ec, ec.detail());
}

RedisDailyGenerator::~RedisDailyGenerator() = default;

std::uint64_t RedisDailyGenerator::next() {
  return detail::next_or_throw([&](std::uint64_t& id) { return impl_->next(id); });
}

std::uint64_t RedisDailyGenerator::next(std::error_code& ec) noexcept {
  return detail::next_or_code(ec, [&](std::uint64_t& id) { return impl_->next(id); });
}

std::uint64_t RedisDailyGenerator::round_trips() const noexcept {
  return impl_->round_trips.load(std::memory_order_relaxed);
}

const RedisDailyOptions& RedisDailyGenerator::options() const noexcept {
  return impl_->opts;
}

}  // namespace distlock::ids
