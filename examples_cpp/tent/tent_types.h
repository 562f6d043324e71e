// tent_types.h: the few types of TENT's transport interface that the OrbiteTransport
// adapter uses, declared here so that the example builds without a Mooncake tree.
//
// They follow the shape of TENT's runtime headers (a Transport base class with
// install / sub-batches / per-task status / buffers / local memory, requests naming
// a target segment and the remote address, buffer descriptors that carry per-transport
// attributes) with this example's own minimal definitions. Moving the adapter into
// TENT's tree means deleting this header and including TENT's own
// (tent/runtime/transport.h, tent/common/types.h, tent/runtime/segment.h,
// tent/common/status.h); docs/tent-integration.md lists what changes then.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace tent {

/// Outcome of a transport call: OK, or a code and a message.
class Status {
 public:
  enum class Code { kOk, kInvalidArgument, kTooManyRequests, kAddressNotRegistered, kNotImplemented,
                    kInternalError, kMetadataError };
  Status() = default;
  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string m) { return Status(Code::kInvalidArgument, std::move(m)); }
  static Status TooManyRequests(std::string m) { return Status(Code::kTooManyRequests, std::move(m)); }
  static Status AddressNotRegistered(std::string m) { return Status(Code::kAddressNotRegistered, std::move(m)); }
  static Status NotImplemented(std::string m) { return Status(Code::kNotImplemented, std::move(m)); }
  static Status InternalError(std::string m) { return Status(Code::kInternalError, std::move(m)); }
  static Status MetadataError(std::string m) { return Status(Code::kMetadataError, std::move(m)); }
  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string &message() const { return message_; }
  std::string ToString() const { return ok() ? "OK" : message_; }

 private:
  Status(Code c, std::string m) : code_(c), message_(std::move(m)) {}
  Code code_ = Code::kOk;
  std::string message_;
};

/// Transports an engine may load. Values travel between processes: a new
/// one is appended before the end, never inserted.
enum class TransportType : int { UNSPEC = 0, RDMA, MNNVL, SHM, NVLINK, GDS, IOURING, TCP, ORBITE };

/// Which process's memory a request names.
using SegmentID = std::uint64_t;

/// One transfer between local memory and a remote segment.
struct Request {
  enum OpCode { READ, WRITE };
  OpCode opcode = READ;
  void *source = nullptr;             ///< local memory
  SegmentID target_id = 0;            ///< the remote segment
  std::uint64_t target_offset = 0;    ///< the remote process's own address of the bytes
  std::size_t length = 0;
};

enum class TransferStatusEnum { INITIAL, PENDING, INVALID, CANCELED, COMPLETED, TIMEOUT, FAILED };

/// One task's state and the bytes it moved.
struct TransferStatus {
  TransferStatusEnum s = TransferStatusEnum::INITIAL;
  std::size_t transferred_bytes = 0;
};

/// Where memory is: "cpu:NODE", "cuda:DEVICE", or "*".
struct MemoryOptions {
  std::string location = "cpu:0";
};

/// A registered buffer as the segment publishes it. A transport adds its type
/// to `transports` and what a remote needs to `transport_attrs[type]`.
struct BufferDesc {
  std::uint64_t addr = 0;
  std::size_t length = 0;
  std::string location;
  std::vector<TransportType> transports;
  std::map<TransportType, std::string> transport_attrs;
};

/// A process's published memory.
struct SegmentDesc {
  std::string name;
  std::vector<BufferDesc> buffers;
  /// The buffer holding [addr, addr+len), or null.
  const BufferDesc *findBuffer(std::uint64_t addr, std::size_t len) const {
    for (const BufferDesc &b : buffers)
      if (addr >= b.addr && addr + len <= b.addr + b.length) return &b;
    return nullptr;
  }
};

/// The segment/metadata store the engine installs transports against: the
/// local segment is published there; remote segments are looked up by id.
class ControlService {
 public:
  virtual ~ControlService() = default;
  /// Changes the local segment and publishes it.
  virtual Status updateLocal(const std::function<void(SegmentDesc &)> &mutate) = 0;
  /// A snapshot of a remote segment (fresh from the store when `refresh`).
  virtual Status getSegment(SegmentID id, bool refresh, std::shared_ptr<const SegmentDesc> &out) = 0;
};

/// What a transport can move: local side first, remote second.
struct Capabilities {
  bool dram_to_dram = false;
  bool dram_to_gpu = false;
  bool gpu_to_dram = false;
  bool gpu_to_gpu = false;
  bool dram_to_file = false;
  bool gpu_to_file = false;
};

/// A notification between segments: the sender's name and the message.
struct Notification {
  std::string name;
  std::string msg;
};

/// The interface every transport of the engine implements.
class Transport {
 public:
  /// A transport's own record of one batch's tasks. Task ids are positions:
  /// the engine numbers a submission's tasks from size() on.
  struct SubBatch {
    virtual ~SubBatch() = default;
    virtual std::size_t size() const = 0;
  };
  using SubBatchRef = SubBatch *;

  virtual ~Transport() = default;
  virtual Status install(std::string &local_segment_name, std::shared_ptr<ControlService> metadata,
                         const std::string &config_json) = 0;
  virtual Status uninstall() { return Status::OK(); }
  virtual const Capabilities capabilities() const { return caps; }
  virtual Status allocateSubBatch(SubBatchRef &batch, std::size_t max_size) = 0;
  virtual Status freeSubBatch(SubBatchRef &batch) = 0;
  virtual Status submitTransferTasks(SubBatchRef batch, const std::vector<Request> &requests) = 0;
  virtual Status getTransferStatus(SubBatchRef batch, int task_id, TransferStatus &status) = 0;
  virtual bool supportsCancellation() const { return false; }
  virtual Status cancelTransferTask(SubBatchRef, int) { return Status::NotImplemented("cancellation"); }
  virtual Status allocateLocalMemory(void **addr, std::size_t size, MemoryOptions &options) = 0;
  virtual Status freeLocalMemory(void *addr, std::size_t size) = 0;
  virtual Status addMemoryBuffer(BufferDesc &desc, const MemoryOptions &options) = 0;
  virtual Status removeMemoryBuffer(BufferDesc &desc) = 0;
  virtual const char *getName() const = 0;
  virtual bool supportNotification() const { return false; }
  virtual Status sendNotification(SegmentID, const Notification &) { return Status::NotImplemented("notifications"); }
  virtual Status receiveNotification(std::vector<Notification> &) { return Status::NotImplemented("notifications"); }

 protected:
  Capabilities caps;
};

}  // namespace tent
