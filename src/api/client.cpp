#include "distlock/client.hpp"

#include <unistd.h>

#include <cstdlib>
#include <map>

#include "api/client_access.hpp"
#include "connect/registry.hpp"
#include "engine/backend.hpp"
#include "engine/engine.hpp"
#include "engine/names.hpp"
#include "engine/url.hpp"

namespace distlock {

using detail::Engine;
using detail::HeldLock;

// ---- LockOptions -----------------------------------------------------------

// The rules live here once: validate_and_fill() and every message about a bad
// option come from this function.
std::error_code LockOptions::validate_and_fill(std::string& message) {
  auto bad = [&](std::string msg) {
    message = std::move(msg);
    return make_error_code(errc::invalid_argument);
  };
  const auto ms = [](Millis d) { return std::to_string(d.count()) + "ms"; };
  if (ttl < min_ttl) return bad("lock ttl " + ms(ttl) + " is below the minimum of " + ms(min_ttl));
  if (ttl > max_ttl)
    return bad("lock ttl " + ms(ttl) + " is above the maximum of " + ms(max_ttl) + " (366 days)");
  if (safety_margin.count() < 0) return bad("safety_margin " + ms(safety_margin) + " is negative");
  if (renew_interval.count() < 0) return bad("renew_interval " + ms(renew_interval) + " is negative");
  if (safety_margin.count() == 0) safety_margin = std::min<Millis>(ttl / 10, std::chrono::seconds(2));
  if (renew_interval.count() == 0) renew_interval = ttl / 3;
  if (safety_margin >= ttl / 3) {
    return bad("safety_margin " + ms(safety_margin) + " must be below ttl/3 (" + ms(ttl / 3) + ")");
  }
  if (renew_interval > ttl / 2) {
    return bad("renew_interval " + ms(renew_interval) + " must be at most ttl/2 (" + ms(ttl / 2) + ")");
  }
  if (max_hold && max_hold->count() <= 0) return bad("max_hold " + ms(*max_hold) + " must be above zero");
  if (max_hold && *max_hold > max_wait) {
    return bad("max_hold " + ms(*max_hold) + " is above the maximum of 100 years");
  }
  if (lock_delay.count() < 0) return bad("lock_delay " + ms(lock_delay) + " is negative");
  if (lock_delay > max_lock_delay) {
    return bad("lock_delay " + ms(lock_delay) + " is above the maximum of " + ms(max_lock_delay) + " (60 s)");
  }
  if (holder_info.size() > max_holder_info) holder_info.resize(max_holder_info);
  for (std::size_t i = 0; i < holder_info.size(); ++i) {
    const char c = holder_info[i];
    if (c == '|') return bad("holder_info must not contain '|' (byte " + std::to_string(i) + ")");
    if (c < 0x20 || c > 0x7e) {
      return bad("holder_info must be printable ASCII: byte " + std::to_string(i) + " is " +
                 std::to_string(static_cast<unsigned char>(c)));
    }
  }
  return {};
}

std::error_code LockOptions::validate_and_fill() noexcept {
  try {
    std::string why;
    return validate_and_fill(why);
  } catch (...) {  // std::bad_alloc building a message: the options are not known to be good
    return make_error_code(errc::invalid_argument);
  }
}

std::error_code ClientOptions::validate(std::string& message) const {
  for (auto [field, value] :
       {std::pair{"connect_timeout", connect_timeout}, std::pair{"command_timeout", command_timeout}}) {
    if (value.count() <= 0 || value > std::chrono::hours(1)) {
      message = std::string(field) + " " + std::to_string(value.count()) + "ms is out of range (0, 1 h]";
      return make_error_code(errc::invalid_argument);
    }
  }
  LockOptions defaults = lock_defaults;
  if (auto ec = defaults.validate_and_fill(message)) {
    message = "lock_defaults: " + message;
    return ec;
  }
  return {};
}

Hold::~Hold() = default;

const char* to_string(LossReason reason) noexcept {
  switch (reason) {
    case LossReason::none: return "none";
    case LossReason::local_deadline: return "local_deadline";
    case LossReason::renewal_late: return "renewal_late";
    case LossReason::renewal_refused: return "renewal_refused";
    case LossReason::session_lost: return "session_lost";
    case LossReason::lease_ended: return "lease_ended";
    case LossReason::gone_at_release: return "gone_at_release";
    case LossReason::max_hold: return "max_hold";
    case LossReason::forked: return "forked";
    case LossReason::revoked: return "revoked";
  }
  return "unknown";
}

namespace {

/// `what`, and the backend's sentence for the failed call (which server, what went
/// wrong) when it left one.
std::string with_detail(std::string what, const detail::Error& err) {
  return what + err.suffix();
}

std::string describe_options_error(const LockOptions& o) {
  LockOptions copy = o;
  std::string why;
  if (copy.validate_and_fill(why)) return why;
  return "invalid lock options";
}

[[noreturn]] void throw_acquire_error(const detail::Error& ec, std::string_view name, const LockOptions& o) {
  std::string what = "lock \"" + std::string(name.substr(0, 200)) + "\"";
  const std::string& detail = ec.detail();
  if (ec == errc::invalid_argument) {
    if (const auto bad = Engine::check_name(name)) throw_error(ec, bad.detail());
    // A limit of the backend (etcd's largest lease TTL, a zk:// ttl above what its
    // session allows) explains itself.
    if (!detail.empty()) throw_error(ec, what + ": " + detail);
    throw_error(ec, describe_options_error(o));
  }
  throw_error(ec, what + ec.suffix());
}

/// Gives the lease's hold back to its engine (the server release when it was the last).
void release_hold(std::shared_ptr<Engine>& engine, std::shared_ptr<HeldLock>& held,
                  detail::Error& ec) noexcept {
  ec.clear();
  if (!held) return;
  auto h = std::move(held);
  auto e = std::move(engine);
  e->release(h, ec);
}

}  // namespace

// ---- Lease -----------------------------------------------------------------

Lease::Lease(std::shared_ptr<Engine> engine, std::shared_ptr<HeldLock> held) noexcept
    : engine_(std::move(engine)), held_(std::move(held)) {}

Lease::Lease(Lease&& o) noexcept : engine_(std::move(o.engine_)), held_(std::move(o.held_)) {}

Lease& Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    std::error_code ec;
    release(ec);
    engine_ = std::move(o.engine_);
    held_ = std::move(o.held_);
  }
  return *this;
}

