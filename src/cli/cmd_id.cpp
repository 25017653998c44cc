// `distlock id`: print globally unique ids (redis-daily, snowflake, segment, uuid7) or decode one.
//
//   distlock id [--url URL] [--scheme redis-daily|snowflake|segment|uuid7] [--prefix P] [-n COUNT]
//               [--tag TAG] [--step N] [--epoch SECONDS] [--local-only] [--decode ID]
//
// Exit 0 ok; 64 usage (bad flag, URL, an ID that does not parse, snowflake on a host-local
// URL without --local-only); 69 lock service or Redis unreachable / authentication failed;
// 74 writing the ids failed; 70 anything else (all worker ids leased, a day's counter
// exhausted, the clock moved backwards). Ids issued before an error are printed first.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "cli/commands.hpp"
#include "distlock/client.hpp"
#include "distlock/ids.hpp"

namespace distlock::cli {

namespace {

struct IdFlags {
  std::string url;
  std::string scheme = "snowflake";
  std::optional<std::string> prefix;
  std::string tag;
  std::int64_t step = 0;
  long long count = 1;
  std::int64_t epoch_seconds = ids::kDefaultEpochSeconds;
  std::optional<std::string> decode;
  bool local_only = false;
};

// EX_IOERR: the ids could not be written (a full disk, a closed pipe reader).
constexpr int kExitIoError = 74;

// Largest reservation the tool asks Redis for at once: a single call printing n ids
// takes min(n, this) per round trip, so nearly no counter values are left unused.
constexpr long long kMaxReservation = 10'000;

[[noreturn]] void usage_error(const std::string& message) {
  throw_error(make_error_code(errc::invalid_argument), message);
}

// "2026-11-22T02:13:20.123Z"
std::string iso8601_ms(std::int64_t unix_ms) {
  using namespace std::chrono;
  const auto tp = sys_time<milliseconds>(milliseconds(unix_ms));
  const auto day = floor<days>(tp);
  const year_month_day ymd{day};
  const hh_mm_ss<milliseconds> t{tp - day};
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z", static_cast<int>(ymd.year()),
                     static_cast<unsigned>(ymd.month()), static_cast<unsigned>(ymd.day()), t.hours().count(),
                     t.minutes().count(), t.seconds().count(), t.subseconds().count());
}

std::uint64_t parse_u64(const std::string& text, const std::string& scheme) {
  std::uint64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || ptr != end) {
    usage_error(fmt::format("--decode \"{}\" is not a decimal 64-bit {} id", text, scheme));
  }
  return v;
}

std::string decode_line(const IdFlags& f) {
  const std::string& text = *f.decode;
  if (f.scheme == "segment") {
    usage_error("segment ids are plain numbers taken from a database row: there is nothing to --decode");
  }
  if (f.scheme == "snowflake") {
    const auto p = ids::decode_snowflake(parse_u64(text, f.scheme), f.epoch_seconds * 1000);
    return fmt::format("time={} unix_ms={} worker={} sequence={}", iso8601_ms(p.unix_ms), p.unix_ms, p.worker,
                       p.sequence);
  }
  if (f.scheme == "redis-daily") {
    const auto p = ids::decode_redis_daily(parse_u64(text, f.scheme), f.epoch_seconds);
    return fmt::format(
        "time={} unix_seconds={} counter={} key={}", iso8601_ms(p.unix_seconds * 1000), p.unix_seconds,
        p.counter, ids::redis_daily_key(f.prefix.value_or(ids::RedisDailyOptions{}.prefix), p.unix_seconds));
  }
  const ids::Uuid u = ids::Uuid::parse(text);
  if (u.version() != 7 || u.variant_bits() != 0b10) {
    usage_error(fmt::format("--decode \"{}\" is not an RFC 9562 UUIDv7 (version {}, variant bits {})", text,
                            u.version(), u.variant_bits()));
  }
  return fmt::format("time={} unix_ms={} version=7 counter={}", iso8601_ms(u.unix_ms()), u.unix_ms(),
                     u.rand_a());
}

// Writes `buf` to stdout and flushes; throws std::system_error (generic category) on a
// write error.
void write_out(const std::string& buf) {
  errno = 0;
  const bool ok = std::fwrite(buf.data(), 1, buf.size(), stdout) == buf.size() && std::fflush(stdout) == 0;
  if (!ok || std::ferror(stdout)) {
    throw std::system_error(std::error_code(errno != 0 ? errno : EIO, std::generic_category()),
                            "writing ids to standard output");
  }
}

