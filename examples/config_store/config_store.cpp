// config_store — a configuration file shared by many readers and a few writers,
// guarded by a distributed read-write lock (`client.shared_mutex(name)`).
//
//   config_store [--url URL] [--processes 3] [--readers 4] [--writers 1] [--rounds 20]
//                [--keys 16] [--think-us 300] [--no-lock]
//
// The store is one file of --keys lines "key<i>=<version>". A writer rewrites it in
// place line by line (pausing --think-us between lines, as a slow writer would), so a
// reader that reads while a write is under way sees lines of two versions: a torn
// read. Writers take the lock exclusively (std::unique_lock), bump the version and
// pass the lock's fencing token on (written into the file's header line); readers take
// it shared (std::shared_lock) and check that every line carries the same version.
// Each of --processes processes (this program re-executed) runs --readers reader
// threads and --writers writer threads for --rounds rounds each. Every read and write
// appends "r|w start_ns end_ns" (CLOCK_MONOTONIC) to a log, from which the parent
// computes how many readers were inside at once and checks that no write overlapped
// anything. It prints one JSON line:
//   {"url":...,"reads":240,"writes":60,"torn_reads":0,"final_version":60,
//    "max_concurrent_readers":5,"writes_overlapped":0,"ok":true}
// --no-lock runs without the lock (the checks must then catch torn reads).
// URL: --url, else $DISTLOCK_URL, else the host-local file:// default.
// Exit: 0 ok, 1 a check failed, 2 bad arguments.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <shared_mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"

extern char** environ;

namespace {

namespace fs = std::filesystem;

std::int64_t mono_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

struct Config {
  std::string url;
  int processes = 3, readers = 4, writers = 1, rounds = 20, keys = 16;
  long think_us = 300;
  bool no_lock = false;
  std::string child_dir;  // internal
  std::string name = "config-store";
};

// Fixed-width lines, so a rewrite in place never changes the file's length.
std::string line_for(int key, long version) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "key%04d=%012ld\n", key, version);
  return buf;
}

void pause_us(long us) {
  if (us > 0) std::this_thread::sleep_for(std::chrono::microseconds(us));
}

// Reads the store; returns the version if all lines agree, -1 for a torn read.
long read_store(const fs::path& file, int keys, long think_us) {
  std::ifstream in(file);
  long version = -2;
  int n = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("token=", 0) == 0) continue;
    const auto eq = line.find('=');
    if (eq == std::string::npos) return -1;
    const long v = std::stol(line.substr(eq + 1));
    if (version == -2) version = v;
    if (v != version) return -1;
    if (++n % 4 == 0) pause_us(think_us / 4);
  }
  return n == keys ? version : -1;
}

void write_store(const fs::path& file, int keys, long version, const std::string& token, long think_us) {
  const int fd = ::open(file.c_str(), O_WRONLY);
  if (fd < 0) throw std::runtime_error("cannot open the store");
  char head[64];
  std::snprintf(head, sizeof head, "token=%20s\n", token.c_str());
  (void)!::write(fd, head, std::strlen(head));
  for (int k = 0; k < keys; ++k) {
    const std::string l = line_for(k, version);
    (void)!::write(fd, l.data(), l.size());  // one line at a time: a reader may look in between
    if (k % 4 == 3) pause_us(think_us);
  }
  ::close(fd);
}

