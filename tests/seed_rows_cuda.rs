//! Seed rows of the CUDA transports (see docs/seed-traceability.md), each
//! through the CPU stand-in for the CUDA driver (`tests/fakecuda/`), which
//! fills new allocations with garbage, enforces access grants for devices
//! and the CPU, poisons the process on a sticky error and gives a failed batch
//! copy its partial effect. Each test is written so that deleting the line
//! it guards (named in its comment and in the traceability document) turns
//! it red. Cases run as child processes (`tests/fakecuda_harness`): the
//! child is the requester (or, for M10, the source), with its own
//! `FAKECUDA_*` settings; sources are `orbite-gpu-qual` processes.
#![cfg(feature = "cuda")]

mod common;
mod fakecuda;
mod fakecuda_harness;

use common::pattern_vec;
use cudarc::driver::sys::{self, CUresult};
use fakecuda_harness::*;
use orbite::cuda::driver::{primary_context, ContextGuard};
use orbite::cuda::raw::{device_to_host, host_to_device};
use orbite::*;
use std::time::Duration;

/// The stand-in's fill of new allocations.
const GARBAGE: u8 = 0xdb;

fn only(t: TransportKind) -> SubmitOptions {
    SubmitOptions { transport: Transport::Only(t), timeout: Some(Duration::from_secs(60)) }
}

fn bytes_at(addr: u64, len: u64) -> Vec<u8> {
    let mut host = vec![0u8; len as usize];
    device_to_host(&mut host, addr).unwrap();
    host
}

/// A stream of device 0's primary context on which `copies` slow one-byte
/// host copies run first, then `[dst, dst+len)` receives `src`: a producer
/// still writing when the transfer is submitted.
fn slow_producer(dst: u64, src: &[u8], scratch: &mut [u8], copies: usize) -> u64 {
    let g = ContextGuard::bind(primary_context(0).unwrap()).unwrap();
    let mut stream: sys::CUstream = std::ptr::null_mut();
    // SAFETY: a context is current; creates one non-blocking stream.
    assert_eq!(unsafe { sys::cuStreamCreate(&mut stream, 1) }, CUresult::CUDA_SUCCESS);
    for _ in 0..copies {
        // SAFETY: one byte between host buffers that outlive the stream's
        // work (the caller keeps them until the transfer consumed it).
        let q = unsafe { sys::cuMemcpyAsync(scratch.as_mut_ptr() as u64, src.as_ptr() as u64, 1, stream) };
        assert_eq!(q, CUresult::CUDA_SUCCESS);
    }
    // SAFETY: dst holds src.len() bytes of library memory; src outlives the copy.
    let q = unsafe { sys::cuMemcpyAsync(dst, src.as_ptr() as u64, src.len(), stream) };
    assert_eq!(q, CUresult::CUDA_SUCCESS);
    g.restore().unwrap();
    stream as u64
}

/// P8: `allocate_ipc` zeroes its whole physical extent (2 MiB rounding),
/// while the stand-in, like the driver, hands out garbage: a plain
/// allocation shows it. Guards `cuda/raw.rs` `alloc_device`'s
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
    // Four contiguous READs would move as one copy: without coalescing
    // they are four batch entries, of which the stand-in enqueues two.
    let r = Req::new(r#"{"nvlink": true, "coalesce": false}"#, &_src.endpoint, TransportKind::Nvlink);
    host_to_device(r.l(0), &vec![0x11u8; SIZE as usize]).unwrap();
    let group: Vec<Request> = (0..4).map(|k| rd(r.l(0) + k * MIB, a + k * MIB, MIB)).collect();
    assert_eq!(r.go(&group), vec![res(Status::CudaError, RemoteEffect::None); 4]);
    assert!(r.holds(0, 0, 2 * MIB, 1, 0), "the enqueued prefix ran (the stream was drained)");
    assert!(bytes_at(r.l(0) + 2 * MIB, 2 * MIB).iter().all(|b| *b == 0x11), "a descriptor was replayed");
    let st = r.ipc();
    assert_eq!((st.imports.opened, st.imports.closed, st.imports.retained), (1, 1, 0), "{st:?}");
}

/// E3 under a sticky driver error: the first completion query fails with
/// 700 (ILLEGAL_ADDRESS), which poisons the process's CUDA (every context,
/// as the driver's reference says). The group is Unquiesced and retained
/// with its stream quarantined. Every later CUDA group is refused before
/// anything is posted (UNAVAILABLE, effect None; it used to reach the
/// driver and fail with its error), the stats say the transport failed and
/// that the process must be restarted, and the engine still serves TCP
/// with exact bytes. Guards `cuda_mapping.rs` `Mapping::query`'s failure
/// arm, `driver::check`'s recording of a sticky error and
/// `IpcRequester::run_group`'s `backend.usable()` gate.
fn sticky_error() {
    let (mut src, a) = nvlink_source(None);
    let r = Req::new(NVLINK, &src.endpoint, TransportKind::Nvlink);
    assert_eq!(r.go(&[rd(r.l(0), a, SIZE)]), vec![res(Status::Unquiesced, RemoteEffect::None)]);
    assert_eq!(r.ipc().imports.retained, 1);
    assert_eq!(r.e.stats().nvlink.retained_streams, 1);
    assert_eq!(src.ipc("nvlink", "exports_open"), 1);
    let opened = r.ipc().imports.opened;
    let later = r.go_within(&[rd(r.l(1), a, 4096)], Duration::from_secs(60));
    assert_eq!(later, vec![res(Status::Unavailable, RemoteEffect::None)], "refused before posting");
    assert_eq!(r.ipc().imports.opened, opened, "the refused group opened an import");
    // AUTO as well: NVLink is the only transport for this memory, so the
    // READ is refused UNAVAILABLE before posting, naming the failure.
    let auto = SubmitOptions { transport: Transport::Auto, timeout: Some(Duration::from_secs(60)) };
    let b = r.e.submit(r.peer, &[rd(r.l(1), a, 4096)], auto).unwrap();
    let err = b.wait(Duration::from_secs(60)).unwrap_err();
    assert!(err.message().contains("ILLEGAL_ADDRESS"), "{err}");
    assert_eq!(b.results(), vec![res(Status::Unavailable, RemoteEffect::None)]);
    assert_eq!(r.ipc().imports.opened, opened, "the AUTO group opened an import");
    assert_eq!(r.e.stats().transports["tcp"].requests_completed, 0, "GPU memory went over TCP");
    let avail = &r.e.stats().transports_available["nvlink"];
    assert!(avail.starts_with("failed: ") && avail.contains("ILLEGAL_ADDRESS") && avail.contains("restart"), "{avail}");
    let e = CudaMemory::allocate(0, MIB).expect_err("the poisoned process refuses allocations");
    assert_eq!(e.status(), Status::CudaError, "{e}");
    assert!(e.message().contains("ILLEGAL_ADDRESS"), "{e}");
    let e = CudaMemory::allocate(1, MIB).expect_err("another GPU's context is lost with the process");
    assert!(e.message().contains("ILLEGAL_ADDRESS"), "{e}");
    // TCP is untouched: another engine READs this one's host memory.
    let data = pattern_vec(7, 8192);
    r.e.register_memory(data.as_ptr() as u64, 8192, Access::READ).unwrap();
    let other = Engine::from_json("{}").unwrap();
    let got = vec![0u8; 8192];
    other.register_memory(got.as_ptr() as u64, 8192, Access::NONE).unwrap();
    let peer = other.connect(&r.e.endpoint(), None).unwrap();
    let read = Request { op: Op::Read, local_addr: got.as_ptr() as u64, remote_addr: data.as_ptr() as u64, len: 8192 };
    let b = other.submit(peer, &[read], only(TransportKind::Tcp)).unwrap();
    b.wait(Duration::from_secs(60)).unwrap();
    assert_eq!(b.results(), vec![res(Status::Ok, RemoteEffect::None)]);
    assert_eq!(got, data, "bytes over TCP from the poisoned process");
}

