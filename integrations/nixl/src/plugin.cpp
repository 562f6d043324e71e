// The ORBITE plugin's entry points (libplugin_ORBITE.so). NIXL's class
// layouts change between releases while its plugin API version stays 1,
// so nixl_plugin_init first checks which NIXL release runs in the process
// and refuses any other than the one the plugin was built for, naming both
// in NIXL's log (the agent then reports the backend as not loaded). It also
// sends OrbiTE's own log lines (this plugin's private copy of liborbite) to
// NIXL's log.
#include <orbite.h>

#include <string>

#include "backend/backend_plugin.h"
#include "engine.h"
#include "nixl_process.h"
#include "params.h"

#ifndef ORBITE_NIXL_RELEASE
#error "ORBITE_NIXL_RELEASE (the NIXL release the plugin is built for) must be defined by the build"
#endif

namespace {

const char *kName = "ORBITE";

nixlBackendEngine *createEngine(const nixlBackendInitParams *init_params) {
    try {
        return new nixlOrbiteEngine(init_params);
    } catch (const std::exception &e) {
        orbite_nixl::log(orbite_nixl::Severity::error, std::string("cannot create the ORBITE backend: ") + e.what());
        return nullptr;
    }
}

void destroyEngine(nixlBackendEngine *engine) { delete engine; }

const char *pluginName() { return kName; }
const char *pluginVersion() { return ORBITE_VERSION_STRING; }
nixl_b_params_t backendOptions() { return orbite_nixl::documentedParams(); }
nixl_mem_list_t backendMems() { return {DRAM_SEG, VRAM_SEG}; }

void toNixlLog(uint32_t level, const char *message, void *) {
    using orbite_nixl::Severity;
    orbite_nixl::log(level == ORBITE_LOG_ERROR  ? Severity::error
                     : level == ORBITE_LOG_WARN ? Severity::warning
                                                : Severity::info,
                     message);
}

nixlBackendPlugin plugin = {NIXL_PLUGIN_API_VERSION, createEngine,   destroyEngine, pluginName,
                            pluginVersion,            backendOptions, backendMems};

}  // namespace

extern "C" NIXL_PLUGIN_EXPORT nixlBackendPlugin *nixl_plugin_init() {
    std::string where;
    const std::string running = orbite_nixl::runningNixlRelease(&where);
    if (running != ORBITE_NIXL_RELEASE) {
        orbite_nixl::log(orbite_nixl::Severity::error,
                         std::string("libplugin_ORBITE.so is built for NIXL " ORBITE_NIXL_RELEASE
                                     " (its backend interface changes between releases), but this process runs ") +
                             (running.empty() ? "a NIXL release that does not say which it is" : "NIXL " + running) +
                             (where.empty() ? "" : " (" + where + ")") +
                             ": the ORBITE backend is not loaded. Install nixl " ORBITE_NIXL_RELEASE
                             ", or build the plugin against this NIXL's source (-DORBITE_NIXL_SOURCE=..., "
                             "docs/nixl.md)");
        return nullptr;
    }
    orbite_set_log_callback(toNixlLog, nullptr);
    return &plugin;
}

extern "C" NIXL_PLUGIN_EXPORT void nixl_plugin_fini() { orbite_set_log_callback(nullptr, nullptr); }
