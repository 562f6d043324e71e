//! Allocations the library made itself, recorded process-wide so that a
//! registration on any engine recognises their kind, and so that freeing one
//! that is still registered or exported is refused.

use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

// The memory files live in `memfd.rs`; their public paths stay here.
pub use super::memfd::{
    add_seals, is_sealed_memfd, map_shared, map_shared_memory, sealable_memfd, shared_physical, shmem_huge_pages_on,
    shmem_huge_setting, SHARED_ROUNDING, SIZE_SEALS,
};

/// The kind of memory behind a registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemoryKind {
    /// Ordinary process memory (malloc, stack, mmap): TCP only.
    Host,
    /// Library-allocated memfd host memory: exportable over SHM.
    SharedHost,
    /// CUDA device memory (not exportable).
    Cuda,
    /// CUDA device memory allocated for IPC export.
    CudaIpc,
    /// CUDA pinned host memory.
    PinnedHost,
    /// CUDA VMM memory exportable across an NVLink fabric.
    Mnnvl,
    /// CUDA VMM host (NUMA) memory exportable across an NVLink fabric.
    Egm,
}

impl MemoryKind {
    /// Every kind, in wire-code order.
    pub const ALL: [MemoryKind; 7] = [
        MemoryKind::Host,
        MemoryKind::SharedHost,
        MemoryKind::Cuda,
        MemoryKind::CudaIpc,
        MemoryKind::PinnedHost,
        MemoryKind::Mnnvl,
        MemoryKind::Egm,
    ];

    /// Name used in JSON (`peer_regions_json`).
    pub fn name(self) -> &'static str {
        match self {
            MemoryKind::Host => "host",
            MemoryKind::SharedHost => "shared_host",
            MemoryKind::Cuda => "cuda",
            MemoryKind::CudaIpc => "cuda_ipc",
            MemoryKind::PinnedHost => "pinned_host",
            MemoryKind::Mnnvl => "mnnvl",
            MemoryKind::Egm => "egm",
        }
    }

    /// Wire code.
    pub fn code(self) -> u32 {
        self as u32
    }

    /// From a wire code.
    pub fn from_code(c: u32) -> Option<MemoryKind> {
        MemoryKind::ALL.get(c as usize).copied()
    }

    /// Whether the CPU can read and write it directly (the TCP transport
    /// copies through the CPU).
    pub fn cpu_accessible(self) -> bool {
        matches!(self, MemoryKind::Host | MemoryKind::SharedHost | MemoryKind::PinnedHost | MemoryKind::Egm)
    }
}

/// Releases native memory (the allocation's address is the argument); a
/// failure keeps the allocation.
pub type Release = Box<dyn Fn(u64) -> Result<()> + Send + Sync>;

/// The backing of an owned allocation.
pub enum Backing {
    /// memfd mapped shared; the fd can be passed to peers.
    Memfd {
        /// The memory file.
        fd: OwnedFd,
    },
    /// Memory another layer made (CUDA device, pinned host or VMM memory),
    /// released through the hook it was adopted with.
    Native {
        /// The device it lives on, when it is device memory.
        device: Option<i32>,
        /// Frees it.
        release: Release,
    },
}

impl std::fmt::Debug for Backing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Backing::Memfd { fd } => f.debug_struct("Memfd").field("fd", fd).finish(),
            Backing::Native { device, .. } => f.debug_struct("Native").field("device", device).finish(),
        }
    }
}

/// What the owner table knows about the allocation holding an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnerInfo {
    /// Unique id of the allocation (never reused, unlike its address).
    pub id: u64,
    /// First byte.
    pub base: u64,
    /// Logical length.
    pub len: u64,
    /// Physical extent.
    pub physical: u64,
    /// Kind.
    pub kind: MemoryKind,
    /// The memory file of a shared host allocation.
    pub fd: Option<i32>,
    /// The device of CUDA device memory.
    pub device: Option<i32>,
}

#[derive(Debug)]
struct Owned {
    /// Unique for the process's life (an address may be reused).
    id: u64,
    kind: MemoryKind,
    addr: u64,
    len: u64,
    physical: u64,
    backing: Backing,
}

#[derive(Debug, Default)]
struct Counts {
    registered: u64,
    exported: u64,
    /// A local GPU group fences it (see [`Fence`]).
    fenced: bool,
}

/// One adoption of a range inside memory the caller allocated: several may
/// share the allocation's entry (and so its export).
#[derive(Debug)]
struct AdoptionRecord {
    id: u64,
    addr: u64,
    len: u64,
    /// Registrations counted against this adoption.
    registered: u64,
}

