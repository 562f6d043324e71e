// See nixl_process.h. Both facts are read from the image of
// libnixl_common.so mapped in this process (found with dl_iterate_phdr):
// - the release: NIXL logs "NIXL version: " followed by its release at
//   load, and the two string literals sit next to each other in the
//   library's read-only data;
// - the logger: Abseil's LogMessage, which libnixl_common.so exports (the
//   Abseil release is in the symbol names' inline namespace, so the
//   symbols are found by their shape in the library's dynamic symbol
//   table, then resolved with dlsym).
#include "nixl_process.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>

#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

namespace orbite_nixl {
namespace {

constexpr const char *kCommonLib = "libnixl_common.so";

struct Image {
    std::string path;
    const ElfW(Phdr) * phdr = nullptr;
    ElfW(Half) phnum = 0;
    ElfW(Addr) base = 0;
};

bool endsWith(const char *s, const char *suffix) {
    size_t n = std::strlen(s), m = std::strlen(suffix);
    return n >= m && std::strcmp(s + n - m, suffix) == 0;
}

/// The loaded libnixl_common.so, if any.
bool findCommon(Image &out) {
    struct Ctx {
        Image *out;
        bool found;
    } ctx{&out, false};
    dl_iterate_phdr(
        [](struct dl_phdr_info *info, size_t, void *p) -> int {
            auto *c = static_cast<Ctx *>(p);
            if (info->dlpi_name && endsWith(info->dlpi_name, kCommonLib)) {
                c->out->path = info->dlpi_name;
                c->out->phdr = info->dlpi_phdr;
                c->out->phnum = info->dlpi_phnum;
                c->out->base = info->dlpi_addr;
                c->found = true;
                return 1;
            }
            return 0;
        },
        &ctx);
    return ctx.found;
}

/// Looks for `needle` (with its NUL) in the image's loaded, readable,
/// non-writable segments; returns where the text after it starts.
const char *findInImage(const Image &im, const char *needle, size_t len) {
    for (ElfW(Half) i = 0; i < im.phnum; ++i) {
        const ElfW(Phdr) &ph = im.phdr[i];
        if (ph.p_type != PT_LOAD || !(ph.p_flags & PF_R) || (ph.p_flags & PF_W)) continue;
        const char *lo = reinterpret_cast<const char *>(im.base + ph.p_vaddr);
        const char *hi = lo + ph.p_memsz;
        for (const char *p = lo; p + len < hi; ++p) {
            p = static_cast<const char *>(std::memchr(p, needle[0], hi - p - len));
            if (!p) break;
            if (std::memcmp(p, needle, len) == 0) return p + len;
        }
    }
    return nullptr;
}

/// A release text: digits and dots, then optional [A-Za-z0-9.+-].
bool plausibleRelease(const char *s, size_t max) {
    size_t n = strnlen(s, max);
    if (n == 0 || n >= max || !(s[0] >= '0' && s[0] <= '9')) return false;
    for (size_t i = 0; i < n; ++i) {
        char c = s[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '.' ||
              c == '-' || c == '+'))
            return false;
    }
    return true;
}

// ---- the logger ----------------------------------------------------------

// Abseil's LogMessage(const char *file, int line, LogSeverity) constructor,
// operator<<(std::string_view), Flush() (which emits the line, as the LOG
// macro's statement does at its end) and destructor, as plain functions of
// the object's address. The object is a few words; it is given far more
// room than it uses.
using Ctor = void (*)(void *self, const char *file, int line, int severity);
using Append = void *(*)(void *self, std::string_view text);
using Method = void (*)(void *self);

struct Logger {
    Ctor ctor = nullptr;
    Append append = nullptr;
    Method flush = nullptr;
    Method dtor = nullptr;
    bool ready() const { return ctor && append && flush && dtor; }
};

/// The dynamic symbol names of the image, for the shapes above.
Logger resolveLogger(const Image &im) {
    Logger lg;
    const ElfW(Dyn) *dyn = nullptr;
    for (ElfW(Half) i = 0; i < im.phnum; ++i)
        if (im.phdr[i].p_type == PT_DYNAMIC) dyn = reinterpret_cast<const ElfW(Dyn) *>(im.base + im.phdr[i].p_vaddr);
    if (!dyn) return lg;
    const ElfW(Sym) *symtab = nullptr;
    const char *strtab = nullptr;
    const uint32_t *gnu_hash = nullptr;
    // glibc relocates these entries of a loaded object in place; where a
    // loader does not, the value is still the offset from the base.
    auto at = [&](ElfW(Addr) v) { return v < im.base ? v + im.base : v; };
    for (const ElfW(Dyn) *d = dyn; d->d_tag != DT_NULL; ++d) {
        if (d->d_tag == DT_SYMTAB) symtab = reinterpret_cast<const ElfW(Sym) *>(at(d->d_un.d_ptr));
        if (d->d_tag == DT_STRTAB) strtab = reinterpret_cast<const char *>(at(d->d_un.d_ptr));
        if (d->d_tag == DT_GNU_HASH) gnu_hash = reinterpret_cast<const uint32_t *>(at(d->d_un.d_ptr));
    }
    if (!symtab || !strtab || !gnu_hash) return lg;
    // The number of symbols is not stored; the GNU hash table bounds it: the
    // chain of the highest bucket ends at the last symbol.
    uint32_t nbuckets = gnu_hash[0], symoffset = gnu_hash[1], bloom_size = gnu_hash[2];
    const uint32_t *buckets = gnu_hash + 4 + bloom_size * (sizeof(ElfW(Addr)) / 4);
    const uint32_t *chain = buckets + nbuckets;
    uint32_t last = 0;
    for (uint32_t b = 0; b < nbuckets; ++b)
        if (buckets[b] > last) last = buckets[b];
    if (last >= symoffset)
        while (!(chain[last - symoffset] & 1)) ++last;
    std::string ctor, append, flush, dtor;
    for (uint32_t i = 0; i <= last; ++i) {
        const char *name = strtab + symtab[i].st_name;
        if (std::strncmp(name, "_ZN4absl", 8) != 0 || symtab[i].st_shndx == SHN_UNDEF) continue;
        if (endsWith(name, "12log_internal10LogMessageC1EPKciNS0_11LogSeverityE")) ctor = name;
        if (endsWith(name, "12log_internal10LogMessagelsESt17basic_string_viewIcSt11char_traitsIcEE"))
            append = name;
        if (endsWith(name, "12log_internal10LogMessage5FlushEv")) flush = name;
        if (endsWith(name, "12log_internal10LogMessageD1Ev")) dtor = name;
    }
    if (ctor.empty() || append.empty() || flush.empty() || dtor.empty()) return lg;
    void *h = dlopen(im.path.c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (!h) return lg;
    lg.ctor = reinterpret_cast<Ctor>(dlsym(h, ctor.c_str()));
    lg.append = reinterpret_cast<Append>(dlsym(h, append.c_str()));
    lg.flush = reinterpret_cast<Method>(dlsym(h, flush.c_str()));
    lg.dtor = reinterpret_cast<Method>(dlsym(h, dtor.c_str()));
    dlclose(h);  // the agent keeps the library loaded
    return lg;
}

const Logger &logger() {
    static const Logger lg = [] {
        Image im;
        return findCommon(im) ? resolveLogger(im) : Logger{};
    }();
    return lg;
}

}  // namespace

void log(Severity severity, std::string_view message) noexcept {
    try {
        const Logger &lg = logger();
        if (lg.ready()) {
            alignas(64) unsigned char storage[512];
            lg.ctor(storage, "orbite_nixl.cpp", 1, static_cast<int>(severity));
            lg.append(storage, "ORBITE: ");
            lg.append(storage, message);
            lg.flush(storage);
            lg.dtor(storage);
            return;
        }
    } catch (...) {
    }
    static const char tag[] = {'I', 'W', 'E'};
    std::fprintf(stderr, "%c ORBITE: %.*s\n", tag[static_cast<int>(severity)], static_cast<int>(message.size()),
                 message.data());
}

std::string runningNixlRelease(std::string *where) {
    Image im;
    if (!findCommon(im)) return "";
    if (where) *where = im.path;
    static const char needle[] = "NIXL version: ";
    const char *after = findInImage(im, needle, sizeof(needle));  // with its NUL
    if (!after) return "";
    // String literals are NUL-terminated and may be padded with more NULs.
    for (int i = 0; i < 16 && *after == '\0'; ++i) ++after;
    return plausibleRelease(after, 64) ? std::string(after) : std::string();
}

}  // namespace orbite_nixl
