// Derived names (src/engine/names.hpp): the on-server names of a primitive's parts are
// a wire format (docs/primitives.md), so they are spelled out here byte for byte, and
// every name the encoders make decodes back to its kind, base and index.
#include "engine/names.hpp"

#include <gtest/gtest.h>

#include <optional>
#include <string>

namespace names = distlock::detail::names;
using distlock::LockKind;

namespace {

const std::string kSep(1, '\x1f');

TEST(DerivedNames, EncodersWriteTheStoredNames) {
  EXPECT_EQ(names::semaphore_definition("jobs"), "jobs" + kSep + "sem");
  EXPECT_EQ(names::semaphore_permit("jobs", 3), "jobs" + kSep + "sem" + kSep + "3");
  EXPECT_EQ(names::rw_definition("cfg"), "cfg" + kSep + "rw");
  EXPECT_EQ(names::rw_writer("cfg"), "cfg" + kSep + "rw" + kSep + "w");
  EXPECT_EQ(names::rw_reader("cfg", 1023), "cfg" + kSep + "rw" + kSep + "1023");
  EXPECT_EQ(names::election("lead"), "lead" + kSep + "elect");
  EXPECT_EQ(names::election_bell("lead"), "lead" + kSep + "elect" + kSep + "bell");
  EXPECT_EQ(names::once_mark("nightly"), "nightly" + kSep + "once");
  EXPECT_EQ(names::rw_exclusive_mark_name("nightly"), "nightly" + kSep + "exclusive");
  // The longest suffixes the name checks reserve room for.
  EXPECT_EQ(names::semaphore_permit("", 1023).size(), names::kSemaphoreSuffixBytes);
  EXPECT_EQ(names::rw_reader("", 1023).size(), names::kRwSuffixBytes);
}

TEST(DerivedNames, DecodeReadsBackEveryKind) {
  struct Case {
    std::string encoded;  // kept alive: decode() returns views into its argument
    LockKind kind;
    std::string base;
    std::optional<std::uint32_t> index;
    std::string definition;
    std::optional<std::uint32_t> of;  // the primitive's size given to display()
    std::string display_of;           // display(d, of)
    std::string display;              // display(d)
  };
  const Case cases[] = {
      {names::semaphore_permit("jobs", 7), LockKind::semaphore_permit, "jobs", 7u,
       names::semaphore_definition("jobs"), 10u, "semaphore permit 7 of 10", "semaphore permit 7"},
      {names::rw_reader("cfg", 2), LockKind::rw_reader, "cfg", 2u, names::rw_definition("cfg"), 4u,
       "rw reader slot 2 of 4", "rw reader slot 2"},
      {names::rw_writer("cfg"), LockKind::rw_writer, "cfg", std::nullopt, "", 4u, "rw writer", "rw writer"},
      {names::election("lead"), LockKind::election, "lead", std::nullopt, "", std::nullopt, "election",
       "election"},
  };
  for (const Case& c : cases) {
    const auto d = names::decode(c.encoded);
    EXPECT_EQ(d.kind, c.kind) << c.display;
    EXPECT_EQ(d.base, c.base) << c.display;
    EXPECT_EQ(d.index, c.index) << c.display;
    EXPECT_EQ(names::definition_of(d), c.definition) << c.display;
    EXPECT_EQ(names::display(d, c.of), c.display_of);
    EXPECT_EQ(names::display(d), c.display);
  }
}

TEST(DerivedNames, NamesThisLibraryDoesNotDeriveArePlainLocks) {
  for (const std::string& name :
       {std::string("plain"), "a" + kSep + "sem" + kSep + "x", "a" + kSep + "sem", kSep + "sem" + kSep + "1",
        "a" + kSep + "rw" + kSep + "r", "a" + kSep + "unknown" + kSep + "1", names::election_bell("lead"),
        "a" + kSep + "sem" + kSep + "1234567890"}) {
    const auto d = names::decode(name);
    EXPECT_EQ(d.kind, LockKind::lock) << names::printable(name);
    EXPECT_EQ(d.base, name) << names::printable(name);
    EXPECT_FALSE(d.index) << names::printable(name);
    EXPECT_EQ(names::display(d, 3u), "lock");
  }
}

TEST(DerivedNames, PrimitiveOfAndPrintable) {
  EXPECT_EQ(names::primitive_of(names::semaphore_permit("jobs", 1)), "jobs");
  EXPECT_EQ(names::primitive_of("plain"), "plain");
  EXPECT_EQ(names::printable(names::election("lead")), "lead\\x1felect");
  EXPECT_EQ(names::printable(std::string(300, 'a')).size(), 200u);
}

}  // namespace
