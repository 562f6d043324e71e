//! Submissions and batches.

use super::boundary::*;
use super::handles::{give_out, live, take_back};
use super::types::*;
use crate::{Error, Op, Request, RequestResult, Result, Status, SubmitOptions, Transport, TransportKind, MAX_REQUESTS};
use std::ffi::{c_char, c_void};
use std::time::Duration;

pub(crate) fn transport_from(v: u32) -> Option<Transport> {
    match v {
        ORBITE_TRANSPORT_AUTO => Some(Transport::Auto),
        v => TransportKind::from_c_code(v).map(Transport::Only),
    }
}

/// Submits `count` requests to `peer`. Local checks fail the call; remote
/// outcomes are per request. opts may be NULL (defaults). Returns once the
/// requests are admitted; data moves asynchronously. `requests` is read
/// during the call only, in place: it must not change until the call
/// returns (the engine keeps no pointer to it). An array not aligned as
/// `orbite_request` is refused INVALID_ARGUMENT.
#[no_mangle]
pub extern "C" fn orbite_submit(
    engine: *mut orbite_engine,
    peer: u64,
    requests: *const orbite_request,
    count: usize,
    opts: *const orbite_submit_options,
    out_batch: *mut *mut orbite_batch,
) -> orbite_status {
    guard(|| {
        let e = live(engine, "engine")?;
        let out_batch = need_mut(out_batch, "out_batch")?;
        let (reqs, o) = submission(requests, count, opts)?;
        let batch = e.engine.submit(peer, reqs, o)?;
        *out_batch = give_out(orbite_batch { batch });
        Ok(())
    })
}

/// One C request as the engine's, its opcode checked (`name` names it in
/// the error; it is built only then: a submission converts 10^5 requests).
pub(crate) fn request_of(r: &orbite_request, name: impl FnOnce() -> String) -> Result<Request> {
    let op = match r.opcode {
        ORBITE_OP_READ => Op::Read,
        ORBITE_OP_WRITE => Op::Write,
        x => {
            return Err(Error::InvalidArgument(format!(
                "{}.opcode is {x} (use ORBITE_OP_READ or ORBITE_OP_WRITE)",
                name()
            )))
        }
    };
    Ok(Request { op, local_addr: r.local_addr, remote_addr: r.remote_addr, len: r.length })
}

// `Request` is `orbite_request` once its opcode is checked: same size,
// alignment and field offsets, and `Op`'s values are the opcodes.
const _: () = {
    use std::mem::{align_of, offset_of, size_of};
    assert!(size_of::<Request>() == size_of::<orbite_request>());
    assert!(align_of::<Request>() == align_of::<orbite_request>());
    assert!(offset_of!(Request, op) == offset_of!(orbite_request, opcode));
    assert!(offset_of!(Request, local_addr) == offset_of!(orbite_request, local_addr));
    assert!(offset_of!(Request, remote_addr) == offset_of!(orbite_request, remote_addr));
    assert!(offset_of!(Request, len) == offset_of!(orbite_request, length));
    assert!(Op::Read as u32 == ORBITE_OP_READ && Op::Write as u32 == ORBITE_OP_WRITE);
};

/// The requests and options of a C submission, checked. The requests are
/// the caller's array itself, read in place once every opcode is checked
/// (one pass, no copy of 10^5 requests).
pub(crate) fn submission<'a>(
    requests: *const orbite_request,
    count: usize,
    opts: *const orbite_submit_options,
) -> Result<(&'a [Request], SubmitOptions)> {
    {
        if requests.is_null() {
            return Err(Error::NullArgument("requests is NULL".into()));
        }
        if count == 0 {
            return Err(Error::InvalidArgument("count is 0".into()));
        }
        if count > MAX_REQUESTS {
            return Err(Error::InvalidArgument(format!(
                "count is {count}; one submission carries at most {MAX_REQUESTS} requests"
            )));
        }
        aligned(requests, "requests")?;
        // SAFETY: non-NULL, aligned (checked just now), and the caller
        // promises `count` elements, left unchanged during the call.
        let raw = unsafe { std::slice::from_raw_parts(requests, count) };
        if let Some(i) = raw.iter().position(|r| !matches!(r.opcode, ORBITE_OP_READ | ORBITE_OP_WRITE)) {
            request_of(&raw[i], || format!("requests[{i}]"))?;
        }
        // SAFETY: `Request` has `orbite_request`'s layout (checked at
        // compile time above) and every opcode is a value of `Op` (checked
        // just now; the caller leaves the array unchanged during the call,
        // which the returned borrow does not outlive).
        let reqs = unsafe { std::slice::from_raw_parts(requests.cast::<Request>(), count) };
        let mut o = SubmitOptions::default();
        if !opts.is_null() {
            let raw = need(opts, "opts")?;
            o.transport = transport_from(raw.transport).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "opts->transport is {} (use an ORBITE_TRANSPORT_* value)",
                    raw.transport
                ))
            })?;
            o.timeout = timeout_opt(raw.timeout_ms);
        }
        Ok((reqs, o))
    }
}

