// seckill — a flash sale ("seconds kill") on a distributed lock with fenced writes.
//
//   seckill [--url URL] [--stock 300] [--requests 500] [--processes 2] [--threads 8]
//
// `--requests` purchases arrive at once from `--processes` OS processes (this program
// re-executed) x `--threads` threads. Each purchase takes the lock (distlock::Client),
// reads the stock, decrements it if positive with a fenced write (the resource rejects
// a holder whose token is stale), and records the buyer. The stock lives in Redis for
// redis:// URLs (RedisFence), in files beside the lock files for file:// (FileFence),
// in this process for memory:// (FenceGuard, one process only), and in files in
// --data-dir for the other backends.
//
// At the end it checks the books — sold + left = stock, no buyer recorded twice,
// nothing sold beyond the stock — prints a summary and, as its last line, one JSON
// object; it exits 1 on any violation or failed purchase, 2 on bad arguments.
// `--no-lock` runs the same sale with neither lock nor fence (read the stock, write
// stock - 1): the checks then catch the overselling and lost updates the lock prevents.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"
#include "distlock/fencing.hpp"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using json = nlohmann::ordered_json;

struct Config {
  std::string url;
  std::string name = "seckill";
  std::string data_dir;
  long stock = 300;
  long requests = 500;
  int processes = 2;
  int threads = 8;
  long ttl_ms = 10000;
  bool no_lock = false;  // --no-lock: the same sale without lock or fence, to watch it break
  int worker = -1;       // >= 0: this process is worker N (internal)
};

enum class Outcome { sold, sold_out, stale };

/// Where the stock and the buyers live. Every write goes through a fence.
class Store {
 public:
  virtual ~Store() = default;
  /// Sets the stock and clears buyers and fence (nobody holds the lock yet).
  virtual void init(long stock) = 0;
  virtual long read_stock() = 0;
  /// Under the lock: decrement the stock if positive and record the buyer, fenced by `token`.
  virtual Outcome buy(std::uint64_t token, const std::string& buyer) = 0;
  /// --no-lock: write stock `seen - 1` and record the buyer, unfenced, as code that
  /// trusts an earlier read would.
  virtual void unsafe_buy(long seen, const std::string& buyer) = 0;
  virtual std::vector<std::string> buyers() = 0;
  virtual std::string describe() const = 0;
};

// ---- Redis: RedisFence ------------------------------------------------------

class RedisStore final : public Store {
 public:
  RedisStore(const std::string& url, const std::string& name)
      : fence_(url), stock_key_("{" + name + "}:stock"), buyers_key_("{" + name + "}:buyers") {}

  void init(long stock) override {
    fence_.reset(stock_key_);
    fence_.reset(buyers_key_);
    fence_.command({"SET", stock_key_, std::to_string(stock)});
  }
  long read_stock() override { return std::stol(fence_.get(stock_key_).value_or("0")); }
  Outcome buy(std::uint64_t token, const std::string& buyer) override {
    const distlock::DecrementResult d = fence_.decrement_if_positive(stock_key_, token);
    if (!d.applied()) return Outcome::stale;
    if (!d.decremented) return Outcome::sold_out;
    const distlock::ScriptResult r =
        fence_.eval("return redis.call('RPUSH', KEYS[1], ARGV[1])", {buyers_key_}, {buyer}, token);
    return r.applied() ? Outcome::sold : Outcome::stale;
  }
  void unsafe_buy(long seen, const std::string& buyer) override {
    fence_.command({"SET", stock_key_, std::to_string(seen - 1)});
    fence_.command({"RPUSH", buyers_key_, buyer});
  }
  std::vector<std::string> buyers() override {
    std::vector<std::string> out;
    for (const auto& v : fence_.command({"LRANGE", buyers_key_, "0", "-1"}).elements) out.push_back(v.str);
    return out;
  }
  std::string describe() const override {
    return "Redis keys " + stock_key_ + " and " + buyers_key_ + " on " + fence_.url();
  }

