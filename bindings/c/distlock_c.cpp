// The C API (include/distlock/distlock.h) over the public C++ API: every entry point
// catches every exception and turns it into a status code and an error struct.
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <nlohmann/json.hpp>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "distlock/distlock.h"
#include "distlock/distlock.hpp"

struct distlock_cancel {
  std::stop_source source;
};

struct distlock_client {
  distlock::Client client;
  distlock::LockOptions defaults;
};

namespace {

// Writes to the lease's eventfd on the thread that detects the loss (a std::stop_callback:
// short and non-blocking, as client.hpp asks).
struct NotifyFd {
  int fd;
  void operator()() const noexcept {
    const std::uint64_t one = 1;
    // EFD_NONBLOCK: cannot block; the counter cannot overflow from one write.
    [[maybe_unused]] const ssize_t n = ::write(fd, &one, sizeof one);
  }
};

}  // namespace

struct distlock_lease {
  std::optional<distlock::Lease> lease;        // a lock, a permit or a leadership
  std::optional<distlock::ReadWriteLease> rw;  // a read-write lock hold
  std::string election;                        // the election's name, for a leadership
  int fd = -1;
  std::optional<std::stop_callback<NotifyFd>> notify;

  ~distlock_lease() {
    notify.reset();  // waits for a running callback: the fd must outlive it
    if (fd >= 0) ::close(fd);
  }
  std::stop_token stop_token() const noexcept { return lease ? lease->stop_token() : rw->stop_token(); }
};

struct distlock_multi_lease {
  distlock::MultiLease multi;
  std::vector<std::string> names;  // canonical order, for distlock_multi_lease_name
  int fd = -1;
  std::optional<std::stop_callback<NotifyFd>> notify;

  ~distlock_multi_lease() {
    notify.reset();  // waits for a running callback: the fd must outlive it
    if (fd >= 0) ::close(fd);
  }
};

// What a shard group's on_change shares with the waits of the C API (it may run before the
// group's constructor returns: the first rebalance runs at once on the group's thread).
struct ShardGroupSignal {
  std::mutex mu;
  std::condition_variable cv;
  bool left = false;
  int fd = -1;  // the changed descriptor
  void changed() {
    { std::lock_guard lk(mu); }  // a waiter between its check and its wait sees the notify
    cv.notify_all();
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(fd, &one, sizeof one);
  }
  ~ShardGroupSignal() {
    if (fd >= 0) ::close(fd);
  }
};

struct distlock_shard_group {
  std::shared_ptr<ShardGroupSignal> signal;
  std::optional<distlock::ShardGroup> group;
};

struct distlock_shard_assignment {
  struct Shard {
    distlock::OwnedShard owned;
    // The stop signal's eventfd, made at the first distlock_shard_assignment_shard for this
    // shard (a caller that only reads owns() or the token opens none; an assignment of 256
    // shards opened 256 before). Written once under fd_once, read after it.
    mutable std::once_flag fd_once;
    mutable int fd = -1;
    mutable std::optional<std::stop_callback<NotifyFd>> notify;
    // Opens the descriptor once; fires at once (on this thread) if the shard already stopped.
    void open_stop_fd() const {
      std::call_once(fd_once, [this] {
        const int opened = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (opened < 0) {
          throw std::system_error(errno, std::generic_category(),
                                  "distlock: eventfd for a shard's stop signal");
        }
        fd = opened;
        notify.emplace(owned.stop, NotifyFd{opened});
      });
    }
    ~Shard() {
      notify.reset();  // waits for a running callback: the fd must outlive it
      if (fd >= 0) ::close(fd);
    }
  };
  std::uint64_t version = 0;
  std::size_t members = 0;
  std::vector<std::unique_ptr<Shard>> shards;
};

struct distlock_snowflake {
#if DISTLOCK_HAS_IDS
  std::optional<distlock::ids::SnowflakeGenerator> gen;
#endif
};
struct distlock_redis_daily {
#if DISTLOCK_HAS_IDS
  std::optional<distlock::ids::RedisDailyGenerator> gen;
#endif
};
struct distlock_segment {
#if DISTLOCK_HAS_IDS
  std::optional<distlock::ids::SegmentGenerator> gen;
#endif
};

