// OrbiTE's declaration of NIXL's descriptors (nixl_descriptors.h) for the
// pinned release: the members a backend reads, in the release's layout
// (static_asserts in backend/backend_aux.h give the offsets measured in its
// binaries). Out-of-line members of NIXL's classes are not declared: a
// backend never calls them, so the plugin needs no NIXL library at link time.
#ifndef ORBITE_NIXL_ABI_NIXL_DESCRIPTORS_H
#define ORBITE_NIXL_ABI_NIXL_DESCRIPTORS_H

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "nixl_types.h"

/// One contiguous range: start, length and device (GPU ordinal for VRAM).
class nixlBasicDesc {
public:
    uintptr_t addr;
    size_t len;
    uint64_t devId;

    nixlBasicDesc() {}
    nixlBasicDesc(uintptr_t a, size_t l, uint64_t d) : addr(a), len(l), devId(d) {}
};

/// A range with a metadata blob: what registerMem receives, and what
/// loadRemoteMD receives with the peer's public data in metaInfo.
class nixlBlobDesc : public nixlBasicDesc {
public:
    nixl_blob_t metaInfo;
};

/// A list of descriptors of one memory kind. Polymorphic in NIXL (its
/// destructor and a few members are virtual), hence the vtable pointer
/// before `type`.
template<class T> class nixlDescList {
protected:
    nixl_mem_t type;
    std::vector<T> descs;

public:
    virtual ~nixlDescList() = default;

    nixl_mem_t getType() const { return type; }
    int descCount() const { return static_cast<int>(descs.size()); }
    bool isEmpty() const noexcept { return descs.empty(); }
    const T &operator[](size_t index) const { return descs[index]; }
    typename std::vector<T>::const_iterator begin() const { return descs.begin(); }
    typename std::vector<T>::const_iterator end() const { return descs.end(); }

private:
    // NIXL builds these lists; a backend only reads them.
    nixlDescList() = delete;
};

using nixl_reg_dlist_t = nixlDescList<nixlBlobDesc>;

#endif
