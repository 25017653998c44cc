// The client's cost of a lock workload: this process's CPU time and context switches
// (getrusage, every thread), read around a workload's measured part and written into its
// JSON line per acquire + release pair. Shared by distlock-bench (bench_driver.cpp) and
// its raw hiredis baseline (bench/raw_redis_bench.cpp), so both print the same fields.
//
//   const auto before = Usage::now();
//   ... run the pairs ...
//   add_usage(line, before, Usage::now(), pairs);
//
// Thread-safety: pure functions; Usage::now() reads the whole process's figures.
#pragma once

#include <sys/resource.h>
#include <sys/time.h>

#include <algorithm>
#include <nlohmann/json.hpp>

namespace distlock::bench {

struct Usage {
  double user_us = 0, sys_us = 0;
  long voluntary = 0, involuntary = 0;

  static Usage now() {
    rusage r{};
    getrusage(RUSAGE_SELF, &r);
    auto us = [](const timeval& t) {
      return static_cast<double>(t.tv_sec) * 1e6 + static_cast<double>(t.tv_usec);
    };
    return Usage{us(r.ru_utime), us(r.ru_stime), r.ru_nvcsw, r.ru_nivcsw};
  }
};

/// Adds the CPU per pair (user + sys, and each) and the context switches per pair
/// (voluntary, involuntary) between `a` and `b` over `pairs` acquire + release pairs.
inline void add_usage(nlohmann::ordered_json& j, const Usage& a, const Usage& b, long pairs) {
  const double n = static_cast<double>(std::max(1L, pairs));
  auto round2 = [](double v) { return static_cast<double>(static_cast<long long>(v * 100 + 0.5)) / 100; };
  j["pairs"] = pairs;
  j["cpu_us_per_pair"] = round2((b.user_us - a.user_us + b.sys_us - a.sys_us) / n);
  j["user_us_per_pair"] = round2((b.user_us - a.user_us) / n);
  j["sys_us_per_pair"] = round2((b.sys_us - a.sys_us) / n);
  j["vcsw_per_pair"] = round2(static_cast<double>(b.voluntary - a.voluntary) / n);
  j["ivcsw_per_pair"] = round2(static_cast<double>(b.involuntary - a.involuntary) / n);
}

}  // namespace distlock::bench
