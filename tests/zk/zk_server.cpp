#include "zk/zk_server.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "support/harness_setup.hpp"

namespace distlock::testing {

ZkInstall find_zookeeper() {
  ZkInstall z;
  for (const char* candidate : {"/usr/bin/java", "/usr/lib/jvm/default-java/bin/java"}) {
    if (::access(candidate, X_OK) == 0) {
      z.java = candidate;
      break;
    }
  }
  if (z.java.empty() && have_program("java")) z.java = "java";
  if (z.java.empty()) {
    z.problem =
        "java is not installed (Debian: apt-get install default-jre-headless; scripts/bootstrap.sh does it)";
    return z;
  }
  // zookeeper.jar's manifest names its dependencies; slf4j-nop keeps the server quiet.
  const std::string jar = "/usr/share/java/zookeeper.jar";
  if (::access(jar.c_str(), R_OK) != 0) {
    z.problem = jar + " is missing (Debian: apt-get install zookeeper; scripts/bootstrap.sh does it)";
    return z;
  }
  z.classpath = jar;
  for (const char* extra : {"/usr/share/java/zookeeper-jute.jar", "/usr/share/java/slf4j-nop.jar"}) {
    if (::access(extra, R_OK) == 0) z.classpath += std::string(":") + extra;
  }
  return z;
}

std::string four_letter(std::uint16_t port, const std::string& cmd) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return {};
  timeval tv{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::send(fd, cmd.data(), cmd.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(cmd.size())) {
    char buf[4096];
    for (;;) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      out.append(buf, static_cast<std::size_t>(n));
    }
  }
  ::close(fd);
  return out;
}

ZkServer::ZkServer(ZkServerOptions opts) : LocalServerProcess("distlock-zk"), opts_(opts) {
  pick_free_port();
  // A server that exits before serving lost its port to another test's server (free_port()'s
  // race, see ZkEnsemble): it starts again on a new port, at most three times.
  for (int attempt = 1;; ++attempt) {
    write_config();
    spawn();
    if (wait_serving(std::chrono::seconds(30))) return;
    const bool exited = !process_.running();
    if (!exited || attempt == 3) {
      fail_setup("ZooKeeper on port " + std::to_string(port_) +
                 (exited ? " exited before serving, 3 times on new ports" : " did not start within 30 s") +
                 "; its log:\n" + file_text(dir_.path() / "server.log"));
    }
    pick_free_port();
  }
}

ZkServer::ZkServer(ZkServerOptions opts, int id, std::vector<std::uint16_t> quorum_ports,
                   std::vector<std::uint16_t> election_ports, std::vector<std::uint16_t> client_ports)
    : LocalServerProcess("distlock-zk" + std::to_string(id)),
      opts_(opts),
      id_(id),
      quorum_ports_(std::move(quorum_ports)),
      election_ports_(std::move(election_ports)),
      client_ports_(std::move(client_ports)) {
  port_ = client_ports_.at(static_cast<std::size_t>(id - 1));
  write_config();
}

void ZkServer::write_config() {
  std::filesystem::create_directories(dir_.path() / "data");
  std::ofstream cfg(dir_.path() / "zoo.cfg");
  cfg << "tickTime=" << opts_.tick_ms << "\n"
      << "dataDir=" << (dir_.path() / "data").string() << "\n"
      << "clientPort=" << port_ << "\n"
      << "clientPortAddress=127.0.0.1\n"
      << "minSessionTimeout=" << opts_.min_session_ms << "\n"
      << "maxSessionTimeout=" << opts_.max_session_ms << "\n"
      << "admin.enableServer=false\n"
      << "4lw.commands.whitelist=*\n"
      << "maxClientCnxns=0\n";
  if (id_ > 0) {
    cfg << "initLimit=50\nsyncLimit=10\n";
    for (std::size_t i = 0; i < client_ports_.size(); ++i) {
      cfg << "server." << (i + 1) << "=127.0.0.1:" << quorum_ports_[i] << ":" << election_ports_[i] << "\n";
    }
    std::ofstream(dir_.path() / "data" / "myid") << id_ << "\n";
  }
}

void ZkServer::reconfigure(const ZkServerOptions& opts) {
  opts_ = opts;
  write_config();
}

void ZkServer::start() {
  spawn();
  if (id_ == 0 && !wait_serving(std::chrono::seconds(30))) {
    fail_setup("ZooKeeper on port " + std::to_string(port_) + " did not start within 30 s; its log:\n" +
               file_text(dir_.path() / "server.log"));
  }
}

