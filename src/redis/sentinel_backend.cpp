#include "redis/sentinel_backend.hpp"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <charconv>
#include <chrono>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/log.hpp"
#include "core/url_keys.hpp"
#include "core/worker_loop.hpp"
#include "redis/connection.hpp"
#include "redis/redis_backend.hpp"

namespace distlock::detail {

namespace {

using redis::Connection;
using redis::ConnectionOptions;
using redis::Reply;
using Steady = std::chrono::steady_clock;

constexpr std::uint16_t kSentinelPort = 26379;
// The monitor asks a sentinel for the master this often even without a
// +switch-master message (one may be missed while it changes sentinels).
constexpr Millis kRecheckEvery{1000};
// A call that fails re-discovers at most this often (many threads fail at once).
constexpr Millis kMinRediscover{100};
// The monitor waits this long before subscribing again after losing a sentinel.
constexpr Millis kResubscribeDelay{200};

struct Address {
  std::string host;
  std::uint16_t port = 0;
  bool operator==(const Address&) const = default;
  std::string text() const { return host + ":" + std::to_string(port); }
};

bool parse_port(std::string_view s, std::uint16_t& out) {
  unsigned v = 0;
  auto [p, e] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (e != std::errc{} || p != s.data() + s.size() || v == 0 || v > 65535) return false;
  out = static_cast<std::uint16_t>(v);
  return true;
}

// A sentinel without a password answers AUTH with this; it is then asked without.
bool no_password_configured(std::string_view why) {
  return why.find("without any password configured") != std::string_view::npos ||
         why.find("no password is set") != std::string_view::npos;
}

class SentinelBackend final : public Backend, private ChangeListener {
 public:
  SentinelBackend(std::vector<ConnectionOptions> sentinels, std::string master_name, ConnectionOptions master,
                  RedisSettings settings, const ClientOptions& opts)
      : sentinel_opts_(std::move(sentinels)),
        master_name_(std::move(master_name)),
        master_tpl_(std::move(master)),
        settings_(std::move(settings)),
        client_opts_(opts),
        log_(opts.logger) {
    for (const auto& o : sentinel_opts_) sentinel_conns_.emplace_back(o);
    if (!monitor_.valid())
      throw std::system_error(monitor_.error(), std::generic_category(), "eventfd for the sentinel monitor");
  }

  ~SentinelBackend() override {
    monitor_.stop();
    std::lock_guard lk(mu_);
    current_.reset();  // stops its subscriber while every member is alive
  }

  // Finds the master and connects to it; then starts the monitor.
  std::error_code start(std::string& why) {
    std::error_code ec;
    {
      std::lock_guard lk(discover_mu_);
      bool unknown_everywhere = false;
      long long epoch = -1;
      auto addr = discover(why, unknown_everywhere, epoch);
      if (!addr) {
        return make_error_code(unknown_everywhere ? errc::invalid_argument : errc::backend_unavailable);
      }
      if (!switch_to(*addr, ec, why)) return ec;
      current_epoch_ = epoch;
      last_discovery_ = Steady::now();
    }
    monitor_.start([this] { monitor(); });
    return {};
  }

  Capabilities capabilities() const noexcept override { return {true, true}; }
  void set_listener(ChangeListener* listener) override { listener_.store(listener); }

  AcquireResult try_acquire(const AcquireRequest& req, std::error_code& ec) override {
    return call(ec, [&](Backend& b, std::error_code& e) { return b.try_acquire(req, e); });
  }

  // To the current master's backend: a wait queued on a master that was replaced
  // since is unknown there, and its entry expires with its ttl (docs/sentinel.md).
  void cancel_acquire(std::string_view name, std::string_view owner) noexcept override {
    current().first->cancel_acquire(name, owner);
  }

  void renew(std::span<const RenewItem> items, std::span<RenewStatus> out, std::error_code& ec) override {
    call(ec, [&](Backend& b, std::error_code& e) {
      b.renew(items, out, e);
      return 0;
    });
  }

