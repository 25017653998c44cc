// Parsed backend URL: scheme://[user[:password]@]host[:port][,host[:port]...][/path][?k=v&...]
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "distlock/options.hpp"
#include "engine/backend_error.hpp"

namespace distlock::detail {

struct Url {
  struct Host {
    std::string host;        // without brackets for IPv6 literals
    std::uint16_t port = 0;  // 0 when absent
  };

  std::string scheme;    // lower-case
  std::string user;      // percent-decoded
  std::string password;  // percent-decoded
  bool has_userinfo = false;
  std::vector<Host> hosts;
  std::string path;                          // percent-decoded, starts with '/' or is empty
  std::map<std::string, std::string> query;  // percent-decoded
  std::string original;
  // Where the parser found the user info in `original` (npos when absent): it starts at
  // `userinfo_begin`, its ':' is at `password_begin - 1` (npos: no ':'), its '@' at `userinfo_end`.
  std::size_t userinfo_begin = std::string::npos;
  std::size_t password_begin = std::string::npos;
  std::size_t userinfo_end = std::string::npos;

  /// The URL for messages, logs and status output, masked as redact_url_text() masks
  /// it: from the first ':' after "://" to the last '@' (from "://" when an '@' comes
  /// before that ':' or there is none: people write redis://PASSWORD@host). That covers the password the
  /// parser took and any text an unencoded '@' followed by '/' or '?' pushed into the
  /// path or the query. Never contains the password.
  std::string redacted() const;
  std::string query_or(const std::string& key, std::string fallback) const;
};

/// Parses `text`. On failure returns errc::invalid_url whose detail names the offending
/// part (e.g. "port \"99999\" in \"redis://h:99999\" is out of range").
/// The detail never contains the password: the URL and every part of it it quotes are masked
/// from the first ':' after "://" (from "://" when an '@' comes before it) to the last '@'
/// (a superset of any password the text could hold, even when it does not parse).
Error parse_url(std::string_view text, Url& out);

/// The text of a URL that may not parse, masked for a message as parse_url's errors are.
std::string redact_url_text(std::string_view text);

/// Where redact_url_text would mask: [first, second) of `text`, empty when there is
/// nothing that could be a password.
std::pair<std::size_t, std::size_t> url_secret_range(std::string_view text);

/// `text` with its password set to `password` (percent-encoded; the user, if any, is
/// kept). invalid_url (with a masked detail) if `text` does not parse.
Error url_with_password(std::string_view text, std::string_view password, std::string& out);

/// `text` without its password (and without an '@' left with no user). The rest of the
/// text is unchanged. invalid_url (with a masked detail) if `text` does not parse.
Error url_without_password(std::string_view text, std::string& out);

/// `message` with every fragment of `url` that may be secret replaced by "***": the
/// text redact_url_text() masks (raw and percent-decoded), each of its pieces between
/// '@', '/', '?', '#', '&', '=', ':' and ',' (raw and decoded), the password and, when
/// the user info has no ':', the user (it may be a password written alone). Fragments
/// shorter than 3 characters are not searched for (they would mask ordinary words).
/// For every error text that may quote a part of the URL or echo a server's words
/// about it (a role or a database the server does not know).
std::string scrub_secrets(std::string_view message, const Url& url);

/// Parses a duration "250ms", "10s", "2m", "1h", "1500" (milliseconds). False if malformed.
bool parse_duration(std::string_view text, Millis& out);

/// Applies `?timeout=` (if any) to the client options; returns invalid_url naming it if malformed.
Error apply_common_query(const Url& url, ClientOptions& opts);

}  // namespace distlock::detail