int child(const Config& c) {
  const fs::path dir = c.child_dir;
  const fs::path store = dir / "config";
  const int log = ::open((dir / "ops.log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (log < 0) return 1;
  distlock::Client client = distlock::connect(c.url);
  distlock::LockOptions opts;
  opts.ttl = std::chrono::seconds(5);
  distlock::SharedMutex rw = client.shared_mutex(c.name, opts);
  std::atomic<int> errors{0};
  auto record = [&](char kind, std::int64_t start, std::int64_t end, long extra) {
    const std::string l = std::string(1, kind) + " " + std::to_string(start) + " " + std::to_string(end) +
                          " " + std::to_string(extra) + "\n";
    (void)!::write(log, l.data(), l.size());
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < c.readers + c.writers; ++t) {
    const bool writer = t < c.writers;
    threads.emplace_back([&, writer] {
      try {
        for (int r = 0; r < c.rounds; ++r) {
          if (writer) {
            std::unique_lock lk(rw, std::defer_lock);
            if (!c.no_lock) lk.lock();
            const std::int64_t start = mono_ns();
            const long version = read_store(store, c.keys, 0);  // ours alone: never torn
            const std::string token = c.no_lock || !client.has_fencing() ? "0" : std::to_string(rw.token());
            write_store(store, c.keys, std::max(version, 0L) + 1, token, c.think_us);
            record('w', start, mono_ns(), version);
          } else {
            std::shared_lock lk(rw, std::defer_lock);
            if (!c.no_lock) lk.lock();
            const std::int64_t start = mono_ns();
            const long version = read_store(store, c.keys, c.think_us);
            record('r', start, mono_ns(), version);
          }
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "config_store: %s\n", e.what());
        ++errors;
      }
    });
  }
  for (auto& t : threads) t.join();
  ::close(log);
  return errors ? 1 : 0;
}

int run(const Config& c, char* self) {
  const fs::path dir = fs::temp_directory_path() /
                       ("config-store-" + std::to_string(::getpid()) + "-" + std::to_string(mono_ns()));
  fs::create_directories(dir);
  {
    std::ofstream out(dir / "config");
    char head[64];
    std::snprintf(head, sizeof head, "token=%20s\n", "0");
    out << head;
    for (int k = 0; k < c.keys; ++k) out << line_for(k, 0);
  }
  std::vector<pid_t> pids;
  for (int p = 0; p < c.processes; ++p) {
    std::vector<std::string> args{self,
                                  "--url",
                                  c.url,
                                  "--readers",
                                  std::to_string(c.readers),
                                  "--writers",
                                  std::to_string(c.writers),
                                  "--rounds",
                                  std::to_string(c.rounds),
                                  "--keys",
                                  std::to_string(c.keys),
                                  "--think-us",
                                  std::to_string(c.think_us),
                                  "--child",
                                  dir.string()};
    if (c.no_lock) args.push_back("--no-lock");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    if (::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), environ) != 0) {
      std::fprintf(stderr, "config_store: cannot start a process\n");
      return 1;
    }
    pids.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  struct Op {
    char kind;
    std::int64_t start, end;
    long version;
  };
  std::vector<Op> ops;
  std::ifstream in(dir / "ops.log");
  for (std::string line; std::getline(in, line);) {
    std::istringstream ls(line);
    Op o{};
    if (ls >> o.kind >> o.start >> o.end >> o.version) ops.push_back(o);
  }
  int reads = 0, writes = 0, torn = 0, overlapped = 0;
  std::vector<std::pair<std::int64_t, int>> reader_events;
  for (const auto& o : ops) {
    if (o.kind == 'r') {
      ++reads;
      if (o.version < 0) ++torn;
      reader_events.emplace_back(o.start, +1);
      reader_events.emplace_back(o.end, -1);
    } else {
      ++writes;
      for (const auto& x : ops) {
        if (&x != &o && x.start < o.end && o.start < x.end) {
          ++overlapped;
          break;
        }
      }
    }
  }
  std::sort(reader_events.begin(), reader_events.end());
  int open = 0, most = 0;
  for (const auto& [t, d] : reader_events) most = std::max(most, open += d);
  const long final_version = read_store(dir / "config", c.keys, 0);
  const int expected_reads = c.processes * c.readers * c.rounds;
  const int expected_writes = c.processes * c.writers * c.rounds;
  // Every write bumped the version by one from what it read alone: the final version
  // counts the writes exactly (a lost update would leave it short).
  const bool ok = failed == 0 && reads == expected_reads && writes == expected_writes && torn == 0 &&
                  overlapped == 0 && final_version == expected_writes;
  std::error_code ec;
  fs::remove_all(dir, ec);
  std::printf(
      "%d reads (%d torn), %d writes (%d overlapped), final version %ld, up to %d readers at once%s\n", reads,
      torn, writes, overlapped, final_version, most, c.no_lock ? " without the lock" : "");
  nlohmann::json j{{"url", c.url},
                   {"processes", c.processes},
                   {"readers", c.readers},
                   {"writers", c.writers},
                   {"reads", reads},
                   {"writes", writes},
                   {"torn_reads", torn},
                   {"writes_overlapped", overlapped},
                   {"final_version", final_version},
                   {"expected_version", expected_writes},
                   {"max_concurrent_readers", most},
                   {"locked", !c.no_lock},
                   {"process_failures", failed},
                   {"ok", ok}};
  std::cout << j.dump() << std::endl;
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  CLI::App app{"config_store: readers and writers of a shared config behind a distributed read-write lock"};
  app.add_option("--url", c.url, "backend URL (default: $DISTLOCK_URL, else host-local file://)");
  app.add_option("--processes", c.processes, "processes")->check(CLI::Range(1, 64));
  app.add_option("--readers", c.readers, "reader threads per process")->check(CLI::Range(0, 256));
  app.add_option("--writers", c.writers, "writer threads per process")->check(CLI::Range(0, 256));
  app.add_option("--rounds", c.rounds, "reads or writes per thread")->check(CLI::Range(1, 100000));
  app.add_option("--keys", c.keys, "lines in the config")->check(CLI::Range(1, 10000));
  app.add_option("--think-us", c.think_us, "pause inside a read or write")->check(CLI::Range(0L, 1'000'000L));
  app.add_flag("--no-lock", c.no_lock, "run without the lock (the checks must then fail)");
  app.add_option("--child", c.child_dir)->group("");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (c.url.empty()) c.url = distlock::default_url();
  try {
    if (!c.child_dir.empty()) return child(c);
    return run(c, argv[0]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "config_store: %s\n", e.what());
    return 1;
  }
}
