// The redis+sentinel:// backend: finding the master through the sentinels (discover()),
// switching to it, and the factory.
#include "redis/sentinel_backend.hpp"

#include "redis/sentinel_backend_impl.hpp"

namespace distlock::detail {

namespace redis {

namespace {

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

}  // namespace

// Finds the master and connects to it; then starts the monitor.
void SentinelBackend::start(Error& ec) {
  ec.clear();
  {
    LockGuard lk(discover_mu_);
    long long epoch = -1;
    auto addr = discover(ec, epoch);
    if (!addr) return;
    if (!switch_to(*addr, ec)) return;
    current_epoch_ = epoch;
    last_discovery_ = Steady::now();
  }
  drainer_.start([this] { drain_legs(); });
  monitor_.start([this] { monitor(); });
}

// True when the master changed since `generation` (by this call or another).
bool SentinelBackend::rediscover(std::uint64_t generation, bool forced) {
  LockGuard lk(discover_mu_);
  if (current().second != generation) return true;
  const auto now = Steady::now();
  if (!forced && now - last_discovery_ < kMinRediscover) return false;
  last_discovery_ = now;
  Error ec;
  long long epoch = -1;
  auto addr = discover(ec, epoch);
  if (!addr) {
    // Once per outage at warning level: the monitor retries several times a second.
    log_.log(std::exchange(no_master_, true) ? LogLevel::debug : LogLevel::warning, "{}: no master found: {}",
             settings_.url, ec.detail());
    return false;
  }
  if (std::exchange(no_master_, false)) {
    log_.log(LogLevel::info, "{}: the sentinels name master {} again", settings_.url, addr->text());
  }
  if (*addr == current_addr()) {
    current_epoch_ = epoch;  // also when the sentinels' epochs restarted (re-monitored)
    return false;
  }
  if (!switch_to(*addr, ec)) return false;
  current_epoch_ = epoch;
  return true;
}

// One command to sentinel i (discover_mu_ held). A sentinel that has no password
// and refuses AUTH is asked again without credentials from then on.
Reply SentinelBackend::sentinel_command(std::size_t i, std::initializer_list<std::string_view> argv,
                                        Error& ec) {
  Reply r = sentinel_conns_[i].command(argv, ec);
  if (ec == errc::auth_failed && no_password_configured(ec.detail())) {
    sentinel_opts_[i].user.clear();
    sentinel_opts_[i].password.clear();
    sentinel_conns_[i] = Connection(sentinel_opts_[i]);
    r = sentinel_conns_[i].command(argv, ec);
  }
  if (ec) ec.set_detail("sentinel " + ec.detail());
  return r;
}

// The config-epoch sentinel i reports for the master (`SENTINEL MASTER <name>`,
// field config-epoch), or -1 when it gives none (an error, an unexpected reply).
// Sets `ec` only when the sentinel did not answer at all. discover_mu_ held.
long long SentinelBackend::config_epoch(std::size_t i, Error& ec) {
  Reply r = sentinel_command(i, {"SENTINEL", "MASTER", master_name_}, ec);
  if (ec) {
    // An error reply (no such master, an ACL without SENTINEL MASTER) is an answer
    // without an epoch; no answer or a refused password is not an answer.
    const bool answered = ec != errc::backend_unavailable &&
                          (ec != errc::auth_failed || ec.detail().find("NOPERM") != std::string::npos);
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
// collected into the detail of `ec`: invalid_argument when every sentinel that answered
// monitors no master of that name, else backend_unavailable. discover_mu_ held.
std::optional<Address> SentinelBackend::discover(Error& ec, long long& epoch) {
  struct Answer {
    Address addr;
    long long epoch = -1;
    std::size_t sentinel = 0;
  };
  std::vector<std::string> notes;
  std::vector<Answer> answers;
  std::size_t unknown = 0, answered = 0;
  for (std::size_t i = 0; i < sentinel_conns_.size(); ++i) {
    Error err;
    const long long e = config_epoch(i, err);
    Reply r;
    if (!err) r = sentinel_command(i, {"SENTINEL", "get-master-addr-by-name", master_name_}, err);
    if (err) {
      notes.push_back(err.detail().empty() ? describe_sentinel(i) + ": " + err.message() : err.detail());
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
  const bool unknown_everywhere = answered > 0 && unknown == answered;
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
    auto it =
        std::find_if(candidates.begin(), candidates.end(), [&](const auto& c) { return c.first == x.addr; });
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
      if (older && why_not_master(now).empty()) {
        notes.push_back(std::to_string(count) + " of " + std::to_string(sentinel_conns_.size()) +
                        " sentinels name " + a.text() + " with config-epoch " + std::to_string(top) +
                        ", older than the current master's " + std::to_string(current_epoch_) +
                        ", which still answers as master: staying on " + now.text());
        continue;
      }
    }
    const std::string role_why = why_not_master(a);
    if (role_why.empty()) {
      epoch = top;
      ec.clear();
      return a;
    }
    notes.push_back(std::to_string(count) + " sentinel(s) name " + a.text() + " as master, but " + role_why);
  }
  std::string why;
  for (const auto& n : notes) why += (why.empty() ? "" : "; ") + n;
  ec.fail(unknown_everywhere ? errc::invalid_argument : errc::backend_unavailable, std::move(why));
  return std::nullopt;
}

// "" when the server at `a` answers ROLE as a master; else why not (it cannot be
// reached, or the role it answers).
std::string SentinelBackend::why_not_master(const Address& a) {
  ConnectionOptions o = master_tpl_;
  o.host = a.host;
  o.port = a.port;
  Connection c(o);
  Error ec;
  Reply r = c.command({"ROLE"}, ec);
  if (ec) return ec.detail();
  const std::string_view role =
      r->type == REDIS_REPLY_ARRAY && r->elements > 0 ? redis::reply_str(r->element[0]) : std::string_view();
  if (role == "master") return {};
  return "it answers ROLE with \"" + std::string(role) + "\"";
}

// Makes a redis:// backend for `a`, subscribes the watched names on it, swaps it
// in, moves every prefix watch to it (each reports a gap once it watches the new
// master) and wakes every waiter (a release may have happened while nobody listened on
// the new master). discover_mu_ held.
bool SentinelBackend::switch_to(const Address& a, Error& ec) {
  ConnectionOptions o = master_tpl_;
  o.host = a.host;
  o.port = a.port;
  auto made = make_redis_backend_for(o, settings_, client_opts_, ec);
  if (!made) {
    log_.log(LogLevel::warning, "{}: cannot use master {}: {}", settings_.url, a.text(), ec.detail());
    return false;
  }
  std::shared_ptr<Backend> fresh(std::move(made));
  fresh->set_listener(this);
  std::vector<std::string> names;
  std::shared_ptr<Backend> old;
  Address was;
  std::vector<DrainingLeg> draining;
  {
    LockGuard wl(watch_mu_);
    for (const auto& [name, count] : watches_) {
      Error wec;
      for (int k = 0; k < count && !wec; ++k) fresh->watch(name, wec);
      if (wec)
        log_.log(LogLevel::warning, "{}: cannot watch \"{}\" on the new master {}", settings_.url, name,
                 a.text());
      names.push_back(name);
    }
    std::uint64_t generation = 0;
    {
      LockGuard lk(mu_);
      old = std::move(current_);
      current_ = fresh;
      was = current_addr_;
      current_addr_ = a;
      generation = ++generation_;
    }
    move_prefix_watches(fresh, generation, was, a, draining);
  }
  if (old) {
    log_.log(LogLevel::warning,
             "{}: master of \"{}\" moved from {} to {}; leases the new master lacks are lost", settings_.url,
             master_name_, was.text(), a.text());
  }
  // The prefix watches' old subscriptions run on until the old master is demoted
  // (sentinel_watch.cpp): what they still carry is reported as a gap.
  if (!draining.empty()) start_drain(was, std::move(draining));
  old.reset();  // its subscriber stops (unless a call still uses it)
  for (const auto& n : names) on_change(n);
  return true;
}

}  // namespace redis

std::unique_ptr<Backend> make_sentinel_backend(const Url& url, const ClientOptions& opts, Error& err) {
  err.clear();
  const std::string shown = "\"" + url.redacted() + "\"";
  auto bad = [&](std::string msg) -> std::unique_ptr<Backend> {
    err.fail(errc::invalid_url, std::move(msg));
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
  // table (redis_scheme.cpp); what is left relates them to each other and to the timeouts.
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
  redis::ConnectionOptions master;
  master.user = url.user;
  master.password = url.password;
  master.connect_timeout = opts.connect_timeout;
  master.command_timeout = opts.command_timeout;
  std::vector<redis::ConnectionOptions> sentinels;
  for (const auto& h : url.hosts) {
    redis::ConnectionOptions s = master;
    s.host = h.host;
    s.port = h.port != 0 ? h.port : redis::kSentinelPort;
    sentinels.push_back(std::move(s));
  }
  auto backend = std::make_unique<redis::SentinelBackend>(std::move(sentinels), name, master, settings, opts);
  backend->start(err);
  if (err) {
    err.set_detail("URL " + shown + ": " + err.detail());
    return nullptr;
  }
  return backend;
}

}  // namespace distlock::detail
