#include "support/mariadb_server.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <mysql.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "support/harness_setup.hpp"

namespace distlock::testing {

namespace {

using namespace std::chrono_literals;

// The server's options, shared by the template's first start and every test server.
std::vector<std::string> server_argv(const std::string& datadir, const std::string& sock, std::uint16_t port,
                                     const std::string& log) {
  std::vector<std::string> argv{mariadbd_path(),
                                "--no-defaults",
                                "--datadir=" + datadir,
                                "--socket=" + sock,
                                "--pid-file=" + datadir + "/mariadbd.pid",
                                "--log-error=" + log,
                                "--skip-name-resolve",
                                "--skip-log-bin",
                                "--performance-schema=OFF",
                                "--max-connections=600",
                                "--innodb-buffer-pool-size=8M",
                                "--innodb-log-file-size=4M",
                                "--innodb-data-file-path=ibdata1:4M:autoextend",
                                "--innodb-flush-log-at-trx-commit=1",
                                "--innodb-doublewrite=0",
                                "--skip-innodb-use-native-aio",
                                "--character-set-server=utf8mb4"};
  if (port == 0) {
    argv.push_back("--skip-networking");
  } else {
    argv.push_back("--bind-address=127.0.0.1");
    argv.push_back("--port=" + std::to_string(port));
  }
  if (::geteuid() == 0) argv.push_back("--user=root");
  return argv;
}

// Connects as root over the Unix socket; null on failure (with `why`).
MYSQL* connect_root(const std::string& sock, std::string& why, unsigned timeout_s = 5) {
  MYSQL* m = mysql_init(nullptr);
  if (!m) {
    why = "out of memory";
    return nullptr;
  }
  mysql_options(m, MYSQL_OPT_CONNECT_TIMEOUT, &timeout_s);
  mysql_options(m, MYSQL_OPT_READ_TIMEOUT, &timeout_s);
  mysql_options(m, MYSQL_OPT_WRITE_TIMEOUT, &timeout_s);
  if (!mysql_real_connect(m, nullptr, "root", nullptr, nullptr, 0, sock.c_str(), CLIENT_MULTI_STATEMENTS)) {
    why = mysql_error(m);
    mysql_close(m);
    return nullptr;
  }
  return m;
}

// Runs `sql` (several statements allowed); the rows of the last result set.
std::vector<std::vector<std::string>> run_sql(MYSQL* m, const std::string& sql) {
  if (mysql_real_query(m, sql.data(), sql.size()) != 0) throw std::runtime_error(sql + ": " + mysql_error(m));
  std::vector<std::vector<std::string>> rows;
  for (;;) {
    MYSQL_RES* res = mysql_store_result(m);
    if (res) {
      rows.clear();
      const unsigned n = mysql_num_fields(res);
      while (MYSQL_ROW row = mysql_fetch_row(res)) {
        unsigned long* len = mysql_fetch_lengths(res);
        std::vector<std::string> r;
        for (unsigned i = 0; i < n; ++i) r.push_back(row[i] ? std::string(row[i], len[i]) : "<null>");
        rows.push_back(std::move(r));
      }
      mysql_free_result(res);
    } else if (mysql_field_count(m) != 0) {
      throw std::runtime_error(sql + ": " + mysql_error(m));
    }
    const int next = mysql_next_result(m);
    if (next > 0) throw std::runtime_error(sql + ": " + mysql_error(m));
    if (next < 0) break;
  }
  return rows;
}

}  // namespace

std::string mariadbd_path() {
  for (const char* p : {"/usr/sbin/mariadbd", "/usr/bin/mariadbd", "/usr/sbin/mysqld"}) {
    if (::access(p, X_OK) == 0) return p;
  }
  return {};
}

MariadbServer::MariadbServer() : SqlAccountServer("mariadbd", "MariaDB", "distlock-my", SIGTERM, 60s) {
  if (mariadbd_path().empty() || !have_program("mariadb-install-db")) {
    fail_setup(
        "MariaDB (mariadbd, mariadb-install-db) is not installed; it is required for the mysql:// tests: run "
        "scripts/bootstrap.sh or apt-get install mariadb-server");
  }
  // mariadb-install-db once (seconds under load) into a template shared by every test
  // process of this user (CTest runs each test as its own process); each server copies
  // it. Built in a temporary directory and renamed into place, under an flock. The
  // template has the account and the database the tests use.
  const std::string tmpl =
      (std::filesystem::temp_directory_path() / ("distlock-mariadb-template-" + std::to_string(::geteuid())))
          .string();
  start_from_template(tmpl, "ready", [&]() -> std::string {
    std::string error;
    TempDir t("distlock-my-install");
    const std::string td = t.path().string();
    std::vector<std::string> argv{"mariadb-install-db",
                                  "--no-defaults",
                                  "--datadir=" + td + "/data",
                                  "--auth-root-authentication-method=normal",
                                  "--skip-test-db",
                                  "--skip-name-resolve",
                                  "--innodb-buffer-pool-size=8M",
                                  "--innodb-log-file-size=4M",
                                  "--innodb-data-file-path=ibdata1:4M:autoextend"};
    if (::geteuid() == 0) argv.push_back("--user=root");
    error = run_to_end(argv, td + "/install.log");
    if (error.empty()) {
      // One start without networking to create the account and the database.
      const std::string sock = td + "/s";
      Process p = Process::spawn(server_argv(td + "/data", sock, 0, td + "/first.log"), td + "/first.out");
      MYSQL* m = nullptr;
      const auto end = std::chrono::steady_clock::now() + 60s;
      std::string why;
      while (!m && std::chrono::steady_clock::now() < end && p.running()) {
        m = connect_root(sock, why, 2);
        if (!m) std::this_thread::sleep_for(50ms);
      }
      if (!m) {
        error =
            "mariadbd did not start from the fresh template (" + why + "):\n" + file_text(td + "/first.log");
      } else {
        try {
          run_sql(m, std::string("CREATE USER '") + kUser + "'@'127.0.0.1' IDENTIFIED BY '" + kPassword +
                         "'; GRANT ALL ON *.* TO '" + kUser + "'@'127.0.0.1'; CREATE DATABASE " + kDatabase);
        } catch (const std::exception& e) {
          error = e.what();
        }
        mysql_close(m);
      }
      p.signal(SIGTERM);
      if (p.wait_for(60s) == -1) {
        p.stop();
        if (error.empty()) error = "mariadbd did not shut down within 60 s:\n" + file_text(td + "/first.log");
      }
    }
    if (error.empty()) {
      std::ofstream(td + "/data/ready") << "ok\n";
      error = install_template(td + "/data", tmpl, "MariaDB template");
    }
    return error;
  });
}

MariadbServer::~MariadbServer() {
  stop();
}

std::string MariadbServer::socket() const {
  return (dir_.path() / "s").string();
}

void MariadbServer::start() {
  const std::string d = dir_.path().string();
  process_ = Process::spawn(server_argv(d + "/data", socket(), port_, d + "/server.log"), d + "/server.out");
  pid_ = process_.pid();
}

bool MariadbServer::wait_ready(std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (!process_.running()) return false;
    std::string why;
    if (MYSQL* m = connect_root(socket(), why, 2)) {
      mysql_close(m);
      // The socket answers before the TCP port may; wait for the port too.
      return wait_port_open(port_, std::chrono::duration_cast<std::chrono::milliseconds>(
                                       std::max<std::chrono::steady_clock::duration>(
                                           end - std::chrono::steady_clock::now(), 100ms)));
    }
    std::this_thread::sleep_for(50ms);
  }
  return false;
}

std::vector<std::vector<std::string>> MariadbServer::query(const std::string& sql) const {
  std::string why;
  MYSQL* m = connect_root(socket(), why);
  if (!m) throw std::runtime_error("cannot connect to the test mariadbd: " + why);
  try {
    auto rows = run_sql(m, sql);
    mysql_close(m);
    return rows;
  } catch (...) {
    mysql_close(m);
    throw;
  }
}

}  // namespace distlock::testing
