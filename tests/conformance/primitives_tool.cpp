// A helper process for the semaphore and read-write lock conformance scenarios.
//
//   primitives_tool sem-hammer --url URL --name NAME --permits N --log FILE
//                   [--threads T] [--iters I] [--ttl MS] [--hold-us US]
//   primitives_tool sem-hold   --url URL --name NAME --permits N [--ttl MS]
//   primitives_tool rw-hammer  --url URL --name NAME --log FILE [--threads T] [--iters I]
//                   [--ttl MS] [--hold-us US] [--write-every K]
//
// sem-hammer: T threads (one client per process) each take a permit I times. Every
// critical section appends one line "pid tid permit token start_ns end_ns owned" to
// FILE (CLOCK_MONOTONIC, comparable across the processes of one host; token "-"
// without fencing; owned = the permit's owns() at the end of the section) with one
// O_APPEND write.
// sem-hold: takes one permit, prints "acquired <permit> <token> <start_ns>", holds it
// until SIGTERM/SIGINT (prints "lost" when the lease is lost), releases and prints
// "released".
// rw-hammer: T threads each lock I times; every K-th time exclusively (a writer),
// else shared. Lines "pid tid mode token start_ns end_ns owned", mode w or r (token
// "-" for readers).
// Exit codes: 0 done, 64 usage, 69 error, 75 not acquired.
#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"
#include "support/backend_mono_clock.hpp"
#include "support/tool_flags.hpp"

namespace {

using distlock::testing::mono_ns;
using distlock::testing::say;

std::atomic<bool> g_stop{false};

void on_signal(int) {
  g_stop = true;
}

struct Args : distlock::testing::ToolTarget, distlock::testing::ToolHammer {
  std::string mode;
  int permits = 0, write_every = 4;
};

[[noreturn]] void usage(const std::string& why) {
  distlock::testing::tool_usage("primitives_tool", why);
}

Args parse(int argc, char** argv) {
  Args a;
  distlock::testing::ToolFlags f("primitives_tool");
  add_target_flags(f, a);
  add_hammer_flags(f, a);
  f.number("--permits", a.permits).number("--write-every", a.write_every);
  a.mode = f.parse(argc, argv, "sem-hammer|sem-hold|rw-hammer");
  if (a.name.empty()) f.usage("--name is required");
  return a;
}

// Client options that print only the library's error lines, to stderr.
distlock::ClientOptions errors_only() {
  distlock::ClientOptions o;
  o.logger = [](distlock::LogLevel level, std::string_view msg) {
    if (level >= distlock::LogLevel::error)
      std::fprintf(stderr, "distlock %.*s\n", int(msg.size()), msg.data());
  };
  return o;
}

distlock::LockOptions lock_opts(const Args& a) {
  distlock::LockOptions o;
  o.ttl = distlock::Millis(a.ttl_ms);
  return o;
}

long tid() {
  return static_cast<long>(::syscall(SYS_gettid));
}

int permit_of(const distlock::Lease& lease) {
  const std::string& n = lease.name();
  return std::stoi(n.substr(n.rfind('\x1f') + 1));
}

void append(int fd, const std::string& line) {
  (void)!::write(fd, line.data(), line.size());
}

void hold_for(long us) {
  if (us > 0) std::this_thread::sleep_for(std::chrono::microseconds(us));
}

// Runs --threads threads that each call `section(t, i)` --iters times (t: the thread, i: the
// iteration) and append the line it returns to --log with one O_APPEND write. An exception ends
// its thread (printed on stderr). 0, or 69 when a thread failed.
template <class Section>
int hammer(const Args& a, Section section) {
  const int fd = ::open(a.log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0) usage("cannot open --log");
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < a.threads; ++t) {
    threads.emplace_back([&, t] {
      try {
        for (int i = 0; i < a.iters; ++i) append(fd, section(t, i));
      } catch (const std::exception& e) {
        std::fprintf(stderr, "primitives_tool: %s\n", e.what());
        ++failed;
      }
    });
  }
  for (auto& th : threads) th.join();
  ::close(fd);
  return failed ? 69 : 0;
}

// One critical section's line: "pid tid <what> <token> start_ns end_ns <owned 0|1>".
std::string section_line(const std::string& what, const std::string& token, std::int64_t start,
                         std::int64_t end, bool owned) {
  return std::to_string(::getpid()) + " " + std::to_string(tid()) + " " + what + " " + token + " " +
         std::to_string(start) + " " + std::to_string(end) + " " + (owned ? "1" : "0") + "\n";
}

int sem_hammer(const Args& a) {
  distlock::Client client = distlock::connect(a.url, errors_only());
  distlock::Semaphore sem = client.semaphore(a.name, a.permits, lock_opts(a));
  return hammer(a, [&](int, int) {
    distlock::Lease permit = sem.acquire();
    const std::int64_t start = mono_ns();
    hold_for(a.hold_us);
    const bool owned = permit.owns();
    const std::int64_t end = mono_ns();
    std::string line = section_line(std::to_string(permit_of(permit)),
                                    permit.has_token() ? std::to_string(permit.token()) : std::string("-"),
                                    start, end, owned);
    std::error_code ec;
    permit.release(ec);  // a lost permit was signalled; nothing to undo
    return line;
  });
}

int sem_hold(const Args& a) {
  distlock::Client client = distlock::connect(a.url, errors_only());
  distlock::Semaphore sem = client.semaphore(a.name, a.permits, lock_opts(a));
  distlock::Lease permit = sem.acquire();
  const std::int64_t start = mono_ns();
  say("acquired " + std::to_string(permit_of(permit)) + " " +
      (permit.has_token() ? std::to_string(permit.token()) : std::string("-")) + " " + std::to_string(start));
  permit.on_lost([] { say("lost"); });
  while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::error_code ec;
  permit.release(ec);
  say(ec ? "release " + ec.message() : std::string("released"));
  return 0;
}

int rw_hammer(const Args& a) {
  distlock::Client client = distlock::connect(a.url, errors_only());
  distlock::SharedMutex rw = client.shared_mutex(a.name, lock_opts(a));
  return hammer(a, [&](int t, int i) {
    const bool write = (i + t) % a.write_every == 0;
    std::string token = "-";
    std::int64_t start = 0, end = 0;
    bool owned = false;
    if (write) {
      std::unique_lock lk(rw);
      start = mono_ns();
      if (rw.owns() && client.has_fencing()) token = std::to_string(rw.token());
      hold_for(a.hold_us);
      owned = rw.owns();
      end = mono_ns();
    } else {
      std::shared_lock lk(rw);
      start = mono_ns();
      hold_for(a.hold_us);
      owned = rw.owns();
      end = mono_ns();
    }
    return section_line(write ? "w" : "r", token, start, end, owned);
  });
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  distlock::testing::on_signals(on_signal, {SIGTERM, SIGINT});
  try {
    if (a.mode == "sem-hammer") return sem_hammer(a);
    if (a.mode == "sem-hold") return sem_hold(a);
    if (a.mode == "rw-hammer") return rw_hammer(a);
  } catch (const std::system_error& e) {
    std::fprintf(stderr, "primitives_tool: %s\n", e.what());
    return e.code() == distlock::errc::timeout || e.code() == distlock::errc::busy ? 75 : 69;
  }
  usage("unknown mode " + a.mode);
}