void ZkServer::spawn() {
  const ZkInstall z = find_zookeeper();
  if (!z.problem.empty()) fail_setup("cannot start ZooKeeper: " + z.problem);
  const std::string main_class = id_ > 0 ? "org.apache.zookeeper.server.quorum.QuorumPeerMain"
                                         : "org.apache.zookeeper.server.ZooKeeperServerMain";
  std::vector<std::string> argv = {z.java,
                                   "-Xms32m",
                                   "-Xmx256m",
                                   "-XX:+UseSerialGC",
                                   "-XX:TieredStopAtLevel=1",
                                   "-Djava.net.preferIPv4Stack=true",
                                   "-Dzookeeper.admin.enableServer=false"};
  if (opts_.container_check_ms > 0)
    argv.push_back("-Dznode.container.checkIntervalMs=" + std::to_string(opts_.container_check_ms));
  for (const std::string& a :
       {std::string("-cp"), z.classpath, main_class, (dir_.path() / "zoo.cfg").string()})
    argv.push_back(a);
  launch(argv, "server.log");
}

bool ZkServer::wait_serving(std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (!mode().empty()) return true;
    if (!process_.running()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return !mode().empty();
}

std::string ZkServer::mode() const {
  const std::string s = four_letter(port_, "srvr");
  const auto p = s.find("Mode: ");
  if (p == std::string::npos) return {};
  return s.substr(p + 6, s.find('\n', p) - (p + 6));
}

namespace {

std::uint64_t read_be(const std::string& s, std::size_t at, int bytes) {
  std::uint64_t v = 0;
  for (int k = 0; k < bytes; ++k)
    v = (v << 8) | static_cast<unsigned char>(s[at + static_cast<std::size_t>(k)]);
  return v;
}

// ZooKeeper 3.8's election handshake (QuorumCnxManager): the dialer first sends
// int64 protocol version (negative), int64 its server id, int32 n and n bytes of its
// own election address(es) "host:port[|host:port]". When the dialer has the lower id
// the receiver closes that connection and dials back *that announced address*, which
// is the dialer's real election port, not a proxy: a partition made of per-pair
// proxies alone would leak election traffic through those dial-backs. This rewrites
// the announced address to the proxy the receiver uses to reach the dialer.
// (An old-style first message, a non-negative server id alone, carries no address.)
FaultProxy::HeadRewriter announce_as(const std::string& address) {
  return [address](std::string& head) {
    if (head.size() < 8) return false;
    if (static_cast<std::int64_t>(read_be(head, 0, 8)) >= 0) return true;
    if (head.size() < 20) return false;
    const std::uint64_t n = read_be(head, 16, 4);
    if (n > 4096) return true;  // not a handshake we know: leave it alone
    if (head.size() < 20 + n) return false;
    std::string out = head.substr(0, 16);
    const auto len = static_cast<std::uint32_t>(address.size());
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((len >> shift) & 0xff));
    out += address;
    out += head.substr(20 + n);
    head = std::move(out);
    return true;
  };
}

}  // namespace

ZkEnsemble::ZkEnsemble(int servers, ZkServerOptions opts) {
  // free_port() hands out a port that was free a moment ago; a JVM takes a second or two to
  // bind it, and other tests start servers meanwhile. A member that exits before serving (its
  // port taken: ZooKeeper's console log is empty then) is a lost race, not a broken server:
  // the whole ensemble starts again on new ports, at most three times.
  std::string exited;
  for (int attempt = 1; attempt <= 3; ++attempt) {
    exited = start_members(servers, opts);
    if (exited.empty()) return;
    servers_.clear();
    proxies_.clear();
  }
  fail_setup("ZooKeeper ensemble: a member exited before serving in 3 attempts on new ports; the last: " +
             exited);
}

