// The lock-delay marker of the queue backends (etcd://, zk://; docs/design.md "Lock-delay"):
// one text, written once for both. A holder with a delay D keeps "armed\n<holder id>\n<D ms>"
// (the id: its key's create_revision on etcd, its node's czxid on zk); the next acquirer that
// finds it naming a holder that is gone turns it into "lost\n<D ms>".
//
// Thread-safety: free functions over values.
//
// Example:
//   const auto m = parse_delay_marker<std::int64_t>(armed_delay_marker(7, Millis(2000)));
//   // m->armed, m->holder == 7, m->delay == 2000ms
#pragma once

#include <charconv>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "distlock/options.hpp"

namespace distlock::detail {

template <class HolderId>
struct DelayMarker {
  bool armed = false;  ///< written by a holder (else: a lost holder's delay is running)
  HolderId holder{};   ///< armed: the holder's id
  Millis delay{0};     ///< D
};

/// "armed\n<holder>\n<D ms>".
template <class HolderId>
std::string armed_delay_marker(HolderId holder, Millis delay) {
  return "armed\n" + std::to_string(holder) + "\n" + std::to_string(delay.count());
}

/// "lost\n<D ms>".
inline std::string lost_delay_marker(Millis delay) {
  return "lost\n" + std::to_string(delay.count());
}

namespace delay_marker_detail {
template <class Int>
bool parse_int(std::string_view s, Int& out) {
  if (s.empty()) return false;
  const auto [p, err] = std::from_chars(s.data(), s.data() + s.size(), out);
  return err == std::errc() && p == s.data() + s.size();
}
}  // namespace delay_marker_detail

/// The marker in `v`, or nullopt when it is neither form (or its D is negative).
template <class HolderId>
std::optional<DelayMarker<HolderId>> parse_delay_marker(std::string_view v) {
  using delay_marker_detail::parse_int;
  DelayMarker<HolderId> m;
  std::int64_t d = 0;
  if (v.starts_with("armed\n")) {
    v.remove_prefix(6);
    const auto nl = v.find('\n');
    if (nl == std::string_view::npos || !parse_int(v.substr(0, nl), m.holder) ||
        !parse_int(v.substr(nl + 1), d))
      return std::nullopt;
    m.armed = true;
  } else if (v.starts_with("lost\n")) {
    if (!parse_int(v.substr(5), d)) return std::nullopt;
  } else {
    return std::nullopt;
  }
  if (d < 0) return std::nullopt;
  m.delay = Millis(d);
  return m;
}

}  // namespace distlock::detail
