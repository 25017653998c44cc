#include "support/fault_proxy.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>

namespace distlock::testing {

namespace {

using Clock = std::chrono::steady_clock;

enum class Mode { pass, freeze, delay, drop };

struct Chunk {
  Clock::time_point ready;
  std::string bytes;
  std::size_t sent = 0;
};

struct Direction {
  std::deque<Chunk> queue;
  std::size_t queued_bytes = 0;
};

struct Pair {
  int client = -1;
  int upstream = -1;
  Direction to_upstream, to_client;
  bool dead = false;
  int cls = 0;
  int seq = 0;  // the order it was accepted in (0 first): hold_open() holds the ones before
  Clock::time_point connect_until{};  // while upstream < 0: keep trying to connect until then
  FaultProxy::HeadRewriter rewrite;   // set while the dialer's first bytes are held back
  std::string head;
  // lose_answers: the server's bytes are dropped; once some were, the pair is cut at cut_at.
  bool losing = false;
  std::chrono::milliseconds cut_after{0};
  std::optional<Clock::time_point> cut_at;
};

constexpr std::size_t kMaxHead = 64 * 1024;  // a head this long is forwarded unedited

void set_nonblocking(int fd) {
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int connect_loopback(std::uint16_t port) {
  const int fd = dial_loopback(port);
  if (fd >= 0) set_nonblocking(fd);
  return fd;
}

constexpr std::size_t kMaxQueued = 1 << 20;  // stop reading a side whose queue is this full

}  // namespace

struct FaultProxy::Impl {
  using Classifier = FaultProxy::Classifier;
  using HeadRewriter = FaultProxy::HeadRewriter;
  std::uint16_t upstream_port = 0;
  std::uint16_t port = 0;
  int listen_fd = -1;
  int wake_fd = -1;
  std::atomic<bool> stop{false};
  std::atomic<int> accepted{0};

  std::mutex mu;  // guards the settings below
  Mode mode = Mode::pass;
  std::chrono::milliseconds latency{0}, jitter{0};
  std::map<int, Mode> class_modes;  // freeze or drop, overriding `mode` for one class
  Classifier classifier;
  HeadRewriter rewriter;
  std::chrono::milliseconds upstream_retry{0};
  std::atomic<int> unclassified{0};
  int hold_below = 0;  // connections with seq < hold_below are frozen (hold_open)
  int lose_below = 0;  // connections with seq < lose_below lose answers (lose_answers)
  std::chrono::milliseconds lose_cut_after{0};
  std::atomic<int> answers_lost{0};
  std::atomic<int> open{0};  // pairs not dead, as of the last iteration
  std::atomic<std::uint64_t> answer_bytes_dropped{0};
  std::atomic<std::uint64_t> loops{0};  // iterations of run() begun

  std::vector<Pair> pairs;  // owned by the forwarding thread
  std::minstd_rand rng{12345};
  std::thread thread;

  void wake() {
    const std::uint64_t one = 1;
    (void)!::write(wake_fd, &one, sizeof one);
  }

  void set(Mode m, std::chrono::milliseconds lat = {}, std::chrono::milliseconds jit = {}) {
    {
      std::lock_guard lk(mu);
      mode = m;
      latency = lat;
      jitter = jit;
    }
    wake();
  }

  static void close_pair(Pair& p) {
    if (p.client >= 0) ::close(p.client);
    if (p.upstream >= 0) ::close(p.upstream);
    p.client = p.upstream = -1;
    p.dead = true;
  }

