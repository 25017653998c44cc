#include "etcd_cluster.hpp"

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace distlock::testing {

using namespace std::chrono_literals;

CommandResult run_command(const std::vector<std::string>& argv, std::chrono::milliseconds timeout) {
  CommandResult r;
  int fds[2];
  if (::pipe(fds) != 0) return r;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], 1);
    ::dup2(fds[1], 2);
    ::close(fds[0]);
    ::close(fds[1]);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  const auto end = std::chrono::steady_clock::now() + timeout;
  char buf[4096];
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      ::kill(pid, SIGKILL);
      r.output += "\n[timed out]";
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n <= 0) break;
    r.output.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

namespace {
std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// etcdctl's arguments before its command: the endpoints, the two timeouts ("1s"), the user if
// any and, on a TLS cluster, the test CA and client certificate of `c`.
std::vector<std::string> etcdctl_argv(const EtcdCluster& c, bool tls, const std::string& endpoints,
                                      const char* dial_timeout, const char* command_timeout,
                                      const std::string& user = {}) {
  std::vector<std::string> argv{"etcdctl", "--endpoints=" + endpoints,
                                std::string("--dial-timeout=") + dial_timeout,
                                std::string("--command-timeout=") + command_timeout};
  if (!user.empty()) argv.push_back("--user=" + user);
  if (tls) {
    argv.push_back("--cacert=" + c.ca_file());
    argv.push_back("--cert=" + c.client_cert_file());
    argv.push_back("--key=" + c.client_key_file());
  }
  return argv;
}
}  // namespace

EtcdCluster::EtcdCluster(int members, bool tls) : EtcdCluster(members, EtcdClusterOptions{.tls = tls}) {}

EtcdCluster::EtcdCluster(int members, EtcdClusterOptions opts)
    : dir_("distlock-etcd"), tls_(opts.tls), compaction_retention_(opts.auto_compaction_retention) {
  for (const char* program : {"etcd", "etcdctl"}) {
    if (!have_program(program)) {
      ADD_FAILURE() << program << " not found in PATH: install etcd-server and etcd-client "
                    << "(scripts/bootstrap.sh); the etcd tests need a real server";
      throw std::runtime_error(std::string(program) + " missing");
    }
  }
  if (tls_) make_certificates();
  std::set<std::uint16_t> used;
  auto port = [&] {
    for (;;) {
      const auto p = free_port();
      if (used.insert(p).second) return p;
    }
  };
  members_.resize(static_cast<std::size_t>(members));
  pids_.assign(static_cast<std::size_t>(members), -1);
  for (int i = 0; i < members; ++i) {
    auto& m = members_[static_cast<std::size_t>(i)];
    m.name = "m" + std::to_string(i);
    m.client_port = port();
    m.peer_port = port();
    std::uint16_t advertised = m.peer_port;
    if (opts.peer_proxies) {
      m.peer_proxy = std::make_unique<FaultProxy>(m.peer_port);
      m.peer_proxy->set_classifier([this](int fd) { return member_of_dialer(fd); });
      advertised = m.peer_proxy->port();
    }
    if (!initial_cluster_.empty()) initial_cluster_ += ",";
    initial_cluster_ += m.name + "=http://127.0.0.1:" + std::to_string(advertised);
  }
  for (int i = 0; i < members; ++i) start(i, true);
  const auto end = std::chrono::steady_clock::now() + 30s;
  for (int i = 0; i < members; ++i) {
    if (!wait_port_open(members_[static_cast<std::size_t>(i)].client_port, 20s)) break;
  }
  CommandResult health;
  while (std::chrono::steady_clock::now() < end) {
    health = etcdctl({"endpoint", "health"});
    if (health.exit_code == 0 && leader() >= 0) return;
    std::this_thread::sleep_for(100ms);
  }
  std::string logs;
  for (int i = 0; i < members; ++i)
    logs += "\n--- " + members_[static_cast<std::size_t>(i)].name + ":\n" + log(i);
  ADD_FAILURE() << "etcd cluster of " << members << " did not become healthy: " << health.output << logs;
  throw std::runtime_error("etcd did not start");
}

EtcdCluster::~EtcdCluster() {
  for (auto& m : members_) {
    if (m.up) m.proc.signal(SIGCONT);
    m.proc.stop(2000ms);
  }
  for (auto& m : members_) m.peer_proxy.reset();
}

