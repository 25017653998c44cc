// Derived names (src/engine/names.hpp): the on-server names of a primitive's parts are
// a wire format (docs/primitives.md), so they are spelled out here byte for byte, and
// every name the encoders make decodes back to its kind, base and index.
#include "engine/names.hpp"

#include <gtest/gtest.h>

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
  // decode() returns views into its argument, so each encoded name is kept alive.
  const std::string permit_name = names::semaphore_permit("jobs", 7);
  const auto permit = names::decode(permit_name);
  EXPECT_EQ(permit.kind, LockKind::semaphore_permit);
  EXPECT_EQ(permit.base, "jobs");
  EXPECT_EQ(permit.index, 7u);
  EXPECT_EQ(names::definition_of(permit), names::semaphore_definition("jobs"));
  EXPECT_EQ(names::display(permit, 10u), "semaphore permit 7 of 10");
  EXPECT_EQ(names::display(permit), "semaphore permit 7");

  const std::string reader_name = names::rw_reader("cfg", 2);
  const auto reader = names::decode(reader_name);
  EXPECT_EQ(reader.kind, LockKind::rw_reader);
  EXPECT_EQ(reader.base, "cfg");
  EXPECT_EQ(reader.index, 2u);
  EXPECT_EQ(names::definition_of(reader), names::rw_definition("cfg"));
  EXPECT_EQ(names::display(reader, 4u), "rw reader slot 2 of 4");

  const std::string writer_name = names::rw_writer("cfg");
  const auto writer = names::decode(writer_name);
  EXPECT_EQ(writer.kind, LockKind::rw_writer);
  EXPECT_EQ(writer.base, "cfg");
  EXPECT_FALSE(writer.index);
  EXPECT_EQ(names::definition_of(writer), "");
  EXPECT_EQ(names::display(writer, 4u), "rw writer");

  const std::string elect_name = names::election("lead");
  const auto elect = names::decode(elect_name);
  EXPECT_EQ(elect.kind, LockKind::election);
  EXPECT_EQ(elect.base, "lead");
  EXPECT_EQ(names::display(elect), "election");
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
