// Records and the listing of held locks for the ZooKeeper backend (engine/backend.hpp:
// put_record, get_record, erase_record, list_held).
//
// Layout (below the URL's chroot, beside the lock directories of zk_names.hpp):
//   /distlock/.records                   persistent, made on first use
//   /distlock/.records/<encoded key>     persistent node per record, data = the value
// ".records" is never an encoded lock name ('.' is always %2E there), so a record and a
// lock never share a node; the record nodes are persistent, not ephemeral: they outlive
// the session that wrote them.
//
// - put(if_absent): create; on "node exists" read it (a record deleted in between: create
//   again). put(always): set; on "no node" create; on "node exists" set again. Both with
//   a bounded number of rounds.
// - list_held: the children of /distlock (one round trip), decoded and filtered on the
//   user's bytes, sorted; then per batch of lock names one pipelined round trip for their
//   queues and one for the holders' Stat (token = czxid), until `limit` are found.
//
// Thread-safety: every member may be called from any thread (each call takes the
// current session from the backend).
//
// Example:
//   zk::Records records(env);
//   auto v = records.get("jobs\x1fsem", ec);
#pragma once

#include <zookeeper/zookeeper.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "engine/backend.hpp"
#include "zk/zk_call.hpp"

namespace distlock::detail::zk {

inline constexpr std::string_view kRecordsDir = "/distlock/.records";

/// What the records need from the backend.
struct RecordsEnv {
  /// The current session's handle once connected, kept open by `keep`; nullptr at the deadline.
  std::function<zhandle_t*(Clock::time_point deadline, std::shared_ptr<void>& keep)> session;
  const ACL_vector* node_acl = nullptr;  ///< for the records directory and record nodes
  const ACL_vector* root_acl = nullptr;  ///< for /distlock when it is missing
  std::shared_ptr<Clock> clock;          ///< the client's clock: every deadline is taken on it
  Millis connect_timeout{};
  Millis command_timeout{};
  std::string url;  ///< redacted, for messages
};

class Records {
 public:
  explicit Records(RecordsEnv env) : env_(std::move(env)) {}

  std::string put(std::string_view key, std::string_view value, PutMode mode, Error& ec);
  std::optional<std::string> get(std::string_view key, Error& ec);
  bool erase(std::string_view key, Error& ec);
  std::vector<ListedLock> list_held(std::string_view prefix, std::size_t limit, bool& truncated, Error& ec);

 private:
  /// Sets `ec` and the error detail for ZooKeeper code `rc` of step `what`.
  void fail(int rc, std::string_view what, Error& ec) const;
  /// Creates /distlock and /distlock/.records if missing; ZOK or the failing code.
  int ensure_dir(zhandle_t* zh, Clock::time_point deadline) const;
  /// zk::await on the injected clock.
  int await(const ReplyPtr& reply, Clock::time_point deadline) const {
    return zk::await(reply, *env_.clock, deadline);
  }

  RecordsEnv env_;
};

}  // namespace distlock::detail::zk
