#include "etcd/etcd_backend.hpp"

#include "etcd/etcd_backend_impl.hpp"
#include "etcd/etcd_url.hpp"

namespace distlock::detail {
namespace etcd {

LockInfo EtcdBackend::status(std::string_view name, Error& ec) {
  ec.clear();
  const std::string lp = lock_prefix(name);
  // Every place, in creation order: the holder first, then the waiters in the order
  // the lock passes on in (each watches the one created just before it); and the
  // lock-delay marker at the same revision.
  etcdserverpb::RangeResponse resp;
  etcdserverpb::RangeResponse marker;
  grpc::Status st = read_first(name, lp, true, resp, marker);
  if (!st.ok()) {
    set_error(st, ec, "status Range");
    return {};
  }
  LockInfo info;
  info.waiters_listed = true;  // waiting_since: a key records a revision, no time
  // The first key is a waiter itself while it waits out a lost holder's lock-delay.
  const bool first_waits = resp.kvs_size() > 0 && !resp.kvs(0).value().starts_with(kRevokedValue) &&
                           !first_holds(resp.kvs(0), marker.kvs_size() == 1 ? &marker.kvs(0) : nullptr);
  for (int i = first_waits ? 0 : 1; i < resp.kvs_size(); ++i) {
    WaiterInfo w;
    w.owner = resp.kvs(i).value();
    info.waiter_list.push_back(std::move(w));
  }
  info.waiters = info.waiter_list.size();
  if (resp.kvs_size() == 0 || first_waits) return info;
  const auto& kv = resp.kvs(0);
  // A revoked holder's key waits out its lease first in the queue: held by nobody.
  if (kv.value().starts_with(kRevokedValue)) return info;
  info.held = true;
  info.token = static_cast<std::uint64_t>(kv.create_revision());
  info.holder = kv.value();
  etcdserverpb::LeaseTimeToLiveRequest treq;
  treq.set_id(kv.lease());
  etcdserverpb::LeaseTimeToLiveResponse tresp;
  st = transport_.call(
      [&](etcd::Stubs& s, grpc::ClientContext& ctx) { return s.lease->LeaseTimeToLive(&ctx, treq, &tresp); });
  if (st.ok() && tresp.ttl() > 0) info.ttl_remaining = std::chrono::seconds(tresp.ttl());
  return info;
}

}  // namespace etcd

// ---- factory ---------------------------------------------------------------

std::unique_ptr<Backend> make_etcd_backend(const Url& url, const ClientOptions& opts, Error& err) {
  etcd::UrlConfig parsed;
  if ((err = etcd::parse_url(url, opts, parsed))) return nullptr;
  auto backend = std::make_unique<etcd::EtcdBackend>(std::move(parsed.transport), std::move(parsed.prefix),
                                                     url.redacted(), opts);
  if ((err = backend->probe())) {
    err.set_detail("cannot use etcd at " + url.redacted() + ": " + err.detail());
    return nullptr;
  }
  backend->start();
  return backend;
}

}  // namespace distlock::detail