  // Reads what `from` has into `dir`, each chunk due at now + latency (+ jitter).
  // With `p`, the bytes are the dialer's and held in p->head until p->rewrite lets them go.
  bool read_side(int from, Direction& dir, Mode m, std::chrono::milliseconds lat,
                 std::chrono::milliseconds jit, Pair* p = nullptr) {
    char buf[65536];
    const ssize_t n = ::read(from, buf, sizeof buf);
    if (n == 0) return false;
    if (n < 0) return errno == EAGAIN || errno == EINTR;
    std::string bytes(buf, static_cast<std::size_t>(n));
    if (p != nullptr && p->rewrite) {
      p->head += bytes;
      if (!p->rewrite(p->head) && p->head.size() < kMaxHead) return true;
      p->rewrite = nullptr;
      bytes = std::move(p->head);
      p->head.clear();
    }
    Chunk c;
    c.ready = Clock::now();
    if (m == Mode::delay) {
      c.ready += lat;
      if (jit.count() > 0)
        c.ready += std::chrono::milliseconds(rng() % static_cast<unsigned>(jit.count() + 1));
      // A stream keeps its order: never due before the chunk ahead of it.
      if (!dir.queue.empty()) c.ready = std::max(c.ready, dir.queue.back().ready);
    }
    c.bytes = std::move(bytes);
    dir.queued_bytes += c.bytes.size();
    dir.queue.push_back(std::move(c));
    return true;
  }

  // Reads and drops what the server sent on a pair that loses answers; false when it closed.
  bool drop_side(Pair& p) {
    char buf[65536];
    const ssize_t n = ::read(p.upstream, buf, sizeof buf);
    if (n == 0) return false;
    if (n < 0) return errno == EAGAIN || errno == EINTR;
    answer_bytes_dropped.fetch_add(static_cast<std::uint64_t>(n));
    if (!p.cut_at) p.cut_at = Clock::now() + p.cut_after;
    return true;
  }

  // Waits until an iteration of the forwarding loop begun after a settings change has ended
  // (the one running may have read the old settings): two more begun iterations. Bounded: 5 s.
  bool applied() {
    const std::uint64_t start = loops.load();
    wake();
    const auto until = Clock::now() + std::chrono::seconds(5);
    while (loops.load() < start + 2) {
      if (Clock::now() >= until) return false;
      wake();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
  }

  // Writes every due chunk of `dir` to `to`; false when the peer is gone.
  static bool write_side(int to, Direction& dir, Clock::time_point now) {
    while (!dir.queue.empty() && dir.queue.front().ready <= now) {
      Chunk& c = dir.queue.front();
      const ssize_t n = ::send(to, c.bytes.data() + c.sent, c.bytes.size() - c.sent, MSG_NOSIGNAL);
      if (n < 0) return errno == EAGAIN || errno == EINTR;
      c.sent += static_cast<std::size_t>(n);
      if (c.sent < c.bytes.size()) return true;
      dir.queued_bytes -= c.bytes.size();
      dir.queue.pop_front();
    }
    return true;
  }

  void accept_one(Mode m) {
    const int c = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) return;
    const int seq = accepted.fetch_add(1);
    Classifier classify;
    HeadRewriter rewrite;
    std::chrono::milliseconds retry{0};
    {
      std::lock_guard lk(mu);
      classify = classifier;
      rewrite = rewriter;
      retry = upstream_retry;
    }
    int cls = 0;
    if (classify) {
      cls = classify(c);
      if (cls == kUnclassified) unclassified.fetch_add(1);
    }
    Mode cm = m;
    if (m != Mode::drop) {
      std::lock_guard lk(mu);
      const auto it = class_modes.find(cls);
      if (it != class_modes.end()) cm = it->second;
    }
    if (cm == Mode::drop) {
      ::close(c);
      return;
    }
    const int u = connect_loopback(upstream_port);
    if (u < 0 && retry.count() == 0) {
      ::close(c);
      return;
    }
    set_nonblocking(c);
    Pair p;
    p.client = c;
    p.upstream = u;
    p.connect_until = Clock::now() + retry;
    p.cls = cls;
    p.seq = seq;
    p.rewrite = std::move(rewrite);
    pairs.push_back(std::move(p));
  }