  ReleaseStatus release(std::string_view name, std::string_view owner, std::uint64_t token,
                        std::error_code& ec) override {
    return call(ec, [&](Backend& b, std::error_code& e) { return b.release(name, owner, token, e); });
  }

  LockInfo status(std::string_view name, std::error_code& ec) override {
    return call(ec, [&](Backend& b, std::error_code& e) { return b.status(name, e); });
  }

  // Records and listing go to the current master like every lock call (a put that
  // met a demoted master is repeated once on the new one: `always` and `if_absent`
  // are idempotent there, see docs/sentinel.md).
  std::string put_record(std::string_view key, std::string_view value, PutMode mode,
                         std::error_code& ec) override {
    return call(ec, [&](Backend& b, std::error_code& e) { return b.put_record(key, value, mode, e); });
  }

  std::optional<std::string> get_record(std::string_view key, std::error_code& ec) override {
    return call(ec, [&](Backend& b, std::error_code& e) { return b.get_record(key, e); });
  }

  bool erase_record(std::string_view key, std::error_code& ec) override {
    return call(ec, [&](Backend& b, std::error_code& e) { return b.erase_record(key, e); });
  }

  std::vector<ListedLock> list_held(std::string_view prefix, std::size_t limit, bool& truncated,
                                    std::error_code& ec) override {
    return call(ec, [&](Backend& b, std::error_code& e) { return b.list_held(prefix, limit, truncated, e); });
  }

  // Watches are counted here too, so a switch can subscribe them on the new master.
  // The count and the backend are read together under watch_mu_, which a switch holds
  // while it copies the counts to the new master and swaps it in: a watch counted
  // before the swap is made there by the switch, one after it on the new master. The
  // subscription itself runs without the lock (a hung master must not hold up a switch).
  void watch(std::string_view name, std::error_code& ec) override {
    std::shared_ptr<Backend> b;
    std::uint64_t generation = 0;
    {
      std::lock_guard wl(watch_mu_);
      ++watches_[std::string(name)];
      std::tie(b, generation) = current();
    }
    b->watch(name, ec);
    if (!ec) return;
    std::shared_ptr<Backend> now;
    {
      std::lock_guard wl(watch_mu_);
      auto it = watches_.find(name);
      if (it != watches_.end() && --it->second == 0) watches_.erase(it);
      auto [cur, gen] = current();
      if (gen != generation) now = std::move(cur);
    }
    if (now) now->unwatch(name);  // a switch meanwhile subscribed it there for this watch
  }

  void unwatch(std::string_view name) noexcept override {
    try {
      std::shared_ptr<Backend> b;
      {
        std::lock_guard wl(watch_mu_);
        auto it = watches_.find(name);
        if (it == watches_.end()) return;
        if (--it->second == 0) watches_.erase(it);
        b = current().first;
      }
      b->unwatch(name);
    } catch (...) {  // out of memory: the subscription stays, harmless
    }
  }

  std::string url() const override { return settings_.url; }

 private:
  // ChangeListener of the inner backends: forwarded to the engine.
  void on_change(std::string_view name) noexcept override {
    if (auto* l = listener_.load()) l->on_change(name);
  }
  void on_session_lost() noexcept override {
    if (auto* l = listener_.load()) l->on_session_lost();
  }
  void on_lease_lost(std::string_view name, std::string_view owner) noexcept override {
    if (auto* l = listener_.load()) l->on_lease_lost(name, owner);
  }
  void on_validity_changed(Millis validity) noexcept override {
    if (auto* l = listener_.load()) l->on_validity_changed(validity);
  }

  std::pair<std::shared_ptr<Backend>, std::uint64_t> current() const {
    std::lock_guard lk(mu_);
    return {current_, generation_};
  }

