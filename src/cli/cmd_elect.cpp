// `distlock elect`: run a command while leader of an election (distlock/election.hpp),
// with `distlock run`'s runner (the command is stopped when leadership is lost,
// exactly as `run` stops it when its lock is lost). `distlock leader`: who leads an
// election now, and with --watch each new leader, as text or one JSON line each.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "distlock/client.hpp"
#include "distlock/election.hpp"
#include "distlock/text.hpp"

namespace distlock::cli {

namespace {

struct ElectFlags {
  std::string url, value, ttl = "30s", wait, grace, name;
  bool no_wait = false;
  std::vector<std::string> command;
  CLI::Option* value_option = nullptr;
};

std::string default_value() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  return std::string(host) + ":" + std::to_string(::getpid());
}

constexpr const char* kElectDescription =
    "Campaign in the election NAME (wait until this process leads it), run COMMAND while it leads, and\n"
    "resign when every process of the job has exited; exit with COMMAND's status. Leadership is an\n"
    "ordinary lease on the derived lock NAME\\x1felect: the term is its fencing token, strictly\n"
    "increasing from one leader to the next. Right after winning, VALUE is written for the term, so\n"
    "`distlock leader NAME` shows it.\n"
    "\n"
    "COMMAND runs with DISTLOCK_NAME (the election name), DISTLOCK_TOKEN (the term; absent where the\n"
    "backend has no fencing tokens), DISTLOCK_URL and DISTLOCK_ELECTION_VALUE in its environment.\n"
    "Everything `distlock run` does for its command is done here: signals forwarded to the whole job,\n"
    "SIGTERM --grace before the lease's local deadline without a renewal, SIGKILL at it or at once when\n"
    "the loss is reported (another process leads then), exit 76 after the job is reaped.";

constexpr const char* kElectFooter =
    "EXIT STATUS\n"
    "  COMMAND's status  COMMAND ran while leader (128+N if it died of signal N)\n"
    "  64   usage error;  69 the lock service is unreachable;  70 the backend keeps no records\n"
    "  75   not leader: another process leads, with --no-wait or when --wait ran out\n"
    "  76   leadership was lost (or about to be) while the job ran; the job was stopped and reaped\n"
    "  126  COMMAND could not be executed;  127  COMMAND was not found\n"
    "\n"
    "EXAMPLES\n"
    "  distlock elect --url etcd://10.0.0.5:2379 --value \"$(hostname):8080\" scheduler -- ./scheduler\n"
    "  distlock leader --url etcd://10.0.0.5:2379 scheduler\n";

struct LeaderFlags {
  std::string url, name, timeout;
  bool json = false, watch = false;
  CLI::Option* timeout_option = nullptr;
};

void print_leader(const std::string& name, const std::optional<Leader>& l, bool json) {
  std::string line;
  if (json) {
    nlohmann::ordered_json j;
    j["election"] = name;
    j["leader"] = l.has_value();
    if (l) {
      j["term"] = l->term > 0 ? nlohmann::ordered_json(l->term) : nlohmann::ordered_json(nullptr);
      j["value"] = l->value_known ? nlohmann::ordered_json(l->value) : nlohmann::ordered_json(nullptr);
      j["value_known"] = l->value_known;
      j["holder"] = l->holder;
      j["ttl_ms"] = l->ttl_remaining ? nlohmann::ordered_json(l->ttl_remaining->count())
                                     : nlohmann::ordered_json(nullptr);
    }
    line = j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
  } else if (!l) {
    line = "election " + name + ": no leader\n";
  } else {
    line = "election " + name + ": term " + (l->term > 0 ? std::to_string(l->term) : std::string("unknown")) +
           ", value " + (l->value_known ? "\"" + l->value + "\"" : std::string("unknown")) + ", holder " +
           (l->holder.empty() ? std::string("unknown") : l->holder) + "\n";
  }
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fflush(stdout);
}

int show_leader(const LeaderFlags& flags) {
  std::string why;
  if (validate_name(flags.name, why)) throw_error(make_error_code(errc::invalid_argument), why);
  std::optional<Millis> timeout;
  if (flags.timeout_option && flags.timeout_option->count() > 0) {
    timeout = parse_duration_flag("--timeout", flags.timeout);
  }
  if (timeout && !flags.watch) {
    throw_error(make_error_code(errc::invalid_argument), "--timeout is for --watch");
  }
  Client client = connect(flags.url, tool_client_options());
  Election election = client.election(flags.name);
  if (!flags.watch) {
    const auto l = election.leader();
    print_leader(flags.name, l, flags.json);
    return l ? exit_status::ok : exit_status::status_free;
  }
  // Each new leader once, in term order; ends when --timeout passes (exit 0).
  const auto end = std::chrono::steady_clock::now() + timeout.value_or(Millis(0));
  std::optional<std::uint64_t> seen;
  for (;;) {
    std::optional<Millis> left;
    if (timeout) {
      left = std::chrono::duration_cast<Millis>(end - std::chrono::steady_clock::now());
      if (left->count() <= 0) return exit_status::ok;
    }
    const auto l = election.observe(seen, left);
    if (!l) return exit_status::ok;
    print_leader(flags.name, l, flags.json);
    seen = l->term;
  }
}

constexpr const char* kLeaderFooter =
    "OUTPUT\n"
    "  Text: \"election NAME: term T, value \\\"V\\\", holder H\" or \"election NAME: no leader\".\n"
    "  --json: one line {\"election\",\"leader\",\"term\",\"value\",\"value_known\",\"holder\",\"ttl_ms\"};\n"
    "  value is null (value_known false) while a new leader has not written its value yet, or where the\n"
    "  backend has no terms (redlock://: term null too).\n"
    "  --watch prints the current leader, then one line per new leader (a higher term) as it is seen;\n"
    "  never a leader twice, never out of term order, never one whose lease had already ended. A leader\n"
    "  that comes and goes between two reads is not printed. A new value proclaimed within a term is not\n"
    "  a new line. Needs fencing tokens (not redlock://).\n"
    "\n"
    "EXIT STATUS\n"
    "  0 a leader was shown (or --watch ended at --timeout);  3 no leader;  64 usage error;\n"
    "  69 the lock service is unreachable;  70 --watch on a backend without fencing tokens\n";

}  // namespace