Lease::~Lease() {
  std::error_code ec;
  release(ec);
}

bool Lease::owns() const noexcept {
  return held_ && !held_->released && held_->owns();
}

const std::string& Lease::name() const noexcept {
  static const std::string empty;
  return held_ ? held_->name : empty;
}

std::uint64_t Lease::token() const {
  if (!held_) throw_error(make_error_code(errc::not_owner), "empty lease has no token");
  if (!held_->has_token) {
    throw_error(make_error_code(errc::not_supported),
                "backend " + engine_->backend().url() + " issues no fencing tokens");
  }
  return held_->token;
}

bool Lease::has_token() const noexcept {
  return held_ && held_->has_token;
}

std::stop_token Lease::stop_token() const noexcept {
  return held_ ? held_->stop.get_token() : std::stop_token{};
}

void Lease::on_lost(std::function<void()> fn) {
  if (!held_) throw_error(make_error_code(errc::not_owner), "empty lease");
  engine_->add_loss_callback(held_, std::move(fn));
}

Millis Lease::remaining() const noexcept {
  if (!owns()) return Millis(0);
  const auto d = held_->deadline();
  if (d == Clock::time_point::max()) return Millis::max();
  return std::chrono::duration_cast<Millis>(d - held_->clock->now());
}

std::optional<Millis> Lease::max_hold_remaining() const noexcept {
  const Clock::time_point limit = held_->hold_limit();
  if (!owns() || limit == Clock::time_point::max()) return std::nullopt;
  const auto left = limit - held_->clock->now();
  return std::max(Millis(0), std::chrono::duration_cast<Millis>(left));
}

LossReason Lease::loss_reason() const noexcept {
  return held_ ? held_->public_reason() : LossReason::none;
}

std::string Lease::loss_detail() const {
  return held_ ? held_->public_detail() : std::string();
}

std::optional<std::string> Lease::revoke_reason() const {
  if (!held_) return std::nullopt;
  detail::LockGuard lk(held_->callbacks_mu);
  return held_->revoke_reason;
}

std::optional<TraceContext> Lease::trace_context() const {
  if (!held_ || !held_->trace) return std::nullopt;
  return held_->trace->hold;
}

