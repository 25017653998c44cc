// lock_tool — a small process the fault and load tests start against any backend.
//
//   lock_tool hold   --url URL --name NAME [--ttl MS] [--wait MS] [--hold-ms MS] [--lock-delay MS]
//                    [--exit-on-lost] [--work-ms MS]
//   lock_tool hammer --url URL --name NAME --log FILE [--threads T] [--iters N] [--ttl MS]
//                    [--hold-us US] [--counter FILE]
//
// hold: acquires NAME and prints "acquired <token>" ("acquired none" without fencing),
// then holds it for --hold-ms (0: until SIGTERM/SIGINT). When the lease is lost it prints
// "lost" (and exits 76 with --exit-on-lost). SIGUSR1 prints "owns 1" or "owns 0".
// On SIGTERM/SIGINT, or when the hold time is over, it releases, prints "released" and
// exits 0 (76 if the release found the lease lost). Not acquired: 75; unavailable: 69.
// With --work-ms, every MS while holding it does a unit of "work" guarded by the lease: it reads
// CLOCK_MONOTONIC (t), then checks `owns()`, and only if that is true prints "work <t ns>"; so a
// line "work t" means owns() answered true at an instant no earlier than t (comparable with
// std::chrono::steady_clock of another process on this host).
//
// hammer: T threads each take NAME N times. Every critical section appends one record
// "pid tid token start_ns end_ns" (CLOCK_MONOTONIC, comparable across processes of one
// host) to FILE with a single O_APPEND write. With --counter, each section also does a
// read-modify-write of a counter file, so overlapping sections lose increments.
#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"
#include "support/backend_mono_clock.hpp"
#include "support/tool_flags.hpp"
#include "support/tool_signals.hpp"

namespace {

using distlock::testing::g_stop_signal;
using distlock::testing::g_usr1_signal;
using distlock::testing::mono_ns;
using distlock::testing::say;

struct Args : distlock::testing::ToolTarget, distlock::testing::ToolHammer {
  Args() { iters = 50; }
  std::string mode, counter;
  long wait_ms = -1, hold_ms = 0, lock_delay_ms = 0, work_ms = 0;
  bool exit_on_lost = false;
};

[[noreturn]] void usage(const std::string& why) {
  distlock::testing::tool_usage("lock_tool", why);
}

Args parse(int argc, char** argv) {
  Args a;
  distlock::testing::ToolFlags f("lock_tool");
  distlock::testing::add_target_flags(f, a);
  distlock::testing::add_hammer_flags(f, a);
  f.text("--counter", a.counter)
      .number("--wait", a.wait_ms)
      .number("--lock-delay", a.lock_delay_ms)
      .number("--hold-ms", a.hold_ms)
      .number("--work-ms", a.work_ms)
      .on_off("--exit-on-lost", a.exit_on_lost);
  a.mode = f.parse(argc, argv, "hold|hammer");
  if (a.name.empty()) f.usage("--name is required");
  return a;
}

int exit_code_for(const std::error_code& ec) {
  if (ec == distlock::errc::busy || ec == distlock::errc::timeout) return 75;
  if (ec == distlock::errc::lost) return 76;
  if (ec == distlock::errc::invalid_argument || ec == distlock::errc::invalid_url) return 64;
  return 69;
}

int hold(const Args& a) {
  distlock::LockOptions opts;
  opts.ttl = distlock::Millis(a.ttl_ms);
  opts.lock_delay = distlock::Millis(a.lock_delay_ms);
  if (a.wait_ms >= 0) opts.wait = distlock::Millis(a.wait_ms);
  std::error_code ec;
  distlock::Client client = distlock::connect(a.url, {}, ec);
  if (ec) {
    say("error " + ec.message());
    return exit_code_for(ec);
  }
  distlock::Lease lease = client.acquire(a.name, opts, ec);
  if (ec) {
    say("error " + ec.message());
    return exit_code_for(ec);
  }
  say("acquired " + (lease.has_token() ? std::to_string(lease.token()) : std::string("none")));
  std::atomic<bool> lost{false};
  lease.on_lost([&] {
    lost = true;
    say("lost");
    if (a.exit_on_lost) std::_Exit(76);
  });
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(a.hold_ms);
  auto next_work = std::chrono::steady_clock::now();
  while (!g_stop_signal && (a.hold_ms == 0 || std::chrono::steady_clock::now() < end)) {
    // SIGUSR1: report whether the lease is still held.
    if (g_usr1_signal.exchange(false)) say(std::string("owns ") + (lease.owns() ? "1" : "0"));
    if (a.work_ms > 0 && std::chrono::steady_clock::now() >= next_work) {
      next_work += std::chrono::milliseconds(a.work_ms);
      const std::int64_t t = mono_ns();  // before the check: owns() answered at or after t
      if (lease.owns()) say("work " + std::to_string(t));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  lease.release(ec);
  if (ec) {
    say("release-error " + ec.message());
    return exit_code_for(ec);
  }
  say("released");
  return lost ? 76 : 0;
}

int hammer(const Args& a) {
  if (a.log.empty()) usage("--log is required for hammer");
  const int log_fd = ::open(a.log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (log_fd < 0) usage("cannot open --log file");
  distlock::Client client = distlock::connect(a.url);
  distlock::LockOptions opts;
  opts.ttl = distlock::Millis(a.ttl_ms);
  opts.wait = std::chrono::seconds(60);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < a.threads; ++t) {
    threads.emplace_back([&] {
      const long tid = ::syscall(SYS_gettid);
      for (int i = 0; i < a.iters && !g_stop_signal; ++i) {
        std::error_code ec;
        distlock::Lease lease = client.acquire(a.name, opts, ec);
        if (ec) {
          std::fprintf(stderr, "lock_tool: acquire failed: %s\n", ec.message().c_str());
          ++failures;
          continue;
        }
        const std::int64_t start = mono_ns();
        if (!a.counter.empty()) {
          // Read-modify-write without any other synchronisation than the lock.
          long value = 0;
          if (FILE* f = std::fopen(a.counter.c_str(), "r")) {
            if (std::fscanf(f, "%ld", &value) != 1) value = 0;
            std::fclose(f);
          }
          if (a.hold_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(a.hold_us));
          if (FILE* f = std::fopen(a.counter.c_str(), "w")) {
            std::fprintf(f, "%ld\n", value + 1);
            std::fclose(f);
          }
        } else if (a.hold_us > 0) {
          std::this_thread::sleep_for(std::chrono::microseconds(a.hold_us));
        }
        const std::int64_t end = mono_ns();
        const bool still_owned = lease.owns();
        const std::string token = lease.has_token() ? std::to_string(lease.token()) : std::string("-");
        std::string rec = std::to_string(::getpid()) + " " + std::to_string(tid) + " " + token + " " +
                          std::to_string(start) + " " + std::to_string(end) + " " +
                          (still_owned ? "1" : "0") + "\n";
        (void)!::write(log_fd, rec.data(), rec.size());
        lease.release(ec);
        if (ec) {
          std::fprintf(stderr, "lock_tool: release failed: %s\n", ec.message().c_str());
          ++failures;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  ::close(log_fd);
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  distlock::testing::obey_tool_signals();
  const Args a = parse(argc, argv);
  try {
    if (a.mode == "hold") return hold(a);
    if (a.mode == "hammer") return hammer(a);
  } catch (const std::system_error& e) {
    std::fprintf(stderr, "lock_tool: %s\n", e.what());
    return exit_code_for(e.code());
  }
  usage("unknown mode");
}
