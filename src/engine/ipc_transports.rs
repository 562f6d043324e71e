//! The engine's cooperative IPC transports (SHM always; CMA unless disabled
//! or refused by a seccomp filter; NVLink when enabled and a CUDA driver is
//! present): each pairs a source-side export table with a requester-side
//! importer over one backend.

use super::config::{EngineConfig, MnnvlHandleType};
use crate::control::Identity;
use crate::counters::Counters;
use crate::error::Result;
use crate::kinds::TransportKind;
use crate::memory::{MemoryKind, Region, RegionTable};
use crate::sync::admission::{Budget, Gate};
use crate::transport::ipc::backend::IpcBackend;
use crate::transport::ipc::export::ExportTable;
use crate::transport::ipc::faults::Faults;
use crate::transport::ipc::proto::exports::Limits;
use crate::transport::ipc::requester::IpcRequester;
use std::collections::BTreeMap;
use std::sync::Arc;

/// One IPC transport of an engine.
pub(crate) struct IpcTransport {
    pub(crate) kind: TransportKind,
    pub(crate) exports: Arc<ExportTable>,
    pub(crate) requester: Arc<IpcRequester>,
    /// Stream-pool counts (CUDA transports).
    pub(crate) pool: Option<PoolFn>,
    /// Copies per device (CUDA transports).
    pub(crate) copies: Option<CopiesFn>,
}

/// Reads a CUDA transport's stream-pool counts.
type PoolFn = Box<dyn Fn() -> crate::cuda::stream_pool::PoolCounts + Send + Sync>;

/// Reads a CUDA transport's copies per device: (copies, bytes) by ordinal.
pub(crate) type CopiesFn = Box<dyn Fn() -> BTreeMap<i32, (u64, u64)> + Send + Sync>;

/// What a CUDA backend adds to its transport: pool and per-device counts.
struct CudaCounts {
    pool: PoolFn,
    copies: CopiesFn,
}

/// Shared pieces every IPC transport of one engine uses.
pub(crate) struct IpcParts<'a> {
    pub(crate) config: &'a EngineConfig,
    pub(crate) regions: &'a Arc<RegionTable>,
    pub(crate) stats: &'a Arc<Counters>,
    pub(crate) mapping_budget: &'a Arc<Budget>,
    pub(crate) source_gate: &'a Arc<Gate>,
    pub(crate) faults: &'a Arc<Faults>,
    /// The I/O threads (exit watches on importers run there).
    pub(crate) reactor: &'a Arc<crate::transport::reactor::Reactor>,
    /// The engine's log lines.
    pub(crate) log: &'a Arc<crate::log::Logger>,
}

impl IpcParts<'_> {
    /// The per-requester bounds of every export table.
    fn limits(&self) -> Limits {
        let c = self.config;
        Limits {
            exports: c.ipc_max_exports_per_requester as usize,
            sole_bytes: (c.max_inflight_bytes as u128 * c.ipc_requester_budget_percent as u128 / 100) as u64,
        }
    }

    fn transport(
        &self,
        kind: TransportKind,
        memory: Vec<MemoryKind>,
        backend: Arc<dyn IpcBackend>,
        cache: usize,
    ) -> IpcTransport {
        let exports = Arc::new(ExportTable::new(
            backend.clone(),
            memory,
            self.regions.clone(),
            self.mapping_budget.clone(),
            self.stats.clone(),
            self.source_gate.clone(),
            std::time::Duration::from_millis(self.config.offer_timeout_ms as u64),
            self.limits(),
            self.log.clone(),
        ));
        exports.set_exit_watch(crate::transport::ipc::exit_watch::watcher(Arc::downgrade(self.reactor)));
        IpcTransport {
            kind,
            exports,
            requester: Arc::new(IpcRequester::new(
                backend,
                self.mapping_budget.clone(),
                cache,
                self.config.coalesce,
                self.faults.clone(),
                self.log.clone(),
            )),
            pool: None,
            copies: None,
        }
    }

    /// The SHM transport.
    pub(crate) fn shm(&self) -> IpcTransport {
        self.transport(
            TransportKind::Shm,
            vec![MemoryKind::SharedHost],
            Arc::new(crate::transport::ipc::backends::shm::ShmBackend),
            self.config.shm_cache_entries as usize,
        )
    }

    /// The CMA transport (cross-memory attach of any registered host
    /// memory), or why it cannot be offered: disabled, or this process may
    /// not make the calls (a seccomp filter).
    pub(crate) fn cma(&self) -> std::result::Result<IpcTransport, String> {
        if !self.config.cma {
            return Err("not enabled (config `cma: false`)".into());
        }
        let backend = crate::transport::ipc::backends::cma::CmaBackend::new(self.config.cma_ptracer, self.log.clone())?;
        Ok(self.transport(
            TransportKind::Cma,
            vec![MemoryKind::Host],
            Arc::new(backend),
            self.config.shm_cache_entries as usize,
        ))
    }

    /// The NVLink transport, or why it cannot be offered.
    pub(crate) fn nvlink(&self) -> std::result::Result<IpcTransport, String> {
        if !self.config.nvlink {
            return Err("not enabled (config `nvlink: false`)".into());
        }
        nvlink_backend(self.config).map_err(|e| e.message().to_string()).map(|(backend, counts)| {
            let mut t = self.transport(
                TransportKind::Nvlink,
                vec![MemoryKind::CudaIpc],
                backend,
                self.config.nvlink_cache_entries as usize,
            );
            (t.pool, t.copies) = (Some(counts.pool), Some(counts.copies));
            t
        })
    }
}

