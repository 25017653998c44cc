// distlock — the command-line tool: run a command under a lock, inspect a lock,
// and (when built) benchmark a backend or generate ids. See docs/cli.md.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "bench_driver.hpp"
#include "cli/commands.hpp"
#include "distlock/config.hpp"
#include "distlock/error.hpp"
#include "distlock/text.hpp"
#include "distlock/version.hpp"

namespace distlock::cli {

void add_bench_command(CLI::App& app, int& exit_code) {
  auto config = std::make_shared<bench::BenchConfig>();
  CLI::App* sub =
      app.add_subcommand("bench", "Measure lock latency and throughput (one JSON line per workload)");
  sub->description(
      "The bench driver as a subcommand (same flags and JSON lines as distlock-bench): one JSON line per\n"
      "workload on standard output: "
      "{\"workload\",\"url\",\"clients\",\"ops\",\"ops_per_s\",\"p50_us\",\"p99_us\",\n"
      "\"p999_us\"}. Workloads: uncontended, contended (handoff latency), many-keys, renew, all.");
  bench::add_bench_options(*sub, *config);
  sub->callback([config, &exit_code] { exit_code = bench::run_bench(*config); });
}

namespace {

/// Man-page layout for --help: the synopsis first (for `run` and `status` the
/// documented contract), then the description, arguments, options and the footer's
/// EXIT STATUS / ENVIRONMENT / EXAMPLES sections; option texts wrapped to fit.
class Formatter final : public CLI::Formatter {
 public:
  std::string make_help(const CLI::App* app, std::string name, CLI::AppFormatMode mode) const override {
    if (mode == CLI::AppFormatMode::Sub) return CLI::Formatter::make_help(app, std::move(name), mode);
    std::string out = make_usage(app, name);
    out += "\n" + make_description(app);
    out += make_positionals(app);
    out += make_groups(app, mode);
    out += make_subcommands(app, mode);
    out += "\n" + make_footer(app);
    return out;
  }

  std::string make_usage(const CLI::App* app, std::string name) const override {
    if (app->get_name() == "run") {
      return "Usage: distlock run [--url URL] [--ttl DUR] [--wait DUR | --no-wait] [--grace DUR] "
             "[--leader-only] [--max-hold DUR] [--min-hold DUR] [--once-per DUR] [--permits N] NAME -- "
             "COMMAND [ARGS...]\n"
             "       distlock run --shards M [--per-shard | --on-change hup|restart] [--rebalance-period "
             "DUR] "
             "[--url URL] [--ttl DUR] [--grace DUR] GROUP -- COMMAND [ARGS...]\n";
    }
    if (app->get_name() == "status") return "Usage: distlock status [--url URL] [--json] [--shards] NAME\n";
    return CLI::Formatter::make_usage(app, std::move(name));
  }

  // The subcommand list shows a one-line summary, not the whole manual text.
  std::string make_subcommand(const CLI::App* sub) const override {
    std::string summary = sub->get_description();
    if (sub->get_name() == "run") summary = "Run a command while holding a lock (the cron single-runner)";
    if (sub->get_name() == "status") summary = "Show whether a lock is held, its token, TTL, holder, waiters";
    if (sub->get_name() == "list") summary = "List the locks, semaphores, rw locks and elections held now";
    if (sub->get_name() == "bench")
      summary = "Measure lock latency and throughput (one JSON line per workload)";
    if (sub->get_name() == "id")
      summary = "Print or decode globally unique ids (snowflake, redis-daily, uuid7)";
    summary = summary.substr(0, summary.find('\n'));
    return "  " + pad(sub->get_name()) + summary + "\n";
  }

  std::string make_option_desc(const CLI::Option* opt) const override { return wrap(opt->get_description()); }

 private:
  static constexpr std::size_t kColumn = 30;
  static constexpr std::size_t kWidth = 66;  // of the description column

