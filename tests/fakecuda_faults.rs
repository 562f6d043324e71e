//! The seed's Unquiesced and retained-resource paths of the NVLink and
//! MNNVL transports, driven through the CPU stand-in for the CUDA driver
//! with injected driver failures. Each case runs as a child process (the
//! requester, with the stand-in on its loader path and its own
//! `FAKECUDA_FAIL`), which starts an `orbite-gpu-qual` source process and
//! asserts the exact outcome: request statuses, remote effects, retained
//! imports, exports and quarantined streams in the stats of both sides.
#![cfg(feature = "cuda")]

mod common;
mod fakecuda;
mod fakecuda_harness;

use common::pattern;
use fakecuda_harness::*;
use orbite::*;
use std::time::Duration;

/// A failed cuIpcCloseMemHandle: the group is Unquiesced (WRITE effect
/// Unknown), the import stays retained and visible, the source keeps its
/// export (and its loan of the allocation: the source cannot close while
/// it is out); closing the engine says so. The same requester may still
/// read the allocation (its own loans never hold it off).
fn close_fails() {
    let (mut src, a) = nvlink_source(None);
    let r = Req::new(NVLINK, &src.endpoint, TransportKind::Nvlink);
    let out = r.go(&[wr(r.l(0), a, MIB), rd(r.l(1), a + 2 * MIB, 16)]);
    assert_eq!(out, vec![res(Status::Unquiesced, RemoteEffect::Unknown), res(Status::Unquiesced, RemoteEffect::None)]);
    let st = r.ipc();
    assert_eq!((st.imports.opened, st.imports.closed, st.imports.retained), (1, 0, 1), "{st:?}");
    assert_eq!(src.ipc("nvlink", "exports_open"), 1);
    let all: serde_json::Value = serde_json::from_str(&retained_resources_json()).unwrap();
    assert_eq!(all["engines"][r.e.endpoint()]["nvlink"]["retained_imports"], 1, "{all}");
    let later = r.go_within(&[rd(r.l(0), a, 16)], Duration::from_secs(60));
    assert_eq!(later[0].status, Status::Ok, "a later READ of the same requester");
    assert_eq!(src.ipc("nvlink", "exports_open"), 1, "the retained export stays");
    assert!(src.cmd("close_source 300").starts_with("err"), "the source cannot close with its export out");
    assert_eq!(r.e.close(Some(Duration::from_secs(5))).unwrap_err().status(), Status::Unquiesced);
}

/// Every cuEventQuery fails: completion cannot be confirmed, so the group
/// is Unquiesced, the import retained and the stream slot quarantined.
fn query_fails() {
    let (mut src, a) = nvlink_source(None);
    let r = Req::new(NVLINK, &src.endpoint, TransportKind::Nvlink);
    let out = r.go(&[rd(r.l(0), a, SIZE), wr(r.l(1), a, MIB)]);
    assert_eq!(out, vec![res(Status::Unquiesced, RemoteEffect::None), res(Status::Unquiesced, RemoteEffect::Unknown)]);
    assert_eq!(r.ipc().imports.retained, 1);
    assert_eq!(r.e.stats().nvlink.retained_streams, 1, "{:?}", r.e.stats().nvlink);
    assert_eq!(src.ipc("nvlink", "exports_open"), 1);
}

/// A single small copy goes synchronously; a failed drain of its stream
/// after it leaves the outcome uncertain: Unquiesced, retained, the stream
/// quarantined.
fn drain_fails() {
    let (mut src, a) = nvlink_source(None);
    let r = Req::new(NVLINK, &src.endpoint, TransportKind::Nvlink);
    let out = r.go(&[rd(r.l(0), a, 4096)]);
    assert_eq!(out, vec![res(Status::Unquiesced, RemoteEffect::None)]);
    assert_eq!(r.ipc().imports.retained, 1);
    assert_eq!(r.e.stats().nvlink.retained_streams, 1, "the drained stream is quarantined");
    assert_eq!(src.ipc("nvlink", "exports_open"), 1);
}

/// The native batch copy is refused at enqueue and the stream drains: every
/// descriptor counts as attempted (WRITE effect Unknown), nothing is
/// replayed, the import closes normally and the stream stays healthy; the
/// same batch then succeeds.
fn batch_enqueue_fails() {
    let src = Source::start(NVLINK, "ipc", 2, None);
    let (a, b) = (src.addrs[0], src.addrs[1]);
    let mut src = src;
    let r = Req::new(NVLINK, &src.endpoint, TransportKind::Nvlink);
    let s = MIB;
    let group = [rd(r.l(0), a + 2 * s, s), rd(r.l(0) + s, a, s), wr(r.l(1), a + 3 * s, s)];
    let out = r.go(&group);
    assert_eq!(
        out,
        vec![
            res(Status::CudaError, RemoteEffect::None),
            res(Status::CudaError, RemoteEffect::None),
            res(Status::CudaError, RemoteEffect::Unknown)
        ]
    );
    let st = r.ipc();
    assert_eq!((st.imports.opened, st.imports.closed, st.imports.retained), (1, 1, 0), "{st:?}");
    assert_eq!(r.e.stats().nvlink.retained_streams, 0);
    assert_eq!(src.ipc("nvlink", "exports_open"), 0);
    let out = r.go(&[rd(r.l(0), a + 2 * s, s), rd(r.l(0) + s, a, s), rd(r.l(1), b + s, s)]);
    assert!(out.iter().all(|x| x.status == Status::Ok), "{out:?}");
    assert!(r.holds(0, 0, s, 1, 2 * s) && r.holds(0, s, s, 1, 0) && r.holds(1, 0, s, 2, s));
}

/// An ordered enqueue fails and so does the drain after it: the stream slot
/// is quarantined and the import retained.
fn enqueue_and_drain_fail() {
    let (mut src, a) = nvlink_source(None);
    let r = Req::new(NVLINK, &src.endpoint, TransportKind::Nvlink);
    let out = r.go(&[rd(r.l(0), a, SIZE)]);
    assert_eq!(out, vec![res(Status::Unquiesced, RemoteEffect::None)]);
    assert_eq!(r.e.stats().nvlink.retained_streams, 1);
    assert_eq!(r.ipc().imports.retained, 1);
    assert_eq!(src.ipc("nvlink", "exports_open"), 1);
}

/// The import cannot be opened: the request fails with the driver's error,
/// the source is told and releases the export; the next request works.
fn open_fails() {
    let (mut src, a) = nvlink_source(None);
    let r = Req::new(NVLINK, &src.endpoint, TransportKind::Nvlink);
    let out = r.go(&[wr(r.l(0), a, 4096)]);
    assert_eq!(out, vec![res(Status::CudaError, RemoteEffect::None)], "nothing was mapped: no remote effect");
    let st = r.ipc();
    assert_eq!((st.imports.opened, st.imports.retained), (0, 0), "{st:?}");
    assert_eq!(src.ipc("nvlink", "exports_open"), 0);
    assert_eq!(r.go(&[rd(r.l(0), a, SIZE)]), vec![res(Status::Ok, RemoteEffect::None)]);
    assert!(r.holds(0, 0, SIZE, 1, 0));
}

/// The source's cuIpcGetMemHandle fails: the request gets the source's
/// typed error and the offer's loan is released, so the next request is
/// served (it used to stay loaned: Unavailable until the source closed).
fn source_export_fails() {
    let (mut src, a) = nvlink_source(Some("cuIpcGetMemHandle:1:999"));
    let r = Req::new(NVLINK, &src.endpoint, TransportKind::Nvlink);
    let out = r.go(&[rd(r.l(0), a, SIZE)]);
    assert_eq!(out, vec![res(Status::CudaError, RemoteEffect::None)]);
    assert_eq!(src.ipc("nvlink", "exports_open"), 0);
    assert_eq!(r.go(&[rd(r.l(0), a, SIZE)]), vec![res(Status::Ok, RemoteEffect::None)]);
    assert!(r.holds(0, 0, SIZE, 1, 0));
}

