// `distlock watch PREFIX`: one line per lock event under PREFIX (acquired, released, lost,
// revoked, gap, state), as text or (--json) one JSON object per line, until SIGINT or
// SIGTERM (exit 0), --count events or --timeout.
#include <pthread.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>

#include "cli/commands.hpp"
#include "distlock/client.hpp"
#include "distlock/text.hpp"
#include "distlock/watch.hpp"

namespace distlock::cli {

namespace {

struct WatchFlags {
  std::string url;
  std::string prefix;
  bool json = false;
  bool no_initial = false;
  std::size_t count = 0;  // 0: no limit
  std::string timeout;
};
std::string text_line(const WatchEvent& e) {
  std::string line = utc_text(e.at) + " " + std::string(to_string(e.kind));
  if (e.kind == WatchEventKind::gap) {
    if (e.gap_since) line += " since=" + utc_text(*e.gap_since);
    for (const auto& n : e.gap_names) line += " name=" + printable(n);
    line += " (" + printable(e.detail) + ")";
    return line + "\n";
  }
  line += " " + printable(e.name);
  if (e.kind == WatchEventKind::state) line += e.held ? " held" : " free";
  line += " token=" + std::to_string(e.token);
  if (!e.holder.empty()) line += " holder=" + printable(e.holder);
  if (e.holder_info) line += " info=\"" + printable(*e.holder_info) + "\"";
  if (e.inferred) line += " inferred";
  if (!e.detail.empty()) line += " (" + printable(e.detail) + ")";
  return line + "\n";
}

std::string json_line(const WatchEvent& e) {
  using J = nlohmann::ordered_json;
  J j;
  j["event"] = std::string(to_string(e.kind));
  j["at"] = utc_text(e.at);
  if (e.kind == WatchEventKind::gap) {
    j["since"] = e.gap_since ? J(utc_text(*e.gap_since)) : J(nullptr);
    j["names"] = e.gap_names;
    j["detail"] = e.detail;
  } else {
    j["name"] = e.name;
    j["token"] = e.token;
    j["held"] = e.held;
    j["holder"] = e.holder.empty() ? J(nullptr) : J(e.holder);
    j["holder_info"] = e.holder_info ? J(*e.holder_info) : J(nullptr);
    j["inferred"] = e.inferred;
    j["detail"] = e.detail;
  }
  return j.dump(-1, ' ', false, J::error_handler_t::replace) + "\n";
}

int watch_locks(const WatchFlags& flags) {
  std::optional<Millis> timeout;
  if (!flags.timeout.empty()) timeout = parse_duration_flag("--timeout", flags.timeout);
  if (!flags.prefix.empty()) {
    std::string why;
    if (validate_name(flags.prefix, why))
      throw_error(make_error_code(errc::invalid_argument), "PREFIX: " + why);
  }
  // SIGINT and SIGTERM end the watch: blocked in every thread (the client's threads
  // inherit the mask) and taken by one thread that stops the watch.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGUSR2);  // our own: the watch ended by itself, the signal thread ends
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  Client client = connect(flags.url, tool_client_options());
  WatchOptions opts;
  opts.initial_state = !flags.no_initial;
  Watch w = client.watch(flags.prefix, opts);
  std::atomic<bool> signalled{false};
  std::thread signals([&w, &signalled, sigs] {
    int sig = 0;
    sigwait(&sigs, &sig);
    if (sig != SIGUSR2) signalled.store(true);
    w.stop();
  });

  const bool has_deadline = timeout.has_value();
  const auto deadline = std::chrono::steady_clock::now() + timeout.value_or(Millis(0));
  std::size_t printed = 0;
  while (flags.count == 0 || printed < flags.count) {
    std::optional<Millis> left;
    if (has_deadline) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) break;
      left = std::chrono::ceil<Millis>(deadline - now);
    }
    std::optional<WatchEvent> e = w.next(left);
    if (!e) {
      if (signalled.load() || !has_deadline) break;  // stopped by a signal
      continue;                                      // the deadline: checked above
    }
    const std::string line = flags.json ? json_line(*e) : text_line(*e);
    std::fwrite(line.data(), 1, line.size(), stdout);
    std::fflush(stdout);
    ++printed;
  }
  pthread_kill(signals.native_handle(), SIGUSR2);
  signals.join();
  w.stop();
  return exit_status::ok;
}

constexpr const char* kWatchFooter =
    "OUTPUT\n"
    "  One line per event: TIME KIND NAME token=T holder=ID [info=\"...\"] [inferred] [(detail)], where KIND "
    "is\n"
    "  acquired, released, lost (inferred: an expiry the watcher deduced), revoked, state (a snapshot: held\n"
    "  or free; at the start and after each gap) or gap (events may be missing: since=TIME (detail)).\n"
    "  With --json, one object per line: "
    "{\"event\",\"at\",\"name\",\"token\",\"held\",\"holder\",\"holder_info\",\n"
    "  \"inferred\",\"detail\"}, a gap {\"event\":\"gap\",\"at\",\"since\",\"names\",\"detail\"}.\n"
    "\n"
    "EXIT STATUS\n"
    "  0 stopped by SIGINT/SIGTERM, --count or --timeout;  64 usage error;  69 the lock service is\n"
    "  unreachable;  70 the backend publishes no lock changes (not supported)\n"
    "\n"
    "EXAMPLES\n"
    "  distlock watch orders/\n"
    "  distlock watch --url redis://10.0.0.5:6379 --json --count 10 jobs/nightly\n";

}  // namespace

void add_watch_command(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<WatchFlags>();
  CLI::App* sub = app.add_subcommand("watch", "Print lock events under a name prefix as they happen");
  sub->description(
      "Print one line per event of every lock whose name starts with PREFIX (an exact name is a prefix\n"
      "too): acquired, released, lost, revoked, in token order per name; a gap when events may have been\n"
      "missed, followed by the state of every held lock. Ends on SIGINT or SIGTERM (exit 0).");
  sub->footer(kWatchFooter);
  sub->add_option("PREFIX", flags->prefix, "Name prefix (empty: every lock)")->required();
  sub->add_option("--url", flags->url,
                  "Lock service URL (default: $DISTLOCK_URL, else this host's file:// directory)")
      ->option_text("URL");
  sub->add_flag("--json", flags->json, "One JSON object per line");
  sub->add_option("--count", flags->count, "Stop after N events")->option_text("N");
  sub->add_option("--timeout", flags->timeout, "Stop after this long (e.g. 30s)")->option_text("DUR");
  sub->add_flag("--no-initial", flags->no_initial, "No state lines for the locks held at the start");
  sub->callback([flags, &exit_code] { exit_code = watch_locks(*flags); });
}

}  // namespace distlock::cli
