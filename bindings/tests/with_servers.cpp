// with_servers: starts the real servers a binding's tests run against, runs one command with
// their addresses in its environment, stops the servers (by pid) and exits with the command's
// status. Used by ctest for the C API's and the Go module's tests and the Python segment ids'
// test (bindings/*/CMakeLists.txt), so those tests need no server harness of their own in their
// language.
//
// Usage: with_servers [--redis] [--etcd] [--postgres] [--mysql] -- COMMAND [ARGS...]
// Environment given to COMMAND:
//   DISTLOCK_TEST_REDIS_URL    redis://127.0.0.1:<port>      (with --redis)
//   DISTLOCK_TEST_REDIS_PORT   <port>
//   DISTLOCK_TEST_ETCD_URL     etcd://127.0.0.1:<port>       (with --etcd)
//   DISTLOCK_TEST_ETCD_ENDPOINT 127.0.0.1:<port>             (for etcdctl --endpoints)
//   DISTLOCK_TEST_POSTGRES_URL postgres://distlock:<pw>@127.0.0.1:<port>/postgres (with --postgres)
//   DISTLOCK_TEST_MYSQL_URL    mysql://distlock:<pw>@127.0.0.1:<port>/distlock_test (with --mysql)
// --postgres and --mysql exist in builds with those components (the segment ids' tests of the
// Python and Go bindings use them); elsewhere they are an error naming the component.
// A server that cannot be started (binary missing, does not come up) is exit status 1 with the
// harness's message: never a skip.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "etcd_cluster.hpp"
#include "support/redis_server.hpp"
#if WITH_SERVERS_POSTGRES
#include "support/postgres_server.hpp"
#endif
#if WITH_SERVERS_MYSQL
#include "support/mariadb_server.hpp"
#endif

int main(int argc, char** argv) {
  bool redis = false, etcd = false, postgres = false, mysql = false;
  int i = 1;
  for (; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--redis") {
      redis = true;
    } else if (a == "--etcd") {
      etcd = true;
    } else if (a == "--postgres" && WITH_SERVERS_POSTGRES) {
      postgres = true;
    } else if (a == "--mysql" && WITH_SERVERS_MYSQL) {
      mysql = true;
    } else if (a == "--postgres" || a == "--mysql") {
      std::fprintf(stderr, "with_servers: %s: this build has no %s component\n", a.c_str(), a.c_str() + 2);
      return 2;
    } else if (a == "--") {
      ++i;
      break;
    } else {
      std::fprintf(stderr, "with_servers: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (i >= argc) {
    std::fprintf(stderr,
                 "usage: with_servers [--redis] [--etcd] [--postgres] [--mysql] -- COMMAND [ARGS...]\n");
    return 2;
  }
  (void)postgres;  // read only in builds with the component
  (void)mysql;
  std::optional<distlock::testing::RedisServer> redis_server;
  std::unique_ptr<distlock::testing::EtcdCluster> etcd_cluster;
#if WITH_SERVERS_POSTGRES
  std::optional<distlock::testing::PostgresServer> postgres_server;
#endif
#if WITH_SERVERS_MYSQL
  std::optional<distlock::testing::MariadbServer> mariadb_server;
#endif
  try {
    if (redis) {
      redis_server.emplace();
      ::setenv("DISTLOCK_TEST_REDIS_URL", redis_server->url().c_str(), 1);
      ::setenv("DISTLOCK_TEST_REDIS_PORT", std::to_string(redis_server->port()).c_str(), 1);
      // For tests that freeze the server (SIGSTOP, then SIGCONT) to stop every renewal.
      ::setenv("DISTLOCK_TEST_REDIS_PID", std::to_string(redis_server->pid()).c_str(), 1);
    }
    if (etcd) {
      etcd_cluster = std::make_unique<distlock::testing::EtcdCluster>(1);
      ::setenv("DISTLOCK_TEST_ETCD_URL", etcd_cluster->url().c_str(), 1);
      ::setenv("DISTLOCK_TEST_ETCD_ENDPOINT", etcd_cluster->endpoint(0).c_str(), 1);
    }
#if WITH_SERVERS_POSTGRES
    if (postgres) {
      postgres_server.emplace();
      ::setenv("DISTLOCK_TEST_POSTGRES_URL", postgres_server->url().c_str(), 1);
    }
#endif
#if WITH_SERVERS_MYSQL
    if (mysql) {
      mariadb_server.emplace();
      ::setenv("DISTLOCK_TEST_MYSQL_URL", mariadb_server->url().c_str(), 1);
    }
#endif
  } catch (const std::exception& e) {
    std::fprintf(stderr, "with_servers: a server did not start: %s\n", e.what());
    return 1;
  }
  const pid_t pid = ::fork();
  if (pid < 0) {
    std::perror("with_servers: fork");
    return 1;
  }
  if (pid == 0) {
    ::execvp(argv[i], argv + i);
    std::perror("with_servers: exec");
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
  }
  // The servers stop (by pid) in their destructors.
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  std::fprintf(stderr, "with_servers: %s ended by signal %d\n", argv[i], WTERMSIG(status));
  return 1;
}
