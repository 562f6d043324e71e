//! The cooperative IPC protocol, written once for every kind of exportable
//! memory: export grants after validation, an offer before the handle,
//! whole-allocation holds, physical-extent charges (once per allocation),
//! exit watches on importers, subbatches with ordered
//! or batched copies, operation-complete and close receipts with ACKs, the
//! relocation cache, and retention when cleanup cannot be confirmed.
//! Backends (`backend::IpcBackend`) supply export, import, copy, wait and
//! close for their memory: `shm` for host memfd memory, the CUDA backends
//! for device memory.

pub mod alive;
pub mod backend;
pub mod backends;
pub mod board;
pub mod cache;
pub mod channel;
pub mod executor;
pub mod exit_watch;
pub mod export;
pub mod faults;
pub mod groups;
pub mod link;
pub mod messages;
pub mod pipeline;
pub mod plan;
pub mod proto;
pub mod requester;
pub mod source;
