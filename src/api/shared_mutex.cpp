#include "distlock/shared_mutex.hpp"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <vector>

#include "api/client_access.hpp"
#include "api/primitives.hpp"
#include "engine/backend.hpp"
#include "engine/engine.hpp"

namespace distlock {

using detail::Engine;
using detail::HeldLock;

namespace detail {

struct SharedMutexState {
  explicit SharedMutexState(Client c) : client(std::move(c)) {}
  Client client;
  std::string name;
  LockOptions opts;
  int readers = 0;
  std::string intent;
  std::vector<std::string> slots;
  std::string what;  // "read-write lock \"name\"" for messages
};

// A hold's loss flag: set (and its stop token fired) when ANY lease of the hold is
// lost. Shared with the loss callbacks, which may run after the hold is gone.
struct LossFlag {
  std::stop_source stop;
  std::atomic<bool> lost{false};
};

struct ReadWriteHold {
  std::string name;  // the read-write lock's
  bool exclusive = false;
  std::shared_ptr<HeldLock> intent;              // exclusive holds only
  std::vector<std::shared_ptr<HeldLock>> slots;  // exclusive: all R; shared: one
  std::shared_ptr<LossFlag> loss = std::make_shared<LossFlag>();

  bool owns() const noexcept {
    if (loss->lost.load(std::memory_order_acquire)) return false;
    if (exclusive && (!intent || !intent->owns())) return false;
    for (const auto& s : slots) {
      if (!s->owns()) return false;
    }
    return !slots.empty();
  }
};

}  // namespace detail

namespace {

using RwHold = detail::ReadWriteHold;

// Holds per (client, thread, name), shared by every SharedMutex handle: a second
// handle on the same name sees the first one's hold (so relocking is refused, never
// a self-deadlock). Key: thread owner id (client id + thread) '\0' name.
std::mutex g_holds_mu;
std::map<std::string, std::shared_ptr<RwHold>, std::less<>> g_holds;

std::string hold_key(const detail::SharedMutexState& st) {
  std::string key = detail::owner_for_this_thread(detail::engine_of(st.client)->client_id());
  key.push_back('\0');
  key.append(st.name);
  return key;
}

std::shared_ptr<RwHold> find_hold(const detail::SharedMutexState& st) {
  const std::string key = hold_key(st);
  std::lock_guard lk(g_holds_mu);
  auto it = g_holds.find(key);
  return it == g_holds.end() ? nullptr : it->second;
}

void watch_parts(Engine& engine, const RwHold& hold) {
  auto flag = hold.loss;
  auto on_loss = [flag] {
    flag->lost.store(true, std::memory_order_release);
    flag->stop.request_stop();
  };
  // Part of the loss signal: on the detecting thread, never behind user callbacks.
  if (hold.intent) engine.add_loss_signal(hold.intent, on_loss);
  for (const auto& s : hold.slots) engine.add_loss_signal(s, on_loss);
}

void release_all(Engine& engine, std::vector<std::shared_ptr<HeldLock>>& parts) noexcept {
  // Slots before the intent lock: readers woken by the intent lock's release then
  // find the slots free.
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
    if (!*it) continue;
    detail::Error ec;
    engine.release(*it, ec);  // a lost part was signalled already; a failed release expires by TTL
  }
  parts.clear();
}

// Takes the parts of a hold (not registered for any thread) and watches them for
// loss; nullptr with `ec` set when not taken.
std::shared_ptr<RwHold> acquire_hold(detail::SharedMutexState& st, bool exclusive, std::optional<Millis> wait,
                                     detail::Error& ec) {
  Engine& engine = *detail::engine_of(st.client);
  const auto& clock = engine.clock();
  const Clock::time_point start = clock->now();
  auto hold = std::make_shared<RwHold>();
  hold->exclusive = exclusive;
  if (exclusive) {
    // The remaining wait for each step, counted from the call.
    auto remaining = [&]() -> std::optional<Millis> {
      if (!wait) return std::nullopt;
      const auto left = std::chrono::ceil<Millis>(start + *wait - clock->now());
      return std::max(left, Millis(0));
    };
    hold->intent = engine.acquire(st.intent, st.opts, wait, ec);
    std::vector<std::shared_ptr<HeldLock>> parts;
    if (!ec) {
      parts.push_back(hold->intent);
      for (const auto& slot : st.slots) {
        auto s = engine.acquire(slot, st.opts, remaining(), ec);
        if (ec) break;
        parts.push_back(s);
        hold->slots.push_back(std::move(s));
      }
    }
    if (ec) {
      release_all(engine, parts);
      // A wait that ran out between steps is a timeout, even if the last step was
      // a single attempt (busy).
      if (ec == errc::busy && wait && wait->count() > 0) ec = make_error_code(errc::timeout);
    }
  } else {
    const std::size_t first = detail::random_start(st.slots.size());
    std::vector<std::string> order;
    order.reserve(st.slots.size());
    for (std::size_t i = 0; i < st.slots.size(); ++i)
      order.push_back(st.slots[(first + i) % st.slots.size()]);
    auto s = engine.acquire_any(order, st.opts, wait, ec, st.intent);
    if (!ec) hold->slots.push_back(std::move(s));
  }
  if (ec) return nullptr;
  hold->name = st.name;
  watch_parts(engine, *hold);
  return hold;
}

[[noreturn]] void throw_lock_error(const detail::Error& ec, const std::string& what, bool exclusive) {
  std::string msg = what + (exclusive ? " (exclusive)" : " (shared)");
  if (ec == errc::timeout) msg += ": not acquired in time";
  throw_error(ec, msg + ec.suffix());
}

}  // namespace