/// E3 as on a GPU: a copy from reserved but unmapped device memory is
/// enqueued without complaint (the driver checks no access rule at
/// enqueue); the fault surfaces at the next synchronisation as 700 and
/// poisons the process. The engine's next NVLink group meets the dead
/// driver and fails typed with no remote effect, never Ok; every group
/// after it is refused before posting (UNAVAILABLE). Guards the stand-in's
/// asynchronous fault (tests/fakecuda/README.md) and, through it, that a
/// poisoned driver found by any call, not only by a completion query,
/// fails the CUDA transports.
fn asynchronous_fault() {
    let (_src, a) = nvlink_source(None);
    let r = Req::new(NVLINK, &_src.endpoint, TransportKind::Nvlink);
    assert_eq!(r.go(&[rd(r.l(0), a, 4096)]), vec![res(Status::Ok, RemoteEffect::None)]);
    let g = ContextGuard::bind(primary_context(0).unwrap()).unwrap();
    let (mut stream, mut hole): (sys::CUstream, sys::CUdeviceptr) = (std::ptr::null_mut(), 0);
    // SAFETY: a context is current; creates one non-blocking stream.
    assert_eq!(unsafe { sys::cuStreamCreate(&mut stream, 1) }, CUresult::CUDA_SUCCESS);
    // SAFETY: reserves 2 MiB of address space, mapping nothing.
    assert_eq!(unsafe { sys::cuMemAddressReserve(&mut hole, 2 * MIB as usize, 0, 0, 0) }, CUresult::CUDA_SUCCESS);
    // SAFETY: a copy into library memory from the unmapped reservation:
    // the fault this test wants, on the stand-in only.
    let q = unsafe { sys::cuMemcpyAsync(r.l(1), hole, 4096, stream) };
    assert_eq!(q, CUresult::CUDA_SUCCESS, "the enqueue of a faulting copy succeeds, as on a GPU");
    // SAFETY: our stream, in the bound context.
    assert_eq!(unsafe { sys::cuStreamSynchronize(stream) }, CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
    let _ = g.restore();
    assert!(bytes_at_or_err(r.l(1)).is_err(), "the poisoned process still copied");
    let next = r.go(&[rd(r.l(0), a, 4096)]);
    assert_eq!((next[0].status == Status::Ok, next[0].remote_effect), (false, RemoteEffect::None), "{next:?}");
    assert_eq!(r.go(&[rd(r.l(0), a, 4096)]), vec![res(Status::Unavailable, RemoteEffect::None)]);
}

/// Posts a READ of a whole source allocation over NVLink, then kills the
/// source and reaps it (submit returns once the group's copy is enqueued;
/// the stand-in holds the copy `FAKECUDA_COPY_DELAY_US`); the requester
/// and the READ's results.
fn read_as_the_source_dies() -> (Req, Vec<RequestResult>) {
    let (src, a) = nvlink_source(None);
    let r = Req::new(NVLINK, &src.endpoint, TransportKind::Nvlink);
    let b = r.e.submit(r.peer, &[rd(r.l(0), a, SIZE)], only(TransportKind::Nvlink)).unwrap();
    drop(src);
    b.wait(Duration::from_secs(120)).ok();
    let out = b.results();
    (r, out)
}

/// A source that dies while a READ from its memory is posted: on a GPU
/// the import's memory is freed under it and the copy faults (the stand-in
/// holds each copy 3 s, then finds the exporter gone). The READ is never
/// reported Ok: UNQUIESCED with no remote effect, as for any fault, and
/// the process's CUDA is lost with it (its next group is refused). Guards
/// the stand-in's dead-exporter rule; before it, the copy moved the dead
/// exporter's stale bytes and the READ ended Ok.
fn dead_exporter() {
    let (r, out) = read_as_the_source_dies();
    assert_eq!(out, vec![res(Status::Unquiesced, RemoteEffect::None)]);
    let avail = &r.e.stats().transports_available["nvlink"];
    assert!(avail.starts_with("failed: "), "{avail}");
}

/// The same death where the driver happens not to fault
/// (`FAKECUDA_DEAD_EXPORTER=stale`: the freed memory's stale bytes move
/// and the copy reports success). The engine still never reports the READ
/// Ok: the source provably exited before the completion was seen, so
/// what moved is undefined (UNAVAILABLE, effect None), and the process's
/// CUDA stays usable. Guards `IpcRequester::finish`'s dead-exporter check
/// (`import_outlives_exporter` false for NVLink).
fn dead_exporter_without_a_fault() {
    let (r, out) = read_as_the_source_dies();
    assert_eq!(out, vec![res(Status::Unavailable, RemoteEffect::None)]);
    assert_eq!(r.e.stats().transports_available["nvlink"], "available");
}

/// An asynchronous host-to-device copy of 4096 bytes of `src` on a fresh
/// stream of device 0's context, the stream held at a gate (a device word
/// that must reach 1) when `gated`: `src` is filled with 1 before the
/// call and with 2 after it returns, then the gate opens. The byte that
/// landed says when the copy read `src`: 1 at the call, 2 when it ran.
fn byte_the_copy_read(src: &mut [u8], gated: bool) -> u8 {
    let dst = CudaMemory::allocate(0, 4096).unwrap();
    let gate = CudaMemory::allocate(0, 4096).unwrap();
    host_to_device(gate.addr(), &[0u8; 4]).unwrap();
    src.fill(1);
    let g = ContextGuard::bind(primary_context(0).unwrap()).unwrap();
    let mut stream: sys::CUstream = std::ptr::null_mut();
    // SAFETY: a context is current; creates one non-blocking stream.
    assert_eq!(unsafe { sys::cuStreamCreate(&mut stream, 1) }, CUresult::CUDA_SUCCESS);
    if gated {
        // SAFETY: `gate` is 4 aligned bytes of device memory kept past the sync.
        assert_eq!(unsafe { sys::cuStreamWaitValue32_v2(stream, gate.addr(), 1, 0) }, CUresult::CUDA_SUCCESS);
    }
    // SAFETY: dst holds 4096 bytes; src outlives the synchronisation below.
    let q = unsafe { sys::cuMemcpyAsync(dst.addr(), src.as_ptr() as u64, 4096, stream) };
    assert_eq!(q, CUresult::CUDA_SUCCESS);
    src.fill(2);
    host_to_device(gate.addr(), &1u32.to_ne_bytes()).unwrap();
    // SAFETY: our stream, in the bound context.
    assert_eq!(unsafe { sys::cuStreamSynchronize(stream) }, CUresult::CUDA_SUCCESS);
    g.restore().unwrap();
    bytes_at(dst.addr(), 1)[0]
}

/// `len` bytes registered with `cuMemHostRegister` in device 1's context,
/// with `flags`.
fn registered_in_device_1(len: usize, flags: u32) -> Vec<u8> {
    let v = vec![0u8; len];
    let g = ContextGuard::bind(primary_context(1).unwrap()).unwrap();
    // SAFETY: `v` is `len` bytes that stay allocated (the process exits
    // with them registered).
    let r = unsafe { sys::cuMemHostRegister_v2(v.as_ptr() as *mut _, len, flags) };
    assert_eq!(r, CUresult::CUDA_SUCCESS);
    g.restore().unwrap();
    v
}

/// The driver's "API synchronization behavior" for host memory: from
/// pageable memory an asynchronous copy synchronises the stream and
/// stages the bytes at the call, so later writes of the buffer never
/// reach it; from pinned memory it reads them when it runs. Memory
/// registered without `PORTABLE` is pinned only for the context that
/// registered it. Guards the stand-in's pageable staging and registration
/// flags (tests/fakecuda/README.md), which the producer-stream tests now
/// meet with pinned buffers (a pageable producer behind a gate would
/// block its own caller, on a GPU as here).
fn pageable_staging_and_registration_flags() {
    assert_eq!(byte_the_copy_read(&mut [0u8; 4096], false), 1, "pageable: staged at the call");
    assert_eq!(byte_the_copy_read(&mut pinned_copy(&[0u8; 4096]), true), 2, "pinned: read when it ran");
    let mut private = registered_in_device_1(4096, 0);
    assert_eq!(byte_the_copy_read(&mut private, false), 1, "registered for device 1 only: pageable for device 0");
    let mut portable = registered_in_device_1(4096, sys::CU_MEMHOSTREGISTER_PORTABLE);
    assert_eq!(byte_the_copy_read(&mut portable, true), 2, "registered PORTABLE: pinned for every context");
}

/// Reads 16 bytes of device memory back, or the driver's error.
fn bytes_at_or_err(addr: u64) -> Result<Vec<u8>> {
    let mut host = vec![0u8; 16];
    device_to_host(&mut host, addr).map(|_| host)
}

/// E3 at the source: its first cuIpcGetMemHandle fails with 700. That
/// request gets the driver's error; the next export is refused before the
/// driver is asked (UNAVAILABLE, naming the restart) rather than failing
/// again inside it. Guards `ExportTable::offer`'s `backend.usable()`.
fn sticky_error_at_the_source() {
    let (_src, a) = nvlink_source(Some("cuIpcGetMemHandle:1:700"));
    let r = Req::new(NVLINK, &_src.endpoint, TransportKind::Nvlink);
    assert_eq!(r.go(&[rd(r.l(0), a, SIZE)]), vec![res(Status::CudaError, RemoteEffect::None)]);
    assert_eq!(r.go(&[rd(r.l(0), a, SIZE)]), vec![res(Status::Unavailable, RemoteEffect::None)]);
}

/// B2: the NVLink mapping copies a dependent group (overlapping local
/// destinations) in input order; an independent group goes to one native
/// batch, which the stand-in runs last to first. The overlap holds the
/// second READ's bytes only if the plan was followed. Guards
/// `cuda_mapping.rs` `async_copy`'s `CopyBatch::build(ops, plan)`.
fn nvlink_plan() {
    let src = Source::start(NVLINK, "ipc", 2, None);
    let (a, b) = (src.addrs[0], src.addrs[1]);
    let r = Req::new(NVLINK, &src.endpoint, TransportKind::Nvlink);
    let dependent = [rd(r.l(0), a, 2 * MIB), rd(r.l(0) + MIB, a + 2 * MIB + 8192, MIB)];
    assert_eq!(r.go(&dependent), vec![res(Status::Ok, RemoteEffect::None); 2]);
    assert!(r.holds(0, 0, MIB, 1, 0));
    assert!(r.holds(0, MIB, MIB, 1, 2 * MIB + 8192), "the overlap does not hold the later READ's bytes");
    let independent = [rd(r.l(1), b, MIB), rd(r.l(1) + MIB, b + 3 * MIB, MIB)];
    assert_eq!(r.go(&independent), vec![res(Status::Ok, RemoteEffect::None); 2]);
    assert!(r.holds(1, 0, MIB, 2, 0) && r.holds(1, MIB, MIB, 2, 3 * MIB));
}

/// Issue 34: block requests in three runs contiguous on both sides (4, 1
/// and 3 blocks of 64 KiB, the runs scattered) move as one native copy
/// per run, over NVLink and over MNNVL, each request Ok with its own
/// bytes. Guards `coalesce::runs` in `IpcRequester::post` on the CUDA
/// paths (without it: 8 batch entries per transport).
fn contiguous_runs_on_the_cuda_paths() {
    const B: u64 = 64 << 10;
    let runs = [(10u64, 40u64, 4u64), (2, 7, 1), (30, 20, 3)];
    for (cfg, kind, t) in [(NVLINK, "ipc", TransportKind::Nvlink), (MNNVL_FD, "mnnvl", TransportKind::Mnnvl)] {
        let src = Source::start(cfg, kind, 1, None);
        let a = src.addrs[0];
        let r = Req::new(cfg, &src.endpoint, t);
        let reqs: Vec<Request> = runs
            .iter()
            .flat_map(|&(l, rm, n)| (0..n).map(move |k| (l + k, rm + k)))
            .map(|(l, rm)| rd(r.l(0) + l * B, a + rm * B, B))
            .collect();
        assert_eq!(r.go(&reqs), vec![res(Status::Ok, RemoteEffect::None); 8], "{t:?}");
        for &(l, rm, n) in &runs {
            assert!(r.holds(0, l * B, n * B, 1, rm * B), "{t:?}: run at local block {l}");
        }
        let st = r.ipc();
        assert_eq!((st.imports.copies_issued, st.imports.requests_coalesced), (3, 5), "{t:?}: {st:?}");
        assert_eq!(st.copies_by_device[&0].copies, 3, "{t:?}: {st:?}");
    }
}

/// Issue 34, a fault in the middle of coalesced runs: eight WRITEs in three
/// runs move as three batch entries; the driver fails the batch after
/// enqueuing its first entry (the stand-in enqueues half). Every WRITE
/// ends CUDA_ERROR with effect Unknown, and that is the truth: the first
/// run's bytes landed at the source, the second's did not. Guards
/// `fail_all`'s per-request effect on a coalesced group (a run's requests
/// each get the group's outcome, none is lost or reported clean).
fn a_failed_coalesced_batch() {
    const B: u64 = 64 << 10;
    let (mut src, a) = nvlink_source(None);
    let r = Req::new(NVLINK, &src.endpoint, TransportKind::Nvlink);
    // Local blocks 0..8 in order, one pattern per run; remote runs at
    // blocks 8, 20 and 30.
    let runs = [(0u64, 8u64, 4u64), (4, 20, 1), (5, 30, 3)];
    for (seed, &(l, _, n)) in (77u64..).zip(&runs) {
        host_to_device(r.l(0) + l * B, &pattern_vec(seed, (n * B) as usize)).unwrap();
    }
    let reqs: Vec<Request> = runs
        .iter()
        .flat_map(|&(l, rm, n)| (0..n).map(move |k| (l + k, rm + k)))
        .map(|(l, rm)| wr(r.l(0) + l * B, a + rm * B, B))
        .collect();
    assert_eq!(r.go(&reqs), vec![res(Status::CudaError, RemoteEffect::Unknown); 8]);
    let st = r.ipc();
    assert_eq!((st.imports.copies_issued, st.imports.requests_coalesced), (3, 5), "{st:?}");
    // The enqueued prefix (the first run) ran; the second run never did.
    assert_eq!(src.cmd(&format!("verify 0 77 {} {}", 8 * B, 4 * B)), "ok");
    assert_ne!(src.cmd(&format!("verify 0 78 {} {}", 20 * B, B)), "ok");
}

/// Issue 34: an independent submission naming two remote regions (two
/// subbatches) returns with both still copying: the first is not waited
/// for before the second is posted. The stand-in delays each copy by a
/// second, so both are pending when `submit` returns, then both end Ok.
/// Guards `transport/ipc/executor.rs` `IpcExecutor::run`'s `any_order` (without it the
/// first subbatch is complete, Ok, when `submit` returns).
fn independent_subbatches_post_ahead() {
    let src = Source::start(NVLINK, "ipc", 2, None);
    let (a, b) = (src.addrs[0], src.addrs[1]);
    let r = Req::new(NVLINK, &src.endpoint, TransportKind::Nvlink);
    let reqs = [rd(r.l(0), a, SIZE), rd(r.l(1), b, SIZE)];
    let batch = r.e.submit(r.peer, &reqs, only(TransportKind::Nvlink)).unwrap();
    let statuses: Vec<Status> = batch.results().iter().map(|x| x.status).collect();
    assert_eq!(statuses, vec![Status::Pending; 2]);
    batch.wait(Duration::from_secs(60)).unwrap();
    assert_eq!(batch.results(), vec![res(Status::Ok, RemoteEffect::None); 2]);
    assert!(r.holds(0, 0, SIZE, 1, 0) && r.holds(1, 0, SIZE, 2, 0));
}

/// M10 (source side): the source hands a producer stream over for its
/// export (ten slow copies, then the pattern); a requester process READs
/// as soon as it is served. Guards `transport/ipc/backends/nvlink.rs` `export`'s
/// `consume_producer(base)`: without it the requester reads zeros.
fn producer_at_the_source() {
    let e = Engine::from_json(NVLINK).unwrap();
    let a = CudaMemory::allocate_ipc(0, SIZE).unwrap();
    let region = e.register_memory(a.addr(), SIZE, Access::READ_WRITE).unwrap();
    let fresh = pinned_copy(&pattern_vec(1, SIZE as usize));
    let mut scratch = pinned_copy(&[0u8]);
    let stream = slow_producer(a.addr(), &fresh, &mut scratch, 30);
    e.record_producer_stream(region, stream).unwrap();
    let mut c = fakecuda::command(env!("CARGO_BIN_EXE_orbite-gpu-qual"), fakecuda::Variant::Full);
    let out = c
        .args(["requester", "--endpoint", &e.endpoint(), "--mode", "healthy", "--memory", "device"])
        .args(["--remote", &a.addr().to_string(), "--len", &SIZE.to_string(), "--seed", "1"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("PASS healthy"), "{text}");
    e.close(Some(Duration::from_secs(60))).unwrap();
    assert_eq!(scratch[0], fresh[0]);
}

/// A stream of device 0's primary context held at a gate (a word of
/// device memory at `gate` that must reach 1: `cuStreamWaitValue32_v2`),
/// then `[dst, dst+len)` receives `src`: a producer that ends exactly
/// when the test opens the gate.
fn gated_producer(dst: u64, src: &[u8], gate: u64) -> u64 {
    let g = ContextGuard::bind(primary_context(0).unwrap()).unwrap();
    let mut stream: sys::CUstream = std::ptr::null_mut();
    // SAFETY: a context is current; creates one non-blocking stream.
    assert_eq!(unsafe { sys::cuStreamCreate(&mut stream, 1) }, CUresult::CUDA_SUCCESS);
    // SAFETY: `gate` is 4 aligned bytes of device memory the caller keeps
    // until the stream passed it.
    assert_eq!(unsafe { sys::cuStreamWaitValue32_v2(stream, gate, 1, 0) }, CUresult::CUDA_SUCCESS);
    // SAFETY: dst holds src.len() bytes of library memory; src outlives the copy.
    let q = unsafe { sys::cuMemcpyAsync(dst, src.as_ptr() as u64, src.len(), stream) };
    assert_eq!(q, CUresult::CUDA_SUCCESS);
    g.restore().unwrap();
    stream as u64
}

/// A producer wait never holds an I/O thread (issue 30). The source (this
/// child, one I/O thread) hands over a producer stream held at a gate it
/// opens itself; an NVLink requester process asks for the allocation, and
/// its accepted offer waits for the stream on a thread of its own. Gate
/// still closed, a TCP peer served by the same (only) I/O thread READs a
/// whole MiB in 256 requests, every byte checked, while the NVLink
/// requester is still waiting; once the gate opens it reads the
/// producer's bytes. Guards `ipc/source.rs` `answer`'s
/// `answer_waits(..) && answer_later(..)`: answered inline, the I/O thread
/// sits in `cuEventSynchronize` and no TCP READ is served.
fn producer_wait_off_the_io_thread() {
    let e = Engine::from_json(r#"{"nvlink": true, "io_threads": 1}"#).unwrap();
    let a = CudaMemory::allocate_ipc(0, SIZE).unwrap();
    let region = e.register_memory(a.addr(), SIZE, Access::READ_WRITE).unwrap();
    let host = pattern_vec(2, MIB as usize);
    e.register_memory(host.as_ptr() as u64, MIB, Access::READ).unwrap();
    let gate = CudaMemory::allocate(0, 4096).unwrap();
    host_to_device(gate.addr(), &[0u8; 4]).unwrap();
    let fresh = pinned_copy(&pattern_vec(1, SIZE as usize));
    let stream = gated_producer(a.addr(), &fresh, gate.addr());
    e.record_producer_stream(region, stream).unwrap();
    let mut c = fakecuda::command(env!("CARGO_BIN_EXE_orbite-gpu-qual"), fakecuda::Variant::Full);
    let child = c
        .args(["requester", "--endpoint", &e.endpoint(), "--mode", "healthy", "--memory", "device"])
        .args(["--remote", &a.addr().to_string(), "--len", &SIZE.to_string(), "--seed", "1"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    common::eventually("the accepted offer waits for the producer", || {
        e.stats().ipc["nvlink"].exports.answered_after_producer_wait == 1
    });
    let peer = Engine::from_json("{}").unwrap();
    let id = peer.connect(&e.endpoint(), None).unwrap();
    let mut local = vec![0u8; MIB as usize];
    peer.register_memory(local.as_mut_ptr() as u64, MIB, Access::READ_WRITE).unwrap();
    let opts = SubmitOptions { transport: Transport::Only(TransportKind::Tcp), timeout: Some(Duration::from_secs(30)) };
    for k in 0..256u64 {
        let r = rd(local.as_mut_ptr() as u64 + k * 4096, host.as_ptr() as u64 + k * 4096, 4096);
        let b = peer.submit(id, &[r], opts).unwrap();
        b.wait(Duration::from_secs(60)).unwrap_or_else(|err| panic!("READ {k} with the producer waiting: {err}"));
    }
    assert!(local == host, "the TCP peer's bytes differ");
    let mut child = child;
    assert!(child.try_wait().unwrap().is_none(), "the NVLink requester was served with the gate closed");
    host_to_device(gate.addr(), &1u32.to_le_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("PASS healthy"), "{text}");
    peer.close(Some(Duration::from_secs(30))).unwrap();
    e.close(Some(Duration::from_secs(60))).unwrap();
}

/// M10 for MNNVL memory: a producer still writing the source's MNNVL
/// allocation is handed over with `record_producer_stream` (once refused
/// for anything but CUDA and pinned memory); the grant waits for it, and
/// the requester reads the new bytes. Guards `memory/cuda.rs`
/// `record_producer`'s MNNVL arm and `mnnvl.rs` `export`'s
/// `consume_producer(base)`.
fn producer_at_an_mnnvl_source() {
    let e = Engine::from_json(MNNVL_FD).unwrap();
    let a = allocate_mnnvl(0, SIZE).unwrap();
    let region = e.register_memory(a.addr(), SIZE, Access::READ_WRITE).unwrap();
    let fresh = pinned_copy(&pattern_vec(1, SIZE as usize));
    let mut scratch = pinned_copy(&[0u8]);
    let stream = slow_producer(a.addr(), &fresh, &mut scratch, 30);
    e.record_producer_stream(region, stream).unwrap();
    let mut c = fakecuda::command(env!("CARGO_BIN_EXE_orbite-gpu-qual"), fakecuda::Variant::Full);
    let out = c
        .args(["requester", "--endpoint", &e.endpoint(), "--mode", "healthy", "--memory", "device"])
        .args(["--transport", "mnnvl", "--handle", "posix_fd"])
        .args(["--remote", &a.addr().to_string(), "--len", &SIZE.to_string(), "--seed", "1"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("PASS healthy"), "{text}");
    e.close(Some(Duration::from_secs(60))).unwrap();
    assert_eq!(scratch[0], fresh[0]);
}

/// P4 (pinned host variant): a producer still writing local pinned memory
/// is handed over with `record_pinned_host_producer_stream`; the WRITE
/// waits for it and the source receives the new bytes. Guards
/// `cuda_mapping.rs` `copy`'s `consume_producer(o.src)`.
fn pinned_producer() {
    let (mut src, a) = nvlink_source(None);
    let e = Engine::from_json(NVLINK).unwrap();
    let pinned = allocate_pinned_host(SIZE).unwrap();
    let region = e.register_host_memory(&pinned, Access::NONE).unwrap();
    let peer = e.connect(&src.endpoint, None).unwrap();
    let fresh = pinned_copy(&pattern_vec(7, SIZE as usize));
    let mut scratch = pinned_copy(&[0u8]);
    let stream = slow_producer(pinned.addr(), &fresh, &mut scratch, 10);
    e.record_pinned_host_producer_stream(region, stream).unwrap();
    let b = e.submit(peer, &[wr(pinned.addr(), a, SIZE)], only(TransportKind::Nvlink)).unwrap();
    b.wait(Duration::from_secs(60)).unwrap();
    assert_eq!(src.cmd(&format!("verify 0 7 0 {SIZE}")), "ok");
}

/// M4: EGM needs the opt-in of both peers. A source whose engine did not
/// opt in serves nothing of its EGM memory: the requester (opted in) is
/// refused before anything is posted (guards `engine/plan.rs` `select`'s
/// `egm_both`, the peer's capability), and a hand-made MNNVL export request
/// for that memory is refused by the source itself (guards
/// `engine/ipc_transports.rs` `IpcParts::mnnvl`'s `if m.egm { kinds.push(Egm) }`).
fn egm_source_without_opt_in() {
    let mut src = Source::start(MNNVL_FD, "egm", 1, None);
    let a = src.addrs[0];
    let r = Req::new(r#"{"mnnvl": {"handle_type": "posix_fd", "egm": true}}"#, &src.endpoint, TransportKind::Mnnvl);
    let e = r.e.submit(r.peer, &[rd(r.l(0), a, 4096)], only(TransportKind::Mnnvl)).err().expect("refused");
    assert_eq!(e.status(), Status::NotSupported, "{e}");
    assert!(e.message().contains("egm"), "{e}");
    assert_eq!(src.ipc("mnnvl", "exports_open"), 0);
    let reject = common::ipc_export_request(&src.endpoint, TransportKind::Mnnvl, a, 4096).err();
    assert_eq!(reject, Some(Status::NotSupported), "the source exported EGM memory without its opt-in");
    assert_eq!(src.ipc("mnnvl", "exports_open"), 0);
}

/// M13 and M11 (local side): `free_mnnvl` and `free_egm` release the VMM
/// mapping, handle and range (the parent checks the trace and the live
/// report); a failed release is Unquiesced and hands the allocation back.
/// Guards `memory/cuda.rs` `free_mnnvl` -> `cuda/fabric.rs` `free`.
fn free_vmm() {
    let m = allocate_mnnvl(0, 3 * MIB).unwrap();
    let g = allocate_egm(0, MIB).unwrap();
    free_mnnvl(m).map_err(|(_, e)| e).unwrap();
    free_egm(g).map_err(|(_, e)| e).unwrap();
}

fn free_vmm_fails() {
    let m = allocate_mnnvl(0, 3 * MIB).unwrap();
    let (kept, e) = free_mnnvl(m).expect_err("the injected release failure");
    assert_eq!(e.status(), Status::Unquiesced, "{e}");
    assert_eq!(kept.len(), 3 * MIB);
}

/// S1 under AUTO: with both engines offering the transport and the
/// remote region its kind of memory, an AUTO submission (no transport
/// forced) chooses NVLink for a `cuda_ipc` region and MNNVL for an
/// `mnnvl` one, says so per request, and moves the source's bytes; with
/// the requester offering neither, AUTO refuses the submission typed (no
/// transport reaches GPU memory on both sides), as documented. Guards `engine/plan.rs` `select`'s IPC arm under
/// `Transport::Auto` (every other CUDA test forces the transport).
fn auto_picks_the_cuda_transports() {
    let auto = SubmitOptions { transport: Transport::Auto, timeout: Some(Duration::from_secs(60)) };
    let go = |r: &Req, req: Request| {
        let b = r.e.submit(r.peer, &[req], auto).unwrap();
        b.wait(Duration::from_secs(120)).unwrap();
        b.transport(0).unwrap()
    };
    let (src, a) = nvlink_source(None);
    let r = Req::new(NVLINK, &src.endpoint, TransportKind::Nvlink);
    assert_eq!(go(&r, rd(r.l(0), a + 4096, MIB)), Some(TransportKind::Nvlink));
    assert!(r.holds(0, 0, MIB, 1, 4096));
    assert_eq!(r.e.stats().transports["tcp"].requests_completed, 0);
    // A requester that does not offer NVLink: no transport can carry GPU
    // memory to GPU memory (TCP needs CPU access on both sides), and AUTO
    // says so before anything is posted, naming the memory kinds.
    let none = Req::new("{}", &src.endpoint, TransportKind::Tcp);
    let Err(e) = none.e.submit(none.peer, &[rd(none.l(1), a, 8192)], auto) else {
        panic!("AUTO took GPU memory to GPU memory without a CUDA transport")
    };
    assert_eq!(e.status(), Status::Unavailable, "{e}");
    assert!(e.message().contains("cuda -> cuda_ipc"), "{e}");
    let src = Source::start(MNNVL_FD, "mnnvl", 1, None);
    let m = Req::new(MNNVL_FD, &src.endpoint, TransportKind::Mnnvl);
    assert_eq!(go(&m, rd(m.l(0), src.addrs[0], 2 * MIB)), Some(TransportKind::Mnnvl));
    assert!(m.holds(0, 0, 2 * MIB, 1, 0));
    assert_eq!(m.e.stats().transports["mnnvl"].requests_completed, 1);
}

/// M11 (import side): a failed cuMemRelease or cuMemAddressFree while
/// closing an MNNVL import is Unquiesced: no close receipt, the import and
/// its charge retained, the source's export kept. Guards
/// `cuda/fabric.rs` `Imported::close`'s `?` on each step.
fn import_close_step_fails() {
    let mut src = Source::start(MNNVL_FD, "mnnvl", 1, None);
    let a = src.addrs[0];
    let r = Req::new(MNNVL_FD, &src.endpoint, TransportKind::Mnnvl);
    assert_eq!(r.go(&[wr(r.l(0), a, MIB)]), vec![res(Status::Unquiesced, RemoteEffect::Unknown)]);
    let st = r.ipc();
    assert_eq!((st.imports.opened, st.imports.closed, st.imports.retained), (1, 0, 1), "{st:?}");
    assert_eq!(st.mapping_bytes_charged, SIZE, "{st:?}");
    assert_eq!(src.ipc("mnnvl", "exports_open"), 1);
}

/// F4: single copies at or above `nvlink_async_memcpy_threshold_kb` and
/// groups of two copies take the stream/event path; a threshold of 0
/// disables the synchronous path (the parent counts the driver calls).
/// Guards `cuda_mapping.rs` `copy`'s `ops.len() == 1 && ops[0].len < self.threshold`.
fn threshold() {
    let (src, a) = nvlink_source(None);
    let four =
        Req::new(r#"{"nvlink": true, "nvlink_async_memcpy_threshold_kb": 4}"#, &src.endpoint, TransportKind::Nvlink);
    for reqs in
        [vec![rd(four.l(0), a, 4096)], vec![rd(four.l(0), a, 4095)], vec![rd(four.l(0), a, 16), rd(four.l(1), a, 16)]]
    {
        let n = reqs.len();
        assert_eq!(four.go(&reqs), vec![res(Status::Ok, RemoteEffect::None); n]);
    }
    let zero =
        Req::new(r#"{"nvlink": true, "nvlink_async_memcpy_threshold_kb": 0}"#, &src.endpoint, TransportKind::Nvlink);
    assert_eq!(zero.go(&[rd(zero.l(0), a, 1)]), vec![res(Status::Ok, RemoteEffect::None)]);
}

/// F3: a failed drain, or a failed restoration of the caller's context,
/// after a synchronous copy into pinned host memory keeps everything: the
/// import and its charge, the source's export, and the loan of the local
/// pinned allocation (fenced: TCP and free refused). Guards
/// `cuda_mapping.rs` `sync_copy`'s `mark_uncertain` on both.
fn sync_copy_uncertain() {
    let (mut src, a) = nvlink_source(None);
    let e = Engine::from_json(NVLINK).unwrap();
    let pinned = allocate_pinned_host(SIZE).unwrap();
    e.register_host_memory(&pinned, Access::NONE).unwrap();
    let peer = e.connect(&src.endpoint, None).unwrap();
    let b = e.submit(peer, &[rd(pinned.addr(), a, 4096)], only(TransportKind::Nvlink)).unwrap();
    let _ = b.wait(Duration::from_secs(60));
    assert_eq!(b.results(), vec![res(Status::Unquiesced, RemoteEffect::None)]);
    let st = e.stats().ipc["nvlink"].clone();
    assert_eq!((st.imports.retained, st.imports.fenced_local), (1, 1), "{st:?}");
    assert_eq!(st.mapping_bytes_charged, SIZE, "{st:?}");
    assert_eq!(src.ipc("nvlink", "exports_open"), 1);
    let (_kept, err) = pinned.free().expect_err("a fenced allocation is not freed");
    assert_eq!(err.status(), Status::Unavailable, "{err}");
}

/// A stream of device 0's primary context (`flags`: 0 blocking, 1
/// non-blocking) held at a gate: the serving stack's own work, still
/// running.
fn held_stream(gate: u64, flags: u32) -> sys::CUstream {
    let g = ContextGuard::bind(primary_context(0).unwrap()).unwrap();
    let mut s: sys::CUstream = std::ptr::null_mut();
    // SAFETY: a context is current; creates one stream, kept to the end of
    // the case.
    assert_eq!(unsafe { sys::cuStreamCreate(&mut s, flags) }, CUresult::CUDA_SUCCESS);
    // SAFETY: `gate` is 4 aligned bytes of device memory kept until the
    // stream passed it.
    assert_eq!(unsafe { sys::cuStreamWaitValue32_v2(s, gate, 1, 0) }, CUresult::CUDA_SUCCESS);
    g.restore().unwrap();
    s
}

/// Opens a gate without the legacy stream (which waits for the blocking
/// streams held at it): a copy on a non-blocking stream of its own.
fn open_gate(gate: u64) {
    let one = pinned_copy(&1u32.to_le_bytes());
    let g = ContextGuard::bind(primary_context(0).unwrap()).unwrap();
    let mut s: sys::CUstream = std::ptr::null_mut();
    // SAFETY: a context is current; one non-blocking stream, destroyed below.
    assert_eq!(unsafe { sys::cuStreamCreate(&mut s, 1) }, CUresult::CUDA_SUCCESS);
    // SAFETY: 4 bytes from pinned memory that outlives the synchronisation.
    assert_eq!(unsafe { sys::cuMemcpyAsync(gate, one.as_ptr() as u64, 4, s) }, CUresult::CUDA_SUCCESS);
    // SAFETY: our stream.
    assert_eq!(unsafe { sys::cuStreamSynchronize(s) }, CUresult::CUDA_SUCCESS);
    // SAFETY: our idle stream.
    assert_eq!(unsafe { sys::cuStreamDestroy_v2(s) }, CUresult::CUDA_SUCCESS);
    g.restore().unwrap();
}

/// The stand-in's legacy stream, as the driver's "Stream synchronization
/// behavior" describes it, shown by the order two copies to one place land
/// in: a copy on the legacy stream runs after the work queued before it on
/// a blocking stream (held at a gate, then copying 1: the place ends 2,
/// the legacy copy's value), and work queued on a blocking stream after it
/// runs after it (the place ends 4, not the legacy copy's 3); a
/// non-blocking stream held at the gate does not hold the legacy stream
/// up. The F2 case relies on this rule to fail.
fn legacy_stream_rule() {
    let gate = CudaMemory::allocate(0, 4096).unwrap();
    host_to_device(gate.addr(), &[0u8; 4]).unwrap();
    let place = CudaMemory::allocate(0, 8192).unwrap();
    let (first, second) = (place.addr(), place.addr() + 4096);
    let values: Vec<Pinned> = (0..5u8).map(|v| pinned_copy(&[v; 4096])).collect();
    let legacy: sys::CUstream = std::ptr::null_mut();
    let copy = |dst: u64, v: usize, s: sys::CUstream| {
        // SAFETY: 4096 bytes from pinned memory kept to the end of the case
        // into device memory kept as long, in the bound context.
        let r = unsafe { sys::cuMemcpyAsync(dst, values[v].as_ptr() as u64, 4096, s) };
        assert_eq!(r, CUresult::CUDA_SUCCESS);
    };
    let sync = |s: sys::CUstream| {
        // SAFETY: a stream of the bound context, or its legacy stream.
        assert_eq!(unsafe { sys::cuStreamSynchronize(s) }, CUresult::CUDA_SUCCESS);
    };
    let _non_blocking = held_stream(gate.addr(), 1);
    let blocking = held_stream(gate.addr(), 0);
    let g = ContextGuard::bind(primary_context(0).unwrap()).unwrap();
    copy(first, 1, blocking);
    copy(first, 2, legacy);
    copy(second, 3, legacy);
    let mut later: sys::CUstream = std::ptr::null_mut();
    // SAFETY: a context is current; one blocking stream.
    assert_eq!(unsafe { sys::cuStreamCreate(&mut later, 0) }, CUresult::CUDA_SUCCESS);
    copy(second, 4, later);
    g.restore().unwrap();
    open_gate(gate.addr());
    let g = ContextGuard::bind(primary_context(0).unwrap()).unwrap();
    for s in [blocking, later, legacy] {
        sync(s);
    }
    g.restore().unwrap();
    let held = bytes_at(place.addr(), 8192);
    assert_eq!((held[0], held[4096]), (2, 4), "the legacy stream ran out of order with a blocking stream");
    // A non-blocking stream held at a gate never holds the legacy stream.
    host_to_device(gate.addr(), &[0u8; 4]).unwrap();
    let _held_again = held_stream(gate.addr(), 1);
    let g = ContextGuard::bind(primary_context(0).unwrap()).unwrap();
    copy(first, 0, legacy);
    sync(legacy);
    g.restore().unwrap();
    // (bytes_at drains the whole context: only once the gate is open.)
    open_gate(gate.addr());
    assert_eq!(bytes_at(first, 1)[0], 0);
}

/// F2 inside a serving process: the stack's own work in the requester's
/// primary context - one blocking and one non-blocking stream, each held
/// at a gate - does not hold up a small synchronous NVLink READ into device
/// memory there: it completes with both gates closed. On a GPU the legacy
/// stream waits for every blocking stream of its context and
/// `cuCtxSynchronize` for every stream (the stand-in models both, its
/// README), so a copy drained that way would wait for the stack's kernels.
/// A watchdog opens the gates after 30 s so that a failing run ends.
/// Guards `cuda_mapping.rs` `sync_copy`: a leased non-blocking stream,
/// drained alone.
fn application_streams() {
    let (_src, a) = nvlink_source(None);
    let r = Req::new(NVLINK, &_src.endpoint, TransportKind::Nvlink);
    let gate = CudaMemory::allocate(0, 4096).unwrap();
    host_to_device(gate.addr(), &[0u8; 4]).unwrap();
    let held = [held_stream(gate.addr(), 0), held_stream(gate.addr(), 1)];
    let (done, wait) = std::sync::mpsc::channel::<()>();
    let gate_addr = gate.addr();
    let watchdog = std::thread::spawn(move || match wait.recv_timeout(Duration::from_secs(30)) {
        Ok(()) => false,
        Err(_) => {
            open_gate(gate_addr);
            true
        }
    });
    let out = r.go(&[rd(r.l(0), a, 4096)]);
    done.send(()).unwrap();
    assert!(!watchdog.join().unwrap(), "the small READ waited for the application's streams");
    assert_eq!(out, vec![res(Status::Ok, RemoteEffect::None)]);
    open_gate(gate.addr());
    for s in held {
        // SAFETY: our streams; their gate is open.
        assert_eq!(unsafe { sys::cuStreamSynchronize(s) }, CUresult::CUDA_SUCCESS);
    }
    assert!(r.holds(0, 0, 4096, 1, 0), "the READ's bytes");
}

/// Issue 34, posting behind the copy on the CUDA paths: 8192 scattered
/// 512-byte READs (no two contiguous on both sides, so none coalesce)
/// through a cached NVLink import move in two windows of 4096, each one
/// native batch on a stream of its own: the second is posted while the
/// first still copies (every copy held 200 us, so a window takes about
/// 0.8 s), and the submission returns with both in flight. Every byte is
/// checked. The parent counts two batch calls and two streams. Guards
/// `transport/ipc/groups.rs` `windowed` admitting the CUDA transports and
/// `windows` cutting them by count alone.
fn cuda_windows() {
    let src = Source::start(NVLINK_CACHED, "ipc", 1, None);
    let a = src.addrs[0];
    let r = Req::new(NVLINK_CACHED, &src.endpoint, TransportKind::Nvlink);
    const B: u64 = 512;
    let n = SIZE / B;
    let reqs: Vec<Request> = (0..n).map(|k| rd(r.l(0) + k * B, a + (n - 1 - k) * B, B)).collect();
    let opts =
        SubmitOptions { transport: Transport::Only(TransportKind::Nvlink), timeout: Some(Duration::from_secs(120)) };
    let b = r.e.submit(r.peer, &reqs, opts).unwrap();
    assert_eq!(b.poll(), Status::Pending, "the submission waited for its copies");
    b.wait(Duration::from_secs(120)).unwrap();
    let mut host = vec![0u8; SIZE as usize];
    device_to_host(&mut host, r.l(0)).unwrap();
    for k in 0..n {
        let at = (k * B) as usize;
        let want: Vec<u8> = (0..B).map(|i| common::pattern(1, (n - 1 - k) * B + i)).collect();
        assert!(host[at..at + B as usize] == want[..], "block {k}");
    }
    let st = r.ipc();
    assert_eq!((st.imports.opened, st.imports.copies_issued), (1, n), "{st:?}");
}

/// N1: with a driver older than 13000 the v2 batch symbol is never called,
/// even when the library exports it; an independent group goes through
/// ordered copies (the parent checks the trace). Guards `cuda/driver.rs`
/// `probe`'s `version >= 13000 &&`.
fn batch_symbol_gate() {
    let want = std::env::var("FAKECUDA_DRIVER_VERSION").unwrap_or_default() != "12090";
    let v: serde_json::Value = orbite::cuda::driver_json();
    assert_eq!(v["memcpy_batch_v2"], want, "{v}");
    let (src, a) = nvlink_source(None);
    let r = Req::new(NVLINK, &src.endpoint, TransportKind::Nvlink);
    let s = MIB;
    let group = [rd(r.l(0), a + 2 * s + 4096, s), rd(r.l(0) + s, a + 4096, s), rd(r.l(0) + 2 * s, a + s + 8192, s)];
    assert_eq!(r.go(&group), vec![res(Status::Ok, RemoteEffect::None); 3]);
    assert!(r.holds(0, 0, s, 1, 2 * s + 4096) && r.holds(0, s, s, 1, 4096) && r.holds(0, 2 * s, s, 1, s + 8192));
}

/// Runs in a child process; does nothing when run directly.
#[test]
fn child_case() {
    let Some(case) = child_case_name() else { return };
    match case.as_str() {
        "zeroed-ipc" => zeroed_ipc(),
        "batch-prefix" => batch_prefix(),
        "sticky" => sticky_error(),
        "sticky-source" => sticky_error_at_the_source(),
        "async-fault" => asynchronous_fault(),
        "dead-exporter" => dead_exporter(),
        "dead-exporter-stale" => dead_exporter_without_a_fault(),
        "pageable" => pageable_staging_and_registration_flags(),
        "nvlink-plan" => nvlink_plan(),
        "cuda-runs" => contiguous_runs_on_the_cuda_paths(),
        "coalesced-fault" => a_failed_coalesced_batch(),
        "any-order" => independent_subbatches_post_ahead(),
        "producer-source" => producer_at_the_source(),
        "producer-wait-off-io" => producer_wait_off_the_io_thread(),
        "auto-cuda" => auto_picks_the_cuda_transports(),
        "producer-mnnvl-source" => producer_at_an_mnnvl_source(),
        "pinned-producer" => pinned_producer(),
        "egm-source" => egm_source_without_opt_in(),
        "free-vmm" => free_vmm(),
        "free-vmm-fails" => free_vmm_fails(),
        "import-close-step" => import_close_step_fails(),
        "threshold" => threshold(),
        "sync-uncertain" => sync_copy_uncertain(),
        "app-streams" => application_streams(),
        "cuda-windows" => cuda_windows(),
        "legacy-rule" => legacy_stream_rule(),
        "batch-gate" => batch_symbol_gate(),
        "shared-pending" => shared_pending_slot(),
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
fn e3_a_sticky_error_fails_the_cuda_transports_and_leaves_tcp_serving() {
    run("sticky", &[("FAKECUDA_FAIL", "cuEventQuery:1:700"), ("FAKECUDA_DEVICES", "2")]);
}

#[test]
fn e3_an_illegal_access_faults_at_the_next_synchronisation_and_fails_the_cuda_transports() {
    run("async-fault", &[]);
}

#[test]
fn e3_a_copy_through_a_dead_exporters_import_faults_and_is_never_ok() {
    run("dead-exporter", &[("FAKECUDA_COPY_DELAY_US", "3000000")]);
}

#[test]
fn a_copy_a_dead_exporter_overtook_is_never_ok_even_without_a_fault() {
    run("dead-exporter-stale", &[("FAKECUDA_COPY_DELAY_US", "3000000"), ("FAKECUDA_DEAD_EXPORTER", "stale")]);
}

#[test]
fn pageable_memory_is_staged_at_the_call_and_registrations_are_per_context_unless_portable() {
    // Each copy held 500 ms: a copy that read `src` when it ran would see 2.
    run("pageable", &[("FAKECUDA_DEVICES", "2"), ("FAKECUDA_COPY_DELAY_US", "500000")]);
}

#[test]
fn e3_a_sticky_error_at_the_source_refuses_its_later_exports() {
    run("sticky-source", &[]);
}

#[test]
fn b2_the_nvlink_mapping_follows_the_plan_it_is_given() {
    let t = run_traced("nvlink-plan", &[]);
    assert_eq!(fakecuda::calls(&t, "cuMemcpyBatchAsync_v2"), 1, "the independent group: {t:?}");
    assert_eq!(fakecuda::calls(&t, "cuMemcpyAsync"), 2, "the dependent group, in order: {t:?}");
}

#[test]
fn contiguous_runs_move_as_one_native_copy_each_on_nvlink_and_mnnvl() {
    let t = run_traced("cuda-runs", &[]);
    // One native batch per transport, one entry per run.
    assert_eq!(fakecuda::calls(&t, "cuMemcpyBatchAsync_v2"), 2, "{t:?}");
    // The stand-in counts every copy on device 0, the checks' synchronous
    // reads (cuMemcpy) too.
    let enqueued = fakecuda::calls(&t, "copies@device0") - fakecuda::calls(&t, "cuMemcpy");
    assert_eq!(enqueued, 6, "{t:?}");
}

#[test]
fn a_fault_in_the_middle_of_coalesced_writes_leaves_each_unknown() {
    run("coalesced-fault", &[("FAKECUDA_FAIL", "cuMemcpyBatchAsync_v2:1:1")]);
}

#[test]
fn independent_subbatches_are_posted_while_the_first_copies() {
    run("any-order", &[("FAKECUDA_COPY_DELAY_US", "1000000")]);
}

#[test]
fn s1_auto_picks_nvlink_and_mnnvl_where_memory_and_peers_allow() {
    run("auto-cuda", &[]);
}

#[test]
fn a_producer_wait_leaves_the_io_thread_serving_other_peers() {
    run("producer-wait-off-io", &[]);
}

#[test]
fn m10_the_source_consumes_its_producer_before_granting() {
    run("producer-source", &[("FAKECUDA_COPY_DELAY_US", "100000")]);
}

#[test]
fn m10_an_mnnvl_source_consumes_its_producer_before_granting() {
    run("producer-mnnvl-source", &[("FAKECUDA_COPY_DELAY_US", "100000")]);
}

#[test]
fn p4_a_pinned_host_producer_is_waited_for_before_the_write() {
    run("pinned-producer", &[("FAKECUDA_COPY_DELAY_US", "100000")]);
}

#[test]
fn m4_a_source_without_the_egm_opt_in_serves_none_of_its_egm_memory() {
    run("egm-source", &[]);
}

#[test]
fn m13_free_mnnvl_and_free_egm_release_the_driver_resources() {
    let t = run_traced("free-vmm", &[]);
    // Every handle created is released, every mapping unmapped, every range
    // freed (the fabric-export probe creates and releases one more handle).
    let n = |f: &str| fakecuda::calls(&t, f);
    assert_eq!(n("cuMemUnmap"), 2, "{t:?}");
    assert_eq!((n("cuMemMap"), n("cuMemAddressReserve"), n("cuMemAddressFree")), (2, 2, 2), "{t:?}");
    assert_eq!(n("cuMemRelease"), n("cuMemCreate"), "{t:?}");
    for (what, n) in fakecuda::live_reports(&t).values().flatten() {
        assert_eq!(*n, 0, "{what} left behind: {t:?}");
    }
    run("free-vmm-fails", &[("FAKECUDA_FAIL", "cuMemRelease@cuMemUnmap:999")]);
}

#[test]
fn m11_a_failed_release_or_range_free_of_an_import_is_unquiesced_and_retained() {
    for fail in ["cuMemRelease@cuMemUnmap:999", "cuMemAddressFree@cuMemUnmap:999"] {
        run("import-close-step", &[("FAKECUDA_FAIL", fail)]);
    }
}

#[test]
fn f4_copies_at_or_above_the_threshold_and_groups_go_to_a_stream() {
    let t = run_traced("threshold", &[]);
    // Only the 4095-byte copy is synchronous (one copy drained at once, on
    // its own stream: no event); the 4096-byte copy and the 1 byte under
    // threshold 0 each record an event.
    assert_eq!(fakecuda::calls(&t, "cuMemcpy"), 0, "{t:?}");
    assert_eq!(fakecuda::calls(&t, "cuCtxSynchronize"), 0, "{t:?}");
    assert_eq!(fakecuda::calls(&t, "cuStreamSynchronize"), 1, "{t:?}");
    assert_eq!(fakecuda::calls(&t, "cuMemcpyAsync"), 3, "4095, 4096, and 1 byte under threshold 0: {t:?}");
    assert_eq!(fakecuda::calls(&t, "cuEventRecord"), 3, "4096, the group of two, 1 byte: {t:?}");
    assert_eq!(fakecuda::calls(&t, "cuMemcpyBatchAsync_v2"), 1, "the group of two: {t:?}");
}

#[test]
fn large_cuda_groups_are_posted_in_windows_while_the_first_copies() {
    let t = run_traced("cuda-windows", &[("FAKECUDA_COPY_DELAY_US", "200")]);
    assert_eq!(fakecuda::calls(&t, "cuMemcpyBatchAsync_v2"), 2, "one native batch per window: {t:?}");
    assert_eq!(fakecuda::calls(&t, "cuStreamCreate"), 2, "a stream per window in flight: {t:?}");
    assert_eq!(fakecuda::calls(&t, "cuEventRecord"), 2, "{t:?}");
}

#[test]
fn f2_a_small_copy_never_waits_for_the_applications_streams() {
    run("app-streams", &[]);
}

#[test]
fn the_stand_ins_legacy_stream_waits_for_blocking_streams_only() {
    run("legacy-rule", &[]);
}

#[test]
fn f3_a_failed_drain_or_context_restoration_keeps_loan_mapping_and_charge() {
    run("sync-uncertain", &[("FAKECUDA_FAIL", "cuStreamSynchronize:1:999")]);
    run("sync-uncertain", &[("FAKECUDA_FAIL", "cuCtxSetCurrent@cuMemcpyAsync:999")]);
}

#[test]
fn n1_the_v2_batch_symbol_is_called_only_on_driver_13000_and_later() {
    let t = run_traced("batch-gate", &[("FAKECUDA_DRIVER_VERSION", "12090")]);
    assert_eq!(fakecuda::calls(&t, "cuMemcpyBatchAsync_v2"), 0, "{t:?}");
    assert_eq!(fakecuda::calls(&t, "cuMemcpyAsync"), 3, "{t:?}");
    let t = run_traced("batch-gate", &[]);
    assert_eq!(fakecuda::calls(&t, "cuMemcpyBatchAsync_v2"), 1, "{t:?}");
}

/// Two groups in flight on one cached import (once a bug: they shared one
/// pending slot, so the second post replaced the first group's stream lease
/// and the first group completed when the second's event did): a slow
/// 8-copy group, then a 1-copy group through the same cached MNNVL import;
/// the first batch reports Ok only once its own copies landed.
fn shared_pending_slot() {
    let cfg = r#"{"mnnvl": {"handle_type": "posix_fd"}, "nvlink_cache_entries": 2}"#;
    let src = Source::start(cfg, "mnnvl", 1, None);
    let a = src.addrs[0];
    let r = Req::new(cfg, &src.endpoint, TransportKind::Mnnvl);
    host_to_device(r.l(0), &vec![0x11u8; SIZE as usize]).unwrap();
    let slow: Vec<Request> = (0..8).map(|k| rd(r.l(0) + k * (SIZE / 8), a + k * (SIZE / 8), SIZE / 8)).collect();
    let first = r.e.submit(r.peer, &slow, only(TransportKind::Mnnvl)).unwrap();
    let second = r.e.submit(r.peer, &[rd(r.l(1), a, 4096)], only(TransportKind::Mnnvl)).unwrap();
    first.wait(Duration::from_secs(60)).unwrap();
    second.wait(Duration::from_secs(60)).unwrap();
    assert!(r.holds(0, 0, SIZE, 1, 0), "the first batch completed before its copies landed");
}

/// Two groups in flight on one cached import each complete on their own
/// event: the first batch is not done before its own (slow) copies landed.
/// Guards `cuda_mapping.rs`'s postings (one pending lease per group).
#[test]
fn c1_a_second_group_on_a_cached_import_never_completes_the_first() {
    run("shared-pending", &[("FAKECUDA_COPY_DELAY_US", "200000")]);
}
