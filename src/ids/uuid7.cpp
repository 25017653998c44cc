#include <pthread.h>

#include <atomic>
#include <cstring>
#include <mutex>

#include "distlock/error.hpp"
#include "distlock/ids.hpp"
#include "engine/owner_id.hpp"
#include "engine/thread_annotations.hpp"
#include "ids/random_pool.hpp"

namespace distlock::ids {

namespace detail {

std::uint64_t fork_generation() {
  return distlock::detail::fork_generation();  // one pthread_atfork counter for the library
}

void RandomPool::fill(std::uint8_t* out, std::size_t n) {
  const std::uint64_t generation = fork_generation();
  if (generation != fork_generation_ || buf_.size() - used_ < n) {
    distlock::detail::random_bytes(buf_.data(), buf_.size());
    used_ = 0;
    fork_generation_ = generation;
  }
  std::memcpy(out, buf_.data() + used_, n);
  used_ += n;
}

}  // namespace detail

// ---- Uuid -------------------------------------------------------------------------------

std::string Uuid::to_string() const {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(36);
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out.push_back('-');
    out.push_back(kHex[bytes[i] >> 4]);
    out.push_back(kHex[bytes[i] & 0x0f]);
  }
  return out;
}

Uuid Uuid::parse(std::string_view text) {
  auto fail = [&](const std::string& what) -> Uuid {
    throw_error(make_error_code(errc::invalid_argument),
                "UUID \"" + std::string(text.substr(0, 64)) + "\" " + what);
  };
  if (text.size() != 36) {
    return fail("has " + std::to_string(text.size()) + " characters; the canonical form has 36");
  }
  Uuid u;
  std::size_t byte = 0;
  for (std::size_t i = 0; i < text.size();) {
    if (i == 8 || i == 13 || i == 18 || i == 23) {
      if (text[i] != '-') return fail("lacks a '-' at position " + std::to_string(i + 1));
      ++i;
      continue;
    }
    auto nibble = [&](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      return -1;
    };
    const int hi = nibble(text[i]);
    const int lo = nibble(text[i + 1]);
    if (hi < 0 || lo < 0) {
      return fail("has a non-hex character at position " + std::to_string(hi < 0 ? i + 1 : i + 2));
    }
    u.bytes[byte++] = static_cast<std::uint8_t>(hi << 4 | lo);
    i += 2;
  }
  return u;
}

std::int64_t Uuid::unix_ms() const noexcept {
  std::int64_t ms = 0;
  for (int i = 0; i < 6; ++i) ms = ms << 8 | bytes[static_cast<std::size_t>(i)];
  return ms;
}

// ---- Uuid7Generator ---------------------------------------------------------------------

struct Uuid7Generator::Impl {
  std::shared_ptr<WallClock> clock;
  ::distlock::detail::AnnotatedMutex mu;
  std::int64_t last_ms DISTLOCK_GUARDED_BY(mu) = -1;  // the timestamp of the last UUID
  unsigned counter DISTLOCK_GUARDED_BY(mu) = 0;       // rand_a of the last UUID
  detail::RandomPool pool DISTLOCK_GUARDED_BY(mu);

  // A fresh counter for a new millisecond: random, but below 2048, so at least 2048
  // more UUIDs fit in the millisecond before the counter overflows (RFC 9562 6.2).
  unsigned fresh_counter() DISTLOCK_REQUIRES(mu) {
    std::uint8_t r[2];
    pool.fill(r, sizeof r);
    return (static_cast<unsigned>(r[0]) << 8 | r[1]) & 0x7ff;
  }
};

Uuid7Generator::Uuid7Generator(Uuid7Options opts) : impl_(std::make_unique<Impl>()) {
  impl_->clock = opts.clock ? std::move(opts.clock) : system_wall_clock();
}

Uuid7Generator::~Uuid7Generator() = default;

Uuid Uuid7Generator::next() {
  constexpr std::int64_t kMaxMs = (std::int64_t{1} << 48) - 1;
  Uuid u;
  {
    ::distlock::detail::LockGuard lk(impl_->mu);
    std::int64_t now = impl_->clock->now_ms();
    if (now < 0) now = 0;
    if (now > impl_->last_ms) {
      impl_->last_ms = now;
      impl_->counter = impl_->fresh_counter();
    } else if (++impl_->counter > 0xfff) {
      // Counter overflow, or the clock went back: run the timestamp ahead by one
      // millisecond rather than repeat or decrease (RFC 9562 6.2, method 1).
      if (impl_->last_ms >= kMaxMs) {
        throw_error(make_error_code(errc::exhausted), "UUIDv7 timestamp field is full");
      }
      ++impl_->last_ms;
      impl_->counter = impl_->fresh_counter();
    }
    const auto ms = static_cast<std::uint64_t>(impl_->last_ms);
    for (int i = 0; i < 6; ++i)
      u.bytes[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(ms >> (40 - 8 * i));
    u.bytes[6] = static_cast<std::uint8_t>(0x70 | (impl_->counter >> 8));
    u.bytes[7] = static_cast<std::uint8_t>(impl_->counter & 0xff);
    impl_->pool.fill(u.bytes.data() + 8, 8);
  }
  u.bytes[8] = static_cast<std::uint8_t>((u.bytes[8] & 0x3f) | 0x80);  // variant 0b10
  return u;
}

}  // namespace distlock::ids