namespace {

void set_error(distlock_error* err, int code, std::string_view message) noexcept {
  if (err == nullptr) return;
  err->code = code;
  const std::size_t n = std::min(message.size(), sizeof err->message - 1);
  if (n > 0) std::memcpy(err->message, message.data(), n);  // an empty view's data() may be null
  err->message[n] = '\0';
}

int fail(distlock_error* err, int code, std::string_view message) noexcept {
  set_error(err, code, message);
  return code;
}

int invalid(distlock_error* err, std::string_view message) noexcept {
  return fail(err, DISTLOCK_E_INVALID_ARGUMENT, message);
}

// Runs `f`, mapping every exception to a status code; no exception leaves.
template <class F>
int guarded(distlock_error* err, F&& f) noexcept {
  try {
    std::forward<F>(f)();
    set_error(err, DISTLOCK_OK, {});
    return DISTLOCK_OK;
  } catch (const std::system_error& e) {
    const int code = e.code().category() == distlock::category() ? e.code().value() : DISTLOCK_E_INTERNAL;
    return fail(err, code, e.what());
  } catch (const std::bad_alloc&) {
    return fail(err, DISTLOCK_E_NO_MEMORY, "distlock: out of memory");
  } catch (const std::exception& e) {
    return fail(err, DISTLOCK_E_INTERNAL, e.what());
  } catch (...) {
    return fail(err, DISTLOCK_E_INTERNAL, "distlock: an unknown exception");
  }
}

distlock::LockOptions lock_options(const distlock_client* c, const distlock_lock_options* o) {
  distlock::LockOptions opts = c->defaults;
  if (o == nullptr) return opts;
  if (o->ttl_ms != DISTLOCK_DEFAULT) opts.ttl = distlock::Millis(o->ttl_ms);
  if (o->wait_ms == DISTLOCK_WAIT_FOREVER) {
    opts.wait.reset();
  } else if (o->wait_ms != DISTLOCK_DEFAULT) {
    opts.wait = distlock::Millis(o->wait_ms);
  }
  if (o->max_hold_ms != DISTLOCK_DEFAULT) opts.max_hold = distlock::Millis(o->max_hold_ms);
  if (o->holder_info != nullptr) opts.holder_info = o->holder_info;
  if (o->cancel != nullptr) opts.cancel = o->cancel->source.get_token();
  return opts;
}

// The fields of `ext` that lie within its `size` (distlock.h: the struct only grows at its end).
// `queue`: whether its queue-position callback is passed on (single-name acquires only).
// Closes the queue-position callback when the acquire returns: the engine posts each report to
// the event thread, where one may run after the acquire returned; the C caller's user data must
// not be used then. close() waits for a report in progress.
struct QueueGate {
  std::mutex mu;
  bool open = true;
  void close() {
    std::lock_guard lk(mu);
    open = false;
  }
};
struct CloseGate {
  std::shared_ptr<QueueGate> gate;
  ~CloseGate() {
    if (gate) gate->close();
  }
};

std::shared_ptr<QueueGate> apply_ext(distlock::LockOptions& o, const distlock_lock_options_ext* ext,
                                     bool queue) {
  if (ext == nullptr) return nullptr;
  constexpr std::size_t first_version =
      offsetof(distlock_lock_options_ext, traceparent) + sizeof(const char*);
  if (ext->size < first_version) {
    throw std::system_error(make_error_code(distlock::errc::invalid_argument),
                            "distlock: distlock_lock_options_ext.size " + std::to_string(ext->size) +
                                " is below its first version's " + std::to_string(first_version) +
                                " (call distlock_lock_options_ext_init)");
  }
  // Every field up to traceparent is in the first version. A field appended later is read only
  // when `ext->size` reaches past it (offsetof + sizeof), else it keeps its default; a larger size
  // (a newer caller) is fine: the fields this library does not know are not read.
  // Checked by the C++ API (negative, above max_lock_delay: invalid_argument naming lock_delay).
  if (ext->lock_delay_ms != DISTLOCK_DEFAULT) o.lock_delay = distlock::Millis(ext->lock_delay_ms);
  if (ext->traceparent != nullptr && *ext->traceparent != '\0') o.traceparent = ext->traceparent;
  if (!queue || ext->on_queue_position == nullptr) return nullptr;
  auto gate = std::make_shared<QueueGate>();
  o.on_queue_position = [fn = ext->on_queue_position, user = ext->queue_position_user, gate](
                            std::size_t position, const distlock::WaiterInfo& ahead) {
    std::lock_guard lk(gate->mu);  // held during the call: close() waits for it
    if (!gate->open) return;
    distlock_waiter w{};
    w.position = ahead.position;
    w.owner = ahead.owner.c_str();
    w.holder_info = ahead.holder_info ? ahead.holder_info->c_str() : nullptr;
    w.waiting_since_unix_ms =
        ahead.waiting_since
            ? std::chrono::duration_cast<std::chrono::milliseconds>(ahead.waiting_since->time_since_epoch())
                  .count()
            : -1;
    fn(position, &w, user);
  };
  return gate;
}

// Wraps a held lease and arms its loss descriptor.
template <class L>
distlock_lease* wrap(L&& held, std::string election = {}) {
  auto out = std::make_unique<distlock_lease>();
  if constexpr (std::is_same_v<std::decay_t<L>, distlock::Lease>) {
    out->lease.emplace(std::forward<L>(held));
  } else {
    out->rw.emplace(std::forward<L>(held));
  }
  out->election = std::move(election);
  out->fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (out->fd < 0) {
    throw std::system_error(errno, std::generic_category(), "distlock: eventfd for the loss signal");
  }
  // Fires at once (on this thread) if the lease is already lost.
  out->notify.emplace(out->stop_token(), NotifyFd{out->fd});
  return out.release();
}

char* dup_string(const std::string& s) {
  char* p = static_cast<char*>(std::malloc(s.size() + 1));
  if (p == nullptr) throw std::bad_alloc();
  std::memcpy(p, s.c_str(), s.size() + 1);
  return p;
}

static_assert(DISTLOCK_SPAN_WAIT == static_cast<int>(distlock::SpanKind::wait) &&
              DISTLOCK_SPAN_HOLD == static_cast<int>(distlock::SpanKind::hold) &&
              DISTLOCK_SPAN_RENEWAL == static_cast<int>(distlock::SpanKind::renewal) &&
              DISTLOCK_SPAN_LOSS == static_cast<int>(distlock::SpanKind::loss));

// ClientOptions::tracer over a C callback: one distlock_span per span, its strings alive
// for the call only.
class CTracer final : public distlock::Tracer {
 public:
  CTracer(distlock_tracer_fn fn, void* user, void (*release)(void*))
      : fn_(fn), user_(user), release_(release) {}
  CTracer(const CTracer&) = delete;
  CTracer& operator=(const CTracer&) = delete;
  // The last owner is the client's engine, gone after its event thread: no span comes later.
  ~CTracer() override {
    if (release_ != nullptr) release_(user_);
  }
  void on_span(const distlock::Span& s) noexcept override {
    try {
      distlock_span c{};
      c.kind = static_cast<int>(s.kind);
      c.name = s.name.c_str();
      copy_hex(c.trace_id, s.context.trace_id_hex());
      copy_hex(c.span_id, s.context.span_id_hex());
      bool root = true;
      for (const std::uint8_t b : s.parent_span_id) root = root && b == 0;
      if (!root) {
        distlock::TraceContext parent;
        parent.span_id = s.parent_span_id;
        copy_hex(c.parent_span_id, parent.span_id_hex());
      }
      copy_hex(c.traceparent, s.context.traceparent());
      c.sampled = (s.context.flags & 1) != 0 ? 1 : 0;
      c.start_unix_ns = ns(s.start_wall.time_since_epoch());
      c.end_unix_ns = ns(s.end_wall.time_since_epoch());
      c.start_mono_ns = ns(s.start.time_since_epoch());
      c.end_mono_ns = ns(s.end.time_since_epoch());
      c.lock_name = s.lock_name.c_str();
      c.has_token = s.token ? 1 : 0;
      c.token = s.token.value_or(0);
      c.owner = s.owner.c_str();
      c.holder_info = s.holder_info.c_str();
      c.backend = s.backend.c_str();
      c.outcome = distlock::to_string(s.outcome);
      if (s.error)
        c.error_code = s.error.category() == distlock::category() ? s.error.value() : DISTLOCK_E_INTERNAL;
      c.loss_reason = distlock::to_string(s.loss_reason);
      c.detail = s.detail.c_str();
      c.batch_size = s.batch_size;
      fn_(&c, user_);
    } catch (...) {  // no memory for the hex strings: the span is dropped
    }
  }

