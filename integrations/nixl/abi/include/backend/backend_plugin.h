// OrbiTE's declaration of NIXL's plugin entry points (backend_plugin.h) for
// the pinned release: the record nixl_plugin_init returns, which the agent's
// plugin manager reads (api_version first, then the six functions).
#ifndef ORBITE_NIXL_ABI_BACKEND_PLUGIN_H
#define ORBITE_NIXL_ABI_BACKEND_PLUGIN_H

#include "backend_engine.h"

/// The only plugin API version NIXL releases have used; NIXL refuses a
/// plugin that returns another. It does not change when the classes above
/// change, which is why the plugin checks the release itself.
#define NIXL_PLUGIN_API_VERSION 1

class nixlBackendPlugin {
public:
    int api_version;
    nixlBackendEngine *(*create_engine)(const nixlBackendInitParams *init_params);
    void (*destroy_engine)(nixlBackendEngine *engine);
    const char *(*get_plugin_name)();
    const char *(*get_plugin_version)();
    nixl_b_params_t (*get_backend_options)();
    nixl_mem_list_t (*get_backend_mems)();
};

#define NIXL_PLUGIN_EXPORT __attribute__((visibility("default")))

extern "C" {
NIXL_PLUGIN_EXPORT nixlBackendPlugin *nixl_plugin_init();
NIXL_PLUGIN_EXPORT void nixl_plugin_fini();
}

#ifdef ORBITE_NIXL_PINNED
static_assert(sizeof(nixlBackendPlugin) == 56);
#endif

#endif
