// Client::get_record / put_record, the public call over the backends' records: a round trip
// (absent, written, overwritten, binary and 64 KiB values) on memory:// and on a real
// file:// directory, the key it is stored under ("<name>\x1f<tag>", where `distlock run
// --once-per` marks have always been), the names and tags it refuses (the library's own
// tags among them, so a semaphore's stored size cannot be overwritten), and its errors:
// errc::not_supported naming the backend, and a backend's failure with its sentence.
#include <gtest/gtest.h>

#include <string>

#include "api/client_access.hpp"
#include "distlock/distlock.hpp"
#include "engine/backend.hpp"
#include "engine/engine.hpp"
#include "support/forwarding_backend.hpp"
#include "support/memory_fixture.hpp"
#include "support/process.hpp"
#include "support/thrown.hpp"

using distlock::errc;
using distlock::testing::ManualMemoryTest;

namespace {

// What a call threw (support/thrown.hpp), code and what() together.
struct Failure {
  std::error_code code;
  std::string what;
};

template <class Fn>
Failure failure_of(Fn fn) {
  Failure f;
  f.code = distlock::testing::code_of(fn, &f.what);
  return f;
}

// A backend that keeps no records (the Backend defaults), or whose records fail.
class NoRecordsBackend final : public distlock::testing::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  std::string put_record(std::string_view key, std::string_view value, distlock::detail::PutMode mode,
                         distlock::detail::Error& ec) override {
    return Backend::put_record(key, value, mode, ec);
  }
  std::optional<std::string> get_record(std::string_view key, distlock::detail::Error& ec) override {
    return Backend::get_record(key, ec);
  }
};

class UnreachableRecordsBackend final : public distlock::testing::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  std::string put_record(std::string_view, std::string_view, distlock::detail::PutMode,
                         distlock::detail::Error& ec) override {
    ec.fail(errc::backend_unavailable, "reading the reply from memory://x failed: connection reset");
    return {};
  }
  std::optional<std::string> get_record(std::string_view, distlock::detail::Error& ec) override {
    ec.fail(errc::backend_unavailable, "reading the reply from memory://x failed: connection reset");
    return std::nullopt;
  }
};

using ClientRecords = ManualMemoryTest;

// What reading (`write` false) or writing the record "once" of "job" through `c` threw.
Failure record_call_failure(distlock::Client& c, bool write) {
  return failure_of([&] {
    if (write) {
      c.put_record("job", "once", "v");
    } else {
      (void)c.get_record("job", "once");
    }
  });
}

TEST_F(ClientRecords, RoundTripAbsentWrittenOverwritten) {
  auto c = client();
  EXPECT_EQ(c.get_record("jobs/nightly", "last-run"), std::nullopt);
  c.put_record("jobs/nightly", "last-run", "slot 1");
  EXPECT_EQ(c.get_record("jobs/nightly", "last-run"), std::optional<std::string>("slot 1"));
  c.put_record("jobs/nightly", "last-run", "slot 2");
  EXPECT_EQ(c.get_record("jobs/nightly", "last-run"), std::optional<std::string>("slot 2"));
  // Another tag of the same name, and another client of the same store.
  EXPECT_EQ(c.get_record("jobs/nightly", "owner"), std::nullopt);
  EXPECT_EQ(client().get_record("jobs/nightly", "last-run"), std::optional<std::string>("slot 2"));
  // A record and a lock of one name do not collide.
  auto lease = c.acquire("jobs/nightly", distlock::testing::ttl(std::chrono::seconds(5)));
  EXPECT_EQ(c.get_record("jobs/nightly", "last-run"), std::optional<std::string>("slot 2"));
}

TEST_F(ClientRecords, ValuesAreAnyBytesUpTo64KiB) {
  auto c = client();
  const std::string binary("a\0b\nc\x1f\xff", 7);
  c.put_record("n", "bin", binary);
  EXPECT_EQ(c.get_record("n", "bin"), std::optional<std::string>(binary));
  c.put_record("n", "empty", "");
  EXPECT_EQ(c.get_record("n", "empty"), std::optional<std::string>(""));
  const std::string largest(64 * 1024, 'x');
  c.put_record("n", "big", largest);
  EXPECT_EQ(c.get_record("n", "big"), std::optional<std::string>(largest));
  const Failure f = failure_of([&] { c.put_record("n", "big", largest + "y"); });
  EXPECT_EQ(f.code, errc::invalid_argument) << f.what;
  EXPECT_NE(f.what.find("65537"), std::string::npos) << f.what;
  EXPECT_EQ(c.get_record("n", "big"), std::optional<std::string>(largest));  // unchanged
}

