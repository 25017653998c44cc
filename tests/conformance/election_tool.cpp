// election_tool — campaigner and observer processes for the election conformance test
// (tests/conformance/election_conformance_test.cpp), against any backend.
//
//   election_tool campaign --url URL --name NAME --log FILE --stop FILE [--ttl MS]
//                          [--obs-dir DIR --observers K] [--hold-ms MS]
//   election_tool observe  --url URL --name NAME --out FILE --stop FILE
//
// campaign: until FILE --stop exists, campaigns (value "<pid>-<round>"); once leader
// appends "S <pid> <term|-> <start_ns>" to --log, then keeps leading until every one
// of the K observers has reported its term (a line "T <term> " in DIR/obs-<i>) and at
// least --hold-ms passed and no file DIR/hold exists (the test creates it to act on
// the leader of the moment), or the lease is lost; then appends
// "E <pid> <term|-> <start_ns> <last_owned_ns> <owned 0|1>" and resigns. last_owned_ns
// is a CLOCK_MONOTONIC reading taken just BEFORE a check of lease.owns() that said
// true: the leader acted as leader only up to then; -1 when no check said true (the
// lease had lapsed before the first one, e.g. the process was starved or stopped right
// after campaign() returned: it never acted as leader). Each line is one O_APPEND write.
//
// observe: until FILE --stop exists, observe(after, 500 ms) and append
// "T <term> <value> <holder>" for each leader, after = its term.
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "distlock/distlock.hpp"
#include "support/backend_mono_clock.hpp"
#include "support/tool_flags.hpp"

namespace {

using distlock::testing::mono_ns;

using namespace std::chrono_literals;

void append(const std::string& path, const std::string& line) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;
  (void)!::write(fd, line.data(), line.size());
  ::close(fd);
}

bool exists(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec);
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Args : distlock::testing::ToolTarget {
  std::string mode, stop, obs_dir, out;
  long hold_ms = 200;
  int observers = 0;
};

[[noreturn]] void usage(const std::string& why) {
  distlock::testing::tool_usage("election_tool", why);
}

Args parse(int argc, char** argv) {
  Args a;
  distlock::testing::ToolFlags f("election_tool");
  add_target_flags(f, a);
  f.text("--stop", a.stop)
      .text("--obs-dir", a.obs_dir)
      .text("--out", a.out)
      .number("--hold-ms", a.hold_ms)
      .number("--observers", a.observers);
  a.mode = f.parse(argc, argv, "campaign|observe");
  return a;
}

distlock::Client connect(const Args& a) {
  distlock::ClientOptions o;
  o.logger = [](distlock::LogLevel, std::string_view) {};
  o.lock_defaults.ttl = distlock::Millis(a.ttl_ms);  // zk://: the session is sized to the TTL
  return distlock::connect(a.url, o);
}

bool observed_by_all(const Args& a, const std::string& term) {
  for (int i = 0; i < a.observers; ++i) {
    const std::string text = slurp(a.obs_dir + "/obs-" + std::to_string(i));
    if (text.rfind("T " + term + " ", 0) != 0 && text.find("\nT " + term + " ") == std::string::npos)
      return false;
  }
  return true;
}

int campaign(const Args& a) {
  distlock::Client client = connect(a);
  distlock::LockOptions opts;
  opts.ttl = distlock::Millis(a.ttl_ms);
  opts.wait = 500ms;  // so the stop file is looked at
  distlock::Election election = client.election(a.name, opts);
  const std::string pid = std::to_string(::getpid());
  for (int round = 0; !exists(a.stop); ++round) {
    std::error_code ec;
    distlock::Lease lease = election.campaign(pid + "-" + std::to_string(round), ec);
    if (ec) {
      if (ec != distlock::errc::timeout) {
        std::fprintf(stderr, "election_tool: campaign: %s\n", ec.message().c_str());
        std::this_thread::sleep_for(100ms);
      }
      continue;
    }
    const std::int64_t start = mono_ns();
    const std::string term = lease.has_token() ? std::to_string(lease.token()) : std::string("-");
    append(a.log, "S " + pid + " " + term + " " + std::to_string(start) + "\n");
    std::int64_t last_owned = -1;  // no check has said true yet
    const auto give_up = std::chrono::steady_clock::now() + 60s;
    const auto hold_end = std::chrono::steady_clock::now() + std::chrono::milliseconds(a.hold_ms);
    while (std::chrono::steady_clock::now() < give_up) {
      const std::int64_t t = mono_ns();
      if (!lease.owns()) break;
      last_owned = t;
      if (std::chrono::steady_clock::now() >= hold_end && observed_by_all(a, term) &&
          !exists(a.obs_dir + "/hold")) {
        break;
      }
      std::this_thread::sleep_for(5ms);
    }
    const bool owned = lease.owns();
    append(a.log, "E " + pid + " " + term + " " + std::to_string(start) + " " + std::to_string(last_owned) +
                      " " + (owned ? "1" : "0") + "\n");
    try {
      election.resign(lease);
    } catch (const std::system_error&) {
      // lost while stopped: nothing to release
    }
  }
  return 0;
}

int observe(const Args& a) {
  distlock::Client client = connect(a);
  distlock::Election election = client.election(a.name);
  std::optional<std::uint64_t> after;
  while (!exists(a.stop)) {
    try {
      auto l = election.observe(after, 500ms);
      if (!l) continue;
      append(a.out, "T " + std::to_string(l->term) + " " + (l->value_known ? l->value : std::string("?")) +
                        " " + l->holder + "\n");
      after = l->term;
    } catch (const std::system_error& e) {
      std::fprintf(stderr, "election_tool: observe: %s\n", e.what());
      std::this_thread::sleep_for(100ms);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  if (a.url.empty() || a.name.empty() || a.stop.empty()) usage("--url, --name and --stop are required");
  if (a.mode == "campaign") return campaign(a);
  if (a.mode == "observe") return observe(a);
  usage("unknown mode " + a.mode);
}
