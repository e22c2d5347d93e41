#include "worker/checkpoint/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/checkpoint/checkpoint_test_util.h"

namespace zt {
namespace {

using ::testing::HasSubstr;
using testing_util::RoundToSignificantBits;
using testing_util::ScratchDir;

std::vector<uint8_t> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void WriteAll(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

template <typename T>
std::vector<uint8_t> AsBytes(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// A file from a header text and data bytes, with whatever length field the test wants.
std::vector<uint8_t> RawFile(const std::string& header, const std::vector<uint8_t>& data,
                             uint64_t header_len) {
  std::vector<uint8_t> f(8 + header.size() + data.size());
  std::memcpy(f.data(), &header_len, 8);
  std::copy(header.begin(), header.end(), f.begin() + 8);
  std::copy(data.begin(), data.end(), f.begin() + 8 + static_cast<int64_t>(header.size()));
  return f;
}
std::vector<uint8_t> RawFile(const std::string& header, const std::vector<uint8_t>& data) {
  return RawFile(header, data, header.size());
}

TEST(SafetensorsTest, RoundTripsEveryDTypeAndMetadata) {
  ScratchDir dir;
  const std::string path = dir.Path("t.safetensors");
  const std::vector<float> f32 = {1.5f, -2.25f, 3.0f, 0.1f, -7.0f, 1e-3f};
  const std::vector<float> to_half = {0.1f, -1.7f, 3.14159f, 1000.3f};
  const std::vector<float> to_bf16 = {0.1f, -1.7f, 3.14159f, 1e30f};
  const std::vector<int32_t> i32 = {-1, 0, 2147483647};
  const std::vector<int64_t> i64 = {-(int64_t{1} << 40), 7};
  const std::vector<uint8_t> u8 = {0, 1, 254, 255, 7};
  const std::vector<int8_t> i8 = {-128, 0, 127};
  const std::vector<double> f64 = {1.0 / 3.0, -2.5};
  const std::vector<float> scalar = {42.0f};
  {
    auto w = SafetensorsWriter::Create(path,
                                       {{"f32", StDType::kF32, {2, 3}},
                                        {"f16", StDType::kF16, {4}},
                                        {"bf16", StDType::kBF16, {2, 2}},
                                        {"i32", StDType::kI32, {3}},
                                        {"i64", StDType::kI64, {2, 1}},
                                        {"u8", StDType::kU8, {5}},
                                        {"i8", StDType::kI8, {3}},
                                        {"f64", StDType::kF64, {2}},
                                        {"empty", StDType::kF32, {0, 4}},
                                        {"scalar", StDType::kF32, {}}},
                                       {{"format", "pt"}, {"step", "12"}});
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE((*w)->WriteF32("f32", f32).ok());
    ASSERT_TRUE((*w)->WriteF32("f16", to_half).ok());
    ASSERT_TRUE((*w)->WriteF32("bf16", to_bf16).ok());
    ASSERT_TRUE((*w)->Write("i32", AsBytes(i32)).ok());
    ASSERT_TRUE((*w)->Write("i64", AsBytes(i64)).ok());
    ASSERT_TRUE((*w)->Write("u8", u8).ok());
    // The rest through the per-tensor callback.
    std::vector<std::string> filled;
    absl::Status s = (*w)->WriteRemaining(
        [&](const SafetensorsTensorSpec& spec, absl::Span<uint8_t> out) -> absl::Status {
          filled.push_back(spec.name);
          std::vector<uint8_t> src = spec.name == "i8"       ? AsBytes(i8)
                                     : spec.name == "f64"    ? AsBytes(f64)
                                     : spec.name == "scalar" ? AsBytes(scalar)
                                                             : std::vector<uint8_t>{};
          if (src.size() != out.size()) return absl::InternalError("size");
          std::memcpy(out.data(), src.data(), src.size());
          return absl::OkStatus();
        });
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_THAT(filled, ::testing::ElementsAre("i8", "f64", "empty", "scalar"));
    ASSERT_TRUE((*w)->Finish().ok());
  }
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const SafetensorsFile& f = **file;
  EXPECT_EQ(f.metadata(), (std::map<std::string, std::string>{{"format", "pt"}, {"step", "12"}}));
  ASSERT_EQ(f.tensors().size(), 10u);
  // The data region starts 8-byte aligned, as the reference implementation pads it.
  const std::vector<uint8_t> raw = ReadAll(path);
  uint64_t header_len;
  std::memcpy(&header_len, raw.data(), 8);
  EXPECT_EQ(header_len % 8, 0u);

  auto bytes_of = [&](const char* name) {
    const SafetensorsTensorInfo* t = f.Find(name);
    EXPECT_NE(t, nullptr) << name;
    auto b = f.Bytes(*t);
    return std::vector<uint8_t>(b.begin(), b.end());
  };
  EXPECT_EQ(bytes_of("f32"), AsBytes(f32));
  EXPECT_EQ(bytes_of("i32"), AsBytes(i32));
  EXPECT_EQ(bytes_of("i64"), AsBytes(i64));
  EXPECT_EQ(bytes_of("u8"), u8);
  EXPECT_EQ(bytes_of("i8"), AsBytes(i8));
  EXPECT_EQ(bytes_of("f64"), AsBytes(f64));
  EXPECT_EQ(bytes_of("scalar"), AsBytes(scalar));
  EXPECT_TRUE(bytes_of("empty").empty());

  const SafetensorsTensorInfo* i64_info = f.Find("i64");
  EXPECT_EQ(i64_info->dtype, StDType::kI64);
  EXPECT_EQ(i64_info->shape, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(f.Find("scalar")->shape, std::vector<int64_t>{});
  EXPECT_EQ(f.Find("scalar")->numel(), 1);
  EXPECT_EQ(f.Find("empty")->numel(), 0);
  EXPECT_EQ(f.Find("missing"), nullptr);

  // 16-bit values read back as the float64 reference rounding of the originals. Exact
  // equality: round-to-nearest-even to 11 (f16) or 8 (bf16) significant bits has one answer,
  // and every test value lies in both formats' normal range.
  std::vector<float> back(4);
  ASSERT_TRUE(f.ReadAsF32(*f.Find("f16"), absl::MakeSpan(back)).ok());
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(static_cast<double>(back[i]), RoundToSignificantBits(to_half[i], 11)) << i;
  }
  ASSERT_TRUE(f.ReadAsF32(*f.Find("bf16"), absl::MakeSpan(back)).ok());
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(static_cast<double>(back[i]), RoundToSignificantBits(to_bf16[i], 8)) << i;
  }
  std::vector<float> back32(6);
  ASSERT_TRUE(f.ReadAsF32(*f.Find("f32"), absl::MakeSpan(back32)).ok());
  EXPECT_EQ(back32, f32);
  EXPECT_EQ(f.ReadAsF32(*f.Find("i32"), absl::MakeSpan(back32).subspan(0, 3)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f.ReadAsF32(*f.Find("f32"), absl::MakeSpan(back)).code(),
            absl::StatusCode::kInvalidArgument);
}

// The bytes of a tiny file, worked out by hand from the format's definition.
TEST(SafetensorsTest, WritesExactlyTheReferenceBytes) {
  ScratchDir dir;
  const std::string path = dir.Path("tiny.safetensors");
  {
    auto w = SafetensorsWriter::Create(
        path, {{"a", StDType::kF32, {2}}, {"b", StDType::kBF16, {1, 2}}}, {{"format", "pt"}});
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE((*w)->WriteF32("a", std::vector<float>{1.0f, -2.0f}).ok());
    ASSERT_TRUE((*w)->WriteF32("b", std::vector<float>{1.0f, 0.5f}).ok());
    ASSERT_TRUE((*w)->Finish().ok());
  }
  // 32 + 53 + 57 = 142 characters of JSON, padded with 2 spaces to 144 = 0x90.
  const std::string header = R"({"__metadata__":{"format":"pt"},)"
                             R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"BF16","shape":[1,2],"data_offsets":[8,12]}})"
                             "  ";
  std::vector<uint8_t> want = {0x90, 0, 0, 0, 0, 0, 0, 0};
  want.insert(want.end(), header.begin(), header.end());
  // 1.0f = 0x3f800000, -2.0f = 0xc0000000, bf16 1.0 = 0x3f80, bf16 0.5 = 0x3f00, little-endian.
  const std::vector<uint8_t> data = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00,
                                     0x00, 0xc0, 0x80, 0x3f, 0x00, 0x3f};
  want.insert(want.end(), data.begin(), data.end());
  EXPECT_EQ(ReadAll(path), want);
}

