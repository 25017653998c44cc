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

namespace distlock::testing {

namespace {

[[noreturn]] void fail_setup(const std::string& msg) {
  ADD_FAILURE() << msg;
  throw std::runtime_error(msg);
}

std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

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

ZkServer::ZkServer(ZkServerOptions opts) : opts_(opts), client_port_(free_port()), dir_("distlock-zk") {
  write_config();
  start();
}

ZkServer::ZkServer(ZkServerOptions opts, int id, std::vector<std::uint16_t> quorum_ports,
                   std::vector<std::uint16_t> election_ports, std::vector<std::uint16_t> client_ports)
    : opts_(opts),
      id_(id),
      quorum_ports_(std::move(quorum_ports)),
      election_ports_(std::move(election_ports)),
      client_ports_(std::move(client_ports)),
      client_port_(client_ports_.at(static_cast<std::size_t>(id - 1))),
      dir_("distlock-zk" + std::to_string(id)) {
  write_config();
}

ZkServer::~ZkServer() {
  if (process_.pid() > 0) {
    process_.signal(SIGCONT);  // a paused JVM cannot handle SIGTERM
    process_.stop(std::chrono::milliseconds(2000));
  }
}

void ZkServer::write_config() {
  std::filesystem::create_directories(dir_.path() / "data");
  std::ofstream cfg(dir_.path() / "zoo.cfg");
  cfg << "tickTime=" << opts_.tick_ms << "\n"
      << "dataDir=" << (dir_.path() / "data").string() << "\n"
      << "clientPort=" << client_port_ << "\n"
      << "clientPortAddress=127.0.0.1\n"
      << "minSessionTimeout=" << opts_.min_session_ms << "\n"
      << "maxSessionTimeout=" << opts_.max_session_ms << "\n"
      << "admin.enableServer=false\n"
      << "4lw.commands.whitelist=*\n"
      << "maxClientCnxns=0\n"
      // Lock directories are container nodes; check for empty ones often in tests.
      << "znode.container.checkIntervalMs=1000\n";
  if (id_ > 0) {
    cfg << "initLimit=50\nsyncLimit=10\n";
    for (std::size_t i = 0; i < client_ports_.size(); ++i) {
      cfg << "server." << (i + 1) << "=127.0.0.1:" << quorum_ports_[i] << ":" << election_ports_[i] << "\n";
    }
    std::ofstream(dir_.path() / "data" / "myid") << id_ << "\n";
  }
}

void ZkServer::start() {
  const ZkInstall z = find_zookeeper();
  if (!z.problem.empty()) fail_setup("cannot start ZooKeeper: " + z.problem);
  const std::string main_class = id_ > 0 ? "org.apache.zookeeper.server.quorum.QuorumPeerMain"
                                         : "org.apache.zookeeper.server.ZooKeeperServerMain";
  process_ = Process::spawn({z.java, "-Xms32m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                             "-Djava.net.preferIPv4Stack=true", "-Dzookeeper.admin.enableServer=false", "-cp",
                             z.classpath, main_class, (dir_.path() / "zoo.cfg").string()},
                            (dir_.path() / "server.log").string());
  if (id_ == 0 && !wait_serving(std::chrono::seconds(30))) {
    fail_setup("ZooKeeper on port " + std::to_string(client_port_) +
               " did not start within 30 s; its log:\n" + read_text(dir_.path() / "server.log"));
  }
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
  const std::string s = four_letter(client_port_, "srvr");
  const auto p = s.find("Mode: ");
  if (p == std::string::npos) return {};
  return s.substr(p + 6, s.find('\n', p) - (p + 6));
}

void ZkServer::kill() {
  process_.signal(SIGKILL);
  process_.wait_for(std::chrono::seconds(10));
}
void ZkServer::pause() {
  process_.signal(SIGSTOP);
}
void ZkServer::resume() {
  process_.signal(SIGCONT);
}

ZkEnsemble::ZkEnsemble(int servers, ZkServerOptions opts) {
  std::vector<std::uint16_t> quorum, election, client;
  for (int i = 0; i < servers; ++i) {
    quorum.push_back(free_port());
    election.push_back(free_port());
    client.push_back(free_port());
  }
  for (int i = 1; i <= servers; ++i) {
    servers_.push_back(std::unique_ptr<ZkServer>(new ZkServer(opts, i, quorum, election, client)));
  }
  for (auto& s : servers_) s->start();
  for (auto& s : servers_) {
    if (!s->wait_serving(std::chrono::seconds(60))) {
      fail_setup("ZooKeeper ensemble member on port " + std::to_string(s->port()) +
                 " did not join within 60 s; its log:\n" + read_text(s->dir_.path() / "server.log"));
    }
  }
}

std::string ZkEnsemble::hostports() const {
  std::string out;
  for (const auto& s : servers_) {
    if (!out.empty()) out += ',';
    out += s->hostport();
  }
  return out;
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
