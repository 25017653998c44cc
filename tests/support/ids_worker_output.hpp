// Reading the files tests/ids/ids_worker.cpp writes, for the tests that start it
// (tests/ids/segment_test.cpp, tests/ids/snowflake_fault_test.cpp):
//
//   read_ids(path)                       the 8-byte ids of the binary file `path`, in order
//   first_line(path)                     its first line ("" when it has none)
//   wait_for_file(path, timeout, every)  true once `path` exists; false after `timeout` on the
//                                        steady clock (looked at every `every`, 5 ms unless told)
//
// Thread-safety: each call uses only its arguments.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "support/eventually.hpp"

namespace distlock::testing {

inline std::vector<std::uint64_t> read_ids(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<char> bytes{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  std::vector<std::uint64_t> ids(bytes.size() / 8);
  std::memcpy(ids.data(), bytes.data(), ids.size() * 8);
  return ids;
}

inline std::string first_line(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

inline bool wait_for_file(const std::string& path, std::chrono::milliseconds timeout,
                          std::chrono::milliseconds every = std::chrono::milliseconds(5)) {
  return eventually([&] { return std::filesystem::exists(path); }, timeout, every);
}

}  // namespace distlock::testing
