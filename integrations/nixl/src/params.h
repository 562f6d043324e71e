// The ORBITE backend's parameters (NIXL custom params): each one maps to an
// OrbiTE config key (docs/config.md) or to a setting of the plugin itself;
// docs/nixl.md lists them. Values are NIXL's strings, converted to the
// key's type here; OrbiTE itself checks ranges when the engine starts.
#ifndef ORBITE_NIXL_PARAMS_H
#define ORBITE_NIXL_PARAMS_H

#include <cstdint>
#include <string>

#include "nixl_types.h"

namespace orbite_nixl {

/// Environment variable read for parameters NIXL's caller cannot pass
/// (vLLM's connector passes none): "key=value;key=value". A NIXL custom
/// param with the same key wins.
constexpr const char *kParamsEnv = "ORBITE_NIXL_PARAMS";

struct Options {
    /// OrbiTE's config as JSON, without "name" (the engine adds it).
    std::string config_json;
    uint32_t connect_timeout_ms = 5000;
    uint32_t transport = 0;   ///< ORBITE_TRANSPORT_*; 0 = AUTO
    uint32_t timeout_ms = 0;  ///< a transfer's deadline; 0 = default_timeout_ms
};

/// Every parameter with its default ("" where OrbiTE's default applies).
nixl_b_params_t documentedParams();

/// The options from `params` over ORBITE_NIXL_PARAMS; false with `why` set
/// for an unknown key or a value of the wrong kind.
bool buildOptions(const nixl_b_params_t &params, Options &out, std::string &why);

}  // namespace orbite_nixl

#endif
