// api/client_access.hpp — the library's own way from a public Client to its engine.
//
// Client::engine() used to be public; the engine is an internal type (hidden in
// libdistlock.so), so the parts of distlock that are built on it — the primitives, the id
// generators, the CLI and the tests — use these instead. They are compiled into the library's
// objects and its static test library (distlock_testing), not exported to users.
//
// Thread-safety: as Client's members (the engine pointer never changes after connect).
//
// Example:
//   detail::Engine& engine = *detail::engine_of(client);
//   distlock::Client wrapped = distlock::connect_with_engine(make_test_engine());
#pragma once

#include <memory>
#include <utility>

#include "distlock/client.hpp"

namespace distlock {
namespace detail {

struct ClientAccess {
  static const std::shared_ptr<Engine>& engine(const Client& client) noexcept { return client.engine_; }
  static Client wrap(std::shared_ptr<Engine> engine) noexcept { return Client(std::move(engine)); }
};

/// The engine behind `client` (never null for a connected client).
inline const std::shared_ptr<Engine>& engine_of(const Client& client) noexcept {
  return ClientAccess::engine(client);
}

}  // namespace detail

/// Wraps an engine made by hand (tests with a fake backend).
inline Client connect_with_engine(std::shared_ptr<detail::Engine> engine) {
  return detail::ClientAccess::wrap(std::move(engine));
}

}  // namespace distlock
