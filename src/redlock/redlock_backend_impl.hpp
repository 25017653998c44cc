// The Redlock backend's private declarations, shared by its files: redlock_acquire.cpp
// (acquire, split-vote backoff), redlock_lease.cpp (renew, release, watch),
// redlock_records.cpp (status, records, listing) and redlock_backend.cpp (URL, connect,
// factory). Not for use outside src/redlock.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "distlock/clock.hpp"
#include "engine/log.hpp"
#include "engine/thread_annotations.hpp"
#include "redlock/fanout.hpp"
#include "redlock/quorum.hpp"
#include "redlock/redlock_backend.hpp"
#include "redlock/subscriber.hpp"

namespace distlock::detail::redlock {

// Renewals are batched over many keys; a few hundred keys per script call keeps
// each call short on the master.
inline constexpr std::size_t kRenewChunk = 512;
// Default per-node timeout for requests that carry no TTL (release, status, watch).
inline constexpr Millis kDefaultNodeTimeout{50};
// Split-vote backoff: the first window is the attempt's own duration (at least
// kMinBackoff) and doubles with each consecutive split vote of the same caller,
// up to min(ttl / 4, kMaxBackoff).
inline constexpr Millis kMinBackoff{2};
inline constexpr Millis kMaxBackoff{1000};
inline constexpr int kMaxBackoffDoublings = 10;
// Entries of callers that never finish (they always end in acquired or
// cancel_acquire) cannot pile up beyond this.
inline constexpr std::size_t kMaxBackoffEntries = 4096;

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

/// The owner part of a lock key's value "<owner>\n<nonce>" (scripts.hpp): everything before a
/// last "\n" followed by hex digits only; a value without such a tail is all owner.
inline std::string_view owner_of(std::string_view value) {
  const auto nl = value.rfind('\n');
  if (nl == std::string_view::npos || nl + 1 == value.size()) return value;
  for (const char c : value.substr(nl + 1)) {
    const bool hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
    if (!hex) return value;
  }
  return value.substr(0, nl);
}

inline bool integer_at(const redisReply* r, std::size_t i, long long& out) {
  if (!r || r->type != REDIS_REPLY_ARRAY || i >= r->elements || r->element[i]->type != REDIS_REPLY_INTEGER) {
    return false;
  }
  out = r->element[i]->integer;
  return true;
}

// Why masters failed, for messages: "h:p: Connection refused; h2:p2 did not answer within 50 ms".
inline std::string failures(const std::vector<NodeReply>& replies, const std::vector<std::string>& extra) {
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
    LockGuard lk(sub_mu_);
    sub_.reset();
  }

  void connect(Millis timeout, Error& ec);

  Capabilities capabilities() const noexcept override { return {false, true, true}; }

  void set_listener(ChangeListener* listener) override { listener_ = listener; }

  AcquireResult try_acquire(const AcquireRequest& req, Error& ec) override;
  void cancel_acquire(std::string_view name, std::string_view owner) noexcept override;
  void renew(std::span<const RenewItem> items, std::span<RenewStatus> out, Error& ec) override;
  ReleaseStatus release(std::string_view name, std::string_view owner, std::uint64_t /*token*/,
                        Error& ec) override;
  // A lease the engine declared lost: its keys go (owner-checked), its lock-delay markers stay
  // (a loss is not a release; docs/redlock.md "Lock-delay").
  void forget(std::string_view name, std::string_view owner, std::uint64_t token) noexcept override;
  void watch(std::string_view name, Error& ec) override;
  void unwatch(std::string_view name) noexcept override;
  LockInfo status(std::string_view name, Error& ec) override;
  Revoked revoke(std::string_view name, std::string_view note, Millis note_life, Error& ec) override;
  std::optional<std::string> revoke_note(std::string_view name, Error& ec) override;
  std::string put_record(std::string_view key, std::string_view value, PutMode mode, Error& ec) override;
  std::optional<std::string> get_record(std::string_view key, Error& ec) override;
  bool erase_record(std::string_view key, Error& ec) override;
  std::vector<ListedLock> list_held(std::string_view prefix, std::size_t limit, bool& truncated,
                                    Error& ec) override;

  std::string url() const override { return url_; }

 private:
  void forget_backoff(const std::string& key) {
    LockGuard lk(backoff_mu_);
    split_votes_.erase(key);
  }

  void split_vote_backoff(const std::string& key, Millis elapsed, Millis ttl);
  LockInfo status_from(const std::vector<NodeReply>& replies, std::size_t j, std::size_t& answered) const;

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

  Votes record_votes(const Command& cmd);
  void record_failed(std::string_view key, const char* did, std::size_t count, const Votes& v, Error& ec);
  void disagreement(std::string_view key, const Votes& v, Error& ec);

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

  AnnotatedMutex sub_mu_;
  std::unique_ptr<Subscriber> sub_ DISTLOCK_GUARDED_BY(sub_mu_);  // made by the first watch()

  AnnotatedMutex backoff_mu_;
  std::unordered_map<std::string, int> split_votes_ DISTLOCK_GUARDED_BY(backoff_mu_);  // name\0owner -> count
};

}  // namespace distlock::detail::redlock
