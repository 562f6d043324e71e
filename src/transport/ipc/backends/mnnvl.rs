//! MNNVL: how exports name their memory (the handle type), the wire form of
//! an MNNVL handle, and the MNNVL backend of the IPC protocol (fabric or
//! POSIX-fd VMM handles, imports mapped with access for the visible local
//! GPUs, imported and copied in the context of the GPU of the group's local
//! memory — its device, the GPU attached to a local EGM owner's NUMA node,
//! or the first visible GPU for other host memory — through a
//! [`CudaMapping`](super::cuda_mapping::CudaMapping), always
//! asynchronously).

use crate::cuda::vmm::FABRIC_HANDLE_BYTES;
use crate::error::{Error, Result};

/// How MNNVL exports name their memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MnnvlHandleType {
    /// A 64-byte CUDA fabric handle (`CU_MEM_HANDLE_TYPE_FABRIC`).
    Fabric,
    /// A POSIX file descriptor passed between processes of one host.
    PosixFd,
}

impl MnnvlHandleType {
    /// The name used in config.
    pub fn as_str(self) -> &'static str {
        match self {
            MnnvlHandleType::Fabric => "fabric",
            MnnvlHandleType::PosixFd => "posix_fd",
        }
    }
}

/// How an MNNVL export names its memory on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandleBody {
    /// A 64-byte fabric handle (any host of the NVLink partition).
    Fabric([u8; FABRIC_HANDLE_BYTES]),
    /// A POSIX fd passed with `SCM_RIGHTS` (same host); the exporter's pid
    /// is carried for the importer's check.
    PosixFd {
        /// Exporter process id.
        pid: u32,
    },
}

/// The MNNVL handle as it travels in `ExportHandle`: kind, physical size,
/// granularity, the handle body and a checksum that catches corruption.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireHandle {
    /// Physical size of the allocation (a multiple of `granularity`).
    pub physical: u64,
    /// Allocation granularity the exporter used.
    pub granularity: u64,
    /// The handle.
    pub body: HandleBody,
}

const MAGIC: &[u8; 4] = b"MNVL";
const WIRE_LEN: usize = 4 + 1 + 8 + 8 + FABRIC_HANDLE_BYTES + 8;

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ *b as u64).wrapping_mul(0x100_0000_01b3))
}

impl WireHandle {
    /// Encodes to the fixed wire form.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(WIRE_LEN);
        v.extend_from_slice(MAGIC);
        let mut payload = [0u8; FABRIC_HANDLE_BYTES];
        let kind = match &self.body {
            HandleBody::Fabric(h) => {
                payload = *h;
                1u8
            }
            HandleBody::PosixFd { pid } => {
                payload[..4].copy_from_slice(&pid.to_le_bytes());
                2u8
            }
        };
        v.push(kind);
        v.extend_from_slice(&self.physical.to_le_bytes());
        v.extend_from_slice(&self.granularity.to_le_bytes());
        v.extend_from_slice(&payload);
        let sum = fnv(&v);
        v.extend_from_slice(&sum.to_le_bytes());
        v
    }

    /// Decodes and checks: exact length, magic, kind, checksum, a nonzero
    /// fabric handle, sizes consistent with the granularity.
    pub fn decode(b: &[u8]) -> Result<WireHandle> {
        if b.len() != WIRE_LEN {
            return Err(Error::Protocol(format!("an MNNVL handle has {WIRE_LEN} bytes, got {}", b.len())));
        }
        if &b[..4] != MAGIC {
            return Err(Error::Protocol("not an MNNVL handle (bad magic)".into()));
        }
        let sum = u64::from_le_bytes(b[WIRE_LEN - 8..].try_into().expect("8"));
        if fnv(&b[..WIRE_LEN - 8]) != sum {
            return Err(Error::Protocol("MNNVL handle corrupted (checksum mismatch)".into()));
        }
        let physical = u64::from_le_bytes(b[5..13].try_into().expect("8"));
        let granularity = u64::from_le_bytes(b[13..21].try_into().expect("8"));
        let mut payload = [0u8; FABRIC_HANDLE_BYTES];
        payload.copy_from_slice(&b[21..21 + FABRIC_HANDLE_BYTES]);
        let body = match b[4] {
            1 if payload != [0u8; FABRIC_HANDLE_BYTES] => HandleBody::Fabric(payload),
            1 => return Err(Error::Protocol("MNNVL fabric handle is all zero".into())),
            2 => HandleBody::PosixFd { pid: u32::from_le_bytes(payload[..4].try_into().expect("4")) },
            k => return Err(Error::Protocol(format!("unknown MNNVL handle kind {k}"))),
        };
        if granularity == 0 || !granularity.is_power_of_two() || physical == 0 || physical % granularity != 0 {
            return Err(Error::Protocol(format!(
                "MNNVL handle sizes are inconsistent (physical {physical}, granularity {granularity})"
            )));
        }
        Ok(WireHandle { physical, granularity, body })
    }
}

#[cfg(feature = "cuda")]
pub use backend::MnnvlBackend;

