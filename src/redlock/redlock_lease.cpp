// Redlock leases after acquisition: batched renewal, release, and watching the
// release channels.
#include <algorithm>
#include <array>
#include <map>
#include <string>
#include <vector>

#include "redlock/redlock_backend_impl.hpp"
#include "redlock/scripts.hpp"

namespace distlock::detail::redlock {

void RedlockBackend::renew(std::span<const RenewItem> items, std::span<RenewStatus> out, Error& ec) {
  ec.clear();
  if (items.empty()) return;
  std::vector<Command> cmds;
  Millis min_ttl = items[0].ttl;
  for (std::size_t begin = 0; begin < items.size(); begin += kRenewChunk) {
    const std::size_t end = std::min(items.size(), begin + kRenewChunk);
    std::vector<std::string> keys, args;
    keys.reserve(2 * (end - begin));
    args.reserve(2 * (end - begin));
    for (std::size_t i = begin; i < end; ++i) {
      keys.push_back(lock_key(cfg_, items[i].name));
      args.emplace_back(items[i].owner);
      args.push_back(std::to_string(items[i].ttl.count()));
      min_ttl = std::min(min_ttl, items[i].ttl);
    }
    // The lock-delay markers, moved with the keys where they are this owner's.
    for (std::size_t i = begin; i < end; ++i) keys.push_back(delay_key(cfg_, items[i].name));
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

ReleaseStatus RedlockBackend::release(std::string_view name, std::string_view owner, std::uint64_t /*token*/,
                                      Error& ec) {
  ec.clear();
  // In two steps: the keys first (answering 2 where this owner's lock-delay marker stays beside
  // the key), then, only once a quorum confirmed a normal release, those markers. A release
  // that finds the lease gone on a quorum (revoked, expired: a loss) or reaches no quorum keeps
  // every marker, so the name stays held back for the lost lease's delay (docs/redlock.md
  // "Lock-delay"). A lease without a lock-delay has no marker: one step, as before.
  const std::array<std::string, 3> keys{lock_key(cfg_, name), release_channel(cfg_, name),
                                        delay_key(cfg_, name)};
  const std::array<std::string, 2> args{std::string(owner), "1"};
  const Command cmd = script_command(kReleaseScript, keys, args);
  const Millis timeout = cfg_.node_timeout.value_or(kDefaultNodeTimeout);
  LaneLease lane(pool_);
  std::vector<NodeReply> replies = lane->run_all(std::span(&cmd, 1), timeout);
  std::size_t deleted = 0, refused = 0;
  std::vector<std::vector<Command>> markers(replies.size());
  bool any_marker = false;
  for (std::size_t i = 0; i < replies.size(); ++i) {
    const NodeReply& r = replies[i];
    if (r.status != NodeStatus::ok || r.replies[0]->type != REDIS_REPLY_INTEGER) continue;
    const long long v = r.replies[0]->integer;
    ++(v >= 1 ? deleted : refused);
    if (v == 2) {
      const std::array<std::string, 2> marker_args{std::string(owner), "m"};
      markers[i].push_back(script_command(kReleaseScript, keys, marker_args));
      any_marker = true;
    }
  }
  switch (decide_release(replies.size(), deleted, refused)) {
    case ReleaseVerdict::released:
      // Best effort: a marker left (a master that does not answer now) ends by its TTL.
      if (any_marker) lane->run(markers, timeout);
      return ReleaseStatus::released;
    case ReleaseVerdict::not_owner: return ReleaseStatus::not_owner;
    case ReleaseVerdict::quorum_unavailable:
      ec = make_error_code(errc::quorum_unavailable);
      log_.log(LogLevel::warning, "redlock: release of \"{}\": only {} of {} masters answered: {}",
               name.substr(0, 200), deleted + refused, replies.size(), failures(replies, {}));
      return ReleaseStatus::released;
  }
  return ReleaseStatus::released;
}

// The release script in its key-only mode on every master: the lost lease's keys go where
// they are still this owner's (the next holder need not wait for their expiry), its markers
// stay, and nothing is announced where a marker lives. Best effort: the keys' TTL is the bound.
void RedlockBackend::forget(std::string_view name, std::string_view owner, std::uint64_t /*token*/) noexcept {
  try {
    const std::array<std::string, 3> keys{lock_key(cfg_, name), release_channel(cfg_, name),
                                          delay_key(cfg_, name)};
    const std::array<std::string, 2> args{std::string(owner), "0"};
    const Command cmd = script_command(kReleaseScript, keys, args);
    LaneLease lane(pool_);
    (void)lane->run_all(std::span(&cmd, 1), cfg_.node_timeout.value_or(kDefaultNodeTimeout));
  } catch (...) {  // out of memory: the keys expire after their ttl
  }
}

// The revoke script on every master at once. A lock is held where a quorum of masters has
// its key; the holder's lease ends once the masters that still may have its key (those that
// did not answer) are fewer than a quorum: only then is it reported revoked, else
// quorum_unavailable. A master where the key stands beside another acquisition's live
// lock-delay marker answers "not held" (a fast-path attempt inside a lost holder's delay, which
// votes busy there and takes its key back; no grant and no renewal counts such a key, so it
// cannot keep a lease the revoke reports ended). An owner whose key was found on fewer masters
// than a quorum, even with every master that did not answer and every master another revoke
// took that same owner's key from counted for it, held nothing: not revoked. Fewer than a quorum answering
// with no key found is quorum_unavailable too: "nothing held" is not known then.
RedlockBackend::Revoked RedlockBackend::revoke(std::string_view name, std::string_view note, Millis note_life,
                                               Error& ec) {
  ec.clear();
  // The marker key too: a key beside another acquisition's live lock-delay marker is an
  // attempt that counts busy there (scripts.hpp kRevokeScript): not held.
  const std::array<std::string, 4> keys{lock_key(cfg_, name), revoke_note_key(cfg_, name),
                                        release_channel(cfg_, name), delay_key(cfg_, name)};
  const std::array<std::string, 2> args{std::string(note), std::to_string(note_life.count())};
  const Command cmd = script_command(kRevokeScript, keys, args);
  LaneLease lane(pool_);
  std::vector<NodeReply> replies =
      lane->run_all(std::span(&cmd, 1), cfg_.node_timeout.value_or(kDefaultNodeTimeout));
  std::size_t answered = 0;
  // The notes beside the "@revoked" keys of masters another revoke reached first ({2, note}):
  // "0\n<owner>\n..." names the owner that revoke took the key from.
  std::vector<std::string> revoked_notes;
  std::map<std::string, std::size_t> holders;
  for (const NodeReply& r : replies) {
    if (r.status != NodeStatus::ok) continue;
    const redisReply* x = r.replies[0].get();
    long long flag = 0;
    if (!integer_at(x, 0, flag)) continue;
    ++answered;
    if (x->elements != 2 || x->element[1]->type != REDIS_REPLY_STRING) continue;
    std::string text(x->element[1]->str, x->element[1]->len);
    if (flag == 1) ++holders[std::move(text)];
    if (flag == 2) revoked_notes.push_back(std::move(text));
  }
  if (answered < quorum_ && holders.empty()) {
    ec.fail(errc::quorum_unavailable,
            fmt::format("redlock: revoke of \"{}\": only {} of {} masters answered: {}", name.substr(0, 200),
                        answered, replies.size(), failures(replies, {})));
    return {};
  }
  if (holders.empty()) return {};
  // The holder keeps its lease while the masters that did not answer are a quorum: it
  // still renews there. Such a revoke ended nothing and must not say it did.
  if (replies.size() - answered >= quorum_) {
    ec.fail(
        errc::quorum_unavailable,
        fmt::format("redlock: revoke of \"{}\": only {} of {} masters answered ({}); the holder may still "
                    "renew on a quorum of the others: not revoked",
                    name.substr(0, 200), answered, replies.size(), failures(replies, {})));
    return {};
  }
  // Each owner's masters: those where this revoke took its key, and those where another
  // revoke took that same owner's key first (overlapping revokes of one holder each find part
  // of its keys: every one of them ended it). An "@revoked" left by a revoke of another owner
  // (an earlier holder's, waiting out its life) counts for nobody; nor does one whose note is
  // gone (a note life shorter than the key's).
  Revoked out;
  const std::size_t silent = replies.size() - answered;
  std::size_t best = 0;
  std::size_t candidates = 0;  // owners that reach a quorum with the silent masters counted
  for (const auto& [owner, count] : holders) {
    const std::string prefix = "0\n" + owner + "\n";
    const auto same =
        static_cast<std::size_t>(std::count_if(revoked_notes.begin(), revoked_notes.end(),
                                               [&](const std::string& n) { return n.starts_with(prefix); }));
    if (count + same + silent >= quorum_) ++candidates;
    if (count + same > best) {
      best = count + same;
      out.holder = owner;
    }
  }
  // A key on fewer masters than a quorum, counting for it those that did not answer and
  // those another revoke of the same owner reached first, is an attempt in flight or one
  // being cleaned up, never a holder: nobody was revoked (its key there is "@revoked" now, so
  // that attempt cannot win that master).
  if (best + silent < quorum_) return {};
  out.revoked = true;
  // Two owners each reach a quorum only with the silent masters counted for them (a holder
  // and a failing attempt, on either side of the silent masters): whichever held the lock,
  // its keys here are "@revoked" now and the silent masters are fewer than a quorum, so its
  // lease is ended; but which one held it is not known, and naming the other would report an
  // owner that never held a quorum as the revoked holder. No holder is named (the engine
  // reports it unknown).
  if (candidates > 1) out.holder.clear();
  return out;
}

// The note a quorum of all the masters holds; none when no note is on a quorum (a revoke
// that reached fewer masters than a quorum with its note, or overlapping revokes that split
// them), and quorum_unavailable when fewer than a quorum answered. Never the most common
// note short of a quorum: with masters down that may be a minority's, such as the note of a
// revoke that found only an attempt's key on one master and revoked nobody; a holder that
// took it for its own would report its loss as that revoke's (docs/redlock.md "Revoke").
// The engine reads a missing note, or an error, as an ordinary refusal (renewal_refused).
std::optional<std::string> RedlockBackend::revoke_note(std::string_view name, Error& ec) {
  ec.clear();
  const Votes v = record_votes(Command{{"GET", revoke_note_key(cfg_, name)}, nullptr});
  if (v.answered() < quorum_) {
    ec.fail(errc::quorum_unavailable,
            fmt::format("redlock: revoke note of \"{}\": only {} of {} masters answered (a quorum is {}): {}",
                        name.substr(0, 200), v.answered(), v.replies.size(), quorum_,
                        failures(v.replies, v.bad)));
    return std::nullopt;
  }
  if (auto agreed = v.majority(quorum_)) return *agreed;
  return std::nullopt;
}

void RedlockBackend::watch(std::string_view name, Error& ec) {
  ec.clear();
  Subscriber* sub = nullptr;
  {
    LockGuard lk(sub_mu_);
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

void RedlockBackend::unwatch(std::string_view name) noexcept {
  LockGuard lk(sub_mu_);
  if (!sub_) return;
  try {
    sub_->unsubscribe(release_channel(cfg_, name));
  } catch (...) {
  }
}

}  // namespace distlock::detail::redlock
