// gRPC transport to an etcd v3 cluster: one channel per endpoint, fail-over to the
// next endpoint when one is unavailable (member down, no leader, leader changed),
// optional TLS, and user/password authentication whose token rides in the
// "token" metadata of every call (re-authenticating once when the server says the
// token is no longer valid).
//
// Thread-safety: every member may be called from any thread; each call builds its
// own grpc::ClientContext. The stubs are thread-safe gRPC objects.
//
// Example:
//   etcd::Transport t(config);
//   etcdserverpb::RangeResponse resp;
//   grpc::Status st = t.call([&](etcd::Stubs& s, grpc::ClientContext& ctx) {
//     return s.kv->Range(&ctx, req, &resp);
//   });
#pragma once

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "distlock/error.hpp"
#include "distlock/options.hpp"
#include "engine/backend_error.hpp"
#include "engine/round_trips.hpp"
#include "engine/thread_annotations.hpp"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"

namespace distlock::detail::etcd {

struct TransportConfig {
  std::vector<std::string> targets;  ///< "host:port" per member, tried in this order
  std::string user;                  ///< empty: no authentication
  std::string password;
  bool tls = false;
  std::string ca_pem, cert_pem, key_pem;  ///< file contents (empty: system roots / no client cert)
  Millis command_timeout{std::chrono::seconds(2)};
  Millis connect_timeout{std::chrono::seconds(2)};
};

/// The stubs of one endpoint.
struct Stubs {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<etcdserverpb::KV::Stub> kv;
  std::unique_ptr<etcdserverpb::Lease::Stub> lease;
  std::unique_ptr<etcdserverpb::Watch::Stub> watch;
  std::unique_ptr<etcdserverpb::Auth::Stub> auth;
  std::string target;
};

/// What happened during a call beyond its final status.
struct CallInfo {
  int attempts = 0;
  /// An earlier attempt may have reached the server (it timed out or the member went
  /// away mid-call): a non-idempotent request may have been applied already.
  bool maybe_applied = false;
};

class Transport {
 public:
  explicit Transport(TransportConfig config);

  /// Runs `attempt(stubs, ctx)` against the current endpoint; on a retryable status
  /// (unavailable, no leader, leader changed, deadline) moves to the next endpoint
  /// and tries again, with a short backoff once every endpoint failed, for at most
  /// twice the command timeout. An invalid auth token triggers one re-authentication.
  template <class Attempt>
  grpc::Status call(Attempt&& attempt, CallInfo* info = nullptr);

  /// Logs in with the configured user (no-op without one). Errors: auth_failed
  /// (wrong user or password), backend_unavailable, with the detail naming the endpoint.
  Error authenticate();

  /// Maps a failed status to a distlock error whose detail names the endpoint.
  Error to_error(const grpc::Status& st) const;

  /// Sets the deadline and the auth token on a context.
  void prepare(grpc::ClientContext& ctx, Millis timeout) const;

  /// The endpoint currently preferred, and its stubs (for streams).
  std::size_t current() const noexcept { return current_.load(std::memory_order_acquire); }
  Stubs& stubs(std::size_t index) noexcept { return *stubs_[index % stubs_.size()]; }
  std::size_t size() const noexcept { return stubs_.size(); }
  /// Moves away from endpoint `failed` (if it is still the current one).
  void advance(std::size_t failed) noexcept;

  const TransportConfig& config() const noexcept { return config_; }
  bool has_auth() const noexcept { return !config_.user.empty(); }

  /// Lets a channel that is not READY connect for a moment, polling it from this
  /// thread: a failing-fast call alone leaves the connection attempt to gRPC's
  /// backup poller, which looks only every 5 s. Short with several endpoints
  /// (fail over instead), up to `left` with one.
  void ensure_connected(std::size_t index, Millis left);

  /// Request/response exchanges made through this transport (engine/round_trips.hpp): each
  /// attempt of call() and each authentication counts one; a caller that writes a request
  /// on a stream it keeps open (a watch's create or cancel) adds it with count_exchange().
  std::uint64_t round_trips() const noexcept { return round_trips_.count(); }
  void count_exchange() noexcept { round_trips_.add(); }
  static bool retryable(const grpc::Status& st) noexcept;
  static bool invalid_token(const grpc::Status& st) noexcept;
  static bool lease_not_found(const grpc::Status& st) noexcept;

 private:
  TransportConfig config_;
  std::vector<std::unique_ptr<Stubs>> stubs_;
  std::atomic<std::size_t> current_{0};
  RoundTrips round_trips_;
  mutable AnnotatedMutex token_mu_;
  std::string token_ DISTLOCK_GUARDED_BY(token_mu_);
};

template <class Attempt>
grpc::Status Transport::call(Attempt&& attempt, CallInfo* info) {
  using Clock = std::chrono::steady_clock;
  const auto give_up = Clock::now() + 2 * config_.command_timeout;
  Millis backoff{20};
  bool reauthenticated = false;
  int failures = 0;
  for (int n = 1;; ++n) {
    const std::size_t index = current();
    const auto left = std::chrono::duration_cast<Millis>(give_up - Clock::now());
    ensure_connected(index, left);
    grpc::ClientContext ctx;
    prepare(ctx, std::clamp(left, Millis(50), config_.command_timeout));
    round_trips_.add();
    grpc::Status st = attempt(stubs(index), ctx);
    if (info) info->attempts = n;
    if (st.ok()) return st;
    if (invalid_token(st) && has_auth() && !reauthenticated) {
      reauthenticated = true;
      if (!authenticate()) continue;
      return st;
    }
    if (!retryable(st)) return st;
    if (info && st.error_code() != grpc::StatusCode::UNAVAILABLE) info->maybe_applied = true;
    if (info && st.error_message().find("etcdserver:") != std::string::npos) info->maybe_applied = true;
    advance(index);
    if (Clock::now() >= give_up) return st;
    if (++failures % static_cast<int>(stubs_.size()) == 0) {
      std::this_thread::sleep_for(
          std::min(backoff, std::chrono::duration_cast<Millis>(give_up - Clock::now())));
      backoff = std::min(backoff * 2, Millis(400));
    }
  }
}

}  // namespace distlock::detail::etcd
