// distlock-bench — lock latency and throughput workloads; one JSON line per workload.
//   distlock-bench --url URL --workload NAME [--clients N] [--keys K] [--ops N] [--hold-us H]
// See tools/bench/bench_driver.hpp for the workloads and scripts/bench_redis.sh for a run
// beside the raw hiredis baseline.
#include "bench_driver.hpp"

int main(int argc, char** argv) {
  CLI::App app{"distlock-bench: distributed lock workloads, one JSON line per workload"};
  distlock::bench::BenchConfig cfg;
  distlock::bench::add_bench_options(app, cfg);
  CLI11_PARSE(app, argc, argv);
  return distlock::bench::run_bench(cfg);
}
