// distlock._distlock — the compiled part of the Python package, over the public C++ API.
//
// The Python layer (bindings/python/distlock/__init__.py) gives the API people use; this module
// gives it what it needs, with these rules:
//   - every call that may touch the network or wait runs with the GIL released;
//   - a wait on Python's main thread can be ended by a signal (Ctrl-C): the wait runs on a
//     helper thread with a std::stop_source in LockOptions::cancel while the main thread checks
//     Python's signals every 10 ms and requests stop when a handler raises;
//   - a wait on any thread can be ended through a Canceller (asyncio cancellation);
//   - library errors become the exception classes of distlock._errors, by error code, with the
//     C++ API's message;
//   - on_lost callbacks run on the client's event thread and take the GIL only while the
//     interpreter is alive (an atexit hook turns them off before it shuts down); so does a
//     client's tracer, on the threads docs/tracing.md names.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "distlock/distlock.hpp"

namespace py = pybind11;

namespace {

using distlock::Millis;

// False once the interpreter started to shut down (atexit hook) or is finalizing.
std::atomic<bool> g_python_alive{true};
#if PY_VERSION_HEX >= 0x030D0000
bool python_finalizing() {
  return Py_IsFinalizing() != 0;
}
#else
bool python_finalizing() {
  return _Py_IsFinalizing() != 0;
}
#endif
bool python_alive() {
  return g_python_alive.load() && Py_IsInitialized() && !python_finalizing();
}

unsigned long g_main_thread = 0;
bool on_main_thread() {
  return PyThread_get_thread_ident() == g_main_thread;
}

[[noreturn]] void invalid(const std::string& what) {
  distlock::throw_error(distlock::errc::invalid_argument, what);
}

// Seconds as a Python number -> milliseconds, rounded up (a positive duration never becomes 0).
Millis seconds_to_ms(double s, const char* what) {
  if (!std::isfinite(s)) invalid(std::string(what) + " must be a finite number of seconds");
  double ms = std::ceil(s * 1000.0);
  const double cap = static_cast<double>(distlock::LockOptions::max_wait.count());
  if (ms > cap) ms = cap;
  if (ms < -cap) ms = -cap;
  return Millis(static_cast<Millis::rep>(ms));
}

std::optional<Millis> optional_seconds(const py::object& o, const char* what) {
  if (o.is_none()) return std::nullopt;
  return seconds_to_ms(o.cast<double>(), what);
}

// Milliseconds -> seconds; a duration of max_wait or more (a lease that never expires, file://)
// is infinity.
double ms_to_seconds(Millis m) {
  if (m >= distlock::LockOptions::max_wait) return std::numeric_limits<double>::infinity();
  return static_cast<double>(m.count()) / 1000.0;
}

// Releases the GIL for its scope if this thread holds it (destructors run both ways).
class ReleaseIfHeld {
 public:
  ReleaseIfHeld() : state_(PyGILState_Check() ? PyEval_SaveThread() : nullptr) {}
  ReleaseIfHeld(const ReleaseIfHeld&) = delete;
  ReleaseIfHeld& operator=(const ReleaseIfHeld&) = delete;
  ~ReleaseIfHeld() {
    if (state_ != nullptr) PyEval_RestoreThread(state_);
  }

 private:
  PyThreadState* state_;
};

// A strong reference to a Python object that may be dropped on a thread without the GIL.
class PyRef {
 public:
  explicit PyRef(py::object o) : obj_(o.release().ptr()) {}
  PyRef(const PyRef&) = delete;
  PyRef& operator=(const PyRef&) = delete;
  ~PyRef() {
    if (obj_ == nullptr || !python_alive()) return;  // leaked at shutdown, on purpose
    if (PyGILState_Check()) {
      Py_DECREF(obj_);
    } else if (Py_AddPendingCall(
                   [](void* p) {
                     Py_DECREF(static_cast<PyObject*>(p));
                     return 0;
                   },
                   obj_) != 0) {
      // The pending-call queue is full: leak one reference rather than block this thread.
    }
  }
  PyObject* get() const { return obj_; }

 private:
  PyObject* obj_;
};

// Runs `cb()` under the GIL from a library thread; its exception goes to sys.unraisablehook.
std::function<void()> python_callback(py::object cb) {
  auto ref = std::make_shared<PyRef>(std::move(cb));
  return [ref]() {
    if (!python_alive()) return;
    py::gil_scoped_acquire gil;
    try {
      py::handle(ref->get())();
    } catch (py::error_already_set& e) {
      e.discard_as_unraisable("distlock on_lost callback");
    }
  };
}

// A cancel handle for one wait, usable from any thread (asyncio cancellation).
class Canceller {
 public:
  void cancel() { source_.request_stop(); }
  bool cancelled() const { return source_.stop_requested(); }
  std::stop_token token() const { return source_.get_token(); }

 private:
  std::stop_source source_;
};

// Waits that a signal ended on the main thread and that are still withdrawing what they queued
// (see cancellable()). The interpreter's exit waits for them (bounded), so a Ctrl-C that ends
// the program leaves nothing queued either.
struct Withdrawals {
  std::mutex mu;
  std::condition_variable cv;
  int pending = 0;
};
Withdrawals& withdrawals() {
  static auto* w = new Withdrawals();  // never destroyed: detached threads may still use it
  return *w;
}

// Blocks (without the GIL) until no withdrawal is pending or `limit` passed.
void wait_for_withdrawals(std::chrono::milliseconds limit) {
  Withdrawals& w = withdrawals();
  std::unique_lock lk(w.mu);
  w.cv.wait_for(lk, limit, [&] { return w.pending == 0; });
}

// Runs `wait(stop_token)` so that it can be cancelled: through `external` if given; on the
// main thread, by a signal whose Python handler raises (KeyboardInterrupt). Called with the GIL
// held; runs `wait` without it.
//
// On the main thread `wait` runs on a helper thread, which owns it (`wait` must own what it
// uses: capture by value). When a signal handler raises, stop is requested and the exception is
// raised at once; the helper, detached, finishes the library's withdrawal of whatever the wait
// queued (one round trip, in the background) and drops a lease granted at that very moment.
template <class F>
auto cancellable(Canceller* external, F wait) -> decltype(wait(std::stop_token{})) {
  using R = decltype(wait(std::stop_token{}));
  if (external != nullptr || !on_main_thread()) {
    std::stop_token token = external != nullptr ? external->token() : std::stop_token{};
    py::gil_scoped_release nogil;
    return wait(token);
  }
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    bool abandoned = false;  // the caller raised; the helper cleans up alone
    std::optional<R> result;
    std::exception_ptr error;
  };
  auto shared = std::make_shared<Shared>();
  std::stop_source source;
  std::thread worker([shared, token = source.get_token(), wait = std::move(wait)]() mutable {
    std::optional<R> r;
    std::exception_ptr err;
    try {
      r.emplace(wait(token));
    } catch (...) {
      err = std::current_exception();
    }
    std::lock_guard lk(shared->mu);
    if (shared->abandoned) {
      r.reset();  // a lease granted as the wait was cancelled: released here
      Withdrawals& w = withdrawals();
      std::lock_guard wl(w.mu);
      --w.pending;
      w.cv.notify_all();
      return;
    }
    shared->result = std::move(r);
    shared->error = err;
    shared->done = true;
    shared->cv.notify_all();
  });
  for (;;) {
    bool done;
    {
      py::gil_scoped_release nogil;
      std::unique_lock lk(shared->mu);
      done = shared->cv.wait_for(lk, std::chrono::milliseconds(10), [&] { return shared->done; });
    }
    if (done) break;
    if (PyErr_CheckSignals() != 0) {
      // A signal handler raised (KeyboardInterrupt): end the wait and raise now; the helper
      // withdraws in the background (or drops what it got, if it just finished).
      py::error_already_set interrupted;
      source.request_stop();
      {
        py::gil_scoped_release nogil;
        std::unique_lock lk(shared->mu);
        if (shared->done) {
          lk.unlock();
          worker.join();
          shared->result.reset();  // a lease granted at the last moment is released here
        } else {
          shared->abandoned = true;
          {
            Withdrawals& w = withdrawals();
            std::lock_guard wl(w.mu);
            ++w.pending;
          }
          lk.unlock();
          worker.detach();
        }
      }
      throw interrupted;
    }
  }
  {
    py::gil_scoped_release nogil;
    worker.join();
  }
  if (shared->error) std::rethrow_exception(shared->error);
  return std::move(*shared->result);
}