/// OK, PENDING or TRANSFER_FAILED, without waiting. While the batch is
/// pending, the call may first copy one piece (64 KiB to 1 MiB) of a large
/// SHM copy the engine started, so that a caller polling in a loop lends
/// its thread to the copy instead of taking a core from it; or read, without
/// blocking, up to 256 KiB of answers waiting on the batch's TCP connection
/// (which may end requests of another batch of the same peer).
#[no_mangle]
pub extern "C" fn orbite_batch_poll(batch: *mut orbite_batch) -> orbite_status {
    guard_status(|| {
        let b = live(batch, "batch")?;
        let s = b.batch.poll();
        if s == Status::TransferFailed {
            return Err(b.batch.failure());
        }
        Ok(s)
    })
}

/// Waits up to timeout_ms: OK, TRANSFER_FAILED, or TIMED_OUT (still pending).
#[no_mangle]
pub extern "C" fn orbite_batch_wait(batch: *mut orbite_batch, timeout_ms: u32) -> orbite_status {
    guard(|| {
        let b = live(batch, "batch")?;
        b.batch.wait(Duration::from_millis(timeout_ms as u64))
    })
}

/// Copies the per-request outcomes; count must equal the request count and
/// `out` be aligned as `orbite_request_result` (INVALID_ARGUMENT otherwise).
#[no_mangle]
pub extern "C" fn orbite_batch_results(
    batch: *const orbite_batch,
    out: *mut orbite_request_result,
    count: usize,
) -> orbite_status {
    guard(|| {
        let b = live(batch, "batch")?;
        if out.is_null() {
            return Err(Error::NullArgument("out is NULL".into()));
        }
        aligned(out.cast_const(), "out")?;
        let results = b.batch.results();
        if count != results.len() {
            return Err(Error::InvalidArgument(format!(
                "count is {count} but the batch holds {} requests",
                results.len()
            )));
        }
        for (i, r) in results.iter().enumerate() {
            // SAFETY: out is non-NULL with `count` elements per the contract.
            unsafe { out.add(i).write(c_result(r)) };
        }
        Ok(())
    })
}

/// Writes the outcome of request `index`; OUT_OF_RANGE past the request
/// count. While the request is pending, the call may first copy one piece
/// of a started SHM copy or read the answers waiting on its TCP connection,
/// as orbite_batch_poll.
#[no_mangle]
pub extern "C" fn orbite_batch_result(
    batch: *const orbite_batch,
    index: usize,
    out: *mut orbite_request_result,
) -> orbite_status {
    guard(|| {
        let b = live(batch, "batch")?;
        let out = need_mut(out, "out")?;
        *out = c_result(&b.batch.result(index)?);
        Ok(())
    })
}

/// Writes which transport carried request `index` (ORBITE_TRANSPORT_TCP,
/// SHM, NVLINK, MNNVL or CMA; ORBITE_TRANSPORT_AUTO while not yet decided);
/// OUT_OF_RANGE past the request count.
#[no_mangle]
pub extern "C" fn orbite_batch_transport(
    batch: *const orbite_batch,
    index: usize,
    out_transport: *mut u32,
) -> orbite_status {
    guard(|| {
        let b = live(batch, "batch")?;
        let out = need_mut(out_transport, "out_transport")?;
        *out = b.batch.transport(index)?.map_or(ORBITE_TRANSPORT_AUTO, TransportKind::c_code);
        Ok(())
    })
}

/// Writes what the engine decided for this submission and why, one line
/// each: a fallback of ORBITE_TRANSPORT_AUTO to TCP with its reason (for
/// example a mapping budget too small for the peer's allocation), or
/// requests split into more groups than their layout needs. "" when
/// nothing was noted. Text out-parameter rules (BUFFER_TOO_SMALL sets
/// *out_len).
#[no_mangle]
pub extern "C" fn orbite_batch_notes(
    batch: *const orbite_batch,
    buf: *mut c_char,
    cap: usize,
    out_len: *mut usize,
) -> orbite_status {
    guard(|| {
        let b = live(batch, "batch")?;
        write_text(&b.batch.notes().join("\n"), buf, cap, out_len)
    })
}

