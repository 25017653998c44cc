#include "engine/url.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <vector>

#include "distlock/error.hpp"

namespace distlock::detail {

namespace {

Error bad(std::string msg) {
  return {make_error_code(errc::invalid_url), std::move(msg)};
}

int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool percent_decode(std::string_view in, std::string& out) {
  out.clear();
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '%') {
      const int hi = i + 1 < in.size() ? hexval(in[i + 1]) : -1;
      const int lo = i + 2 < in.size() ? hexval(in[i + 2]) : -1;
      if (hi < 0 || lo < 0) return false;
      out.push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    } else {
      out.push_back(in[i]);
    }
  }
  return true;
}

std::string quoted(std::string_view s) {
  // Built by appending: GCC 12 at -O3 reports a false -Wrestrict for "\"" + std::string(s).
  std::string out;
  out.reserve(s.size() + 2);
  out.push_back('"');
  out.append(s);
  out.push_back('"');
  return out;
}

/// The part of a URL's text that could be a password whatever the parse makes of it:
/// from the first ':' after the authority's start to the last '@' (from the authority's
/// start when an '@' comes before that ':', or there is none). Empty (begin == end) when
/// there is no '@'.
struct Mask {
  std::size_t begin = 0;
  std::size_t end = 0;
};

std::size_t authority_start(std::string_view text) {
  const auto sep = text.find("://");
  if (sep == std::string_view::npos || sep == 0) return 0;
  for (char c : text.substr(0, sep)) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '+' && c != '-' && c != '.') return 0;
  }
  return sep + 3;
}

Mask secret_mask(std::string_view text) {
  const std::size_t start = authority_start(text);
  const auto at = text.rfind('@');
  if (at == std::string_view::npos || at < start) return {};
  // The first ':' separates a user from its password only when no '@' comes before it:
  // in "PASSWORD@host:1/x@y" it is the port's, and the text before it is the secret.
  const auto colon = text.find(':', start);
  const auto first_at = text.find('@', start);
  if (colon != std::string_view::npos && colon < first_at) return {colon + 1, at};
  return {start, at};
}

/// `part` (a view into `text`) with whatever lies inside `m` replaced by "***".
std::string masked(std::string_view text, Mask m, std::string_view part) {
  const auto from = static_cast<std::size_t>(part.data() - text.data());
  const auto to = from + part.size();
  if (m.begin == m.end || to <= m.begin || from >= m.end) return std::string(part);
  std::string out;
  if (from < m.begin) out.append(text.substr(from, m.begin - from));
  out.append("***");
  if (to > m.end) out.append(text.substr(m.end, to - m.end));
  return out;
}

void percent_encode(std::string_view in, std::string& out) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (unsigned char c : in) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0xf]);
    }
  }
}

}  // namespace

std::pair<std::size_t, std::size_t> url_secret_range(std::string_view text) {
  const Mask m = secret_mask(text);
  return {m.begin, m.end};
}

std::string redact_url_text(std::string_view text) {
  return masked(text, secret_mask(text), text);
}

std::string Url::redacted() const {
  return redact_url_text(original);
}