#[cfg(feature = "cuda")]
mod backend {
    use super::{HandleBody, MnnvlHandleType, WireHandle};
    use crate::cuda::fabric::{self, HandleType, Received, Shareable};
    use crate::cuda::stream_pool::StreamPool;
    use crate::cuda::streams::CudaStreams;
    use crate::error::{Error, Result};
    use crate::kinds::TransportKind;
    use crate::memory::cuda::consume_producer;
    use crate::transport::ipc::backend::{ExportedHandle, IpcBackend, Mapping, ReceivedHandle};
    use crate::transport::ipc::backends::cuda_mapping::{Closer, CudaMapping, DeviceCopies};
    use std::sync::Arc;

    /// The MNNVL backend.
    pub struct MnnvlBackend {
        handle_type: MnnvlHandleType,
        pool: Arc<StreamPool<CudaStreams>>,
        copies: Arc<DeviceCopies>,
    }

    impl MnnvlBackend {
        /// A backend exporting `handle_type` handles and copying on `pool`.
        /// Resolves the fabric symbols (only here, when MNNVL is requested).
        pub fn new(handle_type: MnnvlHandleType, pool: Arc<StreamPool<CudaStreams>>) -> Result<MnnvlBackend> {
            fabric::fabric_ready()?;
            Ok(MnnvlBackend { handle_type, pool, copies: Arc::new(DeviceCopies::default()) })
        }

        /// Copies per device (for stats).
        pub fn copies(&self) -> &Arc<DeviceCopies> {
            &self.copies
        }
    }

    impl IpcBackend for MnnvlBackend {
        fn transport(&self) -> TransportKind {
            TransportKind::Mnnvl
        }

        fn usable(&self) -> Result<()> {
            crate::cuda::driver::usable()
        }

        fn export_waits(&self, base: u64) -> bool {
            crate::memory::cuda::producer_pending(base)
        }

        fn before_export(&self, base: u64) -> Result<()> {
            consume_producer(base)
        }

        fn export(&self, base: u64, _writable: bool) -> Result<ExportedHandle> {
            // The source consumes producer readiness before exposing the backing.
            consume_producer(base)?;
            let ty = match self.handle_type {
                MnnvlHandleType::Fabric => HandleType::Fabric,
                MnnvlHandleType::PosixFd => HandleType::PosixFd,
            };
            let e = fabric::export(base, ty)?;
            let (body, owned_fd) = match e.handle {
                Shareable::Fabric(h) => (HandleBody::Fabric(h), None),
                Shareable::PosixFd(fd) => (HandleBody::PosixFd { pid: std::process::id() }, Some(fd)),
            };
            let w = WireHandle { physical: e.physical, granularity: e.granularity, body };
            Ok(ExportedHandle { bytes: w.encode(), fd: None, owned_fd, mark: None })
        }

        fn unexport(&self, base: u64) {
            fabric::retire_export(base)
        }

        fn import(
            &self,
            handle: ReceivedHandle,
            physical: u64,
            _writable: bool,
            local_device: Option<i32>,
        ) -> Result<Box<dyn Mapping>> {
            let w = WireHandle::decode(&handle.bytes)?;
            if w.physical != physical {
                return Err(Error::Protocol(format!("MNNVL handle says {} bytes, the grant {physical}", w.physical)));
            }
            let received = match &w.body {
                HandleBody::Fabric(data) => Received::Fabric(data),
                HandleBody::PosixFd { .. } => Received::PosixFd(
                    handle
                        .fd
                        .as_ref()
                        .ok_or_else(|| Error::Protocol("a POSIX-fd MNNVL handle arrived without its fd".into()))?,
                ),
            };
            let device = local_device.unwrap_or(0);
            let imported = fabric::import(received, w.physical, device)?;
            // MNNVL always uses the asynchronous stream and completion event.
            let (va, ctx, pool, copies) = (imported.va, imported.ctx, self.pool.clone(), self.copies.clone());
            Ok(Box::new(CudaMapping::new(va, device, ctx, pool, 0, Closer::Vmm(imported), copies)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_form_round_trips_and_rejects_corruption() {
        let mut fh = [0u8; 64];
        fh[0] = 9;
        fh[63] = 1;
        for body in [HandleBody::Fabric(fh), HandleBody::PosixFd { pid: 4242 }] {
            let w = WireHandle { physical: 4 << 20, granularity: 2 << 20, body };
            let b = w.encode();
            assert_eq!(WireHandle::decode(&b).unwrap(), w);
            assert!(WireHandle::decode(&b[..b.len() - 1]).unwrap_err().message().contains("bytes"));
            let mut longer = b.clone();
            longer.push(0);
            assert!(WireHandle::decode(&longer).is_err());
            for i in 0..b.len() {
                let mut c = b.clone();
                c[i] ^= 0x40;
                assert!(WireHandle::decode(&c).is_err(), "flip at {i} accepted");
            }
        }
        let zero = WireHandle { physical: 2 << 20, granularity: 2 << 20, body: HandleBody::Fabric([0; 64]) };
        assert!(WireHandle::decode(&zero.encode()).unwrap_err().message().contains("all zero"));
        let odd = WireHandle { physical: 3 << 20, granularity: 2 << 20, body: HandleBody::PosixFd { pid: 1 } };
        assert!(WireHandle::decode(&odd.encode()).unwrap_err().message().contains("inconsistent"));
    }
}