 private:
  template <std::size_t N>
  static void copy_hex(char (&out)[N], const std::string& hex) noexcept {
    const std::size_t n = std::min(hex.size(), N - 1);
    std::memcpy(out, hex.data(), n);
    out[n] = '\0';
  }
  template <class D>
  static std::int64_t ns(D d) noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
  }
  distlock_tracer_fn fn_;
  void* user_;
  void (*release_)(void*);
};

const char* kind_name(distlock::LockKind k) noexcept {
  switch (k) {
    case distlock::LockKind::lock: return "lock";
    case distlock::LockKind::semaphore_permit: return "semaphore_permit";
    case distlock::LockKind::rw_writer: return "rw_writer";
    case distlock::LockKind::rw_reader: return "rw_reader";
    case distlock::LockKind::election: return "election";
  }
  return "lock";
}

nlohmann::json info_json(const distlock::LockInfo& info) {
  nlohmann::json j;
  j["held"] = info.held;
  if (info.token) j["token"] = *info.token;
  if (info.ttl_remaining) j["ttl_remaining_ms"] = info.ttl_remaining->count();
  if (info.holder) j["holder"] = *info.holder;
  if (info.holder_info) j["holder_info"] = *info.holder_info;
  if (info.waiters) j["waiters"] = *info.waiters;
  if (info.waiters_listed) {  // absent: the backend does not list its queue
    nlohmann::json queue = nlohmann::json::array();
    for (const distlock::WaiterInfo& w : info.waiter_list) {
      nlohmann::json e;
      e["position"] = w.position;
      e["owner"] = w.owner;
      if (w.holder_info) e["holder_info"] = *w.holder_info;
      if (w.waiting_since) {
        e["waiting_since_unix_ms"] =
            std::chrono::duration_cast<std::chrono::milliseconds>(w.waiting_since->time_since_epoch())
                .count();
      }
      queue.push_back(std::move(e));
    }
    j["queue"] = std::move(queue);
  }
  return j;
}

nlohmann::json leader_json(const std::optional<distlock::Leader>& leader) {
  nlohmann::json j;  // null: nobody leads
  if (leader) {
    j["value"] = leader->value;
    j["term"] = leader->term;
    j["holder"] = leader->holder;
    j["value_known"] = leader->value_known;
    if (leader->ttl_remaining) j["ttl_remaining_ms"] = leader->ttl_remaining->count();
  }
  return j;
}

// JSON text; bytes that are not UTF-8 (lock names may hold any byte) are replaced.
std::string dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