std::string scrub_secrets(std::string_view message, const Url& url) {
  std::vector<std::string> secrets;
  auto add = [&](std::string_view raw) {
    if (raw.size() >= 3) secrets.emplace_back(raw);
    std::string decoded;
    if (percent_decode(raw, decoded) && decoded.size() >= 3 && decoded != raw) secrets.push_back(decoded);
  };
  const Mask m = secret_mask(url.original);
  if (m.begin != m.end) {
    const std::string_view range = std::string_view(url.original).substr(m.begin, m.end - m.begin);
    add(range);
    std::size_t from = 0;
    for (std::size_t i = 0; i <= range.size(); ++i) {
      if (i == range.size() || std::string_view("@/?#&=:,").find(range[i]) != std::string_view::npos) {
        add(range.substr(from, i - from));
        from = i + 1;
      }
    }
  }
  if (url.password.size() >= 3) secrets.push_back(url.password);
  if (url.has_userinfo && url.password_begin == std::string::npos && url.user.size() >= 3) {
    secrets.push_back(url.user);
  }
  // Longest first: a piece never leaves part of a longer fragment it lies in.
  std::sort(secrets.begin(), secrets.end(),
            [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  std::string out(message);
  for (const auto& s : secrets) {
    for (std::size_t p = 0; (p = out.find(s, p)) != std::string::npos;) {
      out.replace(p, s.size(), "***");
      p += 3;
    }
  }
  return out;
}

std::string Url::query_or(const std::string& key, std::string fallback) const {
  auto it = query.find(key);
  return it == query.end() ? std::move(fallback) : it->second;
}

namespace {

/// The URL being parsed and how errors quote it: every message quotes the URL and its
/// parts through show(), which masks whatever could be the password, so no error path
/// can print it.
struct UrlText {
  std::string_view text;
  Mask mask;
  std::string whole;  // show(text)
  std::string show(std::string_view part) const { return quoted(masked(text, mask, part)); }
};

/// The scheme (text before "://"), lower-cased into `out`.
Error parse_scheme(const UrlText& t, std::string_view scheme, std::string& out) {
  for (char c : scheme) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '+' && c != '-' && c != '.') {
      return bad("scheme " + t.show(scheme) + " in URL " + t.whole + " is malformed");
    }
    out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  return {};
}

/// The query (after '?'): key=value pairs split on '&', percent-decoded.
Error parse_query(const UrlText& t, std::string_view qs, std::map<std::string, std::string>& out) {
  while (!qs.empty()) {
    const auto amp = qs.find('&');
    std::string_view kv = qs.substr(0, amp);
    qs = amp == std::string_view::npos ? std::string_view{} : qs.substr(amp + 1);
    if (kv.empty()) continue;
    const auto eq = kv.find('=');
    std::string k, v;
    if (!percent_decode(kv.substr(0, eq), k) ||
        (eq != std::string_view::npos && !percent_decode(kv.substr(eq + 1), v))) {
      return bad("query parameter " + t.show(kv) + " in URL " + t.whole + " has a bad %-escape");
    }
    if (k.empty()) return bad("query parameter " + t.show(kv) + " in URL " + t.whole + " has no name");
    out[k] = v;
  }
  return {};
}

/// The user info `ui` (before the authority's last '@'), which starts at offset `begin`
/// of the URL's text.
Error parse_userinfo(const UrlText& t, std::string_view ui, std::size_t begin, Url& out) {
  out.has_userinfo = true;
  out.userinfo_begin = begin;
  out.userinfo_end = begin + ui.size();
  const auto colon = ui.find(':');
  if (colon != std::string_view::npos) out.password_begin = out.userinfo_begin + colon + 1;
  if (!percent_decode(ui.substr(0, colon), out.user) ||
      (colon != std::string_view::npos && !percent_decode(ui.substr(colon + 1), out.password))) {
    out.password.clear();
    return bad("user info in URL " + t.whole + " has a bad %-escape");
  }
  return {};
}

/// One entry `hp` of the host list: host, [IPv6] or either with ":port".
Error parse_host(const UrlText& t, std::string_view hp, Url::Host& h) {
  std::string_view host_text;
  std::string_view port_text;
  if (hp.front() == '[') {
    const auto close = hp.find(']');
    if (close == std::string_view::npos)
      return bad("IPv6 host " + t.show(hp) + " in URL " + t.whole + " lacks ']'");
    host_text = hp.substr(1, close - 1);
    std::string_view after = hp.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return bad("garbage " + t.show(after) + " after host in URL " + t.whole);
      port_text = after.substr(1);
    }
  } else {
    const auto colon = hp.rfind(':');
    host_text = hp.substr(0, colon);
    if (colon != std::string_view::npos) port_text = hp.substr(colon + 1);
    if (colon != std::string_view::npos && hp.substr(0, colon).find(':') != std::string_view::npos) {
      return bad("host " + t.show(hp) + " in URL " + t.whole +
                 " has several ':' (write IPv6 as [addr]:port)");
    }
  }
  if (host_text.empty()) return bad("empty host name in " + t.show(hp) + " of URL " + t.whole);
  for (std::size_t i = 0; i < host_text.size(); ++i) {
    const char c = host_text[i];
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' || c == ':')) {
      return bad("host " + t.show(host_text) + " in URL " + t.whole + " contains " +
                 t.show(host_text.substr(i, 1)));
    }
  }
  h.host = std::string(host_text);
  if (!port_text.empty() || (hp.back() == ':')) {
    unsigned v = 0;
    auto [p, e] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), v);
    if (port_text.empty() || e != std::errc{} || p != port_text.data() + port_text.size()) {
      return bad("port " + t.show(port_text) + " in URL " + t.whole + " is not a number");
    }
    if (v == 0 || v > 65535)
      return bad("port " + t.show(port_text) + " in URL " + t.whole + " is out of range 1-65535");
    h.port = static_cast<std::uint16_t>(v);
  }
  return {};
}

}  // namespace

