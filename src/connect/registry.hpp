// How a URL becomes a backend: the list of the schemes this build has, made of the
// backends' own entries (src/<backend>/<backend>_scheme.hpp, chosen by DISTLOCK_HAS_<NAME>
// in distlock/config.hpp). connect() (src/api/client.cpp) checks a URL against its
// scheme's entry here before the backend's factory sees it; `distlock urls` prints the
// list. Nothing below src/connect/ includes this header: a backend checks a URL against
// its own entry (engine/scheme.hpp).
//
// Thread-safety: the list is built once, at first use; every function is safe from any thread.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <system_error>

#include "engine/backend.hpp"
#include "engine/scheme.hpp"
#include "engine/url.hpp"

namespace distlock::detail {

/// Every scheme this build has, in the order `distlock urls` lists them.
std::span<const Scheme> all_schemes() noexcept;
/// The scheme called `name` (lower-case, as parse_url leaves it), or nullptr.
const Scheme* find_scheme(std::string_view name) noexcept;
/// The factory of scheme `scheme`, or nullptr when this build has no such scheme.
BackendFactory find_backend(std::string_view scheme);
/// "file, redis, ..." for an unknown-scheme message.
std::string known_schemes();
/// Checks the query of `url` against its scheme's keys (check_query); {} for a scheme
/// this build does not have (connect() reports that itself).
Error check_url_query(const Url& url);
/// Every scheme with its form and its keys (type, default, meaning), for `distlock urls`.
std::string describe_schemes(bool with_keys = true);

}  // namespace distlock::detail