class PyLease;

// The leases a client handed to Python and that may still be held: Client.close() releases
// them. An intrusive list (no allocation per lease), touched only with the GIL held: a lease
// is added as it is returned to Python and removed when its Python object is deallocated.
struct LeaseList {
  PyLease* head = nullptr;
  void add(PyLease* l) noexcept;
  void remove(PyLease* l) noexcept;
  template <class F>
  void for_each(F&& f);
  LeaseList() = default;
  LeaseList(const LeaseList&) = delete;
  LeaseList& operator=(const LeaseList&) = delete;
  ~LeaseList();  // the leases outlive the client's list: detached
};

// A held lease: a plain lock's, a semaphore permit's or an election's (distlock::Lease) or a
// read-write lock's (distlock::ReadWriteLease).
class PyLease {
  template <class F>
  auto visit(F&& f) const {
    using R = decltype(f(std::declval<const distlock::Lease&>()));
    py::gil_scoped_release nogil;
    return std::visit(
        [&](const auto& l) -> R {
          if constexpr (std::is_same_v<std::decay_t<decltype(l)>, std::monostate>) {
            distlock::throw_error(distlock::errc::not_owner, "empty lease");
          } else {
            return f(l);
          }
        },
        v_);
  }

 public:
  explicit PyLease(distlock::Lease l) : v_(std::move(l)) { cache_token(); }
  explicit PyLease(distlock::ReadWriteLease l) : v_(std::move(l)) { cache_token(); }
  // The token as taken (None where there is none): readable without a call into the library.
  py::object token_or_none() const {
    if (!token_) return py::none();
    return py::int_(*token_);
  }
  PyLease(const PyLease&) = delete;
  PyLease& operator=(const PyLease&) = delete;
  ~PyLease() {
    if (list_ != nullptr) list_->remove(this);
    drop();
  }

  std::string name() const {
    return visit([](const auto& l) { return l.name(); });
  }
  std::uint64_t token() const {
    return visit([](const auto& l) { return l.token(); });
  }
  bool has_token() const {
    return visit([](const auto& l) { return l.has_token(); });
  }
  bool owns() const {
    return visit([](const auto& l) { return l.owns(); });
  }
  double remaining() const {
    return ms_to_seconds(visit([](const auto& l) { return l.remaining(); }));
  }
  std::string loss_reason() const {
    return distlock::to_string(visit([](const auto& l) { return l.loss_reason(); }));
  }
  std::string loss_detail() const {
    return visit([](const auto& l) { return l.loss_detail(); });
  }
  // The hold span's W3C traceparent (a Lease of a client with a tracer), else None.
  py::object traceparent() const {
    if (const auto* l = std::get_if<distlock::Lease>(&v_)) {
      if (auto ctx = l->trace_context()) return py::str(ctx->traceparent());
    }
    return py::none();
  }
  bool exclusive() const {
    if (const auto* rw = std::get_if<distlock::ReadWriteLease>(&v_)) return rw->exclusive();
    return true;
  }
  void on_lost(py::object cb) {
    auto fn = python_callback(std::move(cb));
    py::gil_scoped_release nogil;
    std::visit(
        [&](auto& l) {
          if constexpr (!std::is_same_v<std::decay_t<decltype(l)>, std::monostate>) l.on_lost(std::move(fn));
        },
        v_);
  }
  void release() {
    released_ = true;
    py::gil_scoped_release nogil;
    std::visit(
        [](auto& l) {
          if constexpr (!std::is_same_v<std::decay_t<decltype(l)>, std::monostate>) l.release();
        },
        v_);
  }
  distlock::Lease& lease() {
    auto* l = std::get_if<distlock::Lease>(&v_);
    if (l == nullptr) invalid("this lease is not a lock's or an election's");
    return *l;
  }

 private:
  // The destructor releases a held lease (network I/O): without the GIL, so that an on_lost
  // callback waiting for the GIL on the client's event thread cannot deadlock with it. At
  // shutdown nothing is touched (the lease then ends by its TTL, or with the process on file://).
  void drop() {
    if (std::holds_alternative<std::monostate>(v_)) return;
    if (released_) {  // nothing left to tell the server
      v_ = std::monostate{};
      return;
    }
    if (!python_alive()) {
      new std::variant<std::monostate, distlock::Lease, distlock::ReadWriteLease>(std::move(v_));
      return;
    }
    ReleaseIfHeld nogil;
    v_ = std::monostate{};
  }
  void cache_token() {
    std::visit(
        [&](const auto& l) {
          if constexpr (!std::is_same_v<std::decay_t<decltype(l)>, std::monostate>) {
            if (l.has_token()) token_ = l.token();
          }
        },
        v_);
  }
  std::variant<std::monostate, distlock::Lease, distlock::ReadWriteLease> v_;
  std::optional<std::uint64_t> token_;
  bool released_ = false;
  friend struct LeaseList;
  LeaseList* list_ = nullptr;
  PyLease* prev_ = nullptr;
  PyLease* next_ = nullptr;
};

void LeaseList::add(PyLease* l) noexcept {
  l->list_ = this;
  l->prev_ = nullptr;
  l->next_ = head;
  if (head != nullptr) head->prev_ = l;
  head = l;
}
void LeaseList::remove(PyLease* l) noexcept {
  if (l->prev_ != nullptr) {
    l->prev_->next_ = l->next_;
  } else {
    head = l->next_;
  }
  if (l->next_ != nullptr) l->next_->prev_ = l->prev_;
  l->list_ = nullptr;
  l->prev_ = l->next_ = nullptr;
}
template <class F>
void LeaseList::for_each(F&& f) {
  for (PyLease* l = head; l != nullptr; l = l->next_) f(l);
}
LeaseList::~LeaseList() {
  while (head != nullptr) remove(head);
}