  // Runs `f` on the current master; when it fails with backend_unavailable and the
  // sentinels name another master, runs it once more there (every operation is
  // owner-checked, so a repeat cannot act for somebody else).
  template <class F>
  std::invoke_result_t<F&, Backend&, std::error_code&> call(std::error_code& ec, F&& f) {
    auto [backend, generation] = current();
    auto result = f(*backend, ec);
    if (ec != errc::backend_unavailable) return result;
    if (!rediscover(generation, false)) return result;
    take_error_detail();
    ec.clear();
    return f(*current().first, ec);
  }

  // True when the master changed since `generation` (by this call or another).
  bool rediscover(std::uint64_t generation, bool forced) {
    std::lock_guard lk(discover_mu_);
    if (current().second != generation) return true;
    const auto now = Steady::now();
    if (!forced && now - last_discovery_ < kMinRediscover) return false;
    last_discovery_ = now;
    std::string why;
    bool unknown = false;
    long long epoch = -1;
    auto addr = discover(why, unknown, epoch);
    if (!addr) {
      // Once per outage at warning level: the monitor retries several times a second.
      log_.log(std::exchange(no_master_, true) ? LogLevel::debug : LogLevel::warning,
               "{}: no master found: {}", settings_.url, why);
      return false;
    }
    if (std::exchange(no_master_, false)) {
      log_.log(LogLevel::info, "{}: the sentinels name master {} again", settings_.url, addr->text());
    }
    if (*addr == current_addr()) {
      current_epoch_ = epoch;  // also when the sentinels' epochs restarted (re-monitored)
      return false;
    }
    std::error_code ec;
    if (!switch_to(*addr, ec, why)) return false;
    current_epoch_ = epoch;
    return true;
  }

  Address current_addr() const {
    std::lock_guard lk(mu_);
    return current_addr_;
  }

  std::string describe_sentinel(std::size_t i) const {
    return "sentinel " + sentinel_opts_[i].host + ":" + std::to_string(sentinel_opts_[i].port);
  }

  // One command to sentinel i (discover_mu_ held). A sentinel that has no password
  // and refuses AUTH is asked again without credentials from then on.
  Reply sentinel_command(std::size_t i, std::initializer_list<std::string_view> argv, std::error_code& ec,
                         std::string& why) {
    Reply r = sentinel_conns_[i].command(argv, ec);
    if (ec == errc::auth_failed && no_password_configured(sentinel_conns_[i].last_error())) {
      sentinel_opts_[i].user.clear();
      sentinel_opts_[i].password.clear();
      sentinel_conns_[i] = Connection(sentinel_opts_[i]);
      r = sentinel_conns_[i].command(argv, ec);
    }
    if (ec) why = "sentinel " + sentinel_conns_[i].last_error();
    return r;
  }

  // The config-epoch sentinel i reports for the master (`SENTINEL MASTER <name>`,
  // field config-epoch), or -1 when it gives none (an error, an unexpected reply).
  // Sets `ec` only when the sentinel did not answer at all. discover_mu_ held.
  long long config_epoch(std::size_t i, std::error_code& ec, std::string& why) {
    Reply r = sentinel_command(i, {"SENTINEL", "MASTER", master_name_}, ec, why);
    if (ec) {
      // An error reply (no such master, an ACL without SENTINEL MASTER) is an answer
      // without an epoch; no answer or a refused password is not an answer.
      const bool answered = ec != errc::backend_unavailable &&
                            (ec != errc::auth_failed || why.find("NOPERM") != std::string::npos);
      if (answered) ec.clear();
      return -1;
    }
    if (r->type != REDIS_REPLY_ARRAY) return -1;  // RESP2: a flat list of field, value
    for (std::size_t k = 0; k + 1 < r->elements; k += 2) {
      if (redis::reply_str(r->element[k]) != "config-epoch") continue;
      const redisReply* v = r->element[k + 1];
      if (v->type == REDIS_REPLY_INTEGER) return v->integer >= 0 ? v->integer : -1;
      long long e = -1;
      const std::string_view t = redis::reply_str(v);
      auto [q, err] = std::from_chars(t.data(), t.data() + t.size(), e);
      return err == std::errc{} && q == t.data() + t.size() && e >= 0 ? e : -1;
    }
    return -1;
  }

