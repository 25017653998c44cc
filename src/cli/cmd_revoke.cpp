// `distlock revoke`: ends the lease of whoever holds a lock (Client::revoke), with a
// reason the holder reads and `distlock status` shows afterwards.
// Exit 0 revoked, 3 nothing was held, 64 usage, 69 unreachable, 70 not supported.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.hpp"
#include "cli/job_guard.hpp"
#include "distlock/client.hpp"
#include "distlock/text.hpp"

namespace distlock::cli {

namespace {

struct RevokeFlags {
  std::string url, reason, name;
  bool json = false;
};

int revoke_lock(const RevokeFlags& flags) {
  std::string why;
  if (validate_name(flags.name, why)) throw_error(make_error_code(errc::invalid_argument), why);
  ClientOptions opts = tool_client_options();
  // Who revoked: kept in the revoke note, shown by `distlock status`.
  opts.lock_defaults.holder_info = runner_holder_info({"distlock", "revoke"});
  Client client = connect(flags.url, opts);
  const RevokeResult r = client.revoke(flags.name, flags.reason);
  if (flags.json) {
    nlohmann::ordered_json j;
    j["name"] = flags.name;
    j["url"] = client.url();
    j["revoked"] = r.revoked;
    j["token"] = r.token ? nlohmann::ordered_json(*r.token) : nlohmann::ordered_json(nullptr);
    j["holder"] = r.holder ? nlohmann::ordered_json(*r.holder) : nlohmann::ordered_json(nullptr);
    j["holder_info"] =
        r.holder_info ? nlohmann::ordered_json(*r.holder_info) : nlohmann::ordered_json(nullptr);
    const std::string line = j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
    std::fwrite(line.data(), 1, line.size(), stdout);
  } else if (r.revoked) {
    std::string out = "revoked: " + flags.name + "\n";
    out += "token:   " + (r.token ? std::to_string(*r.token) : std::string("none")) + "\n";
    out += "holder:  " + r.holder.value_or("unknown") + "\n";
    if (r.holder_info) out += "info:    " + *r.holder_info + "\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
  } else {
    const std::string out = "nothing held: " + flags.name + " is free; nothing was revoked\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
  }
  std::fflush(stdout);
  return r.revoked ? exit_status::ok : exit_status::status_free;
}

constexpr const char* kRevokeFooter =
    "WHAT THE HOLDER SEES\n"
    "  At its next renewal (within one renew interval, a third of its TTL by default) the holder's\n"
    "  lease is lost with reason \"revoked\" and this reason text; `distlock run` stops its command as on\n"
    "  any loss. The next waiter is granted the lock at once, with a larger fencing token: the revoked\n"
    "  holder may still run until it notices, so revoke what is fenced by the token, or accept the\n"
    "  overlap (docs/design.md \"Revoke\").\n"
    "\n"
    "EXIT STATUS\n"
    "  0 revoked;  3 the lock was free (nothing done);  64 usage error or malformed URL;\n"
    "  69 the lock service is unreachable;  70 the backend cannot revoke (file://, postgres://, mysql://;\n"
    "  etcd:// and zk:// not yet)\n"
    "\n"
    "EXAMPLES\n"
    "  distlock revoke --reason \"stuck since 03:00, ticket 4711\" nightly-report\n"
    "  distlock status nightly-report    # shows the last revoke: when, by whom, why\n";

}  // namespace

void add_revoke_command(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<RevokeFlags>();
  CLI::App* cmd = app.add_subcommand("revoke", "End the current holder's lease of a lock, with a reason");
  cmd->description(
      "End the lease of whoever holds the lock NAME now, in any process on any host: the lock passes\n"
      "to the next waiter, the holder is told (loss reason \"revoked\", with REASON) and the revoke is kept\n"
      "beside the lock for `distlock status`. Exit 0 if revoked, 3 if the lock was free.");
  cmd->footer(kRevokeFooter);
  cmd->add_option("--url", flags->url,
                  "Lock service URL (default: $DISTLOCK_URL, else this host's file:// directory)")
      ->option_text("URL");
  cmd->add_option("--reason", flags->reason,
                  "Why (1 to 1024 bytes, no control characters): the holder and `distlock status` show it")
      ->required()
      ->option_text("TEXT");
  cmd->add_flag("--json", flags->json,
                "Print one JSON object: {\"name\",\"url\",\"revoked\",\"token\",\"holder\",\"holder_info\"}");
  cmd->add_option("NAME", flags->name, "Lock name")->required()->type_name("");
  cmd->callback([flags, &exit_code] { exit_code = revoke_lock(*flags); });
}

}  // namespace distlock::cli