void add_elect_command(CLI::App& app, int& exit_code, const std::vector<std::string>& command_after_dashes) {
  auto flags = std::make_shared<ElectFlags>();
  CLI::App* elect = app.add_subcommand("elect", "Run a command while leader of an election (exit 75 if not)");
  elect->description(kElectDescription);
  elect->footer(kElectFooter);
  elect
      ->add_option("--url", flags->url, "Lock service URL (default: $DISTLOCK_URL, else this host's file://)")
      ->option_text("URL");
  flags->value_option =
      elect->add_option("--value", flags->value, "The leader's value, shown by `distlock leader`")
          ->option_text("V (default HOST:PID)");
  elect->add_option("--ttl", flags->ttl, "Leadership lease length on the server; renewed every ttl/3")
      ->option_text("DUR (default 30s)");
  auto* wait = elect->add_option("--wait", flags->wait, "Give up (exit 75) if not leader within DUR")
                   ->option_text("DUR");
  auto* no_wait =
      elect->add_flag("--no-wait", flags->no_wait, "Campaign once; exit 75 at once if another leads");
  wait->excludes(no_wait);
  elect->add_option("--grace", flags->grace, "As for `distlock run` (default 5s, or ttl/4)")
      ->option_text("DUR");
  elect->add_option("NAME", flags->name, "Election name")->required()->type_name("");
  elect->add_option("COMMAND", flags->command, "Program and arguments, after \"--\"")->type_name("");
  elect->callback([flags, &exit_code, &command_after_dashes] {
    LeaseRun r;
    r.url = flags->url;
    r.ttl = flags->ttl;
    r.wait = flags->wait;
    r.no_wait = flags->no_wait;
    r.grace = flags->grace;
    r.name = flags->name;
    r.command = flags->command;
    r.after_dashes = command_after_dashes;
    const std::string value = flags->value_option->count() > 0 ? flags->value : default_value();
    r.acquire = [value](Client& client, const std::string& name, const LockOptions& lock) {
      return client.election(name, lock).campaign(value);
    };
    r.env.push_back("DISTLOCK_ELECTION_VALUE=" + value);
    exit_code = run_under_lease(r);
  });
}

void add_leader_command(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<LeaderFlags>();
  CLI::App* leader = app.add_subcommand("leader", "Show who leads an election (--watch: each new leader)");
  leader->description(
      "Show the leader of the election NAME: its term (fencing token), the value it proclaimed and its\n"
      "holder id. Exit 0 if there is a leader, 3 if none. With --watch, keep printing each new leader.");
  leader->footer(kLeaderFooter);
  leader
      ->add_option("--url", flags->url, "Lock service URL (default: $DISTLOCK_URL, else this host's file://)")
      ->option_text("URL");
  leader->add_flag("--json", flags->json, "One JSON object per line instead of text");
  leader->add_flag("--watch", flags->watch, "Print each new leader as it is seen (by notification)");
  flags->timeout_option =
      leader
          ->add_option("--timeout", flags->timeout, "With --watch: stop (exit 0) after DUR (default: never)")
          ->option_text("DUR");
  leader->add_option("NAME", flags->name, "Election name")->required()->type_name("");
  leader->callback([flags, &exit_code] { exit_code = show_leader(*flags); });
}

}  // namespace distlock::cli
