// fence_holder — the lock holder of the end-to-end fencing fault test.
//
//   fence_holder --url LOCK_URL --name LOCK --store REDIS_URL --key KEY [--ttl MS]
//
// Acquires LOCK and prints "acquired <token>". On SIGUSR1 it makes one fenced write
// (SET KEY "holder-<pid>" guarded by its token) and prints "write applied" or
// "write stale <highest token>" (or "write error <message>"). When its lease is lost
// it prints "lost". SIGTERM ends it; it also ends by itself after 60 s.
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "distlock/distlock.hpp"
#include "distlock/fencing.hpp"
#include "support/tool_flags.hpp"
#include "support/tool_signals.hpp"

namespace {

using distlock::testing::g_stop_signal;
using distlock::testing::g_usr1_signal;
using distlock::testing::say;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fence_holder: holds a lock and makes a fenced write on SIGUSR1"};
  std::string url, name, store_url, key;
  long ttl_ms = 1000;
  app.add_option("--url", url, "lock backend URL")->required();
  app.add_option("--name", name, "lock name")->required();
  app.add_option("--store", store_url, "redis:// URL of the fenced resource")->required();
  app.add_option("--key", key, "Redis key written under the fence")->required();
  app.add_option("--ttl", ttl_ms, "lease TTL in milliseconds");
  CLI11_PARSE(app, argc, argv);

  distlock::testing::obey_tool_signals();

  try {
    distlock::Client client = distlock::connect(url);
    distlock::RedisFence store(store_url);
    distlock::LockOptions opts;
    opts.ttl = std::chrono::milliseconds(ttl_ms);
    opts.wait = std::chrono::seconds(10);
    distlock::Lease lease = client.acquire(name, opts);
    const std::uint64_t token = lease.token();
    say("acquired " + std::to_string(token));

    bool reported_lost = false;
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!g_stop_signal && std::chrono::steady_clock::now() < end) {
      if (!reported_lost && lease.stop_token().stop_requested()) {
        reported_lost = true;
        say("lost");
      }
      if (g_usr1_signal.exchange(false)) {  // SIGUSR1: one fenced write
        std::error_code ec;
        const distlock::FenceResult r = store.set(key, "holder-" + std::to_string(::getpid()), token, ec);
        if (ec) {
          say("write error " + ec.message());
        } else if (r.applied()) {
          say("write applied");
        } else {
          say("write stale " + std::to_string(r.highest_token));
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::error_code ec;
    lease.release(ec);
    say(ec ? "release " + ec.message() : "released");
    return 0;
  } catch (const std::exception& e) {
    say(std::string("error ") + e.what());
    return 1;
  }
}
