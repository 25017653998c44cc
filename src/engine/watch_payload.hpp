// The text form of the change messages that lock scripts and statements publish for a
// prefix watch (Backend::watch_prefix), read the same way by every backend that publishes
// them (redis://: src/redis/redis_watch.cpp; postgres://: src/postgres/postgres_watch.cpp):
// space-separated fields, the first of them the kind ("acquired", "released", "lost",
// "revoked", or a watch's own "sync" marker). Each backend lays out the fields after the kind.
#pragma once

#include <optional>
#include <string_view>

#include "engine/backend.hpp"

namespace distlock::detail {

/// Takes the next space-separated field off the front of `p` (all of `p` when it has no
/// space left).
inline std::string_view take_field(std::string_view& p) {
  const auto sp = p.find(' ');
  const std::string_view f = p.substr(0, sp);
  p = sp == std::string_view::npos ? std::string_view{} : p.substr(sp + 1);
  return f;
}

/// The event kind a message's first field names; nullopt for any other word (a kind of a
/// newer version: not ours to guess).
inline std::optional<LockEvent::Kind> lock_event_kind(std::string_view kind) {
  if (kind == "acquired") return LockEvent::Kind::acquired;
  if (kind == "released") return LockEvent::Kind::released;
  if (kind == "lost") return LockEvent::Kind::lost;
  if (kind == "revoked") return LockEvent::Kind::revoked;
  return std::nullopt;
}

}  // namespace distlock::detail
