#include "cli/job_guard.hpp"

#include <unistd.h>

#include <charconv>
#include <chrono>
#include <string_view>

#include "core/backend.hpp"
#include "core/engine.hpp"

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

std::int64_t unix_ms_now() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::uint64_t period_slot(Millis period, std::int64_t unix_ms) {
  if (period.count() <= 0 || unix_ms < 0) return 0;
  return static_cast<std::uint64_t>(unix_ms / period.count());
}

bool once_due(const std::optional<OnceMark>& mark, std::uint64_t fired_slot) {
  return !mark || mark->slot < fired_slot;
}

std::string once_key(const std::string& name) {
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

[[noreturn]] void record_error(Client& client, std::error_code ec, const std::string& what) {
  std::string msg = what;
  if (ec == errc::not_supported) msg += ": backend " + client.url() + " keeps no records";
  const std::string d = detail::take_error_detail();
  if (!d.empty()) msg += ": " + d;
  throw_error(ec, msg);
}

}  // namespace

std::optional<OnceMark> read_once_mark(Client& client, const std::string& name) {
  std::error_code ec;
  std::optional<std::string> v = client.engine()->backend().get_record(once_key(name), ec);
  if (ec) record_error(client, ec, "cannot read the --once-per mark of lock \"" + name.substr(0, 200) + "\"");
  if (!v) return std::nullopt;
  const std::string_view text(*v);
  const auto a = text.find('\n');
  const auto b = a == std::string_view::npos ? a : text.find('\n', a + 1);
  if (b == std::string_view::npos) return std::nullopt;
  OnceMark m;
  if (!parse_num(text.substr(0, a), m.slot) || !parse_num(text.substr(a + 1, b - a - 1), m.token) ||
      !parse_num(text.substr(b + 1), m.unix_ms)) {
    return std::nullopt;
  }
  return m;
}

void write_once_mark(Client& client, const std::string& name, const OnceMark& mark) {
  std::error_code ec;
  const std::string value =
      std::to_string(mark.slot) + "\n" + std::to_string(mark.token) + "\n" + std::to_string(mark.unix_ms);
  client.engine()->backend().put_record(once_key(name), value, detail::PutMode::always, ec);
  if (ec)
    record_error(client, ec, "cannot write the --once-per mark of lock \"" + name.substr(0, 200) + "\"");
}

}  // namespace distlock::cli