  // Asks every sentinel for the master and chooses by this rule:
  //
  //  1. Only the addresses named with the highest config-epoch any sentinel reports
  //     are candidates (`SENTINEL MASTER <name>`, asked before the address so that a
  //     switch in between can only under-rate the new address). A config-epoch is
  //     created by a failover whose leader a majority of the sentinels elected, and
  //     the sentinels themselves converge on the configuration with the highest
  //     epoch; a sentinel cut off from the others (or paused and not yet reached by
  //     their hello messages) still reports the older epoch and the old master.
  //     Sentinels that report no epoch count below every reported one.
  //  2. Among the candidates, the one most sentinels name first.
  //  3. The client moves to an address other than its current master only when that
  //     address comes with a newer epoch than the one the current master was chosen
  //     under, or a majority of the sentinels in the URL name it. One stale sentinel
  //     never moves it (an old master that resumes answers ROLE "master" until the
  //     sentinels demote it: moving there would grant a lock held on the real master).
  //  4. Whatever is chosen, the current master included, must answer ROLE "master".
  //
  // A client that takes the first sentinel's answer and checks ROLE (the Sentinel
  // client guidelines; redis-py's discover_master also takes the first acceptable
  // answer) can be held on a hung old master or pulled back to a resumed one by such
  // a sentinel; the rule above costs one more command per sentinel and asking all.
  // `epoch` is the chosen address's epoch (-1: none reported). Every failure is
  // collected into `why`. discover_mu_ held.
  std::optional<Address> discover(std::string& why, bool& unknown_everywhere, long long& epoch) {
    struct Answer {
      Address addr;
      long long epoch = -1;
      std::size_t sentinel = 0;
    };
    std::vector<std::string> notes;
    std::vector<Answer> answers;
    std::size_t unknown = 0, answered = 0;
    for (std::size_t i = 0; i < sentinel_conns_.size(); ++i) {
      std::error_code ec;
      std::string err;
      const long long e = config_epoch(i, ec, err);
      Reply r;
      if (!ec) r = sentinel_command(i, {"SENTINEL", "get-master-addr-by-name", master_name_}, ec, err);
      if (ec) {
        notes.push_back(err.empty() ? describe_sentinel(i) + ": " + ec.message() : err);
        continue;
      }
      ++answered;
      if (r->type == REDIS_REPLY_NIL) {
        ++unknown;
        notes.push_back(describe_sentinel(i) + " does not monitor a master named \"" + master_name_ + "\"");
        continue;
      }
      Address a;
      if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
          !parse_port(redis::reply_str(r->element[1]), a.port)) {
        notes.push_back(describe_sentinel(i) + " answered get-master-addr-by-name unexpectedly");
        continue;
      }
      a.host = std::string(redis::reply_str(r->element[0]));
      answers.push_back({std::move(a), e, i});
    }
    unknown_everywhere = answered > 0 && unknown == answered;
    long long top = -1;
    for (const auto& x : answers) top = std::max(top, x.epoch);
    std::vector<std::pair<Address, std::size_t>> candidates;  // address, sentinels naming it
    for (const auto& x : answers) {
      if (x.epoch != top) {
        notes.push_back(describe_sentinel(x.sentinel) + " names " + x.addr.text() +
                        (x.epoch < 0 ? std::string(" without a config-epoch")
                                     : " with config-epoch " + std::to_string(x.epoch)) +
                        ", older than " + std::to_string(top));
        continue;
      }
      auto it = std::find_if(candidates.begin(), candidates.end(),
                             [&](const auto& c) { return c.first == x.addr; });
      if (it == candidates.end()) {
        candidates.emplace_back(x.addr, 1);
      } else {
        ++it->second;
      }
    }
    std::stable_sort(candidates.begin(), candidates.end(),
                     [](const auto& l, const auto& r) { return l.second > r.second; });
    const Address now = current_addr();
    const bool have_current = now.port != 0;
    for (const auto& [a, count] : candidates) {
      if (have_current && !(a == now)) {
        const bool newer = top >= 0 && top > current_epoch_;
        const bool majority = 2 * count > sentinel_conns_.size();
        if (!newer && !majority) {
          notes.push_back(std::to_string(count) + " of " + std::to_string(sentinel_conns_.size()) +
                          " sentinels name " + a.text() + " with config-epoch " + std::to_string(top) +
                          ", not newer than the current master's " + std::to_string(current_epoch_) +
                          " and not a majority: staying on " + now.text());
          continue;
        }
        // A majority naming an older epoch than the current master's has not heard of
        // the failover that chose it yet (the leader's hello has not reached them):
        // while the current master still answers as master, following them would pull
        // this client back to the old master while others hold locks on the new one.
        const bool older = top >= 0 && current_epoch_ >= 0 && top < current_epoch_;
        std::string current_why;
        if (older && is_master(now, current_why)) {
          notes.push_back(std::to_string(count) + " of " + std::to_string(sentinel_conns_.size()) +
                          " sentinels name " + a.text() + " with config-epoch " + std::to_string(top) +
                          ", older than the current master's " + std::to_string(current_epoch_) +
                          ", which still answers as master: staying on " + now.text());
          continue;
        }
      }
      std::string role_why;
      if (is_master(a, role_why)) {
        epoch = top;
        return a;
      }
      notes.push_back(std::to_string(count) + " sentinel(s) name " + a.text() + " as master, but " +
                      role_why);
    }
    why.clear();
    for (const auto& n : notes) why += (why.empty() ? "" : "; ") + n;
    return std::nullopt;
  }

