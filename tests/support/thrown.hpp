// What a call throws, for the tests that check an error's code or its message:
//
//   code_of(f, what = nullptr)   the code of the std::system_error `f()` throws (its what() in
//                                *what when given); an empty code when it throws none
//   message_of(f)                the what() of the std::system_error `f()` throws; "" when none
//
// Any other exception passes through (the test fails with it).
// Thread-safety: each call uses only its arguments.
#pragma once

#include <string>
#include <system_error>

namespace distlock::testing {

template <class F>
std::error_code code_of(F&& f, std::string* what = nullptr) {
  try {
    f();
  } catch (const std::system_error& e) {
    if (what) *what = e.what();
    return e.code();
  }
  return {};
}

template <class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const std::system_error& e) {
    return e.what();
  }
  return {};
}

}  // namespace distlock::testing