 private:
  distlock::RedisFence fence_;
  std::string stock_key_, buyers_key_;
};

// ---- local files: FileFence -------------------------------------------------

class FileStore final : public Store {
 public:
  FileStore(const fs::path& dir, const std::string& name)
      : stock_(dir / (name + ".stock")), buyers_(dir / (name + ".buyers")), fence_(dir / (name + ".fence")) {
    fs::create_directories(dir);
  }

  void init(long stock) override {
    fence_.reset();
    fs::remove(buyers_);
    write_stock(stock);
  }
  long read_stock() override {
    std::ifstream in(stock_);
    long n = 0;
    if (!(in >> n)) throw std::runtime_error("cannot read the stock from " + stock_.string());
    return n;
  }
  Outcome buy(std::uint64_t token, const std::string& buyer) override {
    Outcome out = Outcome::sold_out;
    const distlock::FenceResult r = fence_.apply(token, [&] {
      const long n = read_stock();  // again, under the fence
      if (n <= 0) return;
      write_stock(n - 1);
      append_line(buyers_, buyer);
      out = Outcome::sold;
    });
    return r.applied() ? out : Outcome::stale;
  }
  void unsafe_buy(long seen, const std::string& buyer) override {
    write_stock(seen - 1);
    append_line(buyers_, buyer);
  }
  std::vector<std::string> buyers() override {
    std::vector<std::string> out;
    std::ifstream in(buyers_);
    for (std::string line; std::getline(in, line);) out.push_back(line);
    return out;
  }
  std::string describe() const override { return "files " + stock_.string() + " and " + buyers_.string(); }

 private:
  void write_stock(long n) const {
    // Write-and-rename: a reader (or a crash) never sees a half-written number.
    const fs::path tmp = stock_.string() + ".tmp";
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << n << "\n";
      if (!out.flush()) throw std::runtime_error("cannot write " + tmp.string());
    }
    fs::rename(tmp, stock_);
  }
  static void append_line(const fs::path& p, const std::string& line) {
    const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) throw std::runtime_error("cannot open " + p.string());
    const std::string l = line + "\n";
    const ssize_t n = ::write(fd, l.data(), l.size());  // one write: lines never interleave
    ::close(fd);
    if (n != static_cast<ssize_t>(l.size())) throw std::runtime_error("cannot append to " + p.string());
  }

  fs::path stock_, buyers_;
  distlock::FileFence fence_;
};

// ---- this process's memory: FenceGuard ---------------------------------------

class MemoryStore final : public Store {
 public:
  void init(long stock) override { stock_ = stock; }
  long read_stock() override {
    std::lock_guard lk(mu_);
    return stock_;
  }
  Outcome buy(std::uint64_t token, const std::string& buyer) override {
    Outcome out = Outcome::sold_out;
    const distlock::FenceResult r = guard_.apply(token, [&] {
      std::lock_guard lk(mu_);
      if (stock_ <= 0) return;
      --stock_;
      buyers_.push_back(buyer);
      out = Outcome::sold;
    });
    return r.applied() ? out : Outcome::stale;
  }
  void unsafe_buy(long seen, const std::string& buyer) override {
    std::lock_guard lk(mu_);
    stock_ = seen - 1;
    buyers_.push_back(buyer);
  }
  std::vector<std::string> buyers() override {
    std::lock_guard lk(mu_);
    return buyers_;
  }
  std::string describe() const override { return "this process's memory"; }

 private:
  distlock::FenceGuard guard_;
  std::mutex mu_;
  long stock_ = 0;
  std::vector<std::string> buyers_;
};

std::string scheme_of(const std::string& url) {
  const auto p = url.find("://");
  return p == std::string::npos ? std::string() : url.substr(0, p);
}