// Several names held as one (Client::acquire_all). Calls that may touch the network run without
// the GIL; the destructor releases every name without it (see PyLease::drop).
class PyMultiLease {
 public:
  explicit PyMultiLease(distlock::MultiLease m) : m_(std::move(m)) {}
  PyMultiLease(const PyMultiLease&) = delete;
  PyMultiLease& operator=(const PyMultiLease&) = delete;
  ~PyMultiLease() {
    if (!m_) return;
    if (!python_alive()) {
      new distlock::MultiLease(std::move(*m_));  // at shutdown nothing is touched
      return;
    }
    ReleaseIfHeld nogil;
    m_.reset();
  }
  std::vector<std::string> names() const { return get().names(); }
  // name -> fencing token; empty where the backend has none.
  py::dict tokens() const {
    py::dict d;
    for (const distlock::Lease& l : get().leases()) {
      if (l.has_token()) d[py::str(l.name())] = l.token();
    }
    return d;
  }
  std::uint64_t token(const std::string& name) const { return get().token(name); }
  bool owns() const { return m_ && m_->owns(); }
  double remaining() const { return m_ ? ms_to_seconds(m_->remaining()) : 0.0; }
  // The first name lost (in the canonical order), its reason and detail; None while held.
  const distlock::Lease* lost_one() const {
    if (!m_) return nullptr;
    for (const distlock::Lease& l : m_->leases()) {
      if (l.loss_reason() != distlock::LossReason::none) return &l;
    }
    return nullptr;
  }
  py::object lost_name() const {
    const auto* l = lost_one();
    return l != nullptr ? py::object(py::str(l->name())) : py::none();
  }
  std::string loss_reason() const {
    const auto* l = lost_one();
    return distlock::to_string(l != nullptr ? l->loss_reason() : distlock::LossReason::none);
  }
  std::string loss_detail() const {
    const auto* l = lost_one();
    return l != nullptr ? l->loss_detail() : std::string();
  }
  // `cb` once when any one name is lost, on the client's event thread (each name's Lease::on_lost;
  // the first loss calls it, the others find it spent).
  void on_lost(py::object cb) {
    auto fn = python_callback(std::move(cb));
    auto once = std::make_shared<std::atomic<bool>>(false);
    distlock::MultiLease& m = get();
    py::gil_scoped_release nogil;
    for (const distlock::Lease& l : m.leases()) {
      // on_lost is not const; the leases belong to this multi-lease (never const objects).
      const_cast<distlock::Lease&>(l).on_lost([fn, once] {
        if (!once->exchange(true)) fn();
      });
    }
  }
  void release() {
    distlock::MultiLease& m = get();
    py::gil_scoped_release nogil;
    m.release();
  }

 private:
  distlock::MultiLease& get() const {
    if (!m_) distlock::throw_error(distlock::errc::not_owner, "empty multi-lease");
    return *m_;
  }
  mutable std::optional<distlock::MultiLease> m_;
};

// ClientOptions::tracer for Python: each span is handed to `cb` as a dict, under the GIL, on the
// thread the library ends it on (docs/tracing.md); an exception goes to sys.unraisablehook.
class PyTracer final : public distlock::Tracer {
 public:
  explicit PyTracer(py::object cb) : ref_(std::move(cb)) {}
  void on_span(const distlock::Span& s) noexcept override {
    if (!python_alive()) return;
    try {
      py::gil_scoped_acquire gil;
      try {
        py::dict d;
        d["kind"] = distlock::to_string(s.kind);
        d["name"] = s.name;
        d["trace_id"] = s.context.trace_id_hex();
        d["span_id"] = s.context.span_id_hex();
        distlock::TraceContext parent = s.context;
        parent.span_id = s.parent_span_id;
        d["parent_span_id"] = parent.valid() ? py::object(py::str(parent.span_id_hex())) : py::none();
        d["traceparent"] = s.context.traceparent();
        d["duration"] = std::chrono::duration<double>(s.end - s.start).count();
        d["start_unix_nano"] =
            std::chrono::duration_cast<std::chrono::nanoseconds>(s.start_wall.time_since_epoch()).count();
        d["end_unix_nano"] =
            std::chrono::duration_cast<std::chrono::nanoseconds>(s.end_wall.time_since_epoch()).count();
        d["lock_name"] = s.lock_name;
        d["token"] = s.token ? py::object(py::int_(*s.token)) : py::none();
        d["owner"] = s.owner;
        d["holder_info"] = s.holder_info;
        d["backend"] = s.backend;
        d["outcome"] = distlock::to_string(s.outcome);
        d["error"] = s.error ? py::object(py::str(s.error.message())) : py::none();
        d["loss_reason"] = s.loss_reason == distlock::LossReason::none
                               ? py::none()
                               : py::object(py::str(distlock::to_string(s.loss_reason)));
        d["detail"] = s.detail;
        d["batch_size"] = s.batch_size;
        py::handle(ref_.get())(d);
      } catch (py::error_already_set& e) {
        e.discard_as_unraisable("distlock tracer");
      }
    } catch (...) {  // no memory for the dict: the span is dropped, never the lock's failure
    }
  }

 private:
  PyRef ref_;
};

// Lock options for one call: the client's defaults, with the caller's values over them. The last
// three only for lock() and lock_all() (None elsewhere).
struct LockArgs {
  py::object ttl, wait, max_hold, holder_info;
  py::object lock_delay = py::none(), on_queue_position = py::none(), traceparent = py::none();
};

// Closes an on_queue_position callback when its acquire returns: the library posts each report to
// the client's event thread, where one could run after the wait ended. The flag is read with the
// GIL held and cleared with it held, so no report reaches Python after lock() returned.
struct QueueGate {
  std::atomic<bool> open{true};
};
struct CloseGate {
  std::shared_ptr<QueueGate> gate;
  ~CloseGate() {
    if (gate) gate->open = false;
  }
};

// LockOptions::on_queue_position over a Python callable `cb(position, ahead)` (`ahead` a dict as
// status()'s waiter_list entries), run under the GIL on the client's event thread; an exception
// from it goes to sys.unraisablehook and the wait goes on.
std::function<void(std::size_t, const distlock::WaiterInfo&)> queue_callback(
    py::object cb, std::shared_ptr<QueueGate> gate) {
  auto ref = std::make_shared<PyRef>(std::move(cb));
  return [ref, gate](std::size_t position, const distlock::WaiterInfo& ahead) {
    if (!gate->open || !python_alive()) return;
    py::gil_scoped_acquire gil;
    if (!gate->open) return;
    try {
      py::dict w;
      w["position"] = ahead.position;
      w["owner"] = ahead.owner;
      w["holder_info"] = ahead.holder_info ? py::object(py::str(*ahead.holder_info)) : py::none();
      w["waiting_since"] =
          ahead.waiting_since
              ? py::object(py::float_(
                    std::chrono::duration<double>(ahead.waiting_since->time_since_epoch()).count()))
              : py::none();
      py::handle(ref->get())(position, w);
    } catch (py::error_already_set& e) {
      e.discard_as_unraisable("distlock on_queue_position callback");
    }
  };
}

class PyClient {
 public:
  PyClient(const std::string& url, const py::object& connect_timeout, const py::object& command_timeout,
           const LockArgs& defaults, const py::object& tracer, const py::object& traceparent) {
    distlock::ClientOptions o;
    if (!tracer.is_none()) o.tracer = std::make_shared<PyTracer>(tracer);
    if (!traceparent.is_none()) o.traceparent = traceparent.cast<std::string>();
    if (auto t = optional_seconds(connect_timeout, "connect_timeout")) o.connect_timeout = *t;
    if (auto t = optional_seconds(command_timeout, "command_timeout")) o.command_timeout = *t;
    defaults_ = apply(o.lock_defaults, defaults);
    o.lock_defaults = defaults_;
    py::gil_scoped_release nogil;
    client_.emplace(distlock::connect(url, o));
  }
  ~PyClient() {
    if (!client_) return;
    if (!python_alive()) {
      new distlock::Client(std::move(*client_));
      return;
    }
    ReleaseIfHeld nogil;
    client_.reset();
  }