void Lease::release() {
  detail::Error ec;
  // The lease's name for the error (a reference, not a copy of the name per call).
  const std::shared_ptr<detail::HeldLock> held = held_;
  release_hold(engine_, held_, ec);
  if (ec) throw_error(ec, with_detail("release of lock \"" + (held ? held->name : std::string()) + "\"", ec));
}

void Lease::release(std::error_code& ec) noexcept {
  detail::Error err;
  release_hold(engine_, held_, err);
  ec = err;
}

// ---- Client ----------------------------------------------------------------

Lease Client::acquire(std::string_view name, const LockOptions& opts) {
  detail::Error ec;
  auto held = engine_->acquire(name, opts, opts.wait, ec);
  if (ec) throw_acquire_error(ec, name, opts);
  return Lease(engine_, std::move(held));
}

Lease Client::acquire(std::string_view name) {
  return acquire(name, engine_->options().lock_defaults);
}

Lease Client::acquire(std::string_view name, const LockOptions& opts, std::error_code& ec) noexcept {
  try {
    detail::Error err;
    auto held = engine_->acquire(name, opts, opts.wait, err);
    ec = err;
    if (ec) return {};
    return Lease(engine_, std::move(held));
  } catch (const std::system_error& e) {
    ec = e.code();
  } catch (...) {
    ec = make_error_code(errc::protocol_error);
  }
  return {};
}

std::optional<Lease> Client::try_acquire(std::string_view name, const LockOptions& opts) {
  detail::Error ec;
  auto held = engine_->acquire(name, opts, Millis(0), ec);
  if (ec == errc::busy) return std::nullopt;
  if (ec) throw_acquire_error(ec, name, opts);
  return Lease(engine_, std::move(held));
}

std::optional<Lease> Client::try_acquire(std::string_view name) {
  return try_acquire(name, engine_->options().lock_defaults);
}

Mutex Client::mutex(std::string_view name, const LockOptions& opts) {
  return Mutex(*this, std::string(name), opts);
}
Mutex Client::mutex(std::string_view name) {
  return mutex(name, engine_->options().lock_defaults);
}

namespace {
/// Engine::status with any exception turned into its code (protocol_error if it has none).
LockInfo status_into(Engine& engine, std::string_view name, detail::Error& ec) noexcept {
  try {
    return engine.status(name, ec);
  } catch (const std::system_error& e) {
    ec = e.code();
  } catch (...) {
    ec = make_error_code(errc::protocol_error);
  }
  return {};
}
}  // namespace

LockInfo Client::status(std::string_view name) {
  detail::Error ec;
  LockInfo info = status_into(*engine_, name, ec);
  if (ec) {
    if (const detail::Error bad = Engine::check_name(name)) throw_error(ec, bad.detail());
    throw_error(ec, with_detail("status of lock \"" + std::string(name.substr(0, 200)) + "\"", ec));
  }
  return info;
}

LockInfo Client::status(std::string_view name, std::error_code& ec) noexcept {
  detail::Error err;
  LockInfo info = status_into(*engine_, name, err);
  ec = err;
  return info;
}

RevokeResult Client::revoke(std::string_view name, std::string_view reason) {
  detail::Error ec;
  RevokeResult r = engine_->revoke(name, reason, ec);
  if (ec) throw_error(ec, with_detail("revoke of lock \"" + std::string(name.substr(0, 200)) + "\"", ec));
  return r;
}

RevokeResult Client::revoke(std::string_view name, std::string_view reason, std::error_code& ec) noexcept {
  try {
    detail::Error err;
    RevokeResult r = engine_->revoke(name, reason, err);
    ec = err;
    return r;
  } catch (...) {
    ec = make_error_code(errc::exhausted);
    return {};
  }
}

std::optional<RevokeRecord> Client::last_revoke(std::string_view name) {
  detail::Error ec;
  std::optional<RevokeRecord> r = engine_->last_revoke(name, ec);
  if (ec) {
    throw_error(ec, with_detail("last revoke of lock \"" + std::string(name.substr(0, 200)) + "\"", ec));
  }
  return r;
}

namespace {

std::optional<std::uint32_t> parse_u32(std::string_view s) {
  if (s.empty() || s.size() > 9) return std::nullopt;
  std::uint32_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<std::uint32_t>(c - '0');
  }
  return v;
}

}  // namespace

std::vector<ListedLock> Client::list(std::string_view prefix, std::size_t limit) {
  bool truncated = false;
  return list(prefix, limit, truncated);
}