pub(crate) fn c_result(r: &RequestResult) -> orbite_request_result {
    orbite_request_result { status: r.status as u32, remote_effect: r.remote_effect as u32 }
}

/// Requests not yet started end CANCELLED (remote effect NONE); started ones
/// run to their outcome.
#[no_mangle]
pub extern "C" fn orbite_batch_cancel(batch: *mut orbite_batch) -> orbite_status {
    guard(|| {
        live(batch, "batch")?.batch.cancel();
        Ok(())
    })
}

/// Asks request `index` of the batch to end CANCELLED (remote effect NONE)
/// if it has not started; its siblings are not affected. A request started
/// already (the IPC transports start theirs within the submission), or one
/// that moves as one copy with siblings not asked to cancel (coalesced TCP
/// READs), runs to its outcome. OUT_OF_RANGE: the batch holds no request
/// `index`.
#[no_mangle]
pub extern "C" fn orbite_batch_cancel_request(batch: *mut orbite_batch, index: usize) -> orbite_status {
    guard(|| live(batch, "batch")?.batch.cancel_request(index))
}

/// An end callback (`orbite_batch_on_end`): `user_data` is the pointer
/// given with it.
pub type orbite_batch_end_fn = Option<unsafe extern "C" fn(user_data: *mut c_void)>;

/// The end callback's `user_data`, carried to whichever thread ends the
/// batch.
struct EndData(*mut c_void);

// SAFETY: the pointer is only handed back to the caller's callback, which
// the contract of orbite_batch_on_end requires to accept a call from any
// thread; the library never dereferences it.
unsafe impl Send for EndData {}

/// Calls `cb(user_data)` once every request of the batch has ended: within
/// this call when they all have already, else on the library thread that
/// ends the last one: an I/O thread, a copy thread, or a caller that
/// submits, cancels, polls or waits (orbite_batch_result, orbite_batch_poll,
/// orbite_batch_wait read answers waiting on a connection, which may end
/// another batch of the same peer). Every request ends, by the batch's deadline at the
/// latest, so `cb` runs exactly once, also when the batch handle was freed
/// meanwhile (a detached batch still ends). A notification submitted with
/// the batch may still be on its way then. `cb` must accept a call from
/// any thread, return promptly (it runs on the transfer path), never
/// unwind, and call no liborbite function but orbite_status_name,
/// orbite_version and orbite_abi_version. Several callbacks may be set on
/// one batch; each runs once. NULL_ARGUMENT: `cb` is NULL.
#[no_mangle]
pub extern "C" fn orbite_batch_on_end(
    batch: *mut orbite_batch,
    cb: orbite_batch_end_fn,
    user_data: *mut c_void,
) -> orbite_status {
    guard(|| {
        let b = live(batch, "batch")?;
        let f = cb.ok_or_else(|| Error::NullArgument("cb is NULL".into()))?;
        let data = EndData(user_data);
        b.batch.on_end(move || {
            let data = data;
            // SAFETY: `f` is the caller's callback, which accepts this call
            // from any thread (the contract above), with its own pointer.
            unsafe { f(data.0) }
        });
        Ok(())
    })
}