/// No stream can be created: the async copy is refused before anything is
/// enqueued; the import closes normally and nothing is retained.
fn stream_create_fails() {
    let (mut src, a) = nvlink_source(None);
    let r = Req::new(NVLINK, &src.endpoint, TransportKind::Nvlink);
    let out = r.go(&[rd(r.l(0), a, SIZE)]);
    assert_eq!(out.len(), 1);
    assert_ne!(out[0].status, Status::Ok);
    assert_ne!(out[0].status, Status::Unquiesced, "{out:?}");
    let st = r.ipc();
    assert_eq!((st.imports.opened, st.imports.closed, st.imports.retained), (1, 1, 0), "{st:?}");
    assert_eq!(src.ipc("nvlink", "exports_open"), 0);
}

/// MNNVL (POSIX-fd handles): a failed unmap while closing the import is
/// Unquiesced and retained; the source keeps its export.
fn mnnvl_unmap_fails() {
    let mut src = Source::start(MNNVL_FD, "mnnvl", 1, None);
    let a = src.addrs[0];
    let r = Req::new(MNNVL_FD, &src.endpoint, TransportKind::Mnnvl);
    let out = r.go(&[wr(r.l(0), a, MIB)]);
    assert_eq!(out, vec![res(Status::Unquiesced, RemoteEffect::Unknown)]);
    assert_eq!(r.ipc().imports.retained, 1);
    assert_eq!(src.ipc("mnnvl", "exports_open"), 1);
}

/// MNNVL with healthy closes: a cached import serves READs and a WRITE,
/// and the source's allocation cannot be freed while it is exported.
fn mnnvl_cached_and_release_refused() {
    let cfg = r#"{"mnnvl": {"handle_type": "posix_fd"}, "nvlink_cache_entries": 2}"#;
    let mut src = Source::start(cfg, "mnnvl", 1, None);
    let a = src.addrs[0];
    let r = Req::new(cfg, &src.endpoint, TransportKind::Mnnvl);
    assert_eq!(r.go(&[rd(r.l(0), a, SIZE)]), vec![res(Status::Ok, RemoteEffect::None)]);
    assert!(r.holds(0, 0, SIZE, 1, 0));
    // `verify 0 SEED OFF LEN`: the source's bytes at OFF are pattern SEED from 0.
    // (The pattern repeats every MiB, so the WRITE lands 4 KiB off that.)
    let off = MIB + 4096;
    let check = format!("verify 0 1 {off} {MIB}");
    assert!(src.cmd(&check).starts_with("bad "), "before the WRITE");
    assert_eq!(r.go(&[wr(r.l(0), a + off, MIB)]), vec![res(Status::Ok, RemoteEffect::Applied)]);
    assert_eq!(src.cmd(&check), "ok", "the WRITE put the first MiB of local[0] at {off}");
    assert_eq!(src.ipc("mnnvl", "exports_open"), 1);
    // The READ-only import went back for a writable one.
    let st = r.ipc();
    assert_eq!((st.imports.opened, st.imports.cached, st.imports.closed), (2, 1, 1), "{st:?}");
    r.e.flush_nvlink_cache(Some(Duration::from_secs(60))).unwrap();
    assert_eq!(r.ipc().imports.closed, 2);
    assert_eq!(src.ipc("mnnvl", "exports_open"), 0);
}

/// EGM: host-NUMA memory exported over MNNVL, read into device memory, when
/// both peers opt in; a requester without the opt-in is refused.
fn egm_needs_both_opt_ins() {
    let cfg = r#"{"mnnvl": {"handle_type": "posix_fd", "egm": true}}"#;
    let src = Source::start(cfg, "egm", 1, None);
    let a = src.addrs[0];
    let r = Req::new(cfg, &src.endpoint, TransportKind::Mnnvl);
    assert_eq!(r.go(&[rd(r.l(0), a, SIZE)]), vec![res(Status::Ok, RemoteEffect::None)]);
    assert!(r.holds(0, 0, SIZE, 1, 0));
    let plain = Req::new(MNNVL_FD, &src.endpoint, TransportKind::Mnnvl);
    let opts = SubmitOptions { transport: Transport::Only(TransportKind::Mnnvl), timeout: None };
    let e = plain.e.submit(plain.peer, &[rd(plain.l(0), a, 16)], opts).err().expect("refused without the opt-in");
    assert!(matches!(e.status(), Status::NotSupported | Status::Unavailable), "{e}");
}

/// Copies slower than the one query: the group moves to the lazy progress
/// worker, which completes it (bytes checked).
fn lazy_progress() {
    let (_src, a) = nvlink_source(None);
    let r = Req::new(NVLINK_CACHED, &_src.endpoint, TransportKind::Nvlink);
    assert_eq!(r.go(&[rd(r.l(0), a, SIZE)]), vec![res(Status::Ok, RemoteEffect::None)]);
    let st = r.ipc();
    assert_eq!((st.progress_workers, st.pending_groups), (1, 0), "{st:?}");
    assert!(r.holds(0, 0, SIZE, 1, 0));
}

/// The deadline passes while the copy's event is pending: the group is
/// reported Unquiesced then, its import and stream stay in use, and the
/// worker polls on; when the copy completes (3 s in) the import is closed
/// with its receipt and the stream returns to the pool, with no flush.
fn deadline_with_a_pending_event() {
    let (mut src, a) = nvlink_source(None);
    let r = Req::new(NVLINK, &src.endpoint, TransportKind::Nvlink);
    let out = r.go_within(&[wr(r.l(0), a, SIZE)], Duration::from_millis(200));
    assert_eq!(out, vec![res(Status::Unquiesced, RemoteEffect::Unknown)]);
    let st = r.ipc();
    assert_eq!(
        (st.imports.late_groups, st.pending_groups, st.imports.retained, st.imports.closed),
        (1, 1, 0, 0),
        "{st:?}"
    );
    let nv = r.e.stats().nvlink;
    assert_eq!((nv.retained_streams, nv.active_streams), (0, 1), "the busy stream stays leased: {nv:?}");
    assert_eq!(src.ipc("nvlink", "exports_open"), 1);
    let t0 = std::time::Instant::now();
    while r.ipc().imports.late_completions != 1 {
        assert!(t0.elapsed() < Duration::from_secs(60), "the late completion never came: {:?}", r.ipc());
        std::thread::sleep(Duration::from_millis(10));
    }
    let st = r.ipc();
    assert_eq!(
        (st.imports.late_groups, st.pending_groups, st.imports.retained, st.imports.closed),
        (0, 0, 0, 1),
        "{st:?}"
    );
    let nv = r.e.stats().nvlink;
    assert_eq!((nv.retained_streams, nv.active_streams), (0, 0), "{nv:?}");
    assert_eq!(src.ipc("nvlink", "exports_open"), 0);
}

/// NVLink and MNNVL need two processes: an engine in the same process is
/// refused with the reason; pageable host memory is never used for NVLink.
fn same_process_and_pageable_refused() {
    let src = Engine::from_json(NVLINK).unwrap();
    let a = CudaMemory::allocate_ipc(0, SIZE).unwrap();
    src.register_memory(a.addr(), SIZE, Access::READ).unwrap();
    let r = Req::new(NVLINK, &src.endpoint(), TransportKind::Nvlink);
    let opts = SubmitOptions { transport: Transport::Only(TransportKind::Nvlink), timeout: None };
    let e = r.e.submit(r.peer, &[rd(r.l(0), a.addr(), 16)], opts).err().expect("refused in one process");
    assert_eq!(e.status(), Status::Unavailable, "{e}");
    assert!(e.message().contains("is in this process"), "{e}");
    let (mut src2, b) = nvlink_source(None);
    let r2 = Req::new(NVLINK, &src2.endpoint, TransportKind::Nvlink);
    let mut pageable = vec![0u8; 4096];
    r2.e.register_memory(pageable.as_mut_ptr() as u64, 4096, Access::NONE).unwrap();
    let e = r2.e.submit(r2.peer, &[rd(pageable.as_ptr() as u64, b, 16)], opts).err().expect("pageable refused");
    assert_eq!(e.status(), Status::NotSupported, "{e}");
    assert_eq!(src2.ipc("nvlink", "exports_open"), 0);
}