std::vector<ListedLock> Client::list(std::string_view prefix, std::size_t limit, bool& truncated) {
  detail::Error ec;
  if (!prefix.empty()) {
    if (const detail::Error bad = Engine::check_name(prefix))
      throw_error(make_error_code(errc::invalid_argument), "prefix: " + bad.detail());
  }
  std::vector<detail::ListedLock> raw = engine_->list_held(prefix, limit, truncated, ec);
  if (ec) {
    std::string what = "list of locks";
    if (!prefix.empty()) what += " with prefix \"" + std::string(prefix.substr(0, 200)) + "\"";
    if (ec == errc::not_supported)
      what += " (backend " + engine_->backend().url() + " cannot list its locks)";
    throw_error(ec, with_detail(std::move(what), ec));
  }
  std::vector<ListedLock> out;
  out.reserve(raw.size());
  std::map<std::string, std::optional<std::uint32_t>> definitions;  // record key -> N or R
  for (auto& r : raw) {
    ListedLock l;
    l.name = std::move(r.name);
    l.info = std::move(r.info);
    const detail::names::Decoded decoded = detail::names::decode(l.name);
    l.kind = decoded.kind;
    l.base = std::string(decoded.base);
    l.index = decoded.index;
    if (const std::string key = detail::names::definition_of(decoded); !key.empty()) {
      auto it = definitions.find(key);
      if (it == definitions.end()) {
        std::optional<std::uint32_t> n;
        detail::Error rec_ec;
        try {
          if (auto v = engine_->backend().get_record(key, rec_ec); v && !rec_ec) n = parse_u32(*v);
        } catch (...) {
        }
        it = definitions.emplace(key, n).first;
      }
      l.of = it->second;
    }
    l.display = detail::names::display(decoded, l.of);
    out.push_back(std::move(l));
  }
  return out;
}

bool Client::has_fencing() const noexcept {
  return engine_->capabilities().fencing;
}
std::string Client::url() const {
  return engine_->backend().url();
}
std::string Client::scheme() const {
  const std::string u = url();
  return u.substr(0, u.find("://"));
}
std::string Client::id() const {
  return engine_->client_id();
}
ClientStats Client::stats() const noexcept {
  return engine_->stats();
}
std::string Client::metrics() const {
  return engine_->metrics_text();
}
std::size_t Client::renew_now() {
  return engine_->renew_all();
}

std::string default_url() {
  if (const char* env = std::getenv("DISTLOCK_URL"); env && *env) return env;
  if (const char* xdg = std::getenv("XDG_RUNTIME_DIR"); xdg && *xdg == '/') {
    return std::string("file://") + xdg + "/distlock";
  }
  return "file:///tmp/distlock-" + std::to_string(::getuid());
}

std::string describe_url_schemes(bool with_keys) {
  return detail::describe_schemes(with_keys);
}

Client connect(std::string_view url_text, const ClientOptions& in_opts, std::error_code& ec) noexcept {
  try {
    return connect(url_text, in_opts);
  } catch (const std::system_error& e) {
    ec = e.code();
  } catch (...) {
    ec = make_error_code(errc::protocol_error);
  }
  return Client(nullptr);
}

Client connect(std::string_view url_text, const ClientOptions& in_opts) {
  const std::string text = url_text.empty() ? default_url() : std::string(url_text);
  detail::Url url;
  if (const detail::Error err = detail::parse_url(text, url)) throw_error(err, err.detail());
  const detail::BackendFactory factory = detail::find_backend(url.scheme);
  if (!factory) {
    throw_error(make_error_code(errc::invalid_url), "unknown scheme \"" + url.scheme + "\" in URL \"" +
                                                        url.redacted() +
                                                        "\" (known: " + detail::known_schemes() + ")");
  }
  // Past the parser, messages may quote a part of the URL (a path, a query key) or
  // a server's words about it (a role, a database): none may show the authority's
  // secret, however the URL was written.
  auto fail = [&](std::error_code e, const std::string& msg) {
    throw_error(e, detail::scrub_secrets(msg, url));
  };
  if (const detail::Error err = detail::check_url_query(url)) fail(err, err.detail());
  ClientOptions opts = in_opts;
  if (const detail::Error err = detail::apply_common_query(url, opts)) fail(err, err.detail());
  std::string why;  // ClientOptions::validate is public: its sentence comes back as a string
  if (auto ec = opts.validate(why)) fail(ec, why);
  opts.lock_defaults.validate_and_fill();
  detail::Error err;
  std::unique_ptr<detail::Backend> backend = factory(url, opts, err);
  if (err || !backend) {
    if (!err) err = make_error_code(errc::protocol_error);
    fail(err, err.detail().empty() ? url.redacted() : err.detail());
  }
  auto engine = Engine::create(std::move(backend), std::move(opts));
  engine->set_source_url(text);
  return Client(std::move(engine));
}

