// See metadata.h. Records are little-endian: a 4-byte magic, a 2-byte
// version, then fixed fields; strings are a 4-byte length and the bytes.
#include "metadata.h"

#include <cstring>

namespace orbite_nixl {
namespace {

constexpr char kConnMagic[4] = {'O', 'R', 'B', 'C'};
constexpr char kDataMagic[4] = {'O', 'R', 'B', 'P'};
constexpr char kNoteMagic[4] = {'O', 'R', 'B', 'N'};
constexpr uint16_t kVersion = 1;

struct Writer {
    std::string out;
    void bytes(const void *p, size_t n) { out.append(static_cast<const char *>(p), n); }
    template<class T> void num(T v) {
        unsigned char b[sizeof(T)];
        for (size_t i = 0; i < sizeof(T); ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
        bytes(b, sizeof b);
    }
    void str(std::string_view s) {
        num<uint32_t>(static_cast<uint32_t>(s.size()));
        bytes(s.data(), s.size());
    }
    void head(const char (&magic)[4]) {
        bytes(magic, 4);
        num<uint16_t>(kVersion);
    }
};

struct Reader {
    std::string_view in;
    size_t at = 0;
    bool ok = true;
    template<class T> T num() {
        if (in.size() - at < sizeof(T)) {
            ok = false;
            return 0;
        }
        T v = 0;
        for (size_t i = 0; i < sizeof(T); ++i)
            v |= static_cast<T>(static_cast<unsigned char>(in[at + i])) << (8 * i);
        at += sizeof(T);
        return v;
    }
    std::string_view str() {
        uint32_t n = num<uint32_t>();
        if (!ok || in.size() - at < n) {
            ok = false;
            return {};
        }
        std::string_view s = in.substr(at, n);
        at += n;
        return s;
    }
    /// The magic and version; `what` names the record in `why`.
    bool head(const char (&magic)[4], const char *what, std::string &why) {
        if (in.size() < 6 || std::memcmp(in.data(), magic, 4) != 0) {
            why = std::string("not ORBITE ") + what + " (another backend's, or damaged)";
            return false;
        }
        at = 4;
        uint16_t v = num<uint16_t>();
        if (v != kVersion) {
            why = std::string("ORBITE ") + what + " of format " + std::to_string(v) + ", this plugin reads " +
                  std::to_string(kVersion) + " (peers must run the same plugin release)";
            return false;
        }
        return true;
    }
    bool end(const char *what, std::string &why) {
        if (!ok || at != in.size()) {
            why = std::string("ORBITE ") + what + " of " + std::to_string(in.size()) + " bytes is truncated or too long";
            return false;
        }
        return true;
    }
};

}  // namespace

std::string encode(const ConnInfo &c) {
    Writer w;
    w.head(kConnMagic);
    w.num(c.incarnation);
    w.num(c.identity_region);
    w.num(c.identity_epoch);
    w.str(c.endpoint);
    return std::move(w.out);
}

std::string encode(const PublicData &p) {
    Writer w;
    w.head(kDataMagic);
    w.num(p.incarnation);
    w.num(p.region);
    w.num(p.epoch);
    w.num(p.addr);
    w.num(p.len);
    w.num(p.mem);
    return std::move(w.out);
}

std::optional<ConnInfo> decodeConnInfo(std::string_view bytes, std::string &why) {
    Reader r{bytes};
    if (!r.head(kConnMagic, "connection info", why)) return std::nullopt;
    ConnInfo c;
    c.incarnation = r.num<uint64_t>();
    c.identity_region = r.num<uint64_t>();
    c.identity_epoch = r.num<uint64_t>();
    c.endpoint = std::string(r.str());
    if (!r.end("connection info", why)) return std::nullopt;
    if (c.endpoint.empty() || c.identity_region == 0) {
        why = "ORBITE connection info names no endpoint or identity region";
        return std::nullopt;
    }
    return c;
}

std::optional<PublicData> decodePublicData(std::string_view bytes, std::string &why) {
    Reader r{bytes};
    if (!r.head(kDataMagic, "registration data", why)) return std::nullopt;
    PublicData p;
    p.incarnation = r.num<uint64_t>();
    p.region = r.num<uint64_t>();
    p.epoch = r.num<uint64_t>();
    p.addr = r.num<uint64_t>();
    p.len = r.num<uint64_t>();
    p.mem = r.num<uint32_t>();
    if (!r.end("registration data", why)) return std::nullopt;
    return p;
}

std::string encodeNotification(std::string_view agent, std::string_view msg) {
    Writer w;
    w.head(kNoteMagic);
    w.str(agent);
    w.bytes(msg.data(), msg.size());
    return std::move(w.out);
}

bool decodeNotification(std::string_view bytes, std::string &agent, std::string &msg) {
    Reader r{bytes};
    std::string why;
    if (!r.head(kNoteMagic, "notification", why)) return false;
    std::string_view a = r.str();
    if (!r.ok) return false;
    agent.assign(a);
    msg.assign(bytes.substr(r.at));
    return true;
}

}  // namespace orbite_nixl
