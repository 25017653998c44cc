// redis/subscriber.hpp — one pub/sub connection and its thread, shared by every
// wait of a client.
//
// `watch(channel)` subscribes and returns only once the server confirmed the
// subscription, so a PUBLISH after it returns cannot be missed. Watches are
// counted per channel; the last `unwatch` unsubscribes. Every message calls
// `on_message(channel)` on the subscriber thread. When the connection breaks
// (server killed or restarted) every watched channel gets `on_message` at once
// (waiters re-check and see the outage); the thread then reconnects with backoff,
// subscribes again and calls `on_message` for every channel once more, because a
// release may have happened while nobody listened. A connection that dies silently
// (a partition: no FIN or RST reaches us) is found by PING: after kPingAfter without
// a byte from the server the thread sends PING, and a connection that stays silent
// for command_timeout after it is dropped (counted in silent_drops()) the same way.
//
// Thread-safety: watch/unwatch may be called from any thread. Callbacks run on the
// subscriber thread without any internal lock held, so they may call watch/unwatch.
// The destructor stops the thread promptly (it sleeps in poll() on the socket and
// an eventfd) and must not be called from a callback.
//
// Example:
//   Subscriber sub(conn_opts, [&](std::string_view ch) { wake_waiters_of(ch); });
//   detail::Error ec;
//   sub.watch("distlock:{job}:released", ec);   // live when it returns
//   if (ec) { /* nothing stays subscribed; ec.detail() names the server's answer */ }
//   ...
//   sub.unwatch("distlock:{job}:released");
//
// Sharded mode (Redis Cluster, `Subscriber(opts, on_message, on_dropped)`): the same
// with SSUBSCRIBE / SUNSUBSCRIBE / smessage. A node that stops serving a channel's
// slot (resharding, failover) unsubscribes it on its own (an `sunsubscribe` nobody
// asked for); the channel is then not subscribed again on this connection and
// `on_dropped(channel)` (then `on_message(channel)`) is called, so the owner can
// watch it on the slot's new node. A refused SSUBSCRIBE (MOVED after a reconnect)
// is reported the same way.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>

#include "engine/thread_annotations.hpp"
#include "engine/worker_loop.hpp"
#include "redis/connection.hpp"

namespace distlock::detail::redis {

class Subscriber {
 public:
  using Callback = std::function<void(std::string_view channel)>;
  /// A message and its payload (set_payload_handler).
  using PayloadCallback = std::function<void(std::string_view channel, std::string_view payload)>;

  Subscriber(ConnectionOptions opts, Callback on_message);
  /// Sharded pub/sub (Redis Cluster); see the banner for `on_dropped`.
  Subscriber(ConnectionOptions opts, Callback on_message, Callback on_dropped);
  ~Subscriber();
  Subscriber(const Subscriber&) = delete;
  Subscriber& operator=(const Subscriber&) = delete;

  /// Subscribes (counted) and waits for the confirmation, at most connect_timeout +
  /// command_timeout. On failure the watch does not count and nothing of it stays
  /// (no retry, no subscription; an unwatch() for it is a harmless no-op): `ec` is
  /// backend_unavailable (no connection, "max number of clients reached", no
  /// confirmation in time) or auth_failed (credentials, or the server refused the
  /// SUBSCRIBE, e.g. NOPERM for the channel), its detail naming the server and its
  /// answer.
  void watch(std::string_view channel, Error& ec);
  void unwatch(std::string_view channel) noexcept;

  /// watch() in two steps, for a caller that subscribes on several servers at once
  /// (Redlock): begin_watch counts the watch and asks the thread to subscribe;
  /// await_watch waits until the subscription is live (true) or fails, at the latest
  /// at `deadline`, with `ec` as for watch(). On failure the watch is undone
  /// unless `keep_on_failure`: then it stays counted, the thread keeps subscribing
  /// (reconnecting with backoff), and only unwatch() ends it.
  struct WatchStart {
    std::uint64_t refusals = 0;
    std::uint64_t failures = 0;
    std::chrono::steady_clock::time_point at{};
  };
  WatchStart begin_watch(std::string_view channel);
  bool await_watch(std::string_view channel, const WatchStart& started,
                   std::chrono::steady_clock::time_point deadline, bool keep_on_failure, Error& ec);

  /// Messages on `channel` go to `handler` with their payload instead of to
  /// on_message; on_message(channel) still reports a broken or renewed subscription
  /// (messages may have been missed). Call before the first watch of `channel`.
  void set_payload_handler(std::string channel, PayloadCallback handler);
  /// As set_payload_handler, for every channel whose name starts with `prefix` (a
  /// redis+cluster:// prefix watch: one channel per slot). Replaces set_payload_handler's.
  void set_payload_prefix_handler(std::string prefix, PayloadCallback handler);

