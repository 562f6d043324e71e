// What the ORBITE backend publishes through NIXL's metadata, and parses
// back on the peer: the connection info of an engine (getConnInfo) and
// the public data of a registration (getPublicData). Both carry what a
// peer needs to tell a live engine and a live registration from stale
// ones: the plugin engine's incarnation (random, new for every backend
// instance), the OrbiTE region id and its registration epoch (random, new
// for every registration).
#ifndef ORBITE_NIXL_METADATA_H
#define ORBITE_NIXL_METADATA_H

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace orbite_nixl {

/// getConnInfo: how to reach an engine and prove it is the same one.
struct ConnInfo {
    uint64_t incarnation = 0;
    /// The engine's identity region (a small READ-only registration whose
    /// id and epoch a peer must find after connecting).
    uint64_t identity_region = 0;
    uint64_t identity_epoch = 0;
    std::string endpoint;  ///< orbite_engine_endpoint
};

/// getPublicData: one registration.
struct PublicData {
    uint64_t incarnation = 0;
    uint64_t region = 0;
    uint64_t epoch = 0;
    uint64_t addr = 0;
    uint64_t len = 0;
    uint32_t mem = 0;  ///< nixl_mem_t
};

std::string encode(const ConnInfo &c);
std::string encode(const PublicData &p);
/// nullopt, with `why` set, for bytes that are not one record of the kind.
std::optional<ConnInfo> decodeConnInfo(std::string_view bytes, std::string &why);
std::optional<PublicData> decodePublicData(std::string_view bytes, std::string &why);

/// A notification as it travels: the NIXL agent name of its sender, then
/// the message (NIXL agent names are free strings; OrbiTE engine names are
/// not, so the agent name rides in the payload).
std::string encodeNotification(std::string_view agent, std::string_view msg);
bool decodeNotification(std::string_view bytes, std::string &agent, std::string &msg);

}  // namespace orbite_nixl

#endif
