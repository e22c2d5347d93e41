#include "worker/data/document_index.h"

#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"

namespace zt {
namespace {

static_assert(std::endian::native == std::endian::little, "document indexes are little-endian");

// Header: magic (8), version u32 (8), reserved u32 (12), documents u64 (16), tokens u64 (24).
// Then per document: length u32, prompt_length u32.
constexpr int kOffVersion = 8;
constexpr int kOffDocuments = 16;
constexpr int kOffTokens = 24;
constexpr int64_t kEntryBytes = 8;

template <typename T>
void Put(std::string& bytes, size_t offset, T value) {
  std::memcpy(bytes.data() + offset, &value, sizeof(T));
}

template <typename T>
T Get(const std::string& bytes, size_t offset) {
  T value;
  std::memcpy(&value, bytes.data() + offset, sizeof(T));
  return value;
}

}  // namespace

int64_t DocumentIndex::tokens() const {
  int64_t n = 0;
  for (const DocumentSpan& d : documents) n += d.length;
  return n;
}

absl::Status WriteDocumentIndex(const std::string& path, const DocumentIndex& index) {
  std::string bytes(kDocumentIndexHeaderBytes + kEntryBytes * index.documents.size(), '\0');
  std::memcpy(bytes.data(), kDocumentIndexMagic, sizeof(kDocumentIndexMagic));
  Put<uint32_t>(bytes, kOffVersion, kDocumentIndexVersion);
  Put<uint64_t>(bytes, kOffDocuments, index.documents.size());
  Put<uint64_t>(bytes, kOffTokens, static_cast<uint64_t>(index.tokens()));
  for (size_t i = 0; i < index.documents.size(); ++i) {
    const DocumentSpan& d = index.documents[i];
    if (d.length == 0 || d.prompt_length > d.length) {
      return absl::InvalidArgumentError(
          absl::StrCat("document index '", path, "': document ", i, " has ", d.length,
                       " tokens and a prompt of ", d.prompt_length,
                       " (a document needs ≥ 1 token and a prompt no longer than itself)"));
    }
    Put<uint32_t>(bytes, kDocumentIndexHeaderBytes + kEntryBytes * i, d.length);
    Put<uint32_t>(bytes, kDocumentIndexHeaderBytes + kEntryBytes * i + 4, d.prompt_length);
  }
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) {
      return absl::ErrnoToStatus(errno, absl::StrCat("writing document index '", tmp, "'"));
    }
  }
  // Synced, then renamed into place (and the directory synced), as the shard itself is: a
  // reader never sees half an index beside a whole shard.
  {
    const int fd = ::open(tmp.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || ::fsync(fd) != 0) {
      const int err = errno;
      if (fd >= 0) ::close(fd);
      return absl::ErrnoToStatus(err, absl::StrCat("syncing document index '", tmp, "'"));
    }
    ::close(fd);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("renaming '", tmp, "' to '", path, "': ", ec.message()));
  }
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0 || ::fsync(dir_fd) != 0) {
    const int err = errno;
    if (dir_fd >= 0) ::close(dir_fd);
    return absl::ErrnoToStatus(err, absl::StrCat("syncing directory '", dir, "'"));
  }
  ::close(dir_fd);
  return absl::OkStatus();
}

absl::StatusOr<std::optional<DocumentIndex>> ReadDocumentIndex(const std::string& shard_path,
                                                               int64_t shard_tokens) {
  const std::string path = shard_path + kDocumentIndexSuffix;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (errno == ENOENT) return std::optional<DocumentIndex>();
    return absl::ErrnoToStatus(errno, absl::StrCat("opening document index '", path, "'"));
  }
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() < static_cast<size_t>(kDocumentIndexHeaderBytes) ||
      std::memcmp(bytes.data(), kDocumentIndexMagic, sizeof(kDocumentIndexMagic)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("document index '", path, "': not a document index (bad magic)"));
  }
  const auto version = Get<uint32_t>(bytes, kOffVersion);
  if (version != kDocumentIndexVersion) {
    return absl::InvalidArgumentError(absl::StrCat("document index '", path, "': version ",
                                                   version, ", this build reads version ",
                                                   kDocumentIndexVersion));
  }
  const auto count = Get<uint64_t>(bytes, kOffDocuments);
  const auto tokens = Get<uint64_t>(bytes, kOffTokens);
  const uint64_t expected = kDocumentIndexHeaderBytes + kEntryBytes * count;
  if (count > bytes.size() || bytes.size() != expected) {
    return absl::DataLossError(absl::StrCat("document index '", path, "' is ", bytes.size(),
                                            " bytes; its header says ", count,
                                            " documents, which take ", expected));
  }
  if (static_cast<int64_t>(tokens) != shard_tokens) {
    return absl::DataLossError(absl::StrCat("document index '", path, "' covers ", tokens,
                                            " tokens; its shard holds ", shard_tokens));
  }
  DocumentIndex index;
  index.documents.resize(count);
  int64_t sum = 0;
  for (uint64_t i = 0; i < count; ++i) {
    DocumentSpan& d = index.documents[i];
    d.length = Get<uint32_t>(bytes, kDocumentIndexHeaderBytes + kEntryBytes * i);
    d.prompt_length = Get<uint32_t>(bytes, kDocumentIndexHeaderBytes + kEntryBytes * i + 4);
    if (d.length == 0 || d.prompt_length > d.length) {
      return absl::DataLossError(absl::StrCat("document index '", path, "': document ", i,
                                              " has ", d.length, " tokens and a prompt of ",
                                              d.prompt_length));
    }
    sum += d.length;
  }
  if (sum != shard_tokens) {
    return absl::DataLossError(absl::StrCat("document index '", path, "': its documents hold ",
                                            sum, " tokens; its shard holds ", shard_tokens));
  }
  return std::optional<DocumentIndex>(std::move(index));
}

}  // namespace zt
