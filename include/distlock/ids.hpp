// distlock/ids.hpp — globally unique, increasing ids: three generators and their decoders.
//
// Four schemes, each a class with a thread-safe `next()`:
//
//   RedisDailyGenerator  the seed layout, 64 bits:
//                          | 0 | 31 bits: seconds since epoch | 32 bits: per-day counter |
//                        the counter is INCR (or INCRBY n, see `reserve`) on the Redis key
//                        `icr:<prefix>:<yyyy:MM:dd>` (UTC date). Unique across every process
//                        that talks to the same Redis; ~one round trip per `reserve` ids.
//   SnowflakeGenerator   64 bits: | 0 | 41 bits: ms since epoch | 10 bits: worker | 12 bits: seq |
//                        the worker id is LEASED through any distlock backend (the lock
//                        `idgen:<prefix>:worker:<n>`), so two live generators never share one,
//                        and a MARK beside it (redis://, file://, memory://) makes each new
//                        holder start above every id its predecessor could issue.
//                        No round trip per id: up to 4096 ids per millisecond per worker.
//   SegmentGenerator     ids from a database row (Leaf "segment" mode) on postgres:// or
//                        mysql://: a row per tag holds max_id and step; a generator takes
//                        the range (max_id, max_id + step] in one transaction and hands it
//                        out from memory, fetching the next range in the background when
//                        10 % is left. One round trip per `step` ids; plain 1, 2, 3, ...
//   Uuid7Generator       RFC 9562 UUIDv7: 48 bits of Unix ms, a 12-bit counter in rand_a
//                        (monotonic within a generator), 62 random bits from the OS CSPRNG.
//                        No coordination at all.
//
// Every generator reads an injectable `WallClock` (milliseconds of UTC wall time). The lock
// engine's `distlock::Clock` is steady and cannot be used here: ids carry calendar time.
//
// Ids from one generator strictly increase (a 64-bit id numerically; a UUID by its bytes,
// which is also its text order). Across generators they are unique but only roughly ordered.
//
// Errors are `std::system_error` in `distlock::category()`:
//   errc::exhausted               a day's counter reached 2^32, all 1024 worker ids are leased,
//                                 the timestamp field is full (year 2090 with the default epoch),
//                                 or a segment's max_id would pass 2^63 - 1
//   errc::lost                    the snowflake worker lease was lost, or its mark was taken
//                                 over by another holder; call `relet()`
//   errc::forked                  used in a child after fork(): make a new generator there
//   errc::clock_moved_backwards   the wall clock went back further than `max_backward`
//   errc::backend_unavailable, errc::auth_failed, errc::invalid_url, errc::invalid_argument
//
// Thread-safety: every generator may be shared by any number of threads (`next()` takes an
// internal mutex). The decoders are pure functions.
//
// Example:
//   auto client = distlock::connect("redis://127.0.0.1:6379");
//   distlock::ids::SnowflakeGenerator orders(client, {.prefix = "orders"});
//   std::uint64_t id = orders.next();                  // no round trip; <= 4096 ids per ms
//   auto parts = distlock::ids::decode_snowflake(id);  // {unix_ms, worker, sequence}
//
//   distlock::ids::RedisDailyGenerator daily("redis://127.0.0.1:6379", {.prefix = "order", .reserve = 1000});
//   std::uint64_t seed_style = daily.next();           // one INCRBY per 1000 ids
//
//   distlock::ids::SegmentGenerator orders_seq("postgres://app:pw@db:5432/shop", {.tag = "orders"});
//   std::uint64_t plain = orders_seq.next();           // 1, 2, 3, ...: one round trip per 1000
//
//   distlock::ids::Uuid7Generator uuids;
//   std::string text = uuids.next().to_string();       // "01937c5e-...-7..."
#pragma once

#include "distlock/config.hpp"
#include "distlock/export.hpp"

// Installed with the other headers whether or not this build has the component; without it
// the declarations below would compile and then fail to link, so say so here instead.
#if !DISTLOCK_HAS_IDS
#error "distlock was built without the ids component (DISTLOCK_WITH_IDS=OFF): check DISTLOCK_HAS_IDS"
#endif

#include <array>
#include <chrono>
#include <compare>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <system_error>

#include "distlock/client.hpp"
#include "distlock/options.hpp"

