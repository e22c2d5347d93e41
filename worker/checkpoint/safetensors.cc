#include "worker/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/checkpoint/durable_file.h"

namespace zt {

// The format stores every number little-endian; the bytes are used as they lie in memory.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a LE host");

namespace {

// The reference implementation refuses headers above 100 MB; a larger length field is far more
// likely a corrupt file than a real header, and would otherwise make us parse garbage.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr size_t kWriteBufferBytes = 1 << 20;

struct DTypeEntry {
  StDType type;
  const char* name;
  int64_t size;
};

constexpr std::array<DTypeEntry, 15> kDTypes = {{
    {StDType::kBool, "BOOL", 1},
    {StDType::kU8, "U8", 1},
    {StDType::kI8, "I8", 1},
    {StDType::kF8E5M2, "F8_E5M2", 1},
    {StDType::kF8E4M3, "F8_E4M3", 1},
    {StDType::kI16, "I16", 2},
    {StDType::kU16, "U16", 2},
    {StDType::kF16, "F16", 2},
    {StDType::kBF16, "BF16", 2},
    {StDType::kI32, "I32", 4},
    {StDType::kU32, "U32", 4},
    {StDType::kF32, "F32", 4},
    {StDType::kF64, "F64", 8},
    {StDType::kI64, "I64", 8},
    {StDType::kU64, "U64", 8},
}};

const DTypeEntry& Entry(StDType t) { return kDTypes[static_cast<size_t>(t)]; }

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// numel × element size, or nullopt when it overflows int64.
std::optional<int64_t> ByteSize(const std::vector<int64_t>& shape, StDType dtype) {
  int64_t n = StDTypeSize(dtype);
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return std::nullopt;
  }
  return n;
}

// A JSON number that is a non-negative integer fitting int64, or nullopt.
std::optional<int64_t> AsNonNegativeInt(const nlohmann::json& v) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (i >= 0) return i;
  }
  return std::nullopt;
}

absl::Status ErrnoStatus(int err, std::string_view what, const std::string& path) {
  return absl::Status(absl::ErrnoToStatusCode(err),
                      absl::StrCat(path, ": ", std::string(what), ": ", std::strerror(err)));
}

}  // namespace

int64_t StDTypeSize(StDType t) { return Entry(t).size; }

const char* StDTypeName(StDType t) { return Entry(t).name; }

std::optional<StDType> ParseStDType(std::string_view name) {
  for (const DTypeEntry& e : kDTypes) {
    if (e.name == name) return e.type;
  }
  return std::nullopt;
}

StDType ToStDType(DType t) {
  switch (t) {
    case DType::kF32:
      return StDType::kF32;
    case DType::kF16:
      return StDType::kF16;
    case DType::kBF16:
      return StDType::kBF16;
    case DType::kI32:
      return StDType::kI32;
    case DType::kU8:
      return StDType::kU8;
    case DType::kI16:
      return StDType::kI16;
  }
  return StDType::kU8;
}

int64_t SafetensorsTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---------------------------------------------------------------------------------------------
// Reader

