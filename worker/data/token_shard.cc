#include "worker/data/token_shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"

namespace zt {
namespace {

// The format is little-endian and the reader hands out the mapped bytes directly.
static_assert(std::endian::native == std::endian::little, "token shards assume little-endian");

// Field offsets inside the 64-byte header (docs/formats.md, "Token shards").
constexpr int kOffMagic = 0;
constexpr int kOffVersion = 8;
constexpr int kOffWidth = 12;
constexpr int kOffCount = 16;
constexpr int kOffVocab = 24;
constexpr int kOffMaxToken = 28;

template <typename T>
void Put(unsigned char* header, int offset, T value) {
  std::memcpy(header + offset, &value, sizeof(T));
}

template <typename T>
T Get(const unsigned char* header, int offset) {
  T value;
  std::memcpy(&value, header + offset, sizeof(T));
  return value;
}

absl::Status WriteAll(int fd, const void* data, size_t bytes, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::write(fd, p, bytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::ErrnoToStatus(errno, absl::StrCat("writing token shard '", path, "'"));
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// Makes the rename itself durable: without it a crash can leave the directory entry unwritten.
absl::Status SyncDirectory(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("opening directory '", dir, "'"));
  absl::Cleanup close_fd = [fd] { ::close(fd); };
  if (::fsync(fd) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("syncing directory '", dir, "'"));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status WriteTokens(int fd, absl::Span<const int32_t> tokens, const std::string& path) {
  // Converted in bounded chunks so a large shard does not need a second full-size copy.
  constexpr size_t kChunk = 1 << 20;
  std::vector<T> buffer(std::min(kChunk, tokens.size()));
  for (size_t start = 0; start < tokens.size(); start += kChunk) {
    size_t n = std::min(kChunk, tokens.size() - start);
    for (size_t i = 0; i < n; ++i) buffer[i] = static_cast<T>(tokens[start + i]);
    ZT_RETURN_IF_ERROR(WriteAll(fd, buffer.data(), n * sizeof(T), path));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteTokenShard(const std::string& path, absl::Span<const int32_t> tokens,
                             uint32_t vocab_size) {
  int32_t max_token = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    int32_t t = tokens[i];
    if (t < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("token shard '", path, "': token ", i, " is ", t, "; ids must be >= 0"));
    }
    if (vocab_size != 0 && static_cast<uint32_t>(t) >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token shard '", path, "': token ", i, " is ",
                                                     t, " >= vocab_size ", vocab_size));
    }
    max_token = std::max(max_token, t);
  }
  const bool narrow =
      vocab_size != 0 ? vocab_size <= kTokenShardMaxU16Vocab : max_token < kTokenShardMaxU16Vocab;
  const uint32_t width = narrow ? 2 : 4;

  unsigned char header[kTokenShardHeaderBytes] = {};
  std::memcpy(header + kOffMagic, kTokenShardMagic, sizeof(kTokenShardMagic));
  Put<uint32_t>(header, kOffVersion, kTokenShardVersion);
  Put<uint32_t>(header, kOffWidth, width);
  Put<uint64_t>(header, kOffCount, tokens.size());
  Put<uint32_t>(header, kOffVocab, vocab_size);
  Put<uint32_t>(header, kOffMaxToken, static_cast<uint32_t>(max_token));

  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("creating '", tmp, "'"));
  bool renamed = false;
  absl::Cleanup cleanup = [&] {
    if (fd >= 0) ::close(fd);
    if (!renamed) ::unlink(tmp.c_str());
  };
  ZT_RETURN_IF_ERROR(WriteAll(fd, header, sizeof(header), tmp));
  ZT_RETURN_IF_ERROR(narrow ? WriteTokens<uint16_t>(fd, tokens, tmp)
                            : WriteTokens<uint32_t>(fd, tokens, tmp));
  if (::fsync(fd) != 0) return absl::ErrnoToStatus(errno, absl::StrCat("syncing '", tmp, "'"));
  const int close_rc = ::close(fd);
  fd = -1;
  if (close_rc != 0) return absl::ErrnoToStatus(errno, absl::StrCat("closing '", tmp, "'"));
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("renaming '", tmp, "' to '", path, "'"));
  }
  renamed = true;
  return SyncDirectory(path);
}

