//! Registrations: registering and unregistering memory (plain host memory,
//! library shared host memory, library CUDA allocations), the producer
//! streams handed over for CUDA regions, and the regions this engine holds.

use super::Engine;
use crate::control::message::RegionInfo;
use crate::error::{Error, Result};
use crate::memory::{Access, Allocation, MemoryKind};
use std::time::Duration;

impl Engine {
    /// Registers `[addr, addr+len)` with remote `access`. Returns the region id.
    pub fn register_memory(&self, addr: u64, len: u64, access: Access) -> Result<u64> {
        self.check_open()?;
        let r = self.inner.regions.register(addr, len, access)?;
        // An exportable allocation larger than the mapping budget can only
        // ever be reached over TCP: say so now, not at the first grant.
        let budget = self.inner.config.max_inflight_bytes;
        if access != Access::NONE && r.kind != MemoryKind::Host && r.kind != MemoryKind::Cuda {
            if let Some(o) = crate::memory::owners::owner_of(addr).filter(|o| o.physical > budget) {
                self.inner.note(format!(
                    "region {} lies in a {} allocation of {} bytes, more than max_inflight_bytes ({budget}): peers \
                     can reach it over TCP only; raise max_inflight_bytes on this engine (and on the requesters)",
                    r.id,
                    r.kind.name(),
                    o.physical
                ));
            }
        }
        self.inner.log.debug(format_args!(
            "region {} registered: 0x{addr:x}+{len}, {} memory, remote access {}",
            r.id,
            r.kind.name(),
            access_words(access)
        ));
        Ok(r.id)
    }

    /// Unregisters a region, waiting up to `timeout` (None: engine default)
    /// for copies and exports that use it. Live requesters holding an
    /// import of it are asked to give it back now; one that does not
    /// (frozen, partitioned) leaves the call `TimedOut` naming its export
    /// and process, and the region registered.
    pub fn unregister_memory(&self, region: u64, timeout: Option<Duration>) -> Result<()> {
        self.check_owner()?;
        let timeout = self.timeout(timeout);
        // Importers' cached grants of the region stop at once (their board
        // slots are revoked); an unregistration that times out gives them
        // back.
        let deadline = std::time::Instant::now() + timeout;
        for t in &self.inner.ipc {
            t.exports.suspend(Some(region), deadline);
        }
        // Then the importers are asked for the region's imports back, which
        // an idle one would otherwise keep until its next flush: each gives
        // back the imports whose grants its board shows withdrawn.
        if self.inner.ipc.iter().any(|t| !t.exports.holding(region).is_empty()) {
            self.inner.revoker.revoke_all();
        }
        // One deadline for every wait inside: what the slots took is not
        // given again to the region's leases.
        let r = self.inner.regions.unregister(region, deadline.saturating_duration_since(std::time::Instant::now()));
        match r {
            Ok(()) => self.inner.log.debug(format_args!("region {region} unregistered")),
            Err(e) => {
                for t in &self.inner.ipc {
                    t.exports.resume(region);
                }
                let held: Vec<String> = self.inner.ipc.iter().flat_map(|t| t.exports.holding(region)).collect();
                if held.is_empty() {
                    return Err(e);
                }
                return Err(Error::from_status(
                    e.status(),
                    format!(
                        "{}; {} of them are exports whose importers did not give them back in time: {}",
                        e.message(),
                        held.len(),
                        held.join("; ")
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The regions this engine has registered.
    pub fn regions(&self) -> Vec<RegionInfo> {
        self.inner.regions.snapshot().iter().map(|r| RegionInfo::of(r)).collect()
    }

    /// Hands a GPU producer stream over for `region`: transfers of the region
    /// start after the work queued on the stream so far.
    pub fn record_producer_stream(&self, region: u64, cu_stream: u64) -> Result<()> {
        self.check_open()?;
        let addr = self
            .inner
            .regions
            .snapshot()
            .iter()
            .find(|r| r.id == region)
            .map(|r| r.addr)
            .ok_or_else(|| Error::NotFound(format!("no region with id {region} is registered")))?;
        crate::memory::cuda::record_producer_stream(addr, cu_stream)
    }

    /// Registers several library CUDA allocations at once (whole logical
    /// ranges). Either every one is registered or none is.
    pub fn register_cuda_memory_batch(&self, allocs: &[(&Allocation, Access)]) -> Result<Vec<u64>> {
        let mut done = Vec::with_capacity(allocs.len());
        for (a, access) in allocs {
            if !matches!(a.kind(), MemoryKind::Cuda | MemoryKind::CudaIpc | MemoryKind::Mnnvl | MemoryKind::Egm) {
                let e = Error::InvalidArgument(format!(
                    "allocation at 0x{:x} holds {} memory, not CUDA memory",
                    a.addr(),
                    a.kind().name()
                ));
                self.undo(&done);
                return Err(e);
            }
            match self.register_memory(a.addr(), a.len(), *access) {
                Ok(id) => done.push(id),
                Err(e) => {
                    self.undo(&done);
                    return Err(e);
                }
            }
        }
        Ok(done)
    }

    /// Registers library pinned host memory (the pinned-host counterpart of
    /// `register_cuda_memory_batch`; pageable memory is refused).
    pub fn register_host_memory(&self, a: &Allocation, access: Access) -> Result<u64> {
        if a.kind() != MemoryKind::PinnedHost {
            return Err(Error::InvalidArgument(format!(
                "allocation at 0x{:x} holds {} memory; NVLink host directions need allocate_pinned_host memory",
                a.addr(),
                a.kind().name()
            )));
        }
        self.register_memory(a.addr(), a.len(), access)
    }

    /// Hands a producer stream over for pinned host memory (the pinned-host
    /// variant of `record_producer_stream`).
    pub fn record_pinned_host_producer_stream(&self, region: u64, cu_stream: u64) -> Result<()> {
        self.record_producer_stream(region, cu_stream)
    }

    fn undo(&self, ids: &[u64]) {
        for id in ids {
            let _ = self.unregister_memory(*id, None);
        }
    }
}

/// Remote access in words: "none", "read", "write" or "read, write".
fn access_words(a: Access) -> &'static str {
    match (a.can_read(), a.can_write()) {
        (false, false) => "none",
        (true, false) => "read",
        (false, true) => "write",
        (true, true) => "read, write",
    }
}
