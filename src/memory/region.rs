//! Registered regions and their table.

use super::owners::{self, MemoryKind};
use crate::error::{Error, Result};
use parking_lot::{Condvar, Mutex, RwLock};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most regions with remote access one engine may hold: all of them are
/// published in its Describe, whose size this bounds. Local-only regions
/// (no remote access) are not published and do not count.
pub const MAX_PUBLISHED_REGIONS: usize = 16_384;

/// What remote peers may do to a region (bit flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Access(u32);

impl Access {
    /// Remote peers may READ the region.
    pub const READ: Access = Access(1);
    /// Remote peers may WRITE the region.
    pub const WRITE: Access = Access(2);
    /// Both.
    pub const READ_WRITE: Access = Access(3);
    /// Neither (local-only region).
    pub const NONE: Access = Access(0);

    /// From raw bits; unknown bits are rejected.
    pub fn from_bits(bits: u32) -> Option<Access> {
        (bits & !3 == 0).then_some(Access(bits))
    }
    /// Raw bits.
    pub const fn bits(self) -> u32 {
        self.0
    }
    /// Whether remote READ is allowed.
    pub fn can_read(self) -> bool {
        self.0 & 1 != 0
    }
    /// Whether remote WRITE is allowed.
    pub fn can_write(self) -> bool {
        self.0 & 2 != 0
    }
    /// Names for JSON (`["read","write"]`).
    pub fn names(self) -> Vec<&'static str> {
        let mut v = Vec::new();
        if self.can_read() {
            v.push("read");
        }
        if self.can_write() {
            v.push("write");
        }
        v
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, o: Access) -> Access {
        Access(self.0 | o.0)
    }
}

/// One registration: a range of memory with access flags and an epoch.
#[derive(Debug)]
pub struct Region {
    /// Engine-local id (nonzero).
    pub id: u64,
    /// Registration epoch: a re-registration of the same range gets a new one.
    pub epoch: u64,
    /// First byte.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Remote access flags.
    pub access: Access,
    /// Kind of the memory behind it.
    pub kind: MemoryKind,
    /// The GPU whose context copies it: its device for device memory, the
    /// GPU attached to its NUMA node for EGM memory; `None` for host memory.
    pub device: Option<i32>,
    active: AtomicU64,
    closing: AtomicBool,
    /// A transport's hold on the backing for this registration (MNNVL's
    /// CUDA host pin), released when the region is unregistered.
    backing_hold: Mutex<Option<Box<dyn std::any::Any + Send + Sync>>>,
}

impl Region {
    /// Runs `make` once per registration to attach a hold on the backing
    /// (kept until unregistration); later calls reuse it.
    pub fn hold_backing(&self, make: impl FnOnce() -> Result<Box<dyn std::any::Any + Send + Sync>>) -> Result<()> {
        let mut h = self.backing_hold.lock();
        if h.is_none() {
            *h = Some(make()?);
        }
        Ok(())
    }

    /// Whether a backing hold is attached.
    pub fn holds_backing(&self) -> bool {
        self.backing_hold.lock().is_some()
    }

    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.addr + self.len
    }

    /// Whether `[addr, addr+len)` lies inside the region.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.addr && addr.checked_add(len).is_some_and(|e| e <= self.end())
    }

    /// Copies using this region right now.
    pub fn active(&self) -> u64 {
        self.active.load(Ordering::Acquire)
    }
}

/// Keeps a region registered while a copy touches it.
pub struct RegionLease {
    region: Arc<Region>,
    table: Arc<TableShared>,
}

impl RegionLease {
    /// The leased region.
    pub fn region(&self) -> &Arc<Region> {
        &self.region
    }
}

impl Drop for RegionLease {
    fn drop(&mut self) {
        if self.region.active.fetch_sub(1, Ordering::AcqRel) == 1 && self.region.closing.load(Ordering::Acquire) {
            let _g = self.table.wake_lock.lock();
            self.table.drained.notify_all();
        }
    }
}

struct TableShared {
    wake_lock: Mutex<()>,
    drained: Condvar,
}