  void close() {
    // Taken out under the GIL (other threads read client_ under it), dropped without it.
    if (!client_) return;
    distlock::Client c = std::move(*client_);
    client_.reset();
    py::gil_scoped_release nogil;
    distlock::Client dropped = std::move(c);  // destroyed first, without the GIL
  }
  bool closed() const { return !client_.has_value(); }

  // Records a lease returned to Python (GIL held), for release_tracked().
  std::unique_ptr<PyLease> track(std::unique_ptr<PyLease> l) {
    if (l) leases_.add(l.get());
    return l;
  }
  // Releases every lease this client returned that Python still holds (errors ignored: a lost
  // lease has nothing to release). Each lease's Python object is held meanwhile, since a release
  // runs without the GIL.
  void release_tracked() {
    std::vector<py::object> alive;
    leases_.for_each([&](PyLease* l) { alive.push_back(py::cast(l, py::return_value_policy::reference)); });
    for (auto& o : alive) {
      try {
        o.cast<PyLease&>().release();
      } catch (const std::exception&) {
        // Lost, or the server unreachable: the lease ends by its TTL.
      }
    }
  }

  std::unique_ptr<PyLease> acquire(const std::string& name, const LockArgs& a, Canceller* cancel) {
    distlock::LockOptions opts = options(a);
    CloseGate closing;  // destroyed with the GIL held, after the wait: no report comes later
    if (!a.on_queue_position.is_none()) {
      closing.gate = std::make_shared<QueueGate>();
      opts.on_queue_position = queue_callback(a.on_queue_position, closing.gate);
    }
    distlock::Client c = get();
    if (opts.wait && *opts.wait <= Millis(0)) {
      py::gil_scoped_release nogil;
      return std::make_unique<PyLease>(c.acquire(name, opts));
    }
    // One attempt first, here: an uncontended lock costs no helper thread.
    if (cancel == nullptr && on_main_thread()) {
      const auto start = std::chrono::steady_clock::now();
      std::optional<distlock::Lease> l;
      {
        py::gil_scoped_release nogil;
        l = c.try_acquire(name, opts);
      }
      if (l) return std::make_unique<PyLease>(std::move(*l));
      if (opts.wait) {
        const auto spent = std::chrono::duration_cast<Millis>(std::chrono::steady_clock::now() - start);
        opts.wait = std::max(Millis(1), *opts.wait - spent);
      }
    }
    return cancellable(cancel, [c, name, opts](std::stop_token stop) mutable {
      distlock::LockOptions o = opts;
      o.cancel = stop;
      return std::make_unique<PyLease>(c.acquire(name, o));
    });
  }

  std::unique_ptr<PyLease> try_acquire(const std::string& name, const LockArgs& a) {
    distlock::LockOptions opts = options(a);
    distlock::Client c = get();
    py::gil_scoped_release nogil;
    auto l = c.try_acquire(name, opts);
    if (!l) return nullptr;
    return std::make_unique<PyLease>(std::move(*l));
  }

  std::unique_ptr<PyMultiLease> acquire_all(const std::vector<std::string>& names, const LockArgs& a,
                                            Canceller* cancel) {
    distlock::LockOptions opts = options(a);
    distlock::Client c = get();
    if (opts.wait && *opts.wait <= Millis(0)) {
      py::gil_scoped_release nogil;
      return std::make_unique<PyMultiLease>(c.acquire_all(names, opts));
    }
    return cancellable(cancel, [c, names, opts](std::stop_token stop) mutable {
      distlock::LockOptions o = opts;
      o.cancel = stop;
      return std::make_unique<PyMultiLease>(c.acquire_all(names, o));
    });
  }

  int semaphore_check(const std::string& name, int permits, const LockArgs& a) {
    distlock::LockOptions opts = options(a);
    distlock::Client c = get();
    py::gil_scoped_release nogil;
    return c.semaphore(name, permits, opts).permits();
  }

  // try_only: one attempt, nullptr when every permit is held; otherwise acquire() (with a wait
  // of 0 it throws errc::busy, as in C++).
  std::unique_ptr<PyLease> semaphore_acquire(const std::string& name, int permits, const LockArgs& a,
                                             Canceller* cancel, bool try_only) {
    distlock::LockOptions opts = options(a);
    distlock::Client c = get();
    if (try_only) {
      py::gil_scoped_release nogil;
      auto l = c.semaphore(name, permits, opts).try_acquire();
      if (!l) return nullptr;
      return std::make_unique<PyLease>(std::move(*l));
    }
    if (opts.wait && *opts.wait <= Millis(0)) {
      py::gil_scoped_release nogil;
      return std::make_unique<PyLease>(c.semaphore(name, permits, opts).acquire());
    }
    return cancellable(cancel, [c, name, permits, opts](std::stop_token stop) mutable {
      distlock::LockOptions o = opts;
      o.cancel = stop;
      return std::make_unique<PyLease>(c.semaphore(name, permits, o).acquire());
    });
  }

  std::size_t semaphore_available(const std::string& name, int permits) {
    distlock::Client c = get();
    py::gil_scoped_release nogil;
    return c.semaphore(name, permits, defaults_).available();
  }

  std::unique_ptr<PyLease> rw_acquire(const std::string& name, bool exclusive, int max_readers,
                                      const LockArgs& a, Canceller* cancel) {
    distlock::LockOptions opts = options(a);
    distlock::Client c = get();
    auto take = [c, name, opts, max_readers, exclusive](std::stop_token stop) mutable {
      distlock::LockOptions o = opts;
      o.cancel = stop;
      distlock::SharedMutex m(c, name, o, max_readers);
      return std::make_unique<PyLease>(exclusive ? m.acquire_exclusive() : m.acquire_shared());
    };
    if (opts.wait && *opts.wait <= Millis(0)) {
      py::gil_scoped_release nogil;
      return take(std::stop_token{});
    }
    return cancellable(cancel, take);
  }

  std::unique_ptr<PyLease> campaign(const std::string& name, const std::string& value, const LockArgs& a,
                                    Canceller* cancel) {
    distlock::LockOptions opts = options(a);
    distlock::Client c = get();
    auto take = [c, name, value, opts](std::stop_token stop) mutable {
      distlock::LockOptions o = opts;
      o.cancel = stop;
      return std::make_unique<PyLease>(c.election(name, o).campaign(value));
    };
    if (opts.wait && *opts.wait <= Millis(0)) {
      py::gil_scoped_release nogil;
      return take(std::stop_token{});
    }
    return cancellable(cancel, take);
  }

  void resign(const std::string& name, PyLease& lease) {
    distlock::Client c = get();
    distlock::Lease& l = lease.lease();
    py::gil_scoped_release nogil;
    c.election(name, defaults_).resign(l);
  }

  void proclaim(const std::string& name, PyLease& lease, const std::string& value) {
    distlock::Client c = get();
    distlock::Lease& l = lease.lease();
    py::gil_scoped_release nogil;
    c.election(name, defaults_).proclaim(l, value);
  }

  py::object leader(const std::string& name) {
    distlock::Client c = get();
    std::optional<distlock::Leader> l;
    {
      py::gil_scoped_release nogil;
      l = c.election(name, defaults_).leader();
    }
    return leader_dict(l);
  }

