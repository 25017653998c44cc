// worker_pool — a rate-limited worker pool: at most --permits jobs run at once across
// every worker process, enforced by a distributed semaphore.
//
//   worker_pool [--url URL] [--permits 3] [--processes 3] [--threads 4] [--jobs 48]
//               [--work-us 3000] [--no-limit]
//
// The pool is --processes OS processes (this program re-executed) x --threads threads.
// Job i is done by whichever thread takes it from a shared queue (one file per job,
// claimed by an atomic rename). A thread takes a permit (`client.semaphore(name, N)`),
// runs the job (sleeps --work-us, stopping early if the permit's stop token fires) and
// gives the permit back. Every job appends "start_ns end_ns owned" (CLOCK_MONOTONIC,
// one O_APPEND write) to a log; at the end the parent computes the most jobs that ran
// at one instant and checks that it never exceeded the permits, that every job ran
// exactly once, and prints one JSON line:
//   {"url":...,"permits":3,"jobs":48,"done":48,"max_concurrent":3,"lost":0,"ok":true}
// --no-limit runs without the semaphore (to show the check catches an unlimited pool:
// with more threads than permits it reports max_concurrent > permits and ok=false).
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
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
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
  int permits = 3, processes = 3, threads = 4, jobs = 48;
  long work_us = 3000;
  bool no_limit = false;
  std::string child_dir;  // internal: set in the re-executed workers
  std::string name = "worker-pool";
};

// Claims the next job of the queue directory: the rename succeeds for exactly one thread.
bool claim(const fs::path& queue, int& job) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(queue, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("job-", 0) != 0) continue;
    const fs::path taken = queue / ("taken-" + n.substr(4) + "-" + std::to_string(::getpid()));
    if (::rename(e.path().c_str(), taken.c_str()) == 0) {
      job = std::stoi(n.substr(4));
      return true;
    }
  }
  return false;
}

int worker(const Config& c) {
  const fs::path dir = c.child_dir;
  const int fd = ::open((dir / "jobs.log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0) return 1;
  distlock::Client client = distlock::connect(c.url);
  distlock::LockOptions opts;
  opts.ttl = std::chrono::seconds(5);
  std::optional<distlock::Semaphore> sem;
  if (!c.no_limit) sem.emplace(client.semaphore(c.name, c.permits, opts));
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < c.threads; ++t) {
    threads.emplace_back([&] {
      try {
        int job = 0;
        while (claim(dir / "queue", job)) {
          distlock::Lease permit;
          if (sem) permit = sem->acquire();
          const std::int64_t start = mono_ns();
          const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(c.work_us);
          const std::stop_token stop = permit.stop_token();
          while (std::chrono::steady_clock::now() < until && !stop.stop_requested()) {
            std::this_thread::sleep_for(std::chrono::microseconds(200));
          }
          const bool owned = !sem || permit.owns();
          const std::int64_t end = mono_ns();
          const std::string line = std::to_string(job) + " " + std::to_string(start) + " " +
                                   std::to_string(end) + " " + (owned ? "1" : "0") + "\n";
          (void)!::write(fd, line.data(), line.size());
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "worker_pool: %s\n", e.what());
        ++errors;
      }
    });
  }
  for (auto& t : threads) t.join();
  ::close(fd);
  return errors ? 1 : 0;
}

int run(const Config& c, char* self) {
  const fs::path dir = fs::temp_directory_path() /
                       ("worker-pool-" + std::to_string(::getpid()) + "-" + std::to_string(mono_ns()));
  fs::create_directories(dir / "queue");
  for (int i = 0; i < c.jobs; ++i) std::ofstream(dir / "queue" / ("job-" + std::to_string(i)));
  const std::string url = c.url.empty() ? distlock::default_url() : c.url;
  if (!c.no_limit) {
    // Define the semaphore (or find it defined with another count: a clear error).
    distlock::Client client = distlock::connect(url);
    client.semaphore(c.name, c.permits);
  }
  std::vector<pid_t> pids;
  for (int p = 0; p < c.processes; ++p) {
    std::vector<std::string> args{self,
                                  "--url",
                                  url,
                                  "--permits",
                                  std::to_string(c.permits),
                                  "--threads",
                                  std::to_string(c.threads),
                                  "--work-us",
                                  std::to_string(c.work_us),
                                  "--child",
                                  dir.string()};
    if (c.no_limit) args.push_back("--no-limit");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    if (::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), environ) != 0) {
      std::fprintf(stderr, "worker_pool: cannot start a worker process\n");
      return 1;
    }
    pids.push_back(pid);
  }
  int failed_workers = 0;
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed_workers;
  }
  // The books: each job once; the most running at one instant (owned sections).
  std::vector<std::pair<std::int64_t, int>> events;
  std::vector<int> seen(static_cast<std::size_t>(c.jobs), 0);
  int done = 0, lost = 0;
  std::ifstream in(dir / "jobs.log");
  for (std::string line; std::getline(in, line);) {
    std::istringstream ls(line);
    int job = 0, owned = 0;
    std::int64_t start = 0, end = 0;
    if (!(ls >> job >> start >> end >> owned) || job < 0 || job >= c.jobs) continue;
    ++done;
    ++seen[static_cast<std::size_t>(job)];
    if (!owned) {
      ++lost;  // its permit was lost before it finished: it stopped early
      continue;
    }
    events.emplace_back(start, +1);
    events.emplace_back(end, -1);
  }
  std::sort(events.begin(), events.end());
  int open = 0, most = 0;
  for (const auto& [t, d] : events) most = std::max(most, open += d);
  const bool each_once = std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; });
  const bool ok = failed_workers == 0 && done == c.jobs && each_once && most <= c.permits;
  std::error_code ec;
  fs::remove_all(dir, ec);
  std::printf("ran %d of %d jobs on %d processes x %d threads; at most %d at once (permits %d)%s\n", done,
              c.jobs, c.processes, c.threads, most, c.permits, c.no_limit ? " without the semaphore" : "");
  nlohmann::json j{{"url", url},
                   {"permits", c.permits},
                   {"processes", c.processes},
                   {"threads", c.threads},
                   {"jobs", c.jobs},
                   {"done", done},
                   {"each_job_once", each_once},
                   {"max_concurrent", most},
                   {"lost", lost},
                   {"limited", !c.no_limit},
                   {"worker_failures", failed_workers},
                   {"ok", ok}};
  std::cout << j.dump() << std::endl;
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  CLI::App app{"worker_pool: a rate-limited worker pool on a distributed semaphore"};
  app.add_option("--url", c.url, "backend URL (default: $DISTLOCK_URL, else host-local file://)");
  app.add_option("--permits", c.permits, "jobs running at once, across all processes")
      ->check(CLI::Range(1, 1024));
  app.add_option("--processes", c.processes, "worker processes")->check(CLI::Range(1, 64));
  app.add_option("--threads", c.threads, "threads per process")->check(CLI::Range(1, 256));
  app.add_option("--jobs", c.jobs, "jobs in the queue")->check(CLI::Range(1, 100000));
  app.add_option("--work-us", c.work_us, "how long a job runs")->check(CLI::Range(0L, 10'000'000L));
  app.add_flag("--no-limit", c.no_limit, "run without the semaphore (the check must then fail)");
  app.add_option("--child", c.child_dir)->group("");  // internal
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (c.url.empty()) c.url = distlock::default_url();
  try {
    if (!c.child_dir.empty()) return worker(c);
    return run(c, argv[0]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "worker_pool: %s\n", e.what());
    return 1;
  }
}