extern "C" {

const char* distlock_status_name(int code) {
  switch (code) {
    case DISTLOCK_OK: return "ok";
    case DISTLOCK_E_BUSY: return "busy";
    case DISTLOCK_E_TIMEOUT: return "timeout";
    case DISTLOCK_E_LOST: return "lost";
    case DISTLOCK_E_NOT_OWNER: return "not_owner";
    case DISTLOCK_E_BACKEND_UNAVAILABLE: return "backend_unavailable";
    case DISTLOCK_E_AUTH_FAILED: return "auth_failed";
    case DISTLOCK_E_INVALID_ARGUMENT: return "invalid_argument";
    case DISTLOCK_E_INVALID_URL: return "invalid_url";
    case DISTLOCK_E_QUORUM_UNAVAILABLE: return "quorum_unavailable";
    case DISTLOCK_E_PROTOCOL_ERROR: return "protocol_error";
    case DISTLOCK_E_NOT_SUPPORTED: return "not_supported";
    case DISTLOCK_E_EXHAUSTED: return "exhausted";
    case DISTLOCK_E_CLOCK_MOVED_BACKWARDS: return "clock_moved_backwards";
    case DISTLOCK_E_FORKED: return "forked";
    case DISTLOCK_E_CANCELLED: return "cancelled";
    case DISTLOCK_E_NO_MEMORY: return "no_memory";
    case DISTLOCK_E_INTERNAL: return "internal";
    default: return "unknown";
  }
}

const char* distlock_version(void) {
  return distlock::kVersion;
}

void distlock_string_free(char* s) {
  std::free(s);
}

void distlock_lock_options_init(distlock_lock_options* opts) {
  if (opts == nullptr) return;
  opts->ttl_ms = DISTLOCK_DEFAULT;
  opts->wait_ms = DISTLOCK_DEFAULT;
  opts->max_hold_ms = DISTLOCK_DEFAULT;
  opts->holder_info = nullptr;
  opts->cancel = nullptr;
}

void distlock_client_options_init(distlock_client_options* opts) {
  if (opts == nullptr) return;
  opts->ttl_ms = DISTLOCK_DEFAULT;
  opts->wait_ms = DISTLOCK_DEFAULT;
  opts->prefix = nullptr;
  opts->holder_info = nullptr;
  opts->connect_timeout_ms = DISTLOCK_DEFAULT;
  opts->command_timeout_ms = DISTLOCK_DEFAULT;
}

int distlock_cancel_new(distlock_cancel** out, distlock_error* err) {
  if (out == nullptr) return invalid(err, "distlock: distlock_cancel_new: out is NULL");
  *out = nullptr;
  return guarded(err, [&] { *out = new distlock_cancel(); });
}

void distlock_cancel_request(distlock_cancel* c) {
  if (c != nullptr) c->source.request_stop();
}

int distlock_cancel_requested(const distlock_cancel* c) {
  return c != nullptr && c->source.stop_requested() ? 1 : 0;
}

void distlock_cancel_free(distlock_cancel* c) {
  delete c;
}

namespace {

int connect_with(const char* url, const distlock_client_options* opts, distlock_tracer_fn tracer, void* user,
                 void (*release)(void*), const char* traceparent, distlock_client** out,
                 distlock_error* err) {
  if (out == nullptr) {
    if (release != nullptr) release(user);
    return invalid(err, "distlock: distlock_connect: out is NULL");
  }
  *out = nullptr;
  std::shared_ptr<CTracer> traced;
  try {
    if (tracer != nullptr || release != nullptr) traced = std::make_shared<CTracer>(tracer, user, release);
  } catch (...) {
    if (release != nullptr) release(user);
    return fail(err, DISTLOCK_E_NO_MEMORY, "distlock: out of memory");
  }
  return guarded(err, [&, traced = std::move(traced)]() mutable {
    std::string u = url != nullptr ? url : "";
    distlock::ClientOptions co;
    if (tracer != nullptr) co.tracer = std::move(traced);
    if (traceparent != nullptr) co.traceparent = traceparent;
    if (opts != nullptr) {
      if (opts->ttl_ms != DISTLOCK_DEFAULT) co.lock_defaults.ttl = distlock::Millis(opts->ttl_ms);
      if (opts->wait_ms != DISTLOCK_DEFAULT && opts->wait_ms != DISTLOCK_WAIT_FOREVER) {
        co.lock_defaults.wait = distlock::Millis(opts->wait_ms);
      }
      if (opts->holder_info != nullptr) co.lock_defaults.holder_info = opts->holder_info;
      if (opts->connect_timeout_ms != DISTLOCK_DEFAULT)
        co.connect_timeout = distlock::Millis(opts->connect_timeout_ms);
      if (opts->command_timeout_ms != DISTLOCK_DEFAULT)
        co.command_timeout = distlock::Millis(opts->command_timeout_ms);
      if (opts->prefix != nullptr) {
        if (u.empty()) u = distlock::default_url();
        // Percent-encoded: the URL parser decodes query values.
        std::string enc;
        for (const unsigned char ch : std::string_view(opts->prefix)) {
          if (std::isalnum(ch) != 0 || ch == '-' || ch == '_' || ch == '.' || ch == '~' || ch == ':' ||
              ch == '/') {
            enc += static_cast<char>(ch);
          } else {
            static constexpr char hex[] = "0123456789ABCDEF";
            enc += '%';
            enc += hex[ch >> 4];
            enc += hex[ch & 15];
          }
        }
        u += (u.find('?') == std::string::npos ? "?prefix=" : "&prefix=") + enc;
      }
    }
    // connect() checks the options (ClientOptions::validate) and the URL.
    auto client = distlock::connect(u, co);
    auto* c = new distlock_client{std::move(client), co.lock_defaults};
    *out = c;
  });
}

}  // namespace

int distlock_connect(const char* url, const distlock_client_options* opts, distlock_client** out,
                     distlock_error* err) {
  return connect_with(url, opts, nullptr, nullptr, nullptr, nullptr, out, err);
}

int distlock_connect_traced(const char* url, const distlock_client_options* opts, distlock_tracer_fn tracer,
                            void* user_data, void (*release_user_data)(void* user_data),
                            const char* traceparent, distlock_client** out, distlock_error* err) {
  return connect_with(url, opts, tracer, user_data, release_user_data, traceparent, out, err);
}

void distlock_client_close(distlock_client* c) {
  delete c;
}

int distlock_client_url(distlock_client* c, char** out, distlock_error* err) {
  if (c == nullptr || out == nullptr)
    return invalid(err, "distlock: distlock_client_url: client or out is NULL");
  *out = nullptr;
  return guarded(err, [&] { *out = dup_string(c->client.url()); });
}

int distlock_client_has_fencing(distlock_client* c) {
  return c != nullptr && c->client.has_fencing() ? 1 : 0;
}

int distlock_acquire(distlock_client* c, const char* name, const distlock_lock_options* opts,
                     distlock_lease** out, distlock_error* err) {
  if (c == nullptr || out == nullptr)
    return invalid(err, "distlock: distlock_acquire: client or out is NULL");
  *out = nullptr;
  if (name == nullptr) return invalid(err, "distlock: the lock name is NULL");
  return guarded(err, [&] { *out = wrap(c->client.acquire(name, lock_options(c, opts))); });
}

int distlock_revoke(distlock_client* c, const char* name, const char* reason, int* revoked,
                    distlock_error* err) {
  if (revoked != nullptr) *revoked = 0;
  if (c == nullptr) return invalid(err, "distlock: distlock_revoke: client is NULL");
  if (name == nullptr) return invalid(err, "distlock: the lock name is NULL");
  if (reason == nullptr) return invalid(err, "distlock: distlock_revoke: reason is NULL");
  return guarded(err, [&] {
    const distlock::RevokeResult r = c->client.revoke(name, reason);
    if (revoked != nullptr) *revoked = r.revoked ? 1 : 0;
  });
}

int distlock_acquire_traced(distlock_client* c, const char* name, const distlock_lock_options* opts,
                            const char* traceparent, distlock_lease** out, distlock_error* err) {
  if (c == nullptr || out == nullptr)
    return invalid(err, "distlock: distlock_acquire_traced: client or out is NULL");
  *out = nullptr;
  if (name == nullptr) return invalid(err, "distlock: the lock name is NULL");
  return guarded(err, [&] {
    auto o = lock_options(c, opts);
    if (traceparent != nullptr && *traceparent != '\0') o.traceparent = traceparent;
    *out = wrap(c->client.acquire(name, o));
  });
}

int distlock_lease_traceparent(const distlock_lease* l, char** out, distlock_error* err) {
  if (l == nullptr || out == nullptr)
    return invalid(err, "distlock: distlock_lease_traceparent: lease or out is NULL");
  *out = nullptr;
  return guarded(err, [&] {
    if (!l->lease) return;
    if (auto ctx = l->lease->trace_context()) *out = dup_string(ctx->traceparent());
  });
}

int distlock_try_acquire(distlock_client* c, const char* name, const distlock_lock_options* opts,
                         distlock_lease** out, distlock_error* err) {
  if (c == nullptr || out == nullptr)
    return invalid(err, "distlock: distlock_try_acquire: client or out is NULL");
  *out = nullptr;
  if (name == nullptr) return invalid(err, "distlock: the lock name is NULL");
  return guarded(err, [&] {
    auto o = lock_options(c, opts);
    o.wait = distlock::Millis(0);
    *out = wrap(c->client.acquire(name, o));  // errc::busy when held
  });
}

int distlock_lease_token(const distlock_lease* l, uint64_t* out, distlock_error* err) {
  if (l == nullptr || out == nullptr)
    return invalid(err, "distlock: distlock_lease_token: lease or out is NULL");
  return guarded(err, [&] { *out = l->lease ? l->lease->token() : l->rw->token(); });
}

int distlock_lease_owns(const distlock_lease* l) {
  if (l == nullptr) return 0;
  return (l->lease ? l->lease->owns() : l->rw->owns()) ? 1 : 0;
}

int64_t distlock_lease_remaining_ms(const distlock_lease* l) {
  if (l == nullptr) return 0;
  return (l->lease ? l->lease->remaining() : l->rw->remaining()).count();
}

int distlock_lease_lost_fd(const distlock_lease* l) {
  return l != nullptr ? l->fd : -1;
}

int distlock_lease_loss(const distlock_lease* l, distlock_error* err) {
  if (l == nullptr) return invalid(err, "distlock: distlock_lease_loss: lease is NULL");
  return guarded(err, [&] {
    const auto reason = l->lease ? l->lease->loss_reason() : l->rw->loss_reason();
    if (reason == distlock::LossReason::none) return;
    const std::string detail = l->lease ? l->lease->loss_detail() : l->rw->loss_detail();
    throw std::system_error(
        make_error_code(distlock::errc::lost),
        std::string("distlock: lease lost (") + distlock::to_string(reason) + "): " + detail);
  });
}

int distlock_lease_on_lost(distlock_lease* l, void (*fn)(void* user), void* user, distlock_error* err) {
  if (l == nullptr || fn == nullptr)
    return invalid(err, "distlock: distlock_lease_on_lost: lease or fn is NULL");
  return guarded(err, [&] {
    auto cb = [fn, user] { fn(user); };
    if (l->lease) {
      l->lease->on_lost(cb);
    } else {
      l->rw->on_lost(cb);
    }
  });
}

int distlock_lease_release(distlock_lease* l, distlock_error* err) {
  if (l == nullptr) return invalid(err, "distlock: distlock_lease_release: lease is NULL");
  return guarded(err, [&] {
    if (l->lease) {
      l->lease->release();
    } else {
      l->rw->release();
    }
  });
}

void distlock_lease_free(distlock_lease* l) {
  // The destructors release a held lease and never throw.
  delete l;
}

void distlock_lock_options_ext_init(distlock_lock_options_ext* ext) {
  if (ext == nullptr) return;
  ext->size = sizeof(distlock_lock_options_ext);
  ext->lock_delay_ms = DISTLOCK_DEFAULT;
  ext->on_queue_position = nullptr;
  ext->queue_position_user = nullptr;
  ext->traceparent = nullptr;
}

int distlock_acquire_ext(distlock_client* c, const char* name, const distlock_lock_options* opts,
                         const distlock_lock_options_ext* ext, distlock_lease** out, distlock_error* err) {
  if (c == nullptr || out == nullptr)
    return invalid(err, "distlock: distlock_acquire_ext: client or out is NULL");
  *out = nullptr;
  if (name == nullptr) return invalid(err, "distlock: the lock name is NULL");
  return guarded(err, [&] {
    distlock::LockOptions o = lock_options(c, opts);
    const CloseGate closing{apply_ext(o, ext, true)};  // no report after this call returns
    *out = wrap(c->client.acquire(name, o));
  });
}

int distlock_acquire_all(distlock_client* c, const char* const* names, size_t count,
                         const distlock_lock_options* opts, const distlock_lock_options_ext* ext,
                         distlock_multi_lease** out, distlock_error* err) {
  if (c == nullptr || out == nullptr)
    return invalid(err, "distlock: distlock_acquire_all: client or out is NULL");
  *out = nullptr;
  if (names == nullptr && count > 0) return invalid(err, "distlock: distlock_acquire_all: names is NULL");
  for (size_t i = 0; i < count; ++i) {
    if (names[i] == nullptr)
      return invalid(err, "distlock: distlock_acquire_all: name " + std::to_string(i) + " is NULL");
  }
  return guarded(err, [&] {
    distlock::LockOptions o = lock_options(c, opts);
    apply_ext(o, ext, false);
    std::vector<std::string> list(names, names + count);
    auto m = std::make_unique<distlock_multi_lease>();
    m->multi = c->client.acquire_all(list, o);
    m->names = m->multi.names();
    m->fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (m->fd < 0) {
      throw std::system_error(errno, std::generic_category(), "distlock: eventfd for the loss signal");
    }
    m->notify.emplace(m->multi.stop_token(), NotifyFd{m->fd});  // fires at once if already lost
    *out = m.release();
  });
}

size_t distlock_multi_lease_count(const distlock_multi_lease* m) {
  return m != nullptr ? m->names.size() : 0;
}

const char* distlock_multi_lease_name(const distlock_multi_lease* m, size_t i) {
  if (m == nullptr || i >= m->names.size()) return nullptr;
  return m->names[i].c_str();
}

int distlock_multi_lease_token(const distlock_multi_lease* m, const char* name, uint64_t* out,
                               distlock_error* err) {
  if (m == nullptr || name == nullptr || out == nullptr)
    return invalid(err, "distlock: distlock_multi_lease_token: multi-lease, name or out is NULL");
  return guarded(err, [&] { *out = m->multi.token(name); });
}

int distlock_multi_lease_owns(const distlock_multi_lease* m) {
  return m != nullptr && m->multi.owns() ? 1 : 0;
}

int64_t distlock_multi_lease_remaining_ms(const distlock_multi_lease* m) {
  return m != nullptr ? m->multi.remaining().count() : 0;
}

int distlock_multi_lease_lost_fd(const distlock_multi_lease* m) {
  return m != nullptr ? m->fd : -1;
}

int distlock_multi_lease_loss(const distlock_multi_lease* m, distlock_error* err) {
  if (m == nullptr) return invalid(err, "distlock: distlock_multi_lease_loss: multi-lease is NULL");
  return guarded(err, [&] {
    for (const distlock::Lease& l : m->multi.leases()) {
      const auto reason = l.loss_reason();
      if (reason == distlock::LossReason::none) continue;
      throw std::system_error(make_error_code(distlock::errc::lost),
                              "distlock: multi-lease lost: \"" + l.name() + "\" lost (" +
                                  distlock::to_string(reason) + "): " + l.loss_detail());
    }
  });
}

int distlock_multi_lease_release(distlock_multi_lease* m, distlock_error* err) {
  if (m == nullptr) return invalid(err, "distlock: distlock_multi_lease_release: multi-lease is NULL");
  return guarded(err, [&] { m->multi.release(); });
}

void distlock_multi_lease_free(distlock_multi_lease* m) {
  delete m;  // the MultiLease's destructor releases every name and never throws
}

int distlock_semaphore_acquire(distlock_client* c, const char* name, int permits,
                               const distlock_lock_options* opts, distlock_lease** out, distlock_error* err) {
  if (c == nullptr || out == nullptr)
    return invalid(err, "distlock: distlock_semaphore_acquire: client or out is NULL");
  *out = nullptr;
  if (name == nullptr) return invalid(err, "distlock: the semaphore name is NULL");
  return guarded(err, [&] {
    distlock::Semaphore sem(c->client, name, permits, lock_options(c, opts));
    *out = wrap(sem.acquire());
  });
}

int distlock_rwlock_acquire(distlock_client* c, const char* name, int exclusive, int max_readers,
                            const distlock_lock_options* opts, distlock_lease** out, distlock_error* err) {
  if (c == nullptr || out == nullptr)
    return invalid(err, "distlock: distlock_rwlock_acquire: client or out is NULL");
  *out = nullptr;
  if (name == nullptr) return invalid(err, "distlock: the read-write lock name is NULL");
  return guarded(err, [&] {
    distlock::SharedMutex rw(c->client, name, lock_options(c, opts), max_readers);
    *out = wrap(exclusive != 0 ? rw.acquire_exclusive() : rw.acquire_shared());
  });
}

int distlock_election_campaign(distlock_client* c, const char* name, const char* value,
                               const distlock_lock_options* opts, distlock_lease** out, distlock_error* err) {
  if (c == nullptr || out == nullptr)
    return invalid(err, "distlock: distlock_election_campaign: client or out is NULL");
  *out = nullptr;
  if (name == nullptr) return invalid(err, "distlock: the election name is NULL");
  return guarded(err, [&] {
    distlock::Election e(c->client, name, lock_options(c, opts));
    *out = wrap(e.campaign(value != nullptr ? value : ""), name);
  });
}

int distlock_election_resign(distlock_client* c, const char* name, distlock_lease* leadership,
                             distlock_error* err) {
  if (c == nullptr || leadership == nullptr || name == nullptr) {
    return invalid(err, "distlock: distlock_election_resign: client, name or lease is NULL");
  }
  if (!leadership->lease || leadership->election != name) {
    return invalid(err, "distlock: the lease is not a leadership of this election");
  }
  return guarded(err, [&] {
    distlock::Election e(c->client, name, c->defaults);
    e.resign(*leadership->lease);
  });
}

int distlock_election_leader(distlock_client* c, const char* name, char** json, distlock_error* err) {
  if (c == nullptr || json == nullptr)
    return invalid(err, "distlock: distlock_election_leader: client or out is NULL");
  *json = nullptr;
  if (name == nullptr) return invalid(err, "distlock: the election name is NULL");
  return guarded(err, [&] {
    distlock::Election e(c->client, name, c->defaults);
    *json = dup_string(dump(leader_json(e.leader())));
  });
}

int distlock_election_proclaim(distlock_client* c, const char* name, const distlock_lease* leadership,
                               const char* value, distlock_error* err) {
  if (c == nullptr || leadership == nullptr || name == nullptr) {
    return invalid(err, "distlock: distlock_election_proclaim: client, name or lease is NULL");
  }
  if (!leadership->lease || leadership->election != name) {
    return invalid(err, "distlock: the lease is not a leadership of this election");
  }
  return guarded(err, [&] {
    distlock::Election e(c->client, name, c->defaults);
    e.proclaim(*leadership->lease, value != nullptr ? value : "");
  });
}

int distlock_election_observe(distlock_client* c, const char* name, const uint64_t* after_term,
                              const distlock_lock_options* opts, char** json, distlock_error* err) {
  if (c == nullptr || json == nullptr)
    return invalid(err, "distlock: distlock_election_observe: client or out is NULL");
  *json = nullptr;
  if (name == nullptr) return invalid(err, "distlock: the election name is NULL");
  return guarded(err, [&] {
    const distlock::LockOptions o = lock_options(c, opts);
    distlock::Election e(c->client, name, o);
    std::optional<std::uint64_t> after;
    if (after_term != nullptr) after = *after_term;
    *json = dup_string(dump(leader_json(e.observe(after, o.wait))));
  });
}

int distlock_status_json(distlock_client* c, const char* name, char** json, distlock_error* err) {
  if (c == nullptr || json == nullptr)
    return invalid(err, "distlock: distlock_status_json: client or out is NULL");
  *json = nullptr;
  if (name == nullptr) return invalid(err, "distlock: the lock name is NULL");
  return guarded(err, [&] { *json = dup_string(dump(info_json(c->client.status(name)))); });
}

int distlock_list_json(distlock_client* c, const char* prefix, size_t limit, char** json,
                       distlock_error* err) {
  if (c == nullptr || json == nullptr)
    return invalid(err, "distlock: distlock_list_json: client or out is NULL");
  *json = nullptr;
  return guarded(err, [&] {
    bool truncated = false;
    const auto locks = c->client.list(prefix != nullptr ? prefix : "", limit, truncated);
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& l : locks) {
      nlohmann::json j = info_json(l.info);
      j["name"] = l.name;
      j["base"] = l.base;
      j["kind"] = kind_name(l.kind);
      j["display"] = l.display;
      if (l.index) j["index"] = *l.index;
      if (l.of) j["of"] = *l.of;
      arr.push_back(std::move(j));
    }
    *json = dup_string(dump(nlohmann::json{{"locks", std::move(arr)}, {"truncated", truncated}}));
  });
}

