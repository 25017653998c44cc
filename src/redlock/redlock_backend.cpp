#include "redlock/redlock_backend.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>

#include "core/log.hpp"
#include "core/url_keys.hpp"
#include "distlock/clock.hpp"
#include "redis/records.hpp"
#include "redlock/fanout.hpp"
#include "redlock/quorum.hpp"
#include "redlock/scripts.hpp"
#include "redlock/subscriber.hpp"

namespace distlock::detail {

namespace redlock {

namespace {

std::error_code bad_url(std::string& why, std::string msg) {
  why = std::move(msg);
  return make_error_code(errc::invalid_url);
}

// Renewals are batched over many keys; a few hundred keys per script call keeps
// each call short on the master.
constexpr std::size_t kRenewChunk = 512;
// Default per-node timeout for requests that carry no TTL (release, status, watch).
constexpr Millis kDefaultNodeTimeout{50};
// Split-vote backoff: the first window is the attempt's own duration (at least
// kMinBackoff) and doubles with each consecutive split vote of the same caller,
// up to min(ttl / 4, kMaxBackoff).
constexpr Millis kMinBackoff{2};
constexpr Millis kMaxBackoff{1000};
constexpr int kMaxBackoffDoublings = 10;
// Entries of callers that never finish (they always end in acquired or
// cancel_acquire) cannot pile up beyond this.
constexpr std::size_t kMaxBackoffEntries = 4096;

// Returns one lane to the pool when the fan-out is over.
class LaneLease {
 public:
  explicit LaneLease(LanePool& pool) : pool_(pool), lane_(pool.take()) {}
  ~LaneLease() { pool_.give(std::move(lane_)); }
  LaneLease(const LaneLease&) = delete;
  LaneLease& operator=(const LaneLease&) = delete;
  Lane* operator->() const noexcept { return lane_.get(); }

