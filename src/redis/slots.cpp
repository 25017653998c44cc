#include "redis/slots.hpp"

#include <array>
#include <vector>

namespace distlock::detail::redis {

namespace {

std::uint16_t crc16(std::string_view s) noexcept {  // CRC16-CCITT (XMODEM), as Redis Cluster
  std::uint16_t crc = 0;
  for (unsigned char c : s) {
    crc = static_cast<std::uint16_t>(crc ^ (static_cast<std::uint16_t>(c) << 8));
    for (int i = 0; i < 8; ++i) {
      crc = (crc & 0x8000) != 0 ? static_cast<std::uint16_t>((crc << 1) ^ 0x1021)
                                : static_cast<std::uint16_t>(crc << 1);
    }
  }
  return crc;
}

// Every slot is hit by some number below 200,000 (about 170,000 are needed); the
// loop stops when all 16,384 are found.
std::vector<std::string> build_tags() {
  std::vector<std::string> tags(kSlots);
  std::size_t found = 0;
  for (std::uint32_t n = 0; found < kSlots; ++n) {
    std::string t = std::to_string(n);
    std::string& slot = tags[crc16(t) & (kSlots - 1)];
    if (slot.empty()) {
      slot = std::move(t);
      ++found;
    }
  }
  return tags;
}

}  // namespace

std::uint16_t key_slot(std::string_view key) noexcept {
  const auto open = key.find('{');
  if (open != std::string_view::npos) {
    const auto close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1) key = key.substr(open + 1, close - open - 1);
  }
  return static_cast<std::uint16_t>(crc16(key) & (kSlots - 1));
}

const std::string& slot_tag(std::uint16_t slot) {
  static const std::vector<std::string> tags = build_tags();
  return tags[slot & (kSlots - 1)];
}

}  // namespace distlock::detail::redis
