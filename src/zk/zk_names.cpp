#include "zk/zk_names.hpp"

#include <algorithm>
#include <charconv>

namespace distlock::detail::zk {

namespace {

bool keep_byte(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;  // only upper-case is produced, so only upper-case is accepted
}

}  // namespace

std::string encode_component(std::string_view raw) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(raw.size());
  for (char ch : raw) {
    const auto c = static_cast<unsigned char>(ch);
    if (keep_byte(c)) {
      out.push_back(ch);
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0xF]);
    }
  }
  return out;
}

std::optional<std::string> decode_component(std::string_view enc) {
  std::string out;
  out.reserve(enc.size());
  for (std::size_t i = 0; i < enc.size(); ++i) {
    const auto c = static_cast<unsigned char>(enc[i]);
    if (c == '%') {
      if (i + 2 >= enc.size()) return std::nullopt;
      const int hi = hex_value(enc[i + 1]);
      const int lo = hex_value(enc[i + 2]);
      if (hi < 0 || lo < 0) return std::nullopt;
      out.push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    } else if (keep_byte(c)) {
      out.push_back(static_cast<char>(c));
    } else {
      return std::nullopt;
    }
  }
  return out;
}

std::string session_presence_path(std::int64_t session_id) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(kSessionsDir);
  out.push_back('/');
  auto v = static_cast<std::uint64_t>(session_id);
  for (int shift = 60; shift >= 0; shift -= 4) out.push_back(kHex[(v >> shift) & 0xF]);
  return out;
}

std::string lock_dir(std::string_view name) {
  std::string out(kRoot);
  out.push_back('/');
  out += encode_component(name);
  return out;
}

std::string make_guid(std::string_view owner, std::uint64_t attempt) {
  return encode_component(owner) + "." + std::to_string(attempt);
}

std::optional<std::string> owner_of_guid(std::string_view guid) {
  const auto dot = guid.rfind('.');
  if (dot == std::string_view::npos || dot == 0) return std::nullopt;
  return decode_component(guid.substr(0, dot));
}

std::optional<LockNode> parse_lock_node(std::string_view node) {
  const auto marker = node.rfind(kLockMarker);
  if (marker == std::string_view::npos || marker == 0) return std::nullopt;
  const std::string_view digits = node.substr(marker + kLockMarker.size());
  if (digits.empty()) return std::nullopt;
  std::uint64_t seq = 0;
  auto [end, err] = std::from_chars(digits.data(), digits.data() + digits.size(), seq);
  if (err != std::errc{} || end != digits.data() + digits.size()) return std::nullopt;
  return LockNode{std::string(node), std::string(node.substr(0, marker)), seq};
}

std::vector<LockNode> queue_order(const std::vector<std::string>& children) {
  std::vector<LockNode> out;
  out.reserve(children.size());
  for (const auto& c : children) {
    if (auto n = parse_lock_node(c)) out.push_back(std::move(*n));
  }
  std::sort(out.begin(), out.end(), [](const LockNode& a, const LockNode& b) { return a.seq < b.seq; });
  return out;
}

std::optional<std::string> name_of_node_path(std::string_view path) {
  const std::string prefix = std::string(kRoot) + "/";
  if (path.substr(0, prefix.size()) != prefix) return std::nullopt;
  std::string_view rest = path.substr(prefix.size());
  const auto slash = rest.find('/');
  if (slash == std::string_view::npos) return std::nullopt;
  return decode_component(rest.substr(0, slash));
}

std::string chroot_problem(std::string_view chroot) {
  if (chroot.empty() || chroot == "/") return {};
  if (chroot.front() != '/') return "must start with '/'";
  if (chroot.back() == '/') return "must not end with '/'";
  std::string_view rest = chroot.substr(1);
  while (!rest.empty()) {
    const auto slash = rest.find('/');
    const std::string_view part = rest.substr(0, slash);
    if (part.empty()) return "contains an empty path component (\"//\")";
    if (part == "." || part == "..") return "contains a \".\" or \"..\" component";
    for (char ch : part) {
      const auto c = static_cast<unsigned char>(ch);
      if (c < 0x20 || c == 0x7F) return "contains a control character";
    }
    rest = slash == std::string_view::npos ? std::string_view{} : rest.substr(slash + 1);
  }
  return {};
}

}  // namespace distlock::detail::zk
