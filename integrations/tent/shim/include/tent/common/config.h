// Shim of TENT's tent/common/config.h (see status.h): a JSON document read
// by slash-separated key paths ("transports/orbite/engine"). Only what the
// adapter and its tests use: load, get, contains, dumpSubtree.
#ifndef ORBITE_TENT_SHIM_CONFIG_H
#define ORBITE_TENT_SHIM_CONFIG_H

#include <mutex>
#include <string>
#include <type_traits>

#include "tent/common/status.h"
#include "tent/common/types.h"

namespace mooncake {
namespace tent {

class Config {
   public:
    /// The value at `key_path` as T (string, bool, integer or floating
    /// point), or `default_value` when it is missing or of another type.
    template <typename T>
    T get(const std::string& key_path, const T& default_value) const {
        std::string text;
        if (!dumpSubtree(key_path, &text)) return default_value;
        T out{};
        if (!convert(text, out)) return default_value;
        return out;
    }

    std::string get(const std::string& key, const char* def) const {
        return get<std::string>(key, std::string(def));
    }

    bool contains(const std::string& key_path) const {
        std::string text;
        return dumpSubtree(key_path, &text) && text != "null";
    }

    /// Replaces the document with `content` (a JSON object).
    Status load(const std::string& content);

    std::string dump(int indent = 2) const;

    /// The JSON text of the value at `key_path`, if there is one.
    bool dumpSubtree(const std::string& key_path, std::string* out) const;

   private:
    static bool convert(const std::string& text, std::string& out);
    static bool convert(const std::string& text, bool& out);
    static bool convert(const std::string& text, double& out);
    static bool convert(const std::string& text, long long& out);
    template <typename T, typename = std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool> &&
                                                      !std::is_same_v<T, long long>>>
    static bool convert(const std::string& text, T& out) {
        long long v = 0;
        if (!convert(text, v)) return false;
        out = static_cast<T>(v);
        return true;
    }

    std::string document_ = "{}";
    mutable std::mutex mutex_;
};

}  // namespace tent
}  // namespace mooncake

#endif
