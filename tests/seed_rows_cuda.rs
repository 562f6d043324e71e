//! Seed rows of the CUDA transports (see docs/seed-traceability.md), each
//! through the CPU stand-in for the CUDA driver (`tests/fakecuda/`), which
//! fills new allocations with garbage, enforces access grants for devices
//! and the CPU, poisons a context on a sticky error and gives a failed batch
//! copy its partial effect. Each test is written so that deleting the line
//! it guards (named in its comment and in the traceability document) turns
//! it red. Cases run as child processes (`tests/fakecuda_harness`): the
//! child is the requester (or, for M10, the source), with its own
//! `FAKECUDA_*` settings; sources are `orbite-gpu-qual` processes.
#![cfg(feature = "cuda")]

mod common;
mod fakecuda;
mod fakecuda_harness;

use fakecuda_harness::*;
use orbite::cuda::memory::{device_to_host, host_to_device};
use orbite::*;
use std::time::Duration;

/// The stand-in's fill of new allocations.
const GARBAGE: u8 = 0xdb;

fn bytes_at(addr: u64, len: u64) -> Vec<u8> {
    let mut host = vec![0u8; len as usize];
    device_to_host(&mut host, addr).unwrap();
    host
}

/// P8: `allocate_ipc` zeroes its whole physical extent (2 MiB rounding),
/// while the stand-in, like the driver, hands out garbage: a plain
/// allocation shows it. Guards `cuda/memory.rs` `alloc_device`'s
/// `cuMemsetD8` (and its `cuCtxSynchronize`).
fn zeroed_ipc() {
    let len = 3 * MIB + 17;
    let plain = CudaMemory::allocate(0, len).unwrap();
    assert!(bytes_at(plain.addr(), len).iter().all(|b| *b == GARBAGE), "the stand-in zeroed memory by itself");
    let a = CudaMemory::allocate_ipc(0, len).unwrap();
    assert_eq!(a.len(), len, "the logical length stays as requested");
    let physical = bytes_at(a.addr(), 4 * MIB);
    assert_eq!(physical.iter().position(|b| *b != 0), None, "allocate_ipc left a nonzero byte");
}

/// N4: a native batch copy refused at enqueue: the stand-in has enqueued
/// the first half of the descriptors (as a driver may), the library drains
/// the stream, fails every request and replays nothing: the first two
/// slices hold the source's bytes, the last two keep their old value, and
/// no ordered copy follows (the parent checks the trace). Guards
/// `cuda_mapping.rs` `async_copy`'s error path (drain, no replay).
fn batch_prefix() {
    let (_src, a) = nvlink_source(None);
    let r = Req::new(NVLINK, &_src.endpoint, TransportKind::Nvlink);
    host_to_device(r.l(0), &vec![0x11u8; SIZE as usize]).unwrap();
    let group: Vec<Request> = (0..4).map(|k| rd(r.l(0) + k * MIB, a + k * MIB, MIB)).collect();
    assert_eq!(r.go(&group), vec![res(Status::CudaError, RemoteEffect::None); 4]);
    assert!(r.holds(0, 0, 2 * MIB, 1, 0), "the enqueued prefix ran (the stream was drained)");
    assert!(bytes_at(r.l(0) + 2 * MIB, 2 * MIB).iter().all(|b| *b == 0x11), "a descriptor was replayed");
    let st = r.ipc();
    assert_eq!((st.imports_opened, st.imports_closed, st.imports_retained), (1, 1, 0), "{st:?}");
}

/// E3 under a sticky driver error: the first completion query fails with
/// 700 (ILLEGAL_ADDRESS), which poisons device 0's context. The group is
/// Unquiesced and retained with its stream quarantined; every later use of
/// the context fails with a typed CUDA error, never a hang or a panic.
/// Guards `cuda_mapping.rs` `Mapping::query`'s failure arm.
fn sticky_error() {
    let (mut src, a) = nvlink_source(None);
    let r = Req::new(NVLINK, &src.endpoint, TransportKind::Nvlink);
    assert_eq!(r.go(&[rd(r.l(0), a, SIZE)]), vec![res(Status::Unquiesced, RemoteEffect::None)]);
    assert_eq!(r.ipc().imports_retained, 1);
    assert_eq!(r.e.stats().nvlink.retained_streams, 1);
    assert_eq!(src.ipc("nvlink", "exports_open"), 1);
    // The retained export keeps the allocation loaned: a new group waits
    // for it within its deadline, and is refused.
    let later = r.go_within(&[rd(r.l(1), a, 4096)], Duration::from_millis(300));
    assert_eq!(later[0].status, Status::Unavailable, "{later:?}");
    let e = CudaMemory::allocate(0, MIB).expect_err("the poisoned context refuses allocations");
    assert_eq!(e.status(), Status::CudaError, "{e}");
    assert!(e.message().contains("ILLEGAL_ADDRESS"), "{e}");
}

