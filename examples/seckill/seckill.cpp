// seckill — a flash sale ("seconds kill") whose stock is protected by a distributed lock.
//
//   seckill [--url URL] [--stock 300] [--requests 500] [--processes 2] [--threads 8]
//           [--think-us 2000] [--no-fence | --no-lock | --lock-per-buyer]
//
// `--requests` purchases come from `--processes` OS processes (this program re-executed)
// x `--threads` threads — the buyers. Every buyer is connected and waiting at a start
// gate before the sale opens, then all start at once. A purchase is a plain, non-atomic
// read-modify-write of the stock:
//
//   lock -> read the stock -> "think" (--think-us) -> write stock - 1 and record the buyer -> unlock
//
// The store does nothing to make this safe: the read and the write are separate
// operations and the write does not look at the stock again. The lock is the only thing
// that keeps two buyers from reading the same stock and both selling the item. The
// think pause is the time a real service spends between its read and its write; it
// widens the race window, so a broken lock is caught on every run (docs/design.md,
// "The flash-sale example", gives the argument).
//
// Fencing is a separate layer on top: with a backend that issues tokens, the write
// carries the lease's token and the store rejects it if a newer holder has written
// already (a holder paused past its lease). Rejected writes are counted and reported
// (`fence_rejected`); `--no-fence` writes without it.
//
// The stock lives in Redis for redis:// URLs (RedisFence), in files beside the lock
// files for file:// (FileFence), in this process for memory:// (FenceGuard, one process
// only), and in files in --data-dir for the other backends.
//
// At the end it checks the books — sold + left = stock (an item sold twice breaks it),
// no buyer recorded twice, nothing sold beyond the stock — prints a summary and, as its
// last line, one JSON object; it exits 1 on any violation or failed purchase, 2 on bad
// arguments. Two deliberately broken modes show that the checks catch a broken lock:
//   --no-lock         no lock at all (and no fence);
//   --lock-per-buyer  a wrong lock: each buyer (thread) locks its own name, so nobody
//                     excludes anybody (unfenced: tokens of different names are not comparable).
// Both oversell and exit 1 whenever at least two buyers run.
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
#include <functional>
#include <iostream>
#include <latch>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
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

enum class Mode { locked, no_lock, lock_per_buyer };

const char* mode_name(Mode m) {
  switch (m) {
    case Mode::locked: return "lock";
    case Mode::no_lock: return "no-lock";
    case Mode::lock_per_buyer: return "lock-per-buyer";
  }
  return "?";
}

struct Config {
  std::string url;
  std::string name = "seckill";
  std::string data_dir;
  long stock = 300;
  long requests = 500;
  int processes = 2;
  int threads = 8;
  long ttl_ms = 10000;
  long think_us = 2000;  // the pause between reading the stock and writing it back
  bool no_fence = false;
  bool no_lock = false;         // --no-lock: no lock, no fence
  bool lock_per_buyer = false;  // --lock-per-buyer: each buyer (thread) locks its own name
  int worker = -1;              // >= 0: this process is worker N (internal)

  Mode mode() const { return no_lock ? Mode::no_lock : lock_per_buyer ? Mode::lock_per_buyer : Mode::locked; }
};

