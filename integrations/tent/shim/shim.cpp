// The shim's implementation (see include/tent/common/status.h): what the
// adapter's tests need of TENT's status, config, segment manager and
// control service, written for the tests. None of it is TENT's code.
#include <glog/logging.h>

#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "tent/common/config.h"
#include "tent/runtime/control_plane.h"
#include "tent/runtime/segment_manager.h"

namespace mooncake {
namespace tent {

}  // namespace tent
}  // namespace mooncake

// ---- glog: lines to stderr, kept for the tests -----------------------------

namespace orbite_tent_shim {

namespace {
std::mutex log_lock;
std::vector<std::string> log_lines;
}  // namespace

void log_line(const char* severity, const std::string& text) {
    std::fprintf(stderr, "%s %s\n", severity, text.c_str());
    std::lock_guard<std::mutex> g(log_lock);
    log_lines.push_back(std::string(severity) + " " + text);
}

std::vector<std::string> logged() {
    std::lock_guard<std::mutex> g(log_lock);
    return log_lines;
}

}  // namespace orbite_tent_shim

namespace mooncake {
namespace tent {

std::string_view Status::CodeToString(Code code) {
    switch (code) {
        case Code::kOk: return "OK";
        case Code::kInvalidArgument: return "InvalidArgument";
        case Code::kTooManyRequests: return "TooManyRequests";
        case Code::kAddressNotRegistered: return "AddressNotRegistered";
        case Code::kDeviceNotFound: return "DeviceNotFound";
        case Code::kInvalidEntry: return "InvalidEntry";
        case Code::kInvalidMetadataType: return "InvalidMetadataType";
        case Code::kNeedsRefreshCache: return "NeedsRefreshCache";
        case Code::kRdmaError: return "RdmaError";
        case Code::kCudaError: return "CudaError";
        case Code::kMetadataError: return "MetadataError";
        case Code::kRpcServiceError: return "RpcServiceError";
        case Code::kMalformedJson: return "MalformedJson";
        case Code::kInternalError: return "InternalError";
        case Code::kNotImplemented: return "NotImplemented";
        default: return "Unknown";
    }
}

std::string Status::ToString() const {
    std::string out(CodeToString(code_));
    if (!message_.empty()) out += ": " + message_;
    return out;
}

// ---- Config: a JSON document, read by key path ----------------------------

namespace {

/// Scans JSON text: `skip` moves past one value, returning false on
/// malformed input.
struct Scan {
    const std::string& s;
    size_t i = 0;
    void space() {
        while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    }
    bool string(std::string* out) {
        if (i >= s.size() || s[i] != '"') return false;
        for (++i; i < s.size(); ++i) {
            char c = s[i];
            if (c == '"') {
                ++i;
                return true;
            }
            if (c == '\\') {
                if (++i >= s.size()) return false;
                char e = s[i];
                if (out) *out += e == 'n' ? '\n' : e == 't' ? '\t' : e;
                continue;
            }
            if (out) *out += c;
        }
        return false;
    }
    bool skip(int depth = 0) {
        if (depth > 64) return false;
        space();
        if (i >= s.size()) return false;
        char c = s[i];
        if (c == '"') return string(nullptr);
        if (c == '{' || c == '[') {
            char close = c == '{' ? '}' : ']';
            ++i;
            space();
            if (i < s.size() && s[i] == close) return ++i, true;
            for (;;) {
                if (c == '{') {
                    space();
                    if (!string(nullptr)) return false;
                    space();
                    if (i >= s.size() || s[i++] != ':') return false;
                }
                if (!skip(depth + 1)) return false;
                space();
                if (i < s.size() && s[i] == ',') {
                    ++i;
                    continue;
                }
                if (i < s.size() && s[i] == close) return ++i, true;
                return false;
            }
        }
        size_t from = i;
        while (i < s.size() && (std::isalnum(static_cast<unsigned char>(s[i])) || s[i] == '-' || s[i] == '+' ||
                                s[i] == '.'))
            ++i;
        return i > from;
    }
    /// In the object at i: moves to the value of `key`.
    bool member(const std::string& key) {
        space();
        if (i >= s.size() || s[i] != '{') return false;
        ++i;
        for (;;) {
            space();
            std::string k;
            if (!string(&k)) return false;
            space();
            if (i >= s.size() || s[i++] != ':') return false;
            space();
            if (k == key) return true;
            if (!skip()) return false;
            space();
            if (i < s.size() && s[i] == ',') {
                ++i;
                continue;
            }
            return false;
        }
    }
};

}  // namespace

Status Config::load(const std::string& content) {
    Scan scan{content};
    scan.space();
    if (scan.i >= content.size() || content[scan.i] != '{' || !scan.skip())
        return Status::MalformedJson("the config is not a JSON object" LOC_MARK);
    std::lock_guard<std::mutex> g(mutex_);
    document_ = content;
    return Status::OK();
}

std::string Config::dump(int) const {
    std::lock_guard<std::mutex> g(mutex_);
    return document_;
}

bool Config::dumpSubtree(const std::string& key_path, std::string* out) const {
    std::lock_guard<std::mutex> g(mutex_);
    Scan scan{document_};
    size_t start = 0;
    while (start < key_path.size()) {
        size_t slash = key_path.find('/', start);
        std::string part = key_path.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
        start = slash == std::string::npos ? key_path.size() : slash + 1;
        if (part.empty()) continue;
        if (!scan.member(part)) return false;
    }
    size_t from = scan.i;
    if (!scan.skip()) return false;
    *out = document_.substr(from, scan.i - from);
    return true;
}

bool Config::convert(const std::string& text, std::string& out) {
    Scan scan{text};
    std::string s;
    if (!scan.string(&s)) return false;
    out = s;
    return true;
}

bool Config::convert(const std::string& text, bool& out) {
    if (text == "true" || text == "false") {
        out = text == "true";
        return true;
    }
    return false;
}

bool Config::convert(const std::string& text, double& out) {
    char* end = nullptr;
    out = std::strtod(text.c_str(), &end);
    return end && *end == '\0' && !text.empty();
}

bool Config::convert(const std::string& text, long long& out) {
    char* end = nullptr;
    out = std::strtoll(text.c_str(), &end, 10);
    return end && *end == '\0' && !text.empty();
}

// ---- SegmentManager: segments in a shared directory -----------------------

namespace {

/// TENT keeps each thread's copies of remote segments apart (a
/// thread-local cache, emptied everywhere when a version is bumped); so
/// does the shim: per thread, per manager.
struct ThreadCache {
    uint64_t version = 0;
    std::map<SegmentID, SegmentDescRef> descs;
};
std::atomic<uint64_t> next_manager{1};

ThreadCache& threadCache(uint64_t manager) {
    thread_local std::map<uint64_t, ThreadCache> caches;
    return caches[manager];
}

}  // namespace

SegmentManager::SegmentManager(std::string dir, std::string local_name, std::string rpc_server_addr)
    : dir_(std::move(dir)), local_(std::make_shared<SegmentDesc>()), id_(next_manager.fetch_add(1)) {
    local_->name = std::move(local_name);
    local_->type = SegmentType::Memory;
    local_->rpc_server_addr = std::move(rpc_server_addr);
    local_->detail = MemorySegmentDesc{};
}

Status SegmentManager::openRemote(SegmentID& handle, const std::string& segment_name) {
    std::lock_guard<std::mutex> g(lock_);
    for (const auto& [id, n] : names_)
        if (n == segment_name) {
            handle = id;
            return Status::OK();
        }
    handle = next_id_++;
    names_[handle] = segment_name;
    return Status::OK();
}

Status SegmentManager::closeRemote(SegmentID handle) {
    std::lock_guard<std::mutex> g(lock_);
    names_.erase(handle);
    return Status::OK();
}

Status SegmentManager::getRemoteCached(SegmentDescRef& desc, SegmentID handle) {
    if (handle == LOCAL_SEGMENT_ID) {
        desc = getLocal();
        return Status::OK();
    }
    ThreadCache& cache = threadCache(id_);
    uint64_t version = version_.load();
    if (cache.version != version) {
        cache.descs.clear();
        cache.version = version;
    }
    auto cached = cache.descs.find(handle);
    if (cached != cache.descs.end()) {
        desc = cached->second;
        return Status::OK();
    }
    std::string segment;
    {
        std::lock_guard<std::mutex> g(lock_);
        auto name = names_.find(handle);
        if (name == names_.end()) return Status::InvalidArgument("no segment id " + std::to_string(handle) + LOC_MARK);
        segment = name->second;
    }
    std::ifstream in(dir_ + "/" + segment + ".segment");
    if (!in) return Status::MetadataError("segment " + segment + " is not published" LOC_MARK);
    auto seg = std::make_shared<SegmentDesc>();
    seg->type = SegmentType::Memory;
    MemorySegmentDesc mem;
    std::string line;
    while (std::getline(in, line)) {
        std::istringstream w(line);
        std::string kind;
        w >> kind;
        if (kind == "segment") {
            w >> seg->name >> seg->rpc_server_addr;
        } else if (kind == "buffer") {
            BufferDesc b{};
            w >> b.addr >> b.length >> b.location;
            mem.buffers.push_back(b);
        } else if (kind == "attr" && !mem.buffers.empty()) {
            int type = 0;
            w >> type;
            std::string text;
            std::getline(w >> std::ws, text);
            auto t = static_cast<TransportType>(type);
            mem.buffers.back().transports.push_back(t);
            mem.buffers.back().transport_attrs[t] = text;
        }
    }
    seg->detail = std::move(mem);
    cache.descs[handle] = seg;
    desc = seg;
    return Status::OK();
}

Status SegmentManager::invalidateRemote(SegmentID handle) {
    threadCache(id_).descs.erase(handle);
    return Status::OK();
}

Status SegmentManager::invalidateAllCacheForRemote(const std::string&) {
    version_.fetch_add(1);
    return Status::OK();
}

SegmentDescRef SegmentManager::getLocal() {
    std::lock_guard<std::mutex> g(lock_);
    return local_;
}

Status SegmentManager::updateLocal(const std::function<Status(SegmentDesc&)>& mutator) {
    std::lock_guard<std::mutex> g(lock_);
    auto next = std::make_shared<SegmentDesc>(*local_);
    CHECK_STATUS(mutator(*next));
    local_ = next;
    return Status::OK();
}

Status SegmentManager::synchronizeLocal() {
    SegmentDescRef seg = getLocal();
    const std::string path = dir_ + "/" + seg->name + ".segment";
    const std::string tmp = path + ".tmp";
    {
        std::ofstream out(tmp, std::ios::trunc);
        out << "segment " << seg->name << " " << (seg->rpc_server_addr.empty() ? "-" : seg->rpc_server_addr) << "\n";
        for (const BufferDesc& b : seg->getMemory().buffers) {
            out << "buffer " << b.addr << " " << b.length << " " << (b.location.empty() ? "*" : b.location) << "\n";
            for (const auto& [type, text] : b.transport_attrs)
                out << "attr " << static_cast<int>(type) << " " << text << "\n";
        }
        if (!out) return Status::MetadataError("cannot write " + tmp + LOC_MARK);
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) return Status::MetadataError("cannot publish " + path + LOC_MARK);
    return Status::OK();
}

ControlService::ControlService(const std::string& type, const std::string& servers, TransferEngineImpl*,
                               const std::string& local_name, const std::string& rpc_server_addr) {
    if (type != "shim-dir") std::fprintf(stderr, "tent shim: metadata type %s taken as shim-dir\n", type.c_str());
    manager_ = std::make_unique<SegmentManager>(servers, local_name, rpc_server_addr);
}

}  // namespace tent
}  // namespace mooncake
