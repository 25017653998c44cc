// Sizes of the load tests' workloads for the build they run in.
//
// A sanitized build (AddressSanitizer + UndefinedBehaviorSanitizer, or ThreadSanitizer) runs
// every instrumented instruction several times slower and starts each process far more slowly
// (an ASan `distlock --version` takes about 0.4 s of CPU, mostly relocations of the
// instrumented library, against 0.05 s in the release tree). The uniqueness and model tests
// that generate hundreds of thousands of ids or thousands of random histories run their full
// count in the release tree (CI's step 1); in a sanitized tree they run a quarter of it, which
// drives the same code paths and leaves the sanitizers the same code to check.
//
// Thread-safety: constants only.
#pragma once

namespace distlock::testing {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitizedBuild = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kSanitizedBuild = true;
#else
inline constexpr bool kSanitizedBuild = false;
#endif
#else
inline constexpr bool kSanitizedBuild = false;
#endif

/// `full` in an uninstrumented build, a quarter of it (at least 1) in a sanitized one.
constexpr int workload_size(int full) {
  return kSanitizedBuild ? (full / 4 > 0 ? full / 4 : 1) : full;
}

}  // namespace distlock::testing
