// `distlock id --scheme segment` black-box, through the real binary, against a real
// PostgreSQL and MariaDB it starts itself: plain increasing ids, one range per --step,
// runs that never collide (what a run left of its range is skipped), and exit 64 / 69
// with one clear line on bad input, a wrong password or no server.
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <sstream>
#include <vector>

#include "cli/cli_harness.hpp"
#include "support/mariadb_server.hpp"
#include "support/postgres_server.hpp"
#include "support/process.hpp"

namespace {

using distlock::testing::Cli;
using distlock::testing::MariadbServer;
using distlock::testing::PostgresServer;
using distlock::testing::TempDir;

std::vector<std::uint64_t> numbers_of(const std::string& text) {
  std::vector<std::uint64_t> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(std::stoull(line));
  return out;
}

class CliSegment : public ::testing::TestWithParam<std::string> {
 protected:
  CliSegment() {
    if (GetParam() == "postgres") {
      pg_.emplace();
    } else {
      my_.emplace();
    }
  }
  std::string url() const { return pg_ ? pg_->url() : my_->url(); }
  std::string url_with_password(const std::string& pw) const {
    return pg_ ? pg_->url_with_password(pw) : my_->url_with_password(pw);
  }
  std::int64_t max_id(const std::string& tag) const {
    const std::string sql = std::string("SELECT max_id FROM ") +
                            (pg_ ? "public.distlock_segments" : "distlock_test.distlock_segments") +
                            " WHERE tag = '" + tag + "'";
    auto rows = pg_ ? pg_->query(sql) : my_->query(sql);
    return rows.empty() ? -1 : std::stoll(rows[0][0]);
  }
  std::optional<PostgresServer> pg_;
  std::optional<MariadbServer> my_;
  TempDir dir_{"distlock-cli-segment"};
};

TEST_P(CliSegment, PrintsPlainIdsOneRangePerStepAndRunsNeverCollide) {
  Cli a =
      Cli::run({"id", "--scheme", "segment", "--url", url(), "--tag", "orders", "--step", "100", "-n", "250"},
               dir_.path());
  ASSERT_EQ(a.code(), 0) << a.err();
  const auto first = numbers_of(a.out());
  ASSERT_EQ(first.size(), 250u);
  for (std::size_t i = 0; i < first.size(); ++i) ASSERT_EQ(first[i], i + 1);
  EXPECT_EQ(max_id("orders"), 300);  // (0,100], (100,200], (200,300]
  // The next run starts above the first run's last range: its unused 251..300 are skipped.
  Cli b =
      Cli::run({"id", "--scheme", "segment", "--url", url(), "--tag", "orders", "--step", "100", "-n", "3"},
               dir_.path());
  ASSERT_EQ(b.code(), 0) << b.err();
  EXPECT_EQ(numbers_of(b.out()), (std::vector<std::uint64_t>{301, 302, 303}));
  // Without --step: the row's step (1000 for a new row).
  Cli c = Cli::run({"id", "--scheme", "segment", "--url", url(), "--tag", "invoices"}, dir_.path());
  ASSERT_EQ(c.code(), 0) << c.err();
  EXPECT_EQ(c.out(), "1\n");
  EXPECT_EQ(max_id("invoices"), 1000);
}

TEST_P(CliSegment, BadInputExits64AndAnUnreachableOrRefusingServerExits69) {
  Cli no_tag = Cli::run({"id", "--scheme", "segment", "--url", url()}, dir_.path());
  EXPECT_EQ(no_tag.code(), 64);
  EXPECT_NE(no_tag.err().find("--tag"), std::string::npos) << no_tag.err();
  Cli long_tag =
      Cli::run({"id", "--scheme", "segment", "--url", url(), "--tag", std::string(129, 't')}, dir_.path());
  EXPECT_EQ(long_tag.code(), 64);
  EXPECT_NE(long_tag.err().find("tag"), std::string::npos) << long_tag.err();
  Cli zero_step =
      Cli::run({"id", "--scheme", "segment", "--url", url(), "--tag", "t", "--step", "0"}, dir_.path());
  EXPECT_EQ(zero_step.code(), 64) << zero_step.err();
  Cli redis =
      Cli::run({"id", "--scheme", "segment", "--url", "redis://127.0.0.1:1", "--tag", "t"}, dir_.path());
  EXPECT_EQ(redis.code(), 64);
  EXPECT_NE(redis.err().find("database URL"), std::string::npos) << redis.err();
  Cli decode = Cli::run({"id", "--scheme", "segment", "--decode", "5"}, dir_.path());
  EXPECT_EQ(decode.code(), 64);
  Cli wrong = Cli::run({"id", "--scheme", "segment", "--url", url_with_password("not-the-pw"), "--tag", "t"},
                       dir_.path());
  EXPECT_EQ(wrong.code(), 69) << wrong.err();
  EXPECT_EQ(wrong.err().find("not-the-pw"), std::string::npos) << wrong.err();
  const std::string down = GetParam() +
                           "://u:pw@127.0.0.1:" + std::to_string(distlock::testing::free_port()) +
                           "/db?timeout=500ms";
  Cli none = Cli::run({"id", "--scheme", "segment", "--url", down, "--tag", "t"}, dir_.path());
  EXPECT_EQ(none.code(), 69) << none.err();
}

INSTANTIATE_TEST_SUITE_P(Databases, CliSegment, ::testing::Values("postgres", "mysql"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

}  // namespace
