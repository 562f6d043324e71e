//! The memory backends of the IPC protocol (`super::backend::IpcBackend`):
//! `shm` for host memfd memory; `cma` for any other registered host memory
//! (cross-memory attach); `nvlink` (legacy CUDA IPC handles) and
//! `mnnvl` (CUDA VMM fabric or POSIX-fd handles) for device memory, both
//! copying through one `cuda_mapping`, whose copies `copy_batch` builds.
//! `held_file` tells whether a memory file's descriptor handed to an
//! importer is still open or mapped anywhere (SHM exports). `cpu_copy` is
//! the copy pool of SHM's memcpy and CMA's kernel calls.

pub mod cma;
pub mod copy_batch;
pub mod cpu_copy;
#[cfg(feature = "cuda")]
pub mod cuda_mapping;
pub mod held_file;
pub mod mnnvl;
#[cfg(feature = "cuda")]
pub mod nvlink;
pub mod shm;
