// A shard group member in a process of its own, for tests that SIGKILL a member
// (tests/shard_group/shard_group_test.cpp).
//   shard_tool URL JOB SHARDS TTL_MS PERIOD_MS OUT_FILE LIFETIME_MS
// Joins JOB and rewrites OUT_FILE after every change with one line: the owned shard
// indexes, comma-separated (written to OUT_FILE.tmp, then renamed). Leaves and exits 0
// after LIFETIME_MS (a bound, in case the test that started it is gone); exit 2 on error.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

#include "distlock/distlock.hpp"

int main(int argc, char** argv) {
  if (argc != 8) {
    std::cerr << "usage: shard_tool URL JOB SHARDS TTL_MS PERIOD_MS OUT_FILE LIFETIME_MS\n";
    return 2;
  }
  try {
    const std::string out = argv[6];
    auto client = distlock::connect(argv[1]);
    distlock::ShardGroupOptions opts;
    opts.lock.ttl = distlock::Millis(std::atoll(argv[4]));
    opts.rebalance_period = distlock::Millis(std::atoll(argv[5]));
    opts.on_change = [&](const distlock::ShardAssignment& a) {
      std::string line;
      for (const auto& s : a.shards) line += (line.empty() ? "" : ",") + std::to_string(s.index);
      {
        std::ofstream f(out + ".tmp", std::ios::trunc);
        f << line << "\n";
      }
      std::filesystem::rename(out + ".tmp", out);
    };
    distlock::ShardGroup member =
        client.shard_group(argv[2], static_cast<std::uint32_t>(std::atol(argv[3])), opts);
    std::this_thread::sleep_for(distlock::Millis(std::atoll(argv[7])));  // the lifetime bound
    member.leave();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "shard_tool: " << e.what() << "\n";
    return 2;
  }
}