std::string SharedMutex::definition_key(std::string_view name) {
  return detail::names::rw_definition(name);
}
std::string SharedMutex::intent_lock_name(std::string_view name) {
  return detail::names::rw_writer(name);
}
std::string SharedMutex::slot_lock_name(std::string_view name, int i) {
  return detail::names::rw_reader(name, static_cast<std::size_t>(i));
}

SharedMutex::SharedMutex(Client client, std::string name, LockOptions opts, int max_readers)
    : state_(std::make_shared<detail::SharedMutexState>(std::move(client))) {
  auto& st = *state_;
  st.name = std::move(name);
  st.opts = opts;
  st.what = "read-write lock \"" + st.name.substr(0, 200) + "\"";
  detail::check_primitive_name("read-write lock", st.name, detail::names::kRwSuffixBytes);
  if (max_readers < 0 || max_readers > kMaxReaders) {
    throw_error(make_error_code(errc::invalid_argument), st.what + ": max_readers must be 1.." +
                                                             std::to_string(kMaxReaders) + ", not " +
                                                             std::to_string(max_readers));
  }
  if (auto ec = st.opts.validate_and_fill()) throw_error(ec, st.what + ": invalid lock options");
  st.readers = detail::define_size(*detail::engine_of(st.client), definition_key(st.name), max_readers,
                                   kDefaultMaxReaders, st.what, "reader slots");
  st.intent = intent_lock_name(st.name);
  st.slots.reserve(static_cast<std::size_t>(st.readers));
  for (int i = 0; i < st.readers; ++i) st.slots.push_back(slot_lock_name(st.name, i));
}

const std::string& SharedMutex::name() const noexcept {
  return state_->name;
}
int SharedMutex::max_readers() const noexcept {
  return state_->readers;
}

// Takes the lock for the calling thread. Returns false when busy (wait 0) or the
// wait ran out (`ec` says which); throws for every other error and for relocking.
bool SharedMutex::timed(bool exclusive, std::optional<Millis> wait) {
  auto& st = *state_;
  if (auto held = find_hold(st)) {
    if (exclusive && !held->exclusive) {
      throw_error(make_error_code(errc::invalid_argument),
                  "upgrade refused: this thread holds " + st.what +
                      " shared; call unlock_shared() first, then lock() (two readers upgrading at once "
                      "would wait for each other forever)");
    }
    throw_error(make_error_code(errc::invalid_argument), st.what + " is already held by this thread (" +
                                                             (held->exclusive ? "exclusive" : "shared") +
                                                             "); it is not reentrant");
  }
  detail::Error ec;
  auto hold = acquire_hold(st, exclusive, wait, ec);
  if (ec == errc::busy || ec == errc::timeout) return false;
  if (ec) throw_lock_error(ec, st.what, exclusive);
  std::lock_guard lk(g_holds_mu);
  g_holds[hold_key(st)] = std::move(hold);
  return true;
}

void SharedMutex::lock() {
  if (!timed(true, state_->opts.wait)) {
    throw_lock_error(
        make_error_code(state_->opts.wait && state_->opts.wait->count() <= 0 ? errc::busy : errc::timeout),
        state_->what, true);
  }
}

bool SharedMutex::try_lock() {
  return timed(true, Millis(0));
}

void SharedMutex::lock_shared() {
  if (!timed(false, state_->opts.wait)) {
    throw_lock_error(
        make_error_code(state_->opts.wait && state_->opts.wait->count() <= 0 ? errc::busy : errc::timeout),
        state_->what, false);
  }
}

bool SharedMutex::try_lock_shared() {
  return timed(false, Millis(0));
}