namespace distlock::ids {

/// 2022-06-12T00:00:00Z, the seed document's epoch, in seconds since the Unix epoch.
inline constexpr std::int64_t kDefaultEpochSeconds = 1654992000;

// ---- wall clock -------------------------------------------------------------------------

/// UTC wall time in milliseconds, injectable for tests (a clock that jumps back, a frozen
/// millisecond). Implementations must be safe to call from any thread.
class DISTLOCK_EXPORT WallClock {
 public:
  virtual ~WallClock() = default;
  /// Milliseconds since 1970-01-01T00:00:00Z.
  virtual std::int64_t now_ms() const = 0;
  /// Blocks until `now_ms()` is probably >= `target_ms`. May return early; callers loop.
  virtual void sleep_until_ms(std::int64_t target_ms) const = 0;
};

/// std::chrono::system_clock (CLOCK_REALTIME), process-wide.
DISTLOCK_EXPORT std::shared_ptr<WallClock> system_wall_clock();

// ---- redis-daily ------------------------------------------------------------------------

struct DISTLOCK_EXPORT RedisDailyOptions {
  /// Key namespace: the counter key is `icr:<prefix>:<yyyy:MM:dd>`. Default "id". Must be
  /// non-empty, at most 256 bytes, without NUL, CR or LF.
  std::string prefix = "id";
  /// Epoch of the 31-bit seconds field. Default 2022-06-12T00:00:00Z; ids run out 2^31 s
  /// (68 years) later. Must be in [0, now].
  std::int64_t epoch_seconds = kDefaultEpochSeconds;
  /// Ids taken from Redis per round trip: 1 means one INCR per id; n > 1 means one
  /// INCRBY n, then n ids handed out locally (unused ones of a reservation are skipped
  /// forever, never reissued). Default 1. Must be in [1, 2^20].
  std::uint32_t reserve = 1;
  /// Default: system_wall_clock().
  std::shared_ptr<WallClock> clock{};
  /// Connect / per-command timeouts (a `timeout=` in the URL overrides both). Default 2 s.
  Millis connect_timeout{std::chrono::seconds(2)};
  Millis command_timeout{std::chrono::seconds(2)};
};

/// The two fields of a redis-daily id.
struct DISTLOCK_EXPORT RedisDailyParts {
  std::int64_t unix_seconds = 0;  ///< when it was issued (UTC seconds since 1970)
  std::uint32_t counter = 0;      ///< the day counter's value (1 for the day's first id)
  auto operator<=>(const RedisDailyParts&) const = default;
};

/// Splits a redis-daily id. Throws errc::invalid_argument if the sign bit is set.
DISTLOCK_EXPORT RedisDailyParts decode_redis_daily(std::uint64_t id,
                                                   std::int64_t epoch_seconds = kDefaultEpochSeconds);
/// The inverse of decode (exposed for tests and tools). Throws errc::invalid_argument if the
/// time is before the epoch or beyond the 31-bit field.
DISTLOCK_EXPORT std::uint64_t encode_redis_daily(RedisDailyParts parts,
                                                 std::int64_t epoch_seconds = kDefaultEpochSeconds);
/// The counter key for a UTC day: "icr:<prefix>:<yyyy:MM:dd>".
DISTLOCK_EXPORT std::string redis_daily_key(std::string_view prefix, std::int64_t unix_seconds);

/// The seed document's generator over one Redis server.
class DISTLOCK_EXPORT RedisDailyGenerator {
 public:
  /// Connects to `redis_url` (redis://[user:password@]host:port[/db][?timeout=DUR]).
  /// Throws errc::invalid_url, errc::invalid_argument, errc::backend_unavailable,
  /// errc::auth_failed. Reconnects by itself after a server restart.
  explicit RedisDailyGenerator(std::string_view redis_url, RedisDailyOptions opts = {});
  ~RedisDailyGenerator();
  RedisDailyGenerator(const RedisDailyGenerator&) = delete;
  RedisDailyGenerator& operator=(const RedisDailyGenerator&) = delete;

  /// The next id. Throws errc::exhausted when today's counter reached 2^32 (never a
  /// wrapped id), errc::backend_unavailable when Redis cannot be reached.
  std::uint64_t next();
  std::uint64_t next(std::error_code& ec) noexcept;

