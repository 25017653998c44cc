// Revoke on etcd (Backend::revoke, docs/etcd.md "Revoke"): the holder's queue key moves
// off the holder's session lease onto a lease of its own that nobody keeps alive, with
// the value "@revoked\n<owner>", in one Txn compared on the key's create_revision and
// lease (the holder's TTL + 1 s), kept alive after the Txn. The key keeps its create_revision, so it stays
// first in the queue (nobody is granted) until that lease runs out; the holder's next renewal finds its key
// on another lease (not ours: revoked), and its delete of the key (release, forget) is compared on its own
// lease, so it cannot hand the lock on early either.
//
// The same Txn puts the lock-delay marker "lost\n<W ms>" (etcd_delay.cpp; W: the holder's
// granted TTL, or its own lock-delay if longer) on a third lease M that outlives the key's by
// W + 1 s: whoever is first once the key is gone waits W on its own clock from a read that
// saw the marker, so after the Txn's apply, and the holder's local deadline (its last
// renewal, sent before that apply, + its TTL) has passed. Only once a keepalive of the key's
// lease is answered (that lease then outlasts the holder's deadline itself) is the marker
// put back as it was before the Txn: a confirmed revoke hands over as fast as without it.
// Every keepalive of the key's lease rides one stream behind a keepalive of M, so one that
// etcd applies but whose answer is lost moves M as well: M still ends W + 1 s after it.
#include <algorithm>
#include <chrono>

#include "engine/delay_marker.hpp"
#include "etcd/etcd_backend_impl.hpp"

