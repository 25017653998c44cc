// The one definition behind src/engine/backend.hpp that every backend shares.
#include "engine/backend.hpp"

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

}  // namespace distlock::detail
