// redis/slots.hpp — Redis Cluster hash slots, shared by redis:// (its fence keys are
// laid out per slot) and redis+cluster:// (routing).
//
// Thread-safety: pure functions; slot_tag's table is built once, thread-safely.
//
// Example:
//   const std::uint16_t s = key_slot("distlock:{order-42}");   // CRC16("order-42") % 16384
//   const std::string fence = "distlock:{" + slot_tag(s) + "}:fence";
//   assert(key_slot(fence) == s);
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace distlock::detail::redis {

inline constexpr std::uint16_t kSlots = 16384;

/// The hash slot of a key, as Redis Cluster computes it: CRC16 (XMODEM) of the part
/// between the first '{' and the next '}' when that part is not empty, else of the
/// whole key; modulo 16384.
std::uint16_t key_slot(std::string_view key) noexcept;

/// A short tag (decimal digits) whose slot is `slot`: the key "<anything>{<tag>}"
/// (with no brace before it) lives in `slot`. The smallest such number.
const std::string& slot_tag(std::uint16_t slot);

}  // namespace distlock::detail::redis