Error parse_url(std::string_view text, Url& out) {
  out = Url{};
  out.original = std::string(text);
  const Mask mask = secret_mask(text);
  const UrlText t{text, mask, quoted(masked(text, mask, text))};
  const auto sep = text.find("://");
  if (sep == std::string_view::npos || sep == 0) {
    return bad("URL " + t.whole + " has no scheme (expected scheme://..., e.g. redis://127.0.0.1:6379)");
  }
  if (Error err = parse_scheme(t, text.substr(0, sep), out.scheme)) return err;
  std::string_view rest = text.substr(sep + 3);

  // Query.
  if (auto q = rest.find('?'); q != std::string_view::npos) {
    const std::string_view qs = rest.substr(q + 1);
    rest = rest.substr(0, q);
    if (Error err = parse_query(t, qs, out.query)) return err;
  }

  // Authority and path.
  std::string_view authority = rest;
  if (auto slash = rest.find('/'); slash != std::string_view::npos) {
    authority = rest.substr(0, slash);
    if (!percent_decode(rest.substr(slash), out.path)) {
      return bad("path " + t.show(rest.substr(slash)) + " in URL " + t.whole + " has a bad %-escape");
    }
  }
  if (auto at = authority.rfind('@'); at != std::string_view::npos) {
    const std::string_view ui = authority.substr(0, at);
    authority = authority.substr(at + 1);
    if (Error err = parse_userinfo(t, ui, sep + 3, out)) return err;
  }
  while (!authority.empty()) {
    const auto comma = authority.find(',');
    std::string_view hp = authority.substr(0, comma);
    authority = comma == std::string_view::npos ? std::string_view{} : authority.substr(comma + 1);
    if (hp.empty()) return bad("empty host in host list of URL " + t.whole);
    Url::Host h;
    if (Error err = parse_host(t, hp, h)) return err;
    out.hosts.push_back(std::move(h));
  }
  return {};
}

Error url_with_password(std::string_view text, std::string_view password, std::string& out) {
  Url url;
  if (Error err = parse_url(text, url)) return err;
  std::string encoded(1, ':');
  percent_encode(password, encoded);
  const std::string& o = url.original;
  if (!url.has_userinfo) {
    const std::size_t at = authority_start(o);
    out = o.substr(0, at) + encoded + "@" + o.substr(at);
  } else {
    const std::size_t user_end =
        url.password_begin == std::string::npos ? url.userinfo_end : url.password_begin - 1;
    out = o.substr(0, user_end) + encoded + o.substr(url.userinfo_end);
  }
  return {};
}

Error url_without_password(std::string_view text, std::string& out) {
  Url url;
  if (Error err = parse_url(text, url)) return err;
  const std::string& o = url.original;
  if (!url.has_userinfo || url.password_begin == std::string::npos) {
    out = o;
  } else if (url.user.empty() && url.password_begin == url.userinfo_begin + 1) {
    out = o.substr(0, url.userinfo_begin) + o.substr(url.userinfo_end + 1);  // ":pw@" goes whole
  } else {
    out = o.substr(0, url.password_begin - 1) + o.substr(url.userinfo_end);
  }
  return {};
}

bool parse_duration(std::string_view text, Millis& out) {
  if (text.empty()) return false;
  std::size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  if (i == 0) return false;
  long long v = 0;
  auto [p, e] = std::from_chars(text.data(), text.data() + i, v);
  if (e != std::errc{}) return false;
  const std::string_view unit = text.substr(i);
  long long mult = 0;
  if (unit.empty() || unit == "ms")
    mult = 1;
  else if (unit == "s")
    mult = 1000;
  else if (unit == "m")
    mult = 60'000;
  else if (unit == "h")
    mult = 3'600'000;
  else
    return false;
  if (v > (1LL << 40) / mult) return false;
  out = Millis(v * mult);
  return true;
}

Error apply_common_query(const Url& url, ClientOptions& opts) {
  if (auto it = url.query.find("timeout"); it != url.query.end()) {
    Millis d{};
    if (!parse_duration(it->second, d) || d.count() <= 0) {
      return bad("timeout " + quoted(it->second) + " in URL " + url.redacted() +
                 " is not a positive duration like 500ms or 2s");
    }
    opts.connect_timeout = d;
    opts.command_timeout = d;
  }
  return {};
}

}  // namespace distlock::detail
