#include "redlock/subscriber.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace distlock::detail::redlock {

namespace {
constexpr Millis kResubscribeBackoff{200};

std::string_view element(const redisReply* r, std::size_t i) {
  if (r->type != REDIS_REPLY_ARRAY || i >= r->elements) return {};
  const redisReply* e = r->element[i];
  if (e->type != REDIS_REPLY_STRING && e->type != REDIS_REPLY_STATUS) return {};
  return {e->str, e->len};
}
}  // namespace

Subscriber::Subscriber(std::vector<std::shared_ptr<Master>> masters, Handler handler, Millis confirm_timeout,
                       Logger& log)
    : handler_(std::move(handler)), confirm_timeout_(confirm_timeout), log_(log) {
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0)
    throw std::system_error(errno, std::generic_category(), "eventfd for the redlock subscriber");
  nodes_.resize(masters.size());
  for (std::size_t i = 0; i < masters.size(); ++i) nodes_[i].master = std::move(masters[i]);
  thread_ = std::jthread([this](std::stop_token st) { run(st); });
}

Subscriber::~Subscriber() {
  thread_.request_stop();
  wake();
  if (thread_.joinable()) thread_.join();
  ::close(wake_fd_);
}

void Subscriber::wake() noexcept {
  const std::uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof one);
}

void Subscriber::subscribe(const std::string& channel) {
  auto pending = std::make_shared<Pending>();
  std::unique_lock lk(mu_);
  channels_.insert(channel);
  ops_.push_back(Op{true, channel, pending});
  wake();
  cv_.wait_for(lk, confirm_timeout_, [&] { return pending->done; });
}

void Subscriber::unsubscribe(const std::string& channel) {
  {
    std::lock_guard lk(mu_);
    channels_.erase(channel);
    ops_.push_back(Op{false, channel, nullptr});
  }
  wake();
}

void Subscriber::confirm(const std::shared_ptr<Pending>& p) {
  if (!p) return;
  std::lock_guard lk(mu_);
  if (p->outstanding > 0 && --p->outstanding == 0) {
    p->done = true;
    cv_.notify_all();
  }
}

void Subscriber::send(Node& node, const std::vector<std::string>& argv) {
  node.out.append(argv);
}

void Subscriber::connect(Node& node, const std::set<std::string>& channels) {
  std::string why;
  node.ctx = node.master->open(why);
  if (!node.ctx) {
    node.retry_at = SteadyClock::now() + kResubscribeBackoff;
    return;
  }
  node.expect.clear();
  node.next_expect = 0;
  const Master& m = *node.master;
  if (!m.password().empty()) {
    std::vector<std::string> auth{"AUTH"};
    if (!m.user().empty()) auth.push_back(m.user());
    auth.push_back(m.password());
    send(node, auth);
    node.expect.push_back({true, nullptr});
  }
  if (!channels.empty()) {
    std::vector<std::string> argv{"SUBSCRIBE"};
    argv.insert(argv.end(), channels.begin(), channels.end());
    send(node, argv);
    for (std::size_t i = 0; i < channels.size(); ++i)
      node.expect.push_back({false, nullptr, node.ever_connected});
  }
  write(node);
}

void Subscriber::write(Node& node) {
  if (!node.ctx || node.out.empty()) return;
  std::string why;
  if (!node.out.flush(node.ctx->fd, why)) fail(node, why);
}

void Subscriber::fail(Node& node, const std::string& why) {
  log_.log(LogLevel::debug, "redlock subscriber: {}: {}", node.master->label(), why);
  for (std::size_t i = node.next_expect; i < node.expect.size(); ++i) confirm(node.expect[i].pending);
  node.expect.clear();
  node.next_expect = 0;
  node.ctx.reset();
  node.out.clear();
  node.retry_at = SteadyClock::now() + kResubscribeBackoff;
}

