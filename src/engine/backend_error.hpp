// The one error type a backend call returns: the code the caller sees and the sentence
// that names the server and the cause ("creating the lock node failed at zk://...:
// connection loss"). Every Backend call and every Engine call that can fail takes one.
//
// It *is* a std::error_code, so the many transport helpers that only ever set a code
// keep taking `std::error_code&` and are handed an Error unchanged; the few places
// that know the cause say it with `fail()` or `set_detail()`. The detail travels with
// the call that failed, never beside it: no thread-local, nothing left over for the
// next call to pick up by mistake.
//
// Thread-safety: a value type; one per call, owned by the caller.
//
// Example:
//   detail::Error err;
//   backend.release(name, owner, token, err);
//   if (err) throw_error(err, "release of \"" + name + "\"" + err.suffix());
#pragma once

#include <string>
#include <system_error>
#include <utility>

#include "distlock/error.hpp"

namespace distlock::detail {

class Error : public std::error_code {
 public:
  Error() = default;
  Error(std::error_code code, std::string detail = {})  // NOLINT(google-explicit-constructor)
      : std::error_code(code), detail_(std::move(detail)) {}

  /// Setting a code keeps a detail said before it: the cause is often known first.
  Error& operator=(std::error_code code) noexcept {
    std::error_code::operator=(code);
    return *this;
  }

  /// Both halves at once.
  void fail(std::error_code code, std::string detail) {
    std::error_code::operator=(code);
    detail_ = std::move(detail);
  }
  void fail(errc code, std::string detail) { fail(make_error_code(code), std::move(detail)); }
  void set_detail(std::string detail) { detail_ = std::move(detail); }

  /// Clears the code and the detail.
  void clear() noexcept {
    std::error_code::clear();
    detail_.clear();
  }

  /// "" or the sentence naming the server and the cause.
  const std::string& detail() const noexcept { return detail_; }
  /// The detail, leaving none behind (a caller that reuses one Error for several calls).
  std::string take_detail() noexcept { return std::exchange(detail_, {}); }
  /// ": <detail>", or "" when there is none: for appending to "what failed".
  std::string suffix() const { return detail_.empty() ? std::string() : ": " + detail_; }

 private:
  std::string detail_;
};

}  // namespace distlock::detail
