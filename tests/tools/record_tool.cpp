// record_tool — a process that writes a record and then holds a lock until it is
// killed, for the tests that show records outlive their writer (tests/etcd, tests/zk).
//
//   record_tool URL KEY VALUE LOCK TTL_MS
//
// Connects to URL, stores VALUE under record KEY (PutMode::always) through the
// backend, acquires LOCK with TTL_MS, prints "ready <token>" and sleeps until killed
// (the tests SIGKILL it, so its lease or session ends by expiry, not by a release).
// Exit codes: 64 usage, 69 an error (printed on stderr).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "api/client_access.hpp"
#include "distlock/distlock.hpp"
#include "engine/backend.hpp"
#include "engine/engine.hpp"

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: record_tool URL KEY VALUE LOCK TTL_MS\n");
    return 64;
  }
  try {
    distlock::ClientOptions opts;
    opts.logger = [](distlock::LogLevel, std::string_view) {};
    distlock::Client client = distlock::connect(argv[1], opts);
    distlock::detail::Error ec;
    distlock::detail::engine_of(client)->backend().put_record(argv[2], argv[3],
                                                              distlock::detail::PutMode::always, ec);
    if (ec) {
      std::fprintf(stderr, "put_record: %s %s\n", ec.message().c_str(), ec.detail().c_str());
      return 69;
    }
    distlock::LockOptions lo;
    lo.ttl = distlock::Millis(std::stol(argv[5]));
    distlock::Lease lease = client.acquire(argv[4], lo);
    const std::string line = "ready " + std::to_string(lease.token()) + "\n";
    (void)!::write(1, line.data(), line.size());
    for (int i = 0; i < 600; ++i) std::this_thread::sleep_for(std::chrono::seconds(1));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "record_tool: %s\n", e.what());
    return 69;
  }
}
