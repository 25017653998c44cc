// distlock-bench-mysql — uncontended lock+unlock latency on mysql:// beside its floor, in
// the same run against the same server: a raw libmariadb loop of `SELECT GET_LOCK(name, 0)`
// / `SELECT RELEASE_LOCK(name)` on one connection (two round trips, as distlock's acquire
// and release are), and the same with a durable per-name token row upserted after the
// lock (one redo-log flush per lock). The three alternate in rounds so that drift on a
// shared machine hits them alike. Prints one JSON line per implementation and one with the
// ratios. A measurement, not a test: bench/mysql/run.sh.
#include <mysql.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "distlock/distlock.hpp"

namespace {

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double percentile_us(std::vector<std::int64_t> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto i = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1));
  return static_cast<double>(v[i]) / 1000.0;
}

// Runs a batch and drains every result; false (with a message) on an error.
bool raw_exec(MYSQL* c, const std::string& sql) {
  if (mysql_real_query(c, sql.data(), sql.size()) != 0) {
    std::fprintf(stderr, "raw: %s\n", mysql_error(c));
    return false;
  }
  do {
    if (MYSQL_RES* r = mysql_store_result(c)) mysql_free_result(r);
  } while (mysql_next_result(c) == 0);
  return mysql_errno(c) == 0;
}

nlohmann::json summary(const std::string& impl, const std::vector<std::int64_t>& ns) {
  double total = 0;
  for (auto v : ns) total += static_cast<double>(v);
  return {{"workload", "uncontended"},
          {"impl", impl},
          {"ops", ns.size()},
          {"p50_us", percentile_us(ns, 0.50)},
          {"p99_us", percentile_us(ns, 0.99)},
          {"mean_us", ns.empty() ? 0.0 : total / static_cast<double>(ns.size()) / 1000.0}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"mysql:// lock+unlock vs raw GET_LOCK/RELEASE_LOCK"};
  std::string url, host = "127.0.0.1", user = "bench", password = "bench", db = "bench";
  unsigned port = 3306;
  long ops = 5000, warmup = 500, rounds = 10;
  app.add_option("--url", url,
                 "mysql://bench:bench@127.0.0.1:PORT/bench (user, password and database as here)")
      ->required();
  app.add_option("--ops", ops, "measured lock+unlock pairs per implementation");
  app.add_option("--warmup", warmup, "unmeasured pairs first, per implementation");
  app.add_option("--rounds", rounds, "alternations between the implementations");
  CLI11_PARSE(app, argc, argv);
  if (const auto colon = url.rfind(':'), slash = url.rfind('/');
      colon != std::string::npos && slash > colon) {
    port = static_cast<unsigned>(std::atoi(url.substr(colon + 1, slash - colon - 1).c_str()));
  }

  MYSQL* raw = mysql_init(nullptr);
  if (!mysql_real_connect(raw, host.c_str(), user.c_str(), password.c_str(), db.c_str(), port, nullptr,
                          CLIENT_MULTI_STATEMENTS)) {
    std::fprintf(stderr, "raw: cannot connect: %s\n", mysql_error(raw));
    return 69;
  }
  distlock::ClientOptions copts;
  copts.logger = [](distlock::LogLevel, std::string_view) {};
  auto client = distlock::connect(url, copts);
  distlock::LockOptions lo;
  lo.ttl = std::chrono::seconds(30);
  lo.wait = std::chrono::milliseconds(0);

  auto one_distlock = [&] {
    auto lease = client.acquire("bench", lo);
    lease.release();
  };
  if (!raw_exec(raw,
                "CREATE TABLE IF NOT EXISTS bench_tokens (k VARCHAR(64) PRIMARY KEY, token BIGINT) "
                "ENGINE=InnoDB")) {
    return 70;
  }
  auto one_raw_token = [&] {
    if (!raw_exec(raw,
                  "SELECT GET_LOCK('raw-token', 0); INSERT INTO bench_tokens VALUES ('raw-token', 1) ON "
                  "DUPLICATE KEY UPDATE token = token + 1") ||
        !raw_exec(raw, "SELECT RELEASE_LOCK('raw-token')")) {
      std::exit(70);
    }
  };
  auto one_raw = [&] {
    if (!raw_exec(raw, "SELECT GET_LOCK('raw', 0)") || !raw_exec(raw, "SELECT RELEASE_LOCK('raw')"))
      std::exit(70);
  };
  for (long i = 0; i < warmup; ++i) {
    one_distlock();
    one_raw();
    one_raw_token();
  }
  std::vector<std::int64_t> d_ns, r_ns, t_ns;
  const long per_round = std::max(1L, ops / std::max(1L, rounds));
  for (long r = 0; r < rounds; ++r) {
    for (long i = 0; i < per_round; ++i) {
      const auto t = now_ns();
      one_distlock();
      d_ns.push_back(now_ns() - t);
    }
    for (long i = 0; i < per_round; ++i) {
      const auto t = now_ns();
      one_raw();
      r_ns.push_back(now_ns() - t);
    }
    for (long i = 0; i < per_round; ++i) {
      const auto t = now_ns();
      one_raw_token();
      t_ns.push_back(now_ns() - t);
    }
  }
  const auto d = summary("distlock", d_ns), rw = summary("raw-get-lock", r_ns);
  const auto rt = summary("raw-get-lock-durable-token", t_ns);
  std::printf("%s\n%s\n%s\n", d.dump().c_str(), rw.dump().c_str(), rt.dump().c_str());
  nlohmann::json ratio{
      {"workload", "uncontended"},
      {"ratio_p50_vs_raw", d["p50_us"].get<double>() / rw["p50_us"].get<double>()},
      {"ratio_p50_vs_raw_durable_token", d["p50_us"].get<double>() / rt["p50_us"].get<double>()},
      {"ratio_mean_vs_raw", d["mean_us"].get<double>() / rw["mean_us"].get<double>()}};
  std::printf("%s\n", ratio.dump().c_str());
  mysql_close(raw);
  return 0;
}
