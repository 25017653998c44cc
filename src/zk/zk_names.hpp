// ZooKeeper paths of the lock recipe, kept free of I/O so they can be unit-tested.
//
// Layout (below the URL's chroot):
//   /distlock                                   persistent root
//   /distlock/<encoded name>                    container node, one per lock name
//   /distlock/<encoded name>/<guid>-lock-<seq>  ephemeral sequential, one per holder/waiter
//   /distlock/<encoded name>/revoked            persistent: the last revoke's note
//   /distlock/<encoded name>/delay              persistent: the lock-delay marker (zk_delay.cpp)
//   /distlock/.sessions/<session id, 16 hex>    ephemeral, one per client session (zk_watch.cpp)
// <guid> is "<encoded owner>.<attempt>": the owner id (client id and thread) plus a per-attempt
// number, so a create whose answer was lost can be found again (and only that create).
//
// Thread-safety: pure functions.
//
// Example:
//   encode_component("orders/42")            == "orders%2F42"
//   parse_lock_node("ab%3A1.7-lock-0000000003") -> {guid "ab%3A1.7", seq 3}
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace distlock::detail::zk {

inline constexpr std::string_view kRoot = "/distlock";
inline constexpr std::string_view kLockMarker = "-lock-";
/// The revoke note of a lock: a persistent child of its directory (not a lock node: no
/// kLockMarker), "<token>\n<holder owner>\n<note>" of the last revoke.
inline constexpr std::string_view kRevokedNode = "revoked";
/// The data a revoke gives the holder's node ("@revoked\n<owner>"): held by nobody, the
/// node waits for its holder's lease to run out. An owner never starts with '@'.
inline constexpr std::string_view kRevokedValue = "@revoked\n";
/// The lock-delay marker of a lock: a persistent child of its directory (not a lock node).
inline constexpr std::string_view kDelayNode = "delay";
/// Whether the first node of a queue (czxid `first_czxid`) holds the lock, given the value of
/// its lock-delay marker (zk_delay.cpp): not while a lost holder's delay runs (a "lost"
/// marker, or an armed one naming another node): the first node is then a waiter waiting it
/// out. A marker distlock did not write says nothing (the acquisition fails on it).
inline bool marker_lets_first_hold(std::string_view marker, std::uint64_t first_czxid) {
  if (marker.starts_with("lost\n")) return false;
  if (!marker.starts_with("armed\n")) return true;
  return marker.substr(6).starts_with(std::to_string(first_czxid) + "\n");
}

/// Where each session of the backend keeps an ephemeral node named after its session id
/// (session_presence_path): a watch tells a holder's release (its session still there) from
/// the end of its session (zk_watch.cpp). ".sessions" never decodes as a lock name.
inline constexpr std::string_view kSessionsDir = "/distlock/.sessions";
/// "/distlock/.sessions/<session id as 16 lower-case hex digits>".
std::string session_presence_path(std::int64_t session_id);

/// Encodes arbitrary bytes as one valid ZooKeeper path component: [A-Za-z0-9_-] stay,
/// every other byte becomes %XX (so '/', '.', control bytes and non-UTF-8 are safe and
/// distinct names never collide).
std::string encode_component(std::string_view raw);
/// Inverse of encode_component; nullopt when `enc` is not a valid encoding.
std::optional<std::string> decode_component(std::string_view enc);

/// "/distlock/<encoded name>".
std::string lock_dir(std::string_view name);
/// The guid of one acquisition attempt of `owner`.
std::string make_guid(std::string_view owner, std::uint64_t attempt);
/// The owner encoded in a guid (nullopt if malformed).
std::optional<std::string> owner_of_guid(std::string_view guid);

struct LockNode {
  std::string node;  ///< the child's name
  std::string guid;
  std::uint64_t seq = 0;
};

/// Parses "<guid>-lock-<seq>"; nullopt for a child that is not one of our lock nodes.
std::optional<LockNode> parse_lock_node(std::string_view node);
/// Our lock nodes among `children`, in queue order (ascending sequence number).
std::vector<LockNode> queue_order(const std::vector<std::string>& children);
/// The lock name of a watched path "/distlock/<encoded name>/<node>" (nullopt otherwise).
std::optional<std::string> name_of_node_path(std::string_view path);

/// Checks a chroot from the URL ("" or "/" = none): absolute, no empty, "." or ".."
/// components, no trailing '/'. Returns an explanation, or "" when valid.
std::string chroot_problem(std::string_view chroot);

}  // namespace distlock::detail::zk
