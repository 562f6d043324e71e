//! The NVLink (CUDA IPC) backend of the IPC protocol: an export is the CUDA
//! IPC handle of a whole exportable device allocation (`allocate_ipc`, or
//! `cudaMalloc` memory the caller adopted) followed by the UUID of the GPU
//! holding it; an import is opened in the primary context of the GPU that
//! will copy it, and copied through as a [`CudaMapping`]: a leased stream
//! with one trailing event (native batch copies for independent groups),
//! or, for a single copy below `nvlink_async_memcpy_threshold_kb`,
//! synchronously with the legacy stream drained before the import may be
//! released.
//!
//! Which GPU copies: the local memory's own device; for local pinned host
//! memory, the GPU that holds the remote allocation when this process sees
//! it (matched by UUID, since ordinals differ between processes), else the
//! first visible GPU.

use super::cuda_mapping::{Closer, CudaMapping, DeviceCopies};
use crate::cuda::driver::{device_uuid, device_with_uuid, driver, primary_context};
use crate::cuda::raw::{ipc_handle, ipc_open, IPC_HANDLE_BYTES};
use crate::cuda::stream_pool::StreamPool;
use crate::cuda::streams::CudaStreams;
use crate::error::{Error, Result};
use crate::kinds::TransportKind;
use crate::memory::cuda::consume_producer;
use crate::memory::{owners, MemoryKind};
use crate::transport::ipc::backend::{ExportedHandle, IpcBackend, Mapping, ReceivedHandle};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

/// Bytes of an NVLink handle on the wire: the CUDA IPC handle, then the
/// UUID of the exporting GPU (zero when the driver cannot say).
pub const WIRE_HANDLE_BYTES: usize = IPC_HANDLE_BYTES + 16;

/// The NVLink backend.
pub struct NvlinkBackend {
    pool: Arc<StreamPool<CudaStreams>>,
    /// The wire handle made for each exported allocation, by its owner id
    /// (made once: grants of several regions or importers of one
    /// allocation, adopted sub-ranges included, share one handle).
    handles: Mutex<HashMap<u64, Vec<u8>>>,
    copies: Arc<DeviceCopies>,
    threshold: u64,
}

impl NvlinkBackend {
    /// A backend with a pool of `streams` slots and the sync-copy threshold.
    pub fn new(streams: usize, threshold_kb: u64) -> Result<NvlinkBackend> {
        driver()?;
        Ok(NvlinkBackend {
            pool: StreamPool::new(CudaStreams, streams),
            handles: Mutex::new(HashMap::new()),
            copies: Arc::new(DeviceCopies::default()),
            threshold: threshold_kb * 1024,
        })
    }

    /// The stream pool (for stats).
    pub fn pool(&self) -> &Arc<StreamPool<CudaStreams>> {
        &self.pool
    }

    /// Copies per device (for stats).
    pub fn copies(&self) -> &Arc<DeviceCopies> {
        &self.copies
    }
}

/// The GPU whose context imports and copies: the local memory's device, or
/// for host memory the exporter's GPU when visible here, else device 0.
fn copying_device(local_device: Option<i32>, exporter: &[u8; 16]) -> i32 {
    local_device.or_else(|| device_with_uuid(exporter)).unwrap_or(0)
}

impl IpcBackend for NvlinkBackend {
    fn transport(&self) -> TransportKind {
        TransportKind::Nvlink
    }

    fn usable(&self) -> Result<()> {
        crate::cuda::driver::usable()
    }

    fn import_outlives_exporter(&self) -> bool {
        // cuIpcOpenMemHandle: the exporter's free (its exit included)
        // leaves the importer's mapping undefined.
        false
    }

    fn export_waits(&self, base: u64) -> bool {
        crate::memory::cuda::producer_pending(base)
    }

    fn before_export(&self, base: u64) -> Result<()> {
        consume_producer(base)
    }

    fn export(&self, base: u64, _writable: bool) -> Result<ExportedHandle> {
        let o =
            owners::owner_of(base).filter(|o| o.base == base && o.kind == MemoryKind::CudaIpc).ok_or_else(|| {
                Error::NotSupported(format!(
                    "0x{base:x} is not an allocate_ipc allocation or an adopted device allocation"
                ))
            })?;
        consume_producer(base)?;
        if let Some(bytes) = self.handles.lock().get(&o.id) {
            return Ok(ExportedHandle { bytes: bytes.clone(), fd: None, owned_fd: None, mark: None });
        }
        let device = o.device.unwrap_or(0);
        let mut bytes = ipc_handle(device, base)?.to_vec();
        bytes.extend_from_slice(&device_uuid(device).unwrap_or([0; 16]));
        let mut handles = self.handles.lock();
        // Handles of allocations gone since are dropped here.
        handles.retain(|id, _| owners::owner_of_id(*id));
        handles.insert(o.id, bytes.clone());
        Ok(ExportedHandle { bytes, fd: None, owned_fd: None, mark: None })
    }

    fn import(
        &self,
        handle: ReceivedHandle,
        _physical: u64,
        _writable: bool,
        local_device: Option<i32>,
    ) -> Result<Box<dyn Mapping>> {
        if handle.bytes.len() != WIRE_HANDLE_BYTES {
            return Err(Error::Protocol(format!(
                "an NVLink handle has {WIRE_HANDLE_BYTES} bytes, got {}",
                handle.bytes.len()
            )));
        }
        let (h, uuid) = handle.bytes.split_at(IPC_HANDLE_BYTES);
        let h: &[u8; IPC_HANDLE_BYTES] = h.try_into().expect("split at the handle size");
        let device = copying_device(local_device, uuid.try_into().expect("16 bytes"));
        let ctx = primary_context(device)?;
        let p = ipc_open(ctx, h)?;
        let copies = self.copies.clone();
        Ok(Box::new(CudaMapping::new(p, device, ctx, self.pool.clone(), self.threshold, Closer::Ipc, copies)))
    }
}
