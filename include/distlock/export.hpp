// distlock/export.hpp — which declarations libdistlock.so exports.
//
// The library is built with hidden visibility (-fvisibility=hidden
// -fvisibility-inlines-hidden): only what the public headers mark DISTLOCK_EXPORT is in the
// shared object's dynamic symbol table, so the engine and the backends (namespace detail) can
// change without changing the ABI, the dynamic linker has fewer symbols to resolve, and a
// program cannot come to depend on an internal by accident. DISTLOCK_NO_EXPORT hides a
// member of an exported class that only the library itself calls (a constructor taking
// internal types). The macros only carry attributes: including this header has no effect on
// a program's behaviour, and it is safe to include from any thread's code.
//
// Example (not compiled; a public declaration in include/distlock/):
//   class DISTLOCK_EXPORT Lease { ... };
//   DISTLOCK_EXPORT std::string default_url();
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define DISTLOCK_EXPORT __attribute__((visibility("default")))
#define DISTLOCK_NO_EXPORT __attribute__((visibility("hidden")))
#else
#define DISTLOCK_EXPORT
#define DISTLOCK_NO_EXPORT
#endif
