// distlock-bench-postgres — uncontended lock+unlock latency on postgres:// beside its
// floor, in the same run against the same server: a raw libpq loop of
// `SELECT pg_advisory_lock($1)` / `SELECT pg_advisory_unlock($1)` on one connection
// (two round trips, as distlock's acquire and release are). The two alternate in
// rounds so that drift on a shared machine hits both alike. Prints one JSON line per
// implementation and one with the ratio. A measurement, not a test: bench/postgres/run.sh.
#include <libpq-fe.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
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

bool raw_exec(PGconn* c, const char* sql, const char* key) {
  const char* params[] = {key};
  PGresult* r = PQexecParams(c, sql, 1, nullptr, params, nullptr, nullptr, 0);
  const bool ok = PQresultStatus(r) == PGRES_TUPLES_OK;
  if (!ok) std::fprintf(stderr, "raw: %s", PQresultErrorMessage(r));
  PQclear(r);
  return ok;
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
  CLI::App app{"postgres:// lock+unlock vs raw pg_advisory_lock/unlock"};
  std::string url;
  long ops = 5000, warmup = 500, rounds = 10;
  app.add_option("--url", url, "postgres://user:pw@host:port/db")->required();
  app.add_option("--ops", ops, "measured lock+unlock pairs per implementation");
  app.add_option("--warmup", warmup, "unmeasured pairs first, per implementation");
  app.add_option("--rounds", rounds, "alternations between the two implementations");
  CLI11_PARSE(app, argc, argv);

  PGconn* raw = PQconnectdb(url.c_str());
  if (PQstatus(raw) != CONNECTION_OK) {
    std::fprintf(stderr, "raw: cannot connect: %s", PQerrorMessage(raw));
    return 69;
  }
  distlock::ClientOptions copts;
  copts.logger = [](distlock::LogLevel, std::string_view) {};
  auto client = distlock::connect(url, copts);
  distlock::LockOptions lo;
  lo.ttl = std::chrono::seconds(30);
  lo.wait = std::chrono::milliseconds(0);
  const std::string key = "7340033";  // the raw loop's key; distlock hashes "bench" elsewhere

  auto one_distlock = [&] {
    auto lease = client.acquire("bench", lo);
    lease.release();
  };
  // The same with a durable per-name token row written in the lock's statement (the
  // WAL flush distlock's acquire pays for tokens that survive a crash).
  {
    PGresult* r = PQexec(raw, "CREATE TABLE IF NOT EXISTS bench_tokens (k bigint PRIMARY KEY, token bigint)");
    PQclear(r);
  }
  auto one_raw_token = [&] {
    if (!raw_exec(raw,
                  "WITH g AS MATERIALIZED (SELECT pg_advisory_lock($1::bigint)) INSERT INTO bench_tokens"
                  " SELECT $1::bigint, 1 FROM g ON CONFLICT (k) DO UPDATE SET token = bench_tokens.token + 1"
                  " RETURNING token",
                  key.c_str()) ||
        !raw_exec(raw, "SELECT pg_advisory_unlock($1::bigint)", key.c_str())) {
      std::exit(70);
    }
  };
  auto one_raw = [&] {
    if (!raw_exec(raw, "SELECT pg_advisory_lock($1::bigint)", key.c_str()) ||
        !raw_exec(raw, "SELECT pg_advisory_unlock($1::bigint)", key.c_str())) {
      std::exit(70);
    }
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
  const auto d = summary("distlock", d_ns), rw = summary("raw-libpq-advisory", r_ns);
  const auto rt = summary("raw-libpq-advisory-durable-token", t_ns);
  std::printf("%s\n%s\n%s\n", d.dump().c_str(), rw.dump().c_str(), rt.dump().c_str());
  nlohmann::json ratio{
      {"workload", "uncontended"},
      {"ratio_p50_vs_raw", d["p50_us"].get<double>() / rw["p50_us"].get<double>()},
      {"ratio_p50_vs_raw_durable_token", d["p50_us"].get<double>() / rt["p50_us"].get<double>()},
      {"ratio_mean_vs_raw", d["mean_us"].get<double>() / rw["mean_us"].get<double>()}};
  std::printf("%s\n", ratio.dump().c_str());
  PQfinish(raw);
  return 0;
}