void distlock_shard_group_options_init(distlock_shard_group_options* opts) {
  if (opts == nullptr) return;
  opts->ttl_ms = DISTLOCK_DEFAULT;
  opts->max_hold_ms = DISTLOCK_DEFAULT;
  opts->rebalance_period_ms = DISTLOCK_DEFAULT;
  opts->member_id = nullptr;
  opts->info = nullptr;
}

int distlock_shard_group_join(distlock_client* c, const char* job, uint32_t shards,
                              const distlock_shard_group_options* opts, distlock_shard_group** out,
                              distlock_error* err) {
  if (c == nullptr || out == nullptr)
    return invalid(err, "distlock: distlock_shard_group_join: client or out is NULL");
  *out = nullptr;
  if (job == nullptr) return invalid(err, "distlock: the shard group's job name is NULL");
  return guarded(err, [&] {
    auto g = std::make_unique<distlock_shard_group>();
    g->signal = std::make_shared<ShardGroupSignal>();
    g->signal->fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (g->signal->fd < 0)
      throw std::system_error(errno, std::generic_category(), "distlock: eventfd for the shard group");
    distlock::ShardGroupOptions o;
    o.lock = c->defaults;
    if (opts != nullptr) {
      if (opts->ttl_ms != DISTLOCK_DEFAULT) o.lock.ttl = distlock::Millis(opts->ttl_ms);
      if (opts->max_hold_ms != DISTLOCK_DEFAULT) o.lock.max_hold = distlock::Millis(opts->max_hold_ms);
      if (opts->rebalance_period_ms != DISTLOCK_DEFAULT)
        o.rebalance_period = distlock::Millis(opts->rebalance_period_ms);
      if (opts->member_id != nullptr) {
        if (*opts->member_id == '\0')
          throw std::system_error(make_error_code(distlock::errc::invalid_argument),
                                  "distlock: shard group: member_id is empty");
        o.member_id = opts->member_id;
      }
      if (opts->info != nullptr) o.info = opts->info;
    }
    // Weak: the group's thread must not keep the signal (and its descriptor) alive.
    o.on_change = [weak = std::weak_ptr<ShardGroupSignal>(g->signal)](const distlock::ShardAssignment&) {
      if (auto s = weak.lock()) s->changed();
    };
    g->group.emplace(c->client.shard_group(job, shards, o));
    *out = g.release();
  });
}

