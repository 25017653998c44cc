// redlock://[user:password@]h1:p1,h2:p2,h3:p3[?prefix=P&timeout=DUR] — one lock
// over N >= 3 independent Redis masters (Redlock). A lock is held while a
// majority (N/2 + 1) of the masters hold its key for this owner; every request
// fans out to all masters at once, each bounded by a per-node timeout
// (`timeout=`, default min(50 ms, ttl/10)). No fencing tokens: independent
// masters cannot agree on a strictly increasing counter (see docs/redlock.md).
// redlocks://...?cacert=CA.pem[&cert=C.pem&key=K.pem] is the same over TLS to every
// master (the certificate of each is verified against CA and the host it was
// reached by), on the Redis stack's sockets (redis/socket.hpp).
//
// Thread-safety: the backend is used by the engine from many threads at once.
//
// Example:
//   auto client = distlock::connect("redlock://127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003");
//   distlock::Lease lease = client.acquire("orders/42");  // lease.has_token() == false
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "engine/backend.hpp"
#include "engine/url.hpp"

namespace distlock::detail {

namespace redlock {

/// The settings a redlock:// URL carries.
struct Config {
  std::vector<Url::Host> masters;  ///< distinct; a missing port is 6379
  std::string user, password;
  std::string prefix = "distlock:redlock:";  ///< `prefix=`: start of every key and channel
  std::optional<Millis> node_timeout{};      ///< `timeout=`; default min(50 ms, ttl/10)
};

/// Checks and extracts the settings; errc::invalid_url naming the offending part.
Error parse_config(const Url& url, Config& out);

/// Key and release channel of a lock name on every master.
std::string lock_key(const Config& cfg, std::string_view name);
std::string release_channel(const Config& cfg, std::string_view name);
/// Key of a record on every master: `<prefix>record:<key>` (locks are `<prefix>lock:<name>`).
std::string record_key(const Config& cfg, std::string_view key);
/// "<prefix>revoked:<name>": the note of the last revoke of lock `name` (it expires).
std::string revoke_note_key(const Config& cfg, std::string_view name);
/// "<prefix>delay:<name>": the lock-delay marker of lock `name` on one master (scripts.hpp).
std::string delay_key(const Config& cfg, std::string_view name);

}  // namespace redlock

std::unique_ptr<Backend> make_redlock_backend(const Url& url, const ClientOptions& opts, Error& err);

}  // namespace distlock::detail