/// Where the stock and the buyers live. Reads and writes are separate, plain operations:
/// nothing here makes read-then-write safe; only the caller's lock does.
class Store {
 public:
  virtual ~Store() = default;
  /// Sets the stock and clears buyers and fence (nobody holds the lock yet).
  virtual void init(long stock) = 0;
  /// A plain read of the stock.
  virtual long read_stock() = 0;
  /// A blind write: stock := `stock`, and `buyer` appended to the buyers. With a token,
  /// the write goes through the fence and is rejected (returns false, nothing written)
  /// when a newer token has written before; without one it is unfenced.
  virtual bool write(long stock, const std::string& buyer, std::optional<std::uint64_t> token) = 0;
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
  bool write(long stock, const std::string& buyer, std::optional<std::uint64_t> token) override {
    if (!token) {
      fence_.command({"SET", stock_key_, std::to_string(stock)});
      fence_.command({"RPUSH", buyers_key_, buyer});
      return true;
    }
    // The fence (keyed on the stock) and the two writes run in one script; the script
    // writes the value it is given and does not look at the stock.
    return fence_
        .eval("redis.call('SET', KEYS[1], ARGV[1]) redis.call('RPUSH', KEYS[2], ARGV[2]) return 1",
              {stock_key_, buyers_key_}, {std::to_string(stock), buyer}, *token)
        .applied();
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
  bool write(long stock, const std::string& buyer, std::optional<std::uint64_t> token) override {
    const auto do_write = [&] {
      write_stock(stock);
      append_line(buyers_, buyer);
    };
    if (!token) {
      do_write();
      return true;
    }
    return fence_.apply(*token, do_write).applied();
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
    // Write-and-rename: a reader (or a crash) never sees a half-written number. The
    // temporary name is unique per writer, so unlocked writers do not trip over each
    // other's files (they only overwrite each other's stock, which is the point).
    static std::atomic<unsigned long> seq{0};
    const fs::path tmp = stock_.string() + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(++seq);
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
  void init(long stock) override { stock_.store(stock); }
  long read_stock() override { return stock_.load(); }
  bool write(long stock, const std::string& buyer, std::optional<std::uint64_t> token) override {
    const auto do_write = [&] {
      stock_.store(stock);  // a plain store of the value computed from the earlier read
      std::lock_guard lk(mu_);
      buyers_.push_back(buyer);
    };
    if (!token) {
      do_write();
      return true;
    }
    return guard_.apply(*token, do_write).applied();
  }
  std::vector<std::string> buyers() override {
    std::lock_guard lk(mu_);
    return buyers_;
  }
  std::string describe() const override { return "this process's memory"; }

 private:
  distlock::FenceGuard guard_;
  std::atomic<long> stock_{0};  // atomic loads and stores only: no data race, but no atomic decrement
  std::mutex mu_;               // guards the buyers list, not the stock
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

/// Runs this process's buyers. `ready` is called once every buyer thread is connected
/// and waiting at the start gate; it returns when the sale opens (for worker processes:
/// when the parent says so, so that the buyers of all processes start together).
WorkerReport run_purchases(const Config& cfg, Store& store, int process_index,
                           const std::function<void()>& ready) {
  distlock::Client client = distlock::connect(cfg.url);
  const Mode mode = cfg.mode();
  const bool fenced = mode == Mode::locked && !cfg.no_fence && client.has_fencing();
  if (mode == Mode::locked && !cfg.no_fence && !client.has_fencing() && process_index == 0) {
    std::cerr << "seckill: " << client.scheme() << ":// issues no fencing tokens; writes are not fenced\n";
  }
  distlock::LockOptions opts;
  opts.ttl = std::chrono::milliseconds(cfg.ttl_ms);
  opts.wait = std::chrono::seconds(120);

  // Requests are split evenly over processes x threads.
  const long slots = static_cast<long>(cfg.processes) * cfg.threads;
  WorkerReport report;
  std::mutex mu;
  std::latch at_gate(cfg.threads), gate(1);
  std::vector<std::thread> threads;
  for (int t = 0; t < cfg.threads; ++t) {
    const long slot = static_cast<long>(process_index) * cfg.threads + t;
    const long mine = cfg.requests / slots + (slot < cfg.requests % slots ? 1 : 0);
    threads.emplace_back([&, t, mine] {
      WorkerReport local;
      const std::string per_buyer_name =
          cfg.name + "-buyer-p" + std::to_string(process_index) + "-t" + std::to_string(t);
      at_gate.count_down();
      gate.wait();
      for (long i = 0; i < mine; ++i) {
        const std::string buyer =
            "p" + std::to_string(process_index) + "-t" + std::to_string(t) + "-r" + std::to_string(i);
        try {
          std::optional<distlock::Lease> lease;
          if (mode != Mode::no_lock) {
            const auto t0 = Clock::now();
            // --lock-per-buyer: a lock that excludes nobody, as code that builds the lock
            // name from the wrong thing (here: the buyer) would take.
            lease = client.acquire(mode == Mode::locked ? cfg.name : per_buyer_name, opts);
            local.waits_us.push_back(
                std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count());
          }
          // The read-modify-write. Only the lock keeps another buyer out between the
          // read and the write.
          const long seen = store.read_stock();
          if (seen <= 0) {
            ++local.sold_out;
          } else {
            if (cfg.think_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(cfg.think_us));
            std::optional<std::uint64_t> token;
            if (fenced) token = lease->token();
            if (store.write(seen - 1, buyer, token)) {
              ++local.sold;
            } else {
              ++local.stale;  // the fence saw a newer holder: nothing was written
            }
          }
          if (lease) lease->release();
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
  at_gate.wait();
  try {
    ready();
  } catch (...) {
    gate.count_down();
    for (auto& th : threads) th.join();
    throw;
  }
  gate.count_down();
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
//
// A worker's stdin is the read end of the parent's "go" pipe and its stdout a pipe back
// to the parent. The worker prints "ready" once its buyers wait at the gate, then
// reads stdin until end-of-file: the parent closes the go pipe when every worker is
// ready. Then it prints its report as one JSON line.

constexpr std::string_view kReady = "ready\n";

struct Child {
  pid_t pid = -1;
  int out_fd = -1;
};

Child spawn_worker(const Config& cfg, int index, int go_fd) {
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
                                "--think-us",
                                std::to_string(cfg.think_us),
                                "--worker",
                                std::to_string(index)};
  if (!cfg.data_dir.empty()) {
    args.push_back("--data-dir");
    args.push_back(cfg.data_dir);
  }
  if (cfg.no_fence) args.push_back("--no-fence");
  if (cfg.no_lock) args.push_back("--no-lock");
  if (cfg.lock_per_buyer) args.push_back("--lock-per-buyer");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "pipe");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, go_fd, 0);
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

/// Reads up to and including the first newline (a few bytes; false on EOF/error first).
bool read_line(int fd, std::string& line) {
  line.clear();
  while (line.size() < 256) {
    char c = 0;
    const ssize_t n = ::read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    line.push_back(c);
    if (c == '\n') return true;
  }
  return false;
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

/// In a worker: tell the parent the buyers are at the gate, wait for the gate to open.
void worker_ready() {
  std::cout << kReady << std::flush;
  char buf[64];
  for (;;) {
    const ssize_t n = ::read(0, buf, sizeof buf);
    if (n == 0) return;  // the parent closed the go pipe: the sale is open
    if (n < 0 && errno != EINTR) throw std::system_error(errno, std::generic_category(), "start gate");
  }
}

double percentile(std::vector<long> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto idx = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return static_cast<double>(v[std::min(idx, v.size() - 1)]);
}

void add(WorkerReport& total, const WorkerReport& r) {
  total.sold += r.sold;
  total.sold_out += r.sold_out;
  total.stale += r.stale;
  total.errors += r.errors;
  if (total.first_error.empty()) total.first_error = r.first_error;
  total.waits_us.insert(total.waits_us.end(), r.waits_us.begin(), r.waits_us.end());
}

int run_sale(const Config& cfg) {
  std::unique_ptr<Store> store = make_store(cfg);
  store->init(cfg.stock);

  WorkerReport total;
  auto t0 = Clock::now();
  if (cfg.processes == 1) {
    total = run_purchases(cfg, *store, 0, [&] { t0 = Clock::now(); });
  } else {
    int go[2];
    if (::pipe2(go, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "pipe");
    std::vector<Child> kids;
    try {
      for (int i = 0; i < cfg.processes; ++i) kids.push_back(spawn_worker(cfg, i, go[0]));
    } catch (...) {
      ::close(go[0]);
      ::close(go[1]);
      for (auto& k : kids) {
        ::close(k.out_fd);
        ::waitpid(k.pid, nullptr, 0);  // its gate opens (EOF) when go[1] is closed
      }
      throw;
    }
    ::close(go[0]);
    // The start gate: every worker's buyers are connected and waiting before any starts.
    std::vector<std::string> early(kids.size());
    for (std::size_t i = 0; i < kids.size(); ++i) {
      std::string line;
      if (!read_line(kids[i].out_fd, line) || line != kReady) early[i] = line;  // it failed: report below
    }
    t0 = Clock::now();
    ::close(go[1]);
    for (std::size_t i = 0; i < kids.size(); ++i) {
      const std::string out = early[i] + read_all(kids[i].out_fd);
      int status = 0;
      ::waitpid(kids[i].pid, &status, 0);
      WorkerReport r;
      try {
        r = from_json(json::parse(out));
      } catch (const std::exception& e) {
        r.errors = 1;
        r.first_error = "worker " + std::to_string(i) + " gave no report (exit status " +
                        std::to_string(status) + "): " + e.what();
      }
      add(total, r);
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
  // Items handed out that the stock never had. Every write stores (a value read earlier) - 1,
  // so left >= stock - sold always, with equality exactly when every purchase read the
  // stock its predecessor wrote; two buyers that read the same stock make it positive.
  const long oversold = std::max(0L, sold + left - cfg.stock) + std::max(0L, -left);
  const long expected = std::min(cfg.stock, cfg.requests - total.stale);

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
  if (total.errors > 0)
    violations.push_back(std::to_string(total.errors) + " purchases failed: " + total.first_error);

  const Mode mode = cfg.mode();
  const bool fenced = mode == Mode::locked && !cfg.no_fence;
  const double rps = seconds > 0 ? static_cast<double>(cfg.requests) / seconds : 0;
  const double p50 = percentile(total.waits_us, 0.50), p99 = percentile(total.waits_us, 0.99);
  std::cout << "seckill on " << cfg.url;
  switch (mode) {
    case Mode::locked:
      std::cout << (fenced ? " (lock + fenced writes)" : " (lock, unfenced writes: --no-fence)");
      break;
    case Mode::no_lock: std::cout << " WITHOUT the lock (--no-lock)"; break;
    case Mode::lock_per_buyer:
      std::cout << " with a WRONG lock: one lock name per buyer (--lock-per-buyer)";
      break;
  }
  std::cout << " (stock in " << store->describe() << ")\n"
            << "  " << cfg.requests << " requests from " << cfg.processes << " processes x " << cfg.threads
            << " threads in " << seconds << " s (" << static_cast<long>(rps) << " requests/s), read -> think "
            << cfg.think_us << " us -> write\n"
            << "  sold " << sold << " of " << cfg.stock << ", left " << left << ", sold out for "
            << total.sold_out << " requests\n"
            << "  fence rejected " << total.stale << " stale writes" << (fenced ? "" : " (writes not fenced)")
            << "\n"
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
                        {"wait_p99_us", p99},
                        {"mode", mode_name(mode)},
                        {"fenced", fenced},
                        {"fence_rejected", total.stale},
                        {"stock", cfg.stock},
                        {"requests", cfg.requests},
                        {"processes", cfg.processes},
                        {"threads", cfg.threads},
                        {"think_us", cfg.think_us},
                        {"sold_out_requests", total.sold_out},
                        {"errors", total.errors},
                        {"ok", violations.empty()}};
  std::cout << summary.dump() << std::endl;
  return violations.empty() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  CLI::App app{"seckill: a flash sale whose read-modify-write of the stock only a distributed lock protects"};
  app.add_option("--url", cfg.url,
                 "lock backend URL (default: $DISTLOCK_URL, else the host-local file:// dir)");
  app.add_option("--stock", cfg.stock, "items for sale")->check(CLI::NonNegativeNumber);
  app.add_option("--requests", cfg.requests, "purchase requests in total")->check(CLI::NonNegativeNumber);
  app.add_option("--processes", cfg.processes, "OS processes")->check(CLI::Range(1, 64));
  app.add_option("--threads", cfg.threads, "threads per process")->check(CLI::Range(1, 256));
  app.add_option("--name", cfg.name, "lock name, also the prefix of the stock keys/files");
  app.add_option("--ttl-ms", cfg.ttl_ms, "lease TTL in milliseconds")->check(CLI::Range(100L, 3600000L));
  app.add_option("--think-us", cfg.think_us,
                 "pause between reading the stock and writing it back, in microseconds (the race window)")
      ->check(CLI::Range(0L, 10000000L));
  app.add_option("--data-dir", cfg.data_dir, "directory for the stock files (non-Redis backends)");
  app.add_flag("--no-fence", cfg.no_fence, "write the stock without the fencing token");
  auto* no_lock =
      app.add_flag("--no-lock", cfg.no_lock,
                   "run the sale WITHOUT the lock (and without the fence): shows the overselling the "
                   "lock prevents; exits 1");
  auto* per_buyer =
      app.add_flag("--lock-per-buyer", cfg.lock_per_buyer,
                   "a deliberately WRONG lock: each buyer (thread) locks its own name (unfenced); "
                   "oversells; exits 1");
  no_lock->excludes(per_buyer);
  app.add_option("--worker", cfg.worker, "internal: run as worker process N")->group("");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help is 0; every bad argument is 2
  }

  if (cfg.url.empty()) cfg.url = distlock::default_url();
  if (cfg.name.empty()) {
    std::cerr << "seckill: --name must not be empty\n";
    return 2;
  }
  if (scheme_of(cfg.url) == "memory" && cfg.processes != 1) {
    std::cerr << "seckill: memory:// exists only inside one process; use --processes 1\n";
    return 2;
  }
  if (cfg.mode() != Mode::locked && cfg.worker < 0 &&
      (static_cast<long>(cfg.processes) * cfg.threads < 2 || cfg.requests < 2 || cfg.stock < 1)) {
    std::cerr << "seckill: --" << mode_name(cfg.mode())
              << " shows a race between buyers: it needs --processes x --threads >= 2, --requests >= 2 and "
                 "--stock >= 1\n";
    return 2;
  }
  try {
    if (cfg.worker >= 0) {
      std::unique_ptr<Store> store = make_store(cfg);
      const WorkerReport r = run_purchases(cfg, *store, cfg.worker, worker_ready);
      std::cout << to_json(r).dump() << std::endl;
      return 0;
    }
    return run_sale(cfg);
  } catch (const std::exception& e) {
    std::cerr << "seckill: " << e.what() << "\n";
    return 1;
  }
}