  bool is_master(const Address& a, std::string& why) {
    ConnectionOptions o = master_tpl_;
    o.host = a.host;
    o.port = a.port;
    Connection c(o);
    std::error_code ec;
    Reply r = c.command({"ROLE"}, ec);
    if (ec) {
      why = c.last_error();
      return false;
    }
    const std::string_view role = r->type == REDIS_REPLY_ARRAY && r->elements > 0
                                      ? redis::reply_str(r->element[0])
                                      : std::string_view();
    if (role == "master") return true;
    why = "it answers ROLE with \"" + std::string(role) + "\"";
    return false;
  }

  // Makes a redis:// backend for `a`, subscribes the watched names on it, swaps it
  // in and wakes every waiter (a release may have happened while nobody listened on
  // the new master). discover_mu_ held.
  bool switch_to(const Address& a, std::error_code& ec, std::string& why) {
    ConnectionOptions o = master_tpl_;
    o.host = a.host;
    o.port = a.port;
    auto made = make_redis_backend_for(o, settings_, client_opts_, ec, why);
    if (!made) {
      log_.log(LogLevel::warning, "{}: cannot use master {}: {}", settings_.url, a.text(), why);
      return false;
    }
    std::shared_ptr<Backend> fresh(std::move(made));
    fresh->set_listener(this);
    std::vector<std::string> names;
    std::shared_ptr<Backend> old;
    Address was;
    {
      std::lock_guard wl(watch_mu_);
      for (const auto& [name, count] : watches_) {
        std::error_code wec;
        for (int k = 0; k < count && !wec; ++k) fresh->watch(name, wec);
        if (wec)
          log_.log(LogLevel::warning, "{}: cannot watch \"{}\" on the new master {}", settings_.url, name,
                   a.text());
        names.push_back(name);
      }
      std::lock_guard lk(mu_);
      old = std::move(current_);
      current_ = fresh;
      was = current_addr_;
      current_addr_ = a;
      ++generation_;
    }
    if (old) {
      log_.log(LogLevel::warning,
               "{}: master of \"{}\" moved from {} to {}; leases the new master lacks are lost",
               settings_.url, master_name_, was.text(), a.text());
    }
    old.reset();  // its subscriber stops (unless a call still uses it)
    for (const auto& n : names) on_change(n);
    return true;
  }

