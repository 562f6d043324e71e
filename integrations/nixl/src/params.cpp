// See params.h.
#include "params.h"

#include <dlfcn.h>
#include <orbite.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string_view>
#include <vector>

namespace orbite_nixl {
namespace {

enum class Kind { text, integer, boolean, json, names, plugin };

struct Param {
    const char *key;
    Kind kind;
    const char *def;  ///< default as documented; "" = OrbiTE's own
};

// The table docs/nixl.md describes (keep the two in step).
constexpr Param kParams[] = {
    {"listen", Kind::text, "127.0.0.1:0"},
    {"auth_key_file", Kind::text, ""},
    {"wire_security", Kind::text, ""},
    {"log_level", Kind::text, ""},
    {"transport_policy", Kind::names, ""},
    {"nvlink", Kind::boolean, ""},  // default: true where a CUDA driver is on the loader path
    {"mnnvl", Kind::json, ""},
    {"cma", Kind::boolean, ""},
    {"cma_ptracer", Kind::text, ""},
    {"coalesce", Kind::boolean, ""},
    {"max_inflight_bytes", Kind::integer, ""},
    {"max_transfer_bytes", Kind::integer, ""},
    {"shm_cache_entries", Kind::integer, ""},
    {"nvlink_cache_entries", Kind::integer, ""},
    {"default_timeout_ms", Kind::integer, ""},
    {"handshake_timeout_ms", Kind::integer, ""},
    {"io_threads", Kind::integer, ""},
    {"io_poll_us", Kind::integer, ""},
    {"min_payload_rate_kib", Kind::integer, ""},
    {"notification_max_bytes", Kind::integer, "65536"},
    {"notification_queue", Kind::integer, ""},
    {"config_json", Kind::json, ""},
    {"connect_timeout_ms", Kind::plugin, "5000"},
    {"transport", Kind::plugin, "auto"},
    {"timeout_ms", Kind::plugin, "0"},
};

const Param *find(std::string_view key) {
    for (const Param &p : kParams)
        if (key == p.key) return &p;
    return nullptr;
}

std::string quoted(std::string_view s) {
    std::string o = "\"";
    for (char c : s) {
        switch (c) {
            case '"': o += "\\\""; break;
            case '\\': o += "\\\\"; break;
            case '\n': o += "\\n"; break;
            case '\t': o += "\\t"; break;
            default:
                if (static_cast<unsigned char>(c) < 0x20) {
                    char b[8];
                    std::snprintf(b, sizeof b, "\\u%04x", c);
                    o += b;
                } else {
                    o += c;
                }
        }
    }
    return o + "\"";
}

bool digits(std::string_view s) {
    if (s.empty() || s.size() > 19) return false;
    for (char c : s)
        if (c < '0' || c > '9') return false;
    return true;
}

std::string trim(std::string_view s) {
    size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
    return a == std::string_view::npos ? std::string() : std::string(s.substr(a, b - a + 1));
}

/// Whether the CUDA driver can be loaded here (without keeping it loaded).
bool cudaDriverPresent() {
    void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!h) return false;
    dlclose(h);
    return true;
}

/// key=value;key=value
bool parseEnv(const char *text, std::map<std::string, std::string> &out, std::string &why) {
    std::string_view s(text);
    while (!s.empty()) {
        size_t semi = s.find(';');
        std::string_view item = s.substr(0, semi);
        s = semi == std::string_view::npos ? std::string_view() : s.substr(semi + 1);
        if (trim(item).empty()) continue;
        size_t eq = item.find('=');
        if (eq == std::string_view::npos) {
            why = std::string(kParamsEnv) + ": \"" + std::string(item) + "\" is not key=value";
            return false;
        }
        out[trim(item.substr(0, eq))] = trim(item.substr(eq + 1));
    }
    return true;
}

}  // namespace

nixl_b_params_t documentedParams() {
    nixl_b_params_t m;
    for (const Param &p : kParams) m[p.key] = p.def;
    return m;
}