  void run() {
    while (!stop.load()) {
      loops.fetch_add(1);
      Mode m;
      std::chrono::milliseconds lat, jit;
      std::map<int, Mode> overrides;
      int held_below = 0;
      int losing_below = 0;
      std::chrono::milliseconds cut_after{0};
      {
        std::lock_guard lk(mu);
        held_below = hold_below;
        losing_below = lose_below;
        cut_after = lose_cut_after;
        m = mode;
        lat = latency;
        jit = jitter;
        overrides = class_modes;
      }
      // A class override (freeze, drop) wins over the proxy-wide mode, except drop.
      auto mode_of = [&](int cls) {
        if (m == Mode::drop) return m;
        const auto it = overrides.find(cls);
        return it == overrides.end() ? m : it->second;
      };
      // A connection held by hold_open() is frozen unless the whole proxy drops.
      auto pair_mode = [&](const Pair& p) {
        if (m != Mode::drop && p.seq < held_below) return Mode::freeze;
        return mode_of(p.cls);
      };
      for (auto& p : pairs) {
        if (pair_mode(p) == Mode::drop) close_pair(p);
      }
      const auto started = Clock::now();
      for (auto& p : pairs) {
        if (p.dead) continue;
        if (!p.losing && p.seq < losing_below) {
          p.losing = true;
          p.cut_after = cut_after;
          p.to_client.queue.clear();  // not forwarded yet: dropped as well
          p.to_client.queued_bytes = 0;
        }
        if (p.losing && p.cut_at && started >= *p.cut_at) {
          answers_lost.fetch_add(1);
          close_pair(p);
        }
      }
      pairs.erase(std::remove_if(pairs.begin(), pairs.end(), [](const Pair& p) { return p.dead; }),
                  pairs.end());
      open.store(static_cast<int>(pairs.size()));

      const auto now = Clock::now();
      bool connecting = false;
      for (auto& p : pairs) {
        if (p.upstream >= 0) continue;
        p.upstream = connect_loopback(upstream_port);
        if (p.upstream < 0 && now >= p.connect_until) close_pair(p);
        connecting = connecting || (!p.dead && p.upstream < 0);
      }
      for (auto& p : pairs) {
        if (p.dead || p.upstream < 0) continue;
        if (p.losing) {
          if (!write_side(p.upstream, p.to_upstream, now)) close_pair(p);
          continue;
        }
        if (pair_mode(p) == Mode::freeze) continue;
        if (!write_side(p.upstream, p.to_upstream, now) || !write_side(p.client, p.to_client, now))
          close_pair(p);
      }

      std::vector<pollfd> fds;
      fds.push_back({wake_fd, POLLIN, 0});
      fds.push_back({listen_fd, POLLIN, 0});
      Clock::time_point next_due = now + std::chrono::milliseconds(connecting ? 20 : 100);
      for (auto& p : pairs) {
        short cin = 0, uin = 0;
        if (!p.dead && p.upstream >= 0 && p.losing) {
          if (p.to_upstream.queued_bytes < kMaxQueued) cin = POLLIN;
          uin = POLLIN;  // read and dropped
          if (!p.to_upstream.queue.empty()) uin |= POLLOUT;
          if (p.cut_at) next_due = std::min(next_due, *p.cut_at);
        } else if (!p.dead && p.upstream >= 0 && pair_mode(p) != Mode::freeze) {
          if (p.to_upstream.queued_bytes < kMaxQueued) cin = POLLIN;
          if (p.to_client.queued_bytes < kMaxQueued) uin = POLLIN;
          for (Direction* d : {&p.to_upstream, &p.to_client}) {
            if (!d->queue.empty()) next_due = std::min(next_due, d->queue.front().ready);
          }
          if (!p.to_upstream.queue.empty() && p.to_upstream.queue.front().ready <= now) uin |= POLLOUT;
          if (!p.to_client.queue.empty() && p.to_client.queue.front().ready <= now) cin |= POLLOUT;
        }
        fds.push_back({p.dead ? -1 : p.client, cin, 0});
        fds.push_back({p.dead ? -1 : p.upstream, uin, 0});
      }
      const auto wait_ms = std::max<long>(
          0,
          static_cast<long>(std::chrono::duration_cast<std::chrono::milliseconds>(next_due - now).count()));
      ::poll(fds.data(), fds.size(), static_cast<int>(std::min<long>(wait_ms, 100)));
      if (fds[0].revents & POLLIN) {
        std::uint64_t v;
        (void)!::read(wake_fd, &v, sizeof v);
      }
      const std::size_t polled = pairs.size();
      if (fds[1].revents & POLLIN) accept_one(m);
      // The fds vector was built before accept: pairs[i] is at 2 + 2i.
      for (std::size_t i = 0; i < polled; ++i) {
        Pair& p = pairs[i];
        if (p.dead || p.upstream < 0) continue;
        const pollfd& cf = fds[2 + 2 * i];
        const pollfd& uf = fds[3 + 2 * i];
        if (p.losing) {
          bool ok = true;
          if (cf.revents & (POLLIN | POLLHUP | POLLERR))
            ok = read_side(p.client, p.to_upstream, Mode::pass, {}, {}) && ok;
          if (uf.revents & (POLLIN | POLLHUP | POLLERR)) ok = drop_side(p) && ok;
          if (!ok) {
            write_side(p.upstream, p.to_upstream, Clock::now());
            close_pair(p);
          }
          continue;
        }
        const Mode pm = pair_mode(p);
        if (pm == Mode::freeze || pm == Mode::drop) continue;
        bool ok = true;
        if (cf.revents & (POLLIN | POLLHUP | POLLERR))
          ok = read_side(p.client, p.to_upstream, pm, lat, jit, &p) && ok;
        if (uf.revents & (POLLIN | POLLHUP | POLLERR))
          ok = read_side(p.upstream, p.to_client, pm, lat, jit) && ok;
        if (!ok) {
          // One side closed: deliver what is due, then close both.
          write_side(p.upstream, p.to_upstream, Clock::now());
          write_side(p.client, p.to_client, Clock::now());
          close_pair(p);
        }
      }
    }
    for (auto& p : pairs) close_pair(p);
  }
};

FaultProxy::FaultProxy(std::uint16_t upstream_port) : impl_(std::make_unique<Impl>()) {
  impl_->upstream_port = upstream_port;
  impl_->listen_fd = listen_loopback(128, impl_->port);
  if (impl_->listen_fd < 0) throw std::runtime_error("fault proxy: cannot listen on 127.0.0.1");
  set_nonblocking(impl_->listen_fd);
  impl_->wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  impl_->thread = std::thread([this] { impl_->run(); });
}

FaultProxy::~FaultProxy() {
  impl_->stop = true;
  impl_->wake();
  impl_->thread.join();
  ::close(impl_->listen_fd);
  ::close(impl_->wake_fd);
}

std::uint16_t FaultProxy::port() const {
  return impl_->port;
}
void FaultProxy::pass() {
  impl_->set(Mode::pass);
}
void FaultProxy::freeze() {
  impl_->set(Mode::freeze);
}
void FaultProxy::delay(std::chrono::milliseconds latency, std::chrono::milliseconds jitter) {
  impl_->set(Mode::delay, latency, jitter);
}
void FaultProxy::drop() {
  impl_->set(Mode::drop);
}
int FaultProxy::accepted() const {
  return impl_->accepted.load();
}
int FaultProxy::open_connections() const {
  return impl_->open.load();
}
void FaultProxy::set_classifier(Classifier classify) {
  std::lock_guard lk(impl_->mu);
  impl_->classifier = std::move(classify);
}
void FaultProxy::set_upstream_retry(std::chrono::milliseconds retry) {
  std::lock_guard lk(impl_->mu);
  impl_->upstream_retry = retry;
}
void FaultProxy::set_head_rewriter(HeadRewriter rewrite) {
  std::lock_guard lk(impl_->mu);
  impl_->rewriter = std::move(rewrite);
}
void FaultProxy::freeze_class(int cls) {
  {
    std::lock_guard lk(impl_->mu);
    impl_->class_modes[cls] = Mode::freeze;
  }
  impl_->wake();
}
void FaultProxy::drop_class(int cls) {
  {
    std::lock_guard lk(impl_->mu);
    impl_->class_modes[cls] = Mode::drop;
  }
  impl_->wake();
}
void FaultProxy::pass_class(int cls) {
  {
    std::lock_guard lk(impl_->mu);
    impl_->class_modes.erase(cls);
  }
  impl_->wake();
}
void FaultProxy::pass_all_classes() {
  {
    std::lock_guard lk(impl_->mu);
    impl_->class_modes.clear();
  }
  impl_->wake();
}
int FaultProxy::unclassified() const {
  return impl_->unclassified.load();
}
bool FaultProxy::hold_open() {
  {
    std::lock_guard lk(impl_->mu);
    impl_->hold_below = impl_->accepted.load();
  }
  return impl_->applied();
}
bool FaultProxy::lose_answers(std::chrono::milliseconds cut_after) {
  {
    std::lock_guard lk(impl_->mu);
    impl_->lose_below = impl_->accepted.load();
    impl_->lose_cut_after = cut_after;
  }
  return impl_->applied();
}
int FaultProxy::answers_lost() const {
  return impl_->answers_lost.load();
}
std::uint64_t FaultProxy::answer_bytes_dropped() const {
  return impl_->answer_bytes_dropped.load();
}
void FaultProxy::release_held() {
  {
    std::lock_guard lk(impl_->mu);
    impl_->hold_below = 0;
  }
  impl_->wake();
}

namespace {

// "0100007F:1F90" -> 0x1F90 (the port of a /proc/net/tcp address column).
int port_of(const std::string& addr) {
  const auto colon = addr.rfind(':');
  if (colon == std::string::npos) return -1;
  return static_cast<int>(std::strtol(addr.c_str() + colon + 1, nullptr, 16));
}

}  // namespace

namespace {

pid_t dialer_pid_once(int accepted_fd, const std::vector<pid_t>& candidates) {
  sockaddr_in local{}, peer{};
  socklen_t len = sizeof local;
  if (::getsockname(accepted_fd, reinterpret_cast<sockaddr*>(&local), &len) != 0) return -1;
  len = sizeof peer;
  if (::getpeername(accepted_fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0) return -1;
  // The dialer's socket has local port = our peer's port and remote port = our port.
  const int their_port = ntohs(peer.sin_port), our_port = ntohs(local.sin_port);
  std::string inode;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (inode.empty() && std::getline(in, line)) {
      std::istringstream row(line);
      std::string sl, laddr, raddr, st, queues, timer, retr, uid, timeout, ino;
      row >> sl >> laddr >> raddr >> st >> queues >> timer >> retr >> uid >> timeout >> ino;
      if (port_of(laddr) == their_port && port_of(raddr) == our_port && ino != "0") inode = ino;
    }
    if (!inode.empty()) break;
  }
  if (inode.empty()) return -1;
  const std::string target = "socket:[" + inode + "]";
  for (pid_t pid : candidates) {
    std::error_code ec;
    for (std::filesystem::directory_iterator it("/proc/" + std::to_string(pid) + "/fd", ec), end;
         !ec && it != end; it.increment(ec)) {
      std::error_code lec;
      if (std::filesystem::read_symlink(it->path(), lec).string() == target) return pid;
    }
  }
  return -1;
}

}  // namespace

pid_t dialer_pid(int accepted_fd, const std::vector<pid_t>& candidates) {
  // /proc/net/tcp is generated in pieces while sockets come and go: a reader can miss
  // a row. A second or third look finds it.
  for (int attempt = 0; attempt < 3; ++attempt) {
    const pid_t pid = dialer_pid_once(accepted_fd, candidates);
    if (pid > 0) return pid;
    if (dialer_closed(accepted_fd)) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return -1;
}

int dial_loopback(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

int listen_loopback(int backlog, std::uint16_t& port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = 0;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, backlog) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    return -1;
  }
  port = ntohs(a.sin_port);
  return fd;
}

bool dialer_closed(int accepted_fd) {
  tcp_info info{};
  socklen_t len = sizeof info;
  if (::getsockopt(accepted_fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return true;
  return info.tcpi_state != TCP_ESTABLISHED;
}

FaultProxyGroup::FaultProxyGroup(const std::vector<std::uint16_t>& upstream_ports) {
  for (auto p : upstream_ports) proxies_.push_back(std::make_unique<FaultProxy>(p));
}
std::string FaultProxyGroup::hosts() const {
  std::string out;
  for (std::size_t i = 0; i < proxies_.size(); ++i) {
    if (i) out += ",";
    out += "127.0.0.1:" + std::to_string(proxies_[i]->port());
  }
  return out;
}
void FaultProxyGroup::pass_all() {
  for (auto& p : proxies_) p->pass();
}
void FaultProxyGroup::freeze_all() {
  for (auto& p : proxies_) p->freeze();
}
void FaultProxyGroup::drop_all() {
  for (auto& p : proxies_) p->drop();
}

}  // namespace distlock::testing
