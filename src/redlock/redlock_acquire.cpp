// Redlock acquisition: one fan-out of SET NX GET to every master, the quorum's
// verdict, releasing a minority's keys, and the split-vote backoff.
#include <fmt/format.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <random>
#include <thread>

#include "redlock/redlock_backend_impl.hpp"
#include "redlock/scripts.hpp"

namespace distlock::detail::redlock {

AcquireResult RedlockBackend::try_acquire(const AcquireRequest& req, Error& ec) {
  ec.clear();
  const std::string key = lock_key(cfg_, req.name);
  const std::string marker = delay_key(cfg_, req.name);
  const std::string owner(req.owner);
  const std::string ttl_ms = std::to_string(req.ttl.count());
  const Millis timeout = node_timeout(req.ttl);
  // With a lock_delay the key and its marker are written in one script per master (the
  // script refuses the key while a lost holder's marker lives there). Without one, a
  // fast path in native commands (a fraction of a script's cost on the master): SET NX
  // GET tells "taken now" (nil) from "held by X"; PTTL gives a busy holder's remaining
  // lease; the marker's PTTL, read after the SET, tells whether a lost holder's
  // lock-delay still runs there. Only a holder of the key writes a marker, so a marker
  // seen right after our SET took the key was there before it (or is our own lost
  // lease's): that master votes busy and the key is taken back (docs/redlock.md
  // "Lock-delay").
  const std::string extra = std::to_string(lock_delay_extra(req.lock_delay).count());
  const bool with_delay = req.lock_delay.count() > 0;
  const std::array<std::string, 2> script_keys{key, marker};
  // The attempt's nonce, in the key's value "<owner>\n<nonce>" and in the markers it writes:
  // undoing a failed attempt deletes only that value and those markers, never the key a later
  // attempt of the same owner (the engine sends every attempt of one acquire() call with one
  // owner id) took, nor a marker of this owner's lost lease (scripts.hpp kReleaseScript). It
  // increases from attempt to attempt in this process (one counter, from a random start below
  // 2^30: no wrap), so an earlier attempt's late script never takes over a later one's key
  // (kAcquireScript).
  static std::atomic<std::uint64_t> next_nonce{std::random_device{}() & ((std::uint64_t{1} << 30) - 1)};
  const std::string nonce = fmt::format("{:016x}", next_nonce.fetch_add(1, std::memory_order_relaxed));
  const std::string my_value = owner + "\n" + nonce;
  const std::array<std::string, 4> script_args{owner, ttl_ms, extra, nonce};
  const std::string my_marker = extra + "\n" + owner + "\n" + nonce;
  std::vector<Command> first;
  if (with_delay) {
    first.push_back(script_command(kAcquireScript, script_keys, script_args));
  } else {
    first = {Command{{"SET", key, my_value, "NX", "GET", "PX", ttl_ms}, nullptr},
             Command{{"PTTL", key}, nullptr}, Command{{"PTTL", marker}, nullptr}};
  }

  LaneLease lane(pool_);
  // The validity check (ttl - elapsed - drift) is a deadline: measured on the
  // client's clock, the one the engine takes the grant's send time on (tests
  // inject a manual one). Socket timeouts in the fan-out stay on real time.
  const Clock::time_point start = clock_->now();
  std::vector<NodeReply> replies = lane->run_all(first, timeout);

  AcquireTally tally;
  tally.nodes = replies.size();
  std::vector<bool> definitely_not_ours(replies.size(), false);
  std::vector<bool> taken_in_delay(replies.size(), false);
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
  // The script's answer on master i: acquired, busy (its PTTL), or an error (no vote).
  auto count_script = [&](std::size_t i, const redisReply* reply) {
    long long flag = 0, pttl = 0;
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
  };
  // The key already holds our owner id (a leftover of this owner's own earlier
  // attempt or lease), or the master does not know SET NX GET (Redis < 7): the acquire
  // script takes it with a fresh TTL unless a later attempt's nonce is there. Rare; one
  // more round trip to those only.
  std::vector<std::vector<Command>> slow(replies.size());
  bool any_slow = false;
  for (std::size_t i = 0; i < replies.size(); ++i) {
    const NodeReply& r = replies[i];
    if (r.status == NodeStatus::auth_failed) ++auth_failed;
    if (r.status != NodeStatus::ok) continue;
    if (with_delay) {
      count_script(i, r.replies[0].get());
      continue;
    }
    const redisReply* set = r.replies[0].get();
    const redisReply* pttl = r.replies[1].get();
    const redisReply* held_back = r.replies[2].get();
    if (set->type == REDIS_REPLY_NIL && held_back->type == REDIS_REPLY_INTEGER && held_back->integer > 0) {
      // Taken while a lost holder's lock-delay runs here: busy; the key is taken back (by
      // the not-acquired path below, or right after a grant by a quorum elsewhere), never
      // the marker.
      taken_in_delay[i] = true;
      ++tally.busy;
      tally.max_busy_ttl = std::max(tally.max_busy_ttl.value_or(Millis(0)), Millis(held_back->integer));
      ++holders["\n(lock-delay)"];
    } else if (set->type == REDIS_REPLY_NIL) {
      ++tally.acquired;
    } else if (set->type == REDIS_REPLY_STRING && owner_of(std::string_view(set->str, set->len)) != owner) {
      vote_busy(i, pttl->type == REDIS_REPLY_INTEGER ? pttl->integer : -1);
      ++holders[std::string(owner_of(std::string_view(set->str, set->len)))];
    } else {
      slow[i].push_back(script_command(kAcquireScript, script_keys, script_args));
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
      count_script(i, r.replies[0].get());
    }
  }
  const auto elapsed = std::chrono::duration_cast<Millis>(clock_->now() - start);
  const AcquireDecision d = decide_acquire(tally, req.ttl, elapsed);
  const std::string backoff_key = std::string(req.name) + '\0' + owner;
  if (d.verdict == AcquireVerdict::acquired) {
    forget_backoff(backoff_key);
    // Granted by a quorum elsewhere: the keys taken where a lost holder's marker lives go
    // back (the key only; rare: one more round trip to those masters).
    std::vector<std::vector<Command>> undo(replies.size());
    bool any_undo = false;
    for (std::size_t i = 0; i < replies.size(); ++i) {
      if (!taken_in_delay[i]) continue;
      undo[i].push_back(Command{{"EVAL", std::string(kReleaseScript.body), "3", key,
                                 release_channel(cfg_, req.name), marker, owner, "0", "", my_value},
                                nullptr});
      any_undo = true;
    }
    if (any_undo) lane->run(undo, timeout);
    return AcquireResult{true, 0, d.validity, std::nullopt};
  }

  // Not acquired: release on every master that may hold our key (those that
  // took it and those whose answer is unknown), so no minority keys linger.
  // Sent on the same connections, so it runs after a late acquisition. It is
  // sent as EVAL with the body, not EVALSHA: on a master that answers late, a
  // NOSCRIPT reply would come too late to retry and the key would linger.
  // The markers this attempt wrote (with a lock_delay: exactly its own value) go with its
  // keys; without one it wrote none, and a marker beside a key it took is a lost holder's:
  // it stays. The key goes only where it holds exactly this attempt's value: queued behind a
  // pending request, this release may run after a later attempt of the same owner took the
  // key on another connection (docs/redlock.md "Connections"); that key stays.
  const Command release{{"EVAL", std::string(kReleaseScript.body), "3", key, release_channel(cfg_, req.name),
                         marker, std::string(req.owner), with_delay ? "=" : "0", my_marker, my_value},
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
    ec.set_detail(std::move(detail));
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

void RedlockBackend::cancel_acquire(std::string_view name, std::string_view owner) noexcept {
  try {
    forget_backoff(std::string(name) + '\0' + std::string(owner));
  } catch (...) {
  }
}

// Sleeps a uniformly random time in [0, window]: window = max(elapsed,
// kMinBackoff) * 2^(consecutive split votes - 1), at most min(ttl / 4, kMaxBackoff).
void RedlockBackend::split_vote_backoff(const std::string& key, Millis elapsed, Millis ttl) {
  int votes = 0;
  {
    LockGuard lk(backoff_mu_);
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

}  // namespace distlock::detail::redlock
