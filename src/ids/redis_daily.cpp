#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <mutex>

#include "core/url.hpp"
#include "distlock/error.hpp"
#include "distlock/ids.hpp"
#include "ids/time_math.hpp"
#include "redis/connection.hpp"

namespace distlock::ids {

namespace redis = distlock::detail::redis;

namespace {

using detail::floor_div;
using detail::kSecondsPerDay;
constexpr std::int64_t kMaxSecondsField = detail::kMaxRedisDailySeconds;
constexpr std::uint64_t kCounterLimit = std::uint64_t{1} << 32;  // first value that does not fit
constexpr std::uint32_t kMaxReserve = 1u << 20;

}  // namespace

struct RedisDailyGenerator::Impl {
  RedisDailyOptions opts;
  std::shared_ptr<WallClock> clock;

  std::mutex mu;
  // Everything below is guarded by mu. One connection: ids are handed out under the
  // mutex anyway, and a reservation makes round trips rare.
  redis::Connection conn;
  std::int64_t last_seconds = -1;  // timestamp of the last id (unix seconds)
  std::int64_t range_day = -1;     // UTC day (days since 1970) the reserved range belongs to
  std::uint64_t range_next = 0;    // next counter value to hand out
  std::uint64_t range_end = 0;     // one past the last reserved value (<= 2^32)
  // Set when the day counter went back (Redis lost data: a restart without persistence,
  // a failover): ids of this second may carry the values now handed out again, so the
  // next id uses a later second. -1 when not set.
  std::int64_t reset_at_second = -1;
  std::atomic<std::uint64_t> round_trips{0};

  Impl(RedisDailyOptions o, redis::ConnectionOptions co) : opts(std::move(o)), conn(std::move(co)) {}

  // Takes `opts.reserve` counter values of `key` from Redis: [range_next, range_end).
  std::error_code reserve(const std::string& key, std::int64_t day, std::string& why) {
    const std::string amount = std::to_string(opts.reserve);
    std::error_code ec;
    redis::Reply reply;
    // One retry: the first command after a server restart meets the dead socket;
    // the connection then reconnects. A repeated INCRBY only skips values.
    for (int attempt = 0; attempt < 2; ++attempt) {
      round_trips.fetch_add(1, std::memory_order_relaxed);
      reply = opts.reserve == 1 ? conn.command({"INCR", key}, ec) : conn.command({"INCRBY", key, amount}, ec);
      if (ec != errc::backend_unavailable) break;
    }
    if (ec) {
      why = reply ? fmt::format("{}: INCRBY {} failed: {}", conn.options().describe(), key,
                                redis::reply_str(reply.get()))
                  : conn.last_error();
      return ec;
    }
    if (!reply || reply->type != REDIS_REPLY_INTEGER) {
      why = fmt::format("{}: INCRBY {} did not answer an integer", conn.options().describe(), key);
      return make_error_code(errc::protocol_error);
    }
    const long long last = reply->integer;
    const long long first = last - static_cast<long long>(opts.reserve) + 1;
    if (first < 1) {
      why = fmt::format("{}: day counter {} holds {} after INCRBY {} (it was set below zero by someone)",
                        conn.options().describe(), key, last, opts.reserve);
      return make_error_code(errc::protocol_error);
    }
    if (static_cast<std::uint64_t>(first) >= kCounterLimit) {
      why = fmt::format(
          "day counter {} reached {} (the 32-bit counter allows {} ids per day); "
          "no more redis-daily ids under prefix \"{}\" until the next UTC day",
          key, first, kCounterLimit - 1, opts.prefix);
      return make_error_code(errc::exhausted);
    }
    if (day == range_day && static_cast<std::uint64_t>(first) < range_next) {
      reset_at_second = last_seconds;
    }
    range_day = day;
    range_next = static_cast<std::uint64_t>(first);
    range_end = std::min<std::uint64_t>(static_cast<std::uint64_t>(last) + 1, kCounterLimit);
    return {};
  }

  std::error_code next(std::uint64_t& id, std::string& why) {
    std::lock_guard lk(mu);
    return next_locked(id, why);
  }