  /// Watched channels whose subscription is not live on the current connection (not
  /// sent, not confirmed, refused, dropped by the server, or no connection).
  std::size_t pending() const;

  /// Why the subscriber connection (or a watch) last failed: no error if it never did;
  /// the detail names the server.
  Error last_failure() const;
  /// Number of times the connection was (re)established (for tests).
  std::uint64_t connects() const;
  /// Connections dropped because they did not answer a PING in time.
  std::uint64_t silent_drops() const;

  /// Silence after which the subscriber PINGs the server.
  static constexpr std::chrono::milliseconds kPingAfter{1000};

 private:
  struct Channel {
    int watchers = 0;
    bool sent = false;                // SUBSCRIBE sent on the current connection (and not undone)
    std::uint64_t sent_seq = 0;       // SUBSCRIBEs sent on the current connection
    std::uint64_t confirmed_seq = 0;  // their confirmations received
    bool live() const { return sent && confirmed_seq == sent_seq; }
    bool resubscribed = false;  // sent by a reconnect: tell the listener once confirmed
    // A watch was kept without its confirmation (await_watch, keep_on_failure): tell
    // the listener once the subscription is live, on this connection or a later one.
    bool report_when_live = false;
    // The server refused the last SUBSCRIBE: not sent again until a new watch or a
    // reconnect. `refusals` counts them so a waiting watch() sees its own.
    bool refused = false;
    std::uint64_t refusals = 0;
    Error refusal;  // the code and the server's answer
  };

  void run();
  void wake() noexcept;
  bool connect_once();
  void disconnect(const std::string& cause);
  bool flush_changes();
  bool read_available();
  // PINGs a connection silent for kPingAfter; false (after disconnecting it) when a
  // PING went unanswered for command_timeout or could not be sent.
  bool check_alive();
  void handle_reply(redisReply* r);
  void handle_error(redisReply* r);
  void notify(const std::vector<std::string>& channels);

  void dropped(const std::vector<std::string>& channels);

  const ConnectionOptions opts_;
  const Callback on_message_;
  const Callback on_dropped_;  // set: sharded mode
  std::string payload_channel_ DISTLOCK_GUARDED_BY(mu_);
  bool payload_by_prefix_ DISTLOCK_GUARDED_BY(mu_) = false;   // payload_channel_ is a prefix
  PayloadCallback payload_handler_ DISTLOCK_GUARDED_BY(mu_);  // (set once, before its channel is watched)

  mutable AnnotatedMutex mu_;
  std::condition_variable cv_;  // watchers wait for live()
  std::map<std::string, Channel, std::less<>> channels_ DISTLOCK_GUARDED_BY(mu_);
  // Channels with watchers > 0 (the thread connects while any), and whether a channel's
  // watchers, its sent/refused state or a confirmation changed since flush_changes last
  // scanned them: the thread's loop runs once per message read, and a sharded subscriber of
  // redis+cluster:// Client::watch holds thousands of channels.
  std::size_t watched_ DISTLOCK_GUARDED_BY(mu_) = 0;
  bool changed_ DISTLOCK_GUARDED_BY(mu_) = true;
  bool connected_ DISTLOCK_GUARDED_BY(mu_) = false;
  std::uint64_t failures_ DISTLOCK_GUARDED_BY(mu_) = 0;  // bumped per failed connect
  std::uint64_t connects_ DISTLOCK_GUARDED_BY(mu_) = 0;
  std::uint64_t silent_drops_ DISTLOCK_GUARDED_BY(mu_) = 0;
  Error last_failure_ DISTLOCK_GUARDED_BY(mu_);
  bool retry_now_ DISTLOCK_GUARDED_BY(mu_) = false;  // a new watch skips the reconnect backoff
  bool stop_ DISTLOCK_GUARDED_BY(mu_) = false;
  bool thread_started_ DISTLOCK_GUARDED_BY(mu_) = false;

  std::unique_ptr<Socket> sock_;  // subscriber thread only
  ReaderPtr reader_;              // subscriber thread only
  Error io_error_;                // subscriber thread only: why the last read or write failed
  // Subscriber thread only: when the server last sent a byte, and when the PING
  // that has not been answered yet went out (none: no PING outstanding).
  std::chrono::steady_clock::time_point last_heard_{};
  std::optional<std::chrono::steady_clock::time_point> ping_sent_;
  // Commands sent on sock_ and not answered yet, in order: {subscribe?, channel}.
  // Replies come back in that order, so an error reply (which names no channel)
  // belongs to the front. Subscriber thread only.
  std::deque<std::pair<bool, std::string>> inflight_;
  // The subscriber thread (run()); it stops on stop_ (under mu_), woken by loop_.
  // Last: stopped by the destructor before any member above goes.
  WorkerLoop loop_;
};

}  // namespace distlock::detail::redis