std::string ZkEnsemble::start_members(int servers, const ZkServerOptions& opts) {
  std::vector<std::uint16_t> quorum, election, client;
  for (int i = 0; i < servers; ++i) {
    quorum.push_back(free_port());
    election.push_back(free_port());
    client.push_back(free_port());
  }
  const auto n = static_cast<std::size_t>(servers);
  if (opts.peer_proxies) {
    proxies_.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      proxies_[i].resize(n);
      for (std::size_t j = 0; j < n; ++j) {
        if (i == j) continue;
        proxies_[i][j].quorum = std::make_unique<FaultProxy>(quorum[j]);
        proxies_[i][j].election = std::make_unique<FaultProxy>(election[j]);
        // A follower dials a newly elected leader's quorum port maybe before the
        // leader binds it: refused, it retries; through a proxy it would see the
        // accepted connection closed instead and go back to electing (a 10 s
        // detour, initLimit). The proxy retries for it.
        for (auto* p : {proxies_[i][j].quorum.get(), proxies_[i][j].election.get()})
          p->set_upstream_retry(std::chrono::milliseconds(5000));
      }
    }
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t j = 0; j < n; ++j) {
        if (i == j) continue;
        // j dials i back through proxies_[j][i].
        proxies_[i][j].election->set_head_rewriter(
            announce_as("127.0.0.1:" + std::to_string(proxies_[j][i].election->port())));
      }
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    // Each server's own zoo.cfg: its own ports as they are (it listens there), every
    // other server at the proxy this server dials it through.
    std::vector<std::uint16_t> q = quorum, e = election;
    if (opts.peer_proxies) {
      for (std::size_t j = 0; j < n; ++j) {
        if (j == i) continue;
        q[j] = proxies_[i][j].quorum->port();
        e[j] = proxies_[i][j].election->port();
      }
    }
    servers_.push_back(std::unique_ptr<ZkServer>(
        new ZkServer(opts, static_cast<int>(i) + 1, std::move(q), std::move(e), client)));
  }
  for (auto& s : servers_) s->start();
  for (auto& s : servers_) {
    if (s->wait_serving(std::chrono::seconds(60))) continue;
    const std::string log = file_text(s->dir_.path() / "server.log");
    if (!s->process_.running()) {
      return "member on port " + std::to_string(s->port()) + " exited (status " +
             std::to_string(s->process_.wait_for(std::chrono::milliseconds(0))) + "); its log:\n" + log;
    }
    fail_setup("ZooKeeper ensemble member on port " + std::to_string(s->port()) +
               " did not join within 60 s; its log:\n" + log);
  }
  return {};
}

std::string ZkEnsemble::hostports() const {
  std::string out;
  for (const auto& s : servers_) {
    if (!out.empty()) out += ',';
    out += s->hostport();
  }
  return out;
}

void ZkEnsemble::isolate(int i) {
  if (proxies_.empty()) throw std::logic_error("ZkEnsemble::isolate needs peer_proxies");
  const auto me = static_cast<std::size_t>(i);
  for (std::size_t j = 0; j < proxies_.size(); ++j) {
    if (j == me) continue;
    for (auto* pp : {&proxies_[me][j], &proxies_[j][me]}) {
      pp->quorum->freeze();
      pp->election->freeze();
    }
  }
}

void ZkEnsemble::heal() {
  for (auto& row : proxies_) {
    for (auto& pp : row) {
      if (pp.quorum) pp.quorum->pass();
      if (pp.election) pp.election->pass();
    }
  }
}

int ZkEnsemble::leader() const {
  for (std::size_t i = 0; i < servers_.size(); ++i) {
    if (servers_[i]->mode() == "leader") return static_cast<int>(i);
  }
  return -1;
}

namespace {
void quiet_log(const char*) {}
}  // namespace

RawZk::RawZk(const std::string& hostport, const std::string& credentials) {
  zh_ = zookeeper_init2(hostport.c_str(), nullptr, 10'000, nullptr, nullptr, 0, &quiet_log);
  if (zh_ == nullptr) fail_setup("RawZk: zookeeper_init failed for " + hostport);
  if (!credentials.empty()) {
    zoo_add_auth(zh_, "digest", credentials.data(), static_cast<int>(credentials.size()), nullptr, nullptr);
  }
  wait_connected();
}

RawZk::RawZk(const std::string& hostport, const clientid_t& session) {
  zh_ = zookeeper_init2(hostport.c_str(), nullptr, 10'000, &session, nullptr, 0, &quiet_log);
  if (zh_ == nullptr) fail_setup("RawZk: zookeeper_init failed for " + hostport);
  wait_connected();
}

RawZk::~RawZk() {
  if (zh_ != nullptr) zookeeper_close(zh_);
}

void RawZk::wait_connected() {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < end) {
    if (zoo_state(zh_) == ZOO_CONNECTED_STATE) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  fail_setup("RawZk: no connection within 10 s");
}

bool RawZk::connected() const {
  return zoo_state(zh_) == ZOO_CONNECTED_STATE;
}

std::vector<std::string> RawZk::children(const std::string& path) {
  String_vector v{};
  std::vector<std::string> out;
  if (zoo_get_children(zh_, path.c_str(), 0, &v) == ZOK) {
    for (int i = 0; i < v.count; ++i) out.emplace_back(v.data[i]);
    deallocate_String_vector(&v);
  }
  return out;
}

int RawZk::create(const std::string& path, int mode) {
  return zoo_create(zh_, path.c_str(), nullptr, -1, &ZOO_OPEN_ACL_UNSAFE, mode, nullptr, 0);
}

int RawZk::remove(const std::string& path, int version) {
  return zoo_delete(zh_, path.c_str(), version);
}

int RawZk::exists(const std::string& path, Stat* stat) {
  Stat local{};
  return zoo_exists(zh_, path.c_str(), 0, stat != nullptr ? stat : &local);
}

}  // namespace distlock::testing
