// The redis-daily id layout (seed document): | 0 | 31 bits seconds since epoch | 32 bits day counter |
// and the name of the day-counter key. Pure functions; the generator is in redis_daily.cpp.
#include <fmt/format.h>

#include <chrono>

#include "distlock/error.hpp"
#include "distlock/ids.hpp"
#include "ids/time_math.hpp"

namespace distlock::ids {

std::string redis_daily_key(std::string_view prefix, std::int64_t unix_seconds) {
  using namespace std::chrono;
  const sys_days day{days{detail::floor_div(unix_seconds, detail::kSecondsPerDay)}};
  const year_month_day ymd{day};
  return fmt::format("icr:{}:{:04}:{:02}:{:02}", prefix, static_cast<int>(ymd.year()),
                     static_cast<unsigned>(ymd.month()), static_cast<unsigned>(ymd.day()));
}

RedisDailyParts decode_redis_daily(std::uint64_t id, std::int64_t epoch_seconds) {
  if (id >> 63) {
    throw_error(make_error_code(errc::invalid_argument),
                fmt::format("{} is not a redis-daily id: its sign bit is set", id));
  }
  return RedisDailyParts{static_cast<std::int64_t>(id >> 32) + epoch_seconds,
                         static_cast<std::uint32_t>(id & 0xffffffffu)};
}

std::uint64_t encode_redis_daily(RedisDailyParts parts, std::int64_t epoch_seconds) {
  const std::int64_t field = parts.unix_seconds - epoch_seconds;
  if (field < 0 || field > detail::kMaxRedisDailySeconds) {
    throw_error(make_error_code(errc::invalid_argument),
                fmt::format("time {} s is outside the 31-bit field from epoch {} s", parts.unix_seconds,
                            epoch_seconds));
  }
  return static_cast<std::uint64_t>(field) << 32 | parts.counter;
}

}  // namespace distlock::ids
