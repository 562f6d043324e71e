//! The CUDA layer. The stream pool and the copy-batch planning are plain
//! Rust (tested on CPU); everything that calls the driver is compiled under
//! the `cuda` feature, through cudarc with dynamic loading, so that a build
//! needs no CUDA toolkit and a machine without a driver still runs every
//! other transport.

pub mod copy_batch;
pub mod stream_pool;
pub mod vmm;

#[cfg(feature = "cuda")]
pub mod driver;
#[cfg(feature = "cuda")]
pub mod host_pin;
#[cfg(feature = "cuda")]
pub mod memory;
#[cfg(feature = "cuda")]
pub mod mnnvl;
#[cfg(feature = "cuda")]
pub mod nvlink;
