// distlock-ids-bench: throughput of the id generators, one JSON line per measurement,
// each next to a raw baseline measured in the same run:
//   snowflake    vs raw-snowflake (the same bit layout from a mutex + clock read, no lease
//                check) and the layout's ceiling of 4096 ids per ms per worker;
//   redis-daily  with reservation (INCRBY n) and without (INCR per id) vs raw hiredis INCR
//                round trips on the same server;
//   uuid7        vs raw getrandom(2) of 16 bytes per id;
//   segment      per --segment-url (postgres://, mysql://) and step: ids/s while ranges
//                last and database round trips (ranges taken) per the ids issued; beside
//                it the raw cost of one range (the generator's round trips timed alone).
// Run it pinned (run.sh starts its own redis-server; run_segment.sh its own PostgreSQL
// and MariaDB): this measures, it asserts nothing.
#include <fmt/format.h>
#include <hiredis/hiredis.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "distlock/distlock.hpp"
#include "distlock/ids.hpp"

namespace {

using Clock = std::chrono::steady_clock;

// Wall time of a run and the CPU time its thread used (the machine may be shared: the
// CPU figure shows what the code costs, the wall figure what the caller saw).
struct Elapsed {
  double wall = 0;
  double cpu = 0;
};

struct Measurement {
  std::string scheme;
  std::string variant;
  std::uint64_t ids = 0;
  Elapsed elapsed;
  std::uint64_t round_trips = 0;  // 0 where there are none
};

void print(const Measurement& m) {
  const double n = static_cast<double>(m.ids);
  std::string line = fmt::format(
      R"({{"bench":"ids","scheme":"{}","variant":"{}","threads":1,"ids":{},"seconds":{:.3f},"ids_per_s":{:.0f},)"
      R"("ns_per_id":{:.1f},"cpu_seconds":{:.3f},"ids_per_cpu_s":{:.0f})",
      m.scheme, m.variant, m.ids, m.elapsed.wall, n / m.elapsed.wall, 1e9 * m.elapsed.wall / n, m.elapsed.cpu,
      n / m.elapsed.cpu);
  if (m.round_trips) line += fmt::format(R"(,"round_trips":{})", m.round_trips);
  line += "}\n";
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fflush(stdout);
}

double thread_cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Runs `fn` `n` times; `sink` keeps the results alive.
template <class Fn>
Elapsed timed(std::uint64_t n, Fn&& fn) {
  volatile std::uint64_t sink = 0;
  const double cpu_start = thread_cpu_seconds();
  const auto start = Clock::now();
  for (std::uint64_t i = 0; i < n; ++i) sink = sink + fn();
  return {std::chrono::duration<double>(Clock::now() - start).count(), thread_cpu_seconds() - cpu_start};
}

// The snowflake layout with nothing else: what a generator without a lease costs.
class RawSnowflake {
 public:
  std::uint64_t next() {
    std::lock_guard lk(mu_);
    for (;;) {
      const std::int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count() -
                               1654992000000LL;
      if (now > last_) {
        last_ = now;
        seq_ = 0;
      } else if (seq_ < 4095) {
        ++seq_;
      } else {
        continue;  // spin into the next millisecond
      }
      return static_cast<std::uint64_t>(last_) << 22 | seq_;
    }
  }