struct Entry {
    owned: Arc<Owned>,
    counts: Counts,
    /// Empty for memory the library allocated; the adoptions of the caller's
    /// allocation otherwise (the entry leaves with the last one).
    adoptions: Vec<AdoptionRecord>,
}

impl Entry {
    fn new(owned: Arc<Owned>) -> Entry {
        Entry { owned, counts: Counts::default(), adoptions: Vec::new() }
    }

    /// The adoption a registration at `addr` counts against.
    fn adoption_at(&mut self, addr: u64) -> Option<&mut AdoptionRecord> {
        self.adoptions.iter_mut().find(|a| addr >= a.addr && addr < a.addr + a.len)
    }
}

static OWNERS: Mutex<BTreeMap<u64, Entry>> = Mutex::new(BTreeMap::new());
static FENCE_LIFTED: parking_lot::Condvar = parking_lot::Condvar::new();

/// An allocation made by the library, or the record of an adoption of
/// memory the caller allocated. Free it with [`Allocation::free`]; dropping
/// it without freeing leaks the memory (or the record) on purpose (it may
/// still be registered or mapped by a peer).
#[derive(Debug)]
pub struct Allocation {
    owned: Arc<Owned>,
    /// `(id, addr, len)` of the adoption this record stands for.
    adoption: Option<(u64, u64, u64)>,
}

impl Allocation {
    /// Start address (of the adopted range, for an adoption).
    pub fn addr(&self) -> u64 {
        self.adoption.map_or(self.owned.addr, |a| a.1)
    }
    /// Logical length (as requested, or as adopted).
    pub fn len(&self) -> u64 {
        self.adoption.map_or(self.owned.len, |a| a.2)
    }
    /// Whether this is the record of an adoption: the memory stays the
    /// caller's, and freeing the record releases only the library's hold.
    pub fn is_adoption(&self) -> bool {
        self.adoption.is_some()
    }
    /// The whole underlying allocation `(base, size)`: for an adoption, the
    /// caller's allocation that a peer importing it can reach.
    pub fn underlying(&self) -> (u64, u64) {
        (self.owned.addr, self.owned.physical)
    }
    /// Whether the logical length is zero (never: zero-length allocations are refused).
    pub fn is_empty(&self) -> bool {
        self.owned.len == 0
    }
    /// Physical extent (rounded; the whole underlying allocation for an
    /// adoption).
    pub fn physical_len(&self) -> u64 {
        self.owned.physical
    }
    /// Kind of memory.
    pub fn kind(&self) -> MemoryKind {
        self.owned.kind
    }
    /// The memfd behind a shared host allocation.
    pub fn memfd(&self) -> Option<i32> {
        match &self.owned.backing {
            Backing::Memfd { fd } => Some(fd.as_raw_fd()),
            _ => None,
        }
    }

    /// Frees the allocation. `Unavailable` while any engine has it
    /// registered or a peer has it exported; the allocation is then kept.
    pub fn free(self) -> std::result::Result<(), (Allocation, Error)> {
        match self.release() {
            Ok(()) => Ok(()),
            Err(e) => Err((self, e)),
        }
    }

    /// Frees the memory in place (the C ABI keeps its handle valid when this
    /// fails). After `Ok`, the allocation must not be used again.
    pub fn release(&self) -> Result<()> {
        let mut map = OWNERS.lock();
        let Some(e) = map.get(&self.owned.addr) else {
            return Err(Error::InvalidArgument("allocation was already freed".into()));
        };
        if !Arc::ptr_eq(&e.owned, &self.owned) {
            return Err(Error::InvalidArgument("allocation was already freed".into()));
        }
        if let Some((id, addr, len)) = self.adoption {
            return release_adoption(&mut map, self.owned.addr, id, addr, len);
        }
        if e.counts.registered > 0 || e.counts.exported > 0 {
            return Err(Error::Unavailable(format!(
                "allocation at 0x{:x} is still registered {} time(s) and exported {} time(s); unregister it first",
                self.owned.addr, e.counts.registered, e.counts.exported
            )));
        }
        // Native release first: a failure keeps the allocation (and its entry).
        match &self.owned.backing {
            Backing::Memfd { .. } => {
                // SAFETY: addr/physical describe the mapping created in
                // `allocate_shared_host`; no engine has it registered and no
                // export holds it, so nothing uses it.
                unsafe { libc::munmap(self.owned.addr as *mut libc::c_void, self.owned.physical as usize) };
            }
            Backing::Native { release, .. } => release(self.owned.addr)?,
        }
        map.remove(&self.owned.addr);
        Ok(())
    }
}