std::unique_ptr<Store> make_store(const Config& cfg) {
  const std::string scheme = scheme_of(cfg.url);
  if (scheme == "redis") return std::make_unique<RedisStore>(cfg.url, cfg.name);
  if (scheme == "memory") return std::make_unique<MemoryStore>();
  fs::path dir;
  if (!cfg.data_dir.empty()) {
    dir = cfg.data_dir;
  } else if (scheme == "file") {
    std::string path = cfg.url.substr(7);
    path = path.substr(0, path.find('?'));
    dir = fs::path(path) / "seckill-data";
  } else {
    dir = fs::temp_directory_path() / ("distlock-seckill-" + std::to_string(::getuid()));
  }
  return std::make_unique<FileStore>(dir, cfg.name);
}

// ---- one process's share of the purchases -----------------------------------

struct WorkerReport {
  long sold = 0, sold_out = 0, stale = 0, errors = 0;
  std::vector<long> waits_us;
  std::string first_error;
};

WorkerReport run_purchases(const Config& cfg, Store& store, int process_index) {
  distlock::Client client = distlock::connect(cfg.url);
  if (!client.has_fencing()) {
    std::cerr << "seckill: " << client.scheme() << ":// issues no fencing tokens; writes use token 0 "
              << "and are not fenced\n";
  }
  distlock::LockOptions opts;
  opts.ttl = std::chrono::milliseconds(cfg.ttl_ms);
  opts.wait = std::chrono::seconds(120);

  // Requests are split evenly over processes x threads.
  const long slots = static_cast<long>(cfg.processes) * cfg.threads;
  WorkerReport report;
  std::mutex mu;
  std::vector<std::thread> threads;
  for (int t = 0; t < cfg.threads; ++t) {
    const long slot = static_cast<long>(process_index) * cfg.threads + t;
    const long mine = cfg.requests / slots + (slot < cfg.requests % slots ? 1 : 0);
    threads.emplace_back([&, t, mine] {
      WorkerReport local;
      for (long i = 0; i < mine; ++i) {
        const std::string buyer =
            "p" + std::to_string(process_index) + "-t" + std::to_string(t) + "-r" + std::to_string(i);
        try {
          if (cfg.no_lock) {
            const long seen = store.read_stock();
            if (seen <= 0) {
              ++local.sold_out;
              continue;
            }
            // The time a real service spends between its read and its write.
            std::this_thread::sleep_for(std::chrono::microseconds(200));
            store.unsafe_buy(seen, buyer);
            ++local.sold;
            local.waits_us.push_back(0);
            continue;
          }
          const auto t0 = Clock::now();
          distlock::Lease lease = client.acquire(cfg.name, opts);
          local.waits_us.push_back(
              std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count());
          const std::uint64_t token = lease.has_token() ? lease.token() : 0;
          if (store.read_stock() <= 0) {
            ++local.sold_out;
            continue;
          }
          switch (store.buy(token, buyer)) {
            case Outcome::sold: ++local.sold; break;
            case Outcome::sold_out: ++local.sold_out; break;
            case Outcome::stale: ++local.stale; break;
          }
        } catch (const std::exception& e) {
          if (local.errors++ == 0) local.first_error = buyer + ": " + e.what();
        }
      }
      std::lock_guard lk(mu);
      report.sold += local.sold;
      report.sold_out += local.sold_out;
      report.stale += local.stale;
      report.errors += local.errors;
      if (report.first_error.empty()) report.first_error = local.first_error;
      report.waits_us.insert(report.waits_us.end(), local.waits_us.begin(), local.waits_us.end());
    });
  }
  for (auto& th : threads) th.join();
  return report;
}

json to_json(const WorkerReport& r) {
  return {{"sold", r.sold},     {"sold_out", r.sold_out}, {"stale", r.stale},
          {"errors", r.errors}, {"waits_us", r.waits_us}, {"first_error", r.first_error}};
}