// Release drops the copied-out pages from the resident set; touching them again reads the
// file, so the bytes are unchanged (a wrong advice, e.g. on the wrong range, would zero or
// corrupt them). Three tensors of several pages each, released out of order.
TEST(SafetensorsTest, ReleasedTensorsReadBackUnchanged) {
  ScratchDir dir;
  const std::string path = dir.Path("big.safetensors");
  std::vector<std::vector<float>> values(3, std::vector<float>(5000));
  for (size_t t = 0; t < values.size(); ++t) {
    for (size_t i = 0; i < values[t].size(); ++i) values[t][i] = static_cast<float>(t * 1e5 + i);
  }
  {
    auto w = SafetensorsWriter::Create(
        path,
        {{"a", StDType::kF32, {5000}}, {"b", StDType::kF32, {5000}}, {"c", StDType::kF32, {5000}}});
    ASSERT_TRUE(w.ok()) << w.status();
    for (const char* name : {"a", "b", "c"}) {
      ASSERT_TRUE((*w)->WriteF32(name, values[name[0] - 'a']).ok());
    }
    ASSERT_TRUE((*w)->Finish().ok());
  }
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  for (const char* name : {"b", "a", "c", "b"}) {
    const SafetensorsTensorInfo* info = (*f)->Find(name);
    ASSERT_NE(info, nullptr);
    std::vector<float> out(5000);
    ASSERT_TRUE((*f)->ReadAsF32(*info, absl::MakeSpan(out)).ok());
    EXPECT_EQ(out, values[name[0] - 'a']) << name;
    (*f)->Release(*info);
    ASSERT_TRUE((*f)->ReadAsF32(*info, absl::MakeSpan(out)).ok());
    EXPECT_EQ(out, values[name[0] - 'a']) << name << " after Release";
  }
}

