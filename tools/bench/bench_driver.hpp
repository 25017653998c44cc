// tools/bench/bench_driver.hpp — the workloads of distlock-bench, reusable by other front ends
// (the `distlock bench` subcommand offers the same flags through add_bench_options).
//
// Each workload runs against one backend URL and prints one JSON line to stdout:
//   {"workload":…,"url":…,"clients":…,"ops":…,"ops_per_s":…,"p50_us":…,"p99_us":…,"p999_us":…}
// (plus a few workload-specific fields). Workloads:
//   uncontended  one client, one key: latency of acquire + release
//   contended    --clients clients, one key: the handoff, from the moment a holder calls
//                release() to the moment the next holder's acquire() returns (steady clock,
//                taken in the threads of one process, so the timestamps are comparable)
//   many-keys    --clients clients over --keys keys picked at random: acquire + release
//   renew        one client holds --keys leases; latency of Client::renew_now() and the
//                round trips it took (Client::stats().renew_round_trips) per call
// uncontended, contended and many-keys also give this process's cost per acquire + release
// pair, from getrusage(RUSAGE_SELF) around the measured part: "pairs", "cpu_us_per_pair"
// (user + sys), "user_us_per_pair", "sys_us_per_pair", "vcsw_per_pair", "ivcsw_per_pair".
// Measurements only: nothing here asserts a time.
//
// Thread-safety: run_bench starts and joins its own threads; call it from one thread.
//
// Example:
//   CLI::App app{"bench"};
//   distlock::bench::BenchConfig cfg;
//   distlock::bench::add_bench_options(app, cfg);
//   CLI11_PARSE(app, argc, argv);
//   return distlock::bench::run_bench(cfg);
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace distlock::bench {

struct BenchConfig {
  /// Backend URL; empty: $DISTLOCK_URL, else the host-local default.
  std::string url;
  /// Workloads to run, in order: uncontended, contended, many-keys, renew, or all.
  /// Several may be given (--workload a --workload b, or a,b).
  std::vector<std::string> workloads{"uncontended"};
  /// Concurrent clients (one distlock::Client each). Default 4.
  int clients = 4;
  /// many-keys: threads per client, all calling the same distlock::Client (a thread
  /// pool sharing one client). Default 1.
  int threads = 1;
  /// Keys for many-keys; leases held for renew. Default 1000.
  int keys = 1000;
  /// Operations (acquire + release, or handoffs) per workload, over all clients. Default 5000.
  long ops = 5000;
  /// Time each holder keeps the lock before releasing, in microseconds (sleeping). Default 0.
  long hold_us = 0;
  /// Lease TTL; 0: 30 s (the library default), or the session_timeout of a zk:// URL.
  /// On zk:// the session is sized to it unless the URL sets session_timeout.
  long ttl_ms = 0;
  /// renew: calls of renew_now() measured. Default 5.
  int rounds = 5;
  /// Unmeasured operations first (connections, script loading). Default 100.
  long warmup = 100;
  /// Clients keep no metrics (ClientOptions::metrics = false): to measure their cost.
  bool no_metrics = false;
};

/// Adds --url, --workload, --clients, --threads, --keys, --ops, --hold-us, --ttl-ms, --rounds, --warmup,
/// --no-metrics.
void add_bench_options(CLI::App& app, BenchConfig& cfg);

/// Runs the workloads; one JSON line each on stdout, errors on stderr. Returns 0, or
/// 1 when a workload failed (its error is printed), 2 for an unknown workload.
int run_bench(const BenchConfig& cfg);

}  // namespace distlock::bench