namespace distlock::detail::etcd {

namespace {

constexpr int kRevokeAttempts = 5;
// Keepalives of the revoked key's lease after the Txn, until one is answered.
constexpr int kRevokeKeepAliveTries = 3;

}  // namespace

std::string EtcdBackend::revoke_note_key(std::string_view name) const {
  return (prefix_.empty() ? std::string() : prefix_ + "/") + std::string(kRevokedDir) + encode_name(name);
}

std::int64_t EtcdBackend::grant_free_lease(std::int64_t ttl_s, Error& ec) {
  etcdserverpb::LeaseGrantRequest req;
  req.set_ttl(ttl_s);
  etcdserverpb::LeaseGrantResponse resp;
  const grpc::Status st = transport_.call(
      [&](etcd::Stubs& s, grpc::ClientContext& ctx) { return s.lease->LeaseGrant(&ctx, req, &resp); });
  if (!st.ok()) {
    set_error(st, ec, "LeaseGrant");
    return 0;
  }
  if (!resp.error().empty() || resp.ttl() <= 0) {
    ec.fail(errc::protocol_error, "etcd LeaseGrant(" + std::to_string(ttl_s) + ") answered TTL " +
                                      std::to_string(resp.ttl()) + " error \"" + resp.error() + "\"");
    return 0;
  }
  return resp.id();
}

bool EtcdBackend::keep_alive_behind(std::int64_t first, std::int64_t id) noexcept {
  try {
    bool renewed = false;
    const grpc::Status st = transport_.call([&](etcd::Stubs& s, grpc::ClientContext& ctx) {
      revoke_step(RevokeStep::kKeepAlive);
      auto stream = s.lease->LeaseKeepAlive(&ctx);
      // Both requests are written before either answer is read: etcd's server loop reads a
      // stream's requests one at a time and renews each before it reads the next, so `id` is
      // renewed only after `first` was, a moment before (whether or not an answer gets back).
      etcdserverpb::LeaseKeepAliveRequest req_first;
      req_first.set_id(first);
      etcdserverpb::LeaseKeepAliveRequest req;
      req.set_id(id);
      etcdserverpb::LeaseKeepAliveResponse resp_first;
      etcdserverpb::LeaseKeepAliveResponse resp;
      if (stream->Write(req_first) && stream->Write(req) && stream->Read(&resp_first) && stream->Read(&resp))
        renewed = resp_first.id() == first && resp.id() == id && resp.ttl() > 0;
      stream->WritesDone();
      return stream->Finish();
    });
    return st.ok() && renewed;
  } catch (...) {
    return false;
  }
}

void EtcdBackend::revoke_lease(std::int64_t id) noexcept {
  try {
    etcdserverpb::LeaseRevokeRequest req;
    req.set_id(id);
    etcdserverpb::LeaseRevokeResponse resp;
    (void)transport_.call(
        [&](etcd::Stubs& s, grpc::ClientContext& ctx) { return s.lease->LeaseRevoke(&ctx, req, &resp); });
  } catch (...) {  // the lease runs out by itself
  }
}

bool EtcdBackend::restore_marker(std::string_view name, const std::optional<mvccpb::KeyValue>& prior,
                                 std::int64_t revoke_rev) noexcept {
  try {
    const std::string mkey = delay_key(name);
    etcdserverpb::TxnRequest txn;
    Compare* c = txn.add_compare();
    c->set_result(Compare::EQUAL);
    c->set_target(Compare::MOD);
    c->set_key(mkey);
    c->set_mod_revision(revoke_rev);
    if (prior) {
      auto* put = txn.add_success()->mutable_request_put();
      put->set_key(mkey);
      put->set_value(prior->value());
      put->set_lease(prior->lease());
    } else {
      txn.add_success()->mutable_request_delete_range()->set_key(mkey);
    }
    etcdserverpb::TxnResponse resp;
    const grpc::Status st = transport_.call(
        [&](etcd::Stubs& s, grpc::ClientContext& ctx) { return s.kv->Txn(&ctx, txn, &resp); });
    if (!st.ok()) {
      log_.log(LogLevel::warning,
               "etcd revoke of lock \"{}\": its lock-delay marker could not be put back ({}): the next "
               "holder waits it out",
               name, transport_.to_error(st).detail());
      return false;
    }
    // Not succeeded: taken over by the next holder after its wait, or changed by a later
    // revoke; either way it is no longer ours to put back.
    return true;
  } catch (...) {
    return false;
  }
}

Backend::Revoked EtcdBackend::revoke(std::string_view name, std::string_view note, Millis note_life,
                                     Error& ec) {
  ec.clear();
  const std::string lp = lock_prefix(name);
  for (int attempt = 1; attempt <= kRevokeAttempts; ++attempt) {
    // The holder: the lowest key of the queue, unless a lost holder's lock-delay still runs
    // (read at the same revision): the lowest key then is a waiter waiting it out.
    etcdserverpb::RangeResponse lresp;
    etcdserverpb::RangeResponse mresp;
    grpc::Status st = read_first(name, lp, false, lresp, mresp);
    if (!st.ok()) {
      set_error(st, ec, "revoke Range");
      return {};
    }
    // Nobody holds it, or the holder was revoked already (its key waits out its lease).
    if (lresp.kvs_size() == 0 || lresp.kvs(0).value().starts_with(kRevokedValue)) return {};
    if (!first_holds(lresp.kvs(0), mresp.kvs_size() == 1 ? &mresp.kvs(0) : nullptr)) return {};
    const mvccpb::KeyValue holder = lresp.kvs(0);

    // The holder's lease: its granted TTL bounds how far its last keepalive moved it.
    etcdserverpb::LeaseTimeToLiveRequest treq;
    treq.set_id(holder.lease());
    etcdserverpb::LeaseTimeToLiveResponse tresp;
    st = transport_.call([&](etcd::Stubs& s, grpc::ClientContext& ctx) {
      return s.lease->LeaseTimeToLive(&ctx, treq, &tresp);
    });
    if (!st.ok()) {
      set_error(st, ec, "revoke LeaseTimeToLive");
      return {};
    }
    if (tresp.ttl() < 0 || tresp.grantedttl() <= 0) continue;  // the lease ended: its key goes with it

    // The revoked key's lease L: the holder's granted TTL (its keepalives move its lease's
    // end at most that far) plus one second, kept alive after the Txn (below). The holder
    // may renew between this grant and the Txn; its local deadline is then up to that gap
    // past grant + TTL. The keepalive after the Txn covers any gap; when none is answered,
    // the lock-delay marker the Txn writes does.
    const auto granted_at = std::chrono::steady_clock::now();
    const std::int64_t hold_s = tresp.grantedttl() + 1;
    const std::int64_t hold_lease = grant_free_lease(hold_s, ec);
    if (ec) return {};
    // The marker's wait W: the holder's granted TTL bounds its local deadline past the Txn's
    // apply (its last confirmed renewal was sent before it); a lock-delay of its own that is
    // longer is kept (a revoke is a loss). Its lease M, granted after L, ends at least W + 1 s
    // after L's unrenewed end, so whoever is first once the revoked key is gone reads it.
    const mvccpb::KeyValue* const marker = mresp.kvs_size() == 1 ? &mresp.kvs(0) : nullptr;
    std::optional<mvccpb::KeyValue> prior_marker;
    if (marker != nullptr) prior_marker = *marker;
    Millis wait = std::chrono::seconds(tresp.grantedttl());
    if (marker != nullptr) {
      const auto m = parse_delay_marker<std::int64_t>(marker->value());
      if (m && m->armed && m->holder == holder.create_revision()) wait = std::max(wait, m->delay);
    }
    const std::int64_t wait_s = (wait.count() + 999) / 1000;
    const std::int64_t marker_lease = grant_free_lease(hold_s + wait_s + 1, ec);
    if (ec) {
      revoke_lease(hold_lease);
      return {};
    }
    const std::int64_t note_lease = grant_free_lease(ttl_seconds(note_life), ec);
    if (ec) {
      revoke_lease(hold_lease);
      revoke_lease(marker_lease);
      return {};
    }
    revoke_step(RevokeStep::kGranted);

    etcdserverpb::TxnRequest txn;
    Compare* c = txn.add_compare();
    c->set_result(Compare::EQUAL);
    c->set_target(Compare::CREATE);
    c->set_key(holder.key());
    c->set_create_revision(holder.create_revision());
    c = txn.add_compare();
    c->set_result(Compare::EQUAL);
    c->set_target(Compare::LEASE);
    c->set_key(holder.key());
    c->set_lease(holder.lease());
    // The marker is still the one read with the holder (0: none).
    c = txn.add_compare();
    c->set_result(Compare::EQUAL);
    c->set_target(Compare::MOD);
    c->set_key(delay_key(name));
    c->set_mod_revision(marker != nullptr ? marker->mod_revision() : 0);
    auto* put = txn.add_success()->mutable_request_put();
    put->set_key(holder.key());
    put->set_value(std::string(kRevokedValue) + holder.value());
    put->set_lease(hold_lease);
    auto* note_put = txn.add_success()->mutable_request_put();
    note_put->set_key(revoke_note_key(name));
    note_put->set_value(std::to_string(holder.create_revision()) + "\n" + holder.value() + "\n" +
                        std::string(note));
    note_put->set_lease(note_lease);
    auto* marker_put = txn.add_success()->mutable_request_put();
    marker_put->set_key(delay_key(name));
    marker_put->set_value(lost_delay_marker(wait));
    marker_put->set_lease(marker_lease);
    etcdserverpb::TxnResponse resp;
    etcd::CallInfo info;
    st = transport_.call(
        [&](etcd::Stubs& s, grpc::ClientContext& ctx) { return s.kv->Txn(&ctx, txn, &resp); }, &info);
    // The window the extra second must cover: from L's grant to the Txn's answer (the
    // holder's last confirmed renewal was sent before the Txn was applied), not the
    // keepalive tries after it.
    const auto txn_answered = std::chrono::steady_clock::now();
    if (!st.ok()) {
      // Maybe applied: the lease then holds the key and must stay; it ends by itself.
      set_error(st, ec, "revoke Txn");
      if (!info.maybe_applied) {
        revoke_lease(hold_lease);
        revoke_lease(marker_lease);
        revoke_lease(note_lease);
      }
      return {};
    }
    if (!resp.succeeded()) {
      // The holder changed under us (released, or its lease ended) or its marker did: look again.
      revoke_lease(hold_lease);
      revoke_lease(marker_lease);
      revoke_lease(note_lease);
      continue;
    }
    revoke_step(RevokeStep::kApplied);
    // The holder's last keepalive may have been applied after L was granted (its lease then
    // ends up to that gap later than L): one keepalive of L, sent after the Txn was applied,
    // moves L's end to at least the Txn + the holder's TTL. Then, and only then, the marker
    // may go back to what it was. Each keepalive of L (each transport attempt of each try)
    // follows one of M on its stream: one that etcd applies and whose answer is lost moves
    // L's end up to its TTL past it, and M's end, moved just before, stays W + 1 s past that.
    bool kept = false;
    for (int i = 0; i < kRevokeKeepAliveTries && !kept; ++i)
      kept = keep_alive_behind(marker_lease, hold_lease);
    const long long gap_ms = std::chrono::duration_cast<Millis>(txn_answered - granted_at).count();
    if (!kept) {
      log_.log(
          LogLevel::warning,
          "etcd revoke of lock \"{}\": no keepalive after the revoke was answered ({} tries; its lease was "
          "granted {} ms before the revoke's Txn was answered); the revoke's lock-delay marker stays: "
          "the next holder waits {} ms after the revoked key ends",
          name, kRevokeKeepAliveTries, gap_ms, wait.count());
    } else {
      // Not put back (no answer): the marker stays (a waiter waits W more) unless someone
      // changed it since. M, kept alive just before L on the answered stream, outlives L.
      (void)restore_marker(name, prior_marker, resp.header().revision());
    }
    Revoked r;
    r.revoked = true;
    r.token = static_cast<std::uint64_t>(holder.create_revision());
    r.holder = holder.value();
    return r;
  }
  ec.fail(errc::backend_unavailable, "etcd revoke of lock \"" + std::string(name) +
                                         "\": the holder changed " + std::to_string(kRevokeAttempts) +
                                         " times under the revoke");
  return {};
}

std::optional<std::string> EtcdBackend::revoke_note(std::string_view name, Error& ec) {
  ec.clear();
  RangeRequest req;
  req.set_key(revoke_note_key(name));
  etcdserverpb::RangeResponse resp;
  const grpc::Status st = transport_.call(
      [&](etcd::Stubs& s, grpc::ClientContext& ctx) { return s.kv->Range(&ctx, req, &resp); });
  if (!st.ok()) {
    set_error(st, ec, "revoke note Range");
    return std::nullopt;
  }
  if (resp.kvs_size() == 0) return std::nullopt;
  return resp.kvs(0).value();
}

}  // namespace distlock::detail::etcd
