// Records and the listing of held locks for the etcd backend (engine/backend.hpp:
// put_record, get_record, erase_record, list_held).
//
// - A record is the plain key `<prefix>/%records/<record key>` (etcd/etcd_keys.hpp),
//   put without a lease: it never expires and outlives the client that wrote it. No
//   encoded lock name starts with "%r", so a record and a lock never share a key.
// - put(always) is one Put; put(if_absent) is one Txn (create_revision == 0 → put,
//   else read), so two clients racing get the same answer.
// - list_held reads the lock keys below the prefix in pages of one pinned revision
//   (one consistent snapshot), keeps per lock the key with the lowest create_revision
//   (the holder) and the number of keys (queue length), then asks the holder's lease
//   for its TTL: one LeaseTimeToLive per listed lock.
//
// Thread-safety: every member may be called from any thread (Transport is).
//
// Example:
//   etcd::Records records(transport, "distlock");
//   std::string n = records.put("jobs\x1fsem", "4", PutMode::if_absent, ec);  // "4", or what was there
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "engine/backend.hpp"
#include "etcd/etcd_transport.hpp"

namespace distlock::detail::etcd {

class Records {
 public:
  /// `prefix` without a trailing '/' ("" for none), as the backend's lock keys use it.
  Records(Transport& transport, const std::string& prefix);

  std::string put(std::string_view key, std::string_view value, PutMode mode, Error& ec);
  std::optional<std::string> get(std::string_view key, Error& ec);
  bool erase(std::string_view key, Error& ec);
  std::vector<ListedLock> list_held(std::string_view prefix, std::size_t limit, bool& truncated, Error& ec);

 private:
  std::string record_key(std::string_view key) const;
  void fail(const grpc::Status& st, Error& ec, std::string_view what) const;

  Transport& transport_;
  std::string base_;  // "<prefix>/" or ""
};

}  // namespace distlock::detail::etcd
