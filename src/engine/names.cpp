#include "engine/names.hpp"

namespace distlock::detail::names {

namespace {

std::optional<std::uint32_t> parse_u32(std::string_view s) {
  if (s.empty() || s.size() > 9) return std::nullopt;
  std::uint32_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<std::uint32_t>(c - '0');
  }
  return v;
}

}  // namespace

std::string derived(std::string_view name, std::string_view kind, std::string_view detail) {
  std::string out;
  out.reserve(name.size() + kind.size() + detail.size() + 2);
  out.append(name);
  out.push_back(kSep);
  out.append(kind);
  if (!detail.empty()) {
    out.push_back(kSep);
    out.append(detail);
  }
  return out;
}

std::string semaphore_definition(std::string_view name) {
  return derived(name, kSemaphoreKind);
}
std::string semaphore_permit(std::string_view name, std::size_t index) {
  return derived(name, kSemaphoreKind, std::to_string(index));
}
std::string rw_definition(std::string_view name) {
  return derived(name, kReadWriteKind);
}
std::string rw_writer(std::string_view name) {
  return derived(name, kReadWriteKind, "w");
}
std::string rw_reader(std::string_view name, std::size_t index) {
  return derived(name, kReadWriteKind, std::to_string(index));
}
std::string election(std::string_view name) {
  return derived(name, kElectionKind);
}
std::string election_bell(std::string_view name) {
  return derived(name, kElectionKind, "bell");
}
std::string once_mark(std::string_view name) {
  return derived(name, "once");
}
std::string rw_exclusive_mark_name(std::string_view name) {
  return derived(name, "exclusive");
}

Decoded decode(std::string_view name) {
  Decoded d;
  d.base = name;
  const auto first = name.find(kSep);
  if (first == std::string_view::npos || first == 0) return d;
  const std::string_view rest = name.substr(first + 1);
  const auto second = rest.find(kSep);
  const std::string_view kind = rest.substr(0, second);
  const bool has_detail = second != std::string_view::npos;
  const std::string_view detail = has_detail ? rest.substr(second + 1) : std::string_view();
  if (kind == kElectionKind && !has_detail) {
    d.kind = LockKind::election;
  } else if (kind == kSemaphoreKind && has_detail && parse_u32(detail)) {
    d.kind = LockKind::semaphore_permit;
    d.index = parse_u32(detail);
  } else if (kind == kReadWriteKind && has_detail && detail == "w") {
    d.kind = LockKind::rw_writer;
  } else if (kind == kReadWriteKind && has_detail && parse_u32(detail)) {
    d.kind = LockKind::rw_reader;
    d.index = parse_u32(detail);
  } else {
    return d;  // not a name this library derives: a plain lock with a \x1f in it
  }
  d.base = name.substr(0, first);
  return d;
}

std::string definition_of(const Decoded& d) {
  if (d.kind == LockKind::semaphore_permit) return semaphore_definition(d.base);
  if (d.kind == LockKind::rw_reader) return rw_definition(d.base);
  return {};
}

std::string display(const Decoded& d, std::optional<std::uint32_t> of) {
  std::string out;
  switch (d.kind) {
    case LockKind::lock: return "lock";
    case LockKind::election: return "election";
    case LockKind::rw_writer: return "rw writer";
    case LockKind::semaphore_permit: out = "semaphore permit " + std::to_string(d.index.value_or(0)); break;
    case LockKind::rw_reader: out = "rw reader slot " + std::to_string(d.index.value_or(0)); break;
  }
  if (of) out += " of " + std::to_string(*of);
  return out;
}

std::string_view primitive_of(std::string_view name) noexcept {
  return name.substr(0, name.find(kSep));
}

std::string printable(std::string_view name) {
  std::string out;
  for (char c : name.substr(0, 200)) {
    if (c == kSep) {
      out += "\\x1f";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

}  // namespace distlock::detail::names
