#include "cli/job_guard.hpp"

#include <unistd.h>

#include <charconv>
#include <chrono>
#include <string_view>
#include <system_error>

namespace distlock::cli {

std::string runner_holder_info(const std::vector<std::string>& command) {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  std::string cmd;
  for (const auto& arg : command) {
    if (!cmd.empty()) cmd.push_back(' ');
    cmd += arg;
    if (cmd.size() > LockOptions::max_holder_info) break;
  }
  std::string out =
      "host=" + std::string(*host ? host : "?") + " pid=" + std::to_string(::getpid()) + " cmd=" + cmd;
  if (out.size() > LockOptions::max_holder_info) out.resize(LockOptions::max_holder_info);
  for (char& c : out) {
    if (c < 0x20 || c > 0x7e || c == '|') c = '?';
  }
  return out;
}

std::string waiting_line(std::size_t position, const WaiterInfo& ahead) {
  const std::size_t tens = position % 100;
  const char* suffix = tens >= 11 && tens <= 13 ? "th"
                       : position % 10 == 1     ? "st"
                       : position % 10 == 2     ? "nd"
                       : position % 10 == 3     ? "rd"
                                                : "th";
  std::string who = ahead.holder_info ? *ahead.holder_info : ahead.owner;
  if (who.empty()) who = "(unknown)";
  return "waiting: " + std::to_string(position) + suffix + " in line behind " +
         (position <= 1 ? "the holder " : "") + who;
}

std::int64_t unix_ms_now() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::uint64_t period_slot(Millis period, std::int64_t unix_ms) {
  if (period.count() <= 0 || unix_ms < 0) return 0;
  return static_cast<std::uint64_t>(unix_ms / period.count());
}

bool once_due(const std::optional<OnceMark>& mark, Millis period, std::int64_t fired_unix_ms) {
  if (!mark || mark->malformed) return true;
  const std::uint64_t slot = period_slot(period, fired_unix_ms);
  if (mark->fired_unix_ms >= 0) return period_slot(period, mark->fired_unix_ms) < slot;
  return mark->slot < slot;
}

std::string once_key(const std::string& name) {
  // The record "once" of NAME (Client::get_record/put_record store it under this key).
  return name +
         "\x1f"
         "once";
}

namespace {

template <class T>
bool parse_num(std::string_view s, T& out) {
  if (s.empty()) return false;
  auto [end, err] = std::from_chars(s.data(), s.data() + s.size(), out);
  return err == std::errc{} && end == s.data() + s.size();
}

constexpr std::string_view kOnceTag = "once";

/// Throws `e` again with its context in the tool's words: Client::get_record/put_record's
/// message begins `record "once" of "<name>"` and goes on with the cause, which is kept.
[[noreturn]] void rethrow_in_context(const std::system_error& e, const std::string& name,
                                     const std::string& what) {
  std::string text = e.what();
  const std::string tail = ": " + e.code().message();
  if (text.ends_with(tail)) text.resize(text.size() - tail.size());
  const std::string library = "record \"" + std::string(kOnceTag) + "\" of \"" + name.substr(0, 200) + "\"";
  text = text.starts_with(library) ? what + text.substr(library.size()) : what + ": " + text;
  throw std::system_error(e.code(), text);
}

}  // namespace

std::optional<OnceMark> read_once_mark(Client& client, const std::string& name) {
  std::optional<std::string> v;
  try {
    v = client.get_record(name, kOnceTag);
  } catch (const std::system_error& e) {
    rethrow_in_context(e, name, "cannot read the --once-per mark of lock \"" + name.substr(0, 200) + "\"");
  }
  if (!v) return std::nullopt;
  std::vector<std::string_view> fields;
  std::string_view rest(*v);
  for (std::size_t i = 0; i < 4; ++i) {
    const auto nl = rest.find('\n');
    fields.push_back(rest.substr(0, nl));
    if (nl == std::string_view::npos) break;
    rest.remove_prefix(nl + 1);
  }
  OnceMark m;
  const bool ok = fields.size() >= 3 && parse_num(fields[0], m.slot) && parse_num(fields[1], m.token) &&
                  parse_num(fields[2], m.unix_ms) && m.unix_ms >= 0 &&
                  (fields.size() < 4 || fields[3].empty() ||
                   (parse_num(fields[3], m.fired_unix_ms) && m.fired_unix_ms >= 0));
  if (!ok) {
    OnceMark bad;
    bad.malformed = true;
    return bad;
  }
  return m;
}

void write_once_mark(Client& client, const std::string& name, const OnceMark& mark) {
  const std::string value = std::to_string(mark.slot) + "\n" + std::to_string(mark.token) + "\n" +
                            std::to_string(mark.unix_ms) + "\n" + std::to_string(mark.fired_unix_ms);
  try {
    client.put_record(name, kOnceTag, value);
  } catch (const std::system_error& e) {
    rethrow_in_context(e, name, "cannot write the --once-per mark of lock \"" + name.substr(0, 200) + "\"");
  }
}

}  // namespace distlock::cli