 private:
  std::mutex mu_;
  std::int64_t last_ = -1;
  std::uint64_t seq_ = 0;
};

struct RedisFree {
  void operator()(redisContext* c) const noexcept { redisFree(c); }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"distlock id generator throughput (JSON lines)"};
  std::string redis_url, lock_url;
  std::uint64_t snowflake_ids = 20'000'000, uuid_ids = 5'000'000, reserved_ids = 5'000'000,
                round_trip_ids = 50'000;
  std::uint32_t reserve = 1000;
  std::vector<std::string> segment_urls;
  std::vector<std::int64_t> segment_steps{1000, 100'000};
  std::uint64_t segment_ids = 5'000'000;
  bool segment_only = false;
  app.add_option("--redis-url", redis_url, "redis://host:port for redis-daily (skipped when empty)");
  app.add_option("--lock-url", lock_url,
                 "lock service for the snowflake worker lease (default: a temp file://)");
  app.add_option("--snowflake-ids", snowflake_ids);
  app.add_option("--uuid-ids", uuid_ids);
  app.add_option("--reserved-ids", reserved_ids);
  app.add_option("--round-trip-ids", round_trip_ids);
  app.add_option("--reserve", reserve, "redis-daily reservation size (default 1000)");
  app.add_option("--segment-url", segment_urls, "postgres:// or mysql:// URL for segment ids (repeatable)");
  app.add_option("--segment-steps", segment_steps, "segment steps to measure (default 1000 100000)");
  app.add_option("--segment-ids", segment_ids, "ids per segment measurement (default 5M)");
  app.add_flag("--segment-only", segment_only, "measure only the segment generator");
  CLI11_PARSE(app, argc, argv);

  try {
    // ---- segment
    for (const std::string& url : segment_urls) {
      const std::string scheme = url.substr(0, url.find(':'));
      {
        // While a range lasts: one range larger than the ids taken (no take in the timed
        // part; the background take is asked for only at 90 %).
        const auto step = static_cast<std::int64_t>(segment_ids) * 2;
        distlock::ids::SegmentGenerator gen(
            url, {.tag = fmt::format("bench-{}-inrange", ::getpid()), .step = step});
        const std::uint64_t before = gen.round_trips();
        const Elapsed s = timed(segment_ids, [&] { return gen.next(); });
        print({"segment", fmt::format("{} within one range (step={})", scheme, step), segment_ids, s,
               gen.round_trips() - before});
      }
      for (const std::int64_t step : segment_steps) {
        const std::string tag = fmt::format("bench-{}-{}", ::getpid(), step);
        // The raw cost of a range: a generator of step 1 takes one per id.
        {
          distlock::ids::SegmentGenerator one(url, {.tag = tag + "-raw", .step = 1});
          const std::uint64_t n = 2000;
          const Elapsed s = timed(n, [&] { return one.next(); });
          print({"raw-" + scheme + "-range", "one range per id (step=1)", n, s, one.round_trips()});
        }
        distlock::ids::SegmentGenerator gen(url, {.tag = tag, .step = step});
        const std::uint64_t before = gen.round_trips();
        const Elapsed s = timed(segment_ids, [&] { return gen.next(); });
        print(
            {"segment", fmt::format("{} step={}", scheme, step), segment_ids, s, gen.round_trips() - before});
      }
    }
    if (segment_only) return 0;

    // ---- snowflake
    std::filesystem::path tmp;
    if (lock_url.empty()) {
      tmp = std::filesystem::temp_directory_path() / fmt::format("distlock-ids-bench-{}", ::getpid());
      lock_url = "file://" + tmp.string();
    }
    {
      RawSnowflake raw;
      print({"raw-snowflake", "mutex+clock+bits", snowflake_ids,
             timed(snowflake_ids, [&] { return raw.next(); })});
      distlock::ids::SnowflakeGenerator gen(distlock::connect(lock_url), {.prefix = "bench"});
      print({"snowflake", "leased worker via " + lock_url.substr(0, lock_url.find(':')), snowflake_ids,
             timed(snowflake_ids, [&] { return gen.next(); })});
      // next_batch: one lock and one clock reading per millisecond's run of ids.
      std::vector<std::uint64_t> batch(4096);
      std::size_t used = batch.size();
      print({"snowflake", "next_batch(4096)", snowflake_ids, timed(snowflake_ids, [&] {
               if (used == batch.size()) {
                 gen.next_batch(batch);
                 used = 0;
               }
               return batch[used++];
             })});
    }
    if (!tmp.empty()) std::filesystem::remove_all(tmp);

    // ---- uuid7
    {
      print({"raw-getrandom16", "getrandom(16) per id", uuid_ids, timed(uuid_ids, [] {
               std::uint64_t b[2];
               if (::getrandom(b, sizeof b, 0) != sizeof b) std::abort();
               return b[0];
             })});
      distlock::ids::Uuid7Generator gen;
      print({"uuid7", "counter in rand_a, pooled getrandom", uuid_ids,
             timed(uuid_ids, [&] { return gen.next().bytes[15]; })});
    }

    // ---- redis-daily
    if (!redis_url.empty()) {
      const auto colon = redis_url.rfind(':');
      const std::string host = redis_url.substr(8, colon - 8);
      const int port = std::stoi(redis_url.substr(colon + 1));
      std::unique_ptr<redisContext, RedisFree> ctx(redisConnect(host.c_str(), port));
      if (!ctx || ctx->err) throw std::runtime_error("raw hiredis connect to " + redis_url + " failed");
      print({"raw-hiredis-incr", "one INCR round trip", round_trip_ids,
             timed(round_trip_ids,
                   [&] {
                     auto* r = static_cast<redisReply*>(redisCommand(ctx.get(), "INCR bench:raw"));
                     if (r == nullptr) std::abort();
                     const auto v = static_cast<std::uint64_t>(r->integer);
                     freeReplyObject(r);
                     return v;
                   }),
             round_trip_ids});
      {
        distlock::ids::RedisDailyGenerator gen(redis_url, {.prefix = "bench1", .reserve = 1});
        const Elapsed s = timed(round_trip_ids, [&] { return gen.next(); });
        print({"redis-daily", "reserve=1 (INCR per id)", round_trip_ids, s, gen.round_trips()});
      }
      {
        distlock::ids::RedisDailyGenerator gen(redis_url, {.prefix = "benchn", .reserve = reserve});
        const Elapsed s = timed(reserved_ids, [&] { return gen.next(); });
        print(
            {"redis-daily", fmt::format("reserve={} (INCRBY)", reserve), reserved_ids, s, gen.round_trips()});
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "distlock-ids-bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
