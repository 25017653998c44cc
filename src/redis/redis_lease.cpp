// The redis:// backend's renewal, release and release watches, and the WAIT that
// checks a write reached wait=N replicas.
#include "redis/redis_backend_impl.hpp"

namespace distlock::detail::redis {

void RedisBackend::renew(std::span<const RenewItem> items, std::span<RenewStatus> out, Error& ec) {
  ec.clear();
  std::fill(out.begin(), out.end(), RenewStatus::failed);
  if (items.empty()) return;
  auto conn = lock_link(ec);
  if (ec) return;
  // Keys and arguments live here; the calls hold views into them.
  std::vector<std::string> keys, ttls;
  keys.reserve(items.size());
  ttls.reserve(items.size());
  for (const auto& it : items) {
    keys.push_back(lock_key(it.name));
    ttls.push_back(std::to_string(it.ttl.count()));
  }
  std::vector<std::string_view> key_views(keys.begin(), keys.end());
  std::vector<std::string_view> arg_views;
  arg_views.reserve(2 * items.size());
  for (std::size_t i = 0; i < items.size(); ++i) {
    arg_views.push_back(items[i].owner);
    arg_views.push_back(ttls[i]);
  }
  std::vector<Script::Call> calls;
  for (std::size_t at = 0; at < items.size(); at += kRenewChunk) {
    const std::size_t n = std::min(kRenewChunk, items.size() - at);
    calls.push_back({std::span(key_views).subspan(at, n), std::span(arg_views).subspan(2 * at, 2 * n)});
  }
  std::vector<Reply> replies = renew_script().run_pipelined(*conn, calls, ec);
  if (ec) {
    failed("renew", ec);
    return;
  }
  ok();
  // With wait=N a renewal that fewer than N replicas acknowledged counts as failed
  // (retried until the local deadline): a failover could lose its extension.
  const bool unreplicated = wait_replicas_ > 0 && !replicated(*conn, "renewal");
  for (std::size_t c = 0; c < calls.size(); ++c) {
    const redisReply* r = replies[c].get();
    const std::size_t at = c * kRenewChunk;
    if (r == nullptr || r->type != REDIS_REPLY_ARRAY || r->elements != calls[c].keys.size()) {
      log_.log(
          LogLevel::warning, "{}: renew script answered {}", conn_opts_.describe(),
          r && r->type == REDIS_REPLY_ERROR ? redis::reply_str(r) : std::string_view("an unexpected reply"));
      // READONLY (a demoted master), LOADING, MASTERDOWN...: the call fails with
      // backend_unavailable, so a layer that finds the master (redis+sentinel://)
      // looks for the new one now. No item of this call counts as renewed.
      if (redis::error_code_of(r) == errc::backend_unavailable) {
        ec = make_error_code(errc::backend_unavailable);
        std::fill(out.begin(), out.end(), RenewStatus::failed);
        return;
      }
      continue;  // those items stay `failed`: retried until their local deadline
    }
    for (std::size_t i = 0; i < r->elements; ++i) {
      const redisReply* e = r->element[i];
      out[at + i] = e->type == REDIS_REPLY_INTEGER && e->integer == 1
                        ? (unreplicated ? RenewStatus::failed : RenewStatus::renewed)
                        : RenewStatus::not_owner;
      // A lost lease is never released through here: forget its queue entry now.
      if (out[at + i] == RenewStatus::not_owner) unhold_entry(items[at + i].name, items[at + i].owner);
    }
  }
}

ReleaseStatus RedisBackend::release(std::string_view name, std::string_view owner, std::uint64_t /*token*/,
                                    Error& ec) {
  ec.clear();
  // Forgotten only once the release script ran: a late grant message for the
  // entry arriving before that would otherwise hand on the lock under us.
  struct Unhold {
    RedisBackend* self;
    std::string_view name, owner;
    ~Unhold() { self->unhold_entry(name, owner); }
  } unhold{this, name, owner};
  auto conn = lock_link(ec);
  if (ec) return ReleaseStatus::released;
  const Keys& k = keys_for_call(name);
  Reply r = redis::queue_release_script().run(*conn, {k.lock, k.queue, k.expiries, k.fence},
                                              {owner, k.released, grant_prefix_}, ec);
  if (ec) {
    failed("release", ec);
    return ReleaseStatus::released;
  }
  ok();
  if (r->type != REDIS_REPLY_INTEGER) {
    ec = r->type == REDIS_REPLY_ERROR ? redis::error_code_of(r.get()) : make_error_code(errc::protocol_error);
    return ReleaseStatus::released;
  }
  return r->integer < 0 ? ReleaseStatus::not_owner : ReleaseStatus::released;
}

// Owner- and token-checked: a lease of this owner taken since (another token), or
// another owner's, is never touched. Best effort: the lock's TTL stays the bound.
void RedisBackend::forget(std::string_view name, std::string_view owner, std::uint64_t token) noexcept {
  try {
    struct Unhold {
      RedisBackend* self;
      std::string_view name, owner;
      ~Unhold() { self->unhold_entry(name, owner); }
    } unhold{this, name, owner};
    Error ec;
    auto conn = lock_link(ec);
    if (ec) return;
    const Keys k = keys_of(name);
    Reply r = redis::queue_forget_script().run(*conn, {k.lock, k.queue, k.expiries, k.fence},
                                               {owner, std::to_string(token), k.released, grant_prefix_}, ec);
    if (ec) {
      failed("forget a lost lease", ec);
      return;
    }
    ok();
  } catch (...) {  // out of memory: the lock expires after its ttl
  }
}

// One script (redis::revoke_script): the holder's record goes, the note is stored
// beside the lock, and the lock key keeps its expiry: the queue hands it on when it expires.
RedisBackend::Revoked RedisBackend::revoke(std::string_view name, std::string_view note, Millis note_life,
                                           Error& ec) {
  ec.clear();
  auto conn = lock_link(ec);
  if (ec) return {};
  const Keys k = keys_of(name);
  const std::string note_key = revoke_note_key(name), life = std::to_string(note_life.count());
  Reply r = redis::revoke_script().run(*conn, {k.lock, note_key}, {note, life, prefix_ + ":"}, ec);
  if (ec) {
    failed("revoke", ec);
    return {};
  }
  ok();
  if (r->type == REDIS_REPLY_ERROR) {
    ec.fail(redis::error_code_of(r.get()),
            conn_opts_.describe() + ": revoke: " + std::string(redis::reply_str(r.get())));
    return {};
  }
  if (r->type != REDIS_REPLY_ARRAY || r->elements < 1 || r->element[0]->type != REDIS_REPLY_INTEGER) {
    unexpected("revoke", ec);
    return {};
  }
  if (r->element[0]->integer == 0) return {};
  if (r->elements != 3 || r->element[1]->type != REDIS_REPLY_STRING ||
      r->element[2]->type != REDIS_REPLY_STRING) {
    unexpected("revoke", ec);
    return {};
  }
  Revoked out;
  out.revoked = true;
  const std::string_view token = redis::reply_str(r->element[1]);
  std::uint64_t t = 0;
  for (char c : token) t = t * 10 + static_cast<std::uint64_t>(c - '0');
  out.token = t;
  out.holder = std::string(redis::reply_str(r->element[2]));
  if (wait_replicas_ > 0) (void)replicated(*conn, "revoke");
  return out;
}

std::optional<std::string> RedisBackend::revoke_note(std::string_view name, Error& ec) {
  ec.clear();
  auto conn = checkout(ec);
  if (ec) return std::nullopt;
  Reply r = conn->command({"GET", revoke_note_key(name)}, ec);
  if (!answered(r, "read the revoke note", ec)) return std::nullopt;
  if (r->type == REDIS_REPLY_NIL) return std::nullopt;
  if (r->type != REDIS_REPLY_STRING) return unexpected("read the revoke note", ec), std::nullopt;
  return std::string(redis::reply_str(r.get()));
}

// A failed watch leaves nothing counted or subscribed (the subscriber undoes it)
// and hands the cause to the caller's error.
void RedisBackend::watch(std::string_view name, Error& ec) {
  subscriber_.watch(lock_key(name) + ":released", ec);
  if (ec) {
    const std::string why = ec.detail();
    log_.log(LogLevel::warning, "cannot wait for a release of \"{}\": {}", name, why);
    ec.set_detail("cannot wait for a release of \"" + std::string(name) + "\": " + why);
  }
}

void RedisBackend::unwatch(std::string_view name) noexcept {
  try {
    subscriber_.unwatch(lock_key(name) + ":released");
  } catch (...) {  // out of memory building the channel name: the watch stays, harmless
  }
}

// "<prefix>:{<name>}:released" → name.
void RedisBackend::on_channel(std::string_view channel) {
  if (channel.substr(0, grant_prefix_.size()) == grant_prefix_) {
    waits_.wake_all();  // the subscription broke or came back: grants may have been missed
    return;
  }
  constexpr std::string_view kTail = "}:released";
  release_messages_.fetch_add(1, std::memory_order_relaxed);
  const std::size_t head = prefix_.size() + 2;
  if (channel.size() < head + kTail.size()) return;
  ChangeListener* l = listener_.load();
  if (l) l->on_change(channel.substr(head, channel.size() - head - kTail.size()));
}

// WAIT wait_replicas_ wait_timeout_ after a write on `conn`. False (with a warning
// naming the count) when fewer replicas acknowledged it or WAIT failed.
bool RedisBackend::replicated(redis::Link& conn, const char* what, long long* acked_out) {
  const std::string n = std::to_string(wait_replicas_);
  const std::string ms = std::to_string(wait_timeout_.count());
  Error ec;
  Reply r = conn.command({"WAIT", n, ms}, ec);
  long long acked = -1;
  if (!ec && r && r->type == REDIS_REPLY_INTEGER) acked = r->integer;
  if (acked_out) *acked_out = acked;
  if (acked >= wait_replicas_) return true;
  if (acked < 0) {
    log_.log(LogLevel::warning, "{}: WAIT after the {} failed: {}", conn_opts_.describe(), what,
             ec ? ec.detail() : std::string("unexpected reply"));
  } else {
    log_.log(LogLevel::warning, "{}: only {} of {} replicas acknowledged the {} within {} ms (wait={})",
             conn_opts_.describe(), acked, wait_replicas_, what, wait_timeout_.count(), wait_replicas_);
  }
  return false;
}

}  // namespace distlock::detail::redis