  // Subscribes to +switch-master on one sentinel after another; re-discovers on each
  // message for this master and every kRecheckEvery.
  void monitor() {
    std::size_t next = 0;
    while (!monitor_.stopping()) {
      const std::size_t i = next;
      next = (next + 1) % sentinel_opts_.size();
      ConnectionOptions o;
      {
        std::lock_guard lk(discover_mu_);
        o = sentinel_opts_[i];
      }
      std::error_code ec;
      std::string why;
      std::unique_ptr<redis::Socket> sock = redis::open_socket(o, ec, why);
      redis::ReaderPtr reader = redis::make_reader();
      if (sock && reader) {
        std::string cmd;
        const std::string_view argv[] = {"SUBSCRIBE", "+switch-master"};
        if (redis::format_command(cmd, argv) &&
            sock->write_all(cmd, redis::Socket::Clock::now() + o.command_timeout, why)) {
          listen(*sock, *reader);
        }
      }
      if (monitor_.stopping()) break;
      recheck();
      wait_wake(kResubscribeDelay);
    }
  }

  // Reads messages until the connection fails or the backend stops.
  void listen(redis::Socket& sock, redisReader& reader) {
    recheck();  // a switch between discovery and this subscription
    auto next_check = Steady::now() + kRecheckEvery;
    while (!monitor_.stopping()) {
      const auto left = std::chrono::duration_cast<Millis>(next_check - Steady::now()).count();
      pollfd fds[2] = {{monitor_.wake_fd(), POLLIN, 0}, {sock.fd(), POLLIN, 0}};
      const int n = ::poll(fds, 2, static_cast<int>(std::max<long long>(0, left)));
      if (n < 0 && errno != EINTR) return;
      if (fds[0].revents & POLLIN) monitor_.clear_wake();
      if (monitor_.stopping()) return;
      if (n > 0 && fds[1].revents != 0) {
        char buf[4096];
        short want = 0;
        std::string why;
        const long got = sock.read(buf, sizeof buf, want, why);
        if (got == 0 || got == -1) return;
        if (got > 0 && redisReaderFeed(&reader, buf, static_cast<std::size_t>(got)) != REDIS_OK) return;
        bool switched = false;
        for (;;) {
          void* raw = nullptr;
          if (redisReaderGetReply(&reader, &raw) != REDIS_OK) return;
          if (raw == nullptr) break;
          Reply r(static_cast<redisReply*>(raw));
          // {"message", "+switch-master", "<name> <old-ip> <old-port> <new-ip> <new-port>"}
          if (r->type == REDIS_REPLY_ARRAY && r->elements == 3 &&
              redis::reply_str(r->element[0]) == "message") {
            const std::string text(redis::reply_str(r->element[2]));
            if (text.compare(0, master_name_.size() + 1, master_name_ + " ") != 0) continue;
            switched = true;
            log_.log(LogLevel::info, "{}: a sentinel announced +switch-master {}", settings_.url, text);
          }
        }
        // One sentinel's message is not enough to move (discover()): it makes the
        // client ask them all now.
        if (switched) rediscover(current().second, true);
      }
      if (Steady::now() >= next_check) {
        recheck();
        next_check = Steady::now() + kRecheckEvery;
      }
    }
  }

  void recheck() { rediscover(current().second, true); }

  void wait_wake(Millis d) {
    pollfd p{monitor_.wake_fd(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(d.count())) > 0) monitor_.clear_wake();
  }

  std::vector<ConnectionOptions> sentinel_opts_;  // guarded by discover_mu_
  const std::string master_name_;
  const ConnectionOptions master_tpl_;
  const RedisSettings settings_;
  const ClientOptions client_opts_;
  Logger log_;
  std::atomic<ChangeListener*> listener_{nullptr};

  std::mutex discover_mu_;                  // serialises discovery and switches
  std::vector<Connection> sentinel_conns_;  // guarded by discover_mu_
  Steady::time_point last_discovery_{};     // guarded by discover_mu_
  bool no_master_ = false;                  // guarded by discover_mu_
  long long current_epoch_ = -1;            // the current master's config-epoch, guarded by discover_mu_