void EtcdCluster::start(int member, bool initial) {
  auto& m = members_[static_cast<std::size_t>(member)];
  const std::string client =
      (tls_ ? "https://127.0.0.1:" : "http://127.0.0.1:") + std::to_string(m.client_port);
  const std::string peer = "http://127.0.0.1:" + std::to_string(m.peer_port);
  // With peer proxies the member listens on its own peer port but tells the others
  // (and the initial cluster lists) its proxy: every peer dials through it.
  const std::string advertised_peer =
      m.peer_proxy ? "http://127.0.0.1:" + std::to_string(m.peer_proxy->port()) : peer;
  std::vector<std::string> argv{
      "etcd", "--name", m.name, "--data-dir", (dir_.path() / m.name).string(), "--listen-client-urls", client,
      "--advertise-client-urls", client, "--listen-peer-urls", peer, "--initial-advertise-peer-urls",
      advertised_peer, "--initial-cluster", initial_cluster_, "--initial-cluster-token", "distlock-test",
      "--initial-cluster-state", initial ? "new" : "existing",
      // Fast elections keep leader-change tests short.
      "--heartbeat-interval", "50", "--election-timeout", "500", "--logger", "zap", "--log-level", "warn",
      // Compaction as a production server has it (EtcdClusterOptions::auto_compaction_retention).
      "--auto-compaction-mode", "periodic", "--auto-compaction-retention", compaction_retention_};
  if (tls_) {
    for (const std::string& a : {"--cert-file=" + (dir_.path() / "server.pem").string(),
                                 "--key-file=" + (dir_.path() / "server.key").string(),
                                 "--trusted-ca-file=" + ca_file(), std::string("--client-cert-auth")}) {
      argv.push_back(a);
    }
  }
  m.proc = Process::spawn(argv, (dir_.path() / (m.name + ".log")).string());
  m.up = true;
  std::lock_guard lk(pids_mu_);
  pids_[static_cast<std::size_t>(member)] = m.proc.pid();
}

// Which member opened a peer connection. etcd's rafthttp requests do name their
// sender (header X-Server-From, and the stream path /raft/stream/<type>/<sender id>
// in etcd 3.4), but not every peer request does: the /version and /members probes
// and a follower's forwarded lease renewals (/leases, /leases/internal) carry no
// sender, and the renewals are exactly the traffic that must be cut for a client
// attached to an isolated follower. So the proxy does not read the request at all:
// it asks the kernel which member process holds the other end of the accepted
// loopback socket (dialer_pid). Every peer connection, whatever it carries, gets its
// sender. A connection whose dialer closed it before the proxy accepted it (a dial
// that timed out while the proxy was busy) has no process left: class kDialerGone,
// which isolate() freezes at every proxy (it may come from the isolated member, and
// nothing live waits on it). Policy for a connection still open whose dialer is not
// found (not expected): kUnclassified, which isolate() cuts at the isolated member's
// proxy and lets through at the others; unclassified_peer_connections() counts them
// so a test can show that this policy never decided anything.
int EtcdCluster::member_of_dialer(int accepted_fd) const {
  std::vector<pid_t> pids;
  {
    std::lock_guard lk(pids_mu_);
    pids = pids_;
  }
  const pid_t pid = dialer_pid(accepted_fd, pids);
  for (std::size_t i = 0; i < pids.size(); ++i) {
    if (pid > 0 && pids[i] == pid) return static_cast<int>(i);
  }
  return dialer_closed(accepted_fd) ? kDialerGone : FaultProxy::kUnclassified;
}

void EtcdCluster::isolate(int member) {
  for (int j = 0; j < size(); ++j) {
    auto& proxy = members_[static_cast<std::size_t>(j)].peer_proxy;
    if (!proxy) throw std::logic_error("EtcdCluster::isolate needs peer_proxies");
    if (j == member) {
      for (int k = 0; k < size(); ++k) {
        if (k != member) proxy->freeze_class(k);
      }
      proxy->freeze_class(FaultProxy::kUnclassified);
    } else {
      proxy->freeze_class(member);
    }
    proxy->freeze_class(kDialerGone);
  }
}

void EtcdCluster::heal() {
  for (auto& m : members_) {
    if (m.peer_proxy) m.peer_proxy->pass_all_classes();
  }
}

int EtcdCluster::unclassified_peer_connections() const {
  int n = 0;
  for (const auto& m : members_) {
    if (m.peer_proxy) n += m.peer_proxy->unclassified();
  }
  return n;
}

std::string EtcdCluster::url(const std::string& suffix) const {
  return "etcd://" + endpoints() + suffix;
}