// Release of part of a tensor (what a streaming reader does chunk by chunk) leaves every byte
// readable; a span outside the file's mapping is ignored — advising it would zero anonymous
// memory.
TEST(SafetensorsTest, ReleasingPartOfATensorOrForeignMemoryChangesNoByte) {
  ScratchDir dir;
  const std::string path = dir.Path("part.safetensors");
  std::vector<float> values(20000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f;
  {
    auto w = SafetensorsWriter::Create(path, {{"t", StDType::kF32, {20000}}});
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE((*w)->WriteF32("t", values).ok());
    ASSERT_TRUE((*w)->Finish().ok());
  }
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  const SafetensorsTensorInfo* info = (*f)->Find("t");
  ASSERT_NE(info, nullptr);
  const absl::Span<const uint8_t> bytes = (*f)->Bytes(*info);
  (*f)->Release(bytes.subspan(10001, 30000));  // unaligned at both ends
  (*f)->Release(bytes.subspan(0, 3));          // less than a page
  std::vector<float> out(values.size());
  ASSERT_TRUE((*f)->ReadAsF32(*info, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, values);

  std::vector<uint8_t> anonymous(1 << 16, 0xab);
  (*f)->Release(absl::MakeConstSpan(anonymous));
  EXPECT_EQ(std::count(anonymous.begin(), anonymous.end(), 0xab),
            static_cast<std::ptrdiff_t>(anonymous.size()));
}

TEST(SafetensorsTest, ReadsFileWithNoTensors) {
  ScratchDir dir;
  const std::string path = dir.Path("empty.safetensors");
  WriteAll(path, RawFile("{}      ", {}));
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE((*f)->tensors().empty());
  EXPECT_TRUE((*f)->metadata().empty());
}

TEST(SafetensorsTest, MissingFileIsNotFound) {
  ScratchDir dir;
  auto f = SafetensorsFile::Open(dir.Path("absent.safetensors"));
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(f.status().message(), HasSubstr("absent.safetensors"));
}

struct Corruption {
  std::string label;
  std::vector<uint8_t> bytes;
  std::string tensor;  // the tensor the message must name, or empty
};

std::vector<Corruption> Corruptions() {
  const std::string ok_header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                R"("b":{"dtype":"F16","shape":[2],"data_offsets":[8,12]}})";
  const std::vector<uint8_t> data(12, 0x11);
  std::vector<uint8_t> truncated = RawFile(ok_header, data);
  truncated.resize(truncated.size() - 3);
  return {
      {"shorter than the length field", {1, 2, 3}, ""},
      {"header length beyond file", RawFile(ok_header, data, ok_header.size() + 13), ""},
      {"header length absurd", RawFile(ok_header, data, uint64_t{1} << 62), ""},
      {"bad JSON", RawFile(R"({"a":{"dtype":"F32",)", data), ""},
      {"header not an object", RawFile("[1,2]", data), ""},
      {"metadata not strings", RawFile(R"({"__metadata__":{"k":3}})", {}), ""},
      {"offsets out of range",
       RawFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", data), "a"},
      {"offsets disagree with dtype x shape",
       RawFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,12]}})", data), "a"},
      {"begin after end", RawFile(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", data),
       "a"},
      {"overlap",
       RawFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
               R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
               data),
       "b"},
      {"truncated data", truncated, "b"},
      {"unknown dtype", RawFile(R"({"a":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", data),
       "a"},
      {"negative dimension",
       RawFile(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data), "a"},
      {"missing shape", RawFile(R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", data), "a"},
      {"dimension overflow",
       RawFile(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
               data),
       "a"},
  };
}

TEST(SafetensorsTest, EveryCorruptionIsDataLossNamingFileAndTensor) {
  ScratchDir dir;
  for (const Corruption& c : Corruptions()) {
    SCOPED_TRACE(c.label);
    const std::string path = dir.Path("corrupt.safetensors");
    WriteAll(path, c.bytes);
    auto f = SafetensorsFile::Open(path);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), absl::StatusCode::kDataLoss) << f.status();
    EXPECT_THAT(f.status().message(), HasSubstr(path));
    if (!c.tensor.empty()) {
      EXPECT_THAT(f.status().message(), HasSubstr("\"" + c.tensor + "\""));
    }
  }
}