namespace {

distlock_shard_assignment* wrap_assignment(const distlock::ShardAssignment& a) {
  auto out = std::make_unique<distlock_shard_assignment>();
  out->version = a.version;
  out->members = a.members;
  for (const distlock::OwnedShard& s : a.shards) {
    auto sh = std::make_unique<distlock_shard_assignment::Shard>();
    sh->owned = s;  // its stop descriptor is opened by distlock_shard_assignment_shard
    out->shards.push_back(std::move(sh));
  }
  return out.release();
}

[[noreturn]] void throw_left(const distlock_shard_group* g) {
  throw std::system_error(make_error_code(distlock::errc::not_owner),
                          "distlock: shard group \"" + g->group->job() + "\": this member (" +
                              g->group->member_id() + ") has left the group");
}

}  // namespace

int distlock_shard_group_assigned(distlock_shard_group* g, distlock_shard_assignment** out,
                                  distlock_error* err) {
  if (g == nullptr || out == nullptr)
    return invalid(err, "distlock: distlock_shard_group_assigned: group or out is NULL");
  *out = nullptr;
  return guarded(err, [&] {
    {
      std::lock_guard lk(g->signal->mu);
      if (g->signal->left) throw_left(g);
    }
    *out = wrap_assignment(g->group->assigned());
  });
}