/// The regions one engine registered, ordered by address.
pub struct RegionTable {
    by_addr: RwLock<BTreeMap<u64, Arc<Region>>>,
    shared: Arc<TableShared>,
    next_id: AtomicU64,
    /// Serialises unregister/register so that close waits are coherent.
    change: Mutex<()>,
    /// Registered regions that are published (remote access); changed
    /// under `change`.
    published: AtomicUsize,
}

impl Default for RegionTable {
    fn default() -> Self {
        RegionTable {
            by_addr: RwLock::new(BTreeMap::new()),
            shared: Arc::new(TableShared { wake_lock: Mutex::new(()), drained: Condvar::new() }),
            next_id: AtomicU64::new(1),
            change: Mutex::new(()),
            published: AtomicUsize::new(0),
        }
    }
}

impl RegionTable {
    /// Registers `[addr, addr+len)`. Overlap with an existing region is
    /// `InvalidArgument`; a region with remote access beyond
    /// [`MAX_PUBLISHED_REGIONS`] is `ResourceExhausted`. The kind is
    /// recognised from the library's own allocations; other memory is plain
    /// host memory. The epoch is a fresh random value.
    pub fn register(&self, addr: u64, len: u64, access: Access) -> Result<Arc<Region>> {
        if addr == 0 {
            return Err(Error::InvalidArgument("addr is NULL".into()));
        }
        if len == 0 {
            return Err(Error::InvalidArgument("length is 0".into()));
        }
        let end = addr
            .checked_add(len)
            .ok_or_else(|| Error::InvalidArgument(format!("range 0x{addr:x}+{len} wraps the address space")))?;
        let kind = owners::kind_of(addr, len)?;
        if kind == MemoryKind::Host {
            // Device memory the library neither allocated nor adopted is
            // never taken for host memory (the TCP path would touch it).
            if let Some(what) = super::cuda::foreign_device_memory(addr) {
                return Err(Error::InvalidArgument(format!(
                    "0x{addr:x} is {what} that this library did not allocate; adopt it first with \
                     orbite_cuda_adopt (Rust: memory::cuda::adopt), then register it"
                )));
            }
        }
        let device = super::cuda::local_device(addr, kind);
        let _c = self.change.lock();
        let published = self.published.load(Ordering::Acquire);
        let mut map = self.by_addr.write();
        if let Some((_, r)) = map.range(..end).next_back() {
            if r.end() > addr {
                return Err(Error::InvalidArgument(format!(
                    "range 0x{addr:x}+{len} overlaps region {} (0x{:x}+{})",
                    r.id, r.addr, r.len
                )));
            }
        }
        if access != Access::NONE && published >= MAX_PUBLISHED_REGIONS {
            return Err(Error::ResourceExhausted(format!(
                "{published} regions with remote access are registered, the most one engine publishes; \
                 unregister one, or register local-only memory with access 0"
            )));
        }
        let epoch = crate::random::nonzero_u64()?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let region = Arc::new(Region {
            id,
            epoch,
            addr,
            len,
            access,
            kind,
            device,
            active: AtomicU64::new(0),
            closing: AtomicBool::new(false),
            backing_hold: Mutex::new(None),
        });
        owners::note_registered(addr, 1);
        map.insert(addr, region.clone());
        if access != Access::NONE {
            self.published.fetch_add(1, Ordering::AcqRel);
        }
        Ok(region)
    }

