// distlock-bench-bindings URL OPS ROUNDS: uncontended acquire + release of one key through the
// C++ API and through the C API (libdistlock_c), in the same process, alternating rounds of OPS
// each so that both see the same server and machine state. One JSON line per binding:
//   {"workload":"uncontended","binding":"cpp"|"c","url":...,"ops":N,"p50_us":..,"p99_us":..,"mean_us":..}
// bench/bindings/run.sh runs it beside the Go module's bench (bench/bindings/go).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "distlock/distlock.h"
#include "distlock/distlock.hpp"

namespace {

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void print(const char* binding, const std::string& url, std::vector<std::int64_t>& lat) {
  std::sort(lat.begin(), lat.end());
  double sum = 0;
  for (auto v : lat) sum += static_cast<double>(v);
  auto pct = [&](double p) {
    return static_cast<double>(lat[static_cast<std::size_t>(p * (lat.size() - 1))]) / 1e3;
  };
  std::printf(
      "{\"workload\":\"uncontended\",\"binding\":\"%s\",\"url\":\"%s\",\"ops\":%zu,\"p50_us\":%.1f,\"p99_"
      "us\":%.1f,"
      "\"mean_us\":%.1f}\n",
      binding, url.c_str(), lat.size(), pct(0.5), pct(0.99), sum / static_cast<double>(lat.size()) / 1e3);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: distlock-bench-bindings URL OPS ROUNDS\n");
    return 2;
  }
  const std::string url = argv[1];
  const long ops = std::atol(argv[2]), rounds = std::atol(argv[3]);
  auto client = distlock::connect(url);
  distlock_client* c = nullptr;
  distlock_error err{};
  if (distlock_connect(url.c_str(), nullptr, &c, &err) != DISTLOCK_OK) {
    std::fprintf(stderr, "%s\n", err.message);
    return 1;
  }
  std::vector<std::int64_t> cpp, capi;
  for (long r = 0; r < rounds; ++r) {
    for (long i = 0; i < ops; ++i) {
      const auto a = now_ns();
      client.acquire("bench/bindings/cpp").release();
      cpp.push_back(now_ns() - a);
    }
    for (long i = 0; i < ops; ++i) {
      const auto a = now_ns();
      distlock_lease* l = nullptr;
      if (distlock_acquire(c, "bench/bindings/c", nullptr, &l, &err) != DISTLOCK_OK ||
          distlock_lease_release(l, &err) != DISTLOCK_OK) {
        std::fprintf(stderr, "%s\n", err.message);
        return 1;
      }
      distlock_lease_free(l);
      capi.push_back(now_ns() - a);
    }
  }
  print("cpp", client.url(), cpp);
  print("c", client.url(), capi);
  distlock_client_close(c);
  return 0;
}
