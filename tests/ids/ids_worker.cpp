// ids_worker: one process of the multi-process uniqueness test. Makes ONE generator
// (scheme, url, prefix), announces it is ready, waits for the go file (so all workers
// hold their worker leases at the same time), then T threads take N ids each from the
// shared generator and each thread writes its ids, in the order received, to
// <out>.t<i>.bin (8 bytes per 64-bit id, native order; 16 bytes per UUID).
// Snowflake workers also write their worker id to <out>.worker.
// Stream mode (--stream-ms D, snowflake only): one thread takes an id every --pause-us
// for D ms (creating <out>.issuing after the first) and writes them to <out>.t0.bin; if the worker lease is
// lost it writes <out>.lost and exits 3 (the fault tests pause or kill it meanwhile). Exit 0 on success, 1
// with a message on stderr otherwise.
// Segment (--scheme segment, --url postgres:// or mysql://): --prefix is the tag and
// --reserve the step (1: the row's). In stream mode each id is written to <out>.t0.bin
// as soon as it is issued (one write(2) each), so a SIGKILLed worker leaves every id it
// handed out on disk.
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>
#include <variant>
#include <vector>

#include "distlock/distlock.hpp"
#include "distlock/ids.hpp"

namespace {

bool wait_for_file(const std::string& path, std::chrono::seconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (!std::filesystem::exists(path)) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// Written to a temporary name and renamed, so a test that sees the file also sees its
// content (it polls for existence and then reads).
void write_text(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << text << "\n";
  std::rename(tmp.c_str(), path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ids uniqueness worker (test tool)"};
  std::string scheme, url, prefix = "uniq", out, go_file;
  int threads = 4, count = 1000;
  std::uint32_t reserve = 1;
  long ttl_ms = 0, stream_ms = 0, pause_us = 1000;
  app.add_option("--scheme", scheme)
      ->required()
      ->check(CLI::IsMember({"redis-daily", "snowflake", "segment", "uuid7"}));
  app.add_option("--url", url);
  app.add_option("--prefix", prefix);
  app.add_option("--threads", threads)->check(CLI::Range(1, 64));
  app.add_option("--count", count)->check(CLI::Range(1, 10'000'000));
  app.add_option("--reserve", reserve);
  app.add_option("--out", out)->required();
  app.add_option("--go", go_file);
  app.add_option("--ttl-ms", ttl_ms, "snowflake worker lease ttl (default: the library's)");
  app.add_option("--stream-ms", stream_ms);
  app.add_option("--pause-us", pause_us);
  CLI11_PARSE(app, argc, argv);

  try {
    std::optional<distlock::ids::RedisDailyGenerator> daily;
    std::optional<distlock::ids::SnowflakeGenerator> snowflake;
    std::optional<distlock::ids::Uuid7Generator> uuid7;
    std::optional<distlock::ids::SegmentGenerator> segment;
    if (scheme == "redis-daily") {
      daily.emplace(url, distlock::ids::RedisDailyOptions{.prefix = prefix, .reserve = reserve});
    } else if (scheme == "snowflake") {
      distlock::ids::SnowflakeOptions o{.prefix = prefix};
      if (ttl_ms > 0) o.lease.ttl = std::chrono::milliseconds(ttl_ms);
      snowflake.emplace(distlock::connect(url), o);
      write_text(out + ".worker", std::to_string(snowflake->worker_id()));
    } else if (scheme == "segment") {
      segment.emplace(url, distlock::ids::SegmentOptions{.tag = prefix, .step = reserve > 1 ? reserve : 0});
    } else {
      uuid7.emplace();
    }
    write_text(out + ".ready", "ready");
    if (!go_file.empty() && !wait_for_file(go_file, std::chrono::seconds(60))) {
      std::cerr << "ids_worker: no go file " << go_file << " within 60 s\n";
      return 1;
    }

    if (stream_ms > 0 && segment) {
      const std::string path = out + ".t0.bin";
      const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
      if (fd < 0) {
        std::cerr << "ids_worker: cannot open " << path << "\n";
        return 1;
      }
      const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(stream_ms);
      for (bool first = true; std::chrono::steady_clock::now() < end; first = false) {
        const std::uint64_t id = segment->next();
        if (::write(fd, &id, sizeof id) != static_cast<ssize_t>(sizeof id)) {
          std::cerr << "ids_worker: write to " << path << " failed\n";
          return 1;
        }
        if (first) write_text(out + ".issuing", "issuing");
        std::this_thread::sleep_for(std::chrono::microseconds(pause_us));
      }
      ::close(fd);
      return 0;
    }
    if (stream_ms > 0) {
      if (!snowflake) {
        std::cerr << "ids_worker: --stream-ms needs --scheme snowflake\n";
        return 1;
      }
      std::vector<std::uint64_t> ids;
      int status = 0;
      const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(stream_ms);
      while (std::chrono::steady_clock::now() < end) {
        std::error_code ec;
        const std::uint64_t id = snowflake->next(ec);
        if (ec == distlock::errc::lost) {
          write_text(out + ".lost", ec.message());
          status = 3;
          break;
        }
        if (ec) {
          std::cerr << "ids_worker: " << ec.message() << "\n";
          status = 1;
          break;
        }
        ids.push_back(id);
        if (ids.size() == 1) write_text(out + ".issuing", "issuing");
        std::this_thread::sleep_for(std::chrono::microseconds(pause_us));
      }
      std::ofstream f(out + ".t0.bin", std::ios::binary);
      f.write(reinterpret_cast<const char*>(ids.data()),
              static_cast<std::streamsize>(ids.size() * sizeof(std::uint64_t)));
      return status;
    }

    std::vector<std::string> errors(static_cast<std::size_t>(threads));
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        try {
          std::vector<char> bytes;
          bytes.reserve(static_cast<std::size_t>(count) * 16);
          for (int i = 0; i < count; ++i) {
            if (uuid7) {
              const distlock::ids::Uuid u = uuid7->next();
              bytes.insert(bytes.end(), u.bytes.begin(), u.bytes.end());
              continue;
            }
            const std::uint64_t id = daily ? daily->next() : segment ? segment->next() : snowflake->next();
            const char* p = reinterpret_cast<const char*>(&id);
            bytes.insert(bytes.end(), p, p + sizeof id);
          }
          std::ofstream f(out + ".t" + std::to_string(t) + ".bin", std::ios::binary);
          f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
          if (!f) errors[static_cast<std::size_t>(t)] = "write failed";
        } catch (const std::exception& e) {
          errors[static_cast<std::size_t>(t)] = e.what();
        }
      });
    }
    for (auto& th : pool) th.join();
    for (const auto& e : errors) {
      if (!e.empty()) {
        std::cerr << "ids_worker: " << e << "\n";
        return 1;
      }
    }
    if (snowflake && !snowflake->leased()) {
      std::cerr << "ids_worker: worker lease lost during the run\n";
      return 1;
    }
  } catch (const std::exception& e) {
    std::cerr << "ids_worker: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
