// `distlock status`: what the backend can tell about one lock, for people or (--json)
// for scripts. Exit 0 if held, 3 if free, 69 if the service is unreachable.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <map>
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
  bool shards = false;
  bool waiters = false;
  std::string name;
};

std::string text_or(const std::optional<std::string>& v, const char* absent) {
  return v ? *v : absent;
}

std::int64_t unix_ms(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

// utc_text, or "unknown".
std::string wall_text(const std::optional<std::chrono::system_clock::time_point>& t) {
  return t ? utc_text(*t) : std::string("unknown");
}

void print_text(const std::string& name, const std::string& url, const LockInfo& info,
                const std::optional<RevokeRecord>& revoke, bool waiters) {
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
  if (revoke) {
    out += "revoked: " + utc_text(revoke->at) + " by " + revoke->by +
           (revoke->by_info ? " (" + *revoke->by_info + ")" : std::string()) + ", token " +
           (revoke->token ? std::to_string(*revoke->token) : std::string("none")) + " of " + revoke->holder +
           (revoke->holder_info ? " (" + *revoke->holder_info + ")" : std::string()) + ": " + revoke->reason +
           "\n";
  }
  if (waiters && !info.waiters_listed) {
    out += "queue:   not listed by this backend\n";
  } else if (waiters) {
    for (const WaiterInfo& w : info.waiter_list) {
      out += "  " + std::to_string(w.position) + ". " + w.owner + "  since " + wall_text(w.waiting_since) +
             (w.holder_info ? "  " + *w.holder_info : std::string()) + "\n";
    }
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
}

void print_json(const std::string& name, const std::string& url, const LockInfo& info,
                const std::optional<RevokeRecord>& revoke, bool waiters) {
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
  if (revoke) {
    auto opt = [](const auto& v) { return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(nullptr); };
    nlohmann::ordered_json r;
    r["at_ms"] = unix_ms(revoke->at);
    r["by"] = revoke->by;
    r["by_info"] = opt(revoke->by_info);
    r["reason"] = revoke->reason;
    r["token"] = opt(revoke->token);
    r["holder"] = revoke->holder;
    r["holder_info"] = opt(revoke->holder_info);
    j["last_revoke"] = r;
  } else {
    j["last_revoke"] = nullptr;
  }
  if (waiters) {
    // null: the backend does not list its queue.
    nlohmann::ordered_json list = nullptr;
    if (info.waiters_listed) {
      list = nlohmann::ordered_json::array();
      for (const WaiterInfo& w : info.waiter_list) {
        nlohmann::ordered_json e;
        e["position"] = w.position;
        e["owner"] = w.owner;
        e["holder_info"] =
            w.holder_info ? nlohmann::ordered_json(*w.holder_info) : nlohmann::ordered_json(nullptr);
        e["waiting_since"] = w.waiting_since ? nlohmann::ordered_json(wall_text(w.waiting_since))
                                             : nlohmann::ordered_json(nullptr);
        list.push_back(std::move(e));
      }
    }
    j["queue"] = std::move(list);
  }
  // Lock names are arbitrary bytes; replace invalid UTF-8 rather than fail.
  const std::string line = j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
  std::fwrite(line.data(), 1, line.size(), stdout);
}

/// `status --shards GROUP`: the members of the shard group and the shards each owns, from
/// the group's locks "<GROUP>/members/<id>" and "<GROUP>/shard/<i>" (holder info "member=<id>").
int show_shard_group(const StatusFlags& flags) {
  std::string why;
  if (validate_name(flags.name + "/members/", why)) throw_error(make_error_code(errc::invalid_argument), why);
  Client client = connect(flags.url, tool_client_options());
  const std::string members_prefix = flags.name + "/members/", shard_prefix = flags.name + "/shard/";
  bool truncated_members = false, truncated_shards = false;
  const auto members = client.list(members_prefix, 100000, truncated_members);
  const auto shards = client.list(shard_prefix, 100000, truncated_shards);
  struct Member {
    std::string info;
    std::vector<std::pair<std::uint32_t, std::optional<std::uint64_t>>> shards;
  };
  std::map<std::string, Member> by_id;
  for (const auto& m : members)
    by_id[m.name.substr(members_prefix.size())].info = m.info.holder_info.value_or("");
  std::vector<std::pair<std::uint32_t, std::optional<std::uint64_t>>> unlisted_owner;
  for (const auto& l : shards) {
    const std::string idx_text = l.name.substr(shard_prefix.size());
    if (idx_text.empty() || idx_text.size() > 5 ||
        idx_text.find_first_not_of("0123456789") != std::string::npos)
      continue;
    const auto idx = static_cast<std::uint32_t>(std::stoul(idx_text));
    const std::string info = l.info.holder_info.value_or("");
    const std::string owner = info.rfind("member=", 0) == 0 ? info.substr(7) : std::string();
    by_id[owner].shards.emplace_back(idx, l.info.token);
  }
  for (auto& [id, m] : by_id) std::sort(m.shards.begin(), m.shards.end());
  const std::string url = client.url();
  if (flags.json) {
    nlohmann::ordered_json j;
    j["group"] = flags.name;
    j["url"] = url;
    j["members"] = nlohmann::ordered_json::array();
    for (const auto& [id, m] : by_id) {
      nlohmann::ordered_json e;
      e["member"] = id.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(id);
      e["info"] = m.info;
      e["shards"] = nlohmann::ordered_json::array();
      e["tokens"] = nlohmann::ordered_json::array();
      for (const auto& [i, t] : m.shards) {
        e["shards"].push_back(i);
        e["tokens"].push_back(t ? nlohmann::ordered_json(*t) : nlohmann::ordered_json(nullptr));
      }
      j["members"].push_back(e);
    }
    j["truncated"] = truncated_members || truncated_shards;
    const std::string line = j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
    std::fwrite(line.data(), 1, line.size(), stdout);
  } else {
    std::string out = "group:   " + flags.name + "\nurl:     " + url +
                      "\nmembers: " + std::to_string(members.size()) +
                      "\nowned:   " + std::to_string(shards.size()) + " shards\n";
    for (const auto& [id, m] : by_id) {
      std::string list;
      for (const auto& [i, t] : m.shards) list += (list.empty() ? "" : ",") + std::to_string(i);
      out += "member " + (id.empty() ? std::string("(unknown)") : id) + ": " +
             std::to_string(m.shards.size()) + " shards [" + list + "]" +
             (m.info.empty() ? "" : "  " + m.info) + "\n";
    }
    if (truncated_members || truncated_shards) out += "(listing truncated)\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
  }
  std::fflush(stdout);
  return members.empty() && shards.empty() ? exit_status::status_free : exit_status::ok;
}

int show_status(const StatusFlags& flags) {
  if (flags.shards) return show_shard_group(flags);
  std::string why;
  if (validate_name(flags.name, why)) throw_error(make_error_code(errc::invalid_argument), why);
  Client client = connect(flags.url, tool_client_options());
  const LockInfo info = client.status(flags.name);
  std::optional<RevokeRecord> revoke;
  try {
    revoke = client.last_revoke(flags.name);
  } catch (const std::system_error& e) {
    if (e.code() != errc::not_supported) throw;  // a backend that keeps no revoke notes: none shown
  }
  const std::string url = client.url();  // password masked
  if (flags.json) {
    print_json(flags.name, url, info, revoke, flags.waiters);
  } else {
    print_text(flags.name, url, info, revoke, flags.waiters);
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
    "  revoked (only after a `distlock revoke`, kept 7 days where the backend keeps revoke notes): when\n"
    "  (UTC), by whom, the token revoked, its holder and the reason.\n"
    "  With --json, one line: "
    "{\"name\",\"url\",\"held\",\"token\",\"ttl_ms\",\"holder\",\"holder_info\",\"waiters\",\"last_revoke\"},"
    " null "
    "for\n"
    "  unknown or none.\n"
    "  With --waiters, the queue in hand-off order, one line each: position, owner id, when it started\n"
    "  waiting (UTC, \"unknown\" where the backend records no time) and its description; \"queue: not\n"
    "  listed by this backend\" where the backend keeps no queue (file, postgres, mysql, redis+cluster,\n"
    "  redlock). With --json it adds \"queue\": "
    "[{\"position\",\"owner\",\"holder_info\",\"waiting_since\"}]\n"
    "  (null where not listed).\n"
    "\n"
    "EXIT STATUS\n"
    "  0 held;  3 free;  64 usage error or malformed URL;  69 the lock service is unreachable\n"
    "\n"
    "EXAMPLES\n"
    "  distlock status nightly-report\n"
    "  distlock status --json --url redis://10.0.0.5:6379 backup | jq .token\n"
    "  distlock status --waiters nightly-report\n";

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
  status->add_flag("--shards", flags->shards,
                   "NAME is a shard group (distlock run --shards): show its members and the shards each "
                   "owns with their tokens (JSON: {\"group\",\"url\",\"members\":[{\"member\",\"info\","
                   "\"shards\",\"tokens\"}],\"truncated\"}); exit 3 when nobody is in it");
  status->add_flag("--waiters", flags->waiters,
                   "Also list the waiters in the order the lock passes to them (where the backend queues)");
  status->add_option("NAME", flags->name, "Lock name")->required()->type_name("");
  status->callback([flags, &exit_code] { exit_code = show_status(*flags); });
}

}  // namespace distlock::cli