/// One 4 KiB READ over NVLink (below the threshold: synchronous copy and a
/// drain) and one over MNNVL (always the stream and its event); the parent
/// checks the driver calls in the trace.
fn small_copies() {
    let (nv_src, a) = nvlink_source(None);
    let r = Req::new(NVLINK, &nv_src.endpoint, TransportKind::Nvlink);
    assert_eq!(r.go(&[rd(r.l(0), a, 4096)]), vec![res(Status::Ok, RemoteEffect::None)]);
    let m_src = Source::start(MNNVL_FD, "mnnvl", 1, None);
    let m = Req::new(MNNVL_FD, &m_src.endpoint, TransportKind::Mnnvl);
    assert_eq!(m.go(&[rd(m.l(0), m_src.addrs[0], 4096)]), vec![res(Status::Ok, RemoteEffect::None)]);
}

/// A producer stream still writing the local buffer (ten slow copies, then
/// the new bytes) is handed over with `record_producer_stream`: the WRITE
/// waits for it and the source receives the new bytes, not the old ones
/// (each copy takes 100 ms; the WRITE alone would be done long before).
fn producer_stream_is_consumed() {
    use cudarc::driver::sys::{self, CUresult};
    use orbite::cuda::driver::{primary_context, ContextGuard};
    let (mut src, a) = nvlink_source(None);
    let r = Req::new(NVLINK, &src.endpoint, TransportKind::Nvlink);
    let fresh = pinned_copy(&common::pattern_vec(7, SIZE as usize));
    let mut scratch = pinned_copy(&[0u8]);
    let g = ContextGuard::bind(primary_context(0).unwrap()).unwrap();
    let mut stream: sys::CUstream = std::ptr::null_mut();
    // SAFETY: a context is current; creates one non-blocking stream.
    assert_eq!(unsafe { sys::cuStreamCreate(&mut stream, 1) }, CUresult::CUDA_SUCCESS);
    for _ in 0..10 {
        // SAFETY: host to host, one byte; both outlive the stream's work
        // (the WRITE below waits for it).
        let q = unsafe { sys::cuMemcpyAsync(scratch.as_mut_ptr() as u64, fresh.as_ptr() as u64, 1, stream) };
        assert_eq!(q, CUresult::CUDA_SUCCESS);
    }
    // SAFETY: local buffer 0 holds SIZE bytes; `fresh` outlives the copy.
    let q = unsafe { sys::cuMemcpyAsync(r.l(0), fresh.as_ptr() as u64, SIZE as usize, stream) };
    assert_eq!(q, CUresult::CUDA_SUCCESS);
    g.restore().unwrap();
    r.e.record_producer_stream(r.regions[0], stream as u64).unwrap();
    assert_eq!(r.go(&[wr(r.l(0), a, SIZE)]), vec![res(Status::Ok, RemoteEffect::Applied)]);
    assert_eq!(src.cmd(&format!("verify 0 7 0 {SIZE}")), "ok");
    assert_eq!(scratch[0], fresh[0]);
}

/// `wrap_mnnvl` checks the handle's properties and the exact mapping, then
/// serves the caller's storage over fabric handles to another process (the
/// qualification binary's `healthy` mode as requester); freeing the wrapped
/// allocation only forgets it: the caller's own unmap and release follow.
fn wrapped_vmm_storage() {
    use cudarc::driver::sys;
    const FD: u32 = 1;
    const FABRIC: u32 = 8;
    let mine = caller_vmm(FD | FABRIC, SIZE);
    orbite::cuda::raw::host_to_device(mine.va, &common::pattern_vec(1, SIZE as usize)).unwrap();
    // Preconditions the driver can check.
    let bad = |r: Result<Allocation>, needle: &str| {
        let Err(e) = r else { panic!("{needle}: accepted") };
        assert_eq!(e.status(), Status::InvalidArgument, "{e}");
        assert!(e.message().contains(needle), "{e}");
    };
    // SAFETY (all wraps below): the storage is ours, initialized, mapped
    // exactly as named where the call is meant to succeed.
    bad(unsafe { orbite::wrap_egm(0, mine.va, SIZE, mine.handle) }, "not at HostNuma(0)");
    bad(unsafe { orbite::wrap_mnnvl(0, mine.va, SIZE, 0xdead) }, "live VMM allocation handle");
    bad(unsafe { orbite::wrap_mnnvl(0, mine.va, SIZE / 2, mine.handle) }, "not a whole mapping");
    let plain = caller_vmm(0, 2 * MIB);
    bad(unsafe { orbite::wrap_mnnvl(0, plain.va, plain.size, plain.handle) }, "cannot be exported");
    let wrapped = unsafe { orbite::wrap_mnnvl(0, mine.va, SIZE, mine.handle) }.unwrap();

    let e = Engine::from_json(r#"{"mnnvl": {"handle_type": "fabric"}}"#).unwrap();
    let region = e.register_memory(wrapped.addr(), SIZE, Access::READ_WRITE).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_orbite-gpu-qual"))
        .args(["requester", "--endpoint", &e.endpoint(), "--mode", "healthy", "--memory", "device"])
        .args(["--remote", &mine.va.to_string(), "--len", &SIZE.to_string(), "--seed", "1"])
        .args(["--transport", "mnnvl", "--handle", "fabric"])
        .env_remove("FAKECUDA_FAIL")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("PASS healthy"), "{text}");
    e.unregister_memory(region, None).unwrap();
    e.close(None).unwrap();
    wrapped.free().map_err(|(_, e)| e).unwrap();
    // The caller's release, in order; the wrapped allocation did not do it.
    // SAFETY: our mapping, handle and range, no longer used by anyone.
    unsafe {
        use sys::CUresult::CUDA_SUCCESS;
        assert_eq!(sys::cuMemUnmap(mine.va, SIZE as usize), CUDA_SUCCESS);
        assert_eq!(sys::cuMemRelease(mine.handle), CUDA_SUCCESS);
        assert_eq!(sys::cuMemAddressFree(mine.va, SIZE as usize), CUDA_SUCCESS);
    }
}

