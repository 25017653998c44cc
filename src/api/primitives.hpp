// Shared pieces of the primitives built from ordinary engine locks (semaphore,
// read-write lock): the name check and the definition record that stores a
// primitive's size beside its locks. Their derived names: engine/names.hpp.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>

#include "engine/engine.hpp"
#include "engine/names.hpp"

namespace distlock::detail {

/// Validates the name of a primitive whose longest derived name adds `suffix_bytes`
/// bytes; throws std::system_error (errc::invalid_argument) naming the problem.
void check_primitive_name(std::string_view what, std::string_view name, std::size_t suffix_bytes);

/// The size of the primitive stored in the definition record `key` (created with
/// `requested` if absent, in one atomic step on the server). `requested` 0 means
/// "whatever is stored, else `fallback`". A stored size other than a non-zero
/// `requested` throws errc::invalid_argument naming both numbers. `what` names the
/// primitive in messages ("semaphore \"jobs\"") and `unit` its size ("permits").
int define_size(Engine& engine, const std::string& key, int requested, int fallback, const std::string& what,
                std::string_view unit);

/// The largest number of permits of a semaphore and of reader slots of a read-write lock.
inline constexpr int kMaxPrimitiveSize = 1024;

/// A random index in [0, n) (where a multi-name acquisition starts, to spread contention).
std::size_t random_start(std::size_t n);

}  // namespace distlock::detail
