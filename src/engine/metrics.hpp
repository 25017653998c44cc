// Per-client metrics in the Prometheus text exposition format (version 0.0.4).
//
// The engine calls one small hook per event (an acquisition ends, a hold ends, a
// renewal is answered, a lease is lost, a release ends); each hook is a few relaxed
// atomic increments on a per-prefix series the lease keeps a pointer to, so the hot
// path takes no lock. `text()` renders everything; docs/metrics.md lists the families.
//
// Prefix label (bounded cardinality): the lock name with leading '/' and ':' skipped,
// up to the next '/' or ':' (the whole rest when there is none). A prefix that is
// empty, longer than kMaxPrefixBytes, contains a byte outside [A-Za-z0-9_.-], or is
// "other" itself, is counted under "other"; so is every prefix after the first
// kMaxPrefixes distinct ones a client has seen.
//
// Thread-safety: every member may be called from any thread at once. Counters are
// relaxed atomics: a scrape is a snapshot of each counter, not of all of them at one
// instant (a histogram's _count is the sum of the buckets it printed, so each
// histogram is self-consistent).
//
// Example:
//   Metrics m("redis");
//   MetricsSeries* s = m.series_for("orders/42");   // prefix "orders"
//   m.acquired(s, std::chrono::milliseconds(300));  // wait histogram, le="0.5"
//   std::string text = m.text(1);
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "distlock/clock.hpp"
#include "engine/backend.hpp"

namespace distlock::detail {

/// How an acquisition that reached the engine ended (a re-entry is not one).
enum class AcquireOutcome : std::uint8_t { ok, busy, timeout, error, count_ };
/// Why a lease was lost: every cause the engine tells apart.
enum class LossReason : std::uint8_t {
  local_deadline,   ///< the local deadline passed without a successful renewal
  renewal_late,     ///< a renewal succeeded, but its reply came after the local deadline
  renewal_refused,  ///< the server said another owner (or nobody) holds it
  session_lost,     ///< the client's session ended (also while the lock was being granted)
  lease_ended,      ///< the server ended this one lease (deleted from outside, its node or session gone)
  gone_at_release,  ///< the server no longer had it when the holder released it
  max_hold,         ///< LockOptions::max_hold passed since the grant
  revoked,          ///< Client::revoke ended it (the renewal found the revoke note of its token)
  count_
};
/// How a Client::revoke call ended.
enum class RevokeOutcome : std::uint8_t { revoked, nothing_held, error, count_ };
/// How an orderly release (hold count reaching zero) ended.
enum class ReleaseOutcome : std::uint8_t { ok, lost, error, count_ };

/// Fixed-bucket histogram of durations; buckets are non-cumulative internally.
class DurationHistogram {
 public:
  /// `bounds_ns`: ascending upper bounds in nanoseconds; `labels`: the same in
  /// seconds as printed in `le`. Both must outlive the histogram.
  DurationHistogram(const std::int64_t* bounds_ns, const char* const* labels, std::size_t n) noexcept;
  void observe(Clock::duration d) noexcept;
  /// Appends `<name>_bucket{<labels>,le=...}`, `_sum` and `_count` lines.
  void render(std::string& out, std::string_view name, std::string_view labels) const;

 private:
  const std::int64_t* bounds_ns_;
  const char* const* labels_;
  std::size_t n_;
  static constexpr std::size_t kMaxBuckets = 24;
  std::array<std::atomic<std::uint64_t>, kMaxBuckets + 1> counts_{};  // [n_] is +Inf
  std::atomic<std::uint64_t> sum_ns_{0};
};

/// The counters of one prefix label value.
struct MetricsSeries {
  explicit MetricsSeries(std::string prefix_label);
  const std::string prefix;
  std::array<std::atomic<std::uint64_t>, static_cast<std::size_t>(AcquireOutcome::count_)> acquisitions{};
  std::array<std::atomic<std::uint64_t>, 3> renewals{};  // indexed by RenewStatus
  std::array<std::atomic<std::uint64_t>, static_cast<std::size_t>(LossReason::count_)> losses{};
  std::array<std::atomic<std::uint64_t>, static_cast<std::size_t>(ReleaseOutcome::count_)> releases{};
  std::array<std::atomic<std::uint64_t>, static_cast<std::size_t>(RevokeOutcome::count_)> revokes{};
  DurationHistogram wait;
  DurationHistogram hold;
};

class Metrics {
 public:
  static constexpr std::size_t kMaxPrefixes = 32;
  static constexpr std::size_t kMaxPrefixBytes = 64;
  static constexpr std::string_view kOther = "other";

  /// `backend`: the value of the `backend` label (the URL scheme).
  explicit Metrics(std::string backend);
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  /// The prefix label a name counts under, before the kMaxPrefixes cap.
  static std::string_view prefix_label(std::string_view name) noexcept;
  /// The series `name` counts under; never null. Lock-free once its prefix is known.
  MetricsSeries* series_for(std::string_view name) noexcept;

  void acquired(MetricsSeries* s, Clock::duration waited) noexcept;
  void acquire_failed(MetricsSeries* s, AcquireOutcome outcome) noexcept;
  void hold_ended(MetricsSeries* s, Clock::duration held) noexcept;
  void renewal(MetricsSeries* s, RenewStatus status) noexcept;
  void renewal_round_trip(Clock::duration d) noexcept;
  void loss(MetricsSeries* s, LossReason reason) noexcept;
  void release(MetricsSeries* s, ReleaseOutcome outcome) noexcept;
  void revoke(MetricsSeries* s, RevokeOutcome outcome) noexcept;

  /// The exposition text; `held` is the value of the distlock_leases_held gauge.
  std::string text(std::size_t held, std::uint64_t notification_channel_drops = 0) const;

 private:
  const std::string backend_;
  std::array<std::atomic<MetricsSeries*>, kMaxPrefixes> slots_{};
  std::atomic<std::size_t> used_{0};
  std::mutex add_mu_;  // serialises adding a series; lookups never take it
  std::unique_ptr<MetricsSeries> other_;
  DurationHistogram renew_rtt_;
};

}  // namespace distlock::detail
