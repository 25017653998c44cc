#include <gtest/gtest.h>
TEST(Url, Placeholder) { EXPECT_TRUE(true); }
