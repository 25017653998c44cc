// distlock-bench-raw-zk — the floor for an uncontended ZooKeeper lock, straight on the
// threaded C client with no library around it: create an EPHEMERAL_SEQUENTIAL node,
// delete it (two round trips; no queue check, so only valid without contention).
// Prints one JSON line: {"workload":"uncontended","impl":"raw-c-client",...}.
// A measurement, not a test: bench/zk/run.sh runs it beside distlock, Curator and kazoo.
#include <zookeeper/zookeeper.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

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

void quiet(const char*) {}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"raw ZooKeeper C-client lock baseline"};
  std::string hosts = "127.0.0.1:2181";
  long ops = 5000, warmup = 500;
  app.add_option("--hosts", hosts, "host:port[,host:port...]");
  app.add_option("--ops", ops, "measured create+delete pairs");
  app.add_option("--warmup", warmup, "unmeasured pairs first");
  CLI11_PARSE(app, argc, argv);

  zhandle_t* zh = zookeeper_init2(hosts.c_str(), nullptr, 10'000, nullptr, nullptr, 0, &quiet);
  for (int i = 0; i < 500 && zh != nullptr && zoo_state(zh) != ZOO_CONNECTED_STATE; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (zh == nullptr || zoo_state(zh) != ZOO_CONNECTED_STATE) {
    std::fprintf(stderr, "raw-zk: cannot connect to %s\n", hosts.c_str());
    return 1;
  }
  zoo_create(zh, "/rawbench", nullptr, -1, &ZOO_OPEN_ACL_UNSAFE, ZOO_PERSISTENT, nullptr, 0);
  std::vector<std::int64_t> lat;
  lat.reserve(static_cast<std::size_t>(ops));
  char path[256];
  const std::int64_t t0 = now_ns();
  for (long i = -warmup; i < ops; ++i) {
    const std::int64_t a = now_ns();
    Stat st{};
    int rc = zoo_create2(zh, "/rawbench/lock-", nullptr, -1, &ZOO_OPEN_ACL_UNSAFE, ZOO_EPHEMERAL_SEQUENTIAL,
                         path, sizeof path, &st);
    if (rc == ZOK) rc = zoo_delete(zh, path, st.version);
    if (rc != ZOK) {
      std::fprintf(stderr, "raw-zk: %s\n", zerror(rc));
      return 1;
    }
    if (i >= 0) lat.push_back(now_ns() - a);
  }
  const double seconds = static_cast<double>(now_ns() - t0) / 1e9;
  zookeeper_close(zh);
  nlohmann::json j{{"workload", "uncontended"},
                   {"impl", "raw-c-client"},
                   {"url", "zk://" + hosts},
                   {"ops", ops},
                   {"ops_per_s", static_cast<double>(ops + warmup) / seconds},
                   {"p50_us", percentile_us(lat, 0.50)},
                   {"p99_us", percentile_us(lat, 0.99)},
                   {"p999_us", percentile_us(lat, 0.999)}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}
