// Key layout of the etcd backend, kept free of I/O.
//
// Below the URL's prefix P ("distlock" by default):
//   P/<encoded lock name>/<lease hex>-<seq>   one queued key per owner thread (attached to a lease)
//   P/%records/<record key>                   one record (no lease: never expires)
//   P/%revoked/<encoded lock name>            the last revoke's note (on a lease of its own)
//   P/%delay/<encoded lock name>              the holder's lock-delay marker, or a revoke's
//                                             until it is confirmed (docs/etcd.md)
//   P/%released/<lease hex>                   the queue key a session's last release deleted
//                                             (on the session lease; etcd_prefix_watch.cpp)
//   P/%sync/<lease hex>-<watch seq>           a prefix watch's sync marker (on a session lease)
// Lock names are arbitrary bytes; '%' and '/' are percent-encoded ("%25", "%2F"), so an
// encoded name never contains '/', never starts with "%r", and the code is prefix-free:
// enc(a) is a prefix of enc(b) exactly when a is a prefix of b.
//
// Thread-safety: pure functions.
//
// Example:
//   encode_name("orders/42")        == "orders%2F42"
//   decode_name("orders%2F42")      == "orders/42"
//   prefix_end("a/")                == "a0"
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace distlock::detail::etcd {

/// The marker of the records namespace below the prefix (never an encoded lock name).
inline constexpr std::string_view kRecordsDir = "%records/";
/// The revoke notes' namespace below the prefix (never an encoded lock name either).
inline constexpr std::string_view kRevokedDir = "%revoked/";
/// The lock-delay markers' namespace below the prefix.
inline constexpr std::string_view kDelayDir = "%delay/";
/// The release marks' namespace: a release's Txn puts "<its deleted key>" there, on the
/// releasing session's lease, so a watcher tells a release from any other delete.
inline constexpr std::string_view kReleasedDir = "%released/";
/// The prefix watches' sync markers (etcd_prefix_watch.cpp).
inline constexpr std::string_view kSyncDir = "%sync/";
/// The value a revoke gives the holder's queue key ("@revoked\n<owner>"): held by nobody,
/// it waits out the lease the revoke put it on. An owner never starts with '@'.
inline constexpr std::string_view kRevokedValue = "@revoked\n";

/// Whether the first key of a queue (create_revision `first_rev`) holds the lock, given the
/// value of its lock-delay marker (etcd_delay.cpp): not while a lost holder's delay runs (a
/// "lost" marker, or an armed one naming another key): the first key is then a waiter
/// waiting it out. A marker distlock did not write says nothing (the acquisition fails on it).
inline bool marker_lets_first_hold(std::string_view marker, std::int64_t first_rev) {
  if (marker.starts_with("lost\n")) return false;
  if (!marker.starts_with("armed\n")) return true;
  return marker.substr(6).starts_with(std::to_string(first_rev) + "\n");
}

inline std::string encode_name(std::string_view name) {
  std::string out;
  out.reserve(name.size());
  for (const char c : name) {
    if (c == '%') {
      out += "%25";
    } else if (c == '/') {
      out += "%2F";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

/// Inverse of encode_name; nullopt for text encode_name never produces.
inline std::optional<std::string> decode_name(std::string_view enc) {
  std::string out;
  out.reserve(enc.size());
  for (std::size_t i = 0; i < enc.size(); ++i) {
    if (enc[i] == '/') return std::nullopt;
    if (enc[i] != '%') {
      out.push_back(enc[i]);
      continue;
    }
    const std::string_view code = enc.substr(i, 3);
    if (code == "%25") {
      out.push_back('%');
    } else if (code == "%2F") {
      out.push_back('/');
    } else {
      return std::nullopt;
    }
    i += 2;
  }
  return out;
}

/// The first key after every key starting with `prefix` (etcd's range_end).
inline std::string prefix_end(std::string prefix) {
  while (!prefix.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(prefix.back());
    if (last < 0xff) {
      ++last;
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');  // every key
}

}  // namespace distlock::detail::etcd
