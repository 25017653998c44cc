// The backends a cross-backend test runs against, each started by the test itself:
// one redis-server, three Redlock masters, etcd as one member or a 3-member cluster,
// ZooKeeper standalone or a 3-server ensemble, one PostgreSQL, one MariaDB, a file:// directory. Used by the
// conformance suite (tests/conformance) and the nemesis run (tests/nemesis).
//
// A new backend adds one Target class in backend_targets.cpp and one push_back in
// kinds() there.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace distlock::testing {

/// How the servers of a target are started.
struct TargetOptions {
  /// Servers keep their data across kill_and_restart() (Redis: appendonly with
  /// appendfsync always, the persistence the Redis and Redlock backends require).
  bool durable = false;
  /// Query appended to redlock:// URLs. The default per-master timeout of 1 s keeps
  /// 64 contenders on 2 shared cores (slower still under sanitizers) from turning a
  /// starved master into a spurious quorum failure.
  std::string redlock_query = "?timeout=1s";
  /// The members of an etcd cluster or ZooKeeper ensemble reach each other only through
  /// fault proxies, so that isolate() can cut one off from its peers.
  bool peer_proxies = false;
};

/// One backend under test: its URL, what can be read on its servers without going
/// through distlock, and the faults its servers can be put through.
class Target {
 public:
  virtual ~Target() = default;
  virtual std::string url() = 0;
  /// Tokens are fencing tokens (strictly increasing per name).
  virtual bool fencing() const { return true; }
  /// Tokens are dense: each acquisition of a name issues the previous token + 1.
  virtual bool dense_tokens() const { return false; }
  /// Leases expire when their holder stops renewing (false: host-local kernel locks,
  /// held by a paused process until it dies).
  virtual bool expires() const { return true; }
  /// The longest lock TTL, in ms, the target's URL lets a client ask for (zk://: twice
  /// its session timeout).
  virtual std::int64_t max_ttl_ms() const { return 366LL * 24 * 3600 * 1000; }
  /// How long, in ms, a waiter that died while queued may keep the next one waiting
  /// after a release, for a dead waiter that asked for `waiter_ttl_ms`
  /// (docs/design.md "A dead waiter"): 3 s, or the backend's documented floor.
  virtual std::int64_t dead_waiter_bound_ms(std::int64_t /*waiter_ttl_ms*/) const { return 3000; }
  /// Lock records, queue entries, sessions/leases and subscriptions left on the
  /// servers, described one per string ("key ...", "node ...", "channel ...",
  /// "leases: ..."). Empty once every client is gone.
  virtual std::vector<std::string> leftovers() = 0;
  /// The servers' client ports (empty for host-local backends), and the URL that
  /// reaches them at other host:ports (fault proxies); host-local: url().
  virtual std::vector<std::uint16_t> ports() { return {}; }
  virtual std::string url_via(const std::string& /*hosts*/) { return url(); }
  /// Servers that can be paused or killed: member indexes 0 .. members()-1.
  virtual int members() { return 0; }
  virtual void pause(int /*member*/) {}
  virtual void resume(int /*member*/) {}
  virtual void kill_and_restart(int /*member*/) {}
  /// Kills member `member`, keeps it down for `down_for`, deletes its data and starts it
  /// again, empty, on the same port. False (nothing done) where the target cannot.
  virtual bool wipe_and_restart(int /*member*/, std::chrono::milliseconds /*down_for*/) { return false; }
  /// A member wiped by wipe_and_restart() (kept down for wipe_down_for()) leaves the
  /// lock's guarantees intact: the other members keep the data (a quorum), or the member
  /// stays unreachable until every lock it held has expired (Redlock's delayed restart).
  virtual bool survives_wipe() const { return false; }
  /// How long a wiped member must stay down, for a run whose longest TTL is `max_ttl`.
  virtual std::chrono::milliseconds wipe_down_for(std::chrono::milliseconds /*max_ttl*/) const {
    return std::chrono::milliseconds(0);
  }
  /// Cuts member `member` off from its peers (both ways; its client port stays
  /// reachable) until heal(). False (nothing done) where the target has no peer links
  /// to cut or was not made with TargetOptions::peer_proxies.
  virtual bool isolate(int /*member*/) { return false; }
  virtual void heal() {}
  /// The servers' own logs, as (file name, text), for a kept run to be read after the
  /// fact (DISTLOCK_NEMESIS_KEEP); empty where the target keeps none.
  virtual std::vector<std::pair<std::string, std::string>> server_logs() { return {}; }
  /// Server role changes that no fault of the test caused (a Sentinel failover),
  /// described; empty when there was none.
  virtual std::string unplanned_role_changes() { return {}; }
};

struct Kind {
  std::string label;
  std::function<std::unique_ptr<Target>(const TargetOptions&)> make;
  /// Reached over TCP (fault proxies can stand in between); false: host-local.
  bool networked = true;
  /// Run by the nemesis (the single-member forms of a cluster are left to its
  /// 3-member form there).
  bool in_nemesis = true;
};

void PrintTo(const Kind& k, std::ostream* os);

/// Every backend of this build, file first.
std::vector<Kind> kinds();
/// Those of kinds() reached over TCP (fault proxies can stand in between).
std::vector<Kind> networked_kinds();

}  // namespace distlock::testing