TEST(SafetensorsTest, WriterRejectsBadDeclarations) {
  ScratchDir dir;
  const std::string path = dir.Path("bad.safetensors");
  auto dup =
      SafetensorsWriter::Create(path, {{"x", StDType::kF32, {1}}, {"x", StDType::kF32, {2}}});
  EXPECT_EQ(dup.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(dup.status().message(), HasSubstr("\"x\""));
  auto reserved = SafetensorsWriter::Create(path, {{"__metadata__", StDType::kF32, {1}}});
  EXPECT_EQ(reserved.status().code(), absl::StatusCode::kInvalidArgument);
  auto negative = SafetensorsWriter::Create(path, {{"n", StDType::kF32, {3, -1}}});
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(negative.status().message(), HasSubstr("\"n\""));
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(SafetensorsTest, WriterEnforcesOrderSizeAndCompleteness) {
  ScratchDir dir;
  const std::string path = dir.Path("w.safetensors");
  WriteAll(path, {'o', 'l', 'd'});
  {
    auto w = SafetensorsWriter::Create(path, {{"first", StDType::kF32, {2}},
                                              {"second", StDType::kI32, {1}},
                                              {"third", StDType::kU8, {1}}});
    ASSERT_TRUE(w.ok()) << w.status();
    const std::vector<float> two = {1.0f, 2.0f};
    absl::Status s = (*w)->WriteF32("second", two);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(s.message(), HasSubstr("\"first\""));
    s = (*w)->WriteF32("first", std::vector<float>{1.0f, 2.0f, 3.0f});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    ASSERT_TRUE((*w)->WriteF32("first", two).ok());
    s = (*w)->WriteF32("second", std::vector<float>{1.0f});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "I32 takes no f32 values";
    ASSERT_TRUE((*w)->Write("second", AsBytes(std::vector<int32_t>{5})).ok());
    s = (*w)->Finish();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(s.message(), HasSubstr("\"third\""));
    // Until Finish() succeeds the old file stays as it was.
    EXPECT_EQ(ReadAll(path), (std::vector<uint8_t>{'o', 'l', 'd'}));
    EXPECT_TRUE(std::filesystem::exists(path + ".tmp"));
  }
  // Abandoned: the temporary file is gone and the old one is untouched.
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  EXPECT_EQ(ReadAll(path), (std::vector<uint8_t>{'o', 'l', 'd'}));
}

TEST(SafetensorsTest, CallbackErrorStopsWriting) {
  ScratchDir dir;
  const std::string path = dir.Path("cb.safetensors");
  auto w = SafetensorsWriter::Create(path, {{"a", StDType::kU8, {1}}, {"b", StDType::kU8, {1}}});
  ASSERT_TRUE(w.ok());
  int calls = 0;
  absl::Status s = (*w)->WriteRemaining([&](const SafetensorsTensorSpec&, absl::Span<uint8_t>) {
    ++calls;
    return absl::UnavailableError("source went away");
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(calls, 1);
}

TEST(SafetensorsTest, DTypeNamesRoundTrip) {
  for (int i = 0; i <= static_cast<int>(StDType::kU64); ++i) {
    const auto t = static_cast<StDType>(i);
    EXPECT_EQ(ParseStDType(StDTypeName(t)), t) << StDTypeName(t);
  }
  EXPECT_EQ(ParseStDType("f32"), std::nullopt) << "names are case-sensitive";
  EXPECT_EQ(StDTypeSize(StDType::kBF16), 2);
  EXPECT_EQ(StDTypeSize(StDType::kI64), 8);
  EXPECT_EQ(ToStDType(DType::kBF16), StDType::kBF16);
}

}  // namespace
}  // namespace zt