impl IpcParts<'_> {
    /// The MNNVL transport, or why it cannot be offered. Fabric symbols are
    /// resolved only here, when MNNVL is requested.
    pub(crate) fn mnnvl(&self) -> std::result::Result<IpcTransport, String> {
        let Some(m) = &self.config.mnnvl else {
            return Err("not enabled (config `mnnvl: null`)".into());
        };
        let mut kinds = vec![MemoryKind::Mnnvl];
        if m.egm {
            kinds.push(MemoryKind::Egm);
        }
        mnnvl_backend(self.config).map_err(|e| e.message().to_string()).map(|(backend, counts)| {
            let mut t = self.transport(TransportKind::Mnnvl, kinds, backend, self.config.nvlink_cache_entries as usize);
            (t.pool, t.copies) = (Some(counts.pool), Some(counts.copies));
            t
        })
    }
}

#[cfg(feature = "cuda")]
fn cuda_counts(
    pool: Arc<crate::cuda::stream_pool::StreamPool<crate::cuda::streams::CudaStreams>>,
    copies: Arc<crate::transport::ipc::backends::cuda_mapping::DeviceCopies>,
) -> CudaCounts {
    CudaCounts {
        pool: Box::new(move || pool.counts()),
        copies: Box::new(move || copies.snapshot().into_iter().map(|(d, c)| (d, (c.copies, c.bytes))).collect()),
    }
}

#[cfg(feature = "cuda")]
fn mnnvl_backend(config: &EngineConfig) -> Result<(Arc<dyn IpcBackend>, CudaCounts)> {
    crate::cuda::ready()?;
    let pool = crate::cuda::stream_pool::StreamPool::new(
        crate::cuda::streams::CudaStreams,
        config.nvlink_stream_count as usize,
    );
    let handle_type = config.mnnvl.as_ref().map_or(MnnvlHandleType::Fabric, |m| m.handle_type);
    let b = crate::transport::ipc::backends::mnnvl::MnnvlBackend::new(handle_type, pool.clone())?;
    let counts = cuda_counts(pool, b.copies().clone());
    Ok((Arc::new(b), counts))
}

#[cfg(feature = "cuda")]
fn nvlink_backend(config: &EngineConfig) -> Result<(Arc<dyn IpcBackend>, CudaCounts)> {
    let b = crate::transport::ipc::backends::nvlink::NvlinkBackend::new(
        config.nvlink_stream_count as usize,
        config.nvlink_async_memcpy_threshold_kb,
    )?;
    let counts = cuda_counts(b.pool().clone(), b.copies().clone());
    Ok((Arc::new(b), counts))
}

/// Without the `cuda` feature neither CUDA backend exists: the reason.
#[cfg(not(feature = "cuda"))]
fn nvlink_backend(_config: &EngineConfig) -> Result<(Arc<dyn IpcBackend>, CudaCounts)> {
    Err(crate::error::Error::Unavailable(crate::cuda::NO_CUDA.into()))
}