// Prints `count` lines made by `next`, buffered (a million ids is one write per 64 KiB).
// When `next` fails, the ids already made are printed before the error propagates: they
// were issued and will never be issued again.
template <class Next>
void print_ids(long long count, Next&& next) {
  std::string buf;
  buf.reserve(1 << 16);
  try {
    for (long long i = 0; i < count; ++i) {
      buf += next();
      buf.push_back('\n');
      if (buf.size() > (1 << 16) - 64) {
        write_out(buf);
        buf.clear();
      }
    }
  } catch (const std::system_error& e) {
    if (e.code().category() != std::generic_category()) {
      try {
        write_out(buf);
      } catch (const std::system_error&) {  // the generator's error is the one to report
      }
    }
    throw;
  }
  write_out(buf);
}

void generate(const IdFlags& f) {
  if (f.scheme == "uuid7") {
    ids::Uuid7Generator gen;
    print_ids(f.count, [&] { return gen.next().to_string(); });
    return;
  }
  if (f.scheme == "snowflake") {
    ids::SnowflakeOptions o;
    if (f.prefix) o.prefix = *f.prefix;
    o.epoch_ms = f.epoch_seconds * 1000;
    Client client = connect(f.url, tool_client_options());
    const std::string scheme = client.scheme();
    if ((scheme == "file" || scheme == "memory") && !f.local_only) {
      usage_error(fmt::format(
          "snowflake ids over the host-local lock service {} are unique on this host only: every host would "
          "lease worker id 0 and issue the same ids. Use --url with a lock service all hosts share "
          "(redis://, etcd://, zk://, redlock://), --scheme uuid7, or --local-only if these ids never leave "
          "this host",
          client.url()));
    }
    ids::SnowflakeGenerator gen(client, o);
    print_ids(f.count, [&] { return std::to_string(gen.next()); });
    return;
  }
  if (f.scheme == "segment") {
    if (f.url.empty()) usage_error("--scheme segment needs --url postgres://... or mysql://...");
    if (f.tag.empty())
      usage_error("--scheme segment needs --tag (the row of distlock_segments to draw from)");
    ids::SegmentGenerator gen(f.url, {.tag = f.tag, .step = f.step});
    print_ids(f.count, [&] { return std::to_string(gen.next()); });
    return;
  }
  if (!f.tag.empty() || f.step != 0) usage_error("--tag and --step apply to --scheme segment only");
  ids::RedisDailyOptions o;
  if (f.prefix) o.prefix = *f.prefix;
  o.epoch_seconds = f.epoch_seconds;
  o.reserve = static_cast<std::uint32_t>(std::min(f.count, kMaxReservation));
  ids::RedisDailyGenerator gen(f.url.empty() ? default_url() : f.url, o);
  print_ids(f.count, [&] { return std::to_string(gen.next()); });
}

int exit_status_for_id(const std::error_code& ec) {
  // `id` knows only usage, unavailable and everything else (lost worker lease,
  // exhausted counter, clock rollback): the lock statuses 75/76 do not apply.
  const int status = exit_code_for(ec);
  return status == exit_status::usage || status == exit_status::unavailable ? status : exit_status::software;
}

int run_id(const IdFlags& f) {
  try {
    if (f.decode) {
      const std::string line = decode_line(f) + "\n";
      std::fwrite(line.data(), 1, line.size(), stdout);
      std::fflush(stdout);
    } else {
      generate(f);
    }
    return exit_status::ok;
  } catch (const std::system_error& e) {
    print_error(e.what());
    if (e.code().category() == std::generic_category()) return kExitIoError;
    return exit_status_for_id(e.code());
  }
}