WorkerReport from_json(const json& j) {
  WorkerReport r;
  r.sold = j.at("sold");
  r.sold_out = j.at("sold_out");
  r.stale = j.at("stale");
  r.errors = j.at("errors");
  r.waits_us = j.at("waits_us").get<std::vector<long>>();
  r.first_error = j.at("first_error");
  return r;
}

// ---- worker processes ---------------------------------------------------------

struct Child {
  pid_t pid = -1;
  int out_fd = -1;
};

Child spawn_worker(const Config& cfg, int index) {
  std::vector<std::string> args{"seckill",
                                "--url",
                                cfg.url,
                                "--name",
                                cfg.name,
                                "--stock",
                                std::to_string(cfg.stock),
                                "--requests",
                                std::to_string(cfg.requests),
                                "--processes",
                                std::to_string(cfg.processes),
                                "--threads",
                                std::to_string(cfg.threads),
                                "--ttl-ms",
                                std::to_string(cfg.ttl_ms),
                                "--worker",
                                std::to_string(index)};
  if (!cfg.data_dir.empty()) {
    args.push_back("--data-dir");
    args.push_back(cfg.data_dir);
  }
  if (cfg.no_lock) args.push_back("--no-lock");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "pipe");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, "/proc/self/exe", &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    throw std::system_error(rc, std::generic_category(), "starting a worker process");
  }
  return {pid, fds[0]};
}

