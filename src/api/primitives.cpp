#include "api/primitives.hpp"

#include <charconv>
#include <random>

#include "distlock/error.hpp"
#include "engine/backend.hpp"
#include "engine/names.hpp"

namespace distlock::detail {

void check_primitive_name(std::string_view what, std::string_view name, std::size_t suffix_bytes) {
  if (const Error err = Engine::check_name(name)) throw_error(err, std::string(what) + ": " + err.detail());
  if (name.find(names::kSep) != std::string_view::npos) {
    throw_error(make_error_code(errc::invalid_argument),
                std::string(what) + " name contains the byte 0x1f, which marks the names of its locks");
  }
  if (name.size() + suffix_bytes > 4096) {
    throw_error(make_error_code(errc::invalid_argument),
                std::string(what) + " name is " + std::to_string(name.size()) + " bytes long; the limit is " +
                    std::to_string(4096 - suffix_bytes));
  }
}

int define_size(Engine& engine, const std::string& key, int requested, int fallback, const std::string& what,
                std::string_view unit) {
  if (engine.forked()) throw_error(make_error_code(errc::forked), what + ": client used in a forked child");
  Error ec;
  std::string stored;
  try {
    stored = engine.backend().put_record(key, std::to_string(requested > 0 ? requested : fallback),
                                         PutMode::if_absent, ec);
  } catch (const std::system_error& e) {
    ec = e.code();
  }
  if (ec == errc::not_supported) {
    throw_error(ec, what + ": backend " + engine.backend().url() + " keeps no records (the " +
                        std::string(unit) + " count is stored in one)");
  }
  if (ec) throw_error(ec, what + ": storing its " + std::string(unit) + " count" + ec.suffix());
  int n = 0;
  const auto [end, err] = std::from_chars(stored.data(), stored.data() + stored.size(), n);
  if (err != std::errc() || end != stored.data() + stored.size() || n < 1 || n > kMaxPrimitiveSize) {
    throw_error(make_error_code(errc::protocol_error),
                what + ": the stored " + std::string(unit) + " count \"" + stored.substr(0, 40) +
                    "\" is not a number in 1.." + std::to_string(kMaxPrimitiveSize));
  }
  if (requested > 0 && n != requested) {
    throw_error(make_error_code(errc::invalid_argument), what + " was defined with " + std::to_string(n) +
                                                             " " + std::string(unit) + "; asked for " +
                                                             std::to_string(requested));
  }
  return n;
}

std::size_t random_start(std::size_t n) {
  if (n <= 1) return 0;
  thread_local std::minstd_rand rng{std::random_device{}()};
  return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng);
}

}  // namespace distlock::detail
