#include "offload/swap_format.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace zt::offload::swap_format {
namespace {

void PutInt(std::string& out, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

// Reads big-endian integers from a byte string, remembering whether it ran past the end.
class Reader {
 public:
  explicit Reader(absl::string_view s) : s_(s) {}
  uint64_t Int(int bytes) {
    if (s_.size() < static_cast<size_t>(bytes)) {
      ok_ = false;
      return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v = (v << 8) | static_cast<uint8_t>(s_[i]);
    s_.remove_prefix(bytes);
    return v;
  }
  absl::string_view Bytes(size_t n) {
    if (s_.size() < n) {
      ok_ = false;
      return {};
    }
    absl::string_view v = s_.substr(0, n);
    s_.remove_prefix(n);
    return v;
  }
  bool done() const { return ok_ && s_.empty(); }

 private:
  absl::string_view s_;
  bool ok_ = true;
};

std::string PrefixedJob(char prefix, absl::string_view job) {
  std::string out(1, prefix);
  PutInt(out, job.size(), 2);
  out.append(job.data(), job.size());
  return out;
}

}  // namespace

std::string SwapFilePath(const std::string& dir, uint32_t index) {
  return absl::StrFormat("%s/swap-%03u.zts", dir, index);
}

std::string IndexPath(const std::string& dir) { return dir + "/index"; }

std::string EncodeMeta(uint64_t file_size, uint32_t file_count) {
  std::string out;
  PutInt(out, kMetaMagic, 4);
  PutInt(out, kVersion, 1);
  PutInt(out, file_size, 8);
  PutInt(out, file_count, 4);
  return out;
}

absl::StatusOr<Meta> DecodeMeta(absl::string_view value, const std::string& where) {
  Reader r(value);
  const uint64_t magic = r.Int(4);
  const uint64_t version = r.Int(1);
  Meta meta{.file_size = r.Int(8), .file_count = static_cast<uint32_t>(r.Int(4))};
  if (!r.done() || magic != kMetaMagic || version != kVersion) {
    return absl::DataLossError(
        absl::StrCat("swap store index '", where, "': its meta record is not a version ", kVersion,
                     " swap store's (magic ", absl::Hex(magic), ", version ", version, ")"));
  }
  return meta;
}

std::string EncodeExtentKey(const SwapKey& key) {
  std::string out = PrefixedJob(kExtentPrefix[0], key.job);
  PutInt(out, key.unit, 4);
  PutInt(out, key.range_begin, 8);
  PutInt(out, key.range_end, 8);
  PutInt(out, static_cast<uint8_t>(key.role), 1);
  PutInt(out, key.generation, 8);
  return out;
}

absl::StatusOr<SwapKey> DecodeExtentKey(absl::string_view encoded) {
  Reader r(encoded);
  SwapKey key;
  const absl::string_view prefix = r.Bytes(1);
  key.job = std::string(r.Bytes(r.Int(2)));
  key.unit = static_cast<uint32_t>(r.Int(4));
  key.range_begin = r.Int(8);
  key.range_end = r.Int(8);
  const uint64_t role = r.Int(1);
  key.role = static_cast<SwapRole>(role);
  key.generation = r.Int(8);
  if (!r.done() || prefix != kExtentPrefix || role < 1 ||
      role > static_cast<uint64_t>(SwapRole::kQuantizedBase)) {
    return absl::DataLossError("the index holds an extent key it cannot decode");
  }
  return key;
}

std::string EncodeExtentValue(const ExtentRecord& record) {
  std::string out;
  PutInt(out, kExtentMagic, 4);
  PutInt(out, kVersion, 1);
  PutInt(out, record.file, 4);
  PutInt(out, record.offset, 8);
  PutInt(out, record.length, 8);
  PutInt(out, record.crc, 4);
  return out;
}

absl::StatusOr<ExtentRecord> DecodeExtentValue(absl::string_view value, const std::string& what) {
  Reader r(value);
  const uint64_t magic = r.Int(4);
  const uint64_t version = r.Int(1);
  ExtentRecord rec;
  rec.file = static_cast<uint32_t>(r.Int(4));
  rec.offset = r.Int(8);
  rec.length = r.Int(8);
  rec.crc = static_cast<uint32_t>(r.Int(4));
  if (!r.done() || magic != kExtentMagic || version != kVersion) {
    return absl::DataLossError(absl::StrCat("the index's record of ", what, " is not a version ",
                                            kVersion, " extent record"));
  }
  return rec;
}

std::string EncodeCommittedKey(absl::string_view job) {
  return PrefixedJob(kCommittedPrefix[0], job);
}

std::string EncodeGeneration(uint64_t generation) {
  std::string out;
  PutInt(out, generation, 8);
  return out;
}

absl::StatusOr<std::pair<std::string, uint64_t>> DecodeCommitted(absl::string_view key,
                                                                 absl::string_view value) {
  Reader k(key);
  const absl::string_view prefix = k.Bytes(1);
  std::string job(k.Bytes(k.Int(2)));
  Reader v(value);
  const uint64_t generation = v.Int(8);
  if (!k.done() || !v.done() || prefix != kCommittedPrefix) {
    return absl::DataLossError("the index holds a committed-generation record it cannot decode");
  }
  return std::make_pair(std::move(job), generation);
}

}  // namespace zt::offload::swap_format
