#include "rediscluster/cluster_backend.hpp"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "core/log.hpp"
#include "redis/connection.hpp"
#include "redis/records.hpp"
#include "redis/redis_backend.hpp"
#include "redis/slots.hpp"
#include "redis/subscriber.hpp"

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
// ":released" (its hash tag is the name). A name holding '{' or '}' would end the
// tag early or leave it empty (then each key hashes whole, into different slots):
// its tag is '#' and 16 hex digits of a hash of the name, and the name follows the
// tag whole, after a kind letter, so two names never share a key even when their
// hashes collide (they then only share a slot).
NameKeys keys_of(std::string_view prefix, std::string_view name) {
  NameKeys k;
  if (name.find_first_of("{}") == std::string_view::npos) {
    k.lock.append(prefix).append(":{").append(name).append("}");
    k.fence = k.lock + ":fence";
    k.channel = k.lock + ":released";
  } else {
    static constexpr char kHex[] = "0123456789abcdef";
    std::string tag = "#";
    const std::uint64_t h = fnv1a(name);
    for (int i = 60; i >= 0; i -= 4) tag.push_back(kHex[(h >> i) & 0xf]);
    const std::string head = std::string(prefix) + ":{" + tag + "}:";
    k.lock = head + "l:" + std::string(name);
    k.fence = head + "f:" + std::string(name);
    k.channel = head + "r:" + std::string(name);
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

}  // namespace rediscluster

namespace {

using redis::Connection;
using redis::ConnectionOptions;
using redis::ConnectionPool;
using redis::Reply;
using redis::Script;
using rediscluster::NameKeys;

constexpr std::size_t kSlots = 16384;
// Redirections (MOVED, ASK, TRYAGAIN) followed for one call before giving up: a
// slot moves at most once or twice during one call; more means a map in flux.
constexpr int kMaxAttempts = 6;
constexpr std::size_t kRenewChunk = 1000;
// A node that could not be reached triggers a map refresh at most this often.
constexpr Millis kRefreshOnFailureEvery{500};

// KEYS[1] lock hash; ARGV[1] owner, ARGV[2] release channel. As redis://'s release
// script, published on the slot's shard channel (SPUBLISH).
const Script& release_script() {
  static const Script s(R"lua(
local lock, owner, channel = KEYS[1], ARGV[1], ARGV[2]
if redis.call('HEXISTS', lock, owner) == 0 then
  return -1
end
local left = redis.call('HINCRBY', lock, owner, -1)
if left > 0 then
  return left
end
redis.call('DEL', lock)
redis.call('SPUBLISH', channel, 'released')
return 0
)lua");
  return s;
}

bool to_u64(const redisReply* r, std::uint64_t& out) {
  if (r == nullptr) return false;
  if (r->type == REDIS_REPLY_INTEGER) {
    if (r->integer < 0) return false;
    out = static_cast<std::uint64_t>(r->integer);
    return true;
  }
  const std::string_view s = redis::reply_str(r);
  if (r->type != REDIS_REPLY_STRING || s.empty()) return false;
  auto [p, e] = std::from_chars(s.data(), s.data() + s.size(), out);
  return e == std::errc{} && p == s.data() + s.size();
}

bool starts_with(std::string_view s, std::string_view p) {
  return s.substr(0, p.size()) == p;
}

// "MOVED 3999 127.0.0.1:6381" / "ASK 3999 :6381" (an empty host: the answering node's).
struct Redirect {
  std::uint16_t slot = 0;
  std::string host;
  std::uint16_t port = 0;
};
bool parse_redirect(std::string_view text, std::string_view default_host, Redirect& out) {
  const auto sp1 = text.find(' ');
  if (sp1 == std::string_view::npos) return false;
  const auto sp2 = text.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos) return false;
  std::string_view slot = text.substr(sp1 + 1, sp2 - sp1 - 1);
  std::string_view addr = text.substr(sp2 + 1);
  if (auto end = addr.find_first_of(" \r\n"); end != std::string_view::npos) addr = addr.substr(0, end);
  const auto colon = addr.rfind(':');
  if (colon == std::string_view::npos) return false;
  unsigned s = 0, p = 0;
  auto r1 = std::from_chars(slot.data(), slot.data() + slot.size(), s);
  const std::string_view port = addr.substr(colon + 1);
  auto r2 = std::from_chars(port.data(), port.data() + port.size(), p);
  if (r1.ec != std::errc{} || r2.ec != std::errc{} || s >= kSlots || p == 0 || p > 65535) return false;
  out.slot = static_cast<std::uint16_t>(s);
  out.host = colon == 0 ? std::string(default_host) : std::string(addr.substr(0, colon));
  if (!out.host.empty() && out.host.front() == '[' && out.host.back() == ']') {
    out.host = out.host.substr(1, out.host.size() - 2);
  }
  out.port = static_cast<std::uint16_t>(p);
  return true;
}

// A redirect named inside a longer message (a refused SSUBSCRIBE's text).
bool find_redirect(std::string_view text, std::string_view default_host, Redirect& out, bool& ask) {
  for (std::string_view kind : {"MOVED ", "ASK "}) {
    const auto at = text.find(std::string(": ") + std::string(kind));
    if (at != std::string_view::npos) {
      ask = kind == "ASK ";
      return parse_redirect(text.substr(at + 2), default_host, out);
    }
  }
  return false;
}

// One node's renewal pipeline, run by the node's renewal worker. It owns copies of
// its keys and arguments: the caller may stop waiting and return before it ran.
// The worker writes replies/ec/error, then sets `done` under the backend's work_mu_;
// the caller reads them after it saw `done`.
struct RenewJob {
  std::vector<std::string> keys;
  std::vector<std::string> args;        // owner, ttl per key
  std::vector<std::size_t> call_sizes;  // keys per EVALSHA, in order
  std::vector<Reply> replies;           // one per call
  std::error_code ec;                   // the node could not be reached or the transport failed
  std::string error;
  bool done = false;       // guarded by work_mu_
  bool abandoned = false;  // guarded by work_mu_: the caller stopped waiting
};

struct Node {
  explicit Node(const ConnectionOptions& o) : opts(o), pool(o, 8) {}
  const ConnectionOptions opts;
  ConnectionPool pool;
  std::unique_ptr<redis::Subscriber> sub;  // created on first watch; guarded by the backend's map_mu_
  std::atomic<bool> failing{false};        // its last call failed (logged once per outage)
  std::atomic<bool> config_checked{false};
  // The renewal worker, started on the node's first renewal; guarded by work_mu_.
  std::thread worker;
  std::condition_variable work_cv;
  std::deque<std::shared_ptr<RenewJob>> jobs;
  // A pipeline outlived its caller's wait and the worker has not come back from it
  // (a hung node): written under work_mu_, read also without it.
  std::atomic<bool> renewal_stuck{false};
};

class ClusterBackend final : public Backend {
 public:
  ClusterBackend(const ConnectionOptions& base, std::vector<std::pair<std::string, std::uint16_t>> seeds,
                 std::map<std::string, std::pair<std::string, std::uint16_t>> nat, std::string prefix,
                 std::string url, const ClientOptions& opts)
      : base_(base),
        nat_(std::move(nat)),
        prefix_(std::move(prefix)),
        url_(std::move(url)),
        log_(opts.logger),
        slots_(kSlots) {
    for (auto& [host, port] : seeds) seeds_.push_back(node_at(host, port));
    mover_ = std::thread([this] { run_mover(); });
  }

  ~ClusterBackend() override {
    {
      std::lock_guard lk(move_mu_);
      stop_ = true;
    }
    move_cv_.notify_all();
    mover_.join();
    // Subscriber threads call back into this object: stop them before anything goes.
    std::vector<std::unique_ptr<redis::Subscriber>> subs;
    std::vector<Node*> all;
    {
      std::lock_guard lk(map_mu_);
      for (auto& [addr, node] : nodes_) {
        subs.push_back(std::move(node->sub));
        all.push_back(node.get());
      }
    }
    subs.clear();
    // Renewal workers: one still reading a hung node returns within the command timeout.
    {
      std::lock_guard lk(work_mu_);
      work_stop_ = true;
      for (Node* n : all) n->work_cv.notify_all();
    }
    for (Node* n : all) {
      if (n->worker.joinable()) n->worker.join();
    }
  }

  Capabilities capabilities() const noexcept override { return {true, true}; }
  void set_listener(ChangeListener* listener) override { listener_.store(listener); }

  // Reads the slot map from the first seed that answers.
  std::error_code connect_now(std::string& why) {
    std::error_code ec;
    if (refresh_map(map_version(), ec, why)) return {};
    return ec ? ec : make_error_code(errc::backend_unavailable);
  }

  AcquireResult try_acquire(const AcquireRequest& req, std::error_code& ec) override {
    ec.clear();
    const NameKeys k = rediscluster::keys_of(prefix_, req.name);
    const std::string ttl = std::to_string(req.ttl.count());
    Reply r;
    const redisReply* d = route(
        k.slot, "acquire",
        [&](Connection& c, bool, std::error_code& e) {
          r = redis::lock_acquire_script().run(c, {k.lock, k.fence}, {req.owner, ttl}, e);
          return r.get();
        },
        ec);
    if (d == nullptr || ec) return {};
    std::uint64_t flag = 0;
    if (d->type != REDIS_REPLY_ARRAY || d->elements != 2 || !to_u64(d->element[0], flag)) {
      ec = make_error_code(errc::protocol_error);
      set_error_detail("unexpected reply to the acquire script");
      return {};
    }
    AcquireResult res;
    if (flag == 1) {
      res.acquired = true;
      if (!to_u64(d->element[1], res.token)) {
        ec = make_error_code(errc::protocol_error);
        return {};
      }
      res.validity = req.ttl;
      return res;
    }
    const redisReply* pttl = d->element[1];
    if (pttl->type == REDIS_REPLY_INTEGER && pttl->integer > 0) res.holder_ttl = Millis(pttl->integer);
    return res;
  }

  // One pipeline per node (EVALSHA per slot: a script's keys must share a slot),
  // all nodes at once: each node's pipeline is sent and read by that node's renewal
  // worker, and the call waits for the answers at most renew_budget() (a quarter of
  // the shortest TTL in the batch, at most the command timeout). A node that has
  // not answered by then leaves its items `failed` and the others' statuses are
  // returned at once; while its pipeline is still in flight it gets no new one (its
  // items fail at once). Items redirected (the slot moved since the map was read) are
  // retried through route() within the same budget. The slot map is never read
  // here: an unreachable node asks the mover thread for a refresh.
  void renew(std::span<const RenewItem> items, std::span<RenewStatus> out, std::error_code& ec) override {
    ec.clear();
    std::fill(out.begin(), out.end(), RenewStatus::failed);
    if (items.empty()) return;
    const auto deadline = std::chrono::steady_clock::now() + renew_budget(items);
    std::vector<NameKeys> keys;
    std::vector<std::string> ttls;
    keys.reserve(items.size());
    ttls.reserve(items.size());
    for (const auto& it : items) {
      keys.push_back(rediscluster::keys_of(prefix_, it.name));
      ttls.push_back(std::to_string(it.ttl.count()));
    }
    std::map<Node*, std::vector<std::size_t>> by_node;
    std::vector<std::size_t> retry;  // unrouted, then redirected items
    {
      std::lock_guard lk(map_mu_);
      for (std::size_t i = 0; i < items.size(); ++i) {
        Node* n = slots_[keys[i].slot];
        if (n) {
          by_node[n].push_back(i);
        } else {
          retry.push_back(i);
        }
      }
    }
    struct Sent {
      Node* node;
      std::vector<std::size_t> idx;      // item indexes, in pipeline order
      std::vector<std::size_t> call_at;  // first position in idx of each call
      std::shared_ptr<RenewJob> job;
    };
    std::vector<Sent> sent;
    sent.reserve(by_node.size());
    for (auto& [node, idx] : by_node) {
      std::stable_sort(idx.begin(), idx.end(),
                       [&](std::size_t a, std::size_t b) { return keys[a].slot < keys[b].slot; });
      auto job = std::make_shared<RenewJob>();
      job->keys.reserve(idx.size());
      job->args.reserve(2 * idx.size());
      for (std::size_t i : idx) {
        job->keys.push_back(keys[i].lock);
        job->args.emplace_back(items[i].owner);
        job->args.push_back(ttls[i]);
      }
      std::vector<std::size_t> call_at;
      for (std::size_t at = 0; at < idx.size();) {
        std::size_t end = at + 1;
        while (end < idx.size() && end - at < kRenewChunk && keys[idx[end]].slot == keys[idx[at]].slot) ++end;
        job->call_sizes.push_back(end - at);
        call_at.push_back(at);
        at = end;
      }
      sent.push_back({node, std::move(idx), std::move(call_at), std::move(job)});
    }
    // Hand each node its pipeline, then wait for all of them, up to the deadline.
    std::vector<Node*> stuck, late;
    {
      std::unique_lock lk(work_mu_);
      for (auto& s : sent) {
        if (s.node->renewal_stuck.load()) {  // its previous pipeline is still unanswered
          stuck.push_back(s.node);
          s.job.reset();
          continue;
        }
        if (!s.node->worker.joinable()) {
          Node* n = s.node;
          n->worker = std::thread([this, n] { run_renewal_worker(*n); });
        }
        s.node->jobs.push_back(s.job);
        s.node->work_cv.notify_one();
      }
      done_cv_.wait_until(lk, deadline, [&] {
        return std::all_of(sent.begin(), sent.end(), [](const Sent& s) { return !s.job || s.job->done; });
      });
      for (auto& s : sent) {
        if (!s.job || s.job->done) continue;
        s.job->abandoned = true;  // the worker skips it if it has not started yet
        s.node->renewal_stuck.store(true);
        late.push_back(s.node);
        s.job.reset();
      }
    }
    const auto budget_ms = std::chrono::duration_cast<Millis>(renew_budget(items)).count();
    for (Node* n : stuck) {
      report(*n, "renew: " + n->opts.describe() + " has not answered an earlier renewal yet");
    }
    for (Node* n : late) {
      report(*n,
             "renew: " + n->opts.describe() + " did not answer within " + std::to_string(budget_ms) + " ms");
    }
    if (!stuck.empty() || !late.empty()) request_refresh();
    std::size_t answered = 0;
    for (auto& s : sent) {
      if (!s.job) continue;
      RenewJob& job = *s.job;
      if (job.ec) {
        report(*s.node, "renew: " + job.error);
        request_refresh();
        continue;
      }
      ++answered;
      ok(*s.node);
      for (std::size_t c = 0; c < job.call_sizes.size(); ++c) {
        const redisReply* r = c < job.replies.size() ? job.replies[c].get() : nullptr;
        const std::size_t at = s.call_at[c];
        if (r != nullptr && r->type == REDIS_REPLY_ARRAY && r->elements == job.call_sizes[c]) {
          for (std::size_t j = 0; j < r->elements; ++j) {
            const redisReply* e = r->element[j];
            out[s.idx[at + j]] = e->type == REDIS_REPLY_INTEGER && e->integer == 1 ? RenewStatus::renewed
                                                                                   : RenewStatus::not_owner;
          }
          continue;
        }
        const std::string_view text = redis::reply_str(r);
        if (starts_with(text, "MOVED ") || starts_with(text, "ASK ") || starts_with(text, "TRYAGAIN")) {
          for (std::size_t j = 0; j < job.call_sizes[c]; ++j) retry.push_back(s.idx[at + j]);
          if (starts_with(text, "MOVED ")) learn_redirect(text, s.node->opts.host);
        } else {
          log_.log(LogLevel::warning, "{}: renew script answered {}", s.node->opts.describe(),
                   r && r->type == REDIS_REPLY_ERROR ? text : std::string_view("an unexpected reply"));
        }
      }
    }
    // Redirected or unrouted items: one routed call each (rare: a slot moved), while
    // the budget lasts; the rest stay `failed` (the engine retries them soon).
    for (std::size_t i : retry) {
      if (std::chrono::steady_clock::now() >= deadline) break;
      std::error_code rec;
      Reply r;
      const std::string_view key = keys[i].lock;
      const std::string_view args[] = {items[i].owner, ttls[i]};
      const redisReply* d = route(
          keys[i].slot, "renew",
          [&](Connection& c, bool, std::error_code& e) {
            r = redis::lock_renew_script().run(c, std::span(&key, 1), std::span(args), e);
            return r.get();
          },
          rec);
      if (d == nullptr || rec) continue;
      ++answered;
      if (d->type == REDIS_REPLY_ARRAY && d->elements == 1) {
        const redisReply* e = d->element[0];
        out[i] =
            e->type == REDIS_REPLY_INTEGER && e->integer == 1 ? RenewStatus::renewed : RenewStatus::not_owner;
      }
    }
    take_error_detail();  // per-item failures are retried by the engine, not reported
    if (answered == 0) ec = make_error_code(errc::backend_unavailable);
  }

  ReleaseStatus release(std::string_view name, std::string_view owner, std::uint64_t /*token*/,
                        std::error_code& ec) override {
    ec.clear();
    const NameKeys k = rediscluster::keys_of(prefix_, name);
    Reply r;
    const redisReply* d = route(
        k.slot, "release",
        [&](Connection& c, bool, std::error_code& e) {
          r = release_script().run(c, {k.lock}, {owner, k.channel}, e);
          return r.get();
        },
        ec);
    if (d == nullptr || ec) return ReleaseStatus::released;
    if (d->type != REDIS_REPLY_INTEGER) {
      ec = make_error_code(errc::protocol_error);
      return ReleaseStatus::released;
    }
    return d->integer < 0 ? ReleaseStatus::not_owner : ReleaseStatus::released;
  }

  void watch(std::string_view name, std::error_code& ec) override {
    ec.clear();
    const NameKeys k = rediscluster::keys_of(prefix_, name);
    std::lock_guard w(watch_mu_);
    {
      std::lock_guard lk(names_mu_);
      channel_names_[k.channel] = std::string(name);
    }
    std::string why;
    for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
      Node* node = node_for(k.slot, ec, why);
      if (node == nullptr) break;
      redis::Subscriber& sub = subscriber_of(*node);
      sub.watch(k.channel, ec, why);
      if (!ec) {
        watched_[std::string(name)] = Watch{node, k.channel};
        return;
      }
      Redirect to;
      bool ask = false;
      if (!find_redirect(why, node->opts.host, to, ask)) break;
      if (!ask) learn_redirect_to(to);
      std::string ignored;
      std::error_code ignored_ec;
      refresh_map(map_version(), ignored_ec, ignored);
      if (ask) std::this_thread::sleep_for(Millis(10 * (attempt + 1)));  // the slot is being moved
    }
    {
      std::lock_guard lk(names_mu_);
      channel_names_.erase(k.channel);
    }
    if (!ec) ec = make_error_code(errc::backend_unavailable);
    log_.log(LogLevel::warning, "cannot wait for a release of \"{}\": {}", name, why);
    set_error_detail("cannot wait for a release of \"" + std::string(name) + "\": " + why);
  }

  void unwatch(std::string_view name) noexcept override {
    try {
      std::lock_guard w(watch_mu_);
      auto it = watched_.find(name);
      if (it == watched_.end()) return;
      subscriber_of(*it->second.node).unwatch(it->second.channel);
      {
        std::lock_guard lk(names_mu_);
        channel_names_.erase(it->second.channel);
      }
      watched_.erase(it);
    } catch (...) {  // out of memory: the subscription stays, harmless
    }
  }

  LockInfo status(std::string_view name, std::error_code& ec) override {
    ec.clear();
    const NameKeys k = rediscluster::keys_of(prefix_, name);
    std::vector<Reply> r;
    const redisReply* d = route(
        k.slot, "status",
        [&](Connection& c, bool asking, std::error_code& e) -> const redisReply* {
          // ASKING holds for one command: repeat it before each (route sent the first).
          c.append({"HGETALL", k.lock});
          if (asking) c.append({"ASKING"});
          c.append({"PTTL", k.lock});
          if (asking) c.append({"ASKING"});
          c.append({"GET", k.fence});
          c.append({"PUBSUB", "SHARDNUMSUB", k.channel});
          std::vector<Reply> all = c.read_replies(asking ? 6 : 4, e);
          if (e) return nullptr;
          r.clear();
          for (std::size_t i = 0; i < all.size(); ++i) {
            if (asking && (i == 1 || i == 3)) continue;
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
    const redisReply* numsub = r[3].get();
    if (numsub->type == REDIS_REPLY_ARRAY && numsub->elements == 2 &&
        numsub->element[1]->type == REDIS_REPLY_INTEGER) {
      info.waiters = static_cast<std::uint64_t>(std::max<long long>(0, numsub->element[1]->integer));
    }
    return info;
  }

  std::string put_record(std::string_view key, std::string_view value, PutMode mode,
                         std::error_code& ec) override {
    ec.clear();
    if (!record_value_fits(key, value, ec)) return {};
    const std::string k = rediscluster::record_key(prefix_, key);
    Reply r;
    const redisReply* d = route(
        rediscluster::key_slot(k), "put record",
        [&](Connection& c, bool, std::error_code& e) {
          r = mode == PutMode::always ? c.command({"SET", k, value}, e)
                                      : redis::put_if_absent_script().run(c, {k}, {value}, e);
          return r.get();
        },
        ec);
    if (d == nullptr || ec) return {};
    if (mode == PutMode::always) return std::string(value);
    if (d->type != REDIS_REPLY_STRING) return unexpected("put record", ec), std::string();
    return std::string(redis::reply_str(d));
  }

  std::optional<std::string> get_record(std::string_view key, std::error_code& ec) override {
    Reply r;
    const redisReply* d = record_command("GET", "get record", key, r, ec);
    if (d == nullptr || ec || d->type == REDIS_REPLY_NIL) return std::nullopt;
    if (d->type != REDIS_REPLY_STRING) return unexpected("get record", ec), std::nullopt;
    return std::string(redis::reply_str(d));
  }

  bool erase_record(std::string_view key, std::error_code& ec) override {
    Reply r;
    const redisReply* d = record_command("DEL", "erase record", key, r, ec);
    if (d == nullptr || ec) return false;
    if (d->type != REDIS_REPLY_INTEGER) return unexpected("erase record", ec), false;
    return d->integer > 0;
  }

  // SCAN MATCH on every master of the slot map (a master that cannot be scanned
  // fails the call: the list would be incomplete), for both layouts of keys_of();
  // then status() of the candidates in name order.
  std::vector<ListedLock> list_held(std::string_view prefix, std::size_t limit, bool& truncated,
                                    std::error_code& ec) override {
    ec.clear();
    truncated = false;
    std::string why;
    const std::vector<Node*> masters = all_masters(ec, why);
    if (ec) return set_error_detail("list: " + why), std::vector<ListedLock>{};
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
        report(*node, node->pool.last_error());
        return set_error_detail("list: " + node->pool.last_error()), std::vector<ListedLock>{};
      }
      for (const auto& pattern : patterns) {
        redis::scan_keys(*conn, pattern, on_key, ec, why);
        if (ec) {
          if (!conn->connected()) report(*node, why);
          return set_error_detail("list: " + why), std::vector<ListedLock>{};
        }
      }
      ok(*node);
    }
    auto status_of = [&](std::span<const std::string> chunk, std::vector<LockInfo>& infos,
                         std::error_code& e) {
      for (const auto& name : chunk) {
        infos.push_back(status(name, e));
        if (e) return;
      }
    };
    return redis::held_in_order(names, limit, truncated, status_of, ec);
  }

  std::string url() const override { return url_; }

 private:
  // One single-key command on a record, routed to its slot's master.
  const redisReply* record_command(const char* cmd, const char* what, std::string_view key, Reply& r,
                                   std::error_code& ec) {
    ec.clear();
    const std::string k = rediscluster::record_key(prefix_, key);
    return route(
        rediscluster::key_slot(k), what,
        [&](Connection& c, bool, std::error_code& e) {
          r = c.command({cmd, k}, e);
          return r.get();
        },
        ec);
  }

  void unexpected(const char* what, std::error_code& ec) {
    ec = make_error_code(errc::protocol_error);
    set_error_detail(std::string("unexpected reply to ") + what);
  }

  // Every master of the slot map, once; reads the map again when a slot has no
  // master (backend_unavailable naming the slot when it still has none).
  std::vector<Node*> all_masters(std::error_code& ec, std::string& why) {
    for (int attempt = 0; attempt < 2; ++attempt) {
      std::vector<Node*> out;
      std::size_t unserved = kSlots;
      std::uint64_t version = 0;
      {
        std::lock_guard lk(map_mu_);
        version = map_version_;
        for (std::size_t s = 0; s < kSlots; ++s) {
          Node* n = slots_[s];
          if (n == nullptr) {
            if (unserved == kSlots) unserved = s;
          } else if (std::find(out.begin(), out.end(), n) == out.end()) {
            out.push_back(n);
          }
        }
      }
      if (unserved == kSlots) return out;
      if (attempt == 0 && !refresh_map(version, ec, why)) return {};
      if (attempt == 1) {
        ec = make_error_code(errc::backend_unavailable);
        why = "slot " + std::to_string(unserved) + " is served by no node of the cluster " + url_;
      }
    }
    return {};
  }

  struct Watch {
    Node* node = nullptr;
    std::string channel;
  };
  using Attempt = std::function<const redisReply*(Connection&, bool asking, std::error_code&)>;

  // Runs `attempt` on the node serving `slot`, following MOVED (map updated, then
  // refreshed), ASK (ASKING on the named node, once per ASK) and TRYAGAIN (a short
  // pause) at most kMaxAttempts times. Returns the attempt's reply (an error reply
  // other than a redirection is returned with `ec` as the attempt set it), or
  // nullptr with `ec` and an error detail naming the node and the cause.
  const redisReply* route(std::uint16_t slot, const char* what, const Attempt& attempt, std::error_code& ec) {
    ec.clear();
    Node* ask_node = nullptr;
    std::string last;
    for (int i = 0; i < kMaxAttempts; ++i) {
      std::string why;
      Node* node = ask_node;
      if (node == nullptr) node = node_for(slot, ec, why);
      if (node == nullptr) {
        set_error_detail(why);
        return nullptr;
      }
      const bool asking = ask_node != nullptr;
      ask_node = nullptr;
      auto conn = node->pool.checkout(ec);
      if (ec) {
        const std::string err = node->pool.last_error();
        report(*node, err);
        set_error_detail(err);
        refresh_after_failure();
        return nullptr;
      }
      if (asking) {
        conn->command({"ASKING"}, ec);
        if (ec) {
          failed(*node, *conn, what);
          return nullptr;
        }
      }
      const redisReply* r = attempt(*conn, asking, ec);
      if (r == nullptr) {
        if (!ec) ec = make_error_code(errc::protocol_error);
        failed(*node, *conn, what);
        refresh_after_failure();
        return nullptr;
      }
      if (r->type != REDIS_REPLY_ERROR) {
        ok(*node);
        return r;
      }
      const std::string text(redis::reply_str(r));
      if (starts_with(text, "MOVED ")) {
        last = node->opts.describe() + " answered " + text;
        learn_redirect(text, node->opts.host);
        std::string ignored;
        std::error_code ignored_ec;
        refresh_map(map_version(), ignored_ec, ignored);
        ec.clear();
        continue;
      }
      if (starts_with(text, "ASK ")) {
        last = node->opts.describe() + " answered " + text;
        Redirect to;
        if (parse_redirect(text, node->opts.host, to)) {
          ask_node = node_at(to.host, to.port);
          ec.clear();
          continue;
        }
      }
      if (starts_with(text, "TRYAGAIN")) {  // keys of one slot split by a migration in progress
        last = node->opts.describe() + " answered " + text;
        ec.clear();
        std::this_thread::sleep_for(std::min(Millis(10) * (1 << i), Millis(320)));
        continue;
      }
      if (starts_with(text, "CLUSTERDOWN")) refresh_after_failure();
      ok(*node);
      const std::string msg = node->opts.describe() + ": " + what + ": " + text;
      log_.log(LogLevel::warning, "{}", msg);
      set_error_detail(msg);
      if (!ec) ec = redis::error_code_of(r);
      return r;
    }
    ec = make_error_code(errc::backend_unavailable);
    const std::string msg = std::string(what) + ": slot " + std::to_string(slot) +
                            " was still redirected after " + std::to_string(kMaxAttempts) +
                            " attempts (last: " + last + ")";
    log_.log(LogLevel::warning, "{}", msg);
    set_error_detail(msg);
    return nullptr;
  }

  std::uint64_t map_version() const {
    std::lock_guard lk(map_mu_);
    return map_version_;
  }

  Node* node_at(const std::string& host, std::uint16_t port) {
    std::lock_guard lk(map_mu_);
    return node_at_locked(host, port);
  }
  // `host:port` as the cluster announces it, translated by the URL's nat map.
  Node* node_at_locked(const std::string& announced_host, std::uint16_t announced_port) {
    std::string host = announced_host;
    std::uint16_t port = announced_port;
    if (auto it = nat_.find(announced_host + ":" + std::to_string(announced_port)); it != nat_.end()) {
      host = it->second.first;
      port = it->second.second;
    }
    const std::string addr = host + "|" + std::to_string(port);
    auto it = nodes_.find(addr);
    if (it != nodes_.end()) return it->second.get();
    ConnectionOptions o = base_;
    o.host = host;
    o.port = port;
    return nodes_.emplace(addr, std::make_unique<Node>(o)).first->second.get();
  }

  // The node serving `slot`; reads the map again once when none does.
  Node* node_for(std::uint16_t slot, std::error_code& ec, std::string& why) {
    std::uint64_t version = 0;
    {
      std::lock_guard lk(map_mu_);
      if (slots_[slot] != nullptr) return slots_[slot];
      version = map_version_;
    }
    if (refresh_map(version, ec, why)) {
      std::lock_guard lk(map_mu_);
      if (slots_[slot] != nullptr) return slots_[slot];
    }
    if (!ec) {
      ec = make_error_code(errc::backend_unavailable);
      why = "slot " + std::to_string(slot) + " is served by no node of the cluster " + url_;
    }
    return nullptr;
  }

  void learn_redirect(std::string_view text, std::string_view host) {
    Redirect to;
    if (parse_redirect(text, host, to)) learn_redirect_to(to);
  }
  void learn_redirect_to(const Redirect& to) {
    std::lock_guard lk(map_mu_);
    slots_[to.slot] = node_at_locked(to.host, to.port);
  }

  void refresh_after_failure() {
    const auto now = std::chrono::steady_clock::now();
    {
      std::lock_guard lk(map_mu_);
      if (now - last_failure_refresh_ < kRefreshOnFailureEvery) return;
      last_failure_refresh_ = now;
    }
    std::string ignored;
    std::error_code ignored_ec;
    refresh_map(map_version(), ignored_ec, ignored);
  }

  // As refresh_after_failure(), but on the mover thread: the caller (a renewal)
  // does not wait for CLUSTER SLOTS.
  void request_refresh() {
    const auto now = std::chrono::steady_clock::now();
    {
      std::lock_guard lk(map_mu_);
      if (now - last_failure_refresh_ < kRefreshOnFailureEvery) return;
      last_failure_refresh_ = now;
    }
    {
      std::lock_guard lk(move_mu_);
      refresh_wanted_ = true;
    }
    move_cv_.notify_all();
  }

  // CLUSTER SLOTS from the first known node that answers (the nodes of the current
  // map first, then the URL's seeds). Skipped when another thread refreshed since
  // `seen_version`. False with ec/why when no node answered.
  bool refresh_map(std::uint64_t seen_version, std::error_code& ec, std::string& why) {
    std::lock_guard refresh(refresh_mu_);
    std::vector<Node*> order;
    {
      std::lock_guard lk(map_mu_);
      if (map_version_ != seen_version) return true;
      for (Node* n : slots_) {
        if (n != nullptr && std::find(order.begin(), order.end(), n) == order.end()) order.push_back(n);
      }
      for (auto& [addr, n] : nodes_) {
        if (std::find(order.begin(), order.end(), n.get()) == order.end()) order.push_back(n.get());
      }
    }
    // A node known to hang (a renewal pipeline still unanswered) last.
    std::stable_partition(order.begin(), order.end(), [](const Node* n) { return !n->renewal_stuck.load(); });
    std::string errors;
    std::error_code first_ec;
    for (Node* n : order) {
      std::error_code nec;
      std::string nwhy;
      if (load_map_from(*n, nec, nwhy)) {
        ec.clear();
        return true;
      }
      if (!first_ec || nec == errc::auth_failed || nec == errc::protocol_error) first_ec = nec;
      if (!errors.empty()) errors += "; ";
      errors += nwhy;
    }
    ec = first_ec ? first_ec : make_error_code(errc::backend_unavailable);
    why = "no node of the cluster " + url_ + " gave its slot map: " + errors;
    return false;
  }

  bool load_map_from(Node& node, std::error_code& ec, std::string& why) {
    auto conn = node.pool.checkout(ec);
    if (ec) {
      why = node.pool.last_error();
      return false;
    }
    Reply r = conn->command({"CLUSTER", "SLOTS"}, ec);
    if (!r) {
      why = conn->last_error();
      return false;
    }
    if (r->type == REDIS_REPLY_ERROR) {
      const std::string_view text = redis::reply_str(r.get());
      if (text.find("cluster support disabled") != std::string_view::npos) {
        ec = make_error_code(errc::protocol_error);
        why = node.opts.describe() + " is not a cluster node (" + std::string(text) +
              "): use redis:// for a single server";
      } else {
        if (ec != errc::auth_failed) ec = make_error_code(errc::protocol_error);
        why = node.opts.describe() + ": CLUSTER SLOTS: " + std::string(text);
      }
      return false;
    }
    ec.clear();
    if (r->type != REDIS_REPLY_ARRAY || r->elements == 0) {
      ec = make_error_code(errc::backend_unavailable);
      why = node.opts.describe() + " serves no slots yet (CLUSTER SLOTS is empty: the cluster is not set up)";
      return false;
    }
    std::vector<std::tuple<std::size_t, std::size_t, std::string, std::uint16_t>> ranges;
    for (std::size_t i = 0; i < r->elements; ++i) {
      const redisReply* e = r->element[i];
      if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 || e->element[0]->type != REDIS_REPLY_INTEGER ||
          e->element[1]->type != REDIS_REPLY_INTEGER || e->element[2]->type != REDIS_REPLY_ARRAY ||
          e->element[2]->elements < 2 || e->element[2]->element[1]->type != REDIS_REPLY_INTEGER) {
        ec = make_error_code(errc::protocol_error);
        why = node.opts.describe() + ": unexpected CLUSTER SLOTS reply";
        return false;
      }
      const long long from = e->element[0]->integer, to = e->element[1]->integer;
      const long long port = e->element[2]->element[1]->integer;
      std::string host(redis::reply_str(e->element[2]->element[0]));
      if (host.empty() || host == "?") host = node.opts.host;
      if (from < 0 || to < from || to >= static_cast<long long>(kSlots) || port <= 0 || port > 65535) {
        ec = make_error_code(errc::protocol_error);
        why = node.opts.describe() + ": CLUSTER SLOTS names an impossible range or port";
        return false;
      }
      ranges.emplace_back(from, to, host, static_cast<std::uint16_t>(port));
    }
    {
      std::lock_guard lk(map_mu_);
      std::fill(slots_.begin(), slots_.end(), nullptr);
      for (auto& [from, to, host, port] : ranges) {
        Node* n = node_at_locked(host, port);
        for (std::size_t s = from; s <= to; ++s) slots_[s] = n;
      }
      ++map_version_;
    }
    {
      std::lock_guard lk(move_mu_);
      check_wanted_ = true;  // masters new in the map get their configuration checked
    }
    move_cv_.notify_all();
    return true;
  }

  // Runs check_config() on every master of the map not checked yet (on the mover).
  void check_new_masters() {
    std::vector<Node*> masters;
    {
      std::lock_guard lk(map_mu_);
      for (Node* n : slots_) {
        if (n != nullptr && !n->config_checked.load() &&
            std::find(masters.begin(), masters.end(), n) == masters.end()) {
          masters.push_back(n);
        }
      }
    }
    for (Node* n : masters) check_config(*n);
  }

  // CONFIG GET appendonly / maxmemory / maxmemory-policy on one master, as redis://
  // does at connect: a master that loses writes on a restart or evicts keys breaks
  // guarantees the scripts alone cannot keep; say so once per node, with the
  // consequence. CONFIG renamed or denied by an ACL: a debug line, never a failure.
  // An unreachable node is checked again after the next map refresh.
  void check_config(Node& node) {
    std::error_code ec;
    auto conn = node.pool.checkout(ec);
    if (ec) return;
    node.config_checked.store(true);
    conn->append({"CONFIG", "GET", "appendonly"});
    conn->append({"CONFIG", "GET", "maxmemory"});
    conn->append({"CONFIG", "GET", "maxmemory-policy"});
    std::vector<Reply> r = conn->read_replies(3, ec);
    auto value = [&](std::size_t i) -> std::string_view {
      const redisReply* x = r[i].get();
      if (x == nullptr || x->type != REDIS_REPLY_ARRAY || x->elements != 2) return {};
      return redis::reply_str(x->element[1]);
    };
    const std::string who = node.opts.describe();
    if (!ec) {
      for (const auto& one : r) {
        if (!redis::is_error(one.get())) continue;
        log_.log(LogLevel::debug,
                 "{}: CONFIG GET is not available ({}): appendonly and maxmemory-policy not checked", who,
                 redis::reply_str(one.get()));
        return;
      }
    }
    if (ec || value(0).empty() || value(2).empty()) {
      log_.log(LogLevel::debug,
               "{}: CONFIG GET gave no answer ({}): appendonly and maxmemory-policy not checked", who,
               ec ? conn->last_error() : std::string("unexpected reply"));
      return;
    }
    bool fine = true;
    if (value(0) != "yes") {
      fine = false;
      log_.log(LogLevel::warning,
               "{} runs with appendonly no: a restart loses (or restores stale) the locks of its slots, so a "
               "second client can acquire a lock whose holder has not noticed yet; fencing tokens then "
               "continue from the server clock and stay increasing only if that clock did not step back "
               "(docs/redis-cluster.md)",
               who);
    }
    const std::string_view policy = value(2);
    if (policy != "noeviction" && value(1) != "0") {
      fine = false;
      const bool all = policy.substr(0, 7) == "allkeys";
      log_.log(LogLevel::warning,
               "{} runs with maxmemory {} and maxmemory-policy {}: under memory pressure it may evict held "
               "locks{} (a second client then acquires while the holder has not noticed yet); use "
               "noeviction (docs/redis-cluster.md)",
               who, value(1), policy,
               all ? " and fence counters (tokens then continue from the server clock)" : "");
    }
    if (fine)
      log_.log(LogLevel::debug, "{}: appendonly yes, maxmemory-policy {}: configuration checked", who,
               policy);
  }

  redis::Subscriber& subscriber_of(Node& node) {
    std::lock_guard lk(map_mu_);
    if (!node.sub) {
      Node* n = &node;
      node.sub = std::make_unique<redis::Subscriber>(
          node.opts, [this](std::string_view channel) { on_channel(channel); },
          [this, n](std::string_view channel) { on_dropped(n, channel); });
    }
    return *node.sub;
  }

  void on_channel(std::string_view channel) {
    std::string name;
    {
      std::lock_guard lk(names_mu_);
      auto it = channel_names_.find(channel);
      if (it == channel_names_.end()) return;
      name = it->second;
    }
    ChangeListener* l = listener_.load();
    if (l) l->on_change(name);
  }

  // On a subscriber thread: hand the move to the mover (watch() blocks on
  // confirmations, which a subscriber thread must not wait for).
  void on_dropped(Node* node, std::string_view channel) {
    {
      std::lock_guard lk(move_mu_);
      moves_.emplace_back(node, std::string(channel));
    }
    move_cv_.notify_all();
  }

  // Watches a dropped channel again on the node now serving its slot, then tells
  // the waiters to re-check (a release may have come while nobody listened).
  void run_mover() {
    Millis backoff{20};
    for (;;) {
      std::pair<Node*, std::string> item;
      bool refresh = false, check = false;
      {
        std::unique_lock lk(move_mu_);
        move_cv_.wait(lk, [&] { return stop_ || !moves_.empty() || refresh_wanted_ || check_wanted_; });
        if (stop_) return;
        refresh = std::exchange(refresh_wanted_, false);
        check = std::exchange(check_wanted_, false);
        if (!moves_.empty()) {
          item = std::move(moves_.front());
          moves_.pop_front();
        }
      }
      if (refresh) {
        std::error_code ignored_ec;
        std::string ignored;
        refresh_map(map_version(), ignored_ec, ignored);
      }
      if (check) check_new_masters();
      if (item.first == nullptr) continue;
      std::string name;
      bool again = false;
      {
        std::lock_guard w(watch_mu_);
        {
          std::lock_guard lk(names_mu_);
          auto it = channel_names_.find(item.second);
          if (it != channel_names_.end()) name = it->second;
        }
        auto wit = name.empty() ? watched_.end() : watched_.find(name);
        if (wit == watched_.end() || wit->second.node != item.first) continue;  // unwatched or moved already
        std::error_code ec;
        std::string why;
        refresh_map(map_version(), ec, why);
        const NameKeys k = rediscluster::keys_of(prefix_, name);
        Node* to = node_for(k.slot, ec, why);
        if (to != nullptr) subscriber_of(*to).watch(k.channel, ec, why);
        if (to != nullptr && !ec) {
          subscriber_of(*item.first).unwatch(k.channel);
          wit->second.node = to;
          backoff = Millis(20);
        } else {
          log_.log(LogLevel::debug, "watching \"{}\" on the node now serving its slot failed: {}", name, why);
          Redirect r;
          bool ask = false;
          if (find_redirect(why, item.first->opts.host, r, ask) && !ask) learn_redirect_to(r);
          again = true;
        }
      }
      ChangeListener* l = listener_.load();
      if (l) l->on_change(name);
      if (again) {
        std::unique_lock lk(move_mu_);
        moves_.push_back(std::move(item));
        move_cv_.wait_for(lk, backoff, [&] { return stop_; });
        backoff = std::min(backoff * 2, Millis(1000));
      }
    }
  }

  void failed(Node& node, const Connection& conn, const char* what) {
    const std::string msg = std::string(what) + ": " + conn.last_error();
    report(node, msg);
    set_error_detail(msg);
  }
  // One warning per node and outage, one info line when it answers again.
  void report(Node& node, const std::string& why) {
    if (!node.failing.exchange(true)) log_.log(LogLevel::warning, "{}", why);
  }
  void ok(Node& node) {
    if (node.failing.exchange(false)) log_.log(LogLevel::info, "{} answers again", node.opts.describe());
  }

  // A quarter of the shortest TTL of the batch, at most the command timeout: the
  // engine renews a lease at least a quarter of its TTL before its local deadline
  // (renew_interval <= ttl/2, safety_margin < ttl/3, renewed up to a quarter
  // interval early), so the answers of the nodes that answered arrive in time.
  Millis renew_budget(std::span<const RenewItem> items) const {
    Millis shortest = items.front().ttl;
    for (const auto& it : items) shortest = std::min(shortest, it.ttl);
    return std::max(Millis(1), std::min(base_.command_timeout, shortest / 4));
  }

  // The loop of a node's renewal worker: runs the node's pipelines one after the
  // other; a pipeline whose caller already stopped waiting is not sent.
  void run_renewal_worker(Node& node) {
    for (;;) {
      std::shared_ptr<RenewJob> job;
      {
        std::unique_lock lk(work_mu_);
        node.renewal_stuck.store(false);  // back: free for the next pipeline
        node.work_cv.wait(lk, [&] { return work_stop_ || !node.jobs.empty(); });
        if (work_stop_) return;
        job = std::move(node.jobs.front());
        node.jobs.pop_front();
        if (job->abandoned) continue;
      }
      try {
        run_renewal(node, *job);
      } catch (...) {  // out of memory
        job->ec = make_error_code(errc::protocol_error);
        job->error = node.opts.describe() + ": renewal failed (out of memory)";
      }
      {
        std::lock_guard lk(work_mu_);
        job->done = true;
      }
      done_cv_.notify_all();
    }
  }

  static void run_renewal(Node& node, RenewJob& job) {
    auto conn = node.pool.checkout(job.ec);
    if (job.ec) {
      job.error = node.pool.last_error();
      return;
    }
    const std::vector<std::string_view> key_views(job.keys.begin(), job.keys.end());
    const std::vector<std::string_view> arg_views(job.args.begin(), job.args.end());
    std::vector<Script::Call> calls;
    calls.reserve(job.call_sizes.size());
    std::size_t at = 0;
    for (std::size_t n : job.call_sizes) {
      calls.push_back({std::span(key_views).subspan(at, n), std::span(arg_views).subspan(2 * at, 2 * n)});
      at += n;
    }
    job.replies = redis::lock_renew_script().run_pipelined(*conn, calls, job.ec);
    if (job.ec) job.error = conn->last_error();
  }

  const ConnectionOptions base_;
  const std::map<std::string, std::pair<std::string, std::uint16_t>> nat_;  // "host:port" announced → reached
  const std::string prefix_;
  const std::string url_;
  Logger log_;
  std::atomic<ChangeListener*> listener_{nullptr};

  std::mutex refresh_mu_;  // one CLUSTER SLOTS at a time
  mutable std::mutex map_mu_;
  std::map<std::string, std::unique_ptr<Node>> nodes_;            // guarded by map_mu_; never removed
  std::vector<Node*> slots_;                                      // guarded by map_mu_
  std::uint64_t map_version_ = 0;                                 // guarded by map_mu_
  std::chrono::steady_clock::time_point last_failure_refresh_{};  // guarded by map_mu_
  std::vector<Node*> seeds_;

  std::mutex watch_mu_;                                // serialises watch, unwatch and moves
  std::map<std::string, Watch, std::less<>> watched_;  // guarded by watch_mu_
  std::mutex names_mu_;
  std::map<std::string, std::string, std::less<>> channel_names_;  // guarded by names_mu_

  std::mutex work_mu_;               // renewal jobs of every node
  std::condition_variable done_cv_;  // a renewal job is done
  bool work_stop_ = false;           // guarded by work_mu_

  std::mutex move_mu_;
  std::condition_variable move_cv_;
  std::deque<std::pair<Node*, std::string>> moves_;  // guarded by move_mu_
  bool refresh_wanted_ = false;                      // guarded by move_mu_: read the slot map
  bool check_wanted_ = false;                        // guarded by move_mu_: check new nodes' config
  bool stop_ = false;                                // guarded by move_mu_
  std::thread mover_;
};

}  // namespace

std::unique_ptr<Backend> make_redis_cluster_backend(const Url& url, const ClientOptions& opts,
                                                    std::error_code& ec, std::string& why) {
  ec.clear();
  const std::string shown = "\"" + url.redacted() + "\"";
  auto bad = [&](std::string msg) -> std::unique_ptr<Backend> {
    ec = make_error_code(errc::invalid_url);
    why = std::move(msg);
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
      std::string ignored;
      if (eq == std::string_view::npos ||
          parse_url("redis://" + std::string(pair.substr(0, eq)), from, ignored) ||
          parse_url("redis://" + std::string(pair.substr(eq + 1)), to, ignored) || from.hosts.size() != 1 ||
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
  ConnectionOptions base = redis::options_from_url(url, 0, opts, ec, why);
  if (ec) return nullptr;
  base.db = 0;
  std::vector<std::pair<std::string, std::uint16_t>> seeds;
  for (const auto& h : url.hosts) seeds.emplace_back(h.host, h.port != 0 ? h.port : 6379);
  auto backend =
      std::make_unique<ClusterBackend>(base, std::move(seeds), std::move(nat), prefix, url.redacted(), opts);
  if ((ec = backend->connect_now(why))) return nullptr;
  return backend;
}

}  // namespace distlock::detail
