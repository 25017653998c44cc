// The public text helpers (distlock/text.hpp): the rules the engine and the URL parser
// apply, exposed without their internals.
#include "distlock/text.hpp"

#include "distlock/error.hpp"
#include "engine/engine.hpp"
#include "engine/url.hpp"

namespace distlock {

std::error_code validate_name(std::string_view name, std::string& message) {
  detail::Error err = detail::Engine::check_name(name);
  if (err) message = err.take_detail();
  return err;
}

void validate_name(std::string_view name) {
  std::string why;
  if (auto ec = validate_name(name, why)) throw std::system_error(ec, why);
}

std::optional<Millis> parse_duration(std::string_view text) {
  Millis out{};
  if (!detail::parse_duration(text, out)) return std::nullopt;
  return out;
}

std::string redact_url(std::string_view url) {
  return detail::redact_url_text(url);
}

std::pair<std::size_t, std::size_t> url_secret_range(std::string_view url) {
  return detail::url_secret_range(url);
}

std::string url_scheme(std::string_view url) {
  detail::Url parsed;
  if (const detail::Error err = detail::parse_url(url, parsed)) throw std::system_error(err, err.detail());
  return parsed.scheme;
}

std::string url_with_password(std::string_view url, std::string_view password) {
  std::string out;
  if (const detail::Error err = detail::url_with_password(url, password, out)) {
    throw std::system_error(err, err.detail());
  }
  return out;
}

std::string url_without_password(std::string_view url) {
  std::string out;
  if (const detail::Error err = detail::url_without_password(url, out))
    throw std::system_error(err, err.detail());
  return out;
}

}  // namespace distlock
