//! The C ABI of liborbite (`include/orbite.h`, contract in `C-API.md`).
//!
//! Conventions, for every function here: literal `extern "C" fn`
//! signatures; the panic boundary (`catch_unwind`) inside each body; a
//! status return; out-parameters written only on `ORBITE_STATUS_OK`; NULL
//! checks; enum inputs validated; `*_free(NULL)` a no-op. No engine logic
//! lives in this module.

#![allow(non_camel_case_types)]
#![allow(clippy::missing_safety_doc)]
// The C contract (C-API.md) states what each pointer must be; these
// functions are the boundary where that contract is taken on, so they are
// safe `extern "C" fn`s that check for NULL and document the rest.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

pub(crate) mod boundary;
pub mod cuda;
pub mod engine;
pub(crate) mod handles;
pub mod log;
pub mod memory;
pub mod notify;
pub mod transfer;
pub mod types;

pub use types::*;