  std::mutex watch_mu_;                              // taken before mu_
  std::map<std::string, int, std::less<>> watches_;  // guarded by watch_mu_

  mutable std::mutex mu_;
  std::shared_ptr<Backend> current_;  // guarded by mu_
  Address current_addr_;              // guarded by mu_
  std::uint64_t generation_ = 0;      // guarded by mu_

  WorkerLoop monitor_;  // last: stopped first, while everything it uses is alive
};

}  // namespace

std::unique_ptr<Backend> make_sentinel_backend(const Url& url, const ClientOptions& opts, std::error_code& ec,
                                               std::string& why) {
  ec.clear();
  const std::string shown = "\"" + url.redacted() + "\"";
  auto bad = [&](std::string msg) -> std::unique_ptr<Backend> {
    ec = make_error_code(errc::invalid_url);
    why = std::move(msg);
    return nullptr;
  };
  if (url.hosts.empty()) {
    return bad("URL " + shown +
               " names no sentinel (expected redis+sentinel://host:26379[,host:26379...]/master-name)");
  }
  std::string name = url.path.empty() ? std::string() : url.path.substr(1);
  if (name.empty()) {
    return bad("URL " + shown +
               " names no master (expected the master's name after the sentinels: "
               "redis+sentinel://host:26379,.../mymaster)");
  }
  for (char c : name) {
    if (c == '/' || std::isspace(static_cast<unsigned char>(c)) ||
        std::iscntrl(static_cast<unsigned char>(c))) {
      return bad("master name \"" + name + "\" in URL " + shown +
                 " contains '/', a space or a control character");
    }
  }
  RedisSettings settings;
  settings.url = url.redacted();
  settings.prefix = url.query_or("prefix", "distlock");
  if (!redis_prefix_ok(settings.prefix)) {
    return bad("prefix \"" + settings.prefix + "\" in URL " + shown +
               " must be 1-256 bytes without '{' or '}' (they delimit the hash tag)");
  }
  // Types and ranges of wait= and wait_timeout= were checked against the scheme's
  // table (registry.cpp); what is left relates them to each other and to the timeouts.
  if (const auto wait = query_count(url, "wait")) settings.wait_replicas = static_cast<int>(*wait);
  if (const auto d = query_duration(url, "wait_timeout")) {
    if (settings.wait_replicas == 0) {
      return bad("wait_timeout in URL " + shown + " needs wait=N (the number of replicas to wait for)");
    }
    if (*d >= opts.command_timeout) {
      return bad("wait_timeout \"" + url.query.at("wait_timeout") + "\" in URL " + shown +
                 " must be shorter than the command timeout (" +
                 std::to_string(opts.command_timeout.count()) + " ms; raise it with timeout=)");
    }
    settings.wait_timeout = *d;
  } else if (settings.wait_replicas > 0) {
    settings.wait_timeout = std::min(Millis(1000), opts.command_timeout / 2);
  }
  if (!url.user.empty() && url.password.empty()) {
    return bad("URL " + shown +
               " names a user but no password (write user:password@, or :password@ for the default user)");
  }
  ConnectionOptions master;
  master.user = url.user;
  master.password = url.password;
  master.connect_timeout = opts.connect_timeout;
  master.command_timeout = opts.command_timeout;
  std::vector<ConnectionOptions> sentinels;
  for (const auto& h : url.hosts) {
    ConnectionOptions s = master;
    s.host = h.host;
    s.port = h.port != 0 ? h.port : kSentinelPort;
    sentinels.push_back(std::move(s));
  }
  auto backend = std::make_unique<SentinelBackend>(std::move(sentinels), name, master, settings, opts);
  if ((ec = backend->start(why))) {
    why = "URL " + shown + ": " + why;
    return nullptr;
  }
  return backend;
}

}  // namespace distlock::detail