  /// Round trips to Redis so far (for tests and benchmarks).
  std::uint64_t round_trips() const noexcept;
  const RedisDailyOptions& options() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---- snowflake --------------------------------------------------------------------------

inline constexpr unsigned kSnowflakeWorkers = 1024;        ///< 10 bits
inline constexpr unsigned kSnowflakeSequencePerMs = 4096;  ///< 12 bits

struct DISTLOCK_EXPORT SnowflakeOptions {
  /// Worker-id locks are named `idgen:<prefix>:worker:<n>`. Default "default". Generators
  /// with different prefixes have independent worker-id spaces (and may collide with each
  /// other's ids: use one prefix per id space).
  std::string prefix = "default";
  /// Epoch of the 41-bit millisecond field (69 years). Default 2022-06-12T00:00:00Z.
  std::int64_t epoch_ms = kDefaultEpochSeconds * 1000;
  /// A wall clock that went back by at most this much is waited out; further back is
  /// errc::clock_moved_backwards (no id is issued). Default 5 ms. Must be in [0, 10 s].
  Millis max_backward{5};
  /// How far ahead of the clock the worker mark reserves time (see docs/ids.md): the
  /// generator writes "ids up to now + mark_ahead may be issued" beside its worker lock,
  /// renews that every mark_ahead / 2 while issuing (one round trip, under the internal
  /// mutex), and stops at the reserved time if it cannot. A later holder of the worker id
  /// starts above the mark. Default 1 s. Must be in [10 ms, 60 s].
  Millis mark_ahead{1000};
  /// Lease settings for the worker-id lock (ttl, safety margin, renew interval); `wait` is
  /// ignored (one attempt per worker id). Default: 30 s ttl, renewed every 10 s.
  LockOptions lease{};
  /// Default: system_wall_clock().
  std::shared_ptr<WallClock> clock{};
};

/// The three fields of a snowflake id.
struct DISTLOCK_EXPORT SnowflakeParts {
  std::int64_t unix_ms = 0;
  unsigned worker = 0;
  unsigned sequence = 0;
  auto operator<=>(const SnowflakeParts&) const = default;
};

/// Splits a snowflake id. Throws errc::invalid_argument if the sign bit is set.
DISTLOCK_EXPORT SnowflakeParts decode_snowflake(std::uint64_t id,
                                                std::int64_t epoch_ms = kDefaultEpochSeconds * 1000);

/// Snowflake ids with a worker id leased through a distlock backend.
class DISTLOCK_EXPORT SnowflakeGenerator {
 public:
  /// Leases the first free worker id: try_acquire of `idgen:<prefix>:worker:<n>` for
  /// n = 0..1023. Throws errc::exhausted (all 1024 leased), errc::invalid_argument, or the
  /// backend's error (errc::backend_unavailable, ...).
  explicit SnowflakeGenerator(Client client, SnowflakeOptions opts = {});
  ~SnowflakeGenerator();
  SnowflakeGenerator(const SnowflakeGenerator&) = delete;
  SnowflakeGenerator& operator=(const SnowflakeGenerator&) = delete;

  /// The next id. Throws errc::lost once the worker lease is lost (until `relet()`),
  /// errc::clock_moved_backwards, errc::exhausted (timestamp field full). Waits for the
  /// next millisecond when 4096 ids were issued in this one.
  std::uint64_t next();
  std::uint64_t next(std::error_code& ec) noexcept;

  /// Fills `out` with consecutive ids (the same as `out.size()` calls of `next()`, in
  /// order) under one lock and one clock reading per millisecond used: for bulk inserts.
  /// Same errors as `next()`; on an error some of `out` may have been filled and those
  /// ids are simply never used.
  void next_batch(std::span<std::uint64_t> out);

  /// Leases a worker id again after a loss (the first free one; possibly another number).
  /// Ids keep increasing across the change. Same errors as the constructor.
  void relet();

  /// The leased worker id (the last one, if the lease was lost).
  unsigned worker_id() const;
  /// True while the worker lease is held and within its local deadline.
  bool leased() const;
  /// Fires when the current worker lease is lost.
  std::stop_token stop_token() const;
  const SnowflakeOptions& options() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---- segment ----------------------------------------------------------------------------

/// Largest step a segment generator asks for.
inline constexpr std::int64_t kMaxSegmentStep = 1'000'000'000;

struct DISTLOCK_EXPORT SegmentOptions {
  /// The business tag: the row of `distlock_segments` whose counter this generator
  /// draws from. Generators of one tag share one id space (unique among them); tags are
  /// independent. Required: 1..128 bytes of printable ASCII without spaces.
  std::string tag;
  /// Ids per range (one database round trip each): 0 takes the row's `step` column
  /// (1000 for a row this generator creates), so an administrator's
  /// `UPDATE distlock_segments SET step = ...` applies to every generator of the tag;
  /// a positive value is used instead of the row's. In [0, kMaxSegmentStep]. Default 0.
  /// A change (set_step, or the row's) takes effect at the next range taken.
  std::int64_t step = 0;
  /// Connect / per-statement timeouts (a `timeout=` in the URL overrides both). Default 2 s.
  Millis connect_timeout{std::chrono::seconds(2)};
  Millis command_timeout{std::chrono::seconds(2)};
};

/// Ids from a database segment (Meituan Leaf's "segment" mode), for ids that are plain
/// small integers, dense, roughly ordered across generators and strictly increasing
/// within one, from the database the service already trusts.
///
/// The table `distlock_segments` (tag, max_id, step, updated_at) in the URL's database
/// (PostgreSQL: public.distlock_segments; MySQL/MariaDB: `database`.distlock_segments)
/// is created at first use. Taking a range is one transaction that adds the step to
/// max_id and commits before the range (old max_id, new max_id] is used, so:
///   - ids are unique across every generator and process of a tag (ranges never overlap);
///   - a generator that dies (SIGKILL, a crash) loses what is left of its ranges, which
///     are never issued by anyone (gaps, never repeats), also across a server restart
///     (the commit is durable: synchronous_commit / innodb_flush_log_at_trx_commit = 1);
///   - one generator's ids strictly increase.
/// Double buffering: when 10 % of the current range is left a background thread takes
/// the next one, so callers wait for the database only when a whole range was used up
/// before the next arrived (a slow or stopped server stalls no caller while ids remain).
///
/// Thread-safety: `next()` may be called from any number of threads (an internal
/// mutex). In a child after fork() every call fails with errc::forked (the range is the
/// parent's): make a new generator in the child.
///
/// Example (tests/ids/segment_test.cpp runs it):
///   distlock::ids::SegmentGenerator orders("mysql://app:pw@db:3306/shop", {.tag = "orders", .step = 1000});
///   std::uint64_t id = orders.next();   // from memory; one round trip per 1000 ids
class DISTLOCK_EXPORT SegmentGenerator {
 public:
  /// Connects to `url` (postgres://, postgresql:// or mysql://, with `?timeout=DUR`),
  /// creates the table if it is missing, and takes the first range. Throws
  /// errc::invalid_argument (tag, step), errc::invalid_url (another scheme, no
  /// database), errc::auth_failed (wrong password, a user that may not write the table),
  /// errc::backend_unavailable (no server within the timeouts), errc::exhausted.
  SegmentGenerator(std::string_view url, SegmentOptions opts);
  ~SegmentGenerator();
  SegmentGenerator(const SegmentGenerator&) = delete;
  SegmentGenerator& operator=(const SegmentGenerator&) = delete;