/// Forgets one adoption record of the entry at `base`; the entry (and its
/// release hook, which forgets what the lower layer holds, never frees the
/// caller's memory) goes with the last one.
fn release_adoption(map: &mut BTreeMap<u64, Entry>, base: u64, id: u64, addr: u64, len: u64) -> Result<()> {
    let e = map.get_mut(&base).expect("checked by the caller");
    let Some(i) = e.adoptions.iter().position(|a| a.id == id) else {
        return Err(Error::InvalidArgument("adoption was already freed".into()));
    };
    if e.counts.exported > 0 {
        return Err(Error::Unavailable(format!(
            "the allocation holding the adoption 0x{addr:x}+{len} is exported {} time(s); a peer may still map it \
             (it is released by the importers' close receipts)",
            e.counts.exported
        )));
    }
    if e.adoptions[i].registered > 0 {
        return Err(Error::Unavailable(format!(
            "the adoption 0x{addr:x}+{len} is still registered {} time(s); unregister it first",
            e.adoptions[i].registered
        )));
    }
    if e.adoptions.len() == 1 {
        if let Backing::Native { release, .. } = &e.owned.backing {
            release(base)?;
        }
        map.remove(&base);
    } else {
        e.adoptions.remove(i);
    }
    Ok(())
}

static NEXT_ADOPTION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
static NEXT_OWNER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn next_owner_id() -> u64 {
    NEXT_OWNER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// What a lower layer found out about memory the caller allocated, to be
/// adopted: the whole allocation and how the library lets go of it.
pub struct Foreign {
    /// The kind it is exported as.
    pub kind: MemoryKind,
    /// First byte of the whole allocation.
    pub base: u64,
    /// Its size.
    pub size: u64,
    /// The device of device memory.
    pub device: Option<i32>,
    /// Forgets what the lower layer holds for it (never frees the memory);
    /// run when the last adoption inside it is freed.
    pub forget: Release,
}

/// Records the adoption of `[addr, addr+len)` inside the caller's allocation
/// `f`. Adoptions inside one allocation share one entry (so one export and
/// one handle); the first one's `forget` is kept, and a later one's is
/// returned unused with `false` so that the caller undoes what it took.
/// An overlap with a library allocation, or with another adopted
/// allocation that is not exactly this one, is `InvalidArgument`.
pub fn adopt_range(f: Foreign, addr: u64, len: u64) -> Result<(Allocation, Option<Release>)> {
    let end = f.base.checked_add(f.size).filter(|_| f.size > 0);
    if end.is_none_or(|end| addr < f.base || addr.checked_add(len).is_none_or(|e| e > end) || len == 0) {
        return Err(Error::InvalidArgument(format!(
            "0x{addr:x}+{len} does not lie in its allocation 0x{:x}+{}",
            f.base, f.size
        )));
    }
    let mut map = OWNERS.lock();
    let id = NEXT_ADOPTION.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let record = AdoptionRecord { id, addr, len, registered: 0 };
    if let Some(e) = map.get_mut(&f.base) {
        let o = &e.owned;
        if e.adoptions.is_empty() || o.physical != f.size || o.kind != f.kind {
            return Err(Error::InvalidArgument(format!(
                "0x{addr:x} lies in a library allocation (0x{:x}+{}, {}); register it directly",
                o.addr,
                o.len,
                o.kind.name()
            )));
        }
        e.adoptions.push(record);
        let owned = o.clone();
        return Ok((Allocation { owned, adoption: Some((id, addr, len)) }, Some(f.forget)));
    }
    let below = map.range(..f.base).next_back().filter(|(_, e)| e.owned.addr + e.owned.physical > f.base);
    let inside = map.range(f.base..f.base + f.size).next();
    if let Some((_, e)) = below.or(inside) {
        return Err(Error::InvalidArgument(format!(
            "the allocation 0x{:x}+{} overlaps the library's record of 0x{:x}+{} ({})",
            f.base,
            f.size,
            e.owned.addr,
            e.owned.physical,
            e.owned.kind.name()
        )));
    }
    let backing = Backing::Native { device: f.device, release: f.forget };
    let owned =
        Arc::new(Owned { id: next_owner_id(), kind: f.kind, addr: f.base, len: f.size, physical: f.size, backing });
    let mut entry = Entry::new(owned.clone());
    entry.adoptions.push(record);
    map.insert(f.base, entry);
    Ok((Allocation { owned, adoption: Some((id, addr, len)) }, None))
}

/// Allocates zeroed host memory backed by a memfd, physically rounded up to
/// 2 MiB, shareable with peers on the same host (SHM transport). The memfd
/// is sealed against shrinking and growing ([`SIZE_SEALS`]) and against
/// further seals, so no holder of it can make a mapping fault.
pub fn allocate_shared_host(len: u64) -> Result<Allocation> {
    if len == 0 {
        return Err(Error::InvalidArgument("length is 0".into()));
    }
    let physical = shared_physical(len)?;
    let fd = sealable_memfd(c"orbite-shm", physical, "shared memory")?;
    add_seals(&fd, SIZE_SEALS | libc::F_SEAL_SEAL, "shared memory")?;
    let p = map_shared_memory(&fd, physical, true, "shared memory")?;
    let owned = Arc::new(Owned {
        id: next_owner_id(),
        kind: MemoryKind::SharedHost,
        addr: p,
        len,
        physical,
        backing: Backing::Memfd { fd },
    });
    OWNERS.lock().insert(owned.addr, Entry::new(owned.clone()));
    Ok(Allocation { owned, adoption: None })
}

/// Kind of the memory at `[addr, addr+len)`: the owning allocation's kind, or
/// `Host` for memory the library did not allocate. A range that starts in an
/// owned allocation but crosses its logical end is `InvalidArgument`.
pub fn kind_of(addr: u64, len: u64) -> Result<MemoryKind> {
    let map = OWNERS.lock();
    if let Some((_, e)) = map.range(..=addr).next_back() {
        let o = &e.owned;
        if addr < o.addr + o.physical {
            if addr + len > o.addr + o.len {
                return Err(Error::InvalidArgument(format!(
                    "range 0x{addr:x}+{len} crosses the end of the library allocation 0x{:x}+{}",
                    o.addr, o.len
                )));
            }
            let adopted = |a: &AdoptionRecord| addr >= a.addr && addr + len <= a.addr + a.len;
            if !e.adoptions.is_empty() && !e.adoptions.iter().any(adopted) {
                return Err(Error::InvalidArgument(format!(
                    "range 0x{addr:x}+{len} lies in an adopted allocation (0x{:x}+{}) but in none of its adopted \
                     ranges; adopt it first (orbite_cuda_adopt)",
                    o.addr, o.len
                )));
            }
            return Ok(o.kind);
        }
    }
    if let Some((_, e)) = map.range(addr..addr.saturating_add(len)).next() {
        return Err(Error::InvalidArgument(format!(
            "range 0x{addr:x}+{len} covers part of the library allocation at 0x{:x}; register inside it",
            e.owned.addr
        )));
    }
    Ok(MemoryKind::Host)
}

/// The owned allocation holding `addr` (inside its logical length).
pub fn owner_of(addr: u64) -> Option<OwnerInfo> {
    let map = OWNERS.lock();
    let (_, e) = map.range(..=addr).next_back()?;
    let o = &e.owned;
    (addr < o.addr + o.len).then(|| OwnerInfo {
        id: o.id,
        base: o.addr,
        len: o.len,
        physical: o.physical,
        kind: o.kind,
        fd: match &o.backing {
            Backing::Memfd { fd } => Some(fd.as_raw_fd()),
            _ => None,
        },
        device: match &o.backing {
            Backing::Native { device, .. } => *device,
            Backing::Memfd { .. } => None,
        },
    })
}

/// Whether the allocation with unique id `id` still exists.
pub fn owner_of_id(id: u64) -> bool {
    OWNERS.lock().values().any(|e| e.owned.id == id)
}

/// Records memory the library allocated (or adopted) through another layer
/// (CUDA) so that registration recognises it and frees are checked; the
/// backing says how to release it.
pub fn adopt(kind: MemoryKind, addr: u64, len: u64, physical: u64, backing: Backing) -> Allocation {
    let owned = Arc::new(Owned { id: next_owner_id(), kind, addr, len, physical, backing });
    OWNERS.lock().insert(addr, Entry::new(owned.clone()));
    Allocation { owned, adoption: None }
}

/// Adjusts the registration count of the owned allocation holding `addr`
/// (no-op for plain host memory).
pub(crate) fn note_registered(addr: u64, delta: i64) {
    let mut map = OWNERS.lock();
    if let Some((_, e)) = map.range_mut(..=addr).next_back() {
        if addr < e.owned.addr + e.owned.physical {
            e.counts.registered = e.counts.registered.saturating_add_signed(delta);
            if let Some(a) = e.adoption_at(addr) {
                a.registered = a.registered.saturating_add_signed(delta);
            }
        }
    }
}

/// An export's hold on a whole owned allocation: counted so that the
/// allocation is never freed while a peer may map it. Any number of exports
/// (READ or WRITE, from any number of importing processes) hold one
/// allocation at once, and none of them excludes this process's own access
/// or its TCP peers': between different requesters, ordering of
/// overlapping READs and WRITEs is the application's, as with RDMA.
/// Dropping it (the close receipt, or proof that the importer exited)
/// lets the allocation go.
#[derive(Debug)]
pub struct ExportHold {
    base: u64,
}

impl Drop for ExportHold {
    fn drop(&mut self) {
        let mut map = OWNERS.lock();
        if let Some(e) = map.get_mut(&self.base) {
            e.counts.exported = e.counts.exported.saturating_sub(1);
        }
    }
}

/// Counts one more export of the owned allocation at `base`.
pub fn hold_for_export(base: u64) -> Result<ExportHold> {
    let mut map = OWNERS.lock();
    let e = map.get_mut(&base).ok_or_else(|| Error::NotFound(format!("no library allocation at 0x{base:x}")))?;
    e.counts.exported += 1;
    Ok(ExportHold { base })
}

/// How many exports hold the owned allocation at `base` now.
pub fn exports_of(base: u64) -> u64 {
    OWNERS.lock().get(&base).map_or(0, |e| e.counts.exported)
}

/// A local GPU group's fence on one of this process's pinned host
/// allocations: while a group copies to or from it (and for good after an
/// uncertain completion, when the DMA may still touch it) no other GPU
/// group and no CPU (TCP) access of this process uses it. Fences are
/// exclusive among themselves; exports do not take them. Dropping it
/// returns the allocation.
#[derive(Debug)]
pub struct Fence {
    base: u64,
}

impl Drop for Fence {
    fn drop(&mut self) {
        let mut map = OWNERS.lock();
        if let Some(e) = map.get_mut(&self.base) {
            e.counts.fenced = false;
        }
        drop(map);
        FENCE_LIFTED.notify_all();
    }
}

/// Fences every library pinned host allocation holding one of `addrs`
/// (in address order, so groups never wait on each other in a cycle),
/// waiting within the deadline while another group holds one. One owner
/// lookup per run of addresses inside one allocation (or one stretch of
/// memory the library does not own), not one per address.
pub fn fence_pinned_at(addrs: impl Iterator<Item = u64>, deadline: std::time::Instant) -> Result<Vec<Fence>> {
    let mut bases: Vec<u64> = Vec::new();
    let mut last: Option<(u64, u64)> = None;
    for a in addrs {
        if last.is_some_and(|(lo, hi)| a >= lo && a < hi) {
            continue;
        }
        match owner_of(a) {
            Some(o) => {
                last = Some((o.base, o.base + o.len));
                if o.kind == MemoryKind::PinnedHost {
                    bases.push(o.base);
                }
            }
            None => last = None,
        }
    }
    bases.sort_unstable();
    bases.dedup();
    bases
        .into_iter()
        .map(|b| {
            fence(b, deadline).map_err(|e| {
                Error::Unavailable(format!("local pinned allocation 0x{b:x} is held by another group: {}", e.message()))
            })
        })
        .collect()
}

/// Fences the owned allocation at `base`, waiting until `deadline` while
/// another group's fence holds it.
pub fn fence(base: u64, deadline: std::time::Instant) -> Result<Fence> {
    let mut map = OWNERS.lock();
    loop {
        let e = map.get_mut(&base).ok_or_else(|| Error::NotFound(format!("no library allocation at 0x{base:x}")))?;
        if !e.counts.fenced {
            e.counts.fenced = true;
            return Ok(Fence { base });
        }
        if FENCE_LIFTED.wait_until(&mut map, deadline).timed_out() && map.get(&base).is_some_and(|e| e.counts.fenced) {
            return Err(Error::Unavailable(format!(
                "allocation 0x{base:x} is held by another GPU group (or fenced after an uncertain completion)"
            )));
        }
    }
}

/// Whether the owned allocation holding `addr` is fenced by a GPU group now.
pub fn fenced(addr: u64) -> bool {
    let map = OWNERS.lock();
    map.range(..=addr).next_back().is_some_and(|(_, e)| addr < e.owned.addr + e.owned.physical && e.counts.fenced)
}

#[cfg(test)]
#[path = "owners_tests.rs"]
mod tests;