 private:
  LanePool& pool_;
  std::unique_ptr<Lane> lane_;
};

bool integer_at(const redisReply* r, std::size_t i, long long& out) {
  if (!r || r->type != REDIS_REPLY_ARRAY || i >= r->elements || r->element[i]->type != REDIS_REPLY_INTEGER) {
    return false;
  }
  out = r->element[i]->integer;
  return true;
}

// Why masters failed, for messages: "h:p: Connection refused; h2:p2 did not answer within 50 ms".
std::string failures(const std::vector<NodeReply>& replies, const std::vector<std::string>& extra) {
  std::string out;
  for (const auto& r : replies) {
    if (r.status == NodeStatus::ok) continue;
    if (!out.empty()) out += "; ";
    out += r.error;
  }
  for (const auto& e : extra) {
    if (!out.empty()) out += "; ";
    out += e;
  }
  return out;
}

}  // namespace

std::error_code parse_config(const Url& url, Config& out, std::string& why) {
  out = Config{};
  const std::string shown = url.redacted();
  if (url.hosts.size() < 3) {
    return bad_url(
        why, fmt::format("redlock:// needs at least 3 independent masters for a majority; \"{}\" names {} "
                         "(use redis:// for a single server)",
                         shown, url.hosts.size()));
  }
  std::set<std::pair<std::string, std::uint16_t>> seen;
  for (auto h : url.hosts) {
    if (h.port == 0) h.port = 6379;
    if (!seen.emplace(h.host, h.port).second) {
      return bad_url(
          why, fmt::format("master {}:{} appears twice in \"{}\"; the masters must be independent servers",
                           h.host, h.port, shown));
    }
    out.masters.push_back(h);
  }
  if (!url.path.empty() && url.path != "/") {
    return bad_url(why, fmt::format("redlock:// takes no database path; \"{}\" has \"{}\"", shown, url.path));
  }
  if (url.has_userinfo) {
    if (url.password.empty() && !url.user.empty()) {
      return bad_url(
          // The user part is not quoted: people write a bare password there.
          why, fmt::format("\"{}\" names a user but no password (write user:password@)", shown));
    }
    out.user = url.user;
    out.password = url.password;
  }
  // The query is checked against the scheme's table (registry.cpp) here as well as in
  // connect(): tests parse Redlock URLs without connecting.
  if (const Scheme* scheme = find_scheme(url.scheme)) {
    if (auto ec = check_query(*scheme, url, why)) return ec;
  }
  out.prefix = url.query_or("prefix", out.prefix);
  if (const auto d = query_duration(url, "timeout")) out.node_timeout = *d;
  return {};
}

std::string lock_key(const Config& cfg, std::string_view name) {
  std::string k;
  k.reserve(cfg.prefix.size() + 5 + name.size());
  k.append(cfg.prefix).append("lock:").append(name);
  return k;
}

std::string release_channel(const Config& cfg, std::string_view name) {
  std::string k;
  k.reserve(cfg.prefix.size() + 9 + name.size());
  k.append(cfg.prefix).append("released:").append(name);
  return k;
}

std::string record_key(const Config& cfg, std::string_view key) {
  std::string k;
  k.reserve(cfg.prefix.size() + 7 + key.size());
  k.append(cfg.prefix).append("record:").append(key);
  return k;
}

namespace {

// Per-master time for record calls and for each round of a listing, unless the
// URL sets `timeout=`: they are not bounded by a lease's validity, so a slow master
// is given longer than the 50 ms of a lock call.
constexpr Millis kRecordNodeTimeout{500};
constexpr Millis kListNodeTimeout{1000};

// "3 bytes \"abc\"" (at most 32 bytes shown, others as \xNN) for messages about values.
std::string describe_value(std::string_view v) {
  std::string out = std::to_string(v.size()) + " bytes \"";
  for (std::size_t i = 0; i < v.size() && i < 32; ++i) {
    const auto c = static_cast<unsigned char>(v[i]);
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  return out + (v.size() > 32 ? "...\"" : "\"");
}

class RedlockBackend final : public Backend {
 public:
  RedlockBackend(Config cfg, std::vector<std::shared_ptr<Master>> masters, const ClientOptions& opts,
                 std::string url)
      : cfg_(std::move(cfg)),
        masters_(masters),
        quorum_(quorum_of(masters.size())),
        pool_(std::move(masters)),
        log_(opts.logger),
        clock_(opts.clock ? opts.clock : system_steady_clock()),
        url_(std::move(url)),
        channel_prefix_(release_channel(cfg_, "")) {}

  ~RedlockBackend() override {
    // The subscriber's thread calls the listener: stop it first.
    std::lock_guard lk(sub_mu_);
    sub_.reset();
  }

  // Connects to every master at once; fails unless a quorum answers.
  std::error_code connect(Millis timeout, std::string& why) {
    const Command ping{{"PING"}, nullptr};
    LaneLease lane(pool_);
    auto replies = lane->run_all(std::span(&ping, 1), timeout);
    std::size_t answered = 0;
    for (const auto& r : replies) {
      if (r.status == NodeStatus::auth_failed) {
        why = r.error;
        return make_error_code(errc::auth_failed);
      }
      if (r.status == NodeStatus::ok) ++answered;
    }
    if (answered < quorum_) {
      why = fmt::format("only {} of {} redlock masters answered (a quorum is {}): {}", answered,
                        masters_.size(), quorum_, failures(replies, {}));
      return make_error_code(errc::quorum_unavailable);
    }
    if (answered < masters_.size()) {
      log_.log(LogLevel::warning, "redlock: {} of {} masters answered; going on with a quorum: {}", answered,
               masters_.size(), failures(replies, {}));
    }
    return {};
  }

  Capabilities capabilities() const noexcept override { return {false, true}; }

  void set_listener(ChangeListener* listener) override { listener_ = listener; }

  AcquireResult try_acquire(const AcquireRequest& req, std::error_code& ec) override {
    ec.clear();
    const std::string key = lock_key(cfg_, req.name);
    const std::string owner(req.owner);
    const std::string ttl_ms = std::to_string(req.ttl.count());
    const Millis timeout = node_timeout(req.ttl);
    // Fast path in native commands (a fraction of a script's cost on the
    // master): SET NX GET tells "taken now" (nil) from "held by X"; PTTL gives a
    // busy holder's remaining lease.
    const std::array<Command, 2> fast{Command{{"SET", key, owner, "NX", "GET", "PX", ttl_ms}, nullptr},
                                      Command{{"PTTL", key}, nullptr}};

    LaneLease lane(pool_);
    // The validity check (ttl - elapsed - drift) is a deadline: measured on the
    // client's clock, the one the engine takes the grant's send time on (tests
    // inject a manual one). Socket timeouts in the fan-out stay on real time.
    const Clock::time_point start = clock_->now();
    std::vector<NodeReply> replies = lane->run_all(fast, timeout);

    AcquireTally tally;
    tally.nodes = replies.size();
    std::vector<bool> definitely_not_ours(replies.size(), false);
    std::vector<std::string> bad_replies;
    std::size_t auth_failed = 0;
    // How many masters each other owner holds: a split vote is a busy verdict
    // in which no other owner holds a quorum either.
    std::map<std::string, std::size_t, std::less<>> holders;
    auto vote_busy = [&](std::size_t i, long long pttl) {
      ++tally.busy;
      definitely_not_ours[i] = true;
      if (pttl >= 0) tally.max_busy_ttl = std::max(tally.max_busy_ttl.value_or(Millis(0)), Millis(pttl));
    };
    // The key already holds our owner id (a leftover of this owner's own earlier
    // lease), or the master does not know SET NX GET (Redis < 7): the acquire
    // script takes it with a fresh TTL. Rare; one more round trip to those only.
    std::vector<std::vector<Command>> slow(replies.size());
    bool any_slow = false;
    for (std::size_t i = 0; i < replies.size(); ++i) {
      const NodeReply& r = replies[i];
      if (r.status == NodeStatus::auth_failed) ++auth_failed;
      if (r.status != NodeStatus::ok) continue;
      const redisReply* set = r.replies[0].get();
      const redisReply* pttl = r.replies[1].get();
      if (set->type == REDIS_REPLY_NIL) {
        ++tally.acquired;
      } else if (set->type == REDIS_REPLY_STRING && std::string_view(set->str, set->len) != owner) {
        vote_busy(i, pttl->type == REDIS_REPLY_INTEGER ? pttl->integer : -1);
        ++holders[std::string(set->str, set->len)];
      } else {
        const std::array<std::string, 1> keys{key};
        const std::array<std::string, 2> args{owner, ttl_ms};
        slow[i].push_back(script_command(kAcquireScript, keys, args));
        any_slow = true;
      }
    }
    if (any_slow) {
      std::vector<NodeReply> more = lane->run(slow, timeout);
      for (std::size_t i = 0; i < more.size(); ++i) {
        if (slow[i].empty()) continue;
        const NodeReply& r = more[i];
        if (r.status == NodeStatus::auth_failed) ++auth_failed;
        if (r.status != NodeStatus::ok) {
          bad_replies.push_back(r.error);  // so a quorum failure names this master too
          continue;
        }
        long long flag = 0, pttl = 0;
        const redisReply* reply = r.replies[0].get();
        if (!integer_at(reply, 0, flag) || !integer_at(reply, 1, pttl)) {
          // An error reply (e.g. WRONGTYPE, OOM, READONLY): no vote, nothing set.
          bad_replies.push_back(fmt::format("{} answered {}", masters_[i]->label(), reply_text(reply)));
          definitely_not_ours[i] = true;
        } else if (flag == 1) {
          ++tally.acquired;
        } else {
          vote_busy(i, pttl);
          ++holders["\n(unknown)"];  // the script does not say who holds it
        }
      }
    }
    const auto elapsed = std::chrono::duration_cast<Millis>(clock_->now() - start);
    const AcquireDecision d = decide_acquire(tally, req.ttl, elapsed);
    const std::string backoff_key = std::string(req.name) + '\0' + owner;
    if (d.verdict == AcquireVerdict::acquired) {
      forget_backoff(backoff_key);
      return AcquireResult{true, 0, d.validity, std::nullopt};
    }

    // Not acquired: release on every master that may hold our key (those that
    // took it and those whose answer is unknown), so no minority keys linger.
    // Sent on the same connections, so it runs after a late acquisition. It is
    // sent as EVAL with the body, not EVALSHA: on a master that answers late, a
    // NOSCRIPT reply would come too late to retry and the key would linger.
    const Command release{{"EVAL", std::string(kReleaseScript.body), "2", key,
                           release_channel(cfg_, req.name), std::string(req.owner)},
                          nullptr};
    std::vector<std::vector<Command>> per_node(replies.size());
    bool any = false;
    for (std::size_t i = 0; i < replies.size(); ++i) {
      if (definitely_not_ours[i]) continue;
      per_node[i].push_back(release);
      any = true;
    }
    // A master that did not answer has the acquisition still pending on its
    // connection: the release is queued behind it there (so it runs after it)
    // and that connection is closed; the others answer on their own connection.
    if (any) lane->run(per_node, timeout, Pending::queue_behind);

    if (d.verdict == AcquireVerdict::quorum_unavailable) {
      const bool credentials = auth_failed > 0 && tally.answered() + auth_failed >= quorum_;
      ec = make_error_code(credentials ? errc::auth_failed : errc::quorum_unavailable);
      std::string detail =
          fmt::format("only {} of {} redlock masters answered (a quorum is {}): {}", tally.answered(),
                      replies.size(), quorum_, failures(replies, bad_replies));
      log_.log(LogLevel::warning, "redlock: lock \"{}\": {}", req.name.substr(0, 200), detail);
      set_error_detail(std::move(detail));
      return {};
    }
    std::size_t top_holder = 0;
    for (const auto& [who, n] : holders) top_holder = std::max(top_holder, n);
    if (d.verdict == AcquireVerdict::busy && top_holder < quorum_ && req.keep_queued) {
      // Split vote: nobody took a quorum. Contenders woken together by the same
      // release would collide again at once; a random delay, growing with this
      // caller's consecutive split votes, spreads them out (Redlock's "retry
      // after a random delay").
      split_vote_backoff(backoff_key, elapsed, req.ttl);
    }
    AcquireResult busy;
    busy.holder_ttl = d.holder_ttl;
    return busy;
  }

  void cancel_acquire(std::string_view name, std::string_view owner) noexcept override {
    try {
      forget_backoff(std::string(name) + '\0' + std::string(owner));
    } catch (...) {
    }
  }

  void renew(std::span<const RenewItem> items, std::span<RenewStatus> out, std::error_code& ec) override {
    ec.clear();
    if (items.empty()) return;
    std::vector<Command> cmds;
    Millis min_ttl = items[0].ttl;
    for (std::size_t begin = 0; begin < items.size(); begin += kRenewChunk) {
      const std::size_t end = std::min(items.size(), begin + kRenewChunk);
      std::vector<std::string> keys, args;
      keys.reserve(end - begin);
      args.reserve(2 * (end - begin));
      for (std::size_t i = begin; i < end; ++i) {
        keys.push_back(lock_key(cfg_, items[i].name));
        args.emplace_back(items[i].owner);
        args.push_back(std::to_string(items[i].ttl.count()));
        min_ttl = std::min(min_ttl, items[i].ttl);
      }
      cmds.push_back(script_command(kRenewScript, keys, args));
    }
    // A large batch may take a while on a master; the reply only has to come
    // back well before the local deadline (ttl - margin after the send time).
    const Millis timeout = std::max(node_timeout(min_ttl), min_ttl / 20);
    LaneLease lane(pool_);
    std::vector<NodeReply> replies = lane->run_all(cmds, timeout);

    std::vector<std::size_t> renewed(items.size(), 0), refused(items.size(), 0);
    std::size_t answered = 0;
    for (const NodeReply& r : replies) {
      if (r.status != NodeStatus::ok) continue;
      ++answered;
      for (std::size_t c = 0; c < r.replies.size(); ++c) {
        const redisReply* reply = r.replies[c].get();
        const std::size_t base = c * kRenewChunk;
        for (std::size_t j = 0; base + j < items.size() && j < kRenewChunk; ++j) {
          long long v = 0;
          if (!integer_at(reply, j, v)) break;  // an error reply: unknown for this chunk
          ++(v == 1 ? renewed : refused)[base + j];
        }
      }
    }
    bool any_known = false;
    for (std::size_t i = 0; i < items.size(); ++i) {
      out[i] = decide_renew(replies.size(), renewed[i], refused[i]);
      any_known = any_known || out[i] != RenewStatus::failed;
    }
    if (answered < quorum_ && !any_known) {
      ec = make_error_code(errc::quorum_unavailable);
      log_.log(LogLevel::warning, "redlock: renewal: only {} of {} masters answered (a quorum is {}): {}",
               answered, replies.size(), quorum_, failures(replies, {}));
    }
  }

  ReleaseStatus release(std::string_view name, std::string_view owner, std::uint64_t /*token*/,
                        std::error_code& ec) override {
    ec.clear();
    const std::array<std::string, 2> keys{lock_key(cfg_, name), release_channel(cfg_, name)};
    const std::array<std::string, 1> args{std::string(owner)};
    const Command cmd = script_command(kReleaseScript, keys, args);
    LaneLease lane(pool_);
    std::vector<NodeReply> replies =
        lane->run_all(std::span(&cmd, 1), cfg_.node_timeout.value_or(kDefaultNodeTimeout));
    std::size_t deleted = 0, refused = 0;
    for (const NodeReply& r : replies) {
      if (r.status != NodeStatus::ok || r.replies[0]->type != REDIS_REPLY_INTEGER) continue;
      ++(r.replies[0]->integer == 1 ? deleted : refused);
    }
    switch (decide_release(replies.size(), deleted, refused)) {
      case ReleaseVerdict::released: return ReleaseStatus::released;
      case ReleaseVerdict::not_owner: return ReleaseStatus::not_owner;
      case ReleaseVerdict::quorum_unavailable:
        ec = make_error_code(errc::quorum_unavailable);
        log_.log(LogLevel::warning, "redlock: release of \"{}\": only {} of {} masters answered: {}",
                 name.substr(0, 200), deleted + refused, replies.size(), failures(replies, {}));
        return ReleaseStatus::released;
    }
    return ReleaseStatus::released;
  }

  void watch(std::string_view name, std::error_code& ec) override {
    ec.clear();
    Subscriber* sub = nullptr;
    {
      std::lock_guard lk(sub_mu_);
      if (!sub_) {
        sub_ = std::make_unique<Subscriber>(
            masters_, [this](std::string_view channel) { on_message(channel); },
            cfg_.node_timeout.value_or(Millis(100)), log_);
      }
      sub = sub_.get();
    }
    // Returns once every reachable master confirmed; a release published after
    // that reaches us. An unreachable master is covered by the engine's re-check.
    sub->subscribe(release_channel(cfg_, name));
  }

  void unwatch(std::string_view name) noexcept override {
    std::lock_guard lk(sub_mu_);
    if (!sub_) return;
    try {
      sub_->unsubscribe(release_channel(cfg_, name));
    } catch (...) {
    }
  }

  LockInfo status(std::string_view name, std::error_code& ec) override {
    ec.clear();
    const std::array<std::string, 1> keys{lock_key(cfg_, name)};
    const Command cmd = script_command(kStatusScript, keys, {});
    LaneLease lane(pool_);
    std::vector<NodeReply> replies =
        lane->run_all(std::span(&cmd, 1), cfg_.node_timeout.value_or(kDefaultNodeTimeout));
    std::size_t answered = 0;
    LockInfo info = status_from(replies, 0, answered);
    if (answered < quorum_) {
      ec = make_error_code(errc::quorum_unavailable);
      set_error_detail(fmt::format("only {} of {} redlock masters answered (a quorum is {}): {}", answered,
                                   replies.size(), quorum_, failures(replies, {})));
      return {};
    }
    return info;
  }

  // Records: a plain key `<prefix>record:<key>` without expiry on every master. A
  // put counts when a quorum stored it; if_absent and get answer the value a quorum
  // holds (docs/redlock.md says exactly what that does and does not guarantee).
  std::string put_record(std::string_view key, std::string_view value, PutMode mode,
                         std::error_code& ec) override {
    ec.clear();
    if (!record_value_fits(key, value, ec)) return {};
    const std::array<std::string, 1> keys{record_key(cfg_, key)};
    const std::array<std::string, 1> args{std::string(value)};
    const Command cmd = mode == PutMode::always ? Command{{"SET", keys[0], args[0]}, nullptr}
                                                : script_command(kPutIfAbsentScript, keys, args);
    const Votes v = record_votes(cmd);
    if (mode == PutMode::always) {
      if (v.ok >= quorum_) return std::string(value);
      record_failed(key, "stored it", v.ok, v, ec);
      return {};
    }
    if (auto agreed = v.majority(quorum_); agreed && *agreed) return **agreed;
    if (v.answered() < quorum_) {
      record_failed(key, "answered", v.answered(), v, ec);
    } else {
      disagreement(key, v, ec);
    }
    return {};
  }

  std::optional<std::string> get_record(std::string_view key, std::error_code& ec) override {
    ec.clear();
    const Votes v = record_votes(Command{{"GET", record_key(cfg_, key)}, nullptr});
    if (auto agreed = v.majority(quorum_)) return *agreed;
    if (v.answered() < quorum_) {
      record_failed(key, "answered", v.answered(), v, ec);
    } else {
      disagreement(key, v, ec);
    }
    return std::nullopt;
  }

  // True when any master that answered held the record.
  bool erase_record(std::string_view key, std::error_code& ec) override {
    ec.clear();
    const Votes v = record_votes(Command{{"DEL", record_key(cfg_, key)}, nullptr});
    if (v.answered() < quorum_) {
      record_failed(key, "answered", v.answered(), v, ec);
      return false;
    }
    return v.deleted > 0;
  }

  // SCAN MATCH `<prefix>lock:<escaped prefix>*` on every master at once, a round per
  // SCAN step; it needs a quorum of masters scanned to the end (a lock held by a
  // quorum is then on at least one of them). The candidates' status is read like
  // status(), kListChunk names per fan-out.
  std::vector<ListedLock> list_held(std::string_view prefix, std::size_t limit, bool& truncated,
                                    std::error_code& ec) override {
    ec.clear();
    truncated = false;
    const std::string head = lock_key(cfg_, "");
    const std::string pattern = redis::glob_escape(head) + redis::glob_escape(prefix) + "*";
    const std::string count = std::to_string(redis::kScanCount);
    const Millis timeout = cfg_.node_timeout.value_or(kListNodeTimeout);
    const std::size_t n = masters_.size();
    std::vector<std::string> cursor(n, "0");
    std::vector<int> state(n, 0);  // 0 scanning, 1 done, 2 failed
    std::vector<std::string> errors;
    std::size_t auth_failed = 0;
    std::set<std::string> names;
    LaneLease lane(pool_);
    for (int round = 0; round < (1 << 24); ++round) {
      std::vector<std::vector<Command>> per_node(n);
      bool any = false;
      for (std::size_t i = 0; i < n; ++i) {
        if (state[i] != 0) continue;
        per_node[i].push_back(Command{{"SCAN", cursor[i], "MATCH", pattern, "COUNT", count}, nullptr});
        any = true;
      }
      if (!any) break;
      std::vector<NodeReply> replies = lane->run(per_node, timeout);
      for (std::size_t i = 0; i < n; ++i) {
        if (state[i] != 0) continue;
        const NodeReply& r = replies[i];
        const redisReply* x = r.status == NodeStatus::ok ? r.replies[0].get() : nullptr;
        if (x == nullptr || x->type != REDIS_REPLY_ARRAY || x->elements != 2 ||
            x->element[0]->type != REDIS_REPLY_STRING || x->element[1]->type != REDIS_REPLY_ARRAY) {
          state[i] = 2;
          if (r.status == NodeStatus::auth_failed) ++auth_failed;
          errors.push_back(
              x == nullptr ? r.error
                           : fmt::format("{} answered SCAN with {}", masters_[i]->label(), reply_text(x)));
          continue;
        }
        for (std::size_t k = 0; k < x->element[1]->elements; ++k) {
          const redisReply* key = x->element[1]->element[k];
          const std::string_view s(key->str, key->len);
          if (s.size() > head.size() && s.substr(0, head.size()) == head &&
              s.substr(head.size(), prefix.size()) == prefix) {
            names.emplace(s.substr(head.size()));
          }
        }
        cursor[i].assign(x->element[0]->str, x->element[0]->len);
        if (cursor[i] == "0") state[i] = 1;
      }
    }
    const auto scanned = static_cast<std::size_t>(std::count(state.begin(), state.end(), 1));
    if (scanned < quorum_) {
      const bool credentials = auth_failed > 0 && scanned + auth_failed >= quorum_;
      ec = make_error_code(credentials ? errc::auth_failed : errc::quorum_unavailable);
      std::string detail =
          fmt::format("list: only {} of {} redlock masters could be scanned (a quorum is {}): {}", scanned, n,
                      quorum_, fmt::join(errors, "; "));
      log_.log(LogLevel::warning, "redlock: {}", detail);
      set_error_detail(std::move(detail));
      return {};
    }
    auto status_of = [&](std::span<const std::string> chunk, std::vector<LockInfo>& infos,
                         std::error_code& e) {
      std::vector<Command> cmds;
      for (const auto& name : chunk) {
        const std::array<std::string, 1> keys{lock_key(cfg_, name)};
        cmds.push_back(script_command(kStatusScript, keys, {}));
      }
      std::vector<NodeReply> replies = lane->run_all(cmds, timeout);
      for (std::size_t j = 0; j < chunk.size(); ++j) {
        std::size_t answered = 0;
        infos.push_back(status_from(replies, j, answered));
        if (answered < quorum_) {
          e = make_error_code(errc::quorum_unavailable);
          set_error_detail(fmt::format(
              "list: status of \"{}\": only {} of {} redlock masters answered (a quorum is {}): {}",
              chunk[j].substr(0, 200), answered, n, quorum_, failures(replies, {})));
          return;
        }
      }
    };
    return redis::held_in_order(names, limit, truncated, status_of, ec);
  }

  std::string url() const override { return url_; }

 private:
  void forget_backoff(const std::string& key) {
    std::lock_guard lk(backoff_mu_);
    split_votes_.erase(key);
  }

  // Sleeps a uniformly random time in [0, window]: window = max(elapsed,
  // kMinBackoff) * 2^(consecutive split votes - 1), at most min(ttl / 4, kMaxBackoff).
  void split_vote_backoff(const std::string& key, Millis elapsed, Millis ttl) {
    int votes = 0;
    {
      std::lock_guard lk(backoff_mu_);
      if (split_votes_.size() >= kMaxBackoffEntries && !split_votes_.contains(key)) split_votes_.clear();
      votes = std::min(++split_votes_[key], kMaxBackoffDoublings + 1);
    }
    const Millis cap = std::max(Millis(1), std::min(ttl / 4, kMaxBackoff));
    Millis window = std::max(elapsed, kMinBackoff);
    for (int i = 1; i < votes && window < cap; ++i) window *= 2;
    window = std::min(window, cap);
    thread_local std::minstd_rand rng{std::random_device{}()};
    std::uniform_int_distribution<std::int64_t> pick(0, window.count());
    std::this_thread::sleep_for(Millis(pick(rng)));
  }

  // The holder a quorum agrees on in reply `j` of each master (kStatusScript), as
  // status() reports it; `answered` counts the masters that gave that reply.
  LockInfo status_from(const std::vector<NodeReply>& replies, std::size_t j, std::size_t& answered) const {
    struct Seen {
      std::size_t count = 0;
      long long min_pttl = -1;
    };
    std::map<std::string, Seen> owners;
    answered = 0;
    for (const NodeReply& r : replies) {
      if (r.status != NodeStatus::ok || j >= r.replies.size()) continue;
      const redisReply* reply = r.replies[j].get();
      long long pttl = 0;
      if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 2 || !integer_at(reply, 1, pttl)) continue;
      ++answered;
      const redisReply* holder = reply->element[0];
      if (holder->type != REDIS_REPLY_STRING) continue;
      Seen& s = owners[std::string(holder->str, holder->len)];
      ++s.count;
      if (pttl >= 0) s.min_pttl = s.min_pttl < 0 ? pttl : std::min(s.min_pttl, pttl);
    }
    LockInfo info;
    for (const auto& [owner, s] : owners) {
      if (s.count < quorum_) continue;
      info.held = true;
      info.holder = owner;
      if (s.min_pttl >= 0) info.ttl_remaining = Millis(s.min_pttl);
    }
    return info;
  }

  // How the masters answered one record command.
  struct Votes {
    std::map<std::optional<std::string>, std::size_t>
        values;                         // a string or nil reply: value (nullopt: none) -> masters
    std::size_t ok = 0;                 // status replies (SET)
    std::size_t deleted = 0, kept = 0;  // integer replies (DEL): > 0, 0
    std::size_t auth_failed = 0;
    std::vector<NodeReply> replies;
    std::vector<std::string> bad;  // "h:p answered <error>"
    std::size_t answered() const {
      std::size_t n = ok + deleted + kept;
      for (const auto& [v, count] : values) n += count;
      return n;
    }
    // The value (or absence) held by at least `quorum` masters.
    std::optional<std::optional<std::string>> majority(std::size_t quorum) const {
      for (const auto& [v, count] : values) {
        if (count >= quorum) return v;
      }
      return std::nullopt;
    }
  };

  Votes record_votes(const Command& cmd) {
    Votes v;
    LaneLease lane(pool_);
    v.replies = lane->run_all(std::span(&cmd, 1), cfg_.node_timeout.value_or(kRecordNodeTimeout));
    for (std::size_t i = 0; i < v.replies.size(); ++i) {
      const NodeReply& r = v.replies[i];
      if (r.status == NodeStatus::auth_failed) ++v.auth_failed;
      if (r.status != NodeStatus::ok) continue;
      const redisReply* x = r.replies[0].get();
      if (x->type == REDIS_REPLY_STRING) {
        ++v.values[std::string(x->str, x->len)];
      } else if (x->type == REDIS_REPLY_NIL) {
        ++v.values[std::nullopt];
      } else if (x->type == REDIS_REPLY_STATUS) {
        ++v.ok;
      } else if (x->type == REDIS_REPLY_INTEGER) {
        ++(x->integer > 0 ? v.deleted : v.kept);
      } else {
        v.bad.push_back(fmt::format("{} answered {}", masters_[i]->label(), reply_text(x)));
      }
    }
    return v;
  }

  // Fewer than a quorum did it: quorum_unavailable (auth_failed when credentials
  // kept the quorum away), with a detail naming every master that failed.
  void record_failed(std::string_view key, const char* did, std::size_t count, const Votes& v,
                     std::error_code& ec) {
    const bool credentials = v.auth_failed > 0 && count + v.auth_failed >= quorum_;
    ec = make_error_code(credentials ? errc::auth_failed : errc::quorum_unavailable);
    std::string detail =
        fmt::format("record \"{}\": only {} of {} redlock masters {} (a quorum is {}): {}",
                    key.substr(0, 200), count, v.replies.size(), did, quorum_, failures(v.replies, v.bad));
    log_.log(LogLevel::warning, "redlock: {}", detail);
    set_error_detail(std::move(detail));
  }

  // A quorum answered but no value (nor absence) is on a quorum of them.
  void disagreement(std::string_view key, const Votes& v, std::error_code& ec) {
    ec = make_error_code(errc::quorum_unavailable);
    std::vector<std::string> parts;
    for (const auto& [value, count] : v.values) {
      parts.push_back(fmt::format("{} on {}", value ? "a value of " + describe_value(*value) : "no record",
                                  count == 1 ? "1 master" : std::to_string(count) + " masters"));
    }
    std::string detail = fmt::format(
        "record \"{}\": the redlock masters disagree, no value is held by a quorum ({} of {}): {}{}{}",
        key.substr(0, 200), quorum_, v.replies.size(), fmt::join(parts, "; "),
        v.answered() < v.replies.size() ? "; " : "", failures(v.replies, v.bad));
    log_.log(LogLevel::warning, "redlock: {}", detail);
    set_error_detail(std::move(detail));
  }

  Millis node_timeout(Millis ttl) const noexcept {
    return cfg_.node_timeout.value_or(default_node_timeout(ttl));
  }

  void on_message(std::string_view channel) {
    if (!listener_ || channel.substr(0, channel_prefix_.size()) != channel_prefix_) return;
    listener_->on_change(channel.substr(channel_prefix_.size()));
  }

  Config cfg_;
  std::vector<std::shared_ptr<Master>> masters_;
  std::size_t quorum_;
  LanePool pool_;
  Logger log_;
  const std::shared_ptr<Clock> clock_;  // ClientOptions::clock, else the system's
  std::string url_;
  std::string channel_prefix_;
  ChangeListener* listener_ = nullptr;

  std::mutex sub_mu_;
  std::unique_ptr<Subscriber> sub_;  // guarded by sub_mu_; made by the first watch()

  std::mutex backoff_mu_;
  std::unordered_map<std::string, int> split_votes_;  // guarded by backoff_mu_; name\0owner -> count
};

}  // namespace

}  // namespace redlock

std::unique_ptr<Backend> make_redlock_backend(const Url& url, const ClientOptions& opts, std::error_code& ec,
                                              std::string& why) {
  redlock::Config cfg;
  if ((ec = redlock::parse_config(url, cfg, why))) return nullptr;
  std::vector<std::shared_ptr<redlock::Master>> masters;
  for (std::size_t i = 0; i < url.hosts.size(); ++i) {
    redis::ConnectionOptions o = redlock::master_options(url, i, opts, ec, why);
    if (ec) return nullptr;
    masters.push_back(std::make_shared<redlock::Master>(std::move(o)));
  }
  auto backend = std::make_unique<redlock::RedlockBackend>(cfg, std::move(masters), opts, url.redacted());
  if ((ec = backend->connect(opts.connect_timeout, why))) return nullptr;
  return backend;
}

}  // namespace distlock::detail