int distlock_shard_group_wait_change(distlock_shard_group* g, uint64_t after_version, int64_t timeout_ms,
                                     distlock_cancel* cancel, distlock_shard_assignment** out,
                                     distlock_error* err) {
  if (g == nullptr || out == nullptr)
    return invalid(err, "distlock: distlock_shard_group_wait_change: group or out is NULL");
  *out = nullptr;
  if (timeout_ms < 0 && timeout_ms != DISTLOCK_WAIT_FOREVER)
    return invalid(err, "distlock: distlock_shard_group_wait_change: timeout_ms " +
                            std::to_string(timeout_ms) + " is negative (DISTLOCK_WAIT_FOREVER is -1)");
  return guarded(err, [&] {
    ShardGroupSignal& s = *g->signal;
    std::stop_token token;
    if (cancel != nullptr) token = cancel->source.get_token();
    // Wakes the wait (under the mutex, so that it cannot fall between a check and the wait).
    auto wake = [&s] {
      { std::lock_guard lk(s.mu); }
      s.cv.notify_all();
    };
    std::stop_callback<decltype(wake)> on_cancel(token, wake);
    std::optional<distlock::ShardAssignment> now;
    bool left = false;
    auto ready = [&] {
      if (s.left) return left = true;
      if (token.stop_requested()) return true;
      now = g->group->assigned();
      return now->version > after_version;
    };
    std::unique_lock lk(s.mu);
    bool done = false;
    // DISTLOCK_WAIT_FOREVER, and anything from LockOptions::max_wait (100 years) up, is no limit
    // (a larger wait_for overflows the clock's nanoseconds and returns at once).
    if (timeout_ms == DISTLOCK_WAIT_FOREVER || timeout_ms >= distlock::LockOptions::max_wait.count()) {
      s.cv.wait(lk, ready);
      done = true;
    } else {
      done = s.cv.wait_for(lk, std::chrono::milliseconds(timeout_ms), ready);
    }
    lk.unlock();
    if (left) throw_left(g);
    if (token.stop_requested())
      throw std::system_error(make_error_code(distlock::errc::cancelled),
                              "distlock: the wait for a shard group change was cancelled");
    if (!done)
      throw std::system_error(make_error_code(distlock::errc::timeout),
                              "distlock: shard group \"" + g->group->job() + "\": no change within " +
                                  std::to_string(timeout_ms) + " ms");
    *out = wrap_assignment(*now);
  });
}

int distlock_shard_group_changed_fd(const distlock_shard_group* g) {
  return g != nullptr ? g->signal->fd : -1;
}

const char* distlock_shard_group_member_id(const distlock_shard_group* g) {
  return g != nullptr ? g->group->member_id().c_str() : "";
}

void distlock_shard_group_leave(distlock_shard_group* g) {
  if (g == nullptr) return;
  g->group->leave();  // noexcept; idempotent
  {
    std::lock_guard lk(g->signal->mu);
    if (g->signal->left) return;
    g->signal->left = true;
  }
  g->signal->changed();
}

void distlock_shard_group_free(distlock_shard_group* g) {
  if (g == nullptr) return;
  distlock_shard_group_leave(g);
  delete g;
}

uint64_t distlock_shard_assignment_version(const distlock_shard_assignment* a) {
  return a != nullptr ? a->version : 0;
}

size_t distlock_shard_assignment_members(const distlock_shard_assignment* a) {
  return a != nullptr ? a->members : 0;
}

size_t distlock_shard_assignment_count(const distlock_shard_assignment* a) {
  return a != nullptr ? a->shards.size() : 0;
}

