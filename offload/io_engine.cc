#include "offload/io_engine.h"

#include <liburing.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <vector>

#include "absl/strings/str_cat.h"

namespace zt::offload {

absl::Status IoErrnoStatus(int err, absl::string_view what, const std::string& path) {
  const std::string msg = absl::StrCat(what, " '", path, "': ", std::strerror(err));
  switch (err) {
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      return absl::ResourceExhaustedError(msg);
    case ENOENT:
      return absl::NotFoundError(msg);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(msg);
    case EIO:
      return absl::DataLossError(msg);
    default:
      return absl::ErrnoToStatus(err, msg);
  }
}

namespace {

std::string OpText(const IoOp& op) {
  return absl::StrCat(op.kind == IoOp::Kind::kRead ? "read" : "write", " of ", op.length,
                      " bytes at offset ", op.offset, " of");
}

const std::string& PathOf(const IoOp& op) {
  static const std::string kUnknown = "(unnamed file)";
  return op.path != nullptr ? *op.path : kUnknown;
}

// A transfer that came back short continues from where it stopped.
absl::Status Advance(IoOp& op, int64_t done) {
  if (done == 0) {
    return absl::DataLossError(
        absl::StrCat(OpText(op), " '", PathOf(op), "': the file ends before the extent does"));
  }
  op.buf += done;
  op.length -= static_cast<size_t>(done);
  op.offset += static_cast<uint64_t>(done);
  return absl::OkStatus();
}

class PosixEngine : public IoEngine {
 public:
  absl::Status Run(absl::Span<const IoOp> ops) override {
    for (IoOp op : ops) {
      while (op.length > 0) {
        const ssize_t n = op.kind == IoOp::Kind::kRead
                              ? pread(op.fd, op.buf, op.length, static_cast<off_t>(op.offset))
                              : pwrite(op.fd, op.buf, op.length, static_cast<off_t>(op.offset));
        if (n < 0) {
          if (errno == EINTR) continue;
          return IoErrnoStatus(errno, OpText(op), PathOf(op));
        }
        if (auto s = Advance(op, n); !s.ok()) return s;
      }
    }
    return absl::OkStatus();
  }
  absl::Status SyncData(int fd, const std::string& path) override {
    if (fdatasync(fd) != 0) return IoErrnoStatus(errno, "fdatasync", path);
    return absl::OkStatus();
  }
  bool uses_io_uring() const override { return false; }
};

class UringEngine : public IoEngine {
 public:
  explicit UringEngine(unsigned depth) : depth_(depth) {}
  ~UringEngine() override {
    if (initialized_) io_uring_queue_exit(&ring_);
  }
  // 0, or the negated errno of io_uring_setup.
  int Init() {
    const int r = io_uring_queue_init(depth_, &ring_, 0);
    initialized_ = r == 0;
    return r;
  }

  absl::Status Run(absl::Span<const IoOp> ops) override {
    // The ops not yet submitted, and those in flight by slot (user_data is the slot).
    std::deque<IoOp> pending(ops.begin(), ops.end());
    std::vector<IoOp> slots(depth_);
    std::vector<size_t> free_slots;
    for (size_t i = depth_; i > 0; --i) free_slots.push_back(i - 1);
    size_t in_flight = 0;
    absl::Status first_error;
    while (in_flight > 0 || (!pending.empty() && first_error.ok())) {
      bool queued = false;
      while (first_error.ok() && !pending.empty() && !free_slots.empty()) {
        io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
        if (sqe == nullptr) break;
        const size_t slot = free_slots.back();
        free_slots.pop_back();
        slots[slot] = pending.front();
        pending.pop_front();
        const IoOp& op = slots[slot];
        if (op.kind == IoOp::Kind::kRead) {
          io_uring_prep_read(sqe, op.fd, op.buf, static_cast<unsigned>(op.length), op.offset);
        } else {
          io_uring_prep_write(sqe, op.fd, op.buf, static_cast<unsigned>(op.length), op.offset);
        }
        io_uring_sqe_set_data64(sqe, slot);
        ++in_flight;
        queued = true;
      }
      if (queued) {
        const int r = io_uring_submit(&ring_);
        if (r < 0) return IoErrnoStatus(-r, "io_uring_submit for", PathOf(slots[0]));
      }
      io_uring_cqe* cqe = nullptr;
      int r;
      do {
        r = io_uring_wait_cqe(&ring_, &cqe);
      } while (r == -EINTR);
      if (r < 0) return IoErrnoStatus(-r, "io_uring_wait_cqe for", PathOf(slots[0]));
      const size_t slot = io_uring_cqe_get_data64(cqe);
      const int res = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      --in_flight;
      IoOp& op = slots[slot];
      absl::Status s = res < 0 ? IoErrnoStatus(-res, OpText(op), PathOf(op)) : Advance(op, res);
      if (!s.ok()) {
        if (first_error.ok()) first_error = s;
        free_slots.push_back(slot);
        continue;  // drain what is in flight: its buffers must not be reused under the kernel
      }
      if (op.length > 0) {
        pending.push_front(op);  // the rest of a short transfer
      }
      free_slots.push_back(slot);
    }
    return first_error;
  }

  absl::Status SyncData(int fd, const std::string& path) override {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) return absl::InternalError("io_uring: no free submission entry");
    io_uring_prep_fsync(sqe, fd, IORING_FSYNC_DATASYNC);
    int r = io_uring_submit(&ring_);
    if (r < 0) return IoErrnoStatus(-r, "io_uring_submit of fdatasync for", path);
    io_uring_cqe* cqe = nullptr;
    do {
      r = io_uring_wait_cqe(&ring_, &cqe);
    } while (r == -EINTR);
    if (r < 0) return IoErrnoStatus(-r, "io_uring_wait_cqe of fdatasync for", path);
    const int res = cqe->res;
    io_uring_cqe_seen(&ring_, cqe);
    if (res < 0) return IoErrnoStatus(-res, "fdatasync", path);
    return absl::OkStatus();
  }
  bool uses_io_uring() const override { return true; }

 private:
  const unsigned depth_;
  bool initialized_ = false;
  io_uring ring_{};
};

}  // namespace

absl::StatusOr<std::unique_ptr<IoEngine>> CreateIoEngine(unsigned queue_depth,
                                                         const WarningSink& warn) {
  if (queue_depth < 1 || queue_depth > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("io engine: queue_depth ", queue_depth, " is outside 1..4096"));
  }
  auto engine = std::make_unique<UringEngine>(queue_depth);
  const int r = engine->Init();
  if (r == 0) return std::unique_ptr<IoEngine>(std::move(engine));
  if (warn) {
    warn(absl::StrCat("io_uring_setup refused (", std::strerror(-r),
                      "): swap I/O falls back to pread/pwrite, one request at a time"));
  }
  return std::unique_ptr<IoEngine>(std::make_unique<PosixEngine>());
}

}  // namespace zt::offload
