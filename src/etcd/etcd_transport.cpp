#include "etcd/etcd_transport.hpp"

namespace distlock::detail::etcd {

namespace {

std::shared_ptr<grpc::ChannelCredentials> make_credentials(const TransportConfig& c) {
  if (!c.tls) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = c.ca_pem;
  ssl.pem_private_key = c.key_pem;
  ssl.pem_cert_chain = c.cert_pem;
  return grpc::SslCredentials(ssl);
}

// HTTP/2 keepalive of every channel (Transport::Transport).
constexpr Millis kKeepaliveTime{10000};
constexpr Millis kKeepaliveTimeout{5000};

bool contains(const grpc::Status& st, const char* text) {
  return st.error_message().find(text) != std::string::npos;
}

}  // namespace

Transport::Transport(TransportConfig config) : config_(std::move(config)) {
  const auto creds = make_credentials(config_);
  for (const auto& target : config_.targets) {
    grpc::ChannelArguments args;
    // A member that comes back (restart, partition healed) is reconnected to
    // quickly; the defaults back off for up to two minutes.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    // gRPC uses this one as the connect timeout (default 20 s): a member that
    // accepts TCP while still starting up must not stall us that long.
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS,
                static_cast<int>(std::max<Millis>(config_.connect_timeout, Millis(500)).count()));
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    // Each endpoint is its own channel so fail-over is ours to order.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    // A connection that goes silent without a reset (a frozen member, a dropped route) is
    // found by an HTTP/2 ping: sent after kKeepaliveTime without data while a call is open,
    // the connection is closed when no answer comes within kKeepaliveTimeout. Streams have
    // no deadline (a prefix watch, a waiter's predecessor watch): without it they would
    // wait for TCP to give up (minutes). kKeepaliveTime stays above etcd's default
    // --grpc-keepalive-min-time (5 s), below which etcd ends the connection itself.
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, static_cast<int>(kKeepaliveTime.count()));
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, static_cast<int>(kKeepaliveTimeout.count()));
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
    args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);  // a stream may be idle for hours
    auto s = std::make_unique<Stubs>();
    s->target = target;
    s->channel = grpc::CreateCustomChannel(target, creds, args);
    s->kv = etcdserverpb::KV::NewStub(s->channel);
    s->lease = etcdserverpb::Lease::NewStub(s->channel);
    s->watch = etcdserverpb::Watch::NewStub(s->channel);
    s->auth = etcdserverpb::Auth::NewStub(s->channel);
    stubs_.push_back(std::move(s));
  }
}

void Transport::prepare(grpc::ClientContext& ctx, Millis timeout) const {
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  LockGuard lk(token_mu_);
  if (!token_.empty()) ctx.AddMetadata("token", token_);
}

void Transport::advance(std::size_t failed) noexcept {
  std::size_t expected = failed;
  current_.compare_exchange_strong(expected, (failed + 1) % stubs_.size(), std::memory_order_acq_rel);
}

void Transport::ensure_connected(std::size_t index, Millis left) {
  auto& channel = *stubs(index).channel;
  if (channel.GetState(true) == GRPC_CHANNEL_READY) return;
  const Millis wait =
      stubs_.size() > 1 ? std::min(left, Millis(300)) : std::min(left, config_.connect_timeout);
  channel.WaitForConnected(std::chrono::system_clock::now() + std::max(wait, Millis(1)));
}

bool Transport::retryable(const grpc::Status& st) noexcept {
  switch (st.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:         // member down, no leader, leader changed
    case grpc::StatusCode::DEADLINE_EXCEEDED:   // member hung or partitioned
    case grpc::StatusCode::RESOURCE_EXHAUSTED:  // "too many requests"
      return true;
    default: return false;
  }
}

bool Transport::invalid_token(const grpc::Status& st) noexcept {
  return st.error_code() == grpc::StatusCode::UNAUTHENTICATED || contains(st, "invalid auth token");
}

bool Transport::lease_not_found(const grpc::Status& st) noexcept {
  return st.error_code() == grpc::StatusCode::NOT_FOUND && contains(st, "lease not found");
}

Error Transport::authenticate() {
  if (!has_auth()) return {};
  etcdserverpb::AuthenticateRequest req;
  req.set_name(config_.user);
  req.set_password(config_.password);
  etcdserverpb::AuthenticateResponse resp;
  grpc::Status st;
  // Not through call(): it would add the stale token and re-authenticate recursively.
  const auto give_up = std::chrono::steady_clock::now() + 2 * config_.command_timeout;
  for (;;) {
    const std::size_t index = current();
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + config_.command_timeout);
    round_trips_.add();
    st = stubs(index).auth->Authenticate(&ctx, req, &resp);
    if (st.ok() || !retryable(st) || std::chrono::steady_clock::now() >= give_up) break;
    advance(index);
    std::this_thread::sleep_for(Millis(20));
  }
  if (st.ok()) {
    LockGuard lk(token_mu_);
    token_ = resp.token();
    return {};
  }
  if (contains(st, "authentication is not enabled")) {
    // Credentials given to a cluster without auth: calls work without a token.
    LockGuard lk(token_mu_);
    token_.clear();
    return {};
  }
  return to_error(st);
}

Error Transport::to_error(const grpc::Status& st) const {
  const std::string where = stubs_[current() % stubs_.size()]->target;
  std::string why = "etcd at " + where + ": " + st.error_message() + " (gRPC code " +
                    std::to_string(static_cast<int>(st.error_code())) + ")";
  switch (st.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::CANCELLED:
      return {make_error_code(errc::backend_unavailable),
              "no etcd endpoint of " + std::to_string(stubs_.size()) + " answered; last: " + why};
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED: return {make_error_code(errc::auth_failed), std::move(why)};
    case grpc::StatusCode::INVALID_ARGUMENT:
      if (contains(st, "authentication failed") || contains(st, "user name is empty") ||
          contains(st, "invalid user") || contains(st, "password")) {
        return {make_error_code(errc::auth_failed), std::move(why)};
      }
      return {make_error_code(errc::invalid_argument), std::move(why)};
    default: return {make_error_code(errc::protocol_error), std::move(why)};
  }
}

}  // namespace distlock::detail::etcd