  py::object observe(const std::string& name, const py::object& after_term, const py::object& wait,
                     Canceller* cancel) {
    distlock::Client c = get();
    std::optional<std::uint64_t> after;
    if (!after_term.is_none()) after = after_term.cast<std::uint64_t>();
    std::optional<Millis> w = optional_seconds(wait, "wait");
    auto l = cancellable(cancel, [c, name, after, w, o = defaults_](std::stop_token stop) mutable {
      o.cancel = stop;
      return c.election(name, o).observe(after, w);
    });
    return leader_dict(l);
  }

  py::dict status(const std::string& name) {
    distlock::Client c = get();
    distlock::LockInfo info;
    {
      py::gil_scoped_release nogil;
      info = c.status(name);
    }
    py::dict d;
    d["held"] = info.held;
    d["token"] = info.token ? py::object(py::int_(*info.token)) : py::object(py::none());
    d["ttl_remaining"] = info.ttl_remaining ? py::object(py::float_(ms_to_seconds(*info.ttl_remaining)))
                                            : py::object(py::none());
    d["holder"] = info.holder ? py::object(py::str(*info.holder)) : py::object(py::none());
    d["holder_info"] = info.holder_info ? py::object(py::str(*info.holder_info)) : py::object(py::none());
    d["waiters"] = info.waiters ? py::object(py::int_(*info.waiters)) : py::object(py::none());
    // The queue in hand-off order; None where the backend does not list it.
    py::object queue = py::none();
    if (info.waiters_listed) {
      py::list l;
      for (const distlock::WaiterInfo& w : info.waiter_list) {
        py::dict e;
        e["position"] = py::int_(w.position);
        e["owner"] = py::str(w.owner);
        e["holder_info"] = w.holder_info ? py::object(py::str(*w.holder_info)) : py::object(py::none());
        e["waiting_since"] =
            w.waiting_since ? py::object(py::float_(
                                  std::chrono::duration<double>(w.waiting_since->time_since_epoch()).count()))
                            : py::object(py::none());
        l.append(std::move(e));
      }
      queue = std::move(l);
    }
    d["waiter_list"] = std::move(queue);
    return d;
  }

  bool revoke(const std::string& name, const std::string& reason) {
    distlock::Client c = get();
    py::gil_scoped_release nogil;
    return c.revoke(name, reason).revoked;
  }

  std::string url() const { return get_const().url(); }
  std::string scheme() const { return get_const().scheme(); }
  std::string id() const { return get_const().id(); }
  bool has_fencing() const { return get_const().has_fencing(); }
  // The client's lock defaults (ttl, max_hold, holder_info as given to connect()).
  const distlock::LockOptions& defaults() const { return defaults_; }
  // A copy of the handle (cheap: it shares the connections), so that close() on another thread
  // cannot pull the client from under a call that runs without the GIL.
  distlock::Client get() const {
    if (!client_) throw py::value_error("the distlock client is closed");
    return *client_;
  }

 private:
  const distlock::Client& get_const() const {
    if (!client_) throw py::value_error("the distlock client is closed");
    return *client_;
  }
  static py::object leader_dict(const std::optional<distlock::Leader>& l) {
    if (!l) return py::none();
    py::dict d;
    d["value"] = py::bytes(l->value);
    d["term"] = l->term;
    d["holder"] = l->holder;
    d["value_known"] = l->value_known;
    d["ttl_remaining"] =
        l->ttl_remaining ? py::object(py::float_(ms_to_seconds(*l->ttl_remaining))) : py::object(py::none());
    return d;
  }
  static distlock::LockOptions apply(distlock::LockOptions o, const LockArgs& a) {
    if (!a.ttl.is_none()) o.ttl = seconds_to_ms(a.ttl.cast<double>(), "ttl");
    if (!a.wait.is_none()) {
      o.wait = std::max(Millis(0), seconds_to_ms(a.wait.cast<double>(), "wait"));
    }
    if (!a.max_hold.is_none()) o.max_hold = seconds_to_ms(a.max_hold.cast<double>(), "max_hold");
    if (!a.holder_info.is_none()) o.holder_info = a.holder_info.cast<std::string>();
    if (!a.lock_delay.is_none()) {
      const double d = a.lock_delay.cast<double>();
      o.lock_delay = seconds_to_ms(d, "lock_delay");
      if (d < 0 && o.lock_delay.count() == 0) o.lock_delay = Millis(-1);  // still negative: refused
    }
    if (!a.traceparent.is_none()) o.traceparent = a.traceparent.cast<std::string>();
    return o;
  }
  distlock::LockOptions options(const LockArgs& a) const { return apply(defaults_, a); }

  std::optional<distlock::Client> client_;
  distlock::LockOptions defaults_;
  LeaseList leases_;
};

LockArgs lock_args(py::object ttl, py::object wait, py::object max_hold, py::object holder_info) {
  LockArgs a;
  a.ttl = std::move(ttl);
  a.wait = std::move(wait);
  a.max_hold = std::move(max_hold);
  a.holder_info = std::move(holder_info);
  return a;
}

// The optional Canceller argument of the waits, taken as a plain object: a `Canceller*` parameter
// makes pybind11 treat None as a failed match on its first, non-converting pass (after a failed
// attribute lookup on NoneType that builds an AttributeError), then convert every argument again
// on a second pass -- about 0.4 us per call on the uncontended acquire path
// (docs/benchmarks.md).
Canceller* canceller(const py::handle& o) {
  return o.is_none() ? nullptr : o.cast<Canceller*>();
}

// One shard of an assignment: its index, token and stop token. Python's callbacks for the stop
// are std::stop_callbacks held here; they run on the thread that stops the shard (the group's,
// a lease's event thread, or the one inside leave(), which always runs without the GIL) and take
// the GIL there. They are dropped without the GIL (a running one waits for it).
class PyOwnedShard {
 public:
  explicit PyOwnedShard(distlock::OwnedShard s) : s_(std::move(s)) {}
  PyOwnedShard(const PyOwnedShard&) = delete;
  PyOwnedShard& operator=(const PyOwnedShard&) = delete;
  ~PyOwnedShard() {
    if (!python_alive()) {
      for (auto& cb : callbacks_) (void)cb.release();  // leaked at shutdown, on purpose
      return;
    }
    ReleaseIfHeld nogil;
    callbacks_.clear();
  }
  std::uint32_t index() const { return s_.index; }
  py::object token_or_none() const {
    return s_.token ? py::object(py::int_(*s_.token)) : py::object(py::none());
  }
  bool owns() const { return s_.held(); }  // never late: the lease's deadline, read now
  // Runs cb() once when this member stops owning the shard (at once, here, if it already has).
  void on_stop(py::object cb) {
    auto fn = python_callback(std::move(cb));
    py::gil_scoped_release nogil;
    callbacks_.push_back(std::make_unique<std::stop_callback<std::function<void()>>>(s_.stop, std::move(fn)));
  }

 private:
  distlock::OwnedShard s_;
  std::vector<std::unique_ptr<std::stop_callback<std::function<void()>>>> callbacks_;
};

// (version, members, [PyOwnedShard]) for the Python layer. GIL held.
py::tuple assignment_tuple(const distlock::ShardAssignment& a) {
  py::list shards;
  for (const auto& s : a.shards) shards.append(py::cast(std::make_unique<PyOwnedShard>(s)));
  return py::make_tuple(a.version, a.members, shards);
}

