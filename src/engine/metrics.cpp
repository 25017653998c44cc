#include "engine/metrics.hpp"

#include <algorithm>
#include <chrono>
#include <vector>

#include "engine/names.hpp"

namespace distlock::detail {

namespace {

constexpr std::int64_t kMs = 1'000'000;  // ns per millisecond

// Acquire waits: from sub-millisecond (uncontended) to minutes (a queue of jobs).
constexpr std::int64_t kWaitNs[] = {
    1 * kMs,   5 * kMs / 2, 5 * kMs,    10 * kMs,   25 * kMs,    50 * kMs,    100 * kMs,   250 * kMs,
    500 * kMs, 1000 * kMs,  2500 * kMs, 5000 * kMs, 10000 * kMs, 30000 * kMs, 60000 * kMs, 300000 * kMs};
constexpr const char* kWaitLe[] = {"0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25",
                                   "0.5",   "1",      "2.5",   "5",    "10",    "30",   "60",  "300"};
// Holds: from a request guard (ms) to a nightly job (hours).
constexpr std::int64_t kHoldNs[] = {1 * kMs,       10 * kMs,       100 * kMs,     500 * kMs,
                                    1000 * kMs,    5000 * kMs,     10000 * kMs,   30000 * kMs,
                                    60000 * kMs,   300000 * kMs,   900000 * kMs,  1800000 * kMs,
                                    3600000 * kMs, 14400000 * kMs, 86400000 * kMs};
constexpr const char* kHoldLe[] = {"0.001", "0.01", "0.1", "0.5",  "1",    "5",     "10",   "30",
                                   "60",    "300",  "900", "1800", "3600", "14400", "86400"};
// Renewal round trips: loopback (100 µs) to a command timeout (seconds).
constexpr std::int64_t kRttNs[] = {kMs / 10,  kMs / 4,   kMs / 2,    1 * kMs,    5 * kMs / 2,
                                   5 * kMs,   10 * kMs,  25 * kMs,   50 * kMs,   100 * kMs,
                                   250 * kMs, 500 * kMs, 1000 * kMs, 2500 * kMs, 5000 * kMs};
constexpr const char* kRttLe[] = {"0.0001", "0.00025", "0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025",
                                  "0.05",   "0.1",     "0.25",   "0.5",   "1",      "2.5",   "5"};

static_assert(std::size(kWaitNs) == std::size(kWaitLe));
static_assert(std::size(kHoldNs) == std::size(kHoldLe));
static_assert(std::size(kRttNs) == std::size(kRttLe));

constexpr const char* kAcquireResults[] = {"ok", "busy", "timeout", "error"};
constexpr const char* kRenewResults[] = {"ok", "not_owner", "failed"};  // RenewStatus order
constexpr const char* kLossReasons[] = {"local_deadline", "renewal_late", "renewal_refused",
                                        "session_lost",   "lease_ended",  "gone_at_release",
                                        "max_hold",       "revoked"};
constexpr const char* kReleaseResults[] = {"ok", "lost", "error"};
constexpr const char* kRevokeResults[] = {"revoked", "nothing_held", "error"};
static_assert(std::size(kRevokeResults) == static_cast<std::size_t>(RevokeOutcome::count_));
static_assert(std::size(kAcquireResults) == static_cast<std::size_t>(AcquireOutcome::count_));
static_assert(std::size(kLossReasons) == static_cast<std::size_t>(LossReason::count_));
static_assert(std::size(kReleaseResults) == static_cast<std::size_t>(ReleaseOutcome::count_));
static_assert(static_cast<int>(RenewStatus::renewed) == 0 && static_cast<int>(RenewStatus::not_owner) == 1 &&
              static_cast<int>(RenewStatus::failed) == 2);

constexpr auto relaxed = std::memory_order_relaxed;

bool prefix_byte_ok(char c) noexcept {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
         c == '-';
}

// Nanoseconds as decimal seconds, exactly ("0.3", "12", "0.000001").
void append_seconds(std::string& out, std::uint64_t ns) {
  out += std::to_string(ns / 1'000'000'000);
  std::uint64_t frac = ns % 1'000'000'000;
  if (frac == 0) return;
  std::string digits = std::to_string(frac);
  digits.insert(0, 9 - digits.size(), '0');
  while (digits.back() == '0') digits.pop_back();
  out += '.';
  out += digits;
}

void header(std::string& out, std::string_view name, std::string_view type, std::string_view help) {
  out += "# HELP ";
  out += name;
  out += ' ';
  out += help;
  out += "\n# TYPE ";
  out += name;
  out += ' ';
  out += type;
  out += '\n';
}

void sample(std::string& out, std::string_view name, std::string_view labels, std::uint64_t value) {
  out += name;
  out += '{';
  out += labels;
  out += "} ";
  out += std::to_string(value);
  out += '\n';
}

}  // namespace

DurationHistogram::DurationHistogram(const std::int64_t* bounds_ns, const char* const* labels,
                                     std::size_t n) noexcept
    : bounds_ns_(bounds_ns), labels_(labels), n_(std::min(n, kMaxBuckets)) {}

void DurationHistogram::observe(Clock::duration d) noexcept {
  const std::int64_t ns =
      std::max<std::int64_t>(0, std::chrono::duration_cast<std::chrono::nanoseconds>(d).count());
  // `le` is inclusive: the first bucket whose bound is >= the value.
  const std::size_t i =
      static_cast<std::size_t>(std::lower_bound(bounds_ns_, bounds_ns_ + n_, ns) - bounds_ns_);
  counts_[i].fetch_add(1, relaxed);
  sum_ns_.fetch_add(static_cast<std::uint64_t>(ns), relaxed);
}

void DurationHistogram::render(std::string& out, std::string_view name, std::string_view labels) const {
  std::uint64_t cumulative = 0;
  const std::string bucket = std::string(name) + "_bucket";
  for (std::size_t i = 0; i <= n_; ++i) {
    cumulative += counts_[i].load(relaxed);
    std::string l(labels);
    l += ",le=\"";
    l += i < n_ ? labels_[i] : "+Inf";
    l += '"';
    sample(out, bucket, l, cumulative);
  }
  out += name;
  out += "_sum{";
  out += labels;
  out += "} ";
  append_seconds(out, sum_ns_.load(relaxed));
  out += '\n';
  sample(out, std::string(name) + "_count", labels, cumulative);
}

MetricsSeries::MetricsSeries(std::string prefix_label)
    : prefix(std::move(prefix_label)),
      wait(kWaitNs, kWaitLe, std::size(kWaitNs)),
      hold(kHoldNs, kHoldLe, std::size(kHoldNs)) {}

Metrics::Metrics(std::string backend)
    : backend_(std::move(backend)),
      other_(std::make_unique<MetricsSeries>(std::string(kOther))),
      renew_rtt_(kRttNs, kRttLe, std::size(kRttNs)) {}

Metrics::~Metrics() {
  for (auto& slot : slots_) delete slot.load(relaxed);
}

std::string_view Metrics::prefix_label(std::string_view name) noexcept {
  const auto begin = name.find_first_not_of("/:");
  if (begin == std::string_view::npos) return kOther;
  name.remove_prefix(begin);
  // A derived name's separator ends it too: the locks of a semaphore or read-write lock
  // ("<name>\x1fsem\x1f<i>", engine/names.hpp) count under the primitive's name.
  const std::string_view p = names::primitive_of(name.substr(0, name.find_first_of("/:")));
  if (p.size() > kMaxPrefixBytes || p == kOther) return kOther;
  if (!std::all_of(p.begin(), p.end(), prefix_byte_ok)) return kOther;
  return p;
}

MetricsSeries* Metrics::series_for(std::string_view name) noexcept {
  const std::string_view p = prefix_label(name);
  if (p == kOther) return other_.get();
  std::size_t used = used_.load(std::memory_order_acquire);
  for (std::size_t i = 0; i < used; ++i) {
    MetricsSeries* s = slots_[i].load(std::memory_order_acquire);
    if (s->prefix == p) return s;
  }
  try {
    std::lock_guard lk(add_mu_);
    used = used_.load(std::memory_order_acquire);
    for (std::size_t i = 0; i < used; ++i) {
      MetricsSeries* s = slots_[i].load(std::memory_order_acquire);
      if (s->prefix == p) return s;
    }
    if (used == kMaxPrefixes) return other_.get();
    auto* s = new MetricsSeries(std::string(p));
    slots_[used].store(s, std::memory_order_release);
    used_.store(used + 1, std::memory_order_release);
    return s;
  } catch (...) {
    return other_.get();  // out of memory: counted, under "other"
  }
}

void Metrics::acquired(MetricsSeries* s, Clock::duration waited) noexcept {
  s->acquisitions[static_cast<std::size_t>(AcquireOutcome::ok)].fetch_add(1, relaxed);
  s->wait.observe(waited);
}

void Metrics::acquire_failed(MetricsSeries* s, AcquireOutcome outcome) noexcept {
  s->acquisitions[static_cast<std::size_t>(outcome)].fetch_add(1, relaxed);
}

void Metrics::hold_ended(MetricsSeries* s, Clock::duration held) noexcept {
  s->hold.observe(held);
}

void Metrics::renewal(MetricsSeries* s, RenewStatus status) noexcept {
  s->renewals[static_cast<std::size_t>(status)].fetch_add(1, relaxed);
}

void Metrics::renewal_round_trip(Clock::duration d) noexcept {
  renew_rtt_.observe(d);
}

void Metrics::loss(MetricsSeries* s, LossReason reason) noexcept {
  s->losses[static_cast<std::size_t>(reason)].fetch_add(1, relaxed);
}

void Metrics::release(MetricsSeries* s, ReleaseOutcome outcome) noexcept {
  s->releases[static_cast<std::size_t>(outcome)].fetch_add(1, relaxed);
}

void Metrics::revoke(MetricsSeries* s, RevokeOutcome outcome) noexcept {
  s->revokes[static_cast<std::size_t>(outcome)].fetch_add(1, relaxed);
}

std::string Metrics::text(std::size_t held, std::uint64_t notification_channel_drops) const {
  std::vector<const MetricsSeries*> series;
  const std::size_t used = used_.load(std::memory_order_acquire);
  for (std::size_t i = 0; i < used; ++i) series.push_back(slots_[i].load(std::memory_order_acquire));
  series.push_back(other_.get());
  std::sort(series.begin(), series.end(),
            [](const MetricsSeries* a, const MetricsSeries* b) { return a->prefix < b->prefix; });
  const std::string backend = "backend=\"" + backend_ + "\"";
  auto labels = [&](const MetricsSeries* s) { return backend + ",prefix=\"" + s->prefix + "\""; };

  std::string out;
  out.reserve(4096 + series.size() * 6144);
  auto counter_family = [&](std::string_view name, std::string_view help, std::string_view label,
                            const auto& names, auto member) {
    header(out, name, "counter", help);
    for (const MetricsSeries* s : series) {
      const auto& values = s->*member;
      for (std::size_t i = 0; i < values.size(); ++i) {
        sample(out, name, labels(s) + "," + std::string(label) + "=\"" + names[i] + "\"",
               values[i].load(relaxed));
      }
    }
  };
  counter_family("distlock_acquisitions_total",
                 "Acquisitions that went to the lock service, by result (a thread re-entering its Mutex is "
                 "not one).",
                 "result", kAcquireResults, &MetricsSeries::acquisitions);
  header(out, "distlock_acquire_wait_seconds", "histogram",
         "Time from the acquire call to the grant, for successful acquisitions.");
  for (const MetricsSeries* s : series) s->wait.render(out, "distlock_acquire_wait_seconds", labels(s));
  header(out, "distlock_hold_seconds", "histogram",
         "Time from the grant to the release or to the loss, once per lease.");
  for (const MetricsSeries* s : series) s->hold.render(out, "distlock_hold_seconds", labels(s));
  counter_family("distlock_renewals_total",
                 "Lease renewals, one per lease per renewal request, by the answer.", "result", kRenewResults,
                 &MetricsSeries::renewals);
  header(out, "distlock_renewal_round_trip_seconds", "histogram",
         "Duration of one batched renewal request to the lock service (failed ones included).");
  renew_rtt_.render(out, "distlock_renewal_round_trip_seconds", backend);
  counter_family("distlock_losses_total", "Leases lost (stop token fired), each counted once, by reason.",
                 "reason", kLossReasons, &MetricsSeries::losses);
  counter_family("distlock_releases_total",
                 "Releases (a lease's last unlock), by result: ok, lost (it had been lost), error (the lock "
                 "service could not be reached; the lease expires by its TTL).",
                 "result", kReleaseResults, &MetricsSeries::releases);
  counter_family("distlock_revokes_total",
                 "Client::revoke calls made by this client, by result: revoked (a holder's lease was ended), "
                 "nothing_held (the lock was free), error. The holder counts its loss under "
                 "distlock_losses_total{reason=\"revoked\"}.",
                 "result", kRevokeResults, &MetricsSeries::revokes);
  header(out, "distlock_leases_held", "gauge",
         "Leases this client holds now (lost ones not yet released included).");
  sample(out, "distlock_leases_held", backend, held);
  header(out, "distlock_notification_channel_drops_total", "counter",
         "Notification channels (Redis pub/sub) found dead by a PING without an answer and connected "
         "anew; waiters re-checked with the lock service meanwhile.");
  sample(out, "distlock_notification_channel_drops_total", backend, notification_channel_drops);
  return out;
}

}  // namespace distlock::detail
