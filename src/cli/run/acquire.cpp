// `distlock run`: connect and acquire on a worker thread; the main thread keeps answering
// signals meanwhile. A terminating signal (systemd's or Kubernetes' SIGTERM, Ctrl-C)
// cancels the wait first (LockOptions::cancel), so the runner leaves the server's queue
// before it dies of the signal: a queued place left behind would hold up the next
// waiter until the server expires it (its TTL on etcd). Bounded: after kLeaveQueueLimit
// the runner dies anyway (the worker may be stuck connecting).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <stop_token>
#include <thread>

#include "cli/run/multi_hold.hpp"
#include "cli/run/run.hpp"
#include "distlock/semaphore.hpp"
#include "distlock/shared_mutex.hpp"
#include "distlock/text.hpp"

namespace distlock::cli::run {

namespace {

constexpr std::chrono::milliseconds kLeaveQueueLimit{3000};

/// --lock: the set of names. With a tracer, the set's span (multi_hold.hpp) begins before
/// acquire_all and is the parent of every name's spans; it ends here when the set is not taken.
std::unique_ptr<Hold> take_multi_hold(Client& client, const RunSettings& s, const LockOptions& lock) {
  if (!s.tracer) return std::make_unique<MultiHold>(client.acquire_all(s.names, lock));
  SetSpan span = SetSpan::begin(s.tracer, s.traceparent, s.name, url_scheme(client.url()));
  LockOptions traced = lock;
  traced.traceparent = span.context.traceparent();
  try {
    return std::make_unique<MultiHold>(client.acquire_all(s.names, traced), std::move(span));
  } catch (const std::system_error& e) {
    span.end_not_acquired(e.code(), e.what());
    throw;
  }
}

/// The hold the settings ask for, taken through `client`.
std::unique_ptr<Hold> take_hold(Client& client, const RunSettings& s, const LockOptions& lock) {
  // --lock: every name or none, in the canonical order, within --wait (multi_lease.hpp).
  if (!s.names.empty()) return take_multi_hold(client, s, lock);
  if (s.rw == RwMode::shared) {
    return std::make_unique<ReadWriteLease>(client.shared_mutex(s.name, lock).acquire_shared());
  }
  if (s.rw == RwMode::exclusive) {
    return std::make_unique<ReadWriteLease>(client.shared_mutex(s.name, lock).acquire_exclusive());
  }
  return std::make_unique<Lease>(s.acquire       ? s.acquire(client, s.name, lock)
                                 : s.permits > 0 ? client.semaphore(s.name, s.permits, lock).acquire()
                                                 : client.acquire(s.name, lock));
}

/// The worker thread's work: fills `result` (client and lease, or the error).
void connect_and_take(Acquisition& result, const RunSettings& s, const LockOptions& lock) {
  try {
    ClientOptions options = tool_client_options();
    // zk://: the session (whose timeout is the lease's real length: a killed runner
    // frees the lock when it ends) is sized to --ttl unless the URL sets session_timeout.
    options.lock_defaults.ttl = lock.ttl;
    options.tracer = s.tracer;
    options.traceparent = s.traceparent;  // checked by run_locked: valid, or empty
    Client client = connect(s.url, options);
    result.client = client;
    if (result.on_connected) result.on_connected(client);
    result.lease = take_hold(client, s, lock);
  } catch (const std::system_error& e) {
    result.ec = e.code();
    result.what = e.what();
  } catch (const std::exception& e) {
    result.ec = make_error_code(errc::protocol_error);
    result.what = e.what();
  } catch (...) {
    result.ec = make_error_code(errc::protocol_error);
    result.what = "unexpected error while acquiring " + lock_label(s);
  }
}

/// A terminating signal `sig` while the worker waits: cancel, give the worker
/// kLeaveQueueLimit to leave the queue, give back what it was granted meanwhile, die of it.
[[noreturn]] void cancel_and_die(int sig, std::thread& worker, std::stop_source& cancel,
                                 const std::shared_ptr<Acquisition>& result,
                                 const std::shared_ptr<std::atomic<bool>>& done, SignalFd& signals,
                                 Wakeup& wake) {
  cancel.request_stop();
  const auto until = std::chrono::steady_clock::now() + kLeaveQueueLimit;
  while (!done->load(std::memory_order_acquire) && std::chrono::steady_clock::now() < until) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    poll_for(signals, wake, static_cast<int>(std::max<std::int64_t>(1, left.count())));
    wake.drain();
    (void)signals.drain();  // the runner is dying of the first one already
  }
  if (!done->load(std::memory_order_acquire)) {
    worker.detach();  // still connecting: nothing queued yet that the exit would not end
    die_of_signal(sig);
  }
  worker.join();
  // Granted just before the cancel: given back before dying (a plain exit would
  // leave it to the server's expiry).
  result->lease.reset();
  result->client.reset();
  die_of_signal(sig);
}

}  // namespace

Acquisition connect_and_acquire(const RunSettings& s, SignalFd& signals, const std::shared_ptr<Wakeup>& wake,
                                std::function<void(const Client&)> on_connected) {
  auto result = std::make_shared<Acquisition>();
  auto done = std::make_shared<std::atomic<bool>>(false);  // the worker has set ec or lease
  result->on_connected = std::move(on_connected);
  std::stop_source cancel;
  LockOptions cancellable = s.lock;
  cancellable.cancel = cancel.get_token();
  std::thread worker([result, done, wake, s, lock = cancellable] {
    connect_and_take(*result, s, lock);
    done->store(true, std::memory_order_release);
    wake->notify();
  });
  for (;;) {
    poll_for(signals, *wake, -1);
    for (const auto& d : signals.drain()) {
      if (is_catchable_stop(d.signal)) ::kill(::getpid(), SIGSTOP);  // Ctrl-Z while waiting
      if (is_terminating(d.signal)) cancel_and_die(d.signal, worker, cancel, result, done, signals, *wake);
    }
    if (done->load(std::memory_order_acquire)) break;
  }
  worker.join();
  wake->drain();
  return std::move(*result);
}

std::string not_acquired_message(const RunSettings& s, const std::error_code& ec, const std::string& what) {
  const bool not_now = ec == errc::busy || ec == errc::timeout;
  const std::string attempt = ec == errc::busy ? std::string(" (one attempt, not waiting)")
                                               : " (not acquired within --wait " +
                                                     format_duration(s.lock.wait.value_or(Millis(0))) + ")";
  if (s.permits > 0 && not_now) {
    return "all " + std::to_string(s.permits) + " permits of semaphore \"" + s.name + "\" are held" + attempt;
  }
  if (s.rw != RwMode::none && not_now) {
    return "read-write lock \"" + s.name + "\" is held " +
           (s.rw == RwMode::shared ? std::string("by a writer (or a writer waits for it)")
                                   : std::string("by readers or a writer")) +
           attempt;
  }
  if (s.names.size() > 1 && not_now) {
    // All or nothing: none of the set is held now (acquire_all gave back what it took).
    return lock_label(s) + " were not all acquired" + attempt +
           ": another owner holds one of them; none is held";
  }
  if (ec == errc::busy) return lock_label(s) + " is held by another owner (one attempt, not waiting)";
  if (ec == errc::timeout) {
    return lock_label(s) + " was not acquired within --wait " + format_duration(*s.lock.wait) +
           ": another owner holds it";
  }
  return what;
}

}  // namespace distlock::cli::run