int distlock_shard_assignment_shard(const distlock_shard_assignment* a, size_t i, distlock_owned_shard* out,
                                    distlock_error* err) {
  if (a == nullptr || out == nullptr)
    return invalid(err, "distlock: distlock_shard_assignment_shard: assignment or out is NULL");
  if (i >= a->shards.size())
    return invalid(err, "distlock: shard " + std::to_string(i) + " of an assignment of " +
                            std::to_string(a->shards.size()) + " shards");
  const auto& s = *a->shards[i];
  out->index = s.owned.index;
  out->has_token = s.owned.token ? 1 : 0;
  out->token = s.owned.token.value_or(0);
  out->stopped_fd = -1;
  return guarded(err, [&] {
    s.open_stop_fd();
    out->stopped_fd = s.fd;
  });
}

uint64_t distlock_shard_assignment_ownership(const distlock_shard_assignment* a, size_t i) {
  if (a == nullptr || i >= a->shards.size()) return 0;
  // The shard lease's check, shared by every copy of this one acquisition's OwnedShard and
  // kept alive by each assignment that lists it: two live assignments give the same address
  // exactly when they list the same ownership.
  return static_cast<uint64_t>(reinterpret_cast<std::uintptr_t>(a->shards[i]->owned.check.get()));
}

int distlock_shard_assignment_owns(const distlock_shard_assignment* a, size_t i) {
  if (a == nullptr || i >= a->shards.size()) return 0;
  return a->shards[i]->owned.held() ? 1 : 0;  // never late: the lease's deadline, read now
}

void distlock_shard_assignment_free(distlock_shard_assignment* a) {
  delete a;
}

#if DISTLOCK_HAS_IDS

int distlock_snowflake_new(distlock_client* c, const char* prefix, distlock_snowflake** out,
                           distlock_error* err) {
  if (c == nullptr || out == nullptr)
    return invalid(err, "distlock: distlock_snowflake_new: client or out is NULL");
  *out = nullptr;
  return guarded(err, [&] {
    auto g = std::make_unique<distlock_snowflake>();
    distlock::ids::SnowflakeOptions o;
    if (prefix != nullptr) o.prefix = prefix;
    g->gen.emplace(c->client, std::move(o));
    *out = g.release();
  });
}

int distlock_snowflake_next(distlock_snowflake* g, uint64_t* out, distlock_error* err) {
  if (g == nullptr || out == nullptr)
    return invalid(err, "distlock: distlock_snowflake_next: generator or out is NULL");
  return guarded(err, [&] { *out = g->gen->next(); });
}

int distlock_redis_daily_new(const char* redis_url, const char* prefix, uint32_t reserve,
                             distlock_redis_daily** out, distlock_error* err) {
  if (redis_url == nullptr || out == nullptr) {
    return invalid(err, "distlock: distlock_redis_daily_new: url or out is NULL");
  }
  *out = nullptr;
  return guarded(err, [&] {
    auto g = std::make_unique<distlock_redis_daily>();
    distlock::ids::RedisDailyOptions o;
    if (prefix != nullptr) o.prefix = prefix;
    if (reserve != 0) o.reserve = reserve;
    g->gen.emplace(redis_url, std::move(o));
    *out = g.release();
  });
}

int distlock_redis_daily_next(distlock_redis_daily* g, uint64_t* out, distlock_error* err) {
  if (g == nullptr || out == nullptr) {
    return invalid(err, "distlock: distlock_redis_daily_next: generator or out is NULL");
  }
  return guarded(err, [&] { *out = g->gen->next(); });
}

int distlock_segment_new(const char* url, const char* tag, int64_t step, distlock_segment** out,
                         distlock_error* err) {
  if (url == nullptr || tag == nullptr || out == nullptr) {
    return invalid(err, "distlock: distlock_segment_new: url, tag or out is NULL");
  }
  *out = nullptr;
  return guarded(err, [&] {
    auto g = std::make_unique<distlock_segment>();
    g->gen.emplace(url, distlock::ids::SegmentOptions{.tag = tag, .step = step});
    *out = g.release();
  });
}

int distlock_segment_next(distlock_segment* g, uint64_t* out, distlock_error* err) {
  if (g == nullptr || out == nullptr) {
    return invalid(err, "distlock: distlock_segment_next: generator or out is NULL");
  }
  return guarded(err, [&] { *out = g->gen->next(); });
}

int distlock_segment_set_step(distlock_segment* g, int64_t step, distlock_error* err) {
  if (g == nullptr) return invalid(err, "distlock: distlock_segment_set_step: generator is NULL");
  return guarded(err, [&] { g->gen->set_step(step); });
}

int distlock_uuid7(char out[37], distlock_error* err) {
  if (out == nullptr) return invalid(err, "distlock: distlock_uuid7: out is NULL");
  return guarded(err, [&] {
    static distlock::ids::Uuid7Generator gen;  // thread-safe (an internal mutex)
    const std::string s = gen.next().to_string();
    std::memcpy(out, s.c_str(), 37);
  });
}

#else

namespace {
int no_ids(distlock_error* err) {
  return fail(err, DISTLOCK_E_NOT_SUPPORTED, "distlock: this library was built without the ids component");
}
}  // namespace

int distlock_snowflake_new(distlock_client*, const char*, distlock_snowflake** out, distlock_error* err) {
  if (out != nullptr) *out = nullptr;
  return no_ids(err);
}
int distlock_snowflake_next(distlock_snowflake*, uint64_t*, distlock_error* err) {
  return no_ids(err);
}
int distlock_redis_daily_new(const char*, const char*, uint32_t, distlock_redis_daily** out,
                             distlock_error* err) {
  if (out != nullptr) *out = nullptr;
  return no_ids(err);
}
int distlock_redis_daily_next(distlock_redis_daily*, uint64_t*, distlock_error* err) {
  return no_ids(err);
}
int distlock_segment_new(const char*, const char*, int64_t, distlock_segment** out, distlock_error* err) {
  if (out != nullptr) *out = nullptr;
  return no_ids(err);
}
int distlock_segment_next(distlock_segment*, uint64_t*, distlock_error* err) {
  return no_ids(err);
}
int distlock_segment_set_step(distlock_segment*, int64_t, distlock_error* err) {
  return no_ids(err);
}
int distlock_uuid7(char*, distlock_error* err) {
  return no_ids(err);
}

#endif

void distlock_snowflake_free(distlock_snowflake* g) {
  delete g;
}
void distlock_redis_daily_free(distlock_redis_daily* g) {
  delete g;
}

void distlock_segment_free(distlock_segment* g) {
  delete g;
}

}  // extern "C"