// A member of a shard group. Every call into the group runs without the GIL (the group's thread
// may hold its mutex while a shard's stop callback waits for the GIL); on_change runs on the
// group's thread and takes the GIL only for the Python callback.
class PyShardGroup {
 public:
  PyShardGroup(PyClient& client, const std::string& job, std::uint32_t shards, const py::object& ttl,
               const py::object& max_hold, const py::object& rebalance_period, const py::object& member_id,
               const py::object& info, const py::object& on_change) {
    distlock::Client c = client.get();
    distlock::ShardGroupOptions o;
    o.lock = client.defaults();
    if (!ttl.is_none()) o.lock.ttl = seconds_to_ms(ttl.cast<double>(), "ttl");
    if (!max_hold.is_none()) o.lock.max_hold = seconds_to_ms(max_hold.cast<double>(), "max_hold");
    if (!rebalance_period.is_none())
      o.rebalance_period = seconds_to_ms(rebalance_period.cast<double>(), "rebalance_period");
    if (!member_id.is_none()) {
      o.member_id = member_id.cast<std::string>();
      if (o.member_id.empty()) invalid("shard group: member_id is empty");
    }
    if (!info.is_none()) o.info = info.cast<std::string>();
    if (!on_change.is_none()) {
      auto ref = std::make_shared<PyRef>(on_change);
      o.on_change = [ref](const distlock::ShardAssignment& a) {
        if (!python_alive()) return;
        py::gil_scoped_acquire gil;
        try {
          py::handle(ref->get())(assignment_tuple(a));
        } catch (py::error_already_set& e) {
          e.discard_as_unraisable("distlock shard group on_change callback");
        }
      };
    }
    py::gil_scoped_release nogil;
    group_.emplace(c.shard_group(job, shards, o));
  }
  PyShardGroup(const PyShardGroup&) = delete;
  PyShardGroup& operator=(const PyShardGroup&) = delete;
  ~PyShardGroup() {
    if (!group_) return;
    ReleaseIfHeld nogil;
    group_.reset();  // leaves
  }

