//! OrbiTE: a transfer engine that moves bytes between cooperating processes.
//!
//! A requester READs from or WRITEs into memory that a source process
//! registered, by absolute registered address, in batches, with an exact
//! account of every request. The same engine is shipped as `liborbite.so`
//! with the C ABI in `include/orbite.h` (see `src/ffi`).
//!
//! ```no_run
//! use orbite::{Engine, EngineConfig, Access, Request, Op, SubmitOptions};
//! let source = Engine::new(EngineConfig::default())?;
//! let mut remote = vec![7u8; 4096];
//! source.register_memory(remote.as_mut_ptr() as u64, 4096, Access::READ)?;
//!
//! let requester = Engine::new(EngineConfig::default())?;
//! let mut local = vec![0u8; 4096];
//! requester.register_memory(local.as_mut_ptr() as u64, 4096, Access::NONE)?;
//! let peer = requester.connect(&source.endpoint(), None)?;
//! let batch = requester.submit(peer, &[Request {
//!     op: Op::Read, local_addr: local.as_ptr() as u64,
//!     remote_addr: remote.as_ptr() as u64, len: 4096 }], SubmitOptions::default())?;
//! batch.wait(std::time::Duration::from_secs(10))?;
//! # Ok::<(), orbite::Error>(())
//! ```

#![deny(unsafe_op_in_unsafe_fn)]

/// The value of a simulator's bug switch (`mutated!(self.mutations.x)`)
/// in test builds and with the `sim` feature; `false` in the library as
/// shipped, where the switches are not compiled at all (`liborbite.so`
/// carries none: ctest `no_test_switches` checks it).
macro_rules! mutated {
    ($switch:expr) => {{
        #[cfg(any(test, feature = "sim"))]
        let on: bool = $switch;
        #[cfg(not(any(test, feature = "sim")))]
        let on = false;
        on
    }};
}

// Layers, from the ground up (a file imports only layers below it;
// `tests/layers.rs` checks it, docs/architecture.md draws it):
// ground (error, log, random, kinds, sync, counters, transfer) < cuda < memory < control
// < transport < discovery < engine < ffi.
pub mod control;
pub mod counters;
pub mod cuda;
pub mod discovery;
pub mod engine;
pub mod error;
// The C ABI. Private: its functions take raw pointers on the word of the C
// contract, so safe Rust must not reach them (rustls-ffi and wasmtime keep
// theirs out of the Rust API the same way). Their `#[no_mangle]` symbols
// are exported from the cdylib and the staticlib all the same.
mod ffi;
pub mod kinds;
pub mod log;
pub mod memory;
pub mod random;
pub mod sync;
pub mod transfer;
pub mod transport;

pub use control::message::RegionInfo;
pub use engine::direct::DirectRoute;
pub use engine::doctor::{diagnose, Check, CheckStatus, DiagnoseOptions, Diagnosis};
pub use engine::registry::retained_resources_json;
pub use engine::stats::EngineStats;
pub use engine::{Batch, Engine, EngineConfig, FabricDomain, MnnvlConfig, MnnvlHandleType, SubmitOptions};
pub use error::{Error, Result, Status};
pub use kinds::{Transport, TransportKind};
pub use memory::cuda::{
    adopt as cuda_adopt, allocate_egm, allocate_mnnvl, allocate_pinned_host, free_egm, free_mnnvl, CudaMemory,
    ADOPT_SHARE_WHOLE_ALLOCATION,
};
#[cfg(feature = "cuda")]
pub use memory::cuda::{wrap_egm, wrap_mnnvl};
pub use memory::owners::allocate_shared_host;
pub use memory::{Access, Allocation, MemoryKind};
pub use transfer::{Op, RemoteEffect, Request, RequestResult, MAX_REQUESTS};
pub use transport::inbox::Notification;

/// Library version, `MAJOR.MINOR.PATCH`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The C ABI's version: `ORBITE_ABI_VERSION` of `include/orbite.h`, which
/// `orbite_abi_version()` returns and the SONAME suffix carries
/// (`liborbite.so.1`). Bumped on any incompatible change. Written once, as
/// `abi-version` in Cargo.toml; build.rs hands it over.
pub const ABI_VERSION: u32 = parse_abi_version(env!("ORBITE_ABI_VERSION"));

/// `ORBITE_ABI_VERSION` from the decimal text build.rs sets.
const fn parse_abi_version(text: &str) -> u32 {
    let bytes = text.as_bytes();
    assert!(!bytes.is_empty(), "ORBITE_ABI_VERSION is empty");
    let mut value = 0u32;
    let mut i = 0;
    while i < bytes.len() {
        assert!(bytes[i].is_ascii_digit(), "ORBITE_ABI_VERSION is not a whole number");
        value = value * 10 + (bytes[i] - b'0') as u32;
        i += 1;
    }
    value
}