bool buildOptions(const nixl_b_params_t &params, Options &out, std::string &why) {
    std::map<std::string, std::string> given;
    if (const char *env = std::getenv(kParamsEnv); env && *env && !parseEnv(env, given, why)) return false;
    for (const auto &[k, v] : params) given[k] = v;

    std::string known;
    for (const Param &p : kParams) known += std::string(known.empty() ? "" : ", ") + p.key;
    for (const auto &[k, v] : given) {
        if (!find(k)) {
            why = "unknown ORBITE backend parameter \"" + k + "\" (known: " + known + "; docs/nixl.md)";
            return false;
        }
    }
    // Defaults of the plugin's own choosing, where the caller gave none.
    auto value = [&](const Param &p) -> std::optional<std::string> {
        auto it = given.find(p.key);
        if (it != given.end()) return it->second;
        if (*p.def) return std::string(p.def);
        return std::nullopt;
    };
    std::string json = "{";
    auto add = [&](const std::string &k, const std::string &v) {
        json += (json.size() > 1 ? "," : "") + quoted(k) + ":" + v;
    };
    std::string extra;
    for (const Param &p : kParams) {
        std::optional<std::string> v = value(p);
        // NVLink and MNNVL exclude each other: asking for MNNVL drops the
        // NVLink default.
        if (std::string_view(p.key) == "nvlink" && !given.count("nvlink")) {
            // NVLink by default where a CUDA driver can be loaded (VRAM);
            // not with MNNVL, which excludes it.
            if ((given.count("mnnvl") && given["mnnvl"] != "null") || !cudaDriverPresent()) continue;
            v = "true";
        }
        if (!v) continue;
        const std::string key = p.key;
        switch (p.kind) {
            case Kind::text: add(key, quoted(*v)); break;
            case Kind::integer:
                if (!digits(*v)) {
                    why = "ORBITE backend parameter " + key + " = \"" + *v + "\" is not a non-negative integer";
                    return false;
                }
                add(key, *v);
                break;
            case Kind::boolean:
                if (*v == "true" || *v == "1" || *v == "yes") add(key, "true");
                else if (*v == "false" || *v == "0" || *v == "no") add(key, "false");
                else {
                    why = "ORBITE backend parameter " + key + " = \"" + *v + "\" is not true or false";
                    return false;
                }
                break;
            case Kind::names: {
                std::string arr = "[";
                std::string_view s(*v);
                while (true) {
                    size_t c = s.find(',');
                    std::string name = trim(s.substr(0, c));
                    if (!name.empty()) arr += (arr.size() > 1 ? "," : "") + quoted(name);
                    if (c == std::string_view::npos) break;
                    s = s.substr(c + 1);
                }
                add(key, arr + "]");
                break;
            }
            case Kind::json:
                if (key == "config_json") {
                    std::string t = trim(*v);
                    if (t.size() < 2 || t.front() != '{' || t.back() != '}') {
                        why = "ORBITE backend parameter config_json must be a JSON object of OrbiTE config keys";
                        return false;
                    }
                    extra = trim(std::string_view(t).substr(1, t.size() - 2));
                } else {
                    add(key, trim(*v));  // OrbiTE parses it and names the key if it is not JSON
                }
                break;
            case Kind::plugin:
                if (key == "transport") {
                    static const std::map<std::string, uint32_t> names = {
                        {"auto", ORBITE_TRANSPORT_AUTO}, {"tcp", ORBITE_TRANSPORT_TCP},
                        {"shm", ORBITE_TRANSPORT_SHM},   {"nvlink", ORBITE_TRANSPORT_NVLINK},
                        {"mnnvl", ORBITE_TRANSPORT_MNNVL}, {"cma", ORBITE_TRANSPORT_CMA}};
                    auto it = names.find(*v);
                    if (it == names.end()) {
                        why = "ORBITE backend parameter transport = \"" + *v +
                              "\" is none of auto, tcp, shm, cma, nvlink, mnnvl";
                        return false;
                    }
                    out.transport = it->second;
                } else {
                    if (!digits(*v) || std::stoull(*v) > 0xffffffffull) {
                        why = "ORBITE backend parameter " + key + " = \"" + *v + "\" is not an integer of milliseconds";
                        return false;
                    }
                    (key == "timeout_ms" ? out.timeout_ms : out.connect_timeout_ms) =
                        static_cast<uint32_t>(std::stoull(*v));
                }
                break;
        }
    }
    if (!extra.empty()) json += (json.size() > 1 ? "," : "") + extra;
    out.config_json = json + "}";
    return true;
}

}  // namespace orbite_nixl
