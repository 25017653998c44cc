// The one definition behind src/engine/backend.hpp that every backend shares.
#include "engine/backend.hpp"

#include <charconv>
#include <optional>
#include <string>

#include "distlock/error.hpp"

namespace distlock::detail {

bool record_value_fits(std::string_view key, std::string_view value, Error& ec) {
  if (value.size() <= kMaxRecordValue) return true;
  std::string shown;
  for (char c : key.substr(0, 200)) shown += (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) ? '?' : c;
  ec.fail(errc::invalid_argument, "record \"" + shown + "\": a value of " + std::to_string(value.size()) +
                                      " bytes is larger than the limit of " +
                                      std::to_string(kMaxRecordValue) + " bytes (64 KiB)");
  return false;
}

std::optional<std::uint64_t> record_term(std::string_view record) noexcept {
  const auto nl = record.find('\n');
  if (nl == std::string_view::npos || nl == 0 || nl > 20) return std::nullopt;
  std::uint64_t term = 0;
  const auto [p, err] = std::from_chars(record.data(), record.data() + nl, term);
  if (err != std::errc() || p != record.data() + nl) return std::nullopt;
  return term;
}

bool fenced_put_allowed(std::string_view existing, std::string_view value) noexcept {
  const auto have = record_term(existing);
  if (!have) return true;
  const auto mine = record_term(value);
  return mine && *have <= *mine;
}

}  // namespace distlock::detail
