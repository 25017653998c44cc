// Small integer helpers shared by the redis-daily generator and its layout functions.
#pragma once

#include <cstdint>

namespace distlock::ids::detail {

inline constexpr std::int64_t kSecondsPerDay = 86400;
/// The largest value of redis-daily's 31-bit seconds field.
inline constexpr std::int64_t kMaxRedisDailySeconds = (std::int64_t{1} << 31) - 1;

/// Division rounding toward negative infinity (days and seconds before 1970 stay correct).
inline constexpr std::int64_t floor_div(std::int64_t a, std::int64_t b) {
  return a / b - ((a % b != 0) && ((a < 0) != (b < 0)));
}

}  // namespace distlock::ids::detail
