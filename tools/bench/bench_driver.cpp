// The workloads of distlock-bench (see bench_driver.hpp).
#include "bench_driver.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "distlock/distlock.hpp"
#include "process_usage.hpp"

namespace distlock::bench {

namespace {

using json = nlohmann::ordered_json;
using SteadyClock = std::chrono::steady_clock;

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(SteadyClock::now().time_since_epoch()).count();
}

// The holder sleeps rather than spins: with the clients pinned to one CPU, a spinning
// holder would keep the other clients' threads (waiters, subscribers) off the CPU.
void hold_for_us(long us) {
  if (us > 0) std::this_thread::sleep_for(std::chrono::microseconds(us));
}

/// Latency samples in nanoseconds, merged from threads.
class Samples {
 public:
  void add(std::vector<std::int64_t>&& v) {
    std::lock_guard lk(mu_);
    all_.insert(all_.end(), v.begin(), v.end());
  }
  /// Percentile in microseconds (nearest rank).
  double us(double p) {
    std::lock_guard lk(mu_);
    if (all_.empty()) return 0;
    std::sort(all_.begin(), all_.end());
    auto idx = static_cast<std::size_t>(p * static_cast<double>(all_.size()));
    idx = std::min(idx, all_.size() - 1);
    return static_cast<double>(all_[idx]) / 1000.0;
  }
  std::size_t size() {
    std::lock_guard lk(mu_);
    return all_.size();
  }

