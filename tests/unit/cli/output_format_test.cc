// Tests of cli/output_format.h: sizes the user types, sizes and ages the CLI prints, JSON.
#include "cli/output_format.h"

#include <string>

#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "proto/control.pb.h"

namespace zt::cli {
namespace {

TEST(ParseByteSizeTest, ReadsBytesAndBinaryAndDecimalUnits) {
  EXPECT_EQ(ParseByteSize("17179869184", "--device-memory").value(), int64_t{16} << 30);
  EXPECT_EQ(ParseByteSize("16GiB", "--device-memory").value(), int64_t{16} << 30);
  EXPECT_EQ(ParseByteSize(" 16 gib ", "--device-memory").value(), int64_t{16} << 30);
  EXPECT_EQ(ParseByteSize("16G", "--device-memory").value(), int64_t{16} << 30);
  EXPECT_EQ(ParseByteSize("512MB", "--device-memory").value(), 512'000'000);
  EXPECT_EQ(ParseByteSize("1.5TiB", "--device-memory").value(), int64_t{3} << 39);
  EXPECT_EQ(ParseByteSize("80GB", "--device-memory").value(), 80'000'000'000);
  EXPECT_EQ(ParseByteSize("4096B", "--device-memory").value(), 4096);
}

TEST(ParseByteSizeTest, RefusesWhatIsNotASizeNamingTheFlag) {
  for (const char* bad : {"", "GiB", "sixteen", "16XB", "0", "-1", "0.5", "1e3", "9EiB"}) {
    const absl::StatusOr<int64_t> parsed = ParseByteSize(bad, "--device-memory");
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(parsed.status().message().find("--device-memory"), std::string::npos) << bad;
  }
  EXPECT_FALSE(ParseByteSize("8000000TiB", "--device-memory").ok());  // over 2^62
}

TEST(FormatBytesTest, ThreeSignificantDigitsInBinaryUnits) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatBytes(int64_t{16} << 30), "16.0 GiB");
  EXPECT_EQ(FormatBytes(int64_t{650} << 20), "650 MiB");
}

TEST(FormatAgeTest, PicksTheUnitByMagnitude) {
  EXPECT_EQ(FormatAge(45'900), "45s");
  EXPECT_EQ(FormatAge(12 * 60'000 + 5'000), "12m");
  EXPECT_EQ(FormatAge((3 * 3600 + 5 * 60) * 1000LL), "3h05m");
  EXPECT_EQ(FormatAge((2 * 86400 + 4 * 3600) * 1000LL), "2d04h");
  EXPECT_EQ(FormatAge(-1), "-");
}

TEST(ToJsonTest, UsesProtoNamesAndPrintsZeros) {
  zerotrain::PlanCandidate c;
  c.set_zero_stage(0);
  c.set_activation_checkpointing(zerotrain::MemoryConfig::FULL);
  c.set_peak_bytes_per_rank(1234);
  const std::string pretty = ToJson(c).value();
  EXPECT_NE(pretty.find("\"zero_stage\": 0"), std::string::npos) << pretty;
  EXPECT_NE(pretty.find("\"fits\": false"), std::string::npos) << pretty;
  EXPECT_NE(pretty.find("\"activation_checkpointing\": \"FULL\""), std::string::npos) << pretty;
  // int64 is a string in protobuf's JSON mapping.
  EXPECT_NE(pretty.find("\"peak_bytes_per_rank\": \"1234\""), std::string::npos) << pretty;
  EXPECT_NE(pretty.back(), '\n');
  const std::string line = ToJson(c, /*indent=*/false).value();
  EXPECT_EQ(line.find('\n'), std::string::npos) << line;
  zerotrain::PlanCandidate back;
  // The printed text parses back to the same message.
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(line, &back).ok());
  EXPECT_EQ(back.SerializeAsString(), c.SerializeAsString());
}

}  // namespace
}  // namespace zt::cli