std::string EtcdCluster::endpoint(int member) const {
  return "127.0.0.1:" + std::to_string(members_[static_cast<std::size_t>(member)].client_port);
}

std::string EtcdCluster::endpoints() const {
  std::string out;
  for (int i = 0; i < size(); ++i) {
    if (!out.empty()) out += ",";
    out += endpoint(i);
  }
  return out;
}

CommandResult EtcdCluster::etcdctl(const std::vector<std::string>& args, const std::string& user) const {
  std::string live;
  for (int i = 0; i < size(); ++i) {
    if (!members_[static_cast<std::size_t>(i)].up) continue;
    if (!live.empty()) live += ",";
    live += endpoint(i);
  }
  std::vector<std::string> argv = etcdctl_argv(*this, tls_, live, "2s", "5s", user);
  argv.insert(argv.end(), args.begin(), args.end());
  return run_command(argv, 15s);
}

std::string EtcdCluster::etcdctl_ok(const std::vector<std::string>& args, const std::string& user) const {
  auto r = etcdctl(args, user);
  if (r.exit_code != 0) {
    std::string cmd;
    for (const auto& a : args) cmd += " " + a;
    ADD_FAILURE() << "etcdctl" << cmd << " failed (" << r.exit_code << "): " << r.output;
  }
  return r.output;
}

int EtcdCluster::leader() const {
  for (int i = 0; i < size(); ++i) {
    if (!members_[static_cast<std::size_t>(i)].up) continue;
    std::vector<std::string> argv = etcdctl_argv(*this, tls_, endpoint(i), "1s", "2s");
    for (const char* a : {"endpoint", "status", "-w", "json"}) argv.emplace_back(a);
    auto r = run_command(argv, 5s);
    if (r.exit_code != 0) continue;
    try {
      const auto j = nlohmann::json::parse(r.output);
      const auto& st = j.at(0).at("Status");
      if (st.at("leader").get<std::uint64_t>() == 0) continue;
      if (st.at("header").at("member_id").get<std::uint64_t>() == st.at("leader").get<std::uint64_t>())
        return i;
    } catch (const std::exception&) {
    }
  }
  return -1;
}

void EtcdCluster::kill(int member) {
  auto& m = members_[static_cast<std::size_t>(member)];
  m.proc.signal(SIGKILL);
  m.proc.wait_for(5s);
  m.up = false;
}

void EtcdCluster::pause(int member) {
  members_[static_cast<std::size_t>(member)].proc.signal(SIGSTOP);
}
void EtcdCluster::resume(int member) {
  members_[static_cast<std::size_t>(member)].proc.signal(SIGCONT);
}

void EtcdCluster::restart(int member) {
  start(member, false);
  wait_port_open(members_[static_cast<std::size_t>(member)].client_port, 20s);
}

namespace {
// The last `n` bytes of a file (a member's log), for an error message.
std::string tail_of(const std::filesystem::path& file, std::size_t n) {
  std::ifstream in(file);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return text.size() > n ? text.substr(text.size() - n) : text;
}
}  // namespace

// Removes, wipes, adds back and restarts one member; returns once a read through it alone
// succeeds. On a busy machine a rejoin can miss its bound (the member started before the
// others committed its addition, or it was starved while it caught up), so the whole rejoin
// is tried twice: 20 s to serve, then 40 s. Every step is bounded.
void EtcdCluster::wipe_and_rejoin(int member) {
  std::string why;
  if (try_wipe_and_rejoin(member, 20s, why)) return;
  std::string again;
  if (try_wipe_and_rejoin(member, 40s, again)) return;
  throw std::runtime_error(why + "; then, tried again: " + again);
}