namespace {

// Parses one tensor entry of the header into `info`, or says what is wrong with it.
absl::Status ParseTensorEntry(const std::string& name, const nlohmann::json& v, int64_t data_size,
                              SafetensorsTensorInfo& info) {
  info.name = name;
  if (!v.is_object()) return absl::DataLossError("its header entry is not a JSON object");
  const auto dtype_it = v.find("dtype");
  if (dtype_it == v.end() || !dtype_it->is_string()) {
    return absl::DataLossError("\"dtype\" is missing or not a string");
  }
  const std::optional<StDType> dtype = ParseStDType(dtype_it->get<std::string>());
  if (!dtype) {
    return absl::DataLossError(
        absl::StrCat("unknown dtype \"", dtype_it->get<std::string>(), "\""));
  }
  info.dtype = *dtype;

  const auto shape_it = v.find("shape");
  if (shape_it == v.end() || !shape_it->is_array()) {
    return absl::DataLossError("\"shape\" is missing or not an array");
  }
  for (const nlohmann::json& d : *shape_it) {
    const std::optional<int64_t> dim = AsNonNegativeInt(d);
    if (!dim) return absl::DataLossError("\"shape\" holds a value that is not a size ≥ 0");
    info.shape.push_back(*dim);
  }

  const auto off_it = v.find("data_offsets");
  if (off_it == v.end() || !off_it->is_array() || off_it->size() != 2) {
    return absl::DataLossError("\"data_offsets\" is missing or not a [begin, end] pair");
  }
  const std::optional<int64_t> begin = AsNonNegativeInt((*off_it)[0]);
  const std::optional<int64_t> end = AsNonNegativeInt((*off_it)[1]);
  if (!begin || !end || *begin > *end) {
    return absl::DataLossError("\"data_offsets\" must be integers with 0 ≤ begin ≤ end");
  }
  info.begin = *begin;
  info.end = *end;
  if (info.end > data_size) {
    return absl::DataLossError(absl::StrCat("data_offsets [", info.begin, ", ", info.end,
                                            ") run past the end of the data region (", data_size,
                                            " bytes): the file is truncated"));
  }
  const std::optional<int64_t> expected = ByteSize(info.shape, info.dtype);
  if (!expected) {
    return absl::DataLossError(
        absl::StrCat("shape ", ShapeString(info.shape), " overflows a 64-bit byte count"));
  }
  if (*expected != info.nbytes()) {
    return absl::DataLossError(absl::StrCat(
        "data_offsets [", info.begin, ", ", info.end, ") hold ", info.nbytes(), " bytes but dtype ",
        StDTypeName(info.dtype), " × shape ", ShapeString(info.shape), " needs ", *expected));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "cannot open safetensors file", path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoStatus(err, "cannot stat safetensors file", path);
  }
  const auto file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    return absl::DataLossError(absl::StrCat(path, ": safetensors file is ", file_size,
                                            " bytes, shorter than its 8-byte header length"));
  }
  void* map = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_err = errno;
  ::close(fd);  // the mapping keeps the file open
  if (map == MAP_FAILED) return ErrnoStatus(map_err, "cannot mmap safetensors file", path);

  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->map_ = static_cast<const uint8_t*>(map);
  file->map_size_ = file_size;

  uint64_t header_len;
  std::memcpy(&header_len, file->map_, 8);
  if (header_len > kMaxHeaderBytes) {
    return absl::DataLossError(absl::StrCat(path, ": header length ", header_len, " exceeds the ",
                                            kMaxHeaderBytes, "-byte limit"));
  }
  if (header_len > file_size - 8) {
    return absl::DataLossError(absl::StrCat(path, ": header length ", header_len,
                                            " runs past the end of the file (", file_size,
                                            " bytes)"));
  }
  file->data_ = file->map_ + 8 + header_len;
  const auto data_size = static_cast<int64_t>(file_size - 8 - header_len);

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(file->map_ + 8, file->map_ + 8 + header_len);
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(absl::StrCat(path, ": header is not valid JSON: ", e.what()));
  }
  if (!header.is_object()) {
    return absl::DataLossError(absl::StrCat(path, ": header is not a JSON object"));
  }

  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) {
        return absl::DataLossError(absl::StrCat(path, ": \"__metadata__\" is not an object"));
      }
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) {
          return absl::DataLossError(
              absl::StrCat(path, ": \"__metadata__\" value of \"", mk, "\" is not a string"));
        }
        file->metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    SafetensorsTensorInfo info;
    absl::Status s = ParseTensorEntry(key, value, data_size, info);
    if (!s.ok()) {
      return absl::DataLossError(absl::StrCat(path, ": tensor \"", key, "\": ", s.message()));
    }
    file->tensors_.push_back(std::move(info));
  }

  std::sort(file->tensors_.begin(), file->tensors_.end(),
            [](const SafetensorsTensorInfo& a, const SafetensorsTensorInfo& b) {
              return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
            });
  // Empty tensors occupy no bytes and may share an offset with anything.
  const SafetensorsTensorInfo* last = nullptr;
  for (const SafetensorsTensorInfo& t : file->tensors_) {
    if (t.nbytes() == 0) continue;
    if (last != nullptr && t.begin < last->end) {
      return absl::DataLossError(absl::StrCat(path, ": tensor \"", t.name, "\" bytes [", t.begin,
                                              ", ", t.end, ") overlap tensor \"", last->name,
                                              "\" bytes [", last->begin, ", ", last->end, ")"));
    }
    last = &t;
  }
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(const_cast<uint8_t*>(map_), map_size_);
}

