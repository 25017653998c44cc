// Redlock status, records and listing: what a quorum of masters agrees on.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <set>

#include "redis/records.hpp"
#include "redlock/redlock_backend_impl.hpp"
#include "redlock/scripts.hpp"

namespace distlock::detail::redlock {

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

}  // namespace

LockInfo RedlockBackend::status(std::string_view name, Error& ec) {
  ec.clear();
  // The marker key too: a key beside another acquisition's live lock-delay marker is an
  // attempt that counts busy there, not a holder (scripts.hpp kStatusScript).
  const std::array<std::string, 2> keys{lock_key(cfg_, name), delay_key(cfg_, name)};
  const Command cmd = script_command(kStatusScript, keys, {});
  LaneLease lane(pool_);
  std::vector<NodeReply> replies =
      lane->run_all(std::span(&cmd, 1), cfg_.node_timeout.value_or(kDefaultNodeTimeout));
  std::size_t answered = 0;
  LockInfo info = status_from(replies, 0, answered);
  if (answered < quorum_) {
    ec = make_error_code(errc::quorum_unavailable);
    ec.set_detail(fmt::format("only {} of {} redlock masters answered (a quorum is {}): {}", answered,
                              replies.size(), quorum_, failures(replies, {})));
    return {};
  }
  return info;
}

// Records: a plain key `<prefix>record:<key>` without expiry on every master. A
// put counts when a quorum stored it; if_absent and get answer the value a quorum
// holds (docs/redlock.md says exactly what that does and does not guarantee).
std::string RedlockBackend::put_record(std::string_view key, std::string_view value, PutMode mode,
                                       Error& ec) {
  ec.clear();
  if (!record_value_fits(key, value, ec)) return {};
  const std::array<std::string, 1> keys{record_key(cfg_, key)};
  const std::vector<std::string> args = redis::fenced_put_args(value);
  const Command cmd = mode == PutMode::always ? Command{{"SET", keys[0], args[0]}, nullptr}
                      : mode == PutMode::if_absent
                          ? script_command(kPutIfAbsentScript, keys, std::span(args).first(1))
                          : script_command(kFencedPutScript, keys, args);
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

std::optional<std::string> RedlockBackend::get_record(std::string_view key, Error& ec) {
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
bool RedlockBackend::erase_record(std::string_view key, Error& ec) {
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
std::vector<ListedLock> RedlockBackend::list_held(std::string_view prefix, std::size_t limit, bool& truncated,
                                                  Error& ec) {
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
        errors.push_back(x == nullptr
                             ? r.error
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
    ec.set_detail(std::move(detail));
    return {};
  }
  auto status_of = [&](std::span<const std::string> chunk, std::vector<LockInfo>& infos, Error& e) {
    std::vector<Command> cmds;
    for (const auto& name : chunk) {
      const std::array<std::string, 2> keys{lock_key(cfg_, name), delay_key(cfg_, name)};
      cmds.push_back(script_command(kStatusScript, keys, {}));
    }
    std::vector<NodeReply> replies = lane->run_all(cmds, timeout);
    for (std::size_t j = 0; j < chunk.size(); ++j) {
      std::size_t answered = 0;
      infos.push_back(status_from(replies, j, answered));
      if (answered < quorum_) {
        e = make_error_code(errc::quorum_unavailable);
        e.set_detail(
            fmt::format("list: status of \"{}\": only {} of {} redlock masters answered (a quorum is {}): {}",
                        chunk[j].substr(0, 200), answered, n, quorum_, failures(replies, {})));
        return;
      }
    }
  };
  return redis::held_in_order(names, limit, truncated, status_of, ec);
}

// The holder a quorum agrees on in reply `j` of each master (kStatusScript), as
// status() reports it; `answered` counts the masters that gave that reply. A master where the
// key stands beside another acquisition's live lock-delay marker answers no key (an attempt in
// flight inside a lost holder's delay: no grant counts it), so such a key never makes a holder.
LockInfo RedlockBackend::status_from(const std::vector<NodeReply>& replies, std::size_t j,
                                     std::size_t& answered) const {
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
    // "@revoked": a revoked lease's key waiting out its life (kRevokeScript), held by nobody.
    if (holder->len > 0 && holder->str[0] == '@') continue;
    // The owner part: two attempts of one owner hold for that owner.
    Seen& s = owners[std::string(owner_of(std::string_view(holder->str, holder->len)))];
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

RedlockBackend::Votes RedlockBackend::record_votes(const Command& cmd) {
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
void RedlockBackend::record_failed(std::string_view key, const char* did, std::size_t count, const Votes& v,
                                   Error& ec) {
  const bool credentials = v.auth_failed > 0 && count + v.auth_failed >= quorum_;
  ec = make_error_code(credentials ? errc::auth_failed : errc::quorum_unavailable);
  std::string detail =
      fmt::format("record \"{}\": only {} of {} redlock masters {} (a quorum is {}): {}", key.substr(0, 200),
                  count, v.replies.size(), did, quorum_, failures(v.replies, v.bad));
  log_.log(LogLevel::warning, "redlock: {}", detail);
  ec.set_detail(std::move(detail));
}

// A quorum answered but no value (nor absence) is on a quorum of them.
void RedlockBackend::disagreement(std::string_view key, const Votes& v, Error& ec) {
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
  ec.set_detail(std::move(detail));
}

}  // namespace distlock::detail::redlock
