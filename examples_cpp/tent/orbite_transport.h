// orbite_transport.h: OrbiteTransport, liborbite behind TENT's transport interface.
//
// One OrbiteTransport owns one OrbiteTE engine. Buffers the engine registers
// are published in the local segment with their OrbiteTE endpoint; requests
// name their target segment, and the adapter groups each submission per
// target, connects to each target's engine once and submits one OrbiteTE
// batch per target. The engine picks NVLink, MNNVL, SHM or TCP per batch
// (its transport_policy), and every task's status comes from its own
// request's outcome (orbite_batch_result). All methods may be called from
// several threads at once.
#pragma once

#include <orbite.hpp>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <vector>

#include "tent_types.h"

namespace orbite_tent {

/// The transport attributes OrbiteTE publishes for a buffer, and reads back.
struct BufferAttrs {
  std::string endpoint;   ///< the owning engine, "IP:port"
  std::uint64_t region = 0;
  /// "endpoint=IP:port region=N" (what goes into transport_attrs).
  std::string encode() const;
  /// Parses `text`; false when it is not an OrbiteTE attribute.
  static bool decode(const std::string &text, BufferAttrs &out);
};

class OrbiteTransport final : public tent::Transport {
 public:
  OrbiteTransport();
  ~OrbiteTransport() override;

  /// `config_json` is the engine's configuration (docs/config.md).
  tent::Status install(std::string &local_segment_name, std::shared_ptr<tent::ControlService> metadata,
                       const std::string &config_json) override;
  tent::Status uninstall() override;
  tent::Status allocateSubBatch(SubBatchRef &batch, std::size_t max_size) override;
  tent::Status freeSubBatch(SubBatchRef &batch) override;
  tent::Status submitTransferTasks(SubBatchRef batch, const std::vector<tent::Request> &requests) override;
  tent::Status getTransferStatus(SubBatchRef batch, int task_id, tent::TransferStatus &status) override;
  bool supportsCancellation() const override { return true; }
  tent::Status cancelTransferTask(SubBatchRef batch, int task_id) override;
  tent::Status allocateLocalMemory(void **addr, std::size_t size, tent::MemoryOptions &options) override;
  tent::Status freeLocalMemory(void *addr, std::size_t size) override;
  tent::Status addMemoryBuffer(tent::BufferDesc &desc, const tent::MemoryOptions &options) override;
  tent::Status removeMemoryBuffer(tent::BufferDesc &desc) override;
  const char *getName() const override { return "orbite"; }
  /// Notifications ride OrbiteTE's: in order per sender, after every
  /// transfer submitted to the target before them has ended there.
  bool supportNotification() const override { return true; }
  tent::Status sendNotification(tent::SegmentID target_id, const tent::Notification &notify) override;
  /// Appends every notification received so far (does not wait).
  tent::Status receiveNotification(std::vector<tent::Notification> &notify_list) override;

  /// The engine after install (for stats and for callers that need more
  /// of OrbiteTE).
  orbite::Engine &engine() { return *engine_; }

 private:
  struct Buffer;
  struct SubBatch;
  /// The peer serving `target`, connected on first use (or an error).
  orbite::Result<std::shared_ptr<orbite::Peer>> peer_for(tent::SegmentID target, bool refresh);
  void forget_peer(tent::SegmentID target);

  std::optional<orbite::Engine> engine_;
  std::shared_ptr<tent::ControlService> metadata_;
  std::string local_name_;
  std::mutex buffers_lock_;
  /// Registered buffers by address.
  std::map<std::uint64_t, std::unique_ptr<Buffer>> buffers_;
  /// Memory allocated through allocateLocalMemory, by address.
  std::map<std::uint64_t, orbite::Allocation> allocations_;
  std::shared_mutex peers_lock_;
  std::map<tent::SegmentID, std::shared_ptr<orbite::Peer>> peers_;
};

}  // namespace orbite_tent
