// The two ways every id generator's next() reports a failure, written once: next() throws
// the distlock error (std::system_error) with the generator's message, next(ec) returns its
// code and never throws. `f(id)` makes one id and returns a detail::Error (the code and the
// sentence naming the cause).
#pragma once

#include <cstdint>
#include <exception>
#include <string>
#include <system_error>

#include "distlock/error.hpp"
#include "engine/backend_error.hpp"

namespace distlock::ids::detail {

template <class F>
std::uint64_t next_or_throw(F&& f) {
  std::uint64_t id = 0;
  if (const distlock::detail::Error err = f(id)) throw_error(err, err.detail());
  return id;
}

/// 0 and `ec` set on failure; an exception thrown inside `f` becomes its code
/// (errc::protocol_error for one that is not a std::system_error).
template <class F>
std::uint64_t next_or_code(std::error_code& ec, F&& f) noexcept {
  std::uint64_t id = 0;
  try {
    ec = f(id);
  } catch (const std::system_error& e) {
    ec = e.code();
  } catch (...) {
    ec = make_error_code(errc::protocol_error);
  }
  return ec ? 0 : id;
}

}  // namespace distlock::ids::detail