/// B2: the NVLink mapping copies a dependent group (overlapping local
/// destinations) in input order; an independent group goes to one native
/// batch, which the stand-in runs last to first. The overlap holds the
/// second READ's bytes only if the plan was followed. Guards
/// M10 (source side): the source hands a producer stream over for its
/// export (ten slow copies, then the pattern); a requester process READs
/// as soon as it is served. Guards `transport/nvlink.rs` `export`'s
/// P4 (pinned host variant): a producer still writing local pinned memory
/// is handed over with `record_pinned_host_producer_stream`; the WRITE
/// waits for it and the source receives the new bytes. Guards
/// M4: EGM needs the opt-in of both peers. A source whose engine did not
/// opt in serves nothing of its EGM memory: the requester (opted in) is
/// refused before anything is posted (guards `engine/submit.rs` `select`'s
/// `egm_both`, the peer's capability), and a hand-made MNNVL export request
/// for that memory is refused by the source itself (guards
/// M13 and M11 (local side): `free_mnnvl` and `free_egm` release the VMM
/// mapping, handle and range (the parent checks the trace and the live
/// report); a failed release is Unquiesced and hands the allocation back.
/// M11 (import side): a failed cuMemRelease or cuMemAddressFree while
/// closing an MNNVL import is Unquiesced: no close receipt, the import and
/// its charge retained, the source's export kept. Guards
/// F4: single copies at or above `nvlink_async_memcpy_threshold_kb` and
/// groups of two copies take the stream/event path; a threshold of 0
/// disables the synchronous path (the parent counts the driver calls).
/// F3: a failed drain, or a failed restoration of the caller's context,
/// after a synchronous copy into pinned host memory keeps everything: the
/// import and its charge, the source's export, and the loan of the local
/// pinned allocation (fenced: TCP and free refused). Guards
/// N1: with a driver older than 13000 the v2 batch symbol is never called,
/// even when the library exports it; an independent group goes through
/// ordered copies (the parent checks the trace). Guards `cuda/driver.rs`
/// Runs in a child process; does nothing when run directly.
#[test]
fn child_case() {
    let Ok(case) = std::env::var("ORBITE_FAKECUDA_CASE") else { return };
    if let Some(why) = orbite::cuda::unavailable_reason() {
        panic!("the stand-in did not load: {why}");
    }
    match case.as_str() {
        "zeroed-ipc" => zeroed_ipc(),
        "batch-prefix" => batch_prefix(),
        "sticky" => sticky_error(),
        other => panic!("unknown case {other}"),
    }
    println!("child case passed");
}

#[test]
fn p8_allocate_ipc_zeroes_what_the_driver_hands_out_dirty() {
    run("zeroed-ipc", &[]);
}

#[test]
fn n4_a_failed_batch_keeps_its_enqueued_prefix_and_replays_nothing() {
    let t = run_traced("batch-prefix", &[("FAKECUDA_FAIL", "cuMemcpyBatchAsync_v2:1:1")]);
    assert_eq!(fakecuda::calls(&t, "cuMemcpyBatchAsync_v2"), 1, "{t:?}");
    assert_eq!(fakecuda::calls(&t, "cuMemcpyAsync"), 0, "an ordered replay followed the failed batch: {t:?}");
    assert_eq!(fakecuda::calls(&t, "cuStreamSynchronize"), 1, "{t:?}");
}

#[test]
fn e3_a_sticky_error_poisons_the_context_and_every_later_use_fails_typed() {
    run("sticky", &[("FAKECUDA_FAIL", "cuEventQuery:1:700")]);
}
