#include "support/postgres_server.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <pwd.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "support/harness_setup.hpp"

namespace distlock::testing {

namespace {

// Waits (bounded, 5 s on the steady clock) until every process of `pids` is stopped,
// dead or gone: a SIGSTOP is only queued when kill() returns.
void wait_stopped(const std::vector<pid_t>& pids) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (const pid_t p : pids) {
    for (;;) {
      const char st = process_state(p);
      if (st == 0 || st == 'T' || st == 't' || st == 'Z' || st == 'X') break;
      if (std::chrono::steady_clock::now() >= end) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
}

}  // namespace

std::string postgres_bin_dir() {
  for (const char* v : {"17", "16", "15", "14"}) {
    const std::string d = std::string("/usr/lib/postgresql/") + v + "/bin";
    if (::access((d + "/postgres").c_str(), X_OK) == 0 && ::access((d + "/initdb").c_str(), X_OK) == 0)
      return d;
  }
  return {};
}

PostgresServer::PostgresServer()
    : SqlAccountServer("postgres", "postgres", "distlock-pg", SIGINT, std::chrono::seconds(30)) {
  bin_ = postgres_bin_dir();
  if (bin_.empty()) {
    const std::string msg =
        "PostgreSQL (initdb, postgres >= 14 under /usr/lib/postgresql/<version>/bin) is not installed; it is "
        "required for the postgres:// tests: run scripts/bootstrap.sh or apt-get install postgresql";
    fail_setup(msg);
  }
  as_postgres_ = ::geteuid() == 0;
  const std::string d = dir_.path().string();
  if (as_postgres_) {
    const passwd* pw = ::getpwnam("postgres");
    if (pw == nullptr) {
      const std::string msg = "running as root, but there is no \"postgres\" user to run the server as";
      fail_setup(msg);
    }
    if (::chown(d.c_str(), pw->pw_uid, pw->pw_gid) != 0) throw std::runtime_error("chown " + d + " failed");
  }
  // initdb once (seconds under load) into a template shared by every test process
  // of this user (CTest runs each test as its own process); each server copies it.
  // Built in a temporary directory and renamed into place, under an flock.
  const std::string tmpl = (std::filesystem::temp_directory_path() /
                            ("distlock-pg-template-" + std::to_string(::geteuid()) + "-" +
                             std::filesystem::path(bin_).parent_path().filename().string()))
                               .string();
  start_from_template(tmpl, "PG_VERSION", [&]() -> std::string {
    std::string error;
    TempDir t("distlock-pg-initdb");
    const std::string td = t.path().string();
    {
      std::ofstream pwfile(td + "/pw");
      pwfile << kPassword << "\n";
    }
    if (as_postgres_) {
      const passwd* pw = ::getpwnam("postgres");
      if (::chown(td.c_str(), pw->pw_uid, pw->pw_gid) != 0 ||
          ::chown((td + "/pw").c_str(), pw->pw_uid, pw->pw_gid) != 0) {
        error = "chown " + td + " failed";
      }
    }
    std::vector<std::string> argv{bin_ + "/initdb",
                                  "-D",
                                  td + "/data",
                                  "-U",
                                  kUser,
                                  "--auth=scram-sha-256",
                                  "--pwfile=" + td + "/pw",
                                  "-E",
                                  "UTF8",
                                  "--no-sync",
                                  "--no-instructions"};
    if (as_postgres_) {
      argv.insert(argv.begin(), {"setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--"});
    }
    if (error.empty()) error = run_to_end(argv, td + "/initdb.log");
    if (error.empty()) error = install_template(td + "/data", tmpl, "initdb template");
    return error;
  });
}

PostgresServer::~PostgresServer() {
  stop();
}

void PostgresServer::start() {
  const std::string d = dir_.path().string();
  std::vector<std::string> argv{bin_ + "/postgres",
                                "-D",
                                d + "/data",
                                "-p",
                                std::to_string(port_),
                                "-k",
                                d,
                                "-c",
                                "listen_addresses=127.0.0.1",
                                "-c",
                                "fsync=off",
                                "-c",
                                "max_connections=300",
                                "-c",
                                "shared_buffers=16MB",
                                "-c",
                                "logging_collector=off"};
  if (as_postgres_)
    argv.insert(argv.begin(), {"setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--"});
  process_ = Process::spawn(argv, d + "/server.log");
  pid_ = process_.pid();
}

bool PostgresServer::wait_ready(std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  const std::string port = std::to_string(port_);
  const char* keys[] = {"host", "port", "user", "dbname", "connect_timeout", nullptr};
  const char* vals[] = {"127.0.0.1", port.c_str(), kUser, "postgres", "2", nullptr};
  while (std::chrono::steady_clock::now() < end) {
    if (PQpingParams(keys, vals, 0) == PQPING_OK) return true;
    if (!process_.running()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

void PostgresServer::kill() {
  if (pid_ <= 0) return;
  // Every PostgreSQL backend leads a process group of its own (setsid in
  // InitPostmasterChild), so the postmaster's group holds the postmaster alone. Stop it
  // first (it forks no process more), then kill its children, then it: a crash of the
  // whole server, with no backend left attached to the shared memory a restart needs.
  process_.signal(SIGSTOP);
  // Only while the postmaster is ours and unreaped: a reaped pid may name another process.
  const std::vector<pid_t> children = process_.running() ? child_pids(pid_) : std::vector<pid_t>{};
  for (const pid_t c : children) ::kill(c, SIGKILL);
  process_.signal(SIGKILL);
  ::kill(pid_, SIGCONT);
  process_.wait_for(std::chrono::seconds(10));
  // The killed children are reparented and reaped; wait (bounded, 5 s) until none is left.
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (const pid_t c : children) {
    for (;;) {
      const char st = process_state(c);
      if (st == 0 || st == 'Z' || st == 'X' || std::chrono::steady_clock::now() >= end) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  pid_ = -1;
}

void PostgresServer::pause() {
  if (pid_ <= 0) return;
  // The postmaster first, so that it forks no new backend; then every child alive now
  // (each backend is in a process group of its own, so a group signal misses them).
  // Returns once all of them are stopped (bounded, 5 s in all on the steady clock).
  process_.signal(SIGSTOP);
  // Only while the postmaster is ours and unreaped: a reaped pid may name another process.
  const std::vector<pid_t> children = process_.running() ? child_pids(pid_) : std::vector<pid_t>{};
  for (const pid_t c : children) ::kill(c, SIGSTOP);
  wait_stopped(children);
}

void PostgresServer::resume() {
  if (pid_ <= 0) return;
  // In the reverse order: the children (still the postmaster's, which is stopped and
  // reaps none), then the postmaster.
  if (process_.running()) {
    for (const pid_t c : child_pids(pid_)) ::kill(c, SIGCONT);
  }
  ::kill(pid_, SIGCONT);
}

std::vector<std::vector<std::string>> PostgresServer::query(const std::string& sql) const {
  const std::string port = std::to_string(port_);
  const char* keys[] = {"host", "port", "user", "password", "dbname", "connect_timeout", nullptr};
  const char* vals[] = {"127.0.0.1", port.c_str(), kUser, kPassword, "postgres", "5", nullptr};
  PGconn* c = PQconnectdbParams(keys, vals, 0);
  if (PQstatus(c) != CONNECTION_OK) {
    const std::string m = PQerrorMessage(c);
    PQfinish(c);
    throw std::runtime_error("cannot connect to the test postgres: " + m);
  }
  PGresult* r = PQexec(c, sql.c_str());
  const ExecStatusType st = PQresultStatus(r);
  if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) {
    const std::string m = PQresultErrorMessage(r);
    PQclear(r);
    PQfinish(c);
    throw std::runtime_error(sql + ": " + m);
  }
  std::vector<std::vector<std::string>> rows;
  for (int i = 0; i < PQntuples(r); ++i) {
    std::vector<std::string> row;
    for (int j = 0; j < PQnfields(r); ++j)
      row.push_back(PQgetisnull(r, i, j) ? "<null>" : PQgetvalue(r, i, j));
    rows.push_back(std::move(row));
  }
  PQclear(r);
  PQfinish(c);
  return rows;
}

}  // namespace distlock::testing
