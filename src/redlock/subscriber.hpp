// Release notifications from every master over one pub/sub connection per
// master, shared by all waits of a client. A background thread polls the
// connections, reconnects a master that went away (and then re-subscribes and
// reports every channel, because a release may have been published meanwhile),
// and calls the handler for each message.
//
// Thread-safety: subscribe()/unsubscribe() may be called from any thread; the
// handler runs on the subscriber's thread with no lock of this class held.
//
// Example:
//   Subscriber sub(masters, [&](std::string_view channel) { wake_waiters(channel); },
//                  std::chrono::milliseconds(100));
//   sub.subscribe("distlock:redlock:released:orders");  // confirmed by reachable masters
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "core/log.hpp"
#include "redlock/fanout.hpp"

namespace distlock::detail::redlock {

class Subscriber {
 public:
  using Handler = std::function<void(std::string_view channel)>;

  /// Starts the thread. `confirm_timeout` bounds how long subscribe() waits for a
  /// master that does not confirm (a paused master must not stall a waiter).
  Subscriber(std::vector<std::shared_ptr<Master>> masters, Handler handler, Millis confirm_timeout,
             Logger& log);
  ~Subscriber();
  Subscriber(const Subscriber&) = delete;
  Subscriber& operator=(const Subscriber&) = delete;

  /// Subscribes `channel` on every reachable master; returns once each of them
  /// confirmed, or after the confirm timeout.
  void subscribe(const std::string& channel);
  void unsubscribe(const std::string& channel);

 private:
  struct Pending {
    std::size_t outstanding = 0;
    bool done = false;
  };
  struct Op {
    bool subscribe;
    std::string channel;
    std::shared_ptr<Pending> pending;  // null for unsubscribe
  };
  struct Entry {  // one expected reply on a subscriber connection
    bool auth;
    std::shared_ptr<Pending> pending;  // null: subscribed by (re)connecting
    bool recheck = false;              // a re-subscription after a reconnect: report the channel
  };
  struct Node {
    std::shared_ptr<Master> master;
    ContextPtr ctx;
    OutBuffer out;
    std::vector<Entry> expect;  // in order
    std::size_t next_expect = 0;
    SteadyClock::time_point retry_at{};
    bool ever_connected = false;
  };

  void run(std::stop_token stop);
  void wake() noexcept;
  void connect(Node& node, const std::set<std::string>& channels);
  void send(Node& node, const std::vector<std::string>& argv);
  void write(Node& node);
  void read(Node& node, std::vector<std::string>& fire);
  void fail(Node& node, const std::string& why);
  void confirm(const std::shared_ptr<Pending>& p);

  Handler handler_;
  Millis confirm_timeout_;
  Logger& log_;
  int wake_fd_ = -1;
  std::vector<Node> nodes_;  // owned by the thread

  std::mutex mu_;
  std::condition_variable cv_;
  std::set<std::string> channels_;  // guarded by mu_: what every master should deliver
  std::vector<Op> ops_;             // guarded by mu_
  std::jthread thread_;
};

}  // namespace distlock::detail::redlock