namespace {
std::shared_ptr<RwHold> take_hold(const detail::SharedMutexState& st, bool exclusive, const char* op) {
  const std::string key = hold_key(st);
  std::lock_guard lk(g_holds_mu);
  auto it = g_holds.find(key);
  if (it == g_holds.end()) {
    throw_error(make_error_code(errc::not_owner),
                std::string(op) + " of " + st.what + " by a thread that does not hold it");
  }
  if (it->second->exclusive != exclusive) {
    throw_error(make_error_code(errc::not_owner),
                std::string(op) + " of " + st.what + " by a thread that holds it " +
                    (exclusive ? "shared (use unlock_shared())" : "exclusively (use unlock())"));
  }
  auto hold = std::move(it->second);
  g_holds.erase(it);
  return hold;
}
}  // namespace

void SharedMutex::unlock() {
  auto hold = take_hold(*state_, true, "unlock");
  std::vector<std::shared_ptr<HeldLock>> parts{hold->intent};
  parts.insert(parts.end(), hold->slots.begin(), hold->slots.end());
  release_all(*detail::engine_of(state_->client), parts);
}

void SharedMutex::unlock_shared() {
  auto hold = take_hold(*state_, false, "unlock_shared");
  release_all(*detail::engine_of(state_->client), hold->slots);
}

void SharedMutex::downgrade() {
  auto& st = *state_;
  std::shared_ptr<RwHold> hold = find_hold(st);
  if (!hold || !hold->exclusive) {
    throw_error(make_error_code(errc::not_owner),
                "downgrade of " + st.what + " by a thread that does not hold it exclusively");
  }
  // Keep one slot (no writer can complete without it), give up the rest.
  const std::size_t keep = detail::random_start(hold->slots.size());
  std::vector<std::shared_ptr<HeldLock>> parts{hold->intent};
  for (std::size_t i = 0; i < hold->slots.size(); ++i) {
    if (i != keep) parts.push_back(hold->slots[i]);
  }
  auto kept = hold->slots[keep];
  {
    std::lock_guard lk(g_holds_mu);
    hold->exclusive = false;
    hold->intent.reset();
    hold->slots = {kept};
  }
  release_all(*detail::engine_of(st.client), parts);
}

std::uint64_t SharedMutex::token() const {
  auto hold = find_hold(*state_);
  if (!hold || !hold->exclusive) {
    throw_error(make_error_code(errc::not_owner),
                state_->what + " is not held exclusively by this thread (only a writer has a token)");
  }
  if (!hold->intent->has_token) {
    throw_error(make_error_code(errc::not_supported),
                "backend " + state_->client.url() + " issues no fencing tokens");
  }
  return hold->intent->token;
}

std::stop_token SharedMutex::stop_token() const {
  auto hold = find_hold(*state_);
  if (!hold) throw_error(make_error_code(errc::not_owner), state_->what + " is not held by this thread");
  return hold->loss->stop.get_token();
}

bool SharedMutex::owns() const noexcept {
  try {
    auto hold = find_hold(*state_);
    return hold && hold->owns();
  } catch (...) {
    return false;
  }
}

bool SharedMutex::owns_exclusive() const noexcept {
  try {
    auto hold = find_hold(*state_);
    return hold && hold->exclusive && hold->owns();
  } catch (...) {
    return false;
  }
}

bool SharedMutex::owns_shared() const noexcept {
  try {
    auto hold = find_hold(*state_);
    return hold && !hold->exclusive && hold->owns();
  } catch (...) {
    return false;
  }
}

ReadWriteLease SharedMutex::acquire_shared() {
  return acquire_lease(false);
}

ReadWriteLease SharedMutex::acquire_exclusive() {
  return acquire_lease(true);
}

ReadWriteLease SharedMutex::acquire_lease(bool exclusive) {
  auto& st = *state_;
  detail::Error ec;
  auto hold = acquire_hold(st, exclusive, st.opts.wait, ec);
  if (ec) throw_lock_error(ec, st.what, exclusive);
  return ReadWriteLease(detail::engine_of(st.client), std::move(hold));
}

// ---- ReadWriteLease ----------------------------------------------------------

ReadWriteLease::ReadWriteLease(std::shared_ptr<Engine> engine, std::shared_ptr<RwHold> hold) noexcept
    : engine_(std::move(engine)), hold_(std::move(hold)) {}

ReadWriteLease::ReadWriteLease(ReadWriteLease&& o) noexcept
    : engine_(std::move(o.engine_)), hold_(std::move(o.hold_)) {}

ReadWriteLease& ReadWriteLease::operator=(ReadWriteLease&& o) noexcept {
  if (this != &o) {
    std::error_code ec;
    release(ec);
    engine_ = std::move(o.engine_);
    hold_ = std::move(o.hold_);
  }
  return *this;
}

