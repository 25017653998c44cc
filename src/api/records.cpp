// Client::get_record / put_record: the public face of the backends' records
// (core/backend.hpp), under the key "<name>\x1f<tag>".
#include <algorithm>
#include <string>

#include "api/primitives.hpp"
#include "distlock/client.hpp"
#include "engine/backend.hpp"
#include "engine/engine.hpp"
#include "engine/names.hpp"

namespace distlock {

namespace {

constexpr std::size_t kMaxTag = 32;

std::string record_what(std::string_view name, std::string_view tag) {
  // A NUL byte (refused in a name, but shown when it is) would end the message of what().
  std::string shown(name.substr(0, 200));
  std::replace(shown.begin(), shown.end(), '\0', '?');
  std::string shown_tag(tag.substr(0, kMaxTag + 1));
  std::replace(shown_tag.begin(), shown_tag.end(), '\0', '?');
  return "record \"" + shown_tag + "\" of \"" + shown + "\"";
}

/// The record's key; throws errc::invalid_argument naming what is wrong with name or tag.
std::string record_key(std::string_view name, std::string_view tag) {
  const auto bad = [&](const std::string& problem) {
    throw_error(make_error_code(errc::invalid_argument), record_what(name, tag) + ": " + problem);
  };
  if (tag.empty() || tag.size() > kMaxTag) bad("the tag must be 1 to 32 bytes long");
  for (char c : tag) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    if (!ok) bad("the tag may hold only a-z, 0-9, '_' and '-'");
  }
  for (std::string_view own : detail::names::kLibraryRecordTags) {
    if (tag == own) bad("the tag \"" + std::string(own) + "\" is the library's own");
  }
  if (name.empty()) bad("the lock name is empty");
  std::string key = detail::names::derived(name, tag);
  if (const detail::Error err = detail::Engine::check_name(key)) bad("the record's key: " + err.detail());
  return key;
}

[[noreturn]] void record_error(detail::Engine& engine, std::string_view name, std::string_view tag,
                               const detail::Error& ec) {
  std::string msg = record_what(name, tag);
  if (ec == errc::not_supported) msg += ": backend " + engine.backend().url() + " keeps no records";
  throw_error(ec, msg + ec.suffix());
}

}  // namespace

std::optional<std::string> Client::get_record(std::string_view name, std::string_view tag) {
  const std::string key = record_key(name, tag);
  if (engine_->forked()) {
    throw_error(make_error_code(errc::forked), record_what(name, tag) + ": client used in a forked child");
  }
  detail::Error ec;
  std::optional<std::string> value = engine_->backend().get_record(key, ec);
  if (ec) record_error(*engine_, name, tag, ec);
  return value;
}

void Client::put_record(std::string_view name, std::string_view tag, std::string_view value) {
  const std::string key = record_key(name, tag);
  if (value.size() > detail::kMaxRecordValue) {
    throw_error(make_error_code(errc::invalid_argument),
                record_what(name, tag) + ": a value of " + std::to_string(value.size()) +
                    " bytes is larger than the limit of " + std::to_string(detail::kMaxRecordValue) +
                    " bytes (64 KiB)");
  }
  if (engine_->forked()) {
    throw_error(make_error_code(errc::forked), record_what(name, tag) + ": client used in a forked child");
  }
  detail::Error ec;
  engine_->backend().put_record(key, value, detail::PutMode::always, ec);
  if (ec) record_error(*engine_, name, tag, ec);
}

}  // namespace distlock