#[cfg(not(feature = "cuda"))]
fn mnnvl_backend(config: &EngineConfig) -> Result<(Arc<dyn IpcBackend>, CudaCounts)> {
    nvlink_backend(config)
}

/// Whether the local memory at `addr` can be the local side of a `kind`
/// copy: a local EGM owner needs a visible GPU attached to its NUMA node
/// (an unknown or incompatible placement cannot select that owner).
#[cfg(feature = "cuda")]
pub(crate) fn local_placement_ok(kind: TransportKind, local: MemoryKind, addr: u64) -> bool {
    if kind != TransportKind::Mnnvl || local != MemoryKind::Egm {
        return true;
    }
    crate::cuda::fabric::egm_node(addr).is_none_or(|n| crate::cuda::fabric::device_for_node(n).is_ok())
}

/// Without the `cuda` feature there is no EGM memory to place.
#[cfg(not(feature = "cuda"))]
pub(crate) fn local_placement_ok(_kind: TransportKind, _local: MemoryKind, _addr: u64) -> bool {
    true
}

/// Before anything is posted on `kind`: MNNVL with `host_register` pins the
/// ordinary host memory of the local regions with CUDA, once per
/// registration (the pin is held until the region is unregistered, and
/// shared with other registrations of the same pages).
#[cfg(feature = "cuda")]
pub(crate) fn prepare_local<'a>(
    kind: TransportKind,
    config: &EngineConfig,
    regions: impl Iterator<Item = &'a Arc<Region>>,
) -> Result<()> {
    if kind != TransportKind::Mnnvl || !config.mnnvl.as_ref().is_some_and(|m| m.host_register) {
        return Ok(());
    }
    for r in regions.filter(|r| matches!(r.kind, MemoryKind::Host | MemoryKind::SharedHost)) {
        r.hold_backing(|| Ok(Box::new(crate::cuda::host_pin::pin(r.addr, r.len)?)))?;
    }
    Ok(())
}

/// Without the `cuda` feature MNNVL is never selected: nothing to prepare.
#[cfg(not(feature = "cuda"))]
pub(crate) fn prepare_local<'a>(
    _kind: TransportKind,
    _config: &EngineConfig,
    _regions: impl Iterator<Item = &'a Arc<Region>>,
) -> Result<()> {
    Ok(())
}

/// Describe capability bit: this engine opted in to EGM remote host grants.
pub(crate) const EGM_CAPABILITY: u32 = 1 << 8;

/// Describe capability bit: this engine serves MNNVL with fabric handles
/// over TCP channels for its (nonzero) fabric domain.
pub(crate) const FABRIC_CHANNEL_CAPABILITY: u32 = 1 << 9;

/// The fabric domain for which an engine runs MNNVL channels over TCP:
/// MNNVL configured, fabric handles, a nonzero domain.
pub(crate) fn fabric_channel_domain(config: &EngineConfig) -> Option<[u8; 16]> {
    let m = config.mnnvl.as_ref()?;
    let d = m.fabric_domain.fixed()?;
    (m.handle_type == MnnvlHandleType::Fabric && d != [0; 16]).then_some(d)
}

/// IPC peers must share a boot (the IPC channel is a Unix socket).
pub(crate) fn same_boot(a: &Identity, b: &Identity) -> bool {
    a.same_boot(b)
}

/// What the IPC transports retain after unconfirmed cleanups (exports
/// without a close receipt, imports kept after an unconfirmed close, fenced
/// local owners, quarantined streams) and the regions with a cached import,
/// per transport, as JSON.
pub(crate) fn retained_detail(ipc: &[IpcTransport]) -> serde_json::Value {
    let mut v = serde_json::Map::new();
    for t in ipc {
        let counts = t.requester.counts();
        let mut entry = serde_json::json!({
            "retained_exports": t.exports.retained(),
            "retained_imports": counts.retained,
            "fenced_local_owners": counts.fenced_local,
            "cached_regions": t.requester.cached_regions(),
        });
        if let Some(pool) = &t.pool {
            entry["quarantined_streams"] = serde_json::json!(pool().retained_streams);
        }
        v.insert(t.kind.name().to_string(), entry);
    }
    serde_json::Value::Object(v)
}
