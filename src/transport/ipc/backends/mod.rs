//! The memory backends of the IPC protocol (`super::backend::IpcBackend`):
//! `shm` for host memfd memory; `nvlink` (legacy CUDA IPC handles) and
//! `mnnvl` (CUDA VMM fabric or POSIX-fd handles) for device memory, both
//! copying through one `cuda_mapping`, whose copies `copy_batch` builds.

pub mod copy_batch;
#[cfg(feature = "cuda")]
pub mod cuda_mapping;
pub mod mnnvl;
#[cfg(feature = "cuda")]
pub mod nvlink;
pub mod shm;