  py::tuple assigned() const {
    if (left_) throw_left();
    distlock::ShardAssignment a;
    {
      py::gil_scoped_release nogil;
      a = group_->assigned();
    }
    return assignment_tuple(a);
  }
  // The assignment once its version is greater than after_version, or None when `timeout`
  // (seconds; None: no limit) passed first. NotOwner once the member left. On the main thread a
  // signal whose handler raises ends the wait (checked every 100 ms).
  py::object wait_change(std::uint64_t after_version, const py::object& timeout) {
    std::optional<Millis> limit = optional_seconds(timeout, "timeout");
    const auto deadline = std::chrono::steady_clock::now() + limit.value_or(Millis(0));
    const bool main = on_main_thread();
    for (;;) {
      if (left_) throw_left();
      Millis slice = main ? Millis(100) : distlock::LockOptions::max_wait;
      if (limit) {
        const auto rest = std::chrono::ceil<Millis>(deadline - std::chrono::steady_clock::now());
        slice = std::clamp(rest, Millis(0), slice);
      }
      distlock::ShardAssignment a;
      bool left = false;
      {
        py::gil_scoped_release nogil;
        a = group_->wait_change(after_version, slice);
        left = left_;
      }
      if (left) throw_left();
      if (a.version > after_version) return assignment_tuple(a);
      if (limit && std::chrono::steady_clock::now() >= deadline) return py::none();
      if (main && PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
  }
  void leave() {
    py::gil_scoped_release nogil;
    left_ = true;
    group_->leave();
  }
  bool left() const { return left_; }
  std::string member_id() const { return group_->member_id(); }
  std::string job() const { return group_->job(); }
  std::uint32_t shards() const { return group_->shards(); }
  py::dict stats() const {
    distlock::ShardGroupStats st;
    {
      py::gil_scoped_release nogil;
      st = group_->stats();
    }
    py::dict d;
    d["shards_owned"] = st.shards_owned;
    d["rebalances"] = st.rebalances;
    d["shards_taken"] = st.shards_taken;
    d["shards_given_up"] = st.shards_given_up;
    d["shards_lost"] = st.shards_lost;
    d["membership_lost"] = st.membership_lost;
    d["list_failures"] = st.list_failures;
    d["rejoin_failures"] = st.rejoin_failures;
    d["watching"] = st.watching;
    d["watch_gaps"] = st.watch_gaps;
    d["safety_relists"] = st.safety_relists;
    d["last_rebalance_time"] = st.last_rebalance_time
                                   ? py::object(py::float_(ms_to_seconds(*st.last_rebalance_time)))
                                   : py::object(py::none());
    return d;
  }
  std::string metrics() const {
    py::gil_scoped_release nogil;
    return group_->metrics();
  }

 private:
  [[noreturn]] void throw_left() const {
    distlock::throw_error(distlock::errc::not_owner, "shard group \"" + group_->job() + "\": this member (" +
                                                         group_->member_id() + ") has left the group");
  }
  std::optional<distlock::ShardGroup> group_;
  std::atomic<bool> left_{false};
};

#if DISTLOCK_HAS_IDS
class PySnowflake {
 public:
  PySnowflake(PyClient& client, const std::string& prefix, const py::object& ttl) {
    distlock::ids::SnowflakeOptions o;
    o.prefix = prefix;
    if (!ttl.is_none()) o.lease.ttl = seconds_to_ms(ttl.cast<double>(), "ttl");
    distlock::Client c = client.get();
    py::gil_scoped_release nogil;
    gen_ = std::make_unique<distlock::ids::SnowflakeGenerator>(std::move(c), o);
  }
  ~PySnowflake() { close(); }
  void close() {
    if (!gen_) return;
    if (!python_alive()) {
      (void)gen_.release();
      return;
    }
    ReleaseIfHeld nogil;
    gen_.reset();
  }
  std::uint64_t next() {
    auto& g = get();
    py::gil_scoped_release nogil;
    return g.next();
  }
  std::vector<std::uint64_t> next_batch(std::size_t n) {
    auto& g = get();
    std::vector<std::uint64_t> out(n);
    py::gil_scoped_release nogil;
    g.next_batch(out);
    return out;
  }
  void relet() {
    auto& g = get();
    py::gil_scoped_release nogil;
    g.relet();
  }
  unsigned worker_id() { return get().worker_id(); }
  bool leased() { return get().leased(); }

 private:
  distlock::ids::SnowflakeGenerator& get() {
    if (!gen_) throw py::value_error("the snowflake generator is closed");
    return *gen_;
  }
  std::unique_ptr<distlock::ids::SnowflakeGenerator> gen_;
};

class PyRedisDaily {
 public:
  PyRedisDaily(const std::string& url, const std::string& prefix, std::uint32_t reserve) {
    distlock::ids::RedisDailyOptions o;
    o.prefix = prefix;
    o.reserve = reserve;
    py::gil_scoped_release nogil;
    gen_ = std::make_unique<distlock::ids::RedisDailyGenerator>(url, o);
  }
  ~PyRedisDaily() {
    if (!python_alive()) {
      (void)gen_.release();
      return;
    }
    ReleaseIfHeld nogil;
    gen_.reset();
  }
  std::uint64_t next() {
    py::gil_scoped_release nogil;
    return gen_->next();
  }

 private:
  std::unique_ptr<distlock::ids::RedisDailyGenerator> gen_;
};

class PySegment {
 public:
  PySegment(const std::string& url, const std::string& tag, std::int64_t step) {
    distlock::ids::SegmentOptions o;
    o.tag = tag;
    o.step = step;
    py::gil_scoped_release nogil;
    gen_ = std::make_unique<distlock::ids::SegmentGenerator>(url, std::move(o));
  }
  ~PySegment() { close(); }
  // Stops the background fetcher (a take in flight ends within the timeouts) and closes the
  // connection.
  void close() {
    if (!gen_) return;
    if (!python_alive()) {
      (void)gen_.release();
      return;
    }
    ReleaseIfHeld nogil;
    gen_.reset();
  }
  std::uint64_t next() {
    auto& g = get();
    py::gil_scoped_release nogil;
    return g.next();
  }
  void set_step(std::int64_t step) { get().set_step(step); }
  std::int64_t step() { return get().options().step; }
  std::string tag() { return get().options().tag; }
  std::uint64_t round_trips() { return get().round_trips(); }

 private:
  distlock::ids::SegmentGenerator& get() {
    if (!gen_) throw py::value_error("the segment generator is closed");
    return *gen_;
  }
  std::unique_ptr<distlock::ids::SegmentGenerator> gen_;
};
#endif

}  // namespace

PYBIND11_MODULE(_distlock, m) {
  m.doc() = "The compiled part of distlock (use the `distlock` package).";
  g_main_thread = py::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>();

  // Errors: by code, to the classes of distlock._errors.
  // Kept for the life of the process (never destroyed: a static py::object would be dropped
  // after the interpreter is gone).
  static PyObject* by_code =
      py::module_::import("distlock._errors").attr("BY_CODE").cast<py::object>().release().ptr();
  static PyObject* base_error =
      py::module_::import("distlock._errors").attr("Error").cast<py::object>().release().ptr();
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const std::system_error& e) {
      if (e.code().category() != distlock::category()) {
        PyErr_SetString(PyExc_OSError, e.what());
        return;
      }
      py::object cls = py::handle(by_code).attr("get")(e.code().value(), py::handle(base_error));
      PyErr_SetString(cls.ptr(), e.what());
    }
  });

  // Callbacks stop taking the GIL before the interpreter shuts down.
  // Before that, waits interrupted by a signal finish withdrawing what they queued (up to 5 s).
  py::module_::import("atexit").attr("register")(py::cpp_function([] {
    {
      py::gil_scoped_release nogil;
      wait_for_withdrawals(std::chrono::seconds(5));
    }
    g_python_alive = false;
  }));

  py::class_<Canceller>(m, "Canceller", "Ends one wait from any thread.")
      .def(py::init<>())
      .def("cancel", &Canceller::cancel, "Requests the wait to end (errc::cancelled).")
      .def_property_readonly("cancelled", &Canceller::cancelled);

  py::class_<PyLease>(m, "Lease", "A held lease (see distlock.Lease).")
      .def_property_readonly("name", &PyLease::name)
      .def_property_readonly("token", &PyLease::token)
      .def_property_readonly("token_or_none", &PyLease::token_or_none)
      .def_property_readonly("has_token", &PyLease::has_token)
      .def_property_readonly("owns", &PyLease::owns)
      .def_property_readonly("remaining", &PyLease::remaining)
      .def_property_readonly("loss_reason", &PyLease::loss_reason)
      .def_property_readonly("loss_detail", &PyLease::loss_detail)
      .def_property_readonly("exclusive", &PyLease::exclusive)
      .def_property_readonly("traceparent", &PyLease::traceparent)
      .def("on_lost", &PyLease::on_lost)
      .def("release", &PyLease::release);

  py::class_<PyMultiLease>(m, "MultiLease", "Several names held as one (see distlock.MultiLease).")
      .def_property_readonly("names", &PyMultiLease::names)
      .def_property_readonly("tokens", &PyMultiLease::tokens)
      .def("token", &PyMultiLease::token)
      .def_property_readonly("owns", &PyMultiLease::owns)
      .def_property_readonly("remaining", &PyMultiLease::remaining)
      .def_property_readonly("lost_name", &PyMultiLease::lost_name)
      .def_property_readonly("loss_reason", &PyMultiLease::loss_reason)
      .def_property_readonly("loss_detail", &PyMultiLease::loss_detail)
      .def("on_lost", &PyMultiLease::on_lost)
      .def("release", &PyMultiLease::release);

  py::class_<PyClient>(m, "Client", "A connection to one lock service (see distlock.Client).")
      .def(py::init([](const std::string& url, py::object connect_timeout, py::object command_timeout,
                       py::object ttl, py::object wait, py::object max_hold, py::object holder_info,
                       py::object tracer, py::object traceparent) {
             return std::make_unique<PyClient>(url, connect_timeout, command_timeout,
                                               lock_args(ttl, wait, max_hold, holder_info), tracer,
                                               traceparent);
           }),
           py::arg("url"), py::arg("connect_timeout"), py::arg("command_timeout"), py::arg("ttl"),
           py::arg("wait"), py::arg("max_hold"), py::arg("holder_info"), py::arg("tracer") = py::none(),
           py::arg("traceparent") = py::none())
      .def("close", &PyClient::close)
      .def("release_tracked", &PyClient::release_tracked)
      .def_property_readonly("closed", &PyClient::closed)
      .def(
          "acquire",
          [](PyClient& c, const std::string& name, py::object ttl, py::object wait, py::object max_hold,
             py::object holder_info, const py::object& cancel, py::object lock_delay,
             py::object on_queue_position, py::object traceparent) {
            LockArgs a = lock_args(ttl, wait, max_hold, holder_info);
            a.lock_delay = std::move(lock_delay);
            a.on_queue_position = std::move(on_queue_position);
            a.traceparent = std::move(traceparent);
            return c.track(c.acquire(name, a, canceller(cancel)));
          },
          py::arg("name"), py::arg("ttl"), py::arg("wait"), py::arg("max_hold"), py::arg("holder_info"),
          py::arg("cancel"), py::arg("lock_delay") = py::none(), py::arg("on_queue_position") = py::none(),
          py::arg("traceparent") = py::none())
      .def(
          "acquire_all",
          [](PyClient& c, const std::vector<std::string>& names, py::object ttl, py::object wait,
             py::object max_hold, py::object holder_info, py::object lock_delay, py::object traceparent,
             const py::object& cancel) {
            LockArgs a = lock_args(ttl, wait, max_hold, holder_info);
            a.lock_delay = std::move(lock_delay);
            a.traceparent = std::move(traceparent);
            return c.acquire_all(names, a, canceller(cancel));
          },
          py::arg("names"), py::arg("ttl"), py::arg("wait"), py::arg("max_hold"), py::arg("holder_info"),
          py::arg("lock_delay"), py::arg("traceparent"), py::arg("cancel"))
      .def(
          "try_acquire",
          [](PyClient& c, const std::string& name, py::object ttl, py::object max_hold,
             py::object holder_info) {
            return c.track(c.try_acquire(name, lock_args(ttl, py::none(), max_hold, holder_info)));
          },
          py::arg("name"), py::arg("ttl"), py::arg("max_hold"), py::arg("holder_info"))
      .def(
          "semaphore_check",
          [](PyClient& c, const std::string& name, int permits, py::object ttl) {
            return c.semaphore_check(name, permits, lock_args(ttl, py::none(), py::none(), py::none()));
          },
          py::arg("name"), py::arg("permits"), py::arg("ttl"))
      .def(
          "semaphore_acquire",
          [](PyClient& c, const std::string& name, int permits, py::object ttl, py::object wait,
             const py::object& cancel, bool try_only) {
            return c.track(c.semaphore_acquire(name, permits, lock_args(ttl, wait, py::none(), py::none()),
                                               canceller(cancel), try_only));
          },
          py::arg("name"), py::arg("permits"), py::arg("ttl"), py::arg("wait"), py::arg("cancel"),
          py::arg("try_only"))
      .def("semaphore_available", &PyClient::semaphore_available)
      .def(
          "rw_acquire",
          [](PyClient& c, const std::string& name, bool exclusive, int max_readers, py::object ttl,
             py::object wait, const py::object& cancel) {
            return c.track(c.rw_acquire(name, exclusive, max_readers,
                                        lock_args(ttl, wait, py::none(), py::none()), canceller(cancel)));
          },
          py::arg("name"), py::arg("exclusive"), py::arg("max_readers"), py::arg("ttl"), py::arg("wait"),
          py::arg("cancel"))
      .def(
          "campaign",
          [](PyClient& c, const std::string& name, const std::string& value, py::object ttl, py::object wait,
             const py::object& cancel) {
            return c.track(
                c.campaign(name, value, lock_args(ttl, wait, py::none(), py::none()), canceller(cancel)));
          },
          py::arg("name"), py::arg("value"), py::arg("ttl"), py::arg("wait"), py::arg("cancel"))
      .def("resign", &PyClient::resign)
      .def("proclaim", &PyClient::proclaim)
      .def("leader", &PyClient::leader)
      .def(
          "observe",
          [](PyClient& c, const std::string& name, const py::object& after_term, const py::object& wait,
             const py::object& cancel) { return c.observe(name, after_term, wait, canceller(cancel)); },
          py::arg("name"), py::arg("after_term"), py::arg("wait"), py::arg("cancel"))
      .def("status", &PyClient::status)
      .def("revoke", &PyClient::revoke)
      .def_property_readonly("url", &PyClient::url)
      .def_property_readonly("scheme", &PyClient::scheme)
      .def_property_readonly("id", &PyClient::id)
      .def_property_readonly("has_fencing", &PyClient::has_fencing);

  py::class_<PyOwnedShard>(m, "OwnedShard", "One shard a member owns (see distlock.OwnedShard).")
      .def_property_readonly("index", &PyOwnedShard::index)
      .def_property_readonly("token_or_none", &PyOwnedShard::token_or_none)
      .def_property_readonly("owns", &PyOwnedShard::owns)
      .def("on_stop", &PyOwnedShard::on_stop);

  py::class_<PyShardGroup>(m, "ShardGroup", "A member of a shard group (see distlock.ShardGroup).")
      .def(py::init<PyClient&, const std::string&, std::uint32_t, const py::object&, const py::object&,
                    const py::object&, const py::object&, const py::object&, const py::object&>(),
           py::arg("client"), py::arg("job"), py::arg("shards"), py::arg("ttl"), py::arg("max_hold"),
           py::arg("rebalance_period"), py::arg("member_id"), py::arg("info"), py::arg("on_change"))
      .def("assigned", &PyShardGroup::assigned)
      .def("wait_change", &PyShardGroup::wait_change, py::arg("after_version"), py::arg("timeout"))
      .def("leave", &PyShardGroup::leave)
      .def_property_readonly("left", &PyShardGroup::left)
      .def_property_readonly("member_id", &PyShardGroup::member_id)
      .def_property_readonly("job", &PyShardGroup::job)
      .def_property_readonly("shards", &PyShardGroup::shards)
      .def("stats", &PyShardGroup::stats)
      .def("metrics", &PyShardGroup::metrics);

  m.def("default_url", [] { return distlock::default_url(); });
  // For bench/python/binding_bench.py: `ops` rounds of the C++ call a C++ program makes,
  // acquire(name) + release(), timed on the steady clock; nanoseconds per round.
  m.def("_bench_cpp_acquire_release", [](PyClient& c, const std::string& name, int ops, bool try_acquire) {
    distlock::Client client = c.get();
    std::vector<std::int64_t> ns;
    ns.reserve(static_cast<std::size_t>(std::max(ops, 0)));
    py::gil_scoped_release nogil;
    for (int i = 0; i < ops; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      distlock::Lease lease = try_acquire ? std::move(*client.try_acquire(name)) : client.acquire(name);
      lease.release();
      ns.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
                       .count());
    }
    return ns;
  });
  // The backends this build has (its components, distlock/config.hpp).
  py::dict components;
  components["file"] = bool(DISTLOCK_HAS_FILE);
  components["redis"] = bool(DISTLOCK_HAS_REDIS);
  components["rediscluster"] = bool(DISTLOCK_HAS_REDISCLUSTER);
  components["redlock"] = bool(DISTLOCK_HAS_REDLOCK);
  components["etcd"] = bool(DISTLOCK_HAS_ETCD);
  components["zk"] = bool(DISTLOCK_HAS_ZK);
  components["postgres"] = bool(DISTLOCK_HAS_POSTGRES);
  components["mysql"] = bool(DISTLOCK_HAS_MYSQL);
  components["ids"] = bool(DISTLOCK_HAS_IDS);
  m.attr("components") = components;
  m.attr("version") = distlock::kVersion;

