//! Payload transports: `tcp` carries bytes over the control connection;
//! `ipc` is the cooperative IPC protocol, written once, whose memory
//! backends live in `ipc::backends`: `shm` (host memfd memory), `nvlink`
//! (CUDA IPC) and `mnnvl` (CUDA VMM fabric/POSIX-fd handles), the CUDA ones
//! copying through one `cuda_mapping`, and `cpu_copy`, the copy pool of
//! SHM's and CMA's CPU copies; `coalesce` merges contiguous runs into one
//! copy; `inbox` queues notifications received (`tcp::outbox` those to
//! send); `wire` is how a control connection's or fabric channel's bytes
//! travel, plain or sealed. Nothing here reaches up into the engine.

pub mod coalesce;
pub mod inbox;
pub mod ipc;
pub mod planned;
pub mod reactor;
pub mod tcp;