  static std::string pad(const std::string& s) {
    return s.size() + 2 >= kColumn ? s + "\n" + std::string(kColumn, ' ')
                                   : s + std::string(kColumn - 2 - s.size(), ' ');
  }

  // CLI11 indents whatever follows a '\n' in a description to its column.
  static std::string wrap(const std::string& text) {
    std::string out, line;
    std::size_t start = 0;
    while (start < text.size()) {
      std::size_t end = text.find(' ', start);
      if (end == std::string::npos) end = text.size();
      const std::string word = text.substr(start, end - start);
      if (!line.empty() && line.size() + 1 + word.size() > kWidth) {
        out += line + "\n";
        line.clear();
      }
      line += (line.empty() ? "" : " ") + word;
      start = end + 1;
    }
    return out + line;
  }
};

constexpr const char* kDescription =
    "distlock - distributed locks from the shell.\n"
    "Run a job on exactly one machine at a time, stop it if it loses the lock, and inspect locks.\n"
    "Durations are written 250ms, 10s, 2m or 1h. Lock services are named by URL ('distlock urls' "
    "lists each scheme's query keys):";

constexpr const char* kFooter =
    "EXIT STATUS (all subcommands)\n"
    "  64 usage error, malformed URL or duration;  69 lock service unreachable or authentication failed;\n"
    "  75 lock not acquired;  76 lock lost.  `run` otherwise exits with its command's status, `status`\n"
    "  with 0 (held) or 3 (free).\n"
    "\n"
    "ENVIRONMENT\n"
    "  DISTLOCK_URL  default lock service (else file:// in $XDG_RUNTIME_DIR/distlock or "
    "/tmp/distlock-<uid>)\n"
    "  DISTLOCK_LOG  debug|info|warning|error: show the library's diagnostics\n"
    "  DISTLOCK_PASSWORD  the lock service's password, instead of writing it in the URL where ps shows\n"
    "                it (--password-file FILE wins over it; not used for file://)\n"
    "\n"
    "Run 'distlock SUBCOMMAND --help' for each subcommand's manual.";

/// The message of an error for the one stderr line. A usage error's text already
/// says what is wrong, so the generic ": invalid argument" suffix is dropped.
std::string describe(const std::system_error& e) {
  std::string what = e.what();
  if (e.code() == distlock::errc::invalid_argument) {
    const std::string suffix = ": " + e.code().message();
    if (what.size() > suffix.size() && what.ends_with(suffix)) what.resize(what.size() - suffix.size());
  }
  return what;
}

/// Index of the subcommand word (the first argument that is not a flag), or argc.
// A password written in a URL argument is overwritten in the process's own argument
// memory (what ps and /proc/<pid>/cmdline show) once the arguments have been copied:
// a `run` lives as long as its job, and any user of the host can read its command line.
// It is visible between exec and this call, which is why $DISTLOCK_PASSWORD and
// --password-file exist. Only distlock's own arguments (before "--") are touched.
void hide_url_passwords(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    char* text = argv[i];
    if (text[0] == '-' && text[1] == '-') {
      char* eq = std::strchr(text, '=');
      if (eq == nullptr) continue;
      text = eq + 1;
    }
    if (std::strstr(text, "://") == nullptr) continue;
    const auto [begin, end] = distlock::url_secret_range(text);
    std::fill(text + begin, text + end, '*');
  }
}

int subcommand_index(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (argv[i][0] != '-') return i;
  }
  return argc;
}

}  // namespace

}  // namespace distlock::cli