  /// The next id (>= 1). Waits for the database only when the current range is used
  /// up and the next one has not arrived. Throws errc::backend_unavailable /
  /// errc::auth_failed when that range cannot be taken (the next call tries again),
  /// errc::exhausted, errc::forked, errc::protocol_error (the row's max_id went back
  /// below an id this generator issued: someone edited it).
  std::uint64_t next();
  std::uint64_t next(std::error_code& ec) noexcept;

  /// Ids per range from the next range taken on (0: the row's step); options().step
  /// reports it from then on. Throws errc::invalid_argument outside [0, kMaxSegmentStep]
  /// (nothing changes). Not to be called while another thread reads options().
  void set_step(std::int64_t step);

  /// Ranges taken from the database so far (one round trip each), for tests and benchmarks.
  std::uint64_t round_trips() const noexcept;
  const SegmentOptions& options() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---- uuid7 ------------------------------------------------------------------------------

/// A 128-bit UUID, compared by its bytes (for UUIDv7 that is time order).
struct DISTLOCK_EXPORT Uuid {
  std::array<std::uint8_t, 16> bytes{};

  /// Canonical 8-4-4-4-12 lower-case text.
  std::string to_string() const;
  /// Parses the canonical form (either case). Throws errc::invalid_argument naming the problem.
  static Uuid parse(std::string_view text);

  unsigned version() const noexcept { return bytes[6] >> 4; }
  /// The variant field's top two bits (0b10 for RFC 9562 UUIDs).
  unsigned variant_bits() const noexcept { return bytes[8] >> 6; }
  /// UUIDv7: the 48-bit Unix millisecond timestamp.
  std::int64_t unix_ms() const noexcept;
  /// UUIDv7: the 12-bit rand_a field (this library's per-millisecond counter).
  unsigned rand_a() const noexcept { return (static_cast<unsigned>(bytes[6] & 0x0f) << 8) | bytes[7]; }

  auto operator<=>(const Uuid&) const = default;
};

struct DISTLOCK_EXPORT Uuid7Options {
  /// Default: system_wall_clock().
  std::shared_ptr<WallClock> clock{};
};

/// RFC 9562 UUIDv7 with the "fixed-length dedicated counter" method (section 6.2, method 1):
/// rand_a is a 12-bit counter that starts at a random value below 2048 in each new
/// millisecond and is incremented within one; when it overflows the timestamp is advanced by
/// one millisecond ahead of the clock, and a clock that goes back is ignored (the
/// generator's timestamp never decreases), so ids from one generator strictly increase.
/// rand_b (62 bits) comes from getrandom(2).
class DISTLOCK_EXPORT Uuid7Generator {
 public:
  explicit Uuid7Generator(Uuid7Options opts = {});
  ~Uuid7Generator();
  Uuid7Generator(const Uuid7Generator&) = delete;
  Uuid7Generator& operator=(const Uuid7Generator&) = delete;

  Uuid next();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace distlock::ids