  std::error_code next_locked(std::uint64_t& id, std::string& why) {
    // The timestamp never goes back within a generator (ids keep increasing). That is
    // safe for uniqueness: a counter value is unique within its day's key, and the
    // timestamp used always lies in the day whose key the value came from.
    const std::int64_t now = floor_div(clock->now_ms(), 1000);
    std::int64_t floor_seconds = last_seconds;
    if (reset_at_second >= 0) {
      // After Redis lost data the counter values are handed out again: move to a later
      // second than any id issued before (running up to one second ahead of the clock
      // rather than blocking), where none of the old values were used.
      floor_seconds = std::max(floor_seconds, reset_at_second + 1);
      reset_at_second = -1;
    }
    const std::int64_t seconds = std::max(now, floor_seconds);
    const std::int64_t field = seconds - opts.epoch_seconds;
    if (field < 0) {
      why = fmt::format("the wall clock ({} s) is before the redis-daily epoch ({} s)", seconds,
                        opts.epoch_seconds);
      return make_error_code(errc::clock_moved_backwards);
    }
    if (field > kMaxSecondsField) {
      why = fmt::format("the 31-bit seconds field is full ({} s after the epoch {} s)", field,
                        opts.epoch_seconds);
      return make_error_code(errc::exhausted);
    }
    const std::int64_t day = floor_div(seconds, kSecondsPerDay);
    if (day != range_day || range_next >= range_end) {
      // A new day discards what is left of the old day's range: its values belong to
      // the old day's key and would collide with the new day's counter.
      if (auto ec = reserve(redis_daily_key(opts.prefix, seconds), day, why)) return ec;
      if (reset_at_second >= 0) return next_locked(id, why);  // the counter went back
    }
    last_seconds = seconds;
    id = static_cast<std::uint64_t>(field) << 32 | range_next++;
    return {};
  }
};

namespace {

redis::ConnectionOptions connection_options(std::string_view redis_url, const RedisDailyOptions& o) {
  distlock::detail::Url url;
  std::string why;
  if (auto ec = distlock::detail::parse_url(redis_url, url, why)) throw_error(ec, why);
  if (url.scheme != "redis") {
    throw_error(make_error_code(errc::invalid_url),
                fmt::format("redis-daily ids need a redis:// URL; \"{}\" has scheme \"{}\"", url.redacted(),
                            url.scheme));
  }
  if (url.hosts.size() != 1) {
    throw_error(make_error_code(errc::invalid_url),
                fmt::format("redis-daily ids need exactly one host in \"{}\" (got {})", url.redacted(),
                            url.hosts.size()));
  }
  ClientOptions client;
  client.connect_timeout = o.connect_timeout;
  client.command_timeout = o.command_timeout;
  if (auto ec = distlock::detail::apply_common_query(url, client, why)) throw_error(ec, why);
  std::error_code ec;
  redis::ConnectionOptions co = redis::options_from_url(url, 0, client, ec, why);
  if (ec) throw_error(ec, why);
  return co;
}

void validate(const RedisDailyOptions& o, std::int64_t now_seconds) {
  const auto bad = [](const std::string& why) { throw_error(make_error_code(errc::invalid_argument), why); };
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
  std::error_code ec;
  impl_->conn.connect(ec);
  if (ec) throw_error(ec, impl_->conn.last_error());
}

RedisDailyGenerator::~RedisDailyGenerator() = default;

std::uint64_t RedisDailyGenerator::next() {
  std::uint64_t id = 0;
  std::string why;
  if (const std::error_code ec = impl_->next(id, why)) throw_error(ec, why);
  return id;
}

std::uint64_t RedisDailyGenerator::next(std::error_code& ec) noexcept {
  std::uint64_t id = 0;
  std::string why;
  try {
    ec = impl_->next(id, why);
  } catch (const std::system_error& e) {
    ec = e.code();
  } catch (...) {
    ec = make_error_code(errc::protocol_error);
  }
  return ec ? 0 : id;
}

std::uint64_t RedisDailyGenerator::round_trips() const noexcept {
  return impl_->round_trips.load(std::memory_order_relaxed);
}

const RedisDailyOptions& RedisDailyGenerator::options() const noexcept {
  return impl_->opts;
}

}  // namespace distlock::ids
