// What the examples in the public headers (include/distlock/*.hpp, "// Example:")
// take for granted: the application's own functions and values they call. Each
// example is compiled as the body of a function (tests/doc_examples/CMakeLists.txt),
// never run: they name servers that a test run does not start.
#pragma once

#include <chrono>
#include <cstdint>
#include <iostream>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <stop_token>
#include <string>

#include "distlock/distlock.hpp"

namespace doc_example {

struct Config {};

inline Config new_cfg;
inline const std::string url = "https://example.invalid/page";  // what a crawler fetches
inline const std::string name = "orders/42";                    // a lock name from input
inline std::ostream& log = std::clog;

inline void write_order(std::uint64_t, std::stop_token) {}
inline void run_report() {}
inline void reindex_shard(std::uint32_t, std::uint64_t, std::stop_token) {}
inline void reindex_shard(const distlock::OwnedShard&) {}
inline void transfer(std::uint64_t, std::uint64_t, std::stop_token) {}
inline void schedule(std::uint64_t) {}
inline void fetch(const std::string&, std::stop_token) {}
inline Config read_config() {
  return {};
}
inline void write_config(std::uint64_t, const Config&) {}
inline void verify(const Config&) {}
inline void note_owner(const std::string&, const std::string&, std::uint64_t) {}
inline int build_report(std::uint64_t, std::stop_token) {
  return 0;
}

}  // namespace doc_example
