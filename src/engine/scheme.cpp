#include "engine/scheme.hpp"

#include <charconv>

#include "distlock/error.hpp"

namespace distlock::detail {

namespace {

Error invalid_query(std::string msg) {
  return {make_error_code(errc::invalid_url), std::move(msg)};
}

std::string quoted_bounded(std::string_view s) {
  // Values are user text: keep the message on one line and bounded.
  std::string out = "\"";
  for (char c : s.substr(0, 200)) out += (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) ? '?' : c;
  if (s.size() > 200) out += "...";
  return out + "\"";
}

std::string describe_duration(Millis d) {
  using namespace std::chrono;
  if (d.count() % 3'600'000 == 0) return std::to_string(d.count() / 3'600'000) + "h";
  if (d.count() % 60'000 == 0) return std::to_string(d.count() / 60'000) + "m";
  if (d.count() % 1000 == 0) return std::to_string(d.count() / 1000) + "s";
  return std::to_string(d.count()) + "ms";
}

std::optional<bool> parse_flag(std::string_view v) {
  if (v == "1" || v == "true" || v == "yes") return true;
  if (v == "0" || v == "false" || v == "no") return false;
  return std::nullopt;
}

std::optional<unsigned> parse_count(std::string_view v) {
  unsigned n = 0;
  auto [p, e] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (v.empty() || e != std::errc{} || p != v.data() + v.size()) return std::nullopt;
  return n;
}

bool is_choice(std::string_view choices, std::string_view v) {
  while (!choices.empty()) {
    const auto bar = choices.find('|');
    if (choices.substr(0, bar) == v) return true;
    if (bar == std::string_view::npos) break;
    choices.remove_prefix(bar + 1);
  }
  return false;
}

std::string comma_list(std::string_view choices) {
  std::string out(choices);
  for (std::size_t i = 0; (i = out.find('|', i)) != std::string::npos;) out.replace(i, 1, ", ");
  return out;
}

const QueryKey* find_key(const Scheme& scheme, std::string_view name) {
  for (const QueryKey& k : scheme.keys) {
    if (k.name == name) return &k;
  }
  return nullptr;
}

std::string known_keys(const Scheme& scheme) {
  std::string out;
  for (const QueryKey& k : scheme.keys) {
    if (k.tls_only && !scheme.tls) continue;
    if (!out.empty()) out += ", ";
    out += k.name;
  }
  return out;
}

// `text` as lines of at most `width` bytes (a longer word stays whole), each indented.
std::string wrapped(std::string_view text, std::string_view indent, std::size_t width = 72) {
  std::string out, line;
  while (!text.empty()) {
    const auto space = text.find(' ');
    const std::string_view word = text.substr(0, space);
    text = space == std::string_view::npos ? std::string_view{} : text.substr(space + 1);
    if (!line.empty() && line.size() + 1 + word.size() > width) {
      out += std::string(indent) + line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + std::string(word);
  }
  if (!line.empty()) out += std::string(indent) + line + "\n";
  return out;
}

const char* type_name(const QueryKey& k) {
  switch (k.type) {
    case QueryType::text: return "text";
    case QueryType::duration: return "duration";
    case QueryType::flag: return "true|false";
    case QueryType::count: return "count";
    case QueryType::choice: return "choice";
    case QueryType::file: return "file";
  }
  return "text";
}

}  // namespace

const Scheme* scheme_named(std::span<const Scheme> schemes, std::string_view name) noexcept {
  for (const Scheme& s : schemes) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

Error check_query(const Scheme& scheme, const Url& url) {
  const std::string shown = "\"" + url.redacted() + "\"";
  for (const auto& [name, value] : url.query) {
    const QueryKey* key = find_key(scheme, name);
    if (key == nullptr) {
      const std::string known = known_keys(scheme);
      return invalid_query("unknown query parameter " + quoted_bounded(name) + " in URL " + shown + " (" +
                           std::string(scheme.name) + ":// knows " + (known.empty() ? "none" : known) + ")");
    }
    if (key->tls_only && !scheme.tls) {
      return invalid_query("query parameter " + quoted_bounded(name) + " in URL " + shown +
                           " is a TLS setting: write " + std::string(scheme.tls_scheme) + "://");
    }
    const std::string head = std::string(key->name) + " " + quoted_bounded(value) + " in URL " + shown;
    switch (key->type) {
      case QueryType::text: break;
      case QueryType::duration: {
        Millis d{};
        if (!parse_duration(value, d) || d.count() <= 0) {
          return invalid_query(head + " is not a positive duration like 500ms or 2s");
        }
        if (d > key->max)
          return invalid_query(head + " is above the maximum of " + describe_duration(key->max));
        break;
      }
      case QueryType::flag:
        if (!parse_flag(value)) return invalid_query(head + " is not one of true, false, 1, 0, yes, no");
        break;
      case QueryType::count: {
        const auto n = parse_count(value);
        if (!n || *n > key->max_count) {
          return invalid_query(head + " is not a whole number in 0-" + std::to_string(key->max_count));
        }
        break;
      }
      case QueryType::choice:
        if (!is_choice(key->choices, value)) {
          return invalid_query(head + " is not one of " + comma_list(key->choices));
        }
        break;
      case QueryType::file:
        if (value.empty()) return invalid_query(head + " is empty; it names a file");
        break;
    }
  }
  return {};
}

std::optional<Millis> query_duration(const Url& url, std::string_view key) {
  const auto it = url.query.find(std::string(key));
  Millis d{};
  if (it == url.query.end() || !parse_duration(it->second, d)) return std::nullopt;
  return d;
}

std::optional<bool> query_flag(const Url& url, std::string_view key) {
  const auto it = url.query.find(std::string(key));
  return it == url.query.end() ? std::nullopt : parse_flag(it->second);
}

std::optional<unsigned> query_count(const Url& url, std::string_view key) {
  const auto it = url.query.find(std::string(key));
  return it == url.query.end() ? std::nullopt : parse_count(it->second);
}

std::string describe_schemes(std::span<const Scheme> schemes, bool with_keys) {
  std::string out;
  for (const Scheme& s : schemes) {
    if (s.name == "memory") continue;  // the in-process test store
    out += std::string(s.form) + "\n" + wrapped(s.summary, "    ");
    if (!with_keys) continue;
    for (const QueryKey& k : s.keys) {
      if (k.tls_only && !s.tls) continue;
      std::string line = "    ?" + std::string(k.name) + "=";
      line += k.type == QueryType::choice ? comma_list(k.choices) : type_name(k);
      if (k.type == QueryType::duration) line += " (max " + describe_duration(k.max) + ")";
      if (k.type == QueryType::count) line += " (0-" + std::to_string(k.max_count) + ")";
      if (!k.fallback.empty()) line += ", default " + std::string(k.fallback);
      out += line + "\n" + wrapped(k.meaning, "        ");
    }
    out += "\n";
  }
  if (with_keys && !out.empty()) out.pop_back();
  return out;
}

}  // namespace distlock::detail
