// Release notifications from every master: one redis::Subscriber (the Redis stack's
// pub/sub connection and thread, TCP or TLS) per master, shared by all waits of a
// client. Each of them reconnects its master when it went away, subscribes again and
// then reports every channel, because a release may have been published meanwhile.
//
// Thread-safety: subscribe()/unsubscribe() may be called from any thread; the
// handler runs on a master's subscriber thread with no lock of this class held.
//
// Example:
//   Subscriber sub(masters, [&](std::string_view channel) { wake_waiters(channel); },
//                  std::chrono::milliseconds(100), log);
//   sub.subscribe("distlock:redlock:released:orders");  // confirmed by reachable masters
//   ...
//   sub.unsubscribe("distlock:redlock:released:orders");
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/log.hpp"
#include "redis/subscriber.hpp"
#include "redlock/fanout.hpp"

namespace distlock::detail::redlock {

class Subscriber {
 public:
  using Handler = std::function<void(std::string_view channel)>;

  /// `confirm_timeout` bounds how long subscribe() waits for the masters' confirmations
  /// (a paused master must not stall a waiter).
  Subscriber(const std::vector<std::shared_ptr<Master>>& masters, Handler handler, Millis confirm_timeout,
             Logger& log);
  ~Subscriber();
  Subscriber(const Subscriber&) = delete;
  Subscriber& operator=(const Subscriber&) = delete;

  /// Subscribes `channel` on every master at once (counted per channel) and returns
  /// once each of them confirmed, or after the confirm timeout. A master that did not
  /// confirm keeps being asked (its subscriber reconnects); unsubscribe() ends that.
  void subscribe(const std::string& channel);
  void unsubscribe(const std::string& channel) noexcept;

 private:
  Millis confirm_timeout_;
  Logger& log_;
  std::vector<std::unique_ptr<redis::Subscriber>> nodes_;
};

}  // namespace distlock::detail::redlock