#if DISTLOCK_HAS_IDS
  m.attr("has_ids") = true;
  py::class_<PySnowflake>(m, "Snowflake")
      .def(py::init<PyClient&, const std::string&, py::object>(), py::arg("client"), py::arg("prefix"),
           py::arg("ttl"))
      .def("next", &PySnowflake::next)
      .def("next_batch", &PySnowflake::next_batch)
      .def("relet", &PySnowflake::relet)
      .def("close", &PySnowflake::close)
      .def_property_readonly("worker_id", &PySnowflake::worker_id)
      .def_property_readonly("leased", &PySnowflake::leased);
  py::class_<PyRedisDaily>(m, "RedisDaily")
      .def(py::init<const std::string&, const std::string&, std::uint32_t>(), py::arg("url"),
           py::arg("prefix"), py::arg("reserve"))
      .def("next", &PyRedisDaily::next);
  py::class_<PySegment>(m, "Segment")
      .def(py::init<const std::string&, const std::string&, std::int64_t>(), py::arg("url"), py::arg("tag"),
           py::arg("step"))
      .def("next", &PySegment::next)
      .def("set_step", &PySegment::set_step)
      .def("close", &PySegment::close)
      .def_property_readonly("step", &PySegment::step)
      .def_property_readonly("tag", &PySegment::tag)
      .def_property_readonly("round_trips", &PySegment::round_trips);
  m.def("uuid7_next", [] {
    static distlock::ids::Uuid7Generator gen;
    auto u = gen.next();
    return py::bytes(reinterpret_cast<const char*>(u.bytes.data()), u.bytes.size());
  });
  m.def("decode_snowflake", [](std::uint64_t id) {
    auto p = distlock::ids::decode_snowflake(id);
    return py::make_tuple(p.unix_ms, p.worker, p.sequence);
  });
  m.def("decode_redis_daily", [](std::uint64_t id) {
    auto p = distlock::ids::decode_redis_daily(id);
    return py::make_tuple(p.unix_seconds, p.counter);
  });
#else
  m.attr("has_ids") = false;
#endif
}
