// The safetensors file format: a reader that memory-maps a file and a writer that streams one.
//
// Layout on disk (https://github.com/huggingface/safetensors):
//   [0, 8)        N, the header length, unsigned 64-bit little-endian
//   [8, 8 + N)    the header: a UTF-8 JSON object
//                   {"__metadata__": {str: str},                       (optional)
//                    name: {"dtype": "F32", "shape": [d0, …], "data_offsets": [begin, end]}, …}
//                 padded with spaces so that the data starts 8-byte aligned
//   [8 + N, EOF)  the data; each tensor's bytes are [begin, end) counted from the data start,
//                 row-major, little-endian, end − begin = numel × dtype size.
//
// The format has no magic number or version of its own; the header's shape and offsets are
// checked against each other and against the file size instead, and anything inconsistent is
// DataLoss (the file is corrupt), with the file and the tensor named. Gaps between tensors and
// bytes after the last one are accepted (the reference reader refuses them; they make no read
// ambiguous). The writer never produces them.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/dtype.h"

namespace zt {

// The element types safetensors names. A superset of zt::DType: files written elsewhere carry
// F64, I64, I8, … and the reader must at least be able to list and skip them.
enum class StDType : uint8_t {
  kBool,
  kU8,
  kI8,
  kF8E5M2,
  kF8E4M3,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kF64,
  kI64,
  kU64,
};

// Bytes per element.
int64_t StDTypeSize(StDType t);
// The header's spelling: "F32", "BF16", "I64", … (a static string).
const char* StDTypeName(StDType t);
// The dtype a header string names, or nullopt for an unknown one.
std::optional<StDType> ParseStDType(std::string_view name);
// The safetensors dtype of a zt::DType (every zt::DType has one).
StDType ToStDType(DType t);

// One tensor of a file's header. Offsets count bytes from the start of the data region.
struct SafetensorsTensorInfo {
  std::string name;
  StDType dtype = StDType::kF32;
  std::vector<int64_t> shape;
  int64_t begin = 0;
  int64_t end = 0;

  int64_t numel() const;
  int64_t nbytes() const { return end - begin; }
};

// A read-only, memory-mapped safetensors file. Open() validates the whole header, so every
// view it hands out afterwards lies inside the mapping. Immutable after Open(): safe to use
// from several threads at once. The views live as long as the SafetensorsFile.
class SafetensorsFile {
 public:
  // Maps `path` and validates its header. NotFound (or another errno-derived code) when the
  // file cannot be opened; DataLoss naming the file (and the tensor, where one is at fault)
  // when the header length is implausible or runs past the file, the JSON does not parse or
  // has the wrong structure, a dtype is unknown, a tensor's offsets leave the data region or
  // disagree with dtype × shape, or two tensors' bytes overlap.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // Every tensor, in the order of their bytes in the file.
  const std::vector<SafetensorsTensorInfo>& tensors() const { return tensors_; }
  // The "__metadata__" object; empty when the file has none.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // The tensor called `name`, or nullptr.
  const SafetensorsTensorInfo* Find(std::string_view name) const;
  // The raw bytes of a tensor of this file (little-endian, row-major). Not aligned to the
  // element size in general: copy out with memcpy.
  absl::Span<const uint8_t> Bytes(const SafetensorsTensorInfo& tensor) const;
  // Drops the mapped pages wholly inside `tensor`'s bytes from this process's resident set
  // once they have been copied out (they are read again from the file if touched later), so
  // reading a checkpoint tensor by tensor holds about one tensor, not the file.
  void Release(const SafetensorsTensorInfo& tensor) const;
  // The same for the pages wholly inside `bytes`, a part of a view this file handed out.
  void Release(absl::Span<const uint8_t> bytes) const;

  // Converts a F32, F16 or BF16 tensor into `out`, which must hold exactly numel() floats.
  // InvalidArgument naming the file and the tensor for any other dtype or a size mismatch.
  absl::Status ReadAsF32(const SafetensorsTensorInfo& tensor, absl::Span<float> out) const;

