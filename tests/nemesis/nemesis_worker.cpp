// nemesis_worker — one process of a nemesis run (tests/nemesis/nemesis_test.cpp).
//
//   nemesis_worker URL NAME HISTORY FENCE_FILE THREADS SECONDS TTL_MS SEED
//
// THREADS threads each loop for SECONDS: acquire NAME (bounded wait), then one to
// three fenced writes through a FileFence (each preceded by an owns() check), now and
// then a write attempted after the lease was lost (it must be rejected once a newer
// holder wrote), then release. Every step is one line of HISTORY (history.hpp).
// Exits 0 when the time is up; every call it makes is bounded in time.
#include <fcntl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"

namespace {

std::int64_t mono_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

int g_history = -1;

void record(const std::string& line) {
  const std::string l = line + "\n";
  (void)!::write(g_history, l.data(), l.size());
}

std::string id(long tid, long seq) {
  return std::to_string(::getpid()) + " " + std::to_string(tid) + " " + std::to_string(seq);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 9) {
    std::fprintf(stderr, "usage: nemesis_worker URL NAME HISTORY FENCE_FILE THREADS SECONDS TTL_MS SEED\n");
    return 64;
  }
  const std::string url = argv[1], name = argv[2], history = argv[3], fence_file = argv[4];
  const int threads = std::atoi(argv[5]);
  const auto run_for = std::chrono::seconds(std::atoi(argv[6]));
  const auto ttl = std::chrono::milliseconds(std::atol(argv[7]));
  const unsigned seed = static_cast<unsigned>(std::strtoul(argv[8], nullptr, 10));
  g_history = ::open(history.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (g_history < 0) return 70;

  distlock::ClientOptions copts;
  copts.command_timeout = std::chrono::milliseconds(500);
  copts.connect_timeout = std::chrono::milliseconds(500);
  copts.logger = [](distlock::LogLevel, std::string_view) {};
  std::optional<distlock::Client> client;
  const auto end = std::chrono::steady_clock::now() + run_for;
  // The server may be down when this process starts: retry the connection, bounded.
  while (!client && std::chrono::steady_clock::now() < end) {
    std::error_code ec;
    auto c = distlock::connect(url, copts, ec);
    if (!ec) {
      client = std::move(c);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  if (!client) return 0;
  const bool fencing = client->has_fencing();
  distlock::FileFence fence(fence_file);

  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::minstd_rand rng(seed * 7919u + static_cast<unsigned>(t) + static_cast<unsigned>(::getpid()));
      const long tid = static_cast<long>(::syscall(SYS_gettid));
      long seq = 0;
      while (std::chrono::steady_clock::now() < end) {
        ++seq;
        distlock::LockOptions o;
        o.ttl = ttl;
        o.wait = std::chrono::milliseconds(3000);
        std::error_code ec;
        distlock::Lease lease = client->acquire(name, o, ec);
        if (ec) {
          record("X " + std::to_string(ec.value()) + " " + std::to_string(mono_ns()));
          std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 50));
          continue;
        }
        const std::uint64_t token = fencing ? lease.token() : 0;
        record("A " + id(tid, seq) + " " + std::to_string(token) + " " + std::to_string(mono_ns()));
        lease.on_lost([tid, seq] { record("L " + id(tid, seq) + " " + std::to_string(mono_ns())); });
        // Most sections are short; one in ten holds for half a TTL to two TTLs, writing
        // every ~100 ms, so that renewals run and faults strike leases mid-hold.
        const bool long_hold = rng() % 10 == 0;
        const auto hold_until = std::chrono::steady_clock::now() +
                                (long_hold ? ttl / 2 + ttl * static_cast<int>(rng() % 150) / 100 : ttl * 0);
        const int short_writes = 1 + static_cast<int>(rng() % 3);
        for (int w = 0; long_hold ? std::chrono::steady_clock::now() < hold_until : w < short_writes; ++w) {
          const std::int64_t t0 = mono_ns();
          const bool owns = lease.owns();
          if (owns) record("O " + id(tid, seq) + " " + std::to_string(t0));
          // A write after the loss is attempted now and then: the fence must reject it
          // once a newer holder has written.
          const bool stale_try = !owns && rng() % 4 == 0;
          if ((owns || stale_try) && fencing) {
            std::error_code fec;
            const std::int64_t tw = mono_ns();
            const auto r = fence.apply(
                token, [] {}, fec);
            const char* st =
                fec ? "error" : (r.status == distlock::FenceStatus::applied ? "applied" : "stale");
            record("W " + id(tid, seq) + " " + std::to_string(token) + " " + std::to_string(tw) + " " + st);
          }
          std::this_thread::sleep_for(
              std::chrono::microseconds(long_hold ? 50'000 + rng() % 100'000 : rng() % 8'000));
        }
        const std::int64_t t1 = mono_ns();
        if (lease.owns()) record("O " + id(tid, seq) + " " + std::to_string(t1));
        const std::stop_token stop = lease.stop_token();
        lease.release(ec);
        const char* st = !ec ? "ok" : (ec == distlock::errc::lost ? "lost" : "error");
        record("E " + id(tid, seq) + " " + std::to_string(mono_ns()) + " " + st + " " +
               (stop.stop_requested() ? "1" : "0"));
      }
    });
  }
  for (auto& w : workers) w.join();
  return 0;
}
