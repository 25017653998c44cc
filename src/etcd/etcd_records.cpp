#include "etcd/etcd_records.hpp"

#include <fmt/format.h>

#include <iterator>
#include <map>

#include "etcd/etcd_keys.hpp"

namespace distlock::detail::etcd {

namespace {

using etcdserverpb::Compare;
using etcdserverpb::RangeRequest;

// Keys read per Range while listing.
constexpr std::int64_t kPage = 512;
// A listing whose pinned revision was compacted meanwhile starts over, this often at most.
constexpr int kListAttempts = 3;

// The holder and queue length of one lock, as the scan found them.
struct Queue {
  std::uint64_t keys = 0;
  std::int64_t create_rev = 0;
  std::int64_t lease = 0;
  std::string owner;
};

}  // namespace

Records::Records(Transport& transport, const std::string& prefix)
    : transport_(transport), base_(prefix.empty() ? std::string() : prefix + "/") {}

std::string Records::record_key(std::string_view key) const {
  std::string k = base_;
  k.append(kRecordsDir);
  k.append(key);
  return k;
}

void Records::fail(const grpc::Status& st, Error& ec, std::string_view what) const {
  const Error err = transport_.to_error(st);
  ec.fail(err, fmt::format("{}: {}", what, err.detail()));
}

std::string Records::put(std::string_view key, std::string_view value, PutMode mode, Error& ec) {
  ec.clear();
  if (!record_value_fits(key, value, ec)) return {};
  const std::string k = record_key(key);
  if (mode == PutMode::fenced) {
    // A compare-and-set loop: the Txn replaces the record only while it holds the value read.
    const auto replace = [&](std::string_view expected, Error& e) {
      etcdserverpb::TxnRequest txn;
      Compare* cmp = txn.add_compare();
      cmp->set_result(Compare::EQUAL);
      cmp->set_target(Compare::VALUE);
      cmp->set_key(k);
      cmp->set_value(std::string(expected));
      auto* put = txn.add_success()->mutable_request_put();
      put->set_key(k);
      put->set_value(std::string(value));
      etcdserverpb::TxnResponse resp;
      const grpc::Status st =
          transport_.call([&](Stubs& s, grpc::ClientContext& ctx) { return s.kv->Txn(&ctx, txn, &resp); });
      if (!st.ok()) fail(st, e, "etcd record fenced-put Txn");
      return st.ok() && resp.succeeded();
    };
    return fenced_put_by_cas(
        key, value, [&](Error& e) { return get(key, e); },
        [&](Error& e) { return put(key, value, PutMode::if_absent, e); }, replace, ec);
  }
  if (mode == PutMode::always) {
    etcdserverpb::PutRequest req;
    req.set_key(k);
    req.set_value(std::string(value));
    etcdserverpb::PutResponse resp;
    const grpc::Status st =
        transport_.call([&](Stubs& s, grpc::ClientContext& ctx) { return s.kv->Put(&ctx, req, &resp); });
    if (!st.ok()) {
      fail(st, ec, "etcd record put");
      return {};
    }
    return std::string(value);
  }
  // One Txn: create if absent, else read what is there. A retried Txn whose first
  // attempt was applied reads our own value back, which is the right answer too.
  etcdserverpb::TxnRequest txn;
  Compare* cmp = txn.add_compare();
  cmp->set_result(Compare::EQUAL);
  cmp->set_target(Compare::CREATE);
  cmp->set_key(k);
  cmp->set_create_revision(0);
  auto* put = txn.add_success()->mutable_request_put();
  put->set_key(k);
  put->set_value(std::string(value));
  txn.add_failure()->mutable_request_range()->set_key(k);
  etcdserverpb::TxnResponse resp;
  const grpc::Status st =
      transport_.call([&](Stubs& s, grpc::ClientContext& ctx) { return s.kv->Txn(&ctx, txn, &resp); });
  if (!st.ok()) {
    fail(st, ec, "etcd record put-if-absent Txn");
    return {};
  }
  if (resp.succeeded()) return std::string(value);
  if (resp.responses_size() != 1 || resp.responses(0).response_range().kvs_size() != 1) {
    ec = make_error_code(errc::protocol_error);
    ec.set_detail("etcd put-if-absent Txn found the record but returned no value for it");
    return {};
  }
  return resp.responses(0).response_range().kvs(0).value();
}

std::optional<std::string> Records::get(std::string_view key, Error& ec) {
  ec.clear();
  RangeRequest req;
  req.set_key(record_key(key));
  etcdserverpb::RangeResponse resp;
  const grpc::Status st =
      transport_.call([&](Stubs& s, grpc::ClientContext& ctx) { return s.kv->Range(&ctx, req, &resp); });
  if (!st.ok()) {
    fail(st, ec, "etcd record get");
    return std::nullopt;
  }
  if (resp.kvs_size() == 0) return std::nullopt;
  return resp.kvs(0).value();
}

bool Records::erase(std::string_view key, Error& ec) {
  ec.clear();
  etcdserverpb::DeleteRangeRequest req;
  req.set_key(record_key(key));
  etcdserverpb::DeleteRangeResponse resp;
  CallInfo info;
  const grpc::Status st = transport_.call(
      [&](Stubs& s, grpc::ClientContext& ctx) { return s.kv->DeleteRange(&ctx, req, &resp); }, &info);
  if (!st.ok()) {
    fail(st, ec, "etcd record delete");
    return false;
  }
  // A retry after an attempt that may have been applied finds nothing: that was
  // our own delete.
  return resp.deleted() > 0 || info.maybe_applied;
}

std::vector<ListedLock> Records::list_held(std::string_view prefix, std::size_t limit, bool& truncated,
                                           Error& ec) {
  ec.clear();
  truncated = false;
  const std::string start = base_ + encode_name(prefix);
  const std::string end = prefix_end(start);
  const bool to_the_end = end == std::string(1, '\0');  // etcd's "every key after"

  const std::string records_dir = base_ + std::string(kRecordsDir);

  // The `limit + 1` smallest names seen so far (one more tells `truncated`).
  std::map<std::string, Queue> queues;
  for (int attempt = 1;; ++attempt) {
    queues.clear();
    // An empty key is refused by etcd; "\0" is the first key there is.
    std::string cursor = start.empty() ? std::string(1, '\0') : start;
    std::int64_t revision = 0;  // pinned by the first page
    grpc::Status st;
    while (true) {
      RangeRequest req;
      req.set_key(cursor);
      req.set_range_end(end);
      req.set_limit(kPage);
      req.set_revision(revision);
      etcdserverpb::RangeResponse resp;
      st = transport_.call([&](Stubs& s, grpc::ClientContext& ctx) { return s.kv->Range(&ctx, req, &resp); });
      if (!st.ok()) break;
      if (revision == 0) revision = resp.header().revision();
      bool skipped_records = false;
      for (const auto& kv : resp.kvs()) {
        const std::string& key = kv.key();
        if (key.starts_with(records_dir)) {
          cursor = prefix_end(records_dir);  // jump over the records
          skipped_records = true;
          break;
        }
        const std::string_view rest = std::string_view(key).substr(base_.size());
        const auto slash = rest.find('/');
        if (slash == std::string_view::npos) continue;  // not a lock key
        auto name = decode_name(rest.substr(0, slash));
        if (!name) continue;
        auto it = queues.find(*name);
        if (it == queues.end()) {
          if (queues.size() > limit && *name > std::prev(queues.end())->first) continue;
          it = queues.emplace(std::move(*name), Queue{}).first;
          // The new name is below the largest, which goes (never the new one).
          if (queues.size() - 1 > limit) queues.erase(std::prev(queues.end()));
        }
        Queue& q = it->second;
        ++q.keys;
        if (q.create_rev == 0 || kv.create_revision() < q.create_rev) {
          q.create_rev = kv.create_revision();
          q.lease = kv.lease();
          q.owner = kv.value();
        }
      }
      if (skipped_records) {
        if (!to_the_end && cursor >= end) break;
        continue;
      }
      if (!resp.more() || resp.kvs_size() == 0) break;
      cursor = resp.kvs(resp.kvs_size() - 1).key();
      cursor.push_back('\0');  // the next key after the last one read
    }
    if (st.ok()) break;
    if (st.error_code() == grpc::StatusCode::OUT_OF_RANGE && attempt < kListAttempts) continue;  // compacted
    fail(st, ec, "etcd listing of held locks");
    return {};
  }
  if (queues.size() > limit) {
    truncated = true;
    queues.erase(std::prev(queues.end()));
  }

  // The lock-delay markers of the names under the prefix: a first key waiting out a lost
  // holder's delay holds nothing (etcd_delay.cpp).
  std::map<std::string, std::string> markers;
  if (!queues.empty()) {
    const std::string mstart = base_ + std::string(kDelayDir) + encode_name(prefix);
    RangeRequest req;
    req.set_key(mstart);
    req.set_range_end(prefix_end(mstart));
    etcdserverpb::RangeResponse resp;
    const grpc::Status st =
        transport_.call([&](Stubs& s, grpc::ClientContext& ctx) { return s.kv->Range(&ctx, req, &resp); });
    if (!st.ok()) {
      fail(st, ec, "etcd listing of lock-delay markers");
      return {};
    }
    const std::size_t skip = base_.size() + kDelayDir.size();
    for (const auto& kv : resp.kvs()) {
      if (kv.key().size() <= skip) continue;
      if (auto name = decode_name(std::string_view(kv.key()).substr(skip)))
        markers.emplace(*name, kv.value());
    }
  }

  std::vector<ListedLock> out;
  out.reserve(queues.size());
  std::map<std::int64_t, std::int64_t> ttl_of_lease;  // seconds; -1: the lease is gone
  for (auto& [name, q] : queues) {
    if (q.owner.starts_with(kRevokedValue)) continue;  // a revoked key waiting out its lease
    if (auto m = markers.find(name); m != markers.end() && !marker_lets_first_hold(m->second, q.create_rev))
      continue;  // a waiter first in the queue waiting out a lost holder's lock-delay
    ListedLock l;
    l.name = name;
    l.info.held = true;
    l.info.token = static_cast<std::uint64_t>(q.create_rev);
    l.info.holder = std::move(q.owner);
    l.info.waiters = q.keys - 1;
    if (q.lease != 0) {
      auto t = ttl_of_lease.find(q.lease);
      if (t == ttl_of_lease.end()) {
        etcdserverpb::LeaseTimeToLiveRequest treq;
        treq.set_id(q.lease);
        etcdserverpb::LeaseTimeToLiveResponse tresp;
        const grpc::Status st = transport_.call(
            [&](Stubs& s, grpc::ClientContext& ctx) { return s.lease->LeaseTimeToLive(&ctx, treq, &tresp); });
        if (!st.ok()) {
          fail(st, ec, "etcd LeaseTimeToLive while listing held locks");
          return {};
        }
        t = ttl_of_lease.emplace(q.lease, tresp.ttl()).first;
      }
      // -1: the holder's lease has just expired, its keys are being deleted and the
      // lock is not held by it any more. 0: less than a second left (whole seconds).
      if (t->second < 0) continue;
      if (t->second > 0) l.info.ttl_remaining = std::chrono::seconds(t->second);
    }
    out.push_back(std::move(l));
  }
  return out;
}

}  // namespace distlock::detail::etcd