    /// Unregisters region `id`, waiting up to `timeout` for copies using it.
    /// On timeout the region stays registered and usable, and the call
    /// returns `TimedOut`.
    pub fn unregister(&self, id: u64, timeout: Duration) -> Result<()> {
        let _c = self.change.lock();
        let region = self
            .by_addr
            .read()
            .values()
            .find(|r| r.id == id)
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("no region with id {id} is registered")))?;
        region.closing.store(true, Ordering::Release);
        let deadline = Instant::now() + timeout;
        let mut g = self.shared.wake_lock.lock();
        while region.active() > 0 {
            if self.shared.drained.wait_until(&mut g, deadline).timed_out() && region.active() > 0 {
                region.closing.store(false, Ordering::Release);
                return Err(Error::TimedOut(format!(
                    "region {id} is still used by {} in-flight copies; it stays registered",
                    region.active()
                )));
            }
        }
        drop(g);
        self.by_addr.write().remove(&region.addr);
        if region.access != Access::NONE {
            self.published.fetch_sub(1, Ordering::AcqRel);
        }
        owners::note_registered(region.addr, -1);
        // No copy uses it any more: the transport's hold goes now, not when
        // the last stray reference to the region drops.
        drop(region.backing_hold.lock().take());
        Ok(())
    }

    /// Finds the region holding `[addr, addr+len)` and leases it.
    /// Errors: `NotFound` (no region at addr), `OutOfRange` (crosses the
    /// end), `Unavailable` (being unregistered).
    pub fn lease(&self, addr: u64, len: u64) -> Result<RegionLease> {
        let map = self.by_addr.read();
        let r = map
            .range(..=addr)
            .next_back()
            .map(|(_, r)| r)
            .filter(|r| addr < r.end())
            .ok_or_else(|| Error::NotFound(format!("address 0x{addr:x} is in no registered region")))?;
        if !r.contains(addr, len) {
            return Err(Error::OutOfRange(format!(
                "range 0x{addr:x}+{len} crosses the end of region {} (0x{:x}+{})",
                r.id, r.addr, r.len
            )));
        }
        r.active.fetch_add(1, Ordering::AcqRel);
        if r.closing.load(Ordering::Acquire) {
            let lease = RegionLease { region: r.clone(), table: self.shared.clone() };
            drop(lease);
            return Err(Error::Unavailable(format!("region {} is being unregistered", r.id)));
        }
        Ok(RegionLease { region: r.clone(), table: self.shared.clone() })
    }

    /// Leases the range a peer's request names, as every transport's source
    /// side validates it: registered and inside one region
    /// ([`RegionTable::lease`]), of the epoch the peer knows (`STALE_PEER`
    /// otherwise: it refreshes its table), allowing every operation in
    /// `wants` to remote peers (`PERMISSION_DENIED`). What memory kinds a
    /// transport can move is its own check, on the lease's region.
    pub fn lease_for_remote(&self, addr: u64, len: u64, epoch: u64, wants: Access) -> Result<RegionLease> {
        let lease = self.lease(addr, len)?;
        let r = lease.region();
        if r.epoch != epoch {
            return Err(Error::StalePeer(format!(
                "region at 0x{:x} was re-registered (epoch {}, the request names epoch {epoch}); refresh the peer's \
                 regions",
                r.addr, r.epoch
            )));
        }
        for (bit, can, what) in
            [(Access::READ, r.access.can_read(), "READ"), (Access::WRITE, r.access.can_write(), "WRITE")]
        {
            if wants.bits() & bit.bits() != 0 && !can {
                return Err(Error::PermissionDenied(format!(
                    "region {} (0x{:x}+{}) does not allow remote {what}",
                    r.id, r.addr, r.len
                )));
            }
        }
        Ok(lease)
    }

    /// A snapshot of every region.
    pub fn snapshot(&self) -> Vec<Arc<Region>> {
        self.by_addr.read().values().cloned().collect()
    }

    /// Number of regions.
    pub fn len(&self) -> usize {
        self.by_addr.read().len()
    }

    /// Whether no region is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Unregisters everything without waiting (engine teardown, after every
    /// copy thread has stopped).
    pub fn clear(&self) {
        let mut map = self.by_addr.write();
        self.published.store(0, Ordering::Release);
        for r in map.values() {
            owners::note_registered(r.addr, -1);
        }
        map.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An unregistration waits for the leases of copies in flight and is
    /// woken when the last one drops (not by an earlier one, and never
    /// left to its timeout): it returns OK at once, and the region is gone.
    #[test]
    fn unregister_is_woken_by_the_last_lease_it_waits_for() {
        let t = Arc::new(RegionTable::default());
        let r = t.register(0x30000, 0x1000, Access::READ).unwrap();
        let (a, b) = (t.lease(0x30000, 16).unwrap(), t.lease(0x30010, 16).unwrap());
        let (done_tx, done) = std::sync::mpsc::channel();
        let (tid_tx, tid) = std::sync::mpsc::channel();
        let t2 = t.clone();
        let id = r.id;
        std::thread::spawn(move || {
            tid_tx.send(crate::sync::thread_id()).unwrap();
            done_tx.send(t2.unregister(id, Duration::from_secs(600))).unwrap()
        });
        let tid = tid.recv().unwrap();
        // Asleep with the region closing: waiting for the leases (nothing
        // else it takes is held here).
        let until = Instant::now() + Duration::from_secs(60);
        while !r.closing.load(Ordering::Acquire) {
            assert!(Instant::now() < until, "the unregistration never started");
            std::thread::yield_now();
        }
        crate::sync::until_asleep(tid);
        drop(a);
        crate::sync::until_asleep(tid);
        assert!(done.try_recv().is_err(), "returned with a lease still held");
        drop(b);
        done.recv_timeout(Duration::from_secs(60)).expect("the last lease's drop woke nobody").unwrap();
        assert!(matches!(t.lease(0x30000, 16), Err(Error::NotFound(_))));
    }

    /// At most MAX_PUBLISHED_REGIONS regions with remote access; local-only
    /// ones do not count, and an unregistered one frees its place.
    #[test]
    fn published_regions_are_capped_and_local_only_ones_are_not() {
        let t = RegionTable::default();
        let at = |i: u64| 0x100_0000 + i * 0x10;
        let ids: Vec<u64> =
            (0..MAX_PUBLISHED_REGIONS as u64).map(|i| t.register(at(i), 0x10, Access::READ).unwrap().id).collect();
        let n = MAX_PUBLISHED_REGIONS as u64;
        let e = t.register(at(n), 0x10, Access::WRITE).unwrap_err();
        assert!(matches!(e, Error::ResourceExhausted(_)), "{e}");
        t.register(at(n), 0x10, Access::NONE).unwrap();
        t.unregister(ids[0], Duration::from_secs(1)).unwrap();
        t.register(at(n + 1), 0x10, Access::READ).unwrap();
        assert!(matches!(t.register(at(n + 2), 0x10, Access::READ), Err(Error::ResourceExhausted(_))));
    }

    /// Access flags combine as a union, name themselves as Describe and
    /// stats print them, and refuse unknown bits.
    #[test]
    fn access_flags_combine_name_and_refuse_unknown_bits() {
        assert_eq!(Access::READ | Access::WRITE, Access::READ_WRITE);
        assert_eq!(Access::READ | Access::READ, Access::READ);
        assert_eq!(Access::NONE | Access::WRITE, Access::WRITE);
        assert_eq!(Access::READ_WRITE.names(), vec!["read", "write"]);
        assert_eq!(Access::WRITE.names(), vec!["write"]);
        assert!(Access::NONE.names().is_empty());
        assert_eq!(Access::from_bits(3), Some(Access::READ_WRITE));
        assert_eq!(Access::from_bits(4), None);
    }

    /// A transport's hold on a region's backing (MNNVL's host pin) is made
    /// once per registration, even when asked again, and a failed make
    /// leaves none.
    #[test]
    fn a_backing_hold_is_made_once_per_registration() {
        let t = RegionTable::default();
        let r = t.register(0x20000, 0x1000, Access::READ).unwrap();
        assert!(!r.holds_backing());
        let e = r.hold_backing(|| Err(Error::Cuda("pin refused".into()))).unwrap_err();
        assert_eq!(e.message(), "pin refused");
        assert!(!r.holds_backing());
        let made = std::cell::Cell::new(0);
        for _ in 0..3 {
            r.hold_backing(|| {
                made.set(made.get() + 1);
                Ok(Box::new(7u8))
            })
            .unwrap();
        }
        assert_eq!(made.get(), 1);
        assert!(r.holds_backing());
    }

    #[test]
    fn overlap_bounds_and_lookup() {
        let t = RegionTable::default();
        let a = t.register(0x10000, 0x1000, Access::READ).unwrap();
        assert!(matches!(t.register(0x10fff, 1, Access::READ), Err(Error::InvalidArgument(_))));
        assert!(matches!(t.register(0xf000, 0x1001, Access::READ), Err(Error::InvalidArgument(_))));
        let b = t.register(0x11000, 0x10, Access::WRITE).unwrap();
        assert_ne!(a.epoch, b.epoch);
        assert_eq!(t.lease(0x10000, 0x1000).unwrap().region().id, a.id);
        assert!(matches!(t.lease(0x10fff, 2), Err(Error::OutOfRange(_))));
        assert!(matches!(t.lease(0x12000, 1), Err(Error::NotFound(_))));
        // One past a region's last byte is in no region.
        assert!(matches!(t.lease(0x11010, 1), Err(Error::NotFound(_))));
        assert_eq!(t.len(), 2);
        let ids: Vec<u64> = t.snapshot().iter().map(|r| r.id).collect();
        assert_eq!(ids, vec![a.id, b.id]);
        assert!(matches!(t.lease(0x1, 1), Err(Error::NotFound(_))));
        assert!(matches!(t.register(0, 1, Access::READ), Err(Error::InvalidArgument(_))));
        assert!(matches!(t.register(1, 0, Access::READ), Err(Error::InvalidArgument(_))));
        assert!(matches!(t.register(u64::MAX, 2, Access::READ), Err(Error::InvalidArgument(_))));
    }

    #[test]
    fn a_remote_request_is_checked_for_epoch_and_rights() {
        let t = RegionTable::default();
        let ro = t.register(0x10000, 0x1000, Access::READ).unwrap();
        let wo = t.register(0x20000, 0x1000, Access::WRITE).unwrap();
        let rw = t.register(0x30000, 0x1000, Access::READ_WRITE).unwrap();
        let lease = t.lease_for_remote(0x10010, 16, ro.epoch, Access::READ).unwrap();
        assert_eq!(lease.region().id, ro.id);
        assert!(t.lease_for_remote(0x30000, 0x1000, rw.epoch, Access::READ_WRITE).is_ok());
        let denied = |r: Result<RegionLease>, what: &str| match r {
            Err(Error::PermissionDenied(m)) => assert!(m.ends_with(&format!("does not allow remote {what}")), "{m}"),
            other => panic!("{:?}", other.map(|l| l.region().id)),
        };
        denied(t.lease_for_remote(0x10000, 1, ro.epoch, Access::WRITE), "WRITE");
        denied(t.lease_for_remote(0x20000, 1, wo.epoch, Access::READ), "READ");
        denied(t.lease_for_remote(0x10000, 1, ro.epoch, Access::READ_WRITE), "WRITE");
        match t.lease_for_remote(0x30000, 1, rw.epoch + 1, Access::READ) {
            Err(Error::StalePeer(m)) => assert!(m.ends_with("refresh the peer's regions"), "{m}"),
            other => panic!("{:?}", other.map(|l| l.region().id)),
        }
        // The range checks of a lease come first.
        assert!(matches!(t.lease_for_remote(0x10fff, 2, ro.epoch, Access::READ), Err(Error::OutOfRange(_))));
        assert!(matches!(t.lease_for_remote(0x40000, 1, ro.epoch, Access::READ), Err(Error::NotFound(_))));
    }

    #[test]
    fn unregister_waits_for_leases_then_times_out() {
        let t = Arc::new(RegionTable::default());
        let r = t.register(0x20000, 64, Access::READ).unwrap();
        let lease = t.lease(0x20000, 64).unwrap();
        let e = t.unregister(r.id, Duration::from_millis(20)).unwrap_err();
        assert!(matches!(e, Error::TimedOut(_)), "{e:?}");
        // still registered and usable
        let l2 = t.lease(0x20000, 1).unwrap();
        drop(l2);
        let t2 = t.clone();
        let id = r.id;
        let h = std::thread::spawn(move || t2.unregister(id, Duration::from_secs(30)));
        // while closing, new leases are refused (poll until closing is visible)
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match t.lease(0x20000, 1) {
                Err(Error::Unavailable(_)) => break,
                Ok(l) => drop(l),
                Err(e) => panic!("{e:?}"),
            }
            assert!(Instant::now() < deadline);
            std::thread::yield_now();
        }
        drop(lease);
        h.join().unwrap().unwrap();
        assert!(t.is_empty());
        assert!(matches!(t.unregister(r.id, Duration::ZERO), Err(Error::NotFound(_))));
    }
}