const SafetensorsTensorInfo* SafetensorsFile::Find(std::string_view name) const {
  for (const SafetensorsTensorInfo& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

absl::Span<const uint8_t> SafetensorsFile::Bytes(const SafetensorsTensorInfo& tensor) const {
  return absl::Span<const uint8_t>(data_ + tensor.begin, static_cast<size_t>(tensor.nbytes()));
}

void SafetensorsFile::Release(const SafetensorsTensorInfo& tensor) const {
  Release(Bytes(tensor));
}

void SafetensorsFile::Release(absl::Span<const uint8_t> bytes) const {
  // MADV_DONTNEED zeroes anonymous memory: never advise outside this file's mapping.
  if (bytes.data() < map_ || bytes.data() + bytes.size() > map_ + map_size_) return;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto first = reinterpret_cast<uintptr_t>(bytes.data());
  const uintptr_t begin = (first + page - 1) / page * page;
  const uintptr_t end = (first + bytes.size()) / page * page;
  // Advice only: a failure leaves the pages resident, which is correct, just larger.
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

absl::Status SafetensorsFile::ReadAsF32(const SafetensorsTensorInfo& tensor,
                                        absl::Span<float> out) const {
  const int64_t n = tensor.numel();
  if (static_cast<int64_t>(out.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor \"", tensor.name, "\" has ", n,
                                                   " elements but the destination holds ",
                                                   out.size()));
  }
  const uint8_t* src = data_ + tensor.begin;
  switch (tensor.dtype) {
    case StDType::kF32:
      std::memcpy(out.data(), src, static_cast<size_t>(n) * 4);
      return absl::OkStatus();
    case StDType::kF16:
    case StDType::kBF16: {
      const bool half = tensor.dtype == StDType::kF16;
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        out[i] = half ? HalfToFloat(h) : Bf16ToFloat(h);
      }
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor \"", tensor.name,
                                                     "\" has dtype ", StDTypeName(tensor.dtype),
                                                     "; only F32, F16 and BF16 read as f32"));
  }
}

// ---------------------------------------------------------------------------------------------
// Writer

absl::StatusOr<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Create(
    const std::string& path, std::vector<SafetensorsTensorSpec> tensors,
    const std::map<std::string, std::string>& metadata) {
  std::unique_ptr<SafetensorsWriter> w(new SafetensorsWriter());
  w->path_ = path;
  w->tmp_path_ = path + ".tmp";

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  std::set<std::string> seen;
  int64_t offset = 0;
  for (const SafetensorsTensorSpec& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__") {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tensor name \"", t.name, "\" is not allowed (empty or \"__metadata__\")"));
    }
    if (!seen.insert(t.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor \"", t.name, "\" is declared twice"));
    }
    const std::optional<int64_t> nbytes = ByteSize(t.shape, t.dtype);
    if (!nbytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor \"", t.name, "\" shape ", ShapeString(t.shape),
                       " must have dimensions ≥ 0 and fit a 64-bit byte count"));
    }
    nlohmann::ordered_json entry = nlohmann::ordered_json::object();
    entry["dtype"] = StDTypeName(t.dtype);
    entry["shape"] = t.shape;
    entry["data_offsets"] = {offset, offset + *nbytes};
    header[t.name] = std::move(entry);
    w->nbytes_.push_back(*nbytes);
    offset += *nbytes;
  }
  w->specs_ = std::move(tensors);

  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": tensor names and metadata must be valid UTF-8: ", e.what()));
  }
  text.append((8 - text.size() % 8) % 8, ' ');

  w->fd_ = ::open(w->tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w->fd_ < 0) return ErrnoStatus(errno, "cannot create", w->tmp_path_);
  w->buffer_.reserve(kWriteBufferBytes);
  const uint64_t header_len = text.size();
  w->file_bytes_ = 8 + header_len + static_cast<uint64_t>(offset);
  ZT_RETURN_IF_ERROR(w->Append(&header_len, 8));
  ZT_RETURN_IF_ERROR(w->Append(text.data(), text.size()));
  return w;
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!finished_ && !tmp_path_.empty()) ::unlink(tmp_path_.c_str());
}

absl::Status SafetensorsWriter::IoError(std::string_view what, int err) const {
  const absl::Status status = ErrnoStatus(err, what, tmp_path_);
  if (err != ENOSPC && err != EDQUOT) return status;
  return absl::Status(status.code(),
                      absl::StrCat(status.message(), " (the file needs ", file_bytes_,
                                   " bytes; ", flushed_bytes_, " were written)"));
}