// The key is "<name>\x1f<tag>": the --once-per marks written before this call existed are
// read by it, and a name may itself hold 0x1f (the mark of the read-write lock NAME is the
// record "once" of "NAME\x1fexclusive").
TEST_F(ClientRecords, StoredUnderNameUnitSeparatorTag) {
  auto c = client();
  auto& backend = distlock::detail::engine_of(c)->backend();
  distlock::detail::Error ec;
  backend.put_record(
      "job\x1f"
      "once",
      "7\n0\n100\n90", distlock::detail::PutMode::always, ec);
  ASSERT_FALSE(ec) << ec.message();
  EXPECT_EQ(c.get_record("job", "once"), std::optional<std::string>("7\n0\n100\n90"));
  c.put_record(
      "job\x1f"
      "exclusive",
      "once", "8\n0\n200\n190");
  EXPECT_EQ(backend.get_record("job\x1f"
                               "exclusive\x1f"
                               "once",
                               ec),
            std::optional<std::string>("8\n0\n200\n190"));
  ASSERT_FALSE(ec) << ec.message();
}

TEST_F(ClientRecords, RefusesBadTagsAndNamesNamingThem) {
  auto c = client();
  const struct {
    std::string name, tag, cause;
  } cases[] = {
      {"n", "", "1 to 32 bytes"},
      {"n", std::string(33, 'a'), "1 to 32 bytes"},
      {"n", "Once", "only a-z, 0-9"},
      {"n", "a b", "only a-z, 0-9"},
      {"n",
       "a\x1f"
       "b",
       "only a-z, 0-9"},
      {"n", "sem", "the library's own"},
      {"n", "rw", "the library's own"},
      {"n", "elect", "the library's own"},
      {"", "once", "the lock name is empty"},
      {std::string("a\0b", 3), "once", "NUL"},
      {std::string(4096, 'n'), "once", "the record's key"},
  };
  for (const auto& k : cases) {
    for (bool write : {false, true}) {
      const Failure f = failure_of([&] {
        if (write) {
          c.put_record(k.name, k.tag, "v");
        } else {
          (void)c.get_record(k.name, k.tag);
        }
      });
      EXPECT_EQ(f.code, errc::invalid_argument) << k.tag << " " << write << ": " << f.what;
      EXPECT_EQ(f.what.rfind("record \"", 0), 0u) << f.what;
      EXPECT_NE(f.what.find(k.cause), std::string::npos) << f.what;
    }
  }
  // The longest tag and a key of exactly 4096 bytes are fine.
  c.put_record("n", std::string(32, 'z'), "v");
  c.put_record(std::string(4096 - 5, 'n'), "once", "v");
  EXPECT_EQ(c.get_record(std::string(4096 - 5, 'n'), "once"), std::optional<std::string>("v"));
}

// The library keeps a semaphore's permit count as the record "sem" of its name: a user's
// record cannot overwrite it, so the semaphore keeps its size.
TEST_F(ClientRecords, CannotChangeASemaphoresStoredSize) {
  auto c = client();
  auto sem = c.semaphore("pool", 3);
  EXPECT_EQ(failure_of([&] { c.put_record("pool", "sem", "1000"); }).code, errc::invalid_argument);
  EXPECT_NO_THROW(c.semaphore("pool", 3));
  EXPECT_EQ(failure_of([&] { c.semaphore("pool", 4); }).code, errc::invalid_argument);
}

TEST_F(ClientRecords, BackendWithoutRecordsIsNamed) {
  auto c = distlock::testing::client_through<NoRecordsBackend>(store_name, options(), nullptr);
  for (bool write : {false, true}) {
    const Failure f = record_call_failure(c, write);
    EXPECT_EQ(f.code, errc::not_supported) << f.what;
    EXPECT_EQ(f.what.rfind("record \"once\" of \"job\": backend memory://", 0), 0u) << f.what;
    EXPECT_NE(f.what.find(" keeps no records"), std::string::npos) << f.what;
  }
}

TEST_F(ClientRecords, BackendFailureCarriesItsSentence) {
  auto c = distlock::testing::client_through<UnreachableRecordsBackend>(store_name, options(), nullptr);
  for (bool write : {false, true}) {
    const Failure f = record_call_failure(c, write);
    EXPECT_EQ(f.code, errc::backend_unavailable) << f.what;
    EXPECT_EQ(
        f.what.rfind("record \"once\" of \"job\": reading the reply from memory://x failed: connection reset",
                     0),
        0u)
        << f.what;
  }
}

#if DISTLOCK_HAS_FILE
// On a real backend: the records of file:///dir (files beside the lock files).
TEST(ClientRecordsFile, RoundTripOnADirectory) {
  distlock::testing::TempDir tmp("distlock-client-records");
  distlock::ClientOptions o;
  o.logger = [](distlock::LogLevel, std::string_view) {};
  const std::string url = "file://" + (tmp.path() / "locks").string();
  auto c = distlock::connect(url, o);
  EXPECT_EQ(c.get_record("deploy/web", "version"), std::nullopt);
  c.put_record("deploy/web", "version", "v1");
  c.put_record("deploy/web", "version", "v2");
  EXPECT_EQ(distlock::connect(url, o).get_record("deploy/web", "version"), std::optional<std::string>("v2"));
}
#endif

}  // namespace
