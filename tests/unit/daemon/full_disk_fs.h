// A RocksDB FileSystem that behaves like a disk that filled up, on demand: while full, every
// write, flush or sync of a file and every new file fails with IOStatus::NoSpace (ENOSPC), as
// a full state disk makes them fail. With SetSyncsFail only syncs fail (ENOSPC from delayed
// allocation: the bytes were taken, but cannot be made durable). It counts the syncs that
// succeeded. Reads and everything else pass through to the real file system. Thread-safe (the
// switches are atomics).
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "rocksdb/env.h"
#include "rocksdb/file_system.h"

namespace zt::testing {

class FullDiskFs : public rocksdb::FileSystemWrapper {
 public:
  FullDiskFs() : FileSystemWrapper(rocksdb::FileSystem::Default()) {}
  const char* Name() const override { return "ZtFullDiskFs"; }

  void SetFull(bool full) { full_.store(full); }
  bool full() const { return full_.load(); }
  void SetSyncsFail(bool fail) { syncs_fail_.store(fail); }
  // Writes refused so far.
  int refused() const { return refused_.load(); }
  // Syncs of a file that succeeded so far.
  int syncs() const { return syncs_.load(); }

  rocksdb::IOStatus NewWritableFile(const std::string& fname, const rocksdb::FileOptions& options,
                                    std::unique_ptr<rocksdb::FSWritableFile>* result,
                                    rocksdb::IODebugContext* dbg) override {
    if (full()) return Refuse();
    rocksdb::IOStatus s = target()->NewWritableFile(fname, options, result, dbg);
    if (s.ok()) *result = std::make_unique<File>(std::move(*result), this);
    return s;
  }
  rocksdb::IOStatus ReopenWritableFile(const std::string& fname,
                                       const rocksdb::FileOptions& options,
                                       std::unique_ptr<rocksdb::FSWritableFile>* result,
                                       rocksdb::IODebugContext* dbg) override {
    if (full()) return Refuse();
    rocksdb::IOStatus s = target()->ReopenWritableFile(fname, options, result, dbg);
    if (s.ok()) *result = std::make_unique<File>(std::move(*result), this);
    return s;
  }
  rocksdb::IOStatus ReuseWritableFile(const std::string& fname, const std::string& old_fname,
                                      const rocksdb::FileOptions& options,
                                      std::unique_ptr<rocksdb::FSWritableFile>* result,
                                      rocksdb::IODebugContext* dbg) override {
    if (full()) return Refuse();
    rocksdb::IOStatus s = target()->ReuseWritableFile(fname, old_fname, options, result, dbg);
    if (s.ok()) *result = std::make_unique<File>(std::move(*result), this);
    return s;
  }

 private:
  class File : public rocksdb::FSWritableFileOwnerWrapper {
   public:
    File(std::unique_ptr<rocksdb::FSWritableFile> file, FullDiskFs* fs)
        : FSWritableFileOwnerWrapper(std::move(file)), fs_(fs) {}
    rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& options,
                             rocksdb::IODebugContext* dbg) override {
      if (fs_->full()) return fs_->Refuse();
      return FSWritableFileOwnerWrapper::Append(data, options, dbg);
    }
    rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& options,
                             const rocksdb::DataVerificationInfo& info,
                             rocksdb::IODebugContext* dbg) override {
      if (fs_->full()) return fs_->Refuse();
      return FSWritableFileOwnerWrapper::Append(data, options, info, dbg);
    }
    rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t offset,
                                       const rocksdb::IOOptions& options,
                                       rocksdb::IODebugContext* dbg) override {
      if (fs_->full()) return fs_->Refuse();
      return FSWritableFileOwnerWrapper::PositionedAppend(data, offset, options, dbg);
    }
    rocksdb::IOStatus Flush(const rocksdb::IOOptions& options,
                            rocksdb::IODebugContext* dbg) override {
      if (fs_->full()) return fs_->Refuse();
      return FSWritableFileOwnerWrapper::Flush(options, dbg);
    }
    rocksdb::IOStatus Sync(const rocksdb::IOOptions& options,
                           rocksdb::IODebugContext* dbg) override {
      if (fs_->full() || fs_->syncs_fail_.load()) return fs_->Refuse();
      return fs_->Counted(FSWritableFileOwnerWrapper::Sync(options, dbg));
    }
    rocksdb::IOStatus Fsync(const rocksdb::IOOptions& options,
                            rocksdb::IODebugContext* dbg) override {
      if (fs_->full() || fs_->syncs_fail_.load()) return fs_->Refuse();
      return fs_->Counted(FSWritableFileOwnerWrapper::Fsync(options, dbg));
    }

   private:
    FullDiskFs* fs_;
  };

  rocksdb::IOStatus Refuse() {
    refused_.fetch_add(1);
    return rocksdb::IOStatus::NoSpace("injected: No space left on device");
  }

  rocksdb::IOStatus Counted(rocksdb::IOStatus synced) {
    if (synced.ok()) syncs_.fetch_add(1);
    return synced;
  }

  std::atomic<bool> full_{false};
  std::atomic<bool> syncs_fail_{false};
  std::atomic<int> refused_{0};
  std::atomic<int> syncs_{0};
};

// A FullDiskFs and the Env a StateStore takes it through.
struct FullDiskEnv {
  std::shared_ptr<FullDiskFs> fs = std::make_shared<FullDiskFs>();
  std::unique_ptr<rocksdb::Env> env = rocksdb::NewCompositeEnv(fs);
};

}  // namespace zt::testing
