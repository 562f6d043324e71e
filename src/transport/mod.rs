//! Payload transports: `tcp` carries bytes over the control connection;
//! `ipc` is the cooperative IPC protocol, written once, whose memory
//! backends are `shm` (host memfd memory), `nvlink` (CUDA IPC) and `mnnvl`
//! (CUDA VMM fabric/POSIX-fd handles), the CUDA ones copying through one
//! `cuda_mapping`; `inbox` and `outbox` queue notifications, received and
//! to send. Nothing here reaches up into the engine.

pub mod coalesce;
pub mod copy_batch;
pub mod cpu_copy;
#[cfg(feature = "cuda")]
pub mod cuda_mapping;
pub mod inbox;
pub mod ipc;
pub mod mnnvl;
#[cfg(feature = "cuda")]
pub mod nvlink;
pub mod outbox;
pub mod reactor;
pub mod shm;
pub mod tcp;
