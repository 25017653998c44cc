#include "redlock/subscriber.hpp"

namespace distlock::detail::redlock {

Subscriber::Subscriber(const std::vector<std::shared_ptr<Master>>& masters, Handler handler,
                       Millis confirm_timeout, Logger& log)
    : confirm_timeout_(confirm_timeout), log_(log) {
  auto shared = std::make_shared<Handler>(std::move(handler));
  nodes_.reserve(masters.size());
  for (const auto& m : masters) {
    nodes_.push_back(
        std::make_unique<redis::Subscriber>(m->options(), [shared](std::string_view ch) { (*shared)(ch); }));
  }
}

Subscriber::~Subscriber() {
  nodes_.clear();  // each stops and joins its thread
}

void Subscriber::subscribe(const std::string& channel) {
  std::vector<redis::Subscriber::WatchStart> started;
  started.reserve(nodes_.size());
  for (auto& n : nodes_) started.push_back(n->begin_watch(channel));
  const auto deadline = std::chrono::steady_clock::now() + confirm_timeout_;
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    Error ec;
    if (!nodes_[i]->await_watch(channel, started[i], deadline, true, ec)) {
      // Covered by the other masters and by the engine's re-check; said at debug level
      // because a master that is down is reported by every lock call already.
      log_.log(LogLevel::debug, "redlock: subscription to \"{}\" not confirmed: {}", channel.substr(0, 200),
               ec.detail());
    }
  }
}

void Subscriber::unsubscribe(const std::string& channel) noexcept {
  for (auto& n : nodes_) n->unwatch(channel);
}

}  // namespace distlock::detail::redlock