std::string read_all(int fd) {
  std::string out;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      out.append(buf, static_cast<std::size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  ::close(fd);
  return out;
}

double percentile(std::vector<long> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto idx = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return static_cast<double>(v[std::min(idx, v.size() - 1)]);
}

int run_sale(const Config& cfg) {
  std::unique_ptr<Store> store = make_store(cfg);
  store->init(cfg.stock);

  WorkerReport total;
  const auto t0 = Clock::now();
  if (cfg.processes == 1) {
    total = run_purchases(cfg, *store, 0);
  } else {
    std::vector<Child> kids;
    for (int i = 0; i < cfg.processes; ++i) kids.push_back(spawn_worker(cfg, i));
    for (int i = 0; i < cfg.processes; ++i) {
      const std::string out = read_all(kids[static_cast<std::size_t>(i)].out_fd);
      int status = 0;
      ::waitpid(kids[static_cast<std::size_t>(i)].pid, &status, 0);
      WorkerReport r;
      try {
        r = from_json(json::parse(out));
      } catch (const std::exception& e) {
        r.errors = 1;
        r.first_error = "worker " + std::to_string(i) + " gave no report (exit status " +
                        std::to_string(status) + "): " + e.what();
      }
      total.sold += r.sold;
      total.sold_out += r.sold_out;
      total.stale += r.stale;
      total.errors += r.errors;
      if (total.first_error.empty()) total.first_error = r.first_error;
      total.waits_us.insert(total.waits_us.end(), r.waits_us.begin(), r.waits_us.end());
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();

  // The books, read back from the store itself.
  const long left = store->read_stock();
  const std::vector<std::string> buyers = store->buyers();
  std::map<std::string, int> seen;
  long duplicates = 0;
  for (const auto& b : buyers) {
    if (++seen[b] > 1) ++duplicates;
  }
  const long sold = static_cast<long>(buyers.size());
  const long oversold = std::max(0L, sold - cfg.stock) + std::max(0L, -left);
  const long expected = std::min(cfg.stock, cfg.requests);

  std::vector<std::string> violations;
  if (oversold > 0) violations.push_back("oversold by " + std::to_string(oversold));
  if (duplicates > 0) violations.push_back(std::to_string(duplicates) + " buyers recorded twice");
  if (sold + left != cfg.stock) {
    violations.push_back("sold " + std::to_string(sold) + " + left " + std::to_string(left) + " != stock " +
                         std::to_string(cfg.stock));
  }
  if (sold != total.sold) {
    violations.push_back("buyers told they bought: " + std::to_string(total.sold) +
                         ", recorded: " + std::to_string(sold));
  }
  if (sold != expected) violations.push_back("expected " + std::to_string(expected) + " sold");
  if (total.stale > 0) violations.push_back(std::to_string(total.stale) + " fenced writes were stale");
  if (total.errors > 0)
    violations.push_back(std::to_string(total.errors) + " purchases failed: " + total.first_error);

  const double rps = seconds > 0 ? static_cast<double>(cfg.requests) / seconds : 0;
  const double p50 = percentile(total.waits_us, 0.50), p99 = percentile(total.waits_us, 0.99);
  std::cout << "seckill on " << cfg.url << (cfg.no_lock ? " WITHOUT the lock (--no-lock)" : "")
            << " (stock in " << store->describe() << ")\n"
            << "  " << cfg.requests << " requests from " << cfg.processes << " processes x " << cfg.threads
            << " threads in " << seconds << " s (" << static_cast<long>(rps) << " requests/s)\n"
            << "  sold " << sold << " of " << cfg.stock << ", left " << left << ", sold out for "
            << total.sold_out << " requests\n"
            << "  lock wait p50 " << p50 << " us, p99 " << p99 << " us\n";
  if (violations.empty()) {
    std::cout << "  OK: no overselling, no duplicate buyers, the books balance\n";
  } else {
    for (const auto& v : violations) std::cout << "  VIOLATION: " << v << "\n";
  }
  const json summary = {{"url", cfg.url},
                        {"sold", sold},
                        {"stock_left", left},
                        {"oversold", oversold},
                        {"duplicate_buyers", duplicates},
                        {"requests_per_s", rps},
                        {"wait_p50_us", p50},
                        {"wait_p99_us", p99}};
  std::cout << summary.dump() << std::endl;
  return violations.empty() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  CLI::App app{"seckill: a flash sale on a distributed lock with fenced writes"};
  app.add_option("--url", cfg.url,
                 "lock backend URL (default: $DISTLOCK_URL, else the host-local file:// dir)");
  app.add_option("--stock", cfg.stock, "items for sale")->check(CLI::NonNegativeNumber);
  app.add_option("--requests", cfg.requests, "purchase requests in total")->check(CLI::NonNegativeNumber);
  app.add_option("--processes", cfg.processes, "OS processes")->check(CLI::Range(1, 64));
  app.add_option("--threads", cfg.threads, "threads per process")->check(CLI::Range(1, 256));
  app.add_option("--name", cfg.name, "lock name, also the prefix of the stock keys/files");
  app.add_option("--ttl-ms", cfg.ttl_ms, "lease TTL in milliseconds")->check(CLI::Range(100L, 3600000L));
  app.add_option("--data-dir", cfg.data_dir, "directory for the stock files (non-Redis backends)");
  app.add_flag("--no-lock", cfg.no_lock,
               "run the sale WITHOUT the lock and the fence (reads then writes): shows the overselling the "
               "lock prevents; exits 1");
  app.add_option("--worker", cfg.worker, "internal: run as worker process N")->group("");
  CLI11_PARSE(app, argc, argv);

  if (cfg.url.empty()) cfg.url = distlock::default_url();
  if (cfg.name.empty()) {
    std::cerr << "seckill: --name must not be empty\n";
    return 2;
  }
  if (scheme_of(cfg.url) == "memory" && cfg.processes != 1) {
    std::cerr << "seckill: memory:// exists only inside one process; use --processes 1\n";
    return 2;
  }
  try {
    if (cfg.worker >= 0) {
      std::unique_ptr<Store> store = make_store(cfg);
      std::cout << to_json(run_purchases(cfg, *store, cfg.worker)).dump() << std::endl;
      return 0;
    }
    return run_sale(cfg);
  } catch (const std::exception& e) {
    std::cerr << "seckill: " << e.what() << "\n";
    return 1;
  }
}