ReadWriteLease::~ReadWriteLease() {
  std::error_code ec;
  release(ec);
}

namespace {
// Every part of a hold, the intent lock first.
std::vector<std::shared_ptr<HeldLock>> parts_of(const RwHold& hold) {
  std::vector<std::shared_ptr<HeldLock>> parts;
  if (hold.intent) parts.push_back(hold.intent);
  parts.insert(parts.end(), hold.slots.begin(), hold.slots.end());
  return parts;
}
}  // namespace

bool ReadWriteLease::owns() const noexcept {
  return hold_ && hold_->owns();
}

bool ReadWriteLease::exclusive() const noexcept {
  return hold_ && hold_->exclusive;
}

const std::string& ReadWriteLease::name() const noexcept {
  static const std::string empty;
  return hold_ ? hold_->name : empty;
}

std::uint64_t ReadWriteLease::token() const {
  if (!hold_) throw_error(make_error_code(errc::not_owner), "empty read-write lease has no token");
  if (!hold_->exclusive) {
    throw_error(make_error_code(errc::not_supported), "read-write lock \"" + hold_->name.substr(0, 200) +
                                                          "\" is held shared: readers get no token");
  }
  if (!hold_->intent->has_token) {
    throw_error(make_error_code(errc::not_supported), "the backend issues no fencing tokens");
  }
  return hold_->intent->token;
}

bool ReadWriteLease::has_token() const noexcept {
  return hold_ && hold_->exclusive && hold_->intent && hold_->intent->has_token;
}

std::stop_token ReadWriteLease::stop_token() const noexcept {
  return hold_ ? hold_->loss->stop.get_token() : std::stop_token{};
}

void ReadWriteLease::on_lost(std::function<void()> fn) {
  if (!hold_) throw_error(make_error_code(errc::not_owner), "empty read-write lease");
  auto fired = std::make_shared<std::atomic<bool>>(false);
  auto shared_fn = std::make_shared<std::function<void()>>(std::move(fn));
  for (const auto& part : parts_of(*hold_)) {
    engine_->add_loss_callback(part, [fired, shared_fn] {
      if (!fired->exchange(true)) (*shared_fn)();
    });
  }
}

Millis ReadWriteLease::remaining() const noexcept {
  if (!owns()) return Millis(0);
  Millis least = Millis::max();
  for (const auto& part : parts_of(*hold_)) {
    const auto d = part->deadline();
    if (d == Clock::time_point::max()) continue;
    least = std::min(least, std::max(Millis(0), std::chrono::duration_cast<Millis>(d - part->clock->now())));
  }
  return least;
}

std::optional<Millis> ReadWriteLease::max_hold_remaining() const noexcept {
  if (!owns()) return std::nullopt;
  std::optional<Millis> least;
  for (const auto& part : parts_of(*hold_)) {
    const Clock::time_point limit = part->hold_limit();
    if (limit == Clock::time_point::max()) continue;
    const auto left = std::max(Millis(0), std::chrono::duration_cast<Millis>(limit - part->clock->now()));
    least = least ? std::min(*least, left) : left;
  }
  return least;
}

LossReason ReadWriteLease::loss_reason() const noexcept {
  if (!hold_) return LossReason::none;
  for (const auto& part : parts_of(*hold_)) {
    if (const auto r = part->public_reason(); r != LossReason::none) return r;
  }
  return LossReason::none;
}

std::string ReadWriteLease::loss_detail() const {
  if (!hold_) return {};
  for (const auto& part : parts_of(*hold_)) {
    if (part->public_reason() != LossReason::none) return part->public_detail();
  }
  return {};
}

void ReadWriteLease::release() {
  std::error_code ec;
  const std::string name = hold_ ? hold_->name : std::string();
  release(ec);
  if (ec) throw_error(ec, "release of read-write lock \"" + name.substr(0, 200) + "\"");
}

void ReadWriteLease::release(std::error_code& ec) noexcept {
  ec.clear();
  if (!hold_) return;
  auto hold = std::move(hold_);
  auto engine = std::move(engine_);
  // Slots before the intent lock (as unlock()); the first error is reported, a loss
  // before any other.
  auto parts = parts_of(*hold);
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
    detail::Error part_ec;
    engine->release(*it, part_ec);
    if (part_ec && (!ec || (part_ec == errc::lost && ec != errc::lost))) ec = part_ec;
  }
}

SharedMutex Client::shared_mutex(std::string_view name, const LockOptions& opts) {
  return SharedMutex(*this, std::string(name), opts, 0);
}

SharedMutex Client::shared_mutex(std::string_view name) {
  return shared_mutex(name, engine_->options().lock_defaults);
}

}  // namespace distlock
