//! The NVLink (CUDA IPC) backend of the IPC protocol: an export is the CUDA
//! IPC handle of a whole `allocate_ipc` allocation; an import is opened in
//! the requester's primary context and copied through as a
//! [`CudaMapping`]: a leased stream with one trailing event (native batch
//! copies for independent groups), or, for a single copy below
//! `nvlink_async_memcpy_threshold_kb`, synchronously with the legacy stream
//! drained before the import may be released.

use super::cuda_mapping::{Closer, CudaMapping};
use super::ipc::backend::{ExportedHandle, IpcBackend, Mapping, ReceivedHandle};
use crate::cuda::driver::{driver, primary_context};
use crate::cuda::memory::{ipc_handle, ipc_open, IPC_HANDLE_BYTES};
use crate::cuda::stream_pool::StreamPool;
use crate::cuda::streams::CudaStreams;
use crate::error::{Error, Result};
use crate::kinds::TransportKind;
use crate::memory::cuda::consume_producer;
use crate::memory::{owners, MemoryKind};
use std::sync::Arc;

/// The NVLink backend.
pub struct NvlinkBackend {
    pool: Arc<StreamPool<CudaStreams>>,
    /// The requester's device for imports (its first visible device);
    /// peer ordinals never select it.
    device: i32,
    threshold: u64,
}

impl NvlinkBackend {
    /// A backend with a pool of `streams` slots and the sync-copy threshold.
    pub fn new(streams: usize, threshold_kb: u64) -> Result<NvlinkBackend> {
        driver()?;
        Ok(NvlinkBackend { pool: StreamPool::new(CudaStreams, streams), device: 0, threshold: threshold_kb * 1024 })
    }

    /// The stream pool (for stats).
    pub fn pool(&self) -> &Arc<StreamPool<CudaStreams>> {
        &self.pool
    }
}

impl IpcBackend for NvlinkBackend {
    fn transport(&self) -> TransportKind {
        TransportKind::Nvlink
    }

    fn export(&self, base: u64, _writable: bool) -> Result<ExportedHandle> {
        let o = owners::owner_of(base)
            .filter(|o| o.base == base && o.kind == MemoryKind::CudaIpc)
            .ok_or_else(|| Error::NotSupported(format!("0x{base:x} is not an allocate_ipc allocation")))?;
        consume_producer(base)?;
        let h = ipc_handle(o.device.unwrap_or(0), base)?;
        Ok(ExportedHandle { bytes: h.to_vec(), fd: None, owned_fd: None })
    }

    fn import(&self, handle: ReceivedHandle, physical: u64, _writable: bool) -> Result<Box<dyn Mapping>> {
        let h: &[u8; IPC_HANDLE_BYTES] = handle.bytes.as_slice().try_into().map_err(|_| {
            Error::Protocol(format!("a CUDA IPC handle has {IPC_HANDLE_BYTES} bytes, got {}", handle.bytes.len()))
        })?;
        let ctx = primary_context(self.device)?;
        let p = ipc_open(ctx, h)?;
        Ok(Box::new(CudaMapping::new(p, physical, ctx, self.pool.clone(), self.threshold, Closer::Ipc)))
    }
}
