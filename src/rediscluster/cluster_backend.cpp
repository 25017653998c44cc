// The redis+cluster:// backend: its key layout per name, acquire, release, status,
// records and listing over the routing layer, and the factory.
#include "rediscluster/cluster_backend.hpp"

#include "redis/lock_scripts.hpp"
#include "rediscluster/cluster_backend_impl.hpp"

namespace distlock::detail {

namespace rediscluster {

namespace {

std::uint64_t fnv1a(std::string_view s) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

}  // namespace

std::uint16_t key_slot(std::string_view key) noexcept {
  return redis::key_slot(key);
}

// A name without braces keeps redis://'s layout: "<prefix>:{<name>}", ":fence",
// ":released", ":rv", ":delay", ":q", ":qx" (its hash tag is the name). A name holding '{' or '}' would end
// the tag early or leave it empty (then each key hashes whole, into different slots): its tag is '#' and 16
// hex digits of a hash of the name, and the name follows the tag whole, after a kind letter, so two names
// never share a key even when their hashes collide (they then only share a slot).
NameKeys keys_of(std::string_view prefix, std::string_view name) {
  NameKeys k;
  if (name.find_first_of("{}") == std::string_view::npos) {
    k.lock.append(prefix).append(":{").append(name).append("}");
    k.fence = k.lock + ":fence";
    k.channel = k.lock + ":released";
    k.revoke_note = k.lock + ":rv";
    k.delay = k.lock + ":delay";  // as redis:// (redis/key_layout.hpp delay_key)
    k.queue = k.lock + ":q";
    k.expiries = k.lock + ":qx";
  } else {
    static constexpr char kHex[] = "0123456789abcdef";
    std::string tag = "#";
    const std::uint64_t h = fnv1a(name);
    for (int i = 60; i >= 0; i -= 4) tag.push_back(kHex[(h >> i) & 0xf]);
    const std::string head = std::string(prefix) + ":{" + tag + "}:";
    k.lock = head + "l:" + std::string(name);
    k.fence = head + "f:" + std::string(name);
    k.channel = head + "r:" + std::string(name);
    k.revoke_note = head + "v:" + std::string(name);
    k.delay = head + "d:" + std::string(name);
    k.queue = head + "q:" + std::string(name);
    k.expiries = head + "x:" + std::string(name);
  }
  k.slot = key_slot(k.lock);
  return k;
}

// As redis://: "<prefix>:{<key>}:record" (its slot is the key's, like its lock's);
// a key holding '{' or '}' gets the tag of keys_of() and the kind letter 'k'.
std::string record_key(std::string_view prefix, std::string_view key) {
  const NameKeys k = keys_of(prefix, key);
  if (key.find_first_of("{}") == std::string_view::npos) return k.lock + ":record";
  std::string out = k.lock;
  out[k.lock.size() - key.size() - 2] = 'k';
  return out;
}

// "<prefix>:events:{<tag>}" with the tag of `slot` (redis::slot_tag): the channel lies in
// `slot`, so a lock script of that slot may SPUBLISH on it.
std::string events_channel(std::string_view prefix, std::uint16_t slot) {
  return std::string(prefix) + ":events:{" + redis::slot_tag(slot) + "}";
}

// The inverse of keys_of(prefix, name).lock for both layouts; false for any other key.
bool name_of_lock_key(std::string_view prefix, std::string_view key, std::string& name) {
  if (key.size() <= prefix.size() + 2 || key.substr(0, prefix.size()) != prefix ||
      key.substr(prefix.size(), 2) != ":{")
    return false;
  const std::string_view rest = key.substr(prefix.size() + 2);
  std::string_view n;
  if (!rest.empty() && rest.back() == '}' && rest.find_first_of("{}") == rest.size() - 1) {
    n = rest.substr(0, rest.size() - 1);  // "<prefix>:{<name>}"
  } else if (rest.size() > 21 && rest[0] == '#' && rest.substr(17, 4) == "}:l:") {
    n = rest.substr(21);  // "<prefix>:{#<16 hex>}:l:<name>"
  } else {
    return false;
  }
  if (n.empty() || keys_of(prefix, n).lock != key) return false;
  name = std::string(n);
  return true;
}

namespace {

// KEYS[1] lock hash[, KEYS[2] its lock-delay marker]; ARGV[1] owner, ARGV[2] release
// channel, ARGV[3] the slot's events channel. The release of a lock alone, without its queue,
// for a release the queue's script could not make because a migration split the name's keys
// over two nodes (TRYAGAIN, ClusterBackend::release): the lock is deleted and "released"
// published on the name's channel, so its waiters re-check (their entries stay queued; the
// queue hands the free lock on at the next refresh once the slot has one node again).
// A normal release ends the holder's lock-delay: the marker goes, when named. The field
// holds the owner's queue entry, not a count: one owner holds a name once.
const Script& release_script() {
  static const Script& s = *new Script(std::string(redis::change_event_lua()) + R"lua(
local lock, owner, channel = KEYS[1], ARGV[1], ARGV[2]
if redis.call('HEXISTS', lock, owner) == 0 then
  return -1
end
publish_change(nil, ARGV[3], 'released', redis.call('HGET', lock, '@token') or '0', owner, lock)
redis.call('DEL', lock)
if KEYS[2] then redis.call('DEL', KEYS[2]) end
redis.call('SPUBLISH', channel, 'released')
return 0
)lua");
  return s;
}

// KEYS[1] a released lease's lock-delay marker; ARGV[1] release channel. The second step of a
// release that a migration split from its marker (ClusterBackend::release): deletes it and
// announces the release (the first step, the lock alone, announced it while the marker still
// held the name back).
const Script& split_marker_release_script() {
  static const Script& s = *new Script(R"lua(
redis.call('DEL', KEYS[1])
redis.call('SPUBLISH', ARGV[1], 'released')
return 1
)lua");
  return s;
}

// KEYS[1] lock hash; ARGV[1] owner, ARGV[2] token, ARGV[3] release channel, ARGV[4] the
// slot's events channel (a 'lost' change for Client::watch). The fallback of the queue's
// forget script when a migration splits the name's keys (TRYAGAIN). A lease
// the engine declared lost (Backend::forget): deleted only while `owner` holds it
// under `token`, and the release published as release_script() does. 1 deleted, 0 not.
const Script& forget_script() {
  static const Script& s = *new Script(std::string(redis::change_event_lua()) + R"lua(
local lock, owner, token, channel = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
if redis.call('HEXISTS', lock, owner) == 0 or redis.call('HGET', lock, '@token') ~= token then
  return 0
end
publish_change(nil, ARGV[4], 'lost', token, owner, lock)
redis.call('DEL', lock)
redis.call('SPUBLISH', channel, 'released')
return 1
)lua");
  return s;
}

}  // namespace

// A token or count: an integer reply, or a decimal string (tokens leave the scripts as strings).
ClusterBackend::~ClusterBackend() {
  {
    LockGuard lk(move_mu_);
    stop_ = true;
  }
  move_cv_.notify_all();
  mover_.join();
  // Subscriber threads call back into this object: stop them before anything goes.
  std::vector<std::unique_ptr<redis::Subscriber>> subs;
  std::vector<Node*> all;
  {
    LockGuard lk(map_mu_);
    for (auto& [addr, node] : nodes_) {
      subs.push_back(std::move(node->sub));
      all.push_back(node.get());
    }
  }
  subs.clear();
  // The wait queue's refresher routes calls through the nodes; the subscribers (gone now)
  // handed it grants.
  waits_.reset();
  // Renewal workers: one still reading a hung node returns within the command timeout.
  {
    LockGuard lk(work_mu_);
    work_stop_ = true;
    for (Node* n : all) n->work_cv.notify_all();
  }
  for (Node* n : all) {
    if (n->worker.joinable()) n->worker.join();
  }
}

// Reads the slot map from the first seed that answers.
void ClusterBackend::connect_now(Error& ec) {
  if (refresh_map(map_version(), ec)) return;
  if (!ec) ec = make_error_code(errc::backend_unavailable);  // keeps the detail
}

ReleaseStatus ClusterBackend::release(std::string_view name, std::string_view owner, std::uint64_t /*token*/,
                                      Error& ec) {
  ec.clear();
  const NameKeys k = rediscluster::keys_of(prefix_, name);
  const bool delayed = is_delayed(name, owner);
  const std::string events = events_channel(prefix_, k.slot);
  Reply r;
  bool split = false;  // a migration put the lock and its marker on two nodes
  const redisReply* d = route(
      k.slot, "release",
      [&](Connection& c, bool, Error& e) {
        // The queue's release: the lock goes to the first live waiter (docs/redis-cluster.md
        // "How waiting works"). The marker is named only for a lease with a lock_delay.
        r = delayed ? redis::cluster_queue_release_script().run(
                          c, {k.lock, k.queue, k.expiries, k.fence, k.delay}, {owner, k.channel, events}, e)
                    : redis::cluster_queue_release_script().run(c, {k.lock, k.queue, k.expiries, k.fence},
                                                                {owner, k.channel, events}, e);
        if (r && r->type == REDIS_REPLY_ERROR && starts_with(redis::reply_str(r.get()), "TRYAGAIN")) {
          // A migration split the name's keys (the lock here, its queue or marker not): both
          // nodes refuse a script naming them all. Answered below, one key at a time (a
          // PING's answer ends the routing here).
          split = true;
          r = c.command({"PING"}, e);
        }
        return r.get();
      },
      ec);
  if (split && !ec) {
    // The lock alone (owner-checked, as always), then, once it is gone, its marker alone: while
    // the marker lives nobody else can set one, so the marker deleted is this lease's. The
    // queue is not named: its waiters are told "released" and re-check, and the first live
    // one is granted the free lock by a refresh once the slot's keys are on one node.
    d = route(
        k.slot, "release (lock)",
        [&](Connection& c, bool, Error& e) {
          r = release_script().run(c, {k.lock}, {owner, k.channel, events}, e);
          return r.get();
        },
        ec);
    if (delayed && d != nullptr && !ec && d->type == REDIS_REPLY_INTEGER && d->integer == 0) {
      Reply mr;
      d = route(
          k.slot, "release (marker)",
          [&](Connection& c, bool, Error& e) {
            mr = split_marker_release_script().run(c, {k.delay}, {k.channel}, e);
            return mr.get();
          },
          ec);
      if (d != nullptr && !ec) d = r.get();  // the lock's answer is the release's
    }
  }
  if (!ec) note_delayed(name, owner, false);
  if (d == nullptr || ec) return ReleaseStatus::released;
  if (d->type != REDIS_REPLY_INTEGER) {
    ec = make_error_code(errc::protocol_error);
    return ReleaseStatus::released;
  }
  return d->integer < 0 ? ReleaseStatus::not_owner : ReleaseStatus::released;
}

// Owner- and token-checked on the slot's node: a later lease of the owner, or
// another owner's, is never touched. Best effort: the lock's TTL stays the bound.
void ClusterBackend::forget(std::string_view name, std::string_view owner, std::uint64_t token) noexcept {
  try {
    // A lost lease keeps its lock-delay marker (the forget script does not touch it).
    note_delayed(name, owner, false);
    Error ec;
    const NameKeys k = rediscluster::keys_of(prefix_, name);
    const std::string tok = std::to_string(token);
    const std::string events = events_channel(prefix_, k.slot);
    Reply r;
    route(
        k.slot, "forget",
        [&](Connection& c, bool, Error& e) {
          // The queue's forget: the owner's entries go, the lock is handed on. The marker is
          // named: a lost lease's lock-delay holds the name back from the queue too.
          r = redis::cluster_queue_forget_script().run(c, {k.lock, k.queue, k.expiries, k.fence, k.delay},
                                                       {owner, tok, k.channel, events}, e);
          if (r && r->type == REDIS_REPLY_ERROR && starts_with(redis::reply_str(r.get()), "TRYAGAIN")) {
            // A migration split the name's keys: the lock alone, its waiters told to re-check.
            r = forget_script().run(c, {k.lock}, {owner, tok, k.channel, events}, e);
          }
          return r.get();
        },
        ec);
  } catch (...) {  // out of memory: the lock expires after its ttl
  }
}

// On the slot's master, in one script: the lock deleted and its release published, the
// note stored beside it.
ClusterBackend::Revoked ClusterBackend::revoke(std::string_view name, std::string_view note, Millis note_life,
                                               Error& ec) {
  ec.clear();
  const NameKeys k = rediscluster::keys_of(prefix_, name);
  const std::string life = std::to_string(note_life.count());
  const std::string events = events_channel(prefix_, k.slot);
  Reply r;
  const redisReply* d = route(
      k.slot, "revoke",
      [&](Connection& c, bool, Error& e) {
        r = redis::revoke_script().run(c, {k.lock, k.revoke_note}, {note, life, "", events}, e);
        return r.get();
      },
      ec);
  if (d == nullptr || ec) return {};
  if (d->type != REDIS_REPLY_ARRAY || d->elements < 1 || d->element[0]->type != REDIS_REPLY_INTEGER) {
    unexpected("revoke", ec);
    return {};
  }
  if (d->element[0]->integer == 0) return {};
  Revoked out;
  if (d->elements != 3 || d->element[2]->type != REDIS_REPLY_STRING || !to_u64(d->element[1], out.token)) {
    unexpected("revoke", ec);
    return {};
  }
  out.revoked = true;
  out.holder = std::string(redis::reply_str(d->element[2]));
  return out;
}

std::optional<std::string> ClusterBackend::revoke_note(std::string_view name, Error& ec) {
  ec.clear();
  const NameKeys k = rediscluster::keys_of(prefix_, name);
  Reply r;
  const redisReply* d = route(
      k.slot, "read the revoke note",
      [&](Connection& c, bool, Error& e) {
        r = c.command({"GET", k.revoke_note}, e);
        return r.get();
      },
      ec);
  if (d == nullptr || ec || d->type == REDIS_REPLY_NIL) return std::nullopt;
  if (d->type != REDIS_REPLY_STRING) return unexpected("read the revoke note", ec), std::nullopt;
  return std::string(redis::reply_str(d));
}

// One pipeline of single-key commands on the slot's master (each follows ASK on its own,
// so status works while the slot migrates): the lock hash, its PTTL, the fence counter,
// the queue, its entries' expiries and the node's TIME. The waiters are the queue's live
// entries in hand-off order (expiry after the node's clock), as on redis://.
LockInfo ClusterBackend::status(std::string_view name, Error& ec) {
  ec.clear();
  const NameKeys k = rediscluster::keys_of(prefix_, name);
  std::vector<Reply> r;
  const redisReply* d = route(
      k.slot, "status",
      [&](Connection& c, bool asking, Error& e) -> const redisReply* {
        // ASKING holds for one command: repeat it before each (route sent the first).
        const std::vector<std::vector<std::string_view>> cmds{
            {"HGETALL", k.lock},     {"PTTL", k.lock}, {"GET", k.fence}, {"LRANGE", k.queue, "0", "-1"},
            {"HGETALL", k.expiries}, {"TIME"}};
        for (std::size_t i = 0; i < cmds.size(); ++i) {
          if (asking && i > 0) c.append({"ASKING"});
          c.append(cmds[i]);
        }
        std::vector<Reply> all = c.read_replies(asking ? 2 * cmds.size() - 1 : cmds.size(), e);
        if (e) return nullptr;
        r.clear();
        for (std::size_t i = 0; i < all.size(); ++i) {
          if (asking && i % 2 == 1) continue;  // the ASKINGs' OKs
          r.push_back(std::move(all[i]));
        }
        for (auto& one : r) {
          if (redis::is_error(one.get())) {
            e = redis::error_code_of(one.get());
            return one.get();
          }
        }
        return r[0].get();
      },
      ec);
  if (d == nullptr || ec) return {};
  LockInfo info;
  const redisReply* hash = r[0].get();
  for (std::size_t i = 0; i + 1 < hash->elements; i += 2) {
    const std::string_view field = redis::reply_str(hash->element[i]);
    if (field == "@token") continue;
    info.held = true;
    info.holder = std::string(field);
  }
  if (info.held && r[1]->type == REDIS_REPLY_INTEGER && r[1]->integer >= 0) {
    info.ttl_remaining = Millis(r[1]->integer);
  }
  std::uint64_t token = 0;
  if (to_u64(r[2].get(), token)) info.token = token;
  // The node's clock in ms (TIME: seconds, microseconds), which the queue's expiries use.
  const redisReply* time = r[5].get();
  std::uint64_t sec = 0, usec = 0;
  if (time->type != REDIS_REPLY_ARRAY || time->elements != 2 || !to_u64(time->element[0], sec) ||
      !to_u64(time->element[1], usec)) {
    unexpected("status (TIME)", ec);
    return {};
  }
  const std::uint64_t now_ms = sec * 1000 + usec / 1000;
  std::map<std::string_view, std::uint64_t> expiry;  // "<entry> <owner>" -> expiry ms
  const redisReply* x = r[4].get();
  for (std::size_t i = 0; x->type == REDIS_REPLY_ARRAY && i + 1 < x->elements; i += 2) {
    const std::string_view v = redis::reply_str(x->element[i + 1]);
    std::uint64_t at = 0;
    const auto colon = v.find(':');
    auto [p, e] = std::from_chars(v.data(), v.data() + (colon == std::string_view::npos ? 0 : colon), at);
    if (colon != std::string_view::npos && e == std::errc{} && p == v.data() + colon)
      expiry[redis::reply_str(x->element[i])] = at;
  }
  const redisReply* q = r[3].get();
  for (std::size_t i = 0; q->type == REDIS_REPLY_ARRAY && i < q->elements; ++i) {
    const std::string_view member = redis::reply_str(q->element[i]);
    auto it = expiry.find(member);
    const auto sp = member.find(' ');
    if (it == expiry.end() || it->second <= now_ms || sp == std::string_view::npos) continue;
    WaiterInfo w;
    w.owner = std::string(member.substr(sp + 1));
    info.waiter_list.push_back(std::move(w));
  }
  info.waiters_listed = true;  // waiting_since: a queue entry records no join time
  info.waiters = info.waiter_list.size();
  return info;
}

std::string ClusterBackend::put_record(std::string_view key, std::string_view value, PutMode mode,
                                       Error& ec) {
  ec.clear();
  if (!record_value_fits(key, value, ec)) return {};
  const std::string k = rediscluster::record_key(prefix_, key);
  Reply r;
  const redisReply* d = route(
      rediscluster::key_slot(k), "put record",
      [&](Connection& c, bool, Error& e) {
        r = redis::put_record_command(c, k, value, mode, e);
        return r.get();
      },
      ec);
  if (d == nullptr || ec) return {};
  if (mode == PutMode::always) return std::string(value);
  if (d->type != REDIS_REPLY_STRING) return unexpected("put record", ec), std::string();
  return std::string(redis::reply_str(d));
}

std::optional<std::string> ClusterBackend::get_record(std::string_view key, Error& ec) {
  Reply r;
  const redisReply* d = record_command("GET", "get record", key, r, ec);
  if (d == nullptr || ec || d->type == REDIS_REPLY_NIL) return std::nullopt;
  if (d->type != REDIS_REPLY_STRING) return unexpected("get record", ec), std::nullopt;
  return std::string(redis::reply_str(d));
}

bool ClusterBackend::erase_record(std::string_view key, Error& ec) {
  Reply r;
  const redisReply* d = record_command("DEL", "erase record", key, r, ec);
  if (d == nullptr || ec) return false;
  if (d->type != REDIS_REPLY_INTEGER) return unexpected("erase record", ec), false;
  return d->integer > 0;
}

// SCAN MATCH on every master of the slot map (a master that cannot be scanned
// fails the call: the list would be incomplete), for both layouts of keys_of();
// then status() of the candidates in name order.
std::vector<ListedLock> ClusterBackend::list_held(std::string_view prefix, std::size_t limit, bool& truncated,
                                                  Error& ec) {
  ec.clear();
  truncated = false;
  const std::vector<Node*> masters = all_masters(ec);
  if (ec) return ec.set_detail("list: " + ec.detail()), std::vector<ListedLock>{};
  const std::string head = prefix_ + ":{";
  std::vector<std::string> patterns;
  if (prefix.find_first_of("{}") == std::string_view::npos) {
    patterns.push_back(redis::glob_escape(head) + redis::glob_escape(prefix) + "*}");
  }
  patterns.push_back(redis::glob_escape(head + "#") + std::string(16, '?') + redis::glob_escape("}:l:") +
                     redis::glob_escape(prefix) + "*");
  std::set<std::string> names;
  auto on_key = [&](std::string_view key) {
    if (key.substr(0, head.size()) != head) return;
    const std::string_view rest = key.substr(head.size());
    std::string_view name;
    if (!rest.empty() && rest.back() == '}' &&
        rest.find_first_of("{}") == rest.size() - 1) {  // "<prefix>:{<name>}"
      name = rest.substr(0, rest.size() - 1);
    } else if (rest.size() > 21 && rest[0] == '#' && rest.substr(17, 4) == "}:l:") {
      name = rest.substr(21);
      if (rediscluster::keys_of(prefix_, name).lock != key) return;
    } else {
      return;
    }
    if (!name.empty() && name.substr(0, prefix.size()) == prefix) names.emplace(name);
  };
  for (Node* node : masters) {
    auto conn = node->pool.checkout(ec);
    if (ec) {
      report(*node, ec.detail());
      return ec.set_detail("list: " + ec.detail()), std::vector<ListedLock>{};
    }
    for (const auto& pattern : patterns) {
      redis::scan_keys(*conn, pattern, on_key, ec);
      if (ec) {
        if (!conn->connected()) report(*node, ec.detail());
        return ec.set_detail("list: " + ec.detail()), std::vector<ListedLock>{};
      }
    }
    ok(*node);
  }
  auto status_of = [&](std::span<const std::string> chunk, std::vector<LockInfo>& infos, Error& e) {
    for (const auto& name : chunk) {
      infos.push_back(status(name, e));
      if (e) return;
    }
  };
  return redis::held_in_order(names, limit, truncated, status_of, ec);
}

// One single-key command on a record, routed to its slot's master.
const redisReply* ClusterBackend::record_command(const char* cmd, const char* what, std::string_view key,
                                                 Reply& r, Error& ec) {
  ec.clear();
  const std::string k = rediscluster::record_key(prefix_, key);
  return route(
      rediscluster::key_slot(k), what,
      [&](Connection& c, bool, Error& e) {
        r = c.command({cmd, k}, e);
        return r.get();
      },
      ec);
}

}  // namespace rediscluster

std::unique_ptr<Backend> make_redis_cluster_backend(const Url& url, const ClientOptions& opts, Error& err) {
  err.clear();
  const std::string shown = "\"" + url.redacted() + "\"";
  auto bad = [&](std::string msg) -> std::unique_ptr<Backend> {
    err.fail(errc::invalid_url, std::move(msg));
    return nullptr;
  };
  if (url.hosts.empty()) {
    return bad("URL " + shown + " names no cluster node (expected redis+cluster://host:port[,host:port...])");
  }
  // nat=ANNOUNCED_HOST:PORT=REACHABLE_HOST:PORT[,...]: nodes that announce addresses
  // this client cannot reach directly (port forwarding, containers, proxies).
  std::map<std::string, std::pair<std::string, std::uint16_t>> nat;
  if (auto it = url.query.find("nat"); it != url.query.end()) {
    std::string_view rest = it->second;
    while (!rest.empty()) {
      const auto comma = rest.find(',');
      const std::string_view pair = rest.substr(0, comma);
      rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
      const auto eq = pair.find('=');
      Url from, to;
      if (eq == std::string_view::npos || parse_url("redis://" + std::string(pair.substr(0, eq)), from) ||
          parse_url("redis://" + std::string(pair.substr(eq + 1)), to) || from.hosts.size() != 1 ||
          to.hosts.size() != 1 || from.hosts[0].port == 0 || to.hosts[0].port == 0) {
        return bad("nat entry \"" + std::string(pair) + "\" in URL " + shown +
                   " is not ANNOUNCED_HOST:PORT=REACHABLE_HOST:PORT");
      }
      nat[from.hosts[0].host + ":" + std::to_string(from.hosts[0].port)] = {to.hosts[0].host,
                                                                            to.hosts[0].port};
    }
  }
  if (!url.path.empty() && url.path != "/" && url.path != "/0") {
    return bad("URL " + shown + " selects database \"" + url.path +
               "\"; a Redis Cluster has only database 0 (drop the path)");
  }
  const std::string prefix = url.query_or("prefix", "distlock");
  if (prefix.empty() || prefix.size() > 256 || prefix.find_first_of("{}") != std::string::npos) {
    return bad("prefix \"" + prefix + "\" in URL " + shown +
               " must be 1-256 bytes without '{' or '}' (they delimit the hash tag)");
  }
  redis::ConnectionOptions base = redis::options_from_url(url, 0, opts, err);
  if (err) return nullptr;
  base.db = 0;
  std::vector<std::pair<std::string, std::uint16_t>> seeds;
  for (const auto& h : url.hosts) seeds.emplace_back(h.host, h.port != 0 ? h.port : 6379);
  auto backend = std::make_unique<rediscluster::ClusterBackend>(base, std::move(seeds), std::move(nat),
                                                                prefix, url.redacted(), opts);
  backend->connect_now(err);
  if (err) return nullptr;
  return backend;
}

}  // namespace distlock::detail