/// Frees a batch handle; a pending batch is detached, never cancelled
/// mid-copy. NULL is a no-op.
#[no_mangle]
pub extern "C" fn orbite_batch_free(batch: *mut orbite_batch) {
    guard_value((), || {
        // Anything but a live batch handle is left alone (and said why).
        if let Err(e) = take_back(batch, "batch").map(drop) {
            set_last_error(&e.to_string());
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::boundary::said::{refused, said};

    #[test]
    fn transport_constants_are_the_kinds_c_codes() {
        let pairs = [
            (ORBITE_TRANSPORT_TCP, TransportKind::Tcp),
            (ORBITE_TRANSPORT_SHM, TransportKind::Shm),
            (ORBITE_TRANSPORT_NVLINK, TransportKind::Nvlink),
            (ORBITE_TRANSPORT_MNNVL, TransportKind::Mnnvl),
            (ORBITE_TRANSPORT_CMA, TransportKind::Cma),
        ];
        for (c, k) in pairs {
            assert_eq!(k.c_code(), c);
            assert_eq!(transport_from(c), Some(Transport::Only(k)));
        }
        assert_eq!(transport_from(ORBITE_TRANSPORT_AUTO), Some(Transport::Auto));
        assert_eq!(transport_from(6), None);
    }

    /// Guards `submission`'s view of the caller's array: the requests are
    /// read in place (the same address, no copy of 10^5 requests), each
    /// one as its C twin says, and an opcode out of range anywhere is
    /// refused, naming its position.
    #[test]
    fn a_c_submission_is_read_in_place_and_its_opcodes_checked() {
        let raw: Vec<orbite_request> = (0..1000u64)
            .map(|i| orbite_request {
                opcode: if i % 3 == 0 { ORBITE_OP_WRITE } else { ORBITE_OP_READ },
                local_addr: 0x1000 + i,
                remote_addr: 0x9000 + 2 * i,
                length: i + 1,
            })
            .collect();
        let (reqs, o) = submission(raw.as_ptr(), raw.len(), std::ptr::null()).unwrap();
        assert_eq!(reqs.as_ptr() as usize, raw.as_ptr() as usize, "read in place");
        assert_eq!(o, SubmitOptions::default());
        for (r, c) in reqs.iter().zip(&raw) {
            assert_eq!(*r, request_of(c, String::new).unwrap());
        }
        let mut bad = raw.clone();
        bad[517].opcode = 3;
        let e = submission(bad.as_ptr(), bad.len(), std::ptr::null()).unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument);
        assert!(e.message().contains("requests[517].opcode is 3"), "{}", e.message());
        bad[517].opcode = 0;
        assert!(submission(bad.as_ptr(), bad.len(), std::ptr::null()).is_err());
    }

    /// Guards `aligned(requests, "requests")` in `submission` (read by
    /// orbite_submit and orbite_submit_notify): an array a C caller
    /// packed at an odd address (requests laid into a byte buffer at
    /// offset 4) is refused INVALID_ARGUMENT naming it, instead of
    /// being read as a misaligned Rust slice (undefined behaviour; a debug
    /// build aborts the process). NULL with count 0 is NULL_ARGUMENT, a
    /// count past MAX_REQUESTS is refused before anything is read.
    #[test]
    fn a_c_submission_at_a_misaligned_address_is_refused() {
        let one = orbite_request { opcode: ORBITE_OP_READ, local_addr: 0x1000, remote_addr: 0x2000, length: 8 };
        let size = std::mem::size_of::<orbite_request>();
        let mut buf = vec![0u64; 2 * size / 8 + 1];
        // SAFETY: the byte buffer holds 4 + 2 requests' bytes; unaligned writes.
        let odd = unsafe { (buf.as_mut_ptr() as *mut u8).add(4) } as *mut orbite_request;
        // SAFETY: within `buf` (see above), written unaligned.
        unsafe {
            odd.write_unaligned(one);
            odd.add(1).write_unaligned(one);
        }
        let e = submission(odd, 2, std::ptr::null()).unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument);
        assert!(e.message().starts_with("requests (0x"), "{}", e.message());
        assert!(e.message().contains("not aligned to 8 bytes"), "{}", e.message());
        assert!(submission(&one, 1, std::ptr::null()).is_ok());
        let e = submission(std::ptr::null(), 0, std::ptr::null()).unwrap_err();
        assert_eq!(e.status(), Status::NullArgument);
        let e = submission(buf.as_ptr() as *const orbite_request, MAX_REQUESTS + 1, std::ptr::null()).unwrap_err();
        assert!(e.message().contains("at most"), "{}", e.message());
    }

    /// A C submission of exactly MAX_REQUESTS requests passes the count
    /// check and one more is refused by it, naming both: over 512 MiB of
    /// zeroed address space (an untouched anonymous mapping: no memory),
    /// MAX_REQUESTS requests get as far as the first request's opcode (0,
    /// refused naming `requests[0]`), MAX_REQUESTS + 1 no further than
    /// their count. Guards `submission`'s `count > MAX_REQUESTS` (sweep B;
    /// `a_c_submission_at_a_misaligned_address_is_refused` checks only
    /// that a count past it is refused).
    #[test]
    fn a_c_submission_carries_exactly_max_requests() {
        let total = (MAX_REQUESTS + 1) * std::mem::size_of::<orbite_request>();
        // SAFETY: a fresh private anonymous mapping (zeroed, reserved
        // lazily), unmapped below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
        let requests = base as *const orbite_request;
        let at_most = submission(requests, MAX_REQUESTS, std::ptr::null()).map(|_| ()).unwrap_err();
        let opcode = "requests[0].opcode is 0 (use ORBITE_OP_READ or ORBITE_OP_WRITE)";
        assert_eq!((at_most.status(), at_most.message()), (Status::InvalidArgument, opcode));
        let past = submission(requests, MAX_REQUESTS + 1, std::ptr::null()).map(|_| ()).unwrap_err();
        let count = format!("count is {}; one submission carries at most {MAX_REQUESTS} requests", MAX_REQUESTS + 1);
        assert_eq!((past.status(), past.message()), (Status::InvalidArgument, count.as_str()));
        // SAFETY: the mapping made above; no reference into it is left.
        assert_eq!(unsafe { libc::munmap(base, total) }, 0);
    }

    /// Guards `aligned(out, "out")` in `orbite_batch_results`: results
    /// asked into an odd address of a byte buffer are refused
    /// INVALID_ARGUMENT naming `out`, and nothing is written; the aligned
    /// buffer then gets the outcome.
    #[test]
    fn batch_results_into_a_misaligned_buffer_are_refused() {
        let e = crate::Engine::from_json("{}").unwrap();
        let mut local = vec![0u8; 64];
        let remote = [9u8; 64];
        e.register_memory(local.as_mut_ptr() as u64, 64, crate::Access::READ_WRITE).unwrap();
        e.register_memory(remote.as_ptr() as u64, 64, crate::Access::READ).unwrap();
        let peer = e.connect(&e.endpoint(), None).unwrap();
        let r =
            Request { op: Op::Read, local_addr: local.as_ptr() as u64, remote_addr: remote.as_ptr() as u64, len: 64 };
        let batch = e.submit(peer, &[r], SubmitOptions::default()).unwrap();
        batch.wait(Duration::from_secs(60)).unwrap();
        let handle = give_out(orbite_batch { batch });
        let mut buf = [0xffu8; 16];
        // SAFETY: 2 bytes into a 16-byte buffer (room for one result).
        let odd = unsafe { buf.as_mut_ptr().add(2) } as *mut orbite_request_result;
        assert_eq!(orbite_batch_results(handle, odd, 1), Status::InvalidArgument as u32);
        assert!(buf.iter().all(|&b| b == 0xff), "written before the refusal");
        let mut out = [orbite_request_result { status: 99, remote_effect: 99 }];
        assert_eq!(orbite_batch_results(handle, out.as_mut_ptr(), 1), Status::Ok as u32);
        assert_eq!((out[0].status, out[0].remote_effect), (Status::Ok as u32, 0));
        orbite_batch_free(handle);
        e.close(Some(Duration::from_secs(30))).unwrap();
    }

    /// orbite_batch_results with a count other than the batch's requests
    /// (smaller as larger) is INVALID_ARGUMENT and writes
    /// nothing: a caller's array of `count` elements is never written past
    /// its end. Guards its check `count != results.len()`.
    #[test]
    fn batch_results_write_exactly_count_results_or_none() {
        use crate::transfer::{BatchShared, ChunkOutcome};
        let req = Request { op: Op::Read, local_addr: 0x1000, remote_addr: 0x2000, len: 8 };
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let shared = BatchShared::routed(&[req; 3], Some(TransportKind::Tcp), Default::default(), deadline);
        for i in 0..3 {
            shared.complete_chunk(i, ChunkOutcome::ok(Op::Read));
        }
        let b = give_out(orbite_batch { batch: crate::engine::Batch::new(shared) });
        let sentinel = orbite_request_result { status: 77, remote_effect: 77 };
        for count in [1usize, 2, 4] {
            let mut out = [sentinel; 4];
            assert_eq!(orbite_batch_results(b, out.as_mut_ptr(), count), Status::InvalidArgument as orbite_status);
            assert!(out.iter().all(|r| r.status == 77 && r.remote_effect == 77), "count {count} wrote results");
        }
        let mut out = [sentinel; 4];
        assert_eq!(orbite_batch_results(b, out.as_mut_ptr(), 3), Status::Ok as orbite_status);
        for r in &out[..3] {
            assert_eq!((r.status, r.remote_effect), (Status::Ok as u32, crate::RemoteEffect::None as u32));
        }
        assert_eq!((out[3].status, out[3].remote_effect), (77, 77));
        orbite_batch_free(b);
    }

    /// A peer that answers the handshake (one region, TCP only) and then
    /// reads nothing and answers nothing, until the returned sender drops.
    fn silent_peer(remote: u64, len: u64) -> (String, std::sync::mpsc::Sender<()>) {
        use crate::control::frame::{FrameHeader, MsgKind, FRAME_HEADER_LEN};
        use crate::control::message::{Describe, RegionInfo};
        use std::io::{Read, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let ep = l.local_addr().unwrap().to_string();
        let region = RegionInfo {
            id: 1,
            epoch: 1,
            addr: remote,
            len,
            access: crate::Access::READ_WRITE,
            kind: crate::MemoryKind::Host,
        };
        let d = Describe {
            identity: crate::control::Identity::fresh().unwrap(),
            capabilities: TransportKind::Tcp.capability_bit(),
            fabric_domain: [0; 16],
            endpoint: ep.clone(),
            ipc_name: String::new(),
            regions: vec![region],
        };
        let (hold, held) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut h = [0u8; FRAME_HEADER_LEN];
            s.read_exact(&mut h).unwrap();
            let h = FrameHeader::decode(&h).unwrap();
            s.read_exact(&mut vec![0u8; h.body_len as usize]).unwrap();
            let body = d.encode();
            s.write_all(&FrameHeader::encode(MsgKind::Describe, body.len() as u32)).unwrap();
            s.write_all(&body).unwrap();
            let _ = held.recv();
        });
        (ep, hold)
    }

    /// An engine (default_timeout_ms a day) connected to a [`silent_peer`],
    /// with a READ of 4096 bytes into its local buffer (filled with 0x11)
    /// submitted through orbite_submit with opts->timeout_ms `timeout_ms`
    /// over TCP. Free the batch, then drop the sender, then free the engine.
    fn read_from_a_silent_peer(
        timeout_ms: u32,
    ) -> (*mut orbite_engine, *mut orbite_batch, Vec<u8>, std::sync::mpsc::Sender<()>) {
        let config = std::ffi::CString::new(r#"{"default_timeout_ms": 86400000}"#).unwrap();
        let mut engine: *mut orbite_engine = std::ptr::null_mut();
        assert_eq!(crate::ffi::engine::orbite_engine_new(config.as_ptr(), &mut engine), Status::Ok as u32);
        // SAFETY: `engine` is the live engine orbite_engine_new gave above.
        let e = &unsafe { &*engine }.engine;
        let local = vec![0x11u8; 4096];
        e.register_memory(local.as_ptr() as u64, 4096, crate::Access::READ_WRITE).unwrap();
        let remote = 0x7000_0000u64;
        let (ep, hold) = silent_peer(remote, 4096);
        let peer = e.connect(&ep, Some(Duration::from_secs(60))).unwrap();
        let req = orbite_request {
            opcode: ORBITE_OP_READ,
            local_addr: local.as_ptr() as u64,
            remote_addr: remote,
            length: 4096,
        };
        let opts = orbite_submit_options { transport: ORBITE_TRANSPORT_TCP, timeout_ms };
        let mut batch: *mut orbite_batch = std::ptr::null_mut();
        assert_eq!(orbite_submit(engine, peer, &req, 1, &opts, &mut batch), Status::Ok as u32);
        (engine, batch, local, hold)
    }

    /// orbite_submit with opts->timeout_ms 300 on an engine whose
    /// default_timeout_ms is a day, to a peer that never answers: the READ
    /// ends TIMED_OUT (effect NONE, nothing landed) within the 20 s the
    /// test waits, so its deadline was the caller's. Guards the line of
    /// `submission` that sets `o.timeout` from `raw.timeout_ms` (round 8
    /// H16: without it the batch was still pending when the wait ended).
    #[test]
    fn orbite_submit_ends_at_the_callers_timeout_ms_not_the_engines_default() {
        let (engine, batch, local, hold) = read_from_a_silent_peer(300);
        assert_eq!(orbite_batch_wait(batch, 20_000), Status::TransferFailed as u32);
        let mut out = [orbite_request_result { status: 99, remote_effect: 99 }];
        assert_eq!(orbite_batch_results(batch, out.as_mut_ptr(), 1), Status::Ok as u32);
        assert_eq!((out[0].status, out[0].remote_effect), (Status::TimedOut as u32, crate::RemoteEffect::None as u32));
        assert!(local.iter().all(|b| *b == 0x11), "bytes landed");
        orbite_batch_free(batch);
        drop(hold);
        crate::ffi::engine::orbite_engine_free(engine);
    }

    /// Guards `if s == Status::TransferFailed` in `orbite_batch_poll`
    /// (round 13 M2): polling a failed batch is TRANSFER_FAILED and sets
    /// orbite_last_error to the batch's failure (its request 0 TIMED_OUT),
    /// replacing the text an unrelated failing call left before it.
    #[test]
    fn batch_poll_of_a_failed_batch_names_its_failure_in_last_error() {
        let (engine, batch, _local, hold) = read_from_a_silent_peer(300);
        assert_eq!(orbite_batch_wait(batch, 20_000), Status::TransferFailed as u32);
        let mut one = orbite_request_result { status: 99, remote_effect: 99 };
        assert_eq!(orbite_batch_result(batch, 5, &mut one), Status::OutOfRange as u32);
        assert!(said().contains("request index 5"), "{}", said());
        assert_eq!(orbite_batch_poll(batch), Status::TransferFailed as u32);
        let failed = Error::TransferFailed(format!("request 0 failed with {}: ", Status::TimedOut)).to_string();
        assert!(said().starts_with(&failed), "{}", said());
        orbite_batch_free(batch);
        drop(hold);
        crate::ffi::engine::orbite_engine_free(engine);
    }

    /// Counts its calls in the `AtomicUsize` at `data` (an end callback).
    unsafe extern "C" fn count_call(data: *mut c_void) {
        // SAFETY: the tests pass a live AtomicUsize as user_data.
        unsafe { &*data.cast::<std::sync::atomic::AtomicUsize>() }.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// The sweep of the batch functions' entry checks, each case named:
    /// every one given a NULL batch is NULL_ARGUMENT "batch is NULL"
    /// (nothing written, no callback set); on a live batch of 3 ended
    /// requests a NULL out-parameter or callback is NULL_ARGUMENT naming
    /// it, an index past the requests OUT_OF_RANGE naming it. Out-parameters
    /// keep their sentinels. Guards `live`'s NULL check, `out.is_null()` of
    /// orbite_batch_results and the NULL_ARGUMENT of `cb` in
    /// orbite_batch_on_end.
    #[test]
    fn batch_entry_points_refuse_null_arguments_naming_them() {
        use crate::transfer::{BatchShared, ChunkOutcome};
        use std::sync::atomic::{AtomicUsize, Ordering};
        let null_arg = |what: &str| Error::NullArgument(format!("{what} is NULL"));
        let req = Request { op: Op::Read, local_addr: 0x1000, remote_addr: 0x2000, len: 8 };
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let shared = BatchShared::routed(&[req; 3], Some(TransportKind::Tcp), Default::default(), deadline);
        for i in 0..3 {
            shared.complete_chunk(i, ChunkOutcome::ok(Op::Read));
        }
        let live_batch = give_out(orbite_batch { batch: crate::engine::Batch::new(shared) });
        let no: *mut orbite_batch = std::ptr::null_mut();
        let sentinel = orbite_request_result { status: 77, remote_effect: 77 };
        let (mut out, mut one, mut t, mut n) = ([sentinel; 3], sentinel, 77u32, 77usize);
        let mut text = [0x7f as c_char; 16];
        let calls = AtomicUsize::new(0);
        let data: *mut c_void = (&calls as *const AtomicUsize).cast_mut().cast();

        let e = null_arg("batch");
        refused("poll", orbite_batch_poll(no), e.clone());
        refused("wait", orbite_batch_wait(no, 0), e.clone());
        refused("results", orbite_batch_results(no, out.as_mut_ptr(), 3), e.clone());
        refused("result", orbite_batch_result(no, 0, &mut one), e.clone());
        refused("transport", orbite_batch_transport(no, 0, &mut t), e.clone());
        refused("notes", orbite_batch_notes(no, text.as_mut_ptr(), text.len(), &mut n), e.clone());
        refused("cancel", orbite_batch_cancel(no), e.clone());
        refused("cancel_request", orbite_batch_cancel_request(no, 0), e.clone());
        refused("on_end", orbite_batch_on_end(no, Some(count_call), data), e);

        let b = live_batch;
        refused("results out", orbite_batch_results(b, std::ptr::null_mut(), 3), null_arg("out"));
        // Whatever count says (round 17 R7: not the count's INVALID_ARGUMENT).
        refused("results out, count 0", orbite_batch_results(b, std::ptr::null_mut(), 0), null_arg("out"));
        refused("result out", orbite_batch_result(b, 0, std::ptr::null_mut()), null_arg("out"));
        refused("transport out", orbite_batch_transport(b, 0, std::ptr::null_mut()), null_arg("out_transport"));
        let st = orbite_batch_notes(b, text.as_mut_ptr(), text.len(), std::ptr::null_mut());
        refused("notes out_len", st, null_arg("out_len"));
        refused("on_end cb", orbite_batch_on_end(b, None, data), null_arg("cb"));
        let past = || Error::OutOfRange("request index 3: the batch holds 3 requests".into());
        refused("result index", orbite_batch_result(b, 3, &mut one), past());
        refused("transport index", orbite_batch_transport(b, 3, &mut t), past());
        refused("cancel_request index", orbite_batch_cancel_request(b, 3), past());

        let untouched = |r: &orbite_request_result| (r.status, r.remote_effect) == (77, 77);
        assert!(out.iter().all(untouched) && untouched(&one), "a result was written");
        assert_eq!((t, n), (77, 77), "an out-parameter was written");
        assert!(text.iter().all(|&c| c == 0x7f), "notes were written");
        assert_eq!(calls.load(Ordering::SeqCst), 0, "a refused callback ran");
        assert_eq!(orbite_batch_on_end(b, Some(count_call), data), Status::Ok as u32);
        assert_eq!(calls.load(Ordering::SeqCst), 1, "the ended batch calls back at once");
        orbite_batch_free(b);
    }

    /// The sweep of orbite_submit's entry checks, each case named, on a
    /// live engine and an unknown peer (so that anything not refused here
    /// is the engine's NOT_FOUND or its own wording): a NULL engine,
    /// out_batch or requests is NULL_ARGUMENT naming it; count 0 is
    /// INVALID_ARGUMENT "count is 0"; an unknown opcode or
    /// opts->transport is INVALID_ARGUMENT naming the field and the value.
    /// *out_batch keeps its sentinel. Guards `requests.is_null()`,
    /// `count == 0` and the opts->transport check of `submission`.
    #[test]
    fn submit_refuses_null_zero_and_unknown_arguments_naming_them() {
        let null_arg = |what: &str| Error::NullArgument(format!("{what} is NULL"));
        let mut engine: *mut orbite_engine = std::ptr::null_mut();
        assert_eq!(crate::ffi::engine::orbite_engine_new(std::ptr::null(), &mut engine), Status::Ok as u32);
        let peer = 4242u64;
        let r = orbite_request { opcode: ORBITE_OP_READ, local_addr: 0x1000, remote_addr: 0x2000, length: 8 };
        let dangling = std::ptr::NonNull::<orbite_batch>::dangling().as_ptr();
        let mut batch = dangling;
        let none = std::ptr::null();

        let st = orbite_submit(std::ptr::null_mut(), peer, &r, 1, none, &mut batch);
        refused("engine", st, null_arg("engine"));
        refused("out_batch", orbite_submit(engine, peer, &r, 1, none, std::ptr::null_mut()), null_arg("out_batch"));
        refused("requests", orbite_submit(engine, peer, std::ptr::null(), 1, none, &mut batch), null_arg("requests"));
        let st = orbite_submit(engine, peer, &r, 0, none, &mut batch);
        refused("count 0", st, Error::InvalidArgument("count is 0".into()));
        let bad = orbite_request { opcode: 0, ..r };
        let st = orbite_submit(engine, peer, &bad, 1, none, &mut batch);
        let want = "requests[0].opcode is 0 (use ORBITE_OP_READ or ORBITE_OP_WRITE)";
        refused("opcode", st, Error::InvalidArgument(want.into()));
        let opts = orbite_submit_options { transport: 6, timeout_ms: 0 };
        let st = orbite_submit(engine, peer, &r, 1, &opts, &mut batch);
        let want = "opts->transport is 6 (use an ORBITE_TRANSPORT_* value)";
        refused("opts->transport", st, Error::InvalidArgument(want.into()));
        assert_eq!(batch, dangling, "a batch was written");
        crate::ffi::engine::orbite_engine_free(engine);
    }

    /// orbite_batch_free(NULL) does nothing (the last error stays); a
    /// handle of another type passed as the batch is left alone, still
    /// live, and the last error says what it is. Guards
    /// orbite_batch_free's `set_last_error`.
    #[test]
    fn freeing_null_or_another_handle_as_a_batch_does_nothing() {
        super::set_last_error("an earlier failure");
        orbite_batch_free(std::ptr::null_mut());
        assert_eq!(said(), "an earlier failure");
        let mut engine: *mut orbite_engine = std::ptr::null_mut();
        assert_eq!(crate::ffi::engine::orbite_engine_new(std::ptr::null(), &mut engine), Status::Ok as u32);
        orbite_batch_free(engine.cast());
        assert_eq!(said(), "invalid argument: batch is an orbite_engine, not an orbite_batch");
        let mut mask = 0u32;
        assert_eq!(crate::ffi::engine::orbite_engine_transports(engine, &mut mask), Status::Ok as u32, "still live");
        assert_ne!(mask, 0);
        crate::ffi::engine::orbite_engine_free(engine);
    }
}
