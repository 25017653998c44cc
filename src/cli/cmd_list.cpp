// `distlock list`: the locks held now (plain locks, semaphore permits, read-write lock
// parts, election leaderships), for people or (--json) for scripts. Exit 0.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "distlock/client.hpp"
#include "distlock/text.hpp"

namespace distlock::cli {

namespace {

struct ListFlags {
  std::string url;
  std::string prefix;
  bool json = false;
  std::size_t limit = 1000;
};

const char* kind_name(LockKind k) {
  switch (k) {
    case LockKind::lock: return "lock";
    case LockKind::semaphore_permit: return "semaphore";
    case LockKind::rw_writer: return "rw_writer";
    case LockKind::rw_reader: return "rw_reader";
    case LockKind::election: return "election";
  }
  return "lock";
}

struct Group {  // a semaphore or read-write lock: how many of its parts are held
  LockKind kind;
  std::size_t held = 0;
  std::optional<std::uint32_t> of;
  bool writer = false;
};

std::map<std::pair<std::string, int>, Group> groups_of(const std::vector<ListedLock>& locks) {
  std::map<std::pair<std::string, int>, Group> g;
  for (const auto& l : locks) {
    if (l.kind == LockKind::semaphore_permit) {
      auto& e = g[{l.base, 0}];
      e.kind = l.kind;
      ++e.held;
      if (l.of) e.of = l.of;
    } else if (l.kind == LockKind::rw_reader || l.kind == LockKind::rw_writer) {
      auto& e = g[{l.base, 1}];
      e.kind = LockKind::rw_reader;
      if (l.kind == LockKind::rw_reader) ++e.held;
      if (l.kind == LockKind::rw_writer) e.writer = true;
      if (l.of) e.of = l.of;
    }
  }
  return g;
}

void print_text(const std::vector<ListedLock>& locks, bool truncated, std::size_t limit) {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "%-32s %-26s %10s %9s %7s  %s\n", "NAME", "KIND", "TOKEN", "TTL",
                "WAITERS", "HOLDER");
  out += line;
  for (const auto& l : locks) {
    const std::string token = l.info.token ? std::to_string(*l.info.token) : "-";
    const std::string ttl = l.info.ttl_remaining ? format_duration(*l.info.ttl_remaining) : "-";
    const std::string waiters = l.info.waiters ? std::to_string(*l.info.waiters) : "-";
    std::string holder = l.info.holder_info ? *l.info.holder_info : std::string();
    if (l.info.holder) holder += (holder.empty() ? "" : " ") + std::string("[") + *l.info.holder + "]";
    if (holder.empty()) holder = "-";
    std::snprintf(line, sizeof line, "%-32s %-26s %10s %9s %7s  ", printable(l.base).c_str(),
                  l.display.c_str(), token.c_str(), ttl.c_str(), waiters.c_str());
    out += line;
    out += printable(holder) + "\n";
  }
  for (const auto& [key, g] : groups_of(locks)) {
    const std::string of = g.of ? std::to_string(*g.of) : "?";
    if (key.second == 0) {
      out +=
          "semaphore " + printable(key.first) + ": " + std::to_string(g.held) + "/" + of + " permits held\n";
    } else if (g.writer && g.of && g.held == *g.of) {
      out += "rw lock " + printable(key.first) + ": held exclusive (writer)\n";
    } else {
      out += "rw lock " + printable(key.first) + ": " + std::to_string(g.held) + "/" + of +
             " reader slots held" + (g.writer ? ", a writer waiting or taking it" : "") + "\n";
    }
  }
  if (truncated) out += "(more than " + std::to_string(limit) + " locks: raise --limit to see them)\n";
  if (locks.empty()) out += "(no locks held)\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
}

void print_json(const std::string& url, const std::vector<ListedLock>& locks, bool truncated) {
  using J = nlohmann::ordered_json;
  auto opt = [](const auto& v) { return v ? J(*v) : J(nullptr); };
  J j;
  j["url"] = url;
  j["truncated"] = truncated;
  J arr = J::array();
  for (const auto& l : locks) {
    J e;
    e["name"] = l.name;
    e["base"] = l.base;
    e["kind"] = kind_name(l.kind);
    e["index"] = opt(l.index);
    e["of"] = opt(l.of);
    e["display"] = l.display;
    e["token"] = opt(l.info.token);
    e["ttl_ms"] = l.info.ttl_remaining ? J(l.info.ttl_remaining->count()) : J(nullptr);
    e["holder"] = opt(l.info.holder);
    e["holder_info"] = opt(l.info.holder_info);
    e["waiters"] = opt(l.info.waiters);
    arr.push_back(std::move(e));
  }
  j["locks"] = std::move(arr);
  J sems = J::array(), rws = J::array();
  for (const auto& [key, g] : groups_of(locks)) {
    J e;
    e["name"] = key.first;
    if (key.second == 0) {
      e["held"] = g.held;
      e["permits"] = opt(g.of);
      sems.push_back(std::move(e));
    } else {
      e["readers"] = g.held;
      e["slots"] = opt(g.of);
      e["writer"] = g.writer;
      rws.push_back(std::move(e));
    }
  }
  j["semaphores"] = std::move(sems);
  j["rw_locks"] = std::move(rws);
  const std::string line = j.dump(-1, ' ', false, J::error_handler_t::replace) + "\n";
  std::fwrite(line.data(), 1, line.size(), stdout);
}

int list_locks(const ListFlags& flags) {
  if (!flags.prefix.empty()) {
    std::string why;
    if (validate_name(flags.prefix, why)) {
      throw_error(make_error_code(errc::invalid_argument), "--prefix: " + why);
    }
  }
  if (flags.limit == 0) throw_error(make_error_code(errc::invalid_argument), "--limit must be at least 1");
  Client client = connect(flags.url, tool_client_options());
  bool truncated = false;
  const std::vector<ListedLock> locks = client.list(flags.prefix, flags.limit, truncated);
  if (flags.json) {
    print_json(client.url(), locks, truncated);
  } else {
    print_text(locks, truncated, flags.limit);
  }
  std::fflush(stdout);
  return exit_status::ok;
}

constexpr const char* kListFooter =
    "OUTPUT\n"
    "  One row per lock held now: NAME (the user's name), KIND (lock, semaphore permit i of N, rw writer,\n"
    "  rw reader slot i of R, election), TOKEN, TTL (the server's remaining lease), WAITERS, HOLDER (its\n"
    "  description, e.g. host=H pid=P cmd=C, then [owner id]); \"-\" where the backend cannot tell. Then "
    "one\n"
    "  line per semaphore (permits held/N) and read-write lock. Names are sorted; bytes outside printable\n"
    "  ASCII show as \\xNN.\n"
    "  With --json, one line: "
    "{\"url\",\"truncated\",\"locks\":[{\"name\",\"base\",\"kind\",\"index\",\"of\",\n"
    "  "
    "\"display\",\"token\",\"ttl_ms\",\"holder\",\"holder_info\",\"waiters\"}],\"semaphores\":[{\"name\","
    "\"held\",\n"
    "  \"permits\"}],\"rw_locks\":[{\"name\",\"readers\",\"slots\",\"writer\"}]}, null where unknown.\n"
    "\n"
    "EXIT STATUS\n"
    "  0 listed (also when none is held);  64 usage error;  69 the lock service is unreachable;\n"
    "  70 the backend cannot list its locks\n"
    "\n"
    "EXAMPLES\n"
    "  distlock list\n"
    "  distlock list --url redis://10.0.0.5:6379 --prefix reports/ --json | jq '.locks[].name'\n";

}  // namespace

void add_list_command(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<ListFlags>();
  CLI::App* list = app.add_subcommand("list", "List the locks, semaphores, rw locks and elections held now");
  list->description(
      "List what is held now on the lock service: locks, semaphore permits (held/N), read-write locks and\n"
      "election leaderships, with holder, token, TTL and waiters (as far as the backend can tell). May scan\n"
      "the server's keys: a tool for people, not for a hot path.");
  list->footer(kListFooter);
  list->add_option("--url", flags->url,
                   "Lock service URL (default: $DISTLOCK_URL, else this host's file:// directory)")
      ->option_text("URL");
  list->add_option("--prefix", flags->prefix, "Only names starting with P")->option_text("P");
  list->add_option("--limit", flags->limit, "At most N locks (default 1000)")->option_text("N");
  list->add_flag("--json", flags->json, "Print one JSON object instead of text");
  list->callback([flags, &exit_code] { exit_code = list_locks(*flags); });
}

}  // namespace distlock::cli