/// MNNVL with `host_register`: ordinary heap memory is pinned with CUDA at
/// its first MNNVL use, once for two engines registering the same buffer,
/// and unpinned when the last registration goes; with `host_register:
/// false` the pointer goes to the driver unpinned. The parent counts the
/// driver calls in the trace.
fn host_register() {
    let src = Source::start(MNNVL_FD, "mnnvl", 1, None);
    let a = src.addrs[0];
    let mut heap = vec![0u8; SIZE as usize];
    let p = heap.as_mut_ptr() as u64;
    let engines: Vec<(Engine, u64, u64)> = (0..2)
        .map(|_| {
            let e = Engine::from_json(MNNVL_FD).unwrap();
            let region = e.register_memory(p, SIZE, Access::NONE).unwrap();
            let peer = e.connect(&src.endpoint, None).unwrap();
            (e, region, peer)
        })
        .collect();
    let opts =
        SubmitOptions { transport: Transport::Only(TransportKind::Mnnvl), timeout: Some(Duration::from_secs(60)) };
    for (e, _, peer) in &engines {
        heap.iter_mut().for_each(|b| *b = 0);
        let b = e.submit(*peer, &[rd(p, a, SIZE)], opts).unwrap();
        b.wait(Duration::from_secs(60)).unwrap();
        assert!(heap.iter().enumerate().all(|(i, v)| *v == pattern(1, i as u64)), "READ into heap memory");
    }
    // WRITE from heap memory (shifted 4 KiB so that the source changes).
    let (e0, _, peer0) = &engines[0];
    let b = e0.submit(*peer0, &[wr(p, a + 4096, MIB)], opts).unwrap();
    b.wait(Duration::from_secs(60)).unwrap();
    let mut src = src;
    assert_eq!(src.cmd(&format!("verify 0 1 4096 {MIB}")), "ok");
    // One pin for both registrations: the buffer's pages (it need not be
    // page-aligned, so one page more than its length may be pinned).
    let (ranges, bytes) = orbite::cuda::host_pin::pinned();
    assert_eq!(ranges, 1);
    assert!((SIZE..=SIZE + 65536).contains(&bytes), "{bytes}");
    engines[0].0.unregister_memory(engines[0].1, None).unwrap();
    assert_eq!(orbite::cuda::host_pin::pinned(), (1, bytes), "still registered in the other engine");
    engines[1].0.unregister_memory(engines[1].1, None).unwrap();
    assert_eq!(orbite::cuda::host_pin::pinned(), (0, 0), "the last registration unpinned it");
    // host_register false: no pin, the driver gets the pointer as it is.
    let cfg = r#"{"mnnvl": {"handle_type": "posix_fd", "host_register": false}}"#;
    let e = Engine::from_json(cfg).unwrap();
    e.register_memory(p, SIZE, Access::NONE).unwrap();
    let peer = e.connect(&src.endpoint, None).unwrap();
    e.submit(peer, &[rd(p, a, 4096)], opts).unwrap().wait(Duration::from_secs(60)).unwrap();
    assert_eq!(orbite::cuda::host_pin::pinned(), (0, 0));
}

/// MNNVL with `host_register`: shared host memory (the library's own
/// memfd pages, `allocate_shared_host`) is ordinary host memory to the
/// driver too: pinned at its first MNNVL use, whole pages, and unpinned
/// when its registration goes; a READ into it moves the source's bytes.
/// The parent counts the driver calls in the trace.
fn host_register_shared() {
    let src = Source::start(MNNVL_FD, "mnnvl", 1, None);
    let a = src.addrs[0];
    let shared = allocate_shared_host(SIZE).unwrap();
    let e = Engine::from_json(MNNVL_FD).unwrap();
    let region = e.register_memory(shared.addr(), SIZE, Access::NONE).unwrap();
    let peer = e.connect(&src.endpoint, None).unwrap();
    let opts =
        SubmitOptions { transport: Transport::Only(TransportKind::Mnnvl), timeout: Some(Duration::from_secs(60)) };
    let b = e.submit(peer, &[rd(shared.addr(), a, SIZE)], opts).unwrap();
    b.wait(Duration::from_secs(60)).unwrap();
    assert_eq!(b.results(), vec![res(Status::Ok, RemoteEffect::None)]);
    // SAFETY: the allocation maps SIZE bytes and the READ into them ended.
    let got = unsafe { std::slice::from_raw_parts(shared.addr() as *const u8, SIZE as usize) };
    assert!(got.iter().enumerate().all(|(i, v)| *v == pattern(1, i as u64)), "READ into shared host memory");
    assert_eq!(orbite::cuda::host_pin::pinned(), (1, SIZE), "the shared pages are pinned");
    e.unregister_memory(region, None).unwrap();
    assert_eq!(orbite::cuda::host_pin::pinned(), (0, 0), "its unregistration unpinned them");
    e.close(None).unwrap();
    shared.free().map_err(|(_, e)| e).unwrap();
}

/// The pin fails: nothing is posted, the request gets the driver's error
/// and the source exports nothing.
fn host_register_fails() {
    let mut src = Source::start(MNNVL_FD, "mnnvl", 1, None);
    let a = src.addrs[0];
    let heap = vec![0u8; 4096];
    let e = Engine::from_json(MNNVL_FD).unwrap();
    e.register_memory(heap.as_ptr() as u64, 4096, Access::NONE).unwrap();
    let peer = e.connect(&src.endpoint, None).unwrap();
    let b = e.submit(peer, &[rd(heap.as_ptr() as u64, a, 4096)], SubmitOptions::default()).unwrap();
    let _ = b.wait(Duration::from_secs(60));
    assert_eq!(b.results(), vec![res(Status::ResourceExhausted, RemoteEffect::None)]);
    assert_eq!(src.ipc("mnnvl", "exports_open"), 0);
}

/// A driver exporting `cuMemHostRegister_v2` but not `cuMemHostUnregister`
/// (the stand-in built without it): host memory is never pinned, since
/// the pin could never be released; an MNNVL READ into heap memory is
/// refused NOT_SUPPORTED naming both symbols, nothing is posted and the
/// source exports nothing.
fn host_register_without_unregister() {
    let mut src = Source::start(MNNVL_FD, "mnnvl", 1, None);
    let a = src.addrs[0];
    let heap = vec![0u8; 4096];
    let e = Engine::from_json(MNNVL_FD).unwrap();
    e.register_memory(heap.as_ptr() as u64, 4096, Access::NONE).unwrap();
    let peer = e.connect(&src.endpoint, None).unwrap();
    let opts =
        SubmitOptions { transport: Transport::Only(TransportKind::Mnnvl), timeout: Some(Duration::from_secs(60)) };
    let b = e.submit(peer, &[rd(heap.as_ptr() as u64, a, 4096)], opts).unwrap();
    let _ = b.wait(Duration::from_secs(60));
    assert_eq!(b.results(), vec![res(Status::NotSupported, RemoteEffect::None)]);
    let why = b.error(0).expect("the request's error");
    assert!(why.message().contains("does not export cuMemHostRegister_v2/cuMemHostUnregister"), "{why}");
    assert_eq!(orbite::cuda::host_pin::pinned(), (0, 0), "nothing pinned");
    assert_eq!(src.ipc("mnnvl", "exports_open"), 0);
}

const DOMAIN_A: &str = "0123456789abcdef0123456789abcdef";