 private:
  std::mutex mu_;
  std::vector<std::int64_t> all_;
};

double round1(double v) {
  return static_cast<double>(static_cast<long long>(v * 10 + 0.5)) / 10;
}

json line(const std::string& workload, const BenchConfig& cfg, const std::string& url, int clients, long ops,
          double seconds, Samples& s) {
  return json{{"workload", workload},
              {"url", url},
              {"clients", clients},
              {"ops", ops},
              {"ops_per_s", round1(seconds > 0 ? static_cast<double>(ops) / seconds : 0)},
              {"p50_us", round1(s.us(0.50))},
              {"p99_us", round1(s.us(0.99))},
              {"p999_us", round1(s.us(0.999))},
              {"hold_us", cfg.hold_us},
              {"metrics", !cfg.no_metrics}};
}

// --ttl-ms, else 30 s; on a zk:// URL that sets session_timeout, that session timeout
// (a zk:// lease lasts as long as its session, and a ttl above twice the session is refused).
Millis bench_ttl(const BenchConfig& cfg, const std::string& url) {
  if (cfg.ttl_ms > 0) return Millis(cfg.ttl_ms);
  if (url.starts_with("zk://")) {
    const auto q = url.find("session_timeout=");
    if (q != std::string::npos) {
      const auto end = url.find('&', q);
      const std::string v = url.substr(q + 16, end == std::string::npos ? std::string::npos : end - q - 16);
      // 250ms, 10s, 2m or a bare number of milliseconds (the URL's own syntax).
      std::size_t used = 0;
      long long n = 0;
      try {
        n = std::stoll(v, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      const std::string unit = v.substr(used);
      const long long scale = unit.empty() || unit == "ms" ? 1 : unit == "s" ? 1000 : unit == "m" ? 60000 : 0;
      if (used > 0 && scale > 0 && n > 0 && n <= 3600000 / scale) {
        const Millis d(n * scale);
        if (d >= LockOptions::min_ttl) return d;
      }
    }
  }
  return std::chrono::seconds(30);
}

LockOptions lock_options(const BenchConfig& cfg) {
  LockOptions o;
  o.ttl = Millis(cfg.ttl_ms);
  return o;
}

// The client for a workload; on zk:// its session is sized to the lease TTL (unless the
// URL sets session_timeout), so the default TTL is one the session can honour.
Client connect(const std::string& url, const BenchConfig& cfg) {
  ClientOptions o;
  o.lock_defaults.ttl = Millis(cfg.ttl_ms);
  o.metrics = !cfg.no_metrics;
  return distlock::connect(url, o);
}

json uncontended(const BenchConfig& cfg, const std::string& url) {
  Client client = connect(url, cfg);
  const LockOptions opts = lock_options(cfg);
  const std::string key = "bench/uncontended";
  for (long i = 0; i < cfg.warmup; ++i) client.acquire(key, opts).release();
  std::vector<std::int64_t> lat;
  lat.reserve(static_cast<std::size_t>(cfg.ops));
  const Usage u0 = Usage::now();
  const std::int64_t t0 = now_ns();
  for (long i = 0; i < cfg.ops; ++i) {
    const std::int64_t a = now_ns();
    Lease lease = client.acquire(key, opts);
    hold_for_us(cfg.hold_us);
    lease.release();
    lat.push_back(now_ns() - a);
  }
  const double seconds = static_cast<double>(now_ns() - t0) / 1e9;
  const Usage u1 = Usage::now();
  Samples s;
  s.add(std::move(lat));
  json j = line("uncontended", cfg, client.url(), 1, cfg.ops, seconds, s);
  add_usage(j, u0, u1, cfg.ops);
  return j;
}

// Handoff: a holder stamps the time just before release(); the next holder (another
// client) takes the difference as soon as its acquire() returns. After releasing, a
// client lets another one take the lock (or 20 ms pass) before competing again, so
// the figure is a handoff to a waiter, not the releaser re-taking its own lock.
json contended(const BenchConfig& cfg, const std::string& url) {
  const int n = std::max(2, cfg.clients);
  std::vector<Client> clients;
  for (int i = 0; i < n; ++i) clients.push_back(connect(url, cfg));
  const LockOptions opts = lock_options(cfg);
  const std::string key = "bench/contended";
  const long total = cfg.warmup + cfg.ops;
  std::atomic<long> taken{0};
  std::atomic<int> holder{-1};
  std::mutex holder_mu;
  std::condition_variable holder_changed;  // a releaser sleeps on it until another client holds
  std::atomic<int> last_releaser{-1};
  std::atomic<std::int64_t> released_at{0};
  std::atomic<long> self_reacquired{0};
  Samples handoffs;
  std::atomic<bool> failed{false};
  std::string error;
  std::mutex error_mu;

  const Usage u0 = Usage::now();
  const std::int64_t t0 = now_ns();
  std::vector<std::thread> threads;
  for (int me = 0; me < n; ++me) {
    threads.emplace_back([&, me] {
      std::vector<std::int64_t> mine;
      try {
        for (;;) {
          Lease lease = clients[static_cast<std::size_t>(me)].acquire(key, opts);
          const std::int64_t got = now_ns();
          {
            std::lock_guard lk(holder_mu);
            holder.store(me);
          }
          holder_changed.notify_all();
          const long k = taken.fetch_add(1);
          if (k >= total) break;  // lease released by its destructor
          const int prev = last_releaser.load();
          if (k >= cfg.warmup) {
            if (prev >= 0 && prev != me) {
              mine.push_back(got - released_at.load());
            } else {
              ++self_reacquired;
            }
          }
          hold_for_us(cfg.hold_us);
          last_releaser.store(me);
          released_at.store(now_ns());
          lease.release();
          // Sleep (not spin: the CPU is shared) until another client holds the lock.
          std::unique_lock lk(holder_mu);
          holder_changed.wait_for(lk, std::chrono::milliseconds(20),
                                  [&] { return holder.load() != me || taken.load() >= total; });
        }
      } catch (const std::exception& e) {
        failed = true;
        std::lock_guard lk(error_mu);
        error = e.what();
        taken.store(total);
        holder_changed.notify_all();
      }
      handoffs.add(std::move(mine));
    });
  }
  for (auto& t : threads) t.join();
  if (failed) throw std::runtime_error(error);
  const double seconds = static_cast<double>(now_ns() - t0) / 1e9;
  const Usage u1 = Usage::now();
  json j = line("contended", cfg, clients[0].url(), n, cfg.ops, seconds, handoffs);
  j["handoffs"] = handoffs.size();
  j["self_reacquired"] = self_reacquired.load();
  // Every acquire counted in `taken` (warm-up ones included) is released once.
  add_usage(j, u0, u1, taken.load());
  return j;
}

// --clients clients, --threads threads on each: thread `me` uses client me / threads.
json many_keys(const BenchConfig& cfg, const std::string& url) {
  const int per_client = std::max(1, cfg.threads);
  const int n = std::max(1, cfg.clients) * per_client;  // threads in all
  const int keys = std::max(1, cfg.keys);
  std::vector<Client> clients;
  for (int i = 0; i < std::max(1, cfg.clients); ++i) clients.push_back(connect(url, cfg));
  const LockOptions opts = lock_options(cfg);
  Samples s;
  std::atomic<bool> failed{false};
  std::string error;
  std::mutex error_mu;
  std::atomic<long> pairs{0};
  const Usage u0 = Usage::now();
  const std::int64_t t0 = now_ns();
  std::vector<std::thread> threads;
  for (int me = 0; me < n; ++me) {
    threads.emplace_back([&, me] {
      std::mt19937_64 rng(static_cast<std::uint64_t>(me) * 7919 + 1);
      std::uniform_int_distribution<int> pick(0, keys - 1);
      const long mine = cfg.ops / n + (me < cfg.ops % n ? 1 : 0);
      const long warm = cfg.warmup / n;
      std::vector<std::int64_t> lat;
      lat.reserve(static_cast<std::size_t>(mine));
      try {
        for (long i = 0; i < warm + mine; ++i) {
          const std::string key = "bench/many/" + std::to_string(pick(rng));
          const std::int64_t a = now_ns();
          Lease lease = clients[static_cast<std::size_t>(me / per_client)].acquire(key, opts);
          hold_for_us(cfg.hold_us);
          lease.release();
          if (i >= warm) lat.push_back(now_ns() - a);
        }
        pairs.fetch_add(warm + mine, std::memory_order_relaxed);
      } catch (const std::exception& e) {
        failed = true;
        std::lock_guard lk(error_mu);
        error = e.what();
      }
      s.add(std::move(lat));
    });
  }
  for (auto& t : threads) t.join();
  if (failed) throw std::runtime_error(error);
  const double seconds = static_cast<double>(now_ns() - t0) / 1e9;
  const Usage u1 = Usage::now();
  json j = line("many-keys", cfg, clients[0].url(), static_cast<int>(clients.size()), cfg.ops, seconds, s);
  j["threads"] = n;
  j["keys"] = keys;
  add_usage(j, u0, u1, pairs.load());
  return j;
}

json renew(const BenchConfig& cfg, const std::string& url) {
  Client client = connect(url, cfg);
  const LockOptions opts = lock_options(cfg);
  const int leases = std::max(1, cfg.keys);
  std::vector<Lease> held;
  held.reserve(static_cast<std::size_t>(leases));
  for (int i = 0; i < leases; ++i) held.push_back(client.acquire("bench/renew/" + std::to_string(i), opts));
  client.renew_now();  // warm-up (script loading)

  const ClientStats before = client.stats();
  std::vector<std::int64_t> lat;
  std::size_t renewed = 0;
  const std::int64_t t0 = now_ns();
  for (int r = 0; r < std::max(1, cfg.rounds); ++r) {
    const std::int64_t a = now_ns();
    renewed += client.renew_now();
    lat.push_back(now_ns() - a);
  }
  const double seconds = static_cast<double>(now_ns() - t0) / 1e9;
  const ClientStats after = client.stats();
  const int rounds = std::max(1, cfg.rounds);
  Samples s;
  s.add(std::move(lat));
  json j = line("renew", cfg, client.url(), 1, rounds, seconds, s);
  j["leases"] = leases;
  j["renewed_per_call"] = static_cast<double>(renewed) / rounds;
  j["round_trips_per_call"] =
      static_cast<double>(after.renew_round_trips - before.renew_round_trips) / rounds;
  j["leases_per_s"] = round1(seconds > 0 ? static_cast<double>(renewed) / seconds : 0);
  for (auto& l : held) {
    std::error_code ec;
    l.release(ec);
  }
  return j;
}

std::vector<std::string> expand(const std::vector<std::string>& in) {
  std::vector<std::string> out;
  for (const auto& w : in) {
    std::stringstream ss(w);
    for (std::string part; std::getline(ss, part, ',');) {
      if (part == "all") {
        for (const char* a : {"uncontended", "contended", "many-keys", "renew"}) out.emplace_back(a);
      } else if (!part.empty()) {
        out.push_back(part);
      }
    }
  }
  return out;
}

}  // namespace

void add_bench_options(CLI::App& app, BenchConfig& cfg) {
  app.add_option("--url", cfg.url, "backend URL (default: $DISTLOCK_URL, else the host-local file:// dir)");
  app.add_option("--workload", cfg.workloads,
                 "uncontended, contended, many-keys, renew or all (repeatable, or a,b)")
      ->delimiter(',');
  app.add_option("--clients", cfg.clients, "concurrent clients (contended, many-keys)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--threads", cfg.threads, "threads per client sharing it (many-keys)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--keys", cfg.keys, "keys (many-keys) or leases held (renew)")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--ops", cfg.ops, "measured operations per workload")->check(CLI::Range(1L, 100000000L));
  app.add_option("--hold-us", cfg.hold_us, "microseconds each holder keeps the lock")
      ->check(CLI::Range(0L, 10000000L));
  app.add_option("--ttl-ms", cfg.ttl_ms,
                 "lease TTL in milliseconds (default 30000, or the session_timeout of a zk:// URL)")
      ->check(CLI::Range(100L, 3600000L));
  app.add_option("--rounds", cfg.rounds, "renew_now() calls measured (renew)")->check(CLI::Range(1, 100000));
  app.add_option("--warmup", cfg.warmup, "unmeasured operations first")->check(CLI::Range(0L, 100000000L));
  app.add_flag("--no-metrics", cfg.no_metrics, "clients keep no metrics (to measure what they cost)");
}

int run_bench(const BenchConfig& in) {
  const std::string url = in.url.empty() ? default_url() : in.url;
  BenchConfig cfg = in;
  cfg.ttl_ms = bench_ttl(in, url).count();
  const std::vector<std::string> workloads = expand(cfg.workloads);
  for (const auto& w : workloads) {
    if (w != "uncontended" && w != "contended" && w != "many-keys" && w != "renew") {
      std::cerr << "distlock-bench: unknown workload \"" << w
                << "\" (known: uncontended, contended, many-keys, renew, all)\n";
      return 2;
    }
  }
  int rc = 0;
  for (const auto& w : workloads) {
    try {
      json j;
      if (w == "uncontended") j = uncontended(cfg, url);
      if (w == "contended") j = contended(cfg, url);
      if (w == "many-keys") j = many_keys(cfg, url);
      if (w == "renew") j = renew(cfg, url);
      std::cout << j.dump() << std::endl;
    } catch (const std::exception& e) {
      std::cerr << "distlock-bench: workload " << w << " on " << url << " failed: " << e.what() << "\n";
      rc = 1;
    }
  }
  return rc;
}

}  // namespace distlock::bench