constexpr const char* kIdFooter =
    "SCHEMES\n"
    "  snowflake    (default) 64 bits: 41 bits of ms since the epoch, a 10-bit worker id leased as the lock\n"
    "               idgen:<prefix>:worker:<n> on the lock service at --url, 12 bits of sequence.\n"
    "  redis-daily  64 bits: 31 bits of seconds since the epoch, 32 bits of a per-day counter kept in\n"
    "               Redis (INCRBY on icr:<prefix>:<yyyy:MM:dd>); --url must be redis://.\n"
    "  segment      plain 1, 2, 3, ...: ranges of the row --tag of the table distlock_segments in the\n"
    "               database at --url (postgres:// or mysql://), one transaction per --step ids\n"
    "               (default: the row's step, 1000 for a new row).\n"
    "  uuid7        RFC 9562 UUIDv7, canonical text; needs no service.\n"
    "  Ids print in decimal, one per line, increasing.\n"
    "\n"
    "GUARANTEES AND ASSUMPTIONS (docs/ids.md)\n"
    "  snowflake    No id repeats while the hosts sharing --prefix use one lock service and their\n"
    "               clocks agree within 1 s: a worker id's next holder starts above a mark (the\n"
    "               last id, or up to 1 s reserved ahead) kept beside the worker lock on redis://\n"
    "               and file://; a holder whose mark was taken over stops. etcd://, zk://, redlock://\n"
    "               keep no mark: the next holder only waits out 5 ms. file:// is one host only:\n"
    "               refused unless --local-only. Redis should persist (appendonly yes).\n"
    "  redis-daily  Needs one Redis for every generator of --prefix. Without persistence a lost\n"
    "               day counter is detected by its epoch key (the recreated counter's values are\n"
    "               used from the next second); a failover to a replica that missed writes is not\n"
    "               detected: run Redis with appendonly yes / appendfsync always.\n"
    "  segment      Unique while every generator of --tag uses the same database; a range is\n"
    "               committed before it is used, so ids left of it when the tool exits are skipped,\n"
    "               never issued again.\n"
    "  A generator used in a forked child fails (it would repeat the parent's ids).\n"
    "\n"
    "EXIT STATUS\n"
    "  0 ok;  64 usage error, malformed URL, undecodable ID, or snowflake on file:// without\n"
    "  --local-only;  69 service unreachable or authentication failed;  74 the ids could not be\n"
    "  written;  70 other failure (all 1024 worker ids leased, the day's counter exhausted, the\n"
    "  clock moved backwards). Ids issued before a failure are printed before it.\n"
    "\n"
    "EXAMPLES\n"
    "  distlock id --url redis://127.0.0.1:6379 --scheme redis-daily --prefix order -n 5\n"
    "  distlock id --scheme segment --url postgres://app:pw@db:5432/shop --tag orders -n 3\n"
    "  distlock id --scheme uuid7\n"
    "  distlock id --decode 588552270132543488\n";

}  // namespace

void add_id_command(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<IdFlags>();
  CLI::App* id = app.add_subcommand(
      "id", "Print globally unique ids (snowflake, redis-daily, segment, uuid7) or decode one");
  id->description(
      "Print COUNT globally unique, increasing ids, one per line, or (--decode) show the fields of\n"
      "one id: its time and its worker/sequence, day counter or UUIDv7 counter.");
  id->footer(kIdFooter);
  id->add_option("--url", flags->url,
                 "Lock service (snowflake), Redis (redis-daily) or database (segment) URL (default: "
                 "$DISTLOCK_URL, else this host's file:// directory)")
      ->option_text("URL");
  id->add_option("--scheme", flags->scheme, "Id scheme: snowflake (default), redis-daily, segment or uuid7")
      ->check(CLI::IsMember({"snowflake", "redis-daily", "segment", "uuid7"}))
      ->option_text("SCHEME");
  id->add_option("--prefix", flags->prefix,
                 "Id space: worker-id locks idgen:P:worker:N, or the counter key icr:P:DATE (default: "
                 "\"default\" for snowflake, \"id\" for redis-daily)")
      ->option_text("P");
  id->add_option("-n,--count", flags->count, "How many ids to print (default 1)")
      ->check(CLI::Range(1LL, 100'000'000LL))
      ->option_text("COUNT");
  id->add_option("--epoch", flags->epoch_seconds,
                 "Epoch of the time field, in Unix seconds (default 1654992000 = 2022-06-12T00:00:00Z)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{4'000'000'000}))
      ->option_text("SECONDS");
  id->add_option("--tag", flags->tag, "segment: the business tag (row of distlock_segments), 1..128 bytes")
      ->option_text("TAG");
  id->add_option("--step", flags->step, "segment: ids per database round trip (default: the row's step)")
      ->check(CLI::Range(std::int64_t{1}, ids::kMaxSegmentStep))
      ->option_text("N");
  id->add_flag("--local-only", flags->local_only,
               "Allow snowflake over a host-local URL (file://): ids are then unique on this host only");
  id->add_option("--decode", flags->decode, "Print the fields of ID (of --scheme) instead of making ids")
      ->option_text("ID");
  id->callback([flags, &exit_code] { exit_code = run_id(*flags); });
}

}  // namespace distlock::cli