// ---- Mutex -----------------------------------------------------------------

Mutex::Mutex(Client client, std::string name, LockOptions opts)
    : client_(std::move(client)), name_(std::move(name)), opts_(opts) {}

void Mutex::lock() {
  detail::Error ec;
  auto held = detail::engine_of(client_)->acquire(name_, opts_, std::nullopt, ec, Engine::Reentry::by_thread);
  if (ec) throw_acquire_error(ec, name_, opts_);
}

bool Mutex::try_lock() {
  detail::Error ec;
  auto held = detail::engine_of(client_)->acquire(name_, opts_, Millis(0), ec, Engine::Reentry::by_thread);
  if (ec == errc::busy) return false;
  if (ec) throw_acquire_error(ec, name_, opts_);
  return true;
}

bool Mutex::try_lock_for_ms(std::optional<Millis> d) {
  detail::Error ec;
  if (d) d = std::max(*d, Millis(0));
  auto held = detail::engine_of(client_)->acquire(name_, opts_, d, ec, Engine::Reentry::by_thread);
  if (ec == errc::busy || ec == errc::timeout) return false;
  if (ec) throw_acquire_error(ec, name_, opts_);
  return true;
}

void Mutex::unlock(std::error_code& ec) noexcept {
  ec.clear();
  std::shared_ptr<HeldLock> held;
  try {
    held = detail::engine_of(client_)->mutex_hold_of_this_thread(name_);
  } catch (...) {
    ec = make_error_code(errc::protocol_error);
    return;
  }
  if (!held) {
    ec = make_error_code(errc::not_owner);
    return;
  }
  detail::Error err;
  detail::engine_of(client_)->release(held, err);
  ec = err;
}

void Mutex::unlock() {
  std::error_code ec;
  unlock(ec);
  // Lockable::unlock must not throw for conditions the caller cannot prevent: a
  // lost lease was already signalled through its stop token and is counted; an
  // unreachable server lets the lease expire by its TTL. Unlocking a mutex this
  // thread does not hold is a programming error and is reported.
  if (ec == errc::not_owner)
    throw_error(ec, "unlock of lock \"" + name_ + "\" by a thread that does not hold it");
}

std::uint64_t Mutex::token() const {
  auto held = detail::engine_of(client_)->mutex_hold_of_this_thread(name_);
  if (!held)
    throw_error(make_error_code(errc::not_owner), "lock \"" + name_ + "\" is not held by this thread");
  if (!held->has_token) throw_error(make_error_code(errc::not_supported), "backend issues no fencing tokens");
  return held->token;
}

std::stop_token Mutex::stop_token() const {
  auto held = detail::engine_of(client_)->mutex_hold_of_this_thread(name_);
  if (!held)
    throw_error(make_error_code(errc::not_owner), "lock \"" + name_ + "\" is not held by this thread");
  return held->stop.get_token();
}

bool Mutex::owns() const noexcept {
  try {
    auto held = detail::engine_of(client_)->mutex_hold_of_this_thread(name_);
    return held && held->owns();
  } catch (...) {
    return false;
  }
}

LossReason Mutex::loss_reason() const noexcept {
  try {
    auto held = detail::engine_of(client_)->mutex_hold_of_this_thread(name_);
    return held ? held->public_reason() : LossReason::none;
  } catch (...) {
    return LossReason::none;
  }
}

std::string Mutex::loss_detail() const {
  auto held = detail::engine_of(client_)->mutex_hold_of_this_thread(name_);
  return held ? held->public_detail() : std::string();
}

int Mutex::hold_count() const noexcept {
  try {
    auto held = detail::engine_of(client_)->mutex_hold_of_this_thread(name_);
    return held ? held->hold_count.load() : 0;
  } catch (...) {
    return 0;
  }
}

}  // namespace distlock