void Subscriber::read(Node& node, std::vector<std::string>& fire) {
  if (redisBufferRead(node.ctx.get()) == REDIS_ERR) {
    fail(node, node.ctx->errstr);
    return;
  }
  for (;;) {
    void* raw = nullptr;
    if (redisGetReplyFromReader(node.ctx.get(), &raw) == REDIS_ERR) {
      fail(node, node.ctx->errstr);
      return;
    }
    if (!raw) break;
    ReplyPtr reply(static_cast<redisReply*>(raw));
    const std::string_view kind = element(reply.get(), 0);
    if (kind == "message") {
      fire.emplace_back(element(reply.get(), 1));
      continue;
    }
    if (kind == "unsubscribe") continue;
    if (node.next_expect >= node.expect.size()) {
      fail(node, "unexpected reply " + reply_text(reply.get()));
      return;
    }
    const Entry entry = node.expect[node.next_expect++];
    if (reply->type == REDIS_REPLY_ERROR) {
      log_.log(LogLevel::warning, "redlock: {} refused the notification subscription: {}",
               node.master->label(), reply_text(reply.get()));
      confirm(entry.pending);
      fail(node, reply_text(reply.get()));
      return;
    }
    if (entry.auth) continue;
    if (kind == "subscribe") {
      node.ever_connected = true;
      if (entry.pending) {
        confirm(entry.pending);
      } else if (entry.recheck) {
        // Re-subscribed after a reconnect: a release may have gone unseen.
        fire.emplace_back(element(reply.get(), 1));
      }
    }
    if (node.next_expect == node.expect.size()) {
      node.expect.clear();
      node.next_expect = 0;
    }
  }
}

void Subscriber::run(std::stop_token stop) {
  std::vector<pollfd> fds;
  std::vector<std::string> fire;
  while (!stop.stop_requested()) {
    std::vector<Op> ops;
    std::set<std::string> channels;
    {
      std::lock_guard lk(mu_);
      ops.swap(ops_);
      channels = channels_;
    }
    const auto now = SteadyClock::now();
    for (auto& node : nodes_) {
      // (Re)connect: subscribes every wanted channel, including those of this
      // round's ops (a second SUBSCRIBE of a channel is harmless).
      if (!node.ctx && now >= node.retry_at) connect(node, channels);
    }
    for (auto& op : ops) {
      for (auto& node : nodes_) {
        if (!node.ctx) continue;
        send(node, {op.subscribe ? "SUBSCRIBE" : "UNSUBSCRIBE", op.channel});
        if (op.subscribe) {
          {
            std::lock_guard lk(mu_);
            ++op.pending->outstanding;
          }
          node.expect.push_back({false, op.pending});
        }
        write(node);  // on failure confirms (gives up on) what this node owed
      }
      if (op.pending) {
        std::lock_guard lk(mu_);
        if (op.pending->outstanding == 0) {
          op.pending->done = true;
          cv_.notify_all();
        }
      }
    }

    fds.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    auto next_retry = SteadyClock::now() + std::chrono::seconds(1);
    for (auto& node : nodes_) {
      if (node.ctx) {
        fds.push_back({node.ctx->fd, static_cast<short>(POLLIN | (node.out.empty() ? 0 : POLLOUT)), 0});
      } else {
        next_retry = std::min(next_retry, node.retry_at);
      }
    }
    const auto wait = std::chrono::duration_cast<Millis>(next_retry - SteadyClock::now()).count();
    const int n = ::poll(fds.data(), fds.size(), static_cast<int>(std::clamp<long long>(wait + 1, 0, 1000)));
    if (n <= 0) continue;
    if (fds[0].revents) {
      std::uint64_t v = 0;
      [[maybe_unused]] auto r = ::read(wake_fd_, &v, sizeof v);
    }
    fire.clear();
    std::size_t k = 1;
    for (auto& node : nodes_) {
      if (!node.ctx) continue;
      const short rev = fds[k++].revents;
      if (rev & POLLOUT) write(node);
      if (node.ctx && (rev & (POLLIN | POLLHUP | POLLERR))) read(node, fire);
    }
    for (const auto& channel : fire) handler_(channel);
  }
}

}  // namespace distlock::detail::redlock