bool EtcdCluster::try_wipe_and_rejoin(int member, std::chrono::seconds serve_within, std::string& why) {
  kill(member);
  auto& m = members_[static_cast<std::size_t>(member)];
  const std::string advertised_peer =
      "http://127.0.0.1:" + std::to_string(m.peer_proxy ? m.peer_proxy->port() : m.peer_port);
  // Each step is retried while the others elect a leader, up to 10 s. A member added but
  // never started is listed without a name: it is found by its peer URL.
  auto until = std::chrono::steady_clock::now() + 10s;
  for (;;) {
    auto list = etcdctl({"member", "list", "-w", "json"});
    std::string id;
    bool listed = false;
    if (list.exit_code == 0) {
      try {
        const auto members = nlohmann::json::parse(list.output);
        listed = true;
        for (const auto& e : members.at("members")) {
          bool ours = e.value("name", "") == m.name;
          for (const auto& url : e.value("peerURLs", std::vector<std::string>{}))
            ours = ours || url == advertised_peer;
          if (ours) {
            std::ostringstream hex;
            hex << std::hex << e.at("ID").get<std::uint64_t>();
            id = hex.str();
          }
        }
      } catch (const std::exception&) {
        listed = false;
      }
    }
    if (listed && id.empty()) break;  // not a member (a first attempt removed it already)
    CommandResult removed;
    if (!id.empty()) {
      removed = etcdctl({"member", "remove", id});
      if (removed.exit_code == 0) break;
    }
    if (std::chrono::steady_clock::now() > until) {
      why = "cannot remove etcd member " + m.name + " (id " + id +
            ") within 10 s: " + (id.empty() ? list.output : removed.output);
      return false;
    }
    std::this_thread::sleep_for(100ms);
  }
  std::filesystem::remove_all(dir_.path() / m.name);
  until = std::chrono::steady_clock::now() + 10s;
  for (;;) {
    auto add = etcdctl({"member", "add", m.name, "--peer-urls=" + advertised_peer});
    if (add.exit_code == 0) break;
    if (std::chrono::steady_clock::now() > until) {
      why = "cannot add etcd member " + m.name + " back within 10 s: " + add.output;
      return false;
    }
    std::this_thread::sleep_for(100ms);
  }
  start(member, false);
  // It serves once it has the leader's state: a linearizable read through it alone.
  until = std::chrono::steady_clock::now() + serve_within;
  std::vector<std::string> argv = etcdctl_argv(*this, tls_, endpoint(member), "1s", "2s");
  for (const char* a : {"get", "distlock-test-rejoin-probe"}) argv.emplace_back(a);
  for (;;) {
    auto r = run_command(argv, 5s);
    if (r.exit_code == 0) return true;
    if (std::chrono::steady_clock::now() > until) {
      why = "etcd member " + m.name + " did not serve within " + std::to_string(serve_within.count()) +
            " s of rejoining empty: " + r.output +
            "; its log ends: " + tail_of(dir_.path() / (m.name + ".log"), 1500);
      return false;
    }
    std::this_thread::sleep_for(100ms);
  }
}

std::int64_t EtcdCluster::revision(const std::string& user) const {
  auto r = etcdctl({"get", "distlock-test-revision-probe", "-w", "json"}, user);
  try {
    return nlohmann::json::parse(r.output).at("header").at("revision").get<std::int64_t>();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "cannot read the etcd revision: " << e.what() << ": " << r.output;
    return -1;
  }
}

// A throw-away CA, a server certificate for 127.0.0.1 and a client certificate.
void EtcdCluster::make_certificates() {
  if (!have_program("openssl")) {
    ADD_FAILURE() << "openssl not found in PATH: the TLS test makes its certificates with it";
    throw std::runtime_error("openssl missing");
  }
  const std::string d = dir_.path().string() + "/";
  const std::vector<std::vector<std::string>> steps = {
      {"openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", d + "ca.key", "-out",
       d + "ca.pem", "-days", "2", "-subj", "/CN=distlock-test-ca"},
      {"openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", d + "server.key", "-out",
       d + "server.csr", "-subj", "/CN=127.0.0.1"},
      {"sh", "-c", "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > " + d + "server.ext"},
      {"openssl", "x509", "-req", "-in", d + "server.csr", "-CA", d + "ca.pem", "-CAkey", d + "ca.key",
       "-CAcreateserial", "-out", d + "server.pem", "-days", "2", "-extfile", d + "server.ext"},
      {"openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", d + "client.key", "-out",
       d + "client.csr", "-subj", "/CN=distlock-client"},
      {"openssl", "x509", "-req", "-in", d + "client.csr", "-CA", d + "ca.pem", "-CAkey", d + "ca.key",
       "-CAcreateserial", "-out", d + "client.pem", "-days", "2"},
  };
  for (const auto& step : steps) {
    const auto r = run_command(step, 60s);
    if (r.exit_code != 0) {
      ADD_FAILURE() << step[0] << " " << step[1] << " failed: " << r.output;
      throw std::runtime_error("certificate generation failed");
    }
  }
}

std::string EtcdCluster::log(int member) const {
  return slurp(dir_.path() / (members_[static_cast<std::size_t>(member)].name + ".log"));
}

}  // namespace distlock::testing