absl::Status SafetensorsWriter::CheckNext(std::string_view name, int64_t nbytes) const {
  if (!io_status_.ok()) return io_status_;
  if (finished_) {
    return absl::FailedPreconditionError(
        absl::StrCat(path_, ": tensor \"", std::string(name), "\" written after Finish()"));
  }
  if (next_ >= specs_.size()) {
    return absl::FailedPreconditionError(absl::StrCat(path_, ": tensor \"", std::string(name),
                                                      "\" written but all ", specs_.size(),
                                                      " declared tensors are already written"));
  }
  const SafetensorsTensorSpec& spec = specs_[next_];
  if (spec.name != name) {
    return absl::FailedPreconditionError(
        absl::StrCat(path_, ": tensor \"", std::string(name),
                     "\" written out of order; the next declared is \"", spec.name, "\""));
  }
  if (nbytes != nbytes_[next_]) {
    return absl::InvalidArgumentError(absl::StrCat(
        path_, ": tensor \"", std::string(name), "\" got ", nbytes, " bytes but ",
        StDTypeName(spec.dtype), " × ", ShapeString(spec.shape), " needs ", nbytes_[next_]));
  }
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::Flush() {
  const uint8_t* p = buffer_.data();
  size_t left = buffer_.size();
  while (left > 0) {
    const ssize_t n = ::write(fd_, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      io_status_ = IoError("write failed", errno);
      return io_status_;
    }
    p += n;
    left -= static_cast<size_t>(n);
    flushed_bytes_ += static_cast<uint64_t>(n);
  }
  buffer_.clear();
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::Append(const void* bytes, size_t size) {
  const auto* p = static_cast<const uint8_t*>(bytes);
  while (size > 0) {
    const size_t take = std::min(size, kWriteBufferBytes - buffer_.size());
    buffer_.insert(buffer_.end(), p, p + take);
    p += take;
    size -= take;
    if (buffer_.size() == kWriteBufferBytes) ZT_RETURN_IF_ERROR(Flush());
  }
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::Write(std::string_view name, absl::Span<const uint8_t> bytes) {
  ZT_RETURN_IF_ERROR(CheckNext(name, static_cast<int64_t>(bytes.size())));
  ZT_RETURN_IF_ERROR(Append(bytes.data(), bytes.size()));
  ++next_;
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::WriteF32(std::string_view name, absl::Span<const float> values) {
  const StDType dtype = next_ < specs_.size() ? specs_[next_].dtype : StDType::kF32;
  if (dtype != StDType::kF32 && dtype != StDType::kF16 && dtype != StDType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor \"", std::string(name),
                                                   "\" is declared ", StDTypeName(dtype),
                                                   "; only F32, F16 and BF16 take f32 values"));
  }
  const auto n = static_cast<int64_t>(values.size());
  ZT_RETURN_IF_ERROR(CheckNext(name, n * StDTypeSize(dtype)));
  if (dtype == StDType::kF32) {
    ZT_RETURN_IF_ERROR(Append(values.data(), values.size() * 4));
  } else {
    constexpr int64_t kChunk = 1 << 16;
    std::vector<uint16_t> chunk(static_cast<size_t>(std::min(n, kChunk)));
    for (int64_t start = 0; start < n; start += kChunk) {
      const int64_t len = std::min(kChunk, n - start);
      for (int64_t i = 0; i < len; ++i) {
        const float v = values[start + i];
        chunk[i] = dtype == StDType::kF16 ? FloatToHalf(v) : FloatToBf16(v);
      }
      ZT_RETURN_IF_ERROR(Append(chunk.data(), static_cast<size_t>(len) * 2));
    }
  }
  ++next_;
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::WriteRemaining(const FillFn& fill) {
  std::vector<uint8_t> bytes;
  while (next_ < specs_.size()) {
    const SafetensorsTensorSpec& spec = specs_[next_];
    bytes.assign(static_cast<size_t>(nbytes_[next_]), 0);
    ZT_RETURN_IF_ERROR(fill(spec, absl::MakeSpan(bytes)));
    ZT_RETURN_IF_ERROR(Write(spec.name, bytes));
  }
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::Finish() {
  if (finished_) return absl::FailedPreconditionError(absl::StrCat(path_, ": Finish() twice"));
  if (!io_status_.ok()) return io_status_;
  if (next_ < specs_.size()) {
    return absl::FailedPreconditionError(absl::StrCat(path_, ": Finish() before tensor \"",
                                                      specs_[next_].name, "\" was written (",
                                                      specs_.size() - next_, " left)"));
  }
  ZT_RETURN_IF_ERROR(Flush());
  if (::fsync(fd_) != 0) return IoError("fsync failed", errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) return IoError("close failed", errno);
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    return ErrnoStatus(errno, absl::StrCat("cannot rename ", tmp_path_, " to"), path_);
  }
  finished_ = true;
  // The rename itself is durable only once the directory entry is synced.
  std::string dir = std::filesystem::path(path_).parent_path().string();
  return durable_file::SyncDirectory(dir.empty() ? "." : dir);
}

}  // namespace zt