 private:
  SafetensorsFile() = default;

  std::string path_;
  const uint8_t* map_ = nullptr;
  size_t map_size_ = 0;
  const uint8_t* data_ = nullptr;  // map_ + 8 + N
  std::vector<SafetensorsTensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A tensor the writer will write: its data offsets follow from the declaration order.
struct SafetensorsTensorSpec {
  std::string name;
  StDType dtype = StDType::kF32;
  std::vector<int64_t> shape;
};

// Writes one safetensors file tensor by tensor, so a model larger than memory can be saved
// without building the file in memory. All tensors are declared up front (the header, which
// holds every offset, comes first in the file); their data then follows in declaration order.
//
// The file is written to `path + ".tmp"`; Finish() fsyncs it, renames it to `path` and fsyncs
// the directory, so `path` is either absent, its old version, or complete. A writer destroyed
// before Finish() removes the temporary file. Not thread-safe.
//
// The header is compact JSON, "__metadata__" first, then the tensors in declaration order,
// each {"dtype","shape","data_offsets"}, padded with spaces to a multiple of 8 bytes: the same
// bytes the reference implementation writes for tensors in that order.
class SafetensorsWriter {
 public:
  // Creates `path + ".tmp"` and writes the header. InvalidArgument naming the tensor for an
  // empty, duplicate or reserved ("__metadata__") name, or a negative dimension; an
  // errno-derived status naming the file when it cannot be created or written.
  static absl::StatusOr<std::unique_ptr<SafetensorsWriter>> Create(
      const std::string& path, std::vector<SafetensorsTensorSpec> tensors,
      const std::map<std::string, std::string>& metadata = {});

  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Appends the bytes of the next declared tensor. FailedPrecondition when `name` is not the
  // next declared tensor; InvalidArgument when `bytes` is not exactly numel × dtype size.
  absl::Status Write(std::string_view name, absl::Span<const uint8_t> bytes);

  // Appends the next declared tensor from f32 values, converted to its declared dtype, which
  // must be F32, F16 or BF16 (round to nearest even). Same errors as Write().
  absl::Status WriteF32(std::string_view name, absl::Span<const float> values);

  // Fills every tensor not yet written, in order: `fill` receives the tensor's spec and a
  // buffer of exactly its size in bytes to fill. Stops at the first error `fill` returns.
  using FillFn = std::function<absl::Status(const SafetensorsTensorSpec&, absl::Span<uint8_t>)>;
  absl::Status WriteRemaining(const FillFn& fill);

  // Checks that every declared tensor was written, then syncs and renames the file into
  // place. FailedPrecondition naming the first unwritten tensor.
  absl::Status Finish();

  // The tensors, in declaration (= file) order.
  const std::vector<SafetensorsTensorSpec>& tensors() const { return specs_; }

 private:
  SafetensorsWriter() = default;

  absl::Status CheckNext(std::string_view name, int64_t nbytes) const;
  absl::Status Append(const void* bytes, size_t size);
  absl::Status Flush();
  absl::Status IoError(std::string_view what, int err) const;

  std::string path_;
  std::string tmp_path_;
  int fd_ = -1;
  bool finished_ = false;
  // The first write error; once set, the file is incomplete and every later call fails with it.
  absl::Status io_status_;
  std::vector<SafetensorsTensorSpec> specs_;
  std::vector<int64_t> nbytes_;
  size_t next_ = 0;
  // The whole file's size (header and data) and what has reached it: a full disk's error says
  // both, so the operator knows how much room the write needs.
  uint64_t file_bytes_ = 0;
  uint64_t flushed_bytes_ = 0;
  // Small tensors (biases, norms) are gathered here so they do not cost a syscall each.
  std::vector<uint8_t> buffer_;
};

}  // namespace zt
