// The `distlock` command-line tool: one function per subcommand, the exit codes
// that users' scripts rely on, and the small helpers every subcommand shares.
//
// Each `add_*_command(app, exit_code)` registers a CLI11 subcommand whose callback
// does the work and stores the process exit status in `exit_code`; main() returns
// it. Errors from distlock are `std::system_error` in `distlock::category()`; a
// callback may let them escape and main() maps them with `exit_code_for()`.
//
// Thread-safety: these run on the main thread of the `distlock` process only.
//
// Example (what main.cpp does):
//   CLI::App app{"distributed locks from the shell", "distlock"};
//   int exit_code = 0;
//   distlock::cli::add_run_command(app, exit_code);
//   distlock::cli::add_status_command(app, exit_code);
//   app.parse(argc, argv);
//   return exit_code;
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "distlock/client.hpp"
#include "distlock/options.hpp"

namespace CLI {
class App;
}  // namespace CLI

namespace distlock::cli {

/// Exit statuses (sysexits.h values where one fits). Part of the tool's contract.
namespace exit_status {
inline constexpr int ok = 0;
inline constexpr int status_free = 3;       ///< `distlock status`: nobody holds the lock
inline constexpr int usage = 64;            ///< EX_USAGE: bad flag, malformed URL, name or duration
inline constexpr int unavailable = 69;      ///< EX_UNAVAILABLE: backend unreachable, auth failed, no quorum
inline constexpr int software = 70;         ///< EX_SOFTWARE: an internal error distlock did not expect
inline constexpr int not_acquired = 75;     ///< EX_TEMPFAIL: busy with --no-wait, or --wait ran out
inline constexpr int lost = 76;             ///< the lock was lost while the command ran
inline constexpr int cannot_execute = 126;  ///< the command exists but could not be executed
inline constexpr int not_found = 127;       ///< the command was not found
}  // namespace exit_status

/// `distlock run [--url URL] [--ttl DUR] [--wait DUR | --no-wait] [--grace DUR] NAME -- COMMAND [ARGS…]`.
/// `command_after_dashes` holds what followed the first `--` on the command line
/// (main() splits it off before CLI11 parses, so the command's own flags are never
/// taken for ours).
void add_run_command(CLI::App& app, int& exit_code, const std::vector<std::string>& command_after_dashes);

/// `distlock run`'s runner for other subcommands (`distlock elect`): the flags as
/// `run` takes them (validated the same way; empty wait/grace: not given), the lease
/// taken by `acquire`, `env` added to the command's environment. The command runs and
/// is stopped on loss of that lease exactly as under `run`; returns the exit status.
struct LeaseRun {
  std::string url, ttl = "30s", wait, grace, name;
  bool no_wait = false;
  std::vector<std::string> command, after_dashes;
  std::function<Lease(Client&, const std::string& name, const LockOptions&)> acquire;
  std::vector<std::string> env;
};
int run_under_lease(const LeaseRun& r);

/// `distlock elect [--url URL] [--value V] [--ttl DUR] [--wait DUR | --no-wait] NAME -- COMMAND [ARGS…]`
/// (cmd_elect.cpp): runs COMMAND while leader of the election NAME.
void add_elect_command(CLI::App& app, int& exit_code, const std::vector<std::string>& command_after_dashes);

/// `distlock leader [--url URL] [--json] [--watch] [--timeout DUR] NAME` (cmd_elect.cpp).
void add_leader_command(CLI::App& app, int& exit_code);

/// `distlock status [--url URL] [--json] NAME`.
void add_status_command(CLI::App& app, int& exit_code);

/// `distlock revoke [--url URL] --reason TEXT [--json] NAME` (cmd_revoke.cpp).
void add_revoke_command(CLI::App& app, int& exit_code);

/// `distlock list [--url URL] [--prefix P] [--json] [--limit N]` (cmd_list.cpp).
void add_list_command(CLI::App& app, int& exit_code);

/// `distlock watch [--url URL] [--json] [--count N] [--timeout DUR] PREFIX` (cmd_watch.cpp).
void add_watch_command(CLI::App& app, int& exit_code);

/// `distlock id ...`: defined in cmd_id.cpp, compiled only with the ids component
/// (DISTLOCK_HAS_IDS, distlock/config.hpp).
void add_id_command(CLI::App& app, int& exit_code);

/// `distlock bench ...`: the bench driver (tools/bench) as a subcommand.
void add_bench_command(CLI::App& app, int& exit_code);

/// The exit status for an error: invalid_url/invalid_argument → 64;
/// backend_unavailable/auth_failed/quorum_unavailable/protocol_error → 69;
/// busy/timeout → 75; lost → 76; anything else → 70.
int exit_code_for(const std::error_code& ec) noexcept;

/// Writes the one line `distlock: <message>` to stderr.
void print_error(std::string_view message) noexcept;

/// Parses a duration written `250ms`, `10s`, `2m`, `1h` (a bare number is
/// milliseconds). Throws std::system_error(errc::invalid_argument) naming `flag`
/// and the text when malformed.
Millis parse_duration_flag(std::string_view flag, std::string_view text);

/// Formats a duration for people: "250ms", "10s", "1.5s", "2m".
std::string format_duration(Millis d);

/// A wall-clock time as UTC with milliseconds: "2026-11-29T14:03:07.123Z".
std::string utc_text(std::chrono::system_clock::time_point t);

/// A name or holder text for a terminal: bytes outside printable ASCII (and the backslash)
/// as \xNN.
std::string printable(const std::string& s);

/// Where the tool takes the lock service's password from, besides the URL: the
/// `--password-file FILE` option (wins) or the DISTLOCK_PASSWORD environment variable
/// (redis-cli's REDISCLI_AUTH habit), so it need not appear on the command line where
/// `ps` shows it. Set by main()'s option wiring before a subcommand runs.
struct PasswordSettings {
  std::string file;                ///< --password-file; empty when not given
  bool pass_url_password = false;  ///< `run --pass-url-password`: the child's DISTLOCK_URL keeps it
};
PasswordSettings& password_settings();

/// The URL a subcommand connects to: `url` (the default URL when empty) with the
/// password of --password-file or $DISTLOCK_PASSWORD put in (percent-encoded; it replaces
/// one written in the URL). Returns `url` unchanged when neither is given, or when the
/// scheme takes no password (file://, memory://) and only $DISTLOCK_PASSWORD is set.
/// Throws std::system_error: invalid_argument naming the file (never its content) when it
/// cannot be read or is empty, or when --password-file is given for a scheme without
/// passwords; invalid_url (masked) when the URL does not parse.
std::string url_with_password_from_settings(const std::string& url);

/// The URL `distlock run` puts in its command's DISTLOCK_URL: `url` without its password,
/// unless --pass-url-password was given.
std::string child_url(const std::string& url);

/// Client options for the tool: the library's diagnostics stay silent unless
/// DISTLOCK_LOG asks for them (the tool reports each error once, itself; a lost lease
/// explains itself with Lease::loss_detail()).
ClientOptions tool_client_options();

}  // namespace distlock::cli
