// file_store.h: the example's segment/metadata store, a tent::ControlService.
//
// TENT publishes segments through a metadata service (etcd, redis, HTTP, or
// its P2P store). The example's two processes share a directory instead:
// updateLocal writes the local segment to DIR/NAME.segment (atomically: a
// temporary file renamed into place), and a remote segment is read from its
// file, kept in an in-process map, and read again when the caller asks for a
// refresh. Segment ids are given out by openSegment(name), per process.
#pragma once

#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>

#include "tent_types.h"

namespace orbite_tent {

class FileStore final : public tent::ControlService {
 public:
  FileStore(std::string dir, std::string local_name) : dir_(std::move(dir)) { local_.name = std::move(local_name); }

  tent::Status updateLocal(const std::function<void(tent::SegmentDesc &)> &mutate) override {
    std::lock_guard<std::mutex> g(lock_);
    mutate(local_);
    const std::string path = dir_ + "/" + local_.name + ".segment";
    const std::string tmp = path + ".tmp";
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << "segment " << local_.name << "\n";
      for (const tent::BufferDesc &b : local_.buffers) {
        out << "buffer " << b.addr << " " << b.length << " " << (b.location.empty() ? "*" : b.location) << "\n";
        for (const auto &[type, text] : b.transport_attrs) out << "attr " << static_cast<int>(type) << " " << text << "\n";
      }
      if (!out) return tent::Status::MetadataError("cannot write " + tmp);
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) return tent::Status::MetadataError("cannot publish " + path);
    return tent::Status::OK();
  }

  /// The id of segment `name` in this process (given out on first use).
  tent::SegmentID openSegment(const std::string &name) {
    std::lock_guard<std::mutex> g(lock_);
    for (const auto &[id, n] : names_)
      if (n == name) return id;
    tent::SegmentID id = next_id_++;
    names_[id] = name;
    return id;
  }

  tent::Status getSegment(tent::SegmentID id, bool refresh, std::shared_ptr<const tent::SegmentDesc> &out) override {
    std::lock_guard<std::mutex> g(lock_);
    auto name = names_.find(id);
    if (name == names_.end()) return tent::Status::InvalidArgument("no segment id " + std::to_string(id));
    auto cached = cache_.find(id);
    if (cached != cache_.end() && !refresh) {
      out = cached->second;
      return tent::Status::OK();
    }
    std::ifstream in(dir_ + "/" + name->second + ".segment");
    if (!in) return tent::Status::MetadataError("segment " + name->second + " is not published");
    auto seg = std::make_shared<tent::SegmentDesc>();
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream w(line);
      std::string kind;
      w >> kind;
      if (kind == "segment") {
        w >> seg->name;
      } else if (kind == "buffer") {
        tent::BufferDesc b;
        w >> b.addr >> b.length >> b.location;
        seg->buffers.push_back(b);
      } else if (kind == "attr" && !seg->buffers.empty()) {
        int type = 0;
        w >> type;
        std::string text;
        std::getline(w >> std::ws, text);
        auto t = static_cast<tent::TransportType>(type);
        seg->buffers.back().transports.push_back(t);
        seg->buffers.back().transport_attrs[t] = text;
      }
    }
    cache_[id] = seg;
    out = seg;
    return tent::Status::OK();
  }

 private:
  std::string dir_;
  std::mutex lock_;
  tent::SegmentDesc local_;
  std::map<tent::SegmentID, std::string> names_;
  std::map<tent::SegmentID, std::shared_ptr<const tent::SegmentDesc>> cache_;
  tent::SegmentID next_id_ = 1;
};

}  // namespace orbite_tent