namespace {

// The checks of a header against the size of its file, shared by the reader that maps the
// shard and the one that only reads its header.
absl::StatusOr<TokenShardHeader> ParseHeader(const std::string& path, const unsigned char* header,
                                             int64_t file_bytes) {
  if (std::memcmp(header + kOffMagic, kTokenShardMagic, sizeof(kTokenShardMagic)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", path, "' is not a token shard: bad magic (the file must start with \"ZTTOKENS\")"));
  }
  const auto version = Get<uint32_t>(header, kOffVersion);
  if (version != kTokenShardVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("token shard '", path, "': unsupported format version ", version,
                     " (this build reads version ", kTokenShardVersion, ")"));
  }
  const auto width = Get<uint32_t>(header, kOffWidth);
  if (width != 2 && width != 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token shard '", path, "': unsupported token width ", width, " bytes (must be 2 or 4)"));
  }
  const auto count = Get<uint64_t>(header, kOffCount);
  // Checked before multiplying so a corrupt count cannot overflow the size computation.
  const uint64_t max_count = static_cast<uint64_t>(file_bytes) / width;
  const uint64_t expected = kTokenShardHeaderBytes + count * width;
  if (count > max_count || expected > static_cast<uint64_t>(file_bytes)) {
    return absl::DataLossError(
        absl::StrCat("token shard '", path, "' is truncated: its header promises ", count,
                     " tokens of ", width, " bytes, expected ", kTokenShardHeaderBytes, " + ",
                     count, " x ", width, " bytes but the file has ", file_bytes));
  }
  if (expected < static_cast<uint64_t>(file_bytes)) {
    return absl::DataLossError(absl::StrCat("token shard '", path,
                                            "' has trailing bytes: ", "expected ", expected,
                                            " bytes but the file has ", file_bytes));
  }
  const auto vocab = Get<uint32_t>(header, kOffVocab);
  const auto max_token = Get<uint32_t>(header, kOffMaxToken);
  if ((vocab != 0 && max_token >= vocab) || max_token > INT32_MAX ||
      (width == 2 && max_token >= kTokenShardMaxU16Vocab)) {
    return absl::DataLossError(absl::StrCat("token shard '", path, "': header's largest id ",
                                            max_token, " does not fit its vocab size ", vocab,
                                            " and token width ", width));
  }
  return TokenShardHeader{.width = static_cast<int>(width),
                          .count = static_cast<int64_t>(count),
                          .vocab_size = vocab,
                          .max_token = static_cast<int32_t>(max_token)};
}

absl::Status TruncatedHeader(const std::string& path, int64_t file_bytes) {
  return absl::DataLossError(absl::StrCat("token shard '", path, "' is truncated: ", file_bytes,
                                          " bytes, shorter than the ", kTokenShardHeaderBytes,
                                          "-byte header"));
}

// Opens `path` read-only and returns its descriptor and size.
absl::Status OpenShardFile(const std::string& path, int& fd, int64_t& file_bytes) {
  fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("opening token shard '", path, "'"));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("stat of token shard '", path, "'"));
  }
  file_bytes = st.st_size;
  if (file_bytes < kTokenShardHeaderBytes) return TruncatedHeader(path, file_bytes);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TokenShardHeader> ReadTokenShardHeader(const std::string& path) {
  int fd = -1;
  absl::Cleanup close_fd = [&fd] {
    if (fd >= 0) ::close(fd);
  };
  int64_t file_bytes = 0;
  ZT_RETURN_IF_ERROR(OpenShardFile(path, fd, file_bytes));
  unsigned char header[kTokenShardHeaderBytes];
  int64_t got = 0;
  while (got < kTokenShardHeaderBytes) {
    const ssize_t n = ::pread(fd, header + got, kTokenShardHeaderBytes - got, got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::ErrnoToStatus(errno, absl::StrCat("reading token shard '", path, "'"));
    if (n == 0) return TruncatedHeader(path, got);
    got += n;
  }
  return ParseHeader(path, header, file_bytes);
}

absl::StatusOr<std::unique_ptr<TokenShard>> TokenShard::Open(const std::string& path) {
  std::unique_ptr<TokenShard> shard(new TokenShard());
  shard->path_ = path;
  int64_t file_bytes = 0;
  ZT_RETURN_IF_ERROR(OpenShardFile(path, shard->fd_, file_bytes));
  void* map = ::mmap(nullptr, file_bytes, PROT_READ, MAP_SHARED, shard->fd_, 0);
  if (map == MAP_FAILED) {
    return absl::ErrnoToStatus(errno, absl::StrCat("mapping token shard '", path, "'"));
  }
  shard->map_ = map;
  shard->map_bytes_ = file_bytes;
  // The mapping keeps the file's pages reachable: the descriptor is not needed after it, and
  // closing it keeps a process with many mapped shards far from its open-file limit.
  ::close(shard->fd_);
  shard->fd_ = -1;
  const auto* header = static_cast<const unsigned char*>(map);
  ZT_ASSIGN_OR_RETURN(const TokenShardHeader parsed, ParseHeader(path, header, file_bytes));
  shard->tokens_ = header + kTokenShardHeaderBytes;
  shard->width_ = parsed.width;
  shard->count_ = parsed.count;
  shard->vocab_size_ = parsed.vocab_size;
  shard->max_token_ = parsed.max_token;
  return shard;
}

TokenShard::~TokenShard() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  if (fd_ >= 0) ::close(fd_);
}

int32_t TokenShard::token(int64_t i) const {
  if (width_ == 2) {
    uint16_t v;
    std::memcpy(&v, tokens_ + i * 2, 2);
    return v;
  }
  uint32_t v;
  std::memcpy(&v, tokens_ + i * 4, 4);
  return static_cast<int32_t>(v);
}

void TokenShard::Read(int64_t start, int64_t n, int32_t* out) const {
  if (width_ == 2) {
    const unsigned char* p = tokens_ + start * 2;
    for (int64_t i = 0; i < n; ++i) {
      uint16_t v;
      std::memcpy(&v, p + i * 2, 2);
      out[i] = v;
    }
  } else {
    std::memcpy(out, tokens_ + start * 4, static_cast<size_t>(n) * 4);
  }
}

absl::Status CheckShardVocab(const std::string& path, const TokenShardHeader& header,
                             int32_t vocab_size, std::string_view shard_field,
                             std::string_view vocab_field) {
  if (header.count > 0 && header.max_token >= vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(shard_field), " '", path, "': token id ", header.max_token,
                     " >= ", std::string(vocab_field), " ", vocab_size));
  }
  return absl::OkStatus();
}

absl::Status TokenShard::CheckVocab(int32_t vocab_size, std::string_view shard_field,
                                    std::string_view vocab_field) const {
  return CheckShardVocab(
      path_, {.width = width_, .count = count_, .vocab_size = vocab_size_, .max_token = max_token_},
      vocab_size, shard_field, vocab_field);
}

}  // namespace zt
