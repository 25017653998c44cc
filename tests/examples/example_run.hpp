// Test support for the examples' end-to-end tests: run an example program as a user would and
// read the JSON summary it prints as its last line.
//
//   ExampleRun r = run_example({DISTLOCK_SECKILL_PATH, "--url", url});
//   ASSERT_EQ(r.exit_code, 0) << r.output;
//   EXPECT_EQ(r.summary.at("ok"), true);
//
// Thread-safety: each call uses only its arguments.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/lock_tool.hpp"
#include "support/process.hpp"

namespace distlock::testing {

struct ExampleRun {
  int exit_code = -1;      // -1: it did not exit by itself (killed, or not finished in time)
  std::string output;      // stdout and stderr
  nlohmann::json summary;  // the last line, parsed (discarded if it is not JSON)
};

/// The last line of `output` that has text (trailing newlines ignored), parsed as JSON; a
/// discarded value when it is not JSON.
inline nlohmann::json last_line_json(std::string output) {
  while (!output.empty() && output.back() == '\n') output.pop_back();
  const auto nl = output.rfind('\n');
  return nlohmann::json::parse(output.substr(nl == std::string::npos ? 0 : nl + 1), nullptr,
                               /*allow_exceptions=*/false);
}

/// Runs `argv` (argv[0] the program) with `env` added to the environment; waits at most 180 s
/// (a test failure past that, and the program is killed).
inline ExampleRun run_example(const std::vector<std::string>& argv,
                              const std::vector<std::string>& env = {}) {
  TempDir dir("distlock-example-out");
  const std::string out = (dir.path() / "out").string();
  Process p = Process::spawn(argv, out, env);
  const int status = p.wait_for(std::chrono::seconds(180));
  ExampleRun r;
  r.output = read_file(out);
  EXPECT_NE(status, -1) << argv.at(0) << " did not finish in time:\n" << r.output;
  if (status != -1 && WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  r.summary = last_line_json(r.output);
  return r;
}

/// Runs the shell command `cmd` (stderr is to be redirected by the command itself) to its end.
inline ExampleRun run_shell(const std::string& cmd) {
  ExampleRun r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) r.output.append(buf, n);
  const int st = ::pclose(p);
  r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.summary = last_line_json(r.output);
  return r;
}

}  // namespace distlock::testing
