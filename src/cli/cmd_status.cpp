// `distlock status`: what the backend can tell about one lock, for people or (--json)
// for scripts. Exit 0 if held, 3 if free, 69 if the service is unreachable.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.hpp"
#include "distlock/client.hpp"
#include "distlock/text.hpp"

namespace distlock::cli {

namespace {

struct StatusFlags {
  std::string url;
  bool json = false;
  std::string name;
};

std::string text_or(const std::optional<std::string>& v, const char* absent) {
  return v ? *v : absent;
}

void print_text(const std::string& name, const std::string& url, const LockInfo& info) {
  // Fields the backend cannot tell are "unknown"; those that do not apply to a
  // free lock (its remaining TTL, its holder) are "none".
  const char* absent = info.held ? "unknown" : "none";
  std::string out;
  out += "lock:    " + name + "\n";
  out += "url:     " + url + "\n";
  out += std::string("held:    ") + (info.held ? "yes" : "no") + "\n";
  out += "token:   " + (info.token ? std::to_string(*info.token) : std::string("unknown")) +
         (info.token && !info.held ? " (last issued)" : "") + "\n";
  out +=
      "ttl:     " + (info.ttl_remaining ? format_duration(*info.ttl_remaining) : std::string(absent)) + "\n";
  out += "holder:  " + text_or(info.holder, absent) + "\n";
  if (info.holder_info) out += "info:    " + *info.holder_info + "\n";
  out += "waiters: " + (info.waiters ? std::to_string(*info.waiters) : std::string("unknown")) + "\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
}

void print_json(const std::string& name, const std::string& url, const LockInfo& info) {
  // null = the backend cannot tell (or, for ttl_ms/holder of a free lock, none).
  nlohmann::ordered_json j;
  j["name"] = name;
  j["url"] = url;
  j["held"] = info.held;
  j["token"] = info.token ? nlohmann::ordered_json(*info.token) : nlohmann::ordered_json(nullptr);
  j["ttl_ms"] = info.ttl_remaining ? nlohmann::ordered_json(info.ttl_remaining->count())
                                   : nlohmann::ordered_json(nullptr);
  j["holder"] = info.holder ? nlohmann::ordered_json(*info.holder) : nlohmann::ordered_json(nullptr);
  j["holder_info"] =
      info.holder_info ? nlohmann::ordered_json(*info.holder_info) : nlohmann::ordered_json(nullptr);
  j["waiters"] = info.waiters ? nlohmann::ordered_json(*info.waiters) : nlohmann::ordered_json(nullptr);
  // Lock names are arbitrary bytes; replace invalid UTF-8 rather than fail.
  const std::string line = j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
  std::fwrite(line.data(), 1, line.size(), stdout);
}

int show_status(const StatusFlags& flags) {
  std::string why;
  if (validate_name(flags.name, why)) throw_error(make_error_code(errc::invalid_argument), why);
  Client client = connect(flags.url, tool_client_options());
  const LockInfo info = client.status(flags.name);
  const std::string url = client.url();  // password masked
  if (flags.json) {
    print_json(flags.name, url, info);
  } else {
    print_text(flags.name, url, info);
  }
  std::fflush(stdout);
  return info.held ? exit_status::ok : exit_status::status_free;
}

constexpr const char* kStatusFooter =
    "OUTPUT\n"
    "  lock, url, held (yes/no), token (the current fencing token; for a free lock the last one issued),\n"
    "  ttl (the server's remaining lease), holder (the holder's owner id: client id:thread), info (the\n"
    "  holder's description, e.g. host=H pid=P cmd=C for a distlock run; only when it set one), waiters.\n"
    "  \"unknown\" where the backend cannot tell, \"none\" for the ttl and holder of a free lock.\n"
    "  With --json, one line: "
    "{\"name\",\"url\",\"held\",\"token\",\"ttl_ms\",\"holder\",\"holder_info\",\"waiters\"}, null "
    "for\n"
    "  unknown or none.\n"
    "\n"
    "EXIT STATUS\n"
    "  0 held;  3 free;  64 usage error or malformed URL;  69 the lock service is unreachable\n"
    "\n"
    "EXAMPLES\n"
    "  distlock status nightly-report\n"
    "  distlock status --json --url redis://10.0.0.5:6379 backup | jq .token\n";

}  // namespace

void add_status_command(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<StatusFlags>();
  CLI::App* status = app.add_subcommand("status", "Show whether a lock is held, its token, TTL and holder");
  status->description(
      "Show what the lock service knows about the lock NAME: whether it is held, its current fencing\n"
      "token, the remaining TTL, the holder's id and the number of waiters (as far as the backend can\n"
      "tell). Exit 0 if held, 3 if free.");
  status->footer(kStatusFooter);
  status
      ->add_option("--url", flags->url,
                   "Lock service URL (default: $DISTLOCK_URL, else this host's file:// directory)")
      ->option_text("URL");
  status->add_flag("--json", flags->json, "Print one JSON object instead of text");
  status->add_option("NAME", flags->name, "Lock name")->required()->type_name("");
  status->callback([flags, &exit_code] { exit_code = show_status(*flags); });
}

}  // namespace distlock::cli