fn fabric_config(domain: &str) -> String {
    format!(r#"{{"mnnvl": {{"handle_type": "fabric", "fabric_domain": "{domain}"}}, "nvlink_cache_entries": 2}}"#)
}

/// MNNVL with fabric handles and one fabric domain: the IPC protocol runs
/// over a TCP connection to the source's endpoint (what peers on other
/// hosts of the NVLink partition use), with the domain and epochs checked
/// instead of the kernel's process identity. READ and WRITE, a cached
/// import, a flush with its receipts, and refusals of a foreign domain.
fn fabric_channel() {
    use orbite::control::frame::MsgKind;
    use orbite::control::Identity;
    use orbite::transport::ipc::channel::Channel;
    use orbite::transport::ipc::messages::{decode_reject, Hello};
    let mut src = Source::start(&fabric_config(DOMAIN_A), "mnnvl", 1, None);
    let a = src.addrs[0];
    let r = Req::new(&fabric_config(DOMAIN_A), &src.endpoint, TransportKind::Mnnvl);
    assert_eq!(r.go(&[rd(r.l(0), a, SIZE)]), vec![res(Status::Ok, RemoteEffect::None)]);
    assert!(r.holds(0, 0, SIZE, 1, 0));
    let off = MIB + 4096;
    assert_eq!(r.go(&[wr(r.l(0), a + off, MIB)]), vec![res(Status::Ok, RemoteEffect::Applied)]);
    assert_eq!(src.cmd(&format!("verify 0 1 {off} {MIB}")), "ok");
    let st: serde_json::Value = serde_json::from_str(&src.cmd("stats")).unwrap();
    assert_eq!(st["fabric_channels_accepted"], 1, "{st}");
    assert_eq!(st["ipc"]["mnnvl"]["exports_open"], 1, "cached");
    r.e.flush_nvlink_cache(Some(Duration::from_secs(60))).unwrap();
    assert_eq!(src.ipc("mnnvl", "exports_open"), 0, "the close receipt came over TCP");

    // Another domain: no link at all, with the reason.
    let other = Req::new(&fabric_config("fedcba9876543210fedcba9876543210"), &src.endpoint, TransportKind::Mnnvl);
    let opts = SubmitOptions { transport: Transport::Only(TransportKind::Mnnvl), timeout: None };
    let e = other.e.submit(other.peer, &[rd(other.l(0), a, 16)], opts).err().expect("another domain");
    assert_eq!(e.status(), Status::Unavailable, "{e}");
    assert!(e.message().contains("another fabric domain"), "{e}");
    // A hand-made fabric channel with a foreign domain is refused.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut ch = Channel::connect_tcp(&src.endpoint, deadline).unwrap();
    let hello = Hello {
        identity: Identity::fresh().unwrap(),
        expected_source_epoch: 0,
        transport: TransportKind::Mnnvl as u32,
        fabric_domain: [9; 16],
    };
    let f = ch.call(MsgKind::IpcHello, &hello.encode(), deadline, "hello").unwrap();
    assert_eq!(f.kind, MsgKind::ExportReject);
    assert_eq!(decode_reject(&f.body).unwrap().1.status(), Status::PermissionDenied);
}

/// A fabric config with a shared key (a file of this process's own).
fn keyed_fabric_config(name: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("orbite-fabric-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("key");
    std::fs::write(&key, [0x33; 40]).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let plain = fabric_config(DOMAIN_A);
    format!(r#"{{"auth_key_file": "{}", {}"#, key.display(), &plain[1..])
}

/// With a shared key, the control connection and the fabric channel
/// beside it (the IPC protocol over TCP) are both sealed after the key's
/// proof, and both carry the transfer.
fn fabric_channel_keyed() {
    let config = keyed_fabric_config("keyed");
    let mut src = Source::start(&config, "mnnvl", 1, None);
    let a = src.addrs[0];
    let r = Req::new(&config, &src.endpoint, TransportKind::Mnnvl);
    assert_eq!(r.go(&[rd(r.l(0), a, SIZE)]), vec![res(Status::Ok, RemoteEffect::None)]);
    let off = 3 * 4096;
    assert_eq!(r.go(&[wr(r.l(0), a + off, MIB)]), vec![res(Status::Ok, RemoteEffect::Applied)]);
    assert_eq!(src.cmd(&format!("verify 0 1 {off} {MIB}")), "ok");
    let st: serde_json::Value = serde_json::from_str(&src.cmd("stats")).unwrap();
    assert_eq!(st["fabric_channels_accepted"], 1, "{st}");
    assert_eq!(st["auth_failures"], 0, "{st}");
}

/// A process without the key in the middle of a keyed pair's connections
/// (every one: the control connection and the fabric channel) passes the
/// proofs through; what it leaves unchanged serves a READ, but one bit it
/// flips in the next answer on the fabric channel (the offer of another
/// allocation's export) ends that channel at the requester's record check:
/// the READ fails PERMISSION_DENIED, nothing of the changed offer is acted
/// on. (A plain fabric channel hands the changed offer to the requester,
/// which then fails otherwise, or not at all.)
fn fabric_channel_relayed() {
    let config = keyed_fabric_config("relayed");
    let src = Source::start(&config, "mnnvl", 2, None);
    let relay = common::relay::Relay::to(&src.endpoint);
    let r = Req::new(&config, &relay.endpoint(), TransportKind::Mnnvl);
    assert_eq!(r.go(&[rd(r.l(0), src.addrs[0], SIZE)]), vec![res(Status::Ok, RemoteEffect::None)]);
    assert!(r.holds(0, 0, SIZE, 1, 0));
    assert_eq!(relay.legs(), 2, "the control connection and the fabric channel both came through the relay");
    relay.leg(1).flip_down_ahead(20);
    let got = r.go(&[rd(r.l(1), src.addrs[1], 4096)]);
    assert_eq!(got[0].status, Status::PermissionDenied, "{got:?}");
}

/// A plain fabric channel through a relay that changes one bit of the
/// first offer: the grant's physical extent says 20 MiB where the source's
/// allocation (and the handle that follows, unchanged) has 4 MiB. The
/// requester refuses the handle as a protocol error before it maps
/// anything: an import of fewer bytes than the grant would leave copies
/// the grant allows past the end of what was mapped.
fn fabric_handle_smaller_than_its_grant() {
    let config = fabric_config(DOMAIN_A);
    let src = Source::start(&config, "mnnvl", 1, None);
    let relay = common::relay::Relay::to(&src.endpoint);
    let r = Req::new(&config, &relay.endpoint(), TransportKind::Mnnvl);
    // The connect opened the fabric channel and ran its probe exchange to
    // the end; the next frame down it is the offer of the READ below: its
    // header, then `physical` at byte 32 of the body. The low bit of its
    // byte 3 turns 0x0040_0000 (4 MiB) into 0x0140_0000.
    assert_eq!(relay.legs(), 2, "the control connection and the fabric channel both came through the relay");
    const PHYSICAL_BYTE_3: u64 = 16 + 32 + 3;
    relay.leg(1).flip_down_ahead(PHYSICAL_BYTE_3);
    let opts =
        SubmitOptions { transport: Transport::Only(TransportKind::Mnnvl), timeout: Some(Duration::from_secs(60)) };
    let b = r.e.submit(r.peer, &[rd(r.l(0), src.addrs[0], 4096)], opts).unwrap();
    let _ = b.wait(Duration::from_secs(120));
    let err = b.error(0).expect("the READ failed");
    assert_eq!(err.status(), Status::ProtocolError, "{err}");
    assert!(err.message().contains(&format!("MNNVL handle says {SIZE} bytes, the grant {}", 20 * MIB)), "{err}");
    assert_eq!(r.ipc().imports.retained, 0, "nothing mapped stays");
}

/// Local EGM memory is copied on the GPU attached to its NUMA node (the
/// stand-in attaches node d to device d; the parent counts the copies per
/// device); mixed nodes in one group and a node without a GPU are refused.
fn egm_placement() {
    let src = Source::start(MNNVL_FD, "mnnvl", 1, None);
    let a = src.addrs[0];
    let e = Engine::from_json(MNNVL_FD).unwrap();
    let egm: Vec<Allocation> = [1, 0].iter().map(|n| allocate_egm(*n, SIZE).unwrap()).collect();
    for m in &egm {
        e.register_memory(m.addr(), SIZE, Access::NONE).unwrap();
    }
    let peer = e.connect(&src.endpoint, None).unwrap();
    let opts =
        SubmitOptions { transport: Transport::Only(TransportKind::Mnnvl), timeout: Some(Duration::from_secs(60)) };
    for m in &egm {
        let b = e.submit(peer, &[rd(m.addr(), a, SIZE)], opts).unwrap();
        b.wait(Duration::from_secs(60)).unwrap();
        // The local EGM mapping is CPU-accessible.
        // SAFETY: the allocation maps SIZE bytes readable by the CPU.
        let bytes = unsafe { std::slice::from_raw_parts(m.addr() as *const u8, SIZE as usize) };
        assert!(bytes.iter().enumerate().all(|(i, v)| *v == pattern(1, i as u64)));
    }
    // Local memory of two GPUs in one submission: two groups, each copied
    // by its own GPU.
    let mixed = [rd(egm[0].addr(), a + 4096, 4096), rd(egm[1].addr(), a + 8192, 4096)];
    let b = e.submit(peer, &mixed, opts).unwrap();
    b.wait(Duration::from_secs(60)).unwrap();
    assert!(b.results().iter().all(|r| r.status == Status::Ok), "{:?}", b.results());
    for (m, off) in egm.iter().zip([4096u64, 8192]) {
        // SAFETY: as above.
        let bytes = unsafe { std::slice::from_raw_parts(m.addr() as *const u8, 4096) };
        assert!(bytes.iter().enumerate().all(|(i, v)| *v == pattern(1, off + i as u64)));
    }
    let st = e.stats().ipc["mnnvl"].clone();
    assert_eq!(st.imports.retained, 0);
    let by_device: Vec<(i32, u64, u64)> = st.copies_by_device.iter().map(|(d, c)| (*d, c.copies, c.bytes)).collect();
    assert_eq!(by_device, vec![(0, 2, SIZE + 4096), (1, 2, SIZE + 4096)], "{st:?}");
    // Node 5 has no GPU here: that owner cannot be selected.
    let far = allocate_egm(5, SIZE).unwrap();
    e.register_memory(far.addr(), SIZE, Access::NONE).unwrap();
    let err = e.submit(peer, &[rd(far.addr(), a, 16)], opts).err().expect("no GPU at node 5");
    assert_eq!(err.status(), Status::NotSupported, "{err}");
    assert!(err.message().contains("NUMA node"), "{err}");
}

/// A group copying into local pinned host memory holds the whole pinned
/// allocation; when its completion is uncertain (every event query fails)
/// the allocation stays fenced: later GPU groups wait within their deadline
/// and are refused, CPU (TCP) access is refused at once, and it cannot be
/// freed. Another pinned allocation is unaffected by the fence.
fn pinned_fence() {
    let (_src, a) = nvlink_source(None);
    let e = Engine::from_json(NVLINK).unwrap();
    let pinned = allocate_pinned_host(SIZE).unwrap();
    e.register_memory(pinned.addr(), SIZE, Access::NONE).unwrap();
    let peer = e.connect(&_src.endpoint, None).unwrap();
    let nv = |t: u64| SubmitOptions {
        transport: Transport::Only(TransportKind::Nvlink),
        timeout: Some(Duration::from_millis(t)),
    };
    let run = |reqs: &[Request], o: SubmitOptions| {
        let b = e.submit(peer, reqs, o).unwrap();
        let _ = b.wait(Duration::from_secs(120));
        b.results()
    };
    assert_eq!(run(&[rd(pinned.addr(), a, SIZE)], nv(60_000)), vec![res(Status::Unquiesced, RemoteEffect::None)]);
    assert_eq!(e.stats().ipc["nvlink"].imports.fenced_local, 1);
    let all: serde_json::Value = serde_json::from_str(&retained_resources_json()).unwrap();
    assert_eq!(all["engines"][e.endpoint()]["nvlink"]["fenced_local_owners"], 1, "{all}");
    // Another GPU group waits for the fence within its deadline, then fails.
    let later = run(&[rd(pinned.addr() + 4096, a, 4096)], nv(300));
    assert_eq!(later[0].status, Status::Unavailable, "{later:?}");
    // CPU access (TCP from a host region of another engine) is refused at once.
    let host_src = Engine::from_json("{}").unwrap();
    let mut heap = vec![5u8; 4096];
    host_src.register_memory(heap.as_mut_ptr() as u64, 4096, Access::READ).unwrap();
    let tcp_peer = e.connect(&host_src.endpoint(), None).unwrap();
    let tcp = SubmitOptions { transport: Transport::Only(TransportKind::Tcp), timeout: None };
    let b = e.submit(tcp_peer, &[rd(pinned.addr(), heap.as_ptr() as u64, 4096)], tcp).unwrap();
    let _ = b.wait(Duration::from_secs(60));
    assert_eq!(b.results()[0].status, Status::Unavailable);
    // The fenced allocation cannot be freed.
    let (_kept, err) = pinned.free().expect_err("fenced allocations are not freed");
    assert_eq!(err.status(), Status::Unavailable, "{err}");
    // An unfenced pinned allocation still serves TCP.
    let other = allocate_pinned_host(4096).unwrap();
    e.register_memory(other.addr(), 4096, Access::NONE).unwrap();
    let b = e.submit(tcp_peer, &[rd(other.addr(), heap.as_ptr() as u64, 4096)], tcp).unwrap();
    b.wait(Duration::from_secs(60)).unwrap();
    // SAFETY: pinned host memory of 4096 bytes, CPU-accessible.
    assert_eq!(unsafe { *(other.addr() as *const u8) }, 5);
}

/// A clean life cycle returns the driver to its baseline: NVLink and MNNVL
/// transfers through cached imports, a flush, the engine closed and
/// dropped, the local buffers unregistered and freed. The parent checks the
/// stand-in's live-resource counts at exit and the open/close pairing.
fn clean_baseline() {
    let (mut nv_src, a) = {
        let s = Source::start(NVLINK_CACHED, "ipc", 1, None);
        let a = s.addrs[0];
        (s, a)
    };
    let cached_mnnvl = r#"{"mnnvl": {"handle_type": "posix_fd"}, "nvlink_cache_entries": 2}"#;
    let mut m_src = Source::start(cached_mnnvl, "mnnvl", 1, None);
    let b = m_src.addrs[0];
    for (cfg, ep, t, remote) in [
        (NVLINK_CACHED, nv_src.endpoint.clone(), TransportKind::Nvlink, a),
        (cached_mnnvl, m_src.endpoint.clone(), TransportKind::Mnnvl, b),
    ] {
        let r = Req::new(cfg, &ep, t);
        assert_eq!(r.go(&[rd(r.l(0), remote, SIZE)]), vec![res(Status::Ok, RemoteEffect::None)]);
        assert_eq!(r.go(&[wr(r.l(1), remote, MIB)]), vec![res(Status::Ok, RemoteEffect::Applied)]);
        assert_eq!(r.go(&[rd(r.l(0), remote, 4096), rd(r.l(0) + MIB, remote + MIB, MIB)]).len(), 2);
        r.e.flush_nvlink_cache(Some(Duration::from_secs(60))).unwrap();
        r.e.close(Some(Duration::from_secs(60))).unwrap();
        let Req { e, local, regions, .. } = r;
        for id in regions {
            let _ = e.unregister_memory(id, None);
        }
        drop(e);
        for l in local {
            l.free().map_err(|(_, e)| e).unwrap();
        }
    }
    assert_eq!(nv_src.ipc("nvlink", "exports_open"), 0);
    assert_eq!(m_src.ipc("mnnvl", "exports_open"), 0);
}

/// Peers that die, over NVLink: a long-lived requester with a relocation
/// cache reads from six source processes in turn, each killed (SIGKILL)
/// with the requester's cached import of its memory still open. Each dead
/// source's import is closed natively and released without a receipt (no
/// export is left to owe one), never retained, and the cache keeps serving:
/// a live source afterwards is read through a fresh cached import, and the
/// requester closes OK with nothing left behind.
fn crashed_nvlink_sources() {
    let r = Req::new(NVLINK_CACHED, &Source::start(NVLINK_CACHED, "ipc", 1, None).endpoint, TransportKind::Nvlink);
    for round in 0..6u64 {
        let src = Source::start(NVLINK_CACHED, "ipc", 1, None);
        let a = src.addrs[0];
        let peer = r.e.connect(&src.endpoint, None).unwrap();
        let opts =
            SubmitOptions { transport: Transport::Only(TransportKind::Nvlink), timeout: Some(Duration::from_secs(60)) };
        let b = r.e.submit(peer, &[rd(r.l(0), a, SIZE)], opts).unwrap();
        b.wait(Duration::from_secs(60)).unwrap();
        assert!(r.holds(0, 0, SIZE, 1, 0), "round {round}");
        drop(src); // SIGKILL, its import still cached here
    }
    let mut live = Source::start(NVLINK_CACHED, "ipc", 1, None);
    let peer = r.e.connect(&live.endpoint, None).unwrap();
    let opts =
        SubmitOptions { transport: Transport::Only(TransportKind::Nvlink), timeout: Some(Duration::from_secs(60)) };
    let b = r.e.submit(peer, &[rd(r.l(1), live.addrs[0], SIZE)], opts).unwrap();
    b.wait(Duration::from_secs(60)).unwrap();
    assert!(r.holds(1, 0, SIZE, 1, 0));
    let st = r.ipc();
    assert_eq!(
        (st.imports.opened, st.imports.released_after_exit, st.imports.retained, st.imports.cached),
        (7, 6, 0, 1),
        "{st:?}"
    );
    r.e.close(Some(Duration::from_secs(60))).unwrap();
    assert_eq!(live.ipc("nvlink", "exports_open"), 0);
}

/// A hostile requester's READ and WRITE of a source's device memory (a
/// `cuMemAlloc` allocation) and fabric memory (an MNNVL allocation) over
/// TCP, sent by hand (an engine never plans TCP for them): each is
/// refused NOT_SUPPORTED naming the memory's kind, and the source lives
/// on with its bytes unchanged. The stand-in's device and fabric memory
/// is a `PROT_NONE` reservation, as a GPU pointer is to the CPU: a CPU
/// copy from it kills the source. Guards `transport/tcp/source.rs`
/// `validate`'s `if !r.kind.cpu_accessible()` for READs (with
/// `&& write` the source served the READ by a memcpy and died).
fn tcp_refuses_device_and_fabric_memory() {
    use orbite::control::frame::{FrameHeader, MsgKind, FRAME_HEADER_LEN};
    use orbite::control::message::{DataRequest, DataResponse, DATA_REQUEST_LEN, DATA_RESPONSE_LEN};
    use std::io::{Read, Write};
    for (config, kind) in [(NVLINK, "ipc"), (MNNVL_FD, "mnnvl")] {
        let mut src = Source::start(config, kind, 1, None);
        let a = src.addrs[0];
        let (mut s, d) = common::raw_control(&src.endpoint);
        let r = *d.regions.iter().find(|r| r.addr == a).expect("the region is published");
        assert!(!r.kind.cpu_accessible(), "{kind}: {:?}", r.kind);
        for (tag, ask, answer, payload) in [
            (1, MsgKind::ReadRequest, MsgKind::ReadResponse, 0),
            (2, MsgKind::WriteRequest, MsgKind::WriteResponse, 4096),
        ] {
            let mut f = FrameHeader::encode(ask, (DATA_REQUEST_LEN + payload) as u32).to_vec();
            f.extend_from_slice(&DataRequest { tag, region_epoch: r.epoch, addr: a, len: 4096 }.encode());
            f.resize(f.len() + payload, 0x5a);
            s.write_all(&f).unwrap();
            let mut h = [0u8; FRAME_HEADER_LEN];
            s.read_exact(&mut h).unwrap_or_else(|e| panic!("{kind} {ask:?}: no answer, the source died? {e}"));
            let h = FrameHeader::decode(&h).unwrap();
            let mut body = vec![0u8; h.body_len as usize];
            s.read_exact(&mut body).unwrap();
            assert_eq!(h.kind, answer, "{kind}");
            let resp = DataResponse::decode(body[..DATA_RESPONSE_LEN].try_into().unwrap()).unwrap();
            assert_eq!((resp.tag, resp.status), (tag, Status::NotSupported), "{kind} {ask:?}");
            let why = String::from_utf8_lossy(&body[DATA_RESPONSE_LEN..]).to_string();
            let says = format!("holds {} memory, which the TCP transport cannot copy", r.kind.name());
            assert!(why.contains(&says), "{kind} {ask:?}: {why}");
        }
        assert_eq!(src.cmd(&format!("verify 0 1 0 {SIZE}")), "ok", "{kind}: the source's bytes");
        drop(s);
        src.exit();
    }
}

/// Runs in a child process; does nothing when run directly.
#[test]
fn child_case() {
    let Some(case) = child_case_name() else { return };
    match case.as_str() {
        "close-fails" => close_fails(),
        "crashed-nvlink-sources" => crashed_nvlink_sources(),
        "query-fails" => query_fails(),
        "drain-fails" => drain_fails(),
        "batch-enqueue-fails" => batch_enqueue_fails(),
        "enqueue-and-drain-fail" => enqueue_and_drain_fail(),
        "open-fails" => open_fails(),
        "source-export-fails" => source_export_fails(),
        "stream-create-fails" => stream_create_fails(),
        "mnnvl-unmap-fails" => mnnvl_unmap_fails(),
        "mnnvl-cached" => mnnvl_cached_and_release_refused(),
        "egm" => egm_needs_both_opt_ins(),
        "lazy-progress" => lazy_progress(),
        "deadline-pending" => deadline_with_a_pending_event(),
        "same-process" => same_process_and_pageable_refused(),
        "small-copies" => small_copies(),
        "producer" => producer_stream_is_consumed(),
        "wrap" => wrapped_vmm_storage(),
        "host-register" => host_register(),
        "host-register-shared" => host_register_shared(),
        "host-register-fails" => host_register_fails(),
        "host-register-without-unregister" => host_register_without_unregister(),
        "fabric-channel" => fabric_channel(),
        "fabric-channel-keyed" => fabric_channel_keyed(),
        "fabric-channel-relayed" => fabric_channel_relayed(),
        "fabric-handle-smaller" => fabric_handle_smaller_than_its_grant(),
        "egm-placement" => egm_placement(),
        "pinned-fence" => pinned_fence(),
        "baseline" => clean_baseline(),
        "tcp-device-memory" => tcp_refuses_device_and_fabric_memory(),
        other => panic!("unknown case {other}"),
    }
    println!("child case passed");
}

#[test]
fn failed_ipc_close_is_unquiesced_and_retained() {
    run("close-fails", &[("FAKECUDA_FAIL", "cuIpcCloseMemHandle:1:999")]);
}

#[test]
fn failed_event_query_quarantines_the_stream_and_retains_the_import() {
    run("query-fails", &[("FAKECUDA_FAIL", "cuEventQuery:1+:700")]);
}

#[test]
fn failed_drain_after_a_synchronous_copy_is_unquiesced() {
    run("drain-fails", &[("FAKECUDA_FAIL", "cuStreamSynchronize:1:999")]);
}

#[test]
fn failed_native_batch_enqueue_attempts_every_descriptor_and_replays_nothing() {
    run("batch-enqueue-fails", &[("FAKECUDA_FAIL", "cuMemcpyBatchAsync_v2:1:1")]);
}

#[test]
fn failed_enqueue_and_failed_drain_quarantine_the_stream() {
    run("enqueue-and-drain-fail", &[("FAKECUDA_FAIL", "cuMemcpyAsync:1:999,cuStreamSynchronize:1:999")]);
}

#[test]
fn failed_import_open_releases_the_export() {
    run("open-fails", &[("FAKECUDA_FAIL", "cuIpcOpenMemHandle_v2:1:205")]);
}

#[test]
fn failed_source_export_releases_the_offer() {
    run("source-export-fails", &[]);
}

#[test]
fn failed_stream_creation_refuses_the_copy_without_retention() {
    run("stream-create-fails", &[("FAKECUDA_FAIL", "cuStreamCreate:1+:2")]);
}

#[test]
fn failed_mnnvl_unmap_is_unquiesced_and_retained() {
    run("mnnvl-unmap-fails", &[("FAKECUDA_FAIL", "cuMemUnmap:1:999")]);
}

#[test]
fn mnnvl_cached_import_serves_reads_and_writes() {
    run("mnnvl-cached", &[]);
}

#[test]
fn egm_memory_is_served_only_with_both_opt_ins() {
    run("egm", &[]);
}

#[test]
fn slow_copies_complete_on_the_lazy_progress_worker() {
    run("lazy-progress", &[("FAKECUDA_COPY_DELAY_US", "300000")]);
}

#[test]
fn a_deadline_passing_with_the_event_pending_is_reported_then_closed_when_it_completes() {
    run("deadline-pending", &[("FAKECUDA_COPY_DELAY_US", "3000000")]);
}

#[test]
fn nvlink_refuses_the_same_process_and_pageable_memory() {
    run("same-process", &[]);
}

#[test]
fn small_nvlink_copies_go_synchronously_and_mnnvl_copies_always_async() {
    let t = run_traced("small-copies", &[]);
    // Only the requester is traced (sources do not inherit FAKECUDA_*).
    assert_eq!(t.iter().map(|(pid, _, _)| *pid).collect::<std::collections::BTreeSet<_>>().len(), 1, "{t:?}");
    // NVLink: one copy on a leased non-blocking stream, drained at once
    // (never the legacy stream or a context synchronisation, which would
    // wait for the application's streams), no event; MNNVL: one async copy
    // on a stream of its own transport's pool with one trailing event,
    // queried once (or more, lazily). Besides the copies: the MNNVL
    // engine's probe allocation, zeroed at its start on a stream of its
    // own (one create, one synchronize) and unmapped at its end.
    assert_eq!(fakecuda::calls(&t, "cuMemcpy"), 0, "{t:?}");
    assert_eq!(fakecuda::calls(&t, "cuCtxSynchronize"), 0, "{t:?}");
    assert_eq!(fakecuda::calls(&t, "cuStreamSynchronize"), 1 + 1, "{t:?}");
    assert_eq!(fakecuda::calls(&t, "cuMemcpyAsync"), 2, "{t:?}");
    assert_eq!(fakecuda::calls(&t, "cuMemcpyBatchAsync_v2"), 0, "{t:?}");
    assert_eq!(fakecuda::calls(&t, "cuStreamCreate"), 2 + 1, "one per transport's pool, the probe's: {t:?}");
    assert_eq!(fakecuda::calls(&t, "cuEventRecord"), 1, "{t:?}");
    assert!(fakecuda::calls(&t, "cuEventQuery") >= 1, "{t:?}");
    assert_eq!(fakecuda::calls(&t, "cuIpcCloseMemHandle"), 1, "{t:?}");
    assert_eq!(fakecuda::calls(&t, "cuMemUnmap"), 1 + 1, "{t:?}");
}

#[test]
fn a_recorded_producer_stream_is_waited_for_before_the_copy() {
    run("producer", &[("FAKECUDA_COPY_DELAY_US", "100000")]);
}

#[test]
fn wrapped_vmm_storage_is_checked_then_served_over_fabric_handles() {
    run("wrap", &[]);
}

#[test]
fn mnnvl_pins_ordinary_host_memory_once_per_pages_until_the_last_registration() {
    let t = run_traced("host-register", &[]);
    assert_eq!(fakecuda::calls(&t, "cuMemHostRegister_v2"), 1, "{t:?}");
    assert_eq!(fakecuda::calls(&t, "cuMemHostUnregister"), 1, "{t:?}");
}

/// Guards `matches!(r.kind, MemoryKind::Host | MemoryKind::SharedHost)`
/// in `prepare_local` (round 10 J12: with `Host` alone a copy between
/// fabric memory and an `orbite_host_allocate_shared` region ran from
/// unpinned pages).
#[test]
fn mnnvl_pins_shared_host_memory_too_until_its_registration_goes() {
    let t = run_traced("host-register-shared", &[]);
    assert_eq!(fakecuda::calls(&t, "cuMemHostRegister_v2"), 1, "{t:?}");
    assert_eq!(fakecuda::calls(&t, "cuMemHostUnregister"), 1, "{t:?}");
}

#[test]
fn a_failed_host_pin_posts_nothing() {
    run("host-register-fails", &[("FAKECUDA_FAIL", "cuMemHostRegister_v2:1:2")]);
}

/// Guards `cuda/host_pin.rs` `pin`'s `|| !has_symbol("cuMemHostUnregister")`
/// (round 13 M20): with only `cuMemHostRegister_v2` checked, the pin is
/// made, the READ succeeds, and the pin's release calls a missing symbol.
#[test]
fn a_driver_without_cu_mem_host_unregister_never_pins() {
    run_as("host-register-without-unregister", fakecuda::Variant::NoHostUnregister, &[]);
}

#[test]
fn fabric_handles_with_a_fabric_domain_run_the_protocol_over_tcp() {
    run("fabric-channel", &[]);
}

#[test]
fn a_keyed_fabric_channel_runs_beside_a_sealed_control_connection() {
    run("fabric-channel-keyed", &[]);
}

#[test]
fn a_relay_that_changes_a_keyed_fabric_channel_gets_permission_denied() {
    run("fabric-channel-relayed", &[]);
}

/// Guards `if w.physical != physical` in
/// `transport/ipc/backends/mnnvl.rs`'s import (round 11 K10: with `>` a
/// handle claiming fewer bytes than its grant was mapped).
#[test]
fn an_mnnvl_handle_smaller_than_its_grant_is_a_protocol_error() {
    run("fabric-handle-smaller", &[]);
}

#[test]
fn local_egm_memory_is_copied_on_the_gpu_of_its_numa_node() {
    let t = run_traced("egm-placement", &[("FAKECUDA_DEVICES", "2")]);
    // A 4 MiB READ and a 4 KiB one into node 1's memory on device 1, the
    // same into node 0's on device 0 (the mixed submission split in two).
    assert_eq!(fakecuda::calls(&t, "copies@device1"), 2, "{t:?}");
    assert_eq!(fakecuda::calls(&t, "copies@device0"), 2, "{t:?}");
}

#[test]
fn an_uncertain_group_fences_its_local_pinned_allocation() {
    // 999 (UNKNOWN) is not sticky: the context stays usable for the later
    // allocations of the case, as it would on a GPU.
    run("pinned-fence", &[("FAKECUDA_FAIL", "cuEventQuery:1+:999")]);
}

#[test]
fn a_clean_life_cycle_returns_the_driver_to_its_baseline() {
    let t = run_traced("baseline", &[]);
    // Exactly one traced process (the requester), with a complete report.
    let reports = fakecuda::live_reports(&t);
    assert_eq!(reports.len(), 1, "{t:?}");
    for report in reports.values() {
        for (what, n) in report {
            assert_eq!(*n, 0, "{what} left behind: {t:?}");
        }
    }
    // Every import opened was closed, every VMM import released, once: per
    // transport a READ-only import, given back for the writable one the
    // WRITE needs, which then serves the last READs. MNNVL adds the probe
    // import at connect (imported and released at once) and the engine's
    // own probe allocation (unmapped, released and its range freed at the
    // engine's end).
    assert_eq!(fakecuda::calls(&t, "cuIpcOpenMemHandle_v2"), 2, "{t:?}");
    assert_eq!(fakecuda::calls(&t, "cuIpcCloseMemHandle"), 2, "{t:?}");
    assert_eq!(fakecuda::calls(&t, "cuMemImportFromShareableHandle"), 2 + 1, "{t:?}");
    assert_eq!(fakecuda::calls(&t, "cuMemRelease"), 2 + 1 + 1, "{t:?}");
    assert_eq!(fakecuda::calls(&t, "cuMemUnmap"), 2 + 1, "{t:?}");
    assert_eq!(fakecuda::calls(&t, "cuMemAddressFree"), 2 + 1, "{t:?}");
    assert_eq!(fakecuda::calls(&t, "cuStreamCreate"), fakecuda::calls(&t, "cuStreamDestroy_v2"), "{t:?}");
    assert_eq!(fakecuda::calls(&t, "cuEventCreate"), fakecuda::calls(&t, "cuEventDestroy_v2"), "{t:?}");
}

#[test]
fn a_long_lived_nvlink_requester_outlives_six_crashed_sources() {
    let t = run_traced("crashed-nvlink-sources", &[]);
    // Every import opened was closed natively, once.
    assert_eq!(fakecuda::calls(&t, "cuIpcOpenMemHandle_v2"), 7, "{t:?}");
    assert_eq!(fakecuda::calls(&t, "cuIpcCloseMemHandle"), 7, "{t:?}");
}

#[test]
fn tcp_refuses_a_hostile_requesters_read_of_device_or_fabric_memory() {
    run("tcp-device-memory", &[]);
}