int main(int argc, char** argv) {
  using namespace distlock::cli;

  // `run` takes everything after the first "--" as the command, verbatim: those
  // words are split off before CLI11 sees them, so the command's own flags (or
  // its own "--") are never taken for ours.
  std::vector<char*> args(argv, argv + argc);
  std::vector<std::string> command_after_dashes;
  const int sub = subcommand_index(argc, argv);
  std::string sub_name = sub < argc ? argv[sub] : "";
  if (sub_name == "run" || sub_name == "elect") {
    for (int i = sub + 1; i < argc; ++i) {
      if (std::strcmp(argv[i], "--") == 0) {
        command_after_dashes.assign(argv + i + 1, argv + argc);
        args.resize(static_cast<std::size_t>(i));
        break;
      }
    }
  }

  // CLI11 parses copies, so the originals can be scrubbed before any of it runs.
  std::vector<std::string> owned_args(args.begin(), args.end());
  hide_url_passwords(static_cast<int>(args.size()), args.data());
  args.clear();
  for (std::string& a : owned_args) args.push_back(a.data());

  CLI::App app(std::string(kDescription) + "\n" + distlock::describe_url_schemes(/*with_keys=*/false),
               "distlock");
  app.formatter(std::make_shared<Formatter>());
  app.footer(kFooter);
  app.set_version_flag("--version", std::string("distlock ") + distlock::kVersion);
  app.require_subcommand(1);
  app.fallthrough(false);

  int exit_code = exit_status::ok;
  add_run_command(app, exit_code, command_after_dashes);
  add_status_command(app, exit_code);
  add_revoke_command(app, exit_code);
  add_elect_command(app, exit_code, command_after_dashes);
  add_leader_command(app, exit_code);
  add_list_command(app, exit_code);
  add_watch_command(app, exit_code);
  add_bench_command(app, exit_code);
  app.add_subcommand("urls",
                     "List the lock-service URL schemes this build supports, with every query key each "
                     "one accepts (type, default, meaning)")
      ->callback([] { std::fputs(distlock::describe_url_schemes().c_str(), stdout); });
#if DISTLOCK_HAS_IDS
  add_id_command(app, exit_code);
#endif

  // The lock service's password without the command line: --password-file on every
  // subcommand that takes --url, or $DISTLOCK_PASSWORD. Put into the URL after parsing,
  // before the subcommand runs.
  PasswordSettings& password = password_settings();
  for (CLI::App* s : app.get_subcommands([](const CLI::App*) { return true; })) {
    if (s->get_option_no_throw("--url") == nullptr) continue;
    s->add_option("--password-file", password.file,
                  "Read the lock service's password from FILE (its first line; a trailing newline is "
                  "dropped) instead of writing it in the URL, where ps shows it. Wins over "
                  "$DISTLOCK_PASSWORD and over a password in the URL")
        ->option_text("FILE");
    if (s->get_name() == "run" || s->get_name() == "elect") {
      s->add_flag("--pass-url-password", password.pass_url_password,
                  "Give the command the password in its DISTLOCK_URL (by default DISTLOCK_URL carries no "
                  "password)");
    }
  }
  app.parse_complete_callback([&app] {
    for (CLI::App* s : app.get_subcommands()) {
      CLI::Option* url = s->get_option_no_throw("--url");
      if (url == nullptr) continue;
      const std::string given = url->count() > 0 ? url->as<std::string>() : std::string();
      std::string with = url_with_password_from_settings(given);
      if (with == given) continue;
      url->clear();
      url->add_result(std::move(with));
      url->run_callback();
    }
  });

  try {
    app.parse(static_cast<int>(args.size()), args.data());
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string known;
    bool is_known = false;
    for (const CLI::App* s : app.get_subcommands([](const CLI::App*) { return true; })) {
      known += (known.empty() ? "" : ", ") + s->get_name();
      is_known = is_known || s->get_name() == sub_name;
    }
    if (!sub_name.empty() && !is_known) {
      print_error("unknown subcommand \"" + sub_name + "\" (known: " + known + "; see 'distlock --help')");
    } else {
      print_error(std::string(e.what()) + " (see 'distlock" + (is_known ? " " + sub_name : "") + " --help')");
    }
    return exit_status::usage;
  } catch (const std::system_error& e) {
    print_error(describe(e));
    return exit_code_for(e.code());
  } catch (const std::exception& e) {
    print_error(std::string("internal error: ") + e.what());
    return exit_status::software;
  }
  return exit_code;
}
