//! Engine lifecycle, peers, registration and closing.

use super::boundary::*;
use super::handles::{give_out, live, take_back};
use super::types::*;
use crate::{Access, Engine, Error, RegionInfo, Status, TransportKind};
use std::ffi::{c_char, c_void};

/// The ABI version (== ORBITE_ABI_VERSION of the header compiled against).
#[no_mangle]
pub extern "C" fn orbite_abi_version() -> u32 {
    ORBITE_ABI_VERSION
}

/// The library version, "MAJOR.MINOR.PATCH" (static storage).
#[no_mangle]
pub extern "C" fn orbite_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// The constant's name for a status ("ORBITE_STATUS_OK", ...); unknown values
/// give "ORBITE_STATUS_UNKNOWN". Static storage.
#[no_mangle]
pub extern "C" fn orbite_status_name(status: u32) -> *const c_char {
    Status::from_u32(status).map_or(c"ORBITE_STATUS_UNKNOWN", Status::c_name_cstr).as_ptr()
}

/// The message of the last failing call on this thread ("" if none). Valid
/// until the next failing call on this thread.
#[no_mangle]
pub extern "C" fn orbite_last_error() -> *const c_char {
    last_error_ptr()
}

/// Creates an engine. config_json NULL or "" = all defaults; unknown keys,
/// wrong types and out-of-range values give ORBITE_STATUS_INVALID_CONFIG
/// naming the key.
#[no_mangle]
pub extern "C" fn orbite_engine_new(config_json: *const c_char, out_engine: *mut *mut orbite_engine) -> orbite_status {
    guard(|| {
        let out = need_mut(out_engine, "out_engine")?;
        let text = if config_json.is_null() { "" } else { need_str(config_json, "config_json")? };
        let engine = Engine::from_json(text)?;
        *out = give_out(orbite_engine { engine });
        Ok(())
    })
}

/// Writes the engine's endpoint ("IP:port") for peers to connect to.
#[no_mangle]
pub extern "C" fn orbite_engine_endpoint(
    engine: *const orbite_engine,
    buf: *mut c_char,
    cap: usize,
    out_len: *mut usize,
) -> orbite_status {
    guard(|| {
        let e = live(engine, "engine")?;
        write_text(&e.engine.endpoint(), buf, cap, out_len)
    })
}

/// Writes the engine's counters as a JSON object.
#[no_mangle]
pub extern "C" fn orbite_engine_stats_json(
    engine: *const orbite_engine,
    buf: *mut c_char,
    cap: usize,
    out_len: *mut usize,
) -> orbite_status {
    guard(|| {
        let e = live(engine, "engine")?;
        write_text(&e.engine.stats().to_json(), buf, cap, out_len)
    })
}

/// Writes the transports this engine offers as a mask: bit
/// (1u << ORBITE_TRANSPORT_TCP) and so on.
#[no_mangle]
pub extern "C" fn orbite_engine_transports(engine: *const orbite_engine, out_mask: *mut u32) -> orbite_status {
    guard(|| {
        let e = live(engine, "engine")?;
        let out = need_mut(out_mask, "out_mask")?;
        *out = transport_mask(&e.engine.transports());
        Ok(())
    })
}

/// Writes the transports both this engine and the peer can use now, as a
/// mask (0 once the peer is gone); NOT_FOUND for an unknown peer.
#[no_mangle]
pub extern "C" fn orbite_peer_transports(engine: *mut orbite_engine, peer: u64, out_mask: *mut u32) -> orbite_status {
    guard(|| {
        let e = live(engine, "engine")?;
        let out = need_mut(out_mask, "out_mask")?;
        *out = transport_mask(&e.engine.peer_transports(peer)?);
        Ok(())
    })
}

fn transport_mask(kinds: &[TransportKind]) -> u32 {
    kinds.iter().fold(0, |m, k| m | k.c_mask_bit())
}

/// Frees an engine: stops its threads and closes its connections without
/// waiting for peers. Does not prove remote closure. NULL is a no-op.
#[no_mangle]
pub extern "C" fn orbite_engine_free(engine: *mut orbite_engine) {
    guard_value((), || {
        // Anything but a live engine handle is left alone (and said why).
        if let Err(e) = take_back(engine, "engine").map(drop) {
            set_last_error(&e.to_string());
        }
    })
}

/// Registers [addr, addr+length) with remote access flags
/// (ORBITE_ACCESS_READ | ORBITE_ACCESS_WRITE, or 0 for local-only use).
#[no_mangle]
pub extern "C" fn orbite_register_memory(
    engine: *mut orbite_engine,
    addr: *mut c_void,
    length: usize,
    access: u32,
    out_region: *mut u64,
) -> orbite_status {
    guard(|| {
        let e = live(engine, "engine")?;
        let out = need_mut(out_region, "out_region")?;
        if addr.is_null() {
            return Err(Error::NullArgument("addr is NULL".into()));
        }
        let access = Access::from_bits(access).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "access 0x{access:x} has unknown bits (use ORBITE_ACCESS_READ | ORBITE_ACCESS_WRITE)"
            ))
        })?;
        let id = e.engine.register_memory(addr as u64, length as u64, access)?;
        *out = id;
        Ok(())
    })
}

/// Unregisters a region, waiting up to timeout_ms (0 = default) for copies
/// that use it; TIMED_OUT leaves it registered.
#[no_mangle]
pub extern "C" fn orbite_unregister_memory(engine: *mut orbite_engine, region: u64, timeout_ms: u32) -> orbite_status {
    guard(|| {
        let e = live(engine, "engine")?;
        if region == 0 {
            return Err(Error::InvalidArgument("region id 0 is never valid".into()));
        }
        e.engine.unregister_memory(region, timeout_opt(timeout_ms))
    })
}

/// Hands a GPU producer stream to the engine for a CUDA region.
#[no_mangle]
pub extern "C" fn orbite_record_producer_stream(
    engine: *mut orbite_engine,
    region: u64,
    cu_stream: *mut c_void,
) -> orbite_status {
    guard(|| {
        let e = live(engine, "engine")?;
        if region == 0 {
            return Err(Error::InvalidArgument("region id 0 is never valid".into()));
        }
        e.engine.record_producer_stream(region, cu_stream as u64)
    })
}

/// Connects to a peer's endpoint; writes the peer id.
#[no_mangle]
pub extern "C" fn orbite_connect(
    engine: *mut orbite_engine,
    endpoint: *const c_char,
    timeout_ms: u32,
    out_peer: *mut u64,
) -> orbite_status {
    guard(|| {
        let e = live(engine, "engine")?;
        let out = need_mut(out_peer, "out_peer")?;
        let ep = need_str(endpoint, "endpoint")?;
        let id = e.engine.connect(ep, timeout_opt(timeout_ms))?;
        *out = id;
        Ok(())
    })
}

/// Finds the live engine named `name` through discovery (config
/// "discovery") and connects to it; writes the peer id. NOT_FOUND: no live
/// engine of that name; UNAVAILABLE: no discovery configured or etcd out
/// of reach within the timeout; STALE_PEER: the engine found is not the
/// epoch published under the name. The name stays watched while connected:
/// if it vanishes or names another epoch, the peer is marked gone
/// (STALE_PEER) at once.
#[no_mangle]
pub extern "C" fn orbite_connect_name(
    engine: *mut orbite_engine,
    name: *const c_char,
    timeout_ms: u32,
    out_peer: *mut u64,
) -> orbite_status {
    guard(|| {
        let e = live(engine, "engine")?;
        let out = need_mut(out_peer, "out_peer")?;
        let name = need_str(name, "name")?;
        *out = e.engine.connect_name(name, timeout_opt(timeout_ms))?;
        Ok(())
    })
}

/// Writes the regions the peer publishes, as a JSON array.
#[no_mangle]
pub extern "C" fn orbite_peer_regions_json(
    engine: *mut orbite_engine,
    peer: u64,
    buf: *mut c_char,
    cap: usize,
    out_len: *mut usize,
) -> orbite_status {
    guard(|| {
        let e = live(engine, "engine")?;
        need_mut(out_len, "out_len")?;
        let regions = e.engine.peer_regions(peer, None)?;
        write_text(&RegionInfo::list_json(&regions), buf, cap, out_len)
    })
}

/// Each memory kind's name as a C string, by wire code.
static KIND_NAMES: once_cell::sync::Lazy<Vec<std::ffi::CString>> = once_cell::sync::Lazy::new(|| {
    (0..)
        .map_while(crate::memory::MemoryKind::from_code)
        .map(|k| std::ffi::CString::new(k.name()).unwrap_or_default())
        .collect()
});

/// Writes the regions the peer publishes (asked of the peer now) into
/// out[0..count) and their count to *out_count. A cap below the count is
/// BUFFER_TOO_SMALL with only *out_count written; out may be NULL when cap
/// is 0.
#[no_mangle]
pub extern "C" fn orbite_peer_regions(
    engine: *mut orbite_engine,
    peer: u64,
    out: *mut orbite_region_info,
    cap: usize,
    out_count: *mut usize,
) -> orbite_status {
    guard(|| {
        let e = live(engine, "engine")?;
        let count = need_mut(out_count, "out_count")?;
        let regions = e.engine.peer_regions(peer, None)?;
        if cap < regions.len() {
            *count = regions.len();
            return Err(Error::BufferTooSmall(format!("the peer publishes {} regions, cap is {cap}", regions.len())));
        }
        if out.is_null() && !regions.is_empty() {
            return Err(Error::NullArgument("out is NULL".into()));
        }
        for (i, r) in regions.iter().enumerate() {
            let info = orbite_region_info {
                id: r.id,
                epoch: r.epoch,
                addr: r.addr,
                length: r.len,
                access: r.access.bits(),
                kind: KIND_NAMES[r.kind.code() as usize].as_ptr(),
            };
            // SAFETY: out is non-NULL and the caller promises `cap` writable
            // elements; i < regions.len() <= cap was checked above.
            unsafe { out.add(i).write(info) };
        }
        *count = regions.len();
        Ok(())
    })
}

/// Disconnects a peer after its outstanding requests end (up to timeout_ms).
#[no_mangle]
pub extern "C" fn orbite_disconnect(engine: *mut orbite_engine, peer: u64, timeout_ms: u32) -> orbite_status {
    guard(|| live(engine, "engine")?.engine.disconnect(peer, timeout_opt(timeout_ms)))
}

/// Closes this engine's cached imports of every IPC transport (SHM as well
/// as NVLink and MNNVL) through their receipts, so that the peers' exports
/// are released; admission stays open. The only way to release a cached SHM
/// import (shm_cache_entries) short of orbite_close_requester.
#[no_mangle]
pub extern "C" fn orbite_flush_nvlink_cache(engine: *mut orbite_engine, timeout_ms: u32) -> orbite_status {
    guard(|| live(engine, "engine")?.engine.flush_nvlink_cache(timeout_opt(timeout_ms)))
}

/// Fences new submissions, waits for accepted ones, closes outgoing connections.
#[no_mangle]
pub extern "C" fn orbite_close_requester(engine: *mut orbite_engine, timeout_ms: u32) -> orbite_status {
    guard(|| live(engine, "engine")?.engine.close_requester(timeout_opt(timeout_ms)))
}

/// Stops serving new requests and waits for those being served.
#[no_mangle]
pub extern "C" fn orbite_close_source(engine: *mut orbite_engine, timeout_ms: u32) -> orbite_status {
    guard(|| live(engine, "engine")?.engine.close_source(timeout_opt(timeout_ms)))
}

/// Closes the requester side, then the source side, then the engine.
#[no_mangle]
pub extern "C" fn orbite_close(engine: *mut orbite_engine, timeout_ms: u32) -> orbite_status {
    guard(|| live(engine, "engine")?.engine.close(timeout_opt(timeout_ms)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::boundary::said::{refused, said};
    use std::ffi::CStr;

    #[test]
    fn status_names_match_the_rust_table() {
        for s in Status::ALL {
            // SAFETY: orbite_status_name returns a static NUL-terminated string.
            let n = unsafe { CStr::from_ptr(orbite_status_name(s as u32)) };
            assert_eq!(n.to_str().unwrap(), s.c_name());
        }
        // SAFETY: as above.
        let u = unsafe { CStr::from_ptr(orbite_status_name(99)) };
        assert_eq!(u.to_str().unwrap(), "ORBITE_STATUS_UNKNOWN");
    }

    /// Access bits orbite.h does not define are INVALID_ARGUMENT, named,
    /// with nothing registered (`*out_region` untouched); READ|WRITE alone
    /// registers. Guards `Access::from_bits(access)` in
    /// `orbite_register_memory` (round 9 I19: masked to READ|WRITE first,
    /// a caller's unknown bit, say a future flag it relies on, was dropped
    /// and the memory registered without it).
    #[test]
    fn register_memory_refuses_access_bits_it_does_not_know() {
        let mut engine: *mut orbite_engine = std::ptr::null_mut();
        assert_eq!(orbite_engine_new(std::ptr::null(), &mut engine), Status::Ok as u32);
        let mut buf = vec![0u8; 4096];
        let mut region = 77u64;
        let unknown = ORBITE_ACCESS_READ | 0x80;
        let st = orbite_register_memory(engine, buf.as_mut_ptr().cast(), buf.len(), unknown, &mut region);
        assert_eq!((st, region), (Status::InvalidArgument as u32, 77));
        let said = said();
        assert!(said.contains("access 0x81 has unknown bits"), "{said}");
        let both = ORBITE_ACCESS_READ | ORBITE_ACCESS_WRITE;
        assert_eq!(orbite_register_memory(engine, buf.as_mut_ptr().cast(), buf.len(), both, &mut region), 0);
        assert_ne!(region, 77);
        orbite_engine_free(engine);
    }

    /// A source engine publishing one READ region per buffer of `bufs`, a
    /// requester engine connected to it, the requester's peer id for it,
    /// and the regions' ids in registration order.
    fn a_pair_publishing(bufs: &mut [Vec<u8>]) -> (*mut orbite_engine, *mut orbite_engine, u64, Vec<u64>) {
        let mut src: *mut orbite_engine = std::ptr::null_mut();
        let mut req: *mut orbite_engine = std::ptr::null_mut();
        assert_eq!(orbite_engine_new(std::ptr::null(), &mut src), Status::Ok as u32);
        assert_eq!(orbite_engine_new(std::ptr::null(), &mut req), Status::Ok as u32);
        let mut ids = Vec::new();
        for buf in bufs.iter_mut() {
            let mut region = 0u64;
            let access = ORBITE_ACCESS_READ;
            let st = orbite_register_memory(src, buf.as_mut_ptr().cast(), buf.len(), access, &mut region);
            assert_eq!(st, Status::Ok as u32);
            ids.push(region);
        }
        // SAFETY: src is the live engine orbite_engine_new gave above.
        let ep = std::ffi::CString::new(unsafe { &*src }.engine.endpoint()).unwrap();
        let mut peer = 0u64;
        assert_eq!(orbite_connect(req, ep.as_ptr(), 30_000, &mut peer), Status::Ok as u32);
        (src, req, peer, ids)
    }

    /// A timeout_ms of 0 at the C entry means the engine's default, not a
    /// deadline already passed: orbite_connect with 0 connects, and
    /// orbite_close with 0 closes. Guards `timeout_opt`'s `ms != 0` in
    /// ffi/boundary.rs (round 17 R5: with every value taken as a timeout,
    /// the connect of 0 ms failed at once).
    #[test]
    fn a_timeout_of_zero_is_the_engines_default() {
        let (src, req, _, _) = a_pair_publishing(&mut []);
        // SAFETY: src is the live engine a_pair_publishing made.
        let ep = std::ffi::CString::new(unsafe { &*src }.engine.endpoint()).unwrap();
        let mut peer = 0u64;
        assert_eq!(orbite_connect(req, ep.as_ptr(), 0, &mut peer), Status::Ok as u32, "{}", said());
        assert_ne!(peer, 0);
        assert_eq!(orbite_close(req, 0), Status::Ok as u32, "{}", said());
        orbite_engine_free(req);
        orbite_engine_free(src);
    }

    /// Guards `out.is_null() && !regions.is_empty()` in
    /// `orbite_peer_regions`: a peer publishing exactly one region, asked
    /// with out NULL and cap 1, is NULL_ARGUMENT (not a write to NULL);
    /// with a real array it is OK and names that one region.
    #[test]
    fn peer_regions_into_null_with_room_for_one_is_a_null_argument() {
        let mut bufs = vec![vec![0u8; 4096]];
        let (src, req, peer, ids) = a_pair_publishing(&mut bufs);
        let mut n = 99usize;
        assert_eq!(orbite_peer_regions(req, peer, std::ptr::null_mut(), 1, &mut n), Status::NullArgument as u32);
        let mut out: Vec<orbite_region_info> = Vec::with_capacity(1);
        assert_eq!(orbite_peer_regions(req, peer, out.as_mut_ptr(), 1, &mut n), Status::Ok as u32);
        assert_eq!(n, 1);
        // SAFETY: orbite_peer_regions wrote n = 1 element.
        unsafe { out.set_len(n) };
        assert_eq!((out[0].id, out[0].addr, out[0].length), (ids[0], bufs[0].as_ptr() as u64, 4096));
        orbite_engine_free(req);
        orbite_engine_free(src);
    }

    /// Guards the element each region is written to in
    /// `orbite_peer_regions` (round 15 O1): a peer publishing three
    /// regions, asked with room for four, gets each region in its own
    /// element (id, address, length, access, kind; in the peer's order,
    /// compared here by id), and the fourth element keeps what the caller
    /// put there. With every region written to `out[0]`, elements 1 and 2
    /// kept their sentinels.
    #[test]
    fn peer_regions_writes_each_region_in_its_own_element() {
        let mut bufs = vec![vec![0u8; 4096], vec![0u8; 8192], vec![0u8; 12288]];
        let (src, req, peer, ids) = a_pair_publishing(&mut bufs);
        let sentinel =
            orbite_region_info { id: 77, epoch: 77, addr: 77, length: 77, access: 77, kind: std::ptr::null() };
        let mut out = vec![sentinel; 4];
        let mut n = 99usize;
        assert_eq!(orbite_peer_regions(req, peer, out.as_mut_ptr(), out.len(), &mut n), Status::Ok as u32);
        assert_eq!(n, 3);
        let mut got: Vec<_> = out[..3].iter().map(|r| (r.id, r.addr, r.length, r.access)).collect();
        got.sort_unstable();
        let mut want: Vec<_> =
            bufs.iter().zip(&ids).map(|(b, id)| (*id, b.as_ptr() as u64, b.len() as u64, ORBITE_ACCESS_READ)).collect();
        want.sort_unstable();
        assert_eq!(got, want);
        for r in &out[..3] {
            // SAFETY: kind points at a static NUL-terminated name.
            assert_eq!(unsafe { CStr::from_ptr(r.kind) }.to_str().unwrap(), "host");
        }
        assert_eq!((out[3].id, out[3].addr, out[3].length, out[3].kind), (77, 77, 77, std::ptr::null()));
        orbite_engine_free(req);
        orbite_engine_free(src);
    }

    /// A cap one below the peer's region count (2 of 3) is BUFFER_TOO_SMALL
    /// naming both, with *out_count the count and no element written (the
    /// array has room past the cap, so a write past it would show); a cap
    /// of exactly the count is OK (`peer_regions_writes_each_region_in_its_
    /// own_element` asks with one more). Guards `orbite_peer_regions`'s
    /// `cap < regions.len()` (sweep B).
    #[test]
    fn peer_regions_with_room_for_one_region_fewer_is_buffer_too_small() {
        let mut bufs = vec![vec![0u8; 4096], vec![0u8; 8192], vec![0u8; 12288]];
        let (src, req, peer, _) = a_pair_publishing(&mut bufs);
        let sentinel =
            orbite_region_info { id: 77, epoch: 77, addr: 77, length: 77, access: 77, kind: std::ptr::null() };
        let mut out = vec![sentinel; 4];
        let mut n = 99usize;
        assert_eq!(orbite_peer_regions(req, peer, out.as_mut_ptr(), 2, &mut n), Status::BufferTooSmall as u32);
        assert_eq!(
            (n, said()),
            (3, Error::BufferTooSmall("the peer publishes 3 regions, cap is 2".into()).to_string())
        );
        assert!(
            out.iter().all(|r| (r.id, r.length, r.kind) == (77, 77, std::ptr::null())),
            "written past a cap too small"
        );
        n = 99;
        assert_eq!(orbite_peer_regions(req, peer, out.as_mut_ptr(), 3, &mut n), Status::Ok as u32);
        assert_eq!((n, out[3].id), (3, 77));
        orbite_engine_free(req);
        orbite_engine_free(src);
    }

    /// Guards `if buf.is_null()` in `write_text` (round 13 M3): a text
    /// out-parameter call (here orbite_engine_endpoint) with buf NULL and
    /// a cap that would hold the text is NULL_ARGUMENT naming buf, with
    /// *out_len untouched, never a write through NULL; a real buffer of
    /// that cap then gets the NUL-terminated endpoint and its length.
    #[test]
    fn text_out_parameter_into_null_with_room_is_a_null_argument() {
        let mut engine: *mut orbite_engine = std::ptr::null_mut();
        assert_eq!(orbite_engine_new(std::ptr::null(), &mut engine), Status::Ok as u32);
        let mut n = 99usize;
        assert_eq!(orbite_engine_endpoint(engine, std::ptr::null_mut(), 4096, &mut n), Status::NullArgument as u32);
        assert_eq!(n, 99);
        assert!(said().contains("buf is NULL"), "{}", said());
        let mut buf = vec![0x7f as c_char; 4096];
        assert_eq!(orbite_engine_endpoint(engine, buf.as_mut_ptr(), buf.len(), &mut n), Status::Ok as u32);
        // SAFETY: engine is the live engine orbite_engine_new gave above.
        let ep = unsafe { &*engine }.engine.endpoint();
        // SAFETY: OK means buf holds a NUL-terminated text.
        assert_eq!(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap(), ep);
        assert_eq!(n, ep.len());
        orbite_engine_free(engine);
    }

    /// The sweep of engine.rs's entry checks, each case named: every
    /// function given a NULL engine is NULL_ARGUMENT "engine is NULL"
    /// (not the INVALID_ARGUMENT of a dead handle); on a live engine a
    /// NULL out-parameter or input is NULL_ARGUMENT naming it, checked
    /// before the engine is asked (an unknown peer is not reported
    /// instead); region id 0 is INVALID_ARGUMENT "region id 0 is never
    /// valid" (not the engine's NOT_FOUND); a string that is not UTF-8 is
    /// INVALID_ARGUMENT naming it. Every out-parameter keeps its sentinel
    /// and nothing is registered. Guards `live`'s NULL check, the
    /// `addr.is_null()` and `region == 0` checks, `need_str`'s NULL check
    /// and the early `need_mut(out_len, ...)` of orbite_peer_regions_json.
    #[test]
    fn engine_entry_points_refuse_null_and_zero_arguments_naming_them() {
        let null_arg = |what: &str| Error::NullArgument(format!("{what} is NULL"));
        let mut engine: *mut orbite_engine = std::ptr::null_mut();
        assert_eq!(orbite_engine_new(std::ptr::null(), &mut engine), Status::Ok as u32);
        let no: *mut orbite_engine = std::ptr::null_mut();
        let ep = c"127.0.0.1:1";
        let unknown = 4242u64;
        let mut mem = vec![0u8; 4096];
        let addr: *mut c_void = mem.as_mut_ptr().cast();
        let mut buf = [0x7f as c_char; 64];
        let (b, cap) = (buf.as_mut_ptr(), buf.len());
        let (mut n, mut mask, mut id) = (77usize, 77u32, 77u64);
        let mut infos: Vec<orbite_region_info> = Vec::with_capacity(4);
        let info = infos.as_mut_ptr();

        // A NULL engine, for every function that takes one.
        let e = null_arg("engine");
        refused("endpoint", orbite_engine_endpoint(no, b, cap, &mut n), e.clone());
        refused("stats_json", orbite_engine_stats_json(no, b, cap, &mut n), e.clone());
        refused("engine_transports", orbite_engine_transports(no, &mut mask), e.clone());
        refused("peer_transports", orbite_peer_transports(no, 1, &mut mask), e.clone());
        refused("register_memory", orbite_register_memory(no, addr, 4096, 0, &mut id), e.clone());
        refused("unregister_memory", orbite_unregister_memory(no, 1, 0), e.clone());
        refused("record_producer_stream", orbite_record_producer_stream(no, 1, std::ptr::null_mut()), e.clone());
        refused("connect", orbite_connect(no, ep.as_ptr(), 1, &mut id), e.clone());
        refused("connect_name", orbite_connect_name(no, c"x".as_ptr(), 1, &mut id), e.clone());
        refused("peer_regions_json", orbite_peer_regions_json(no, 1, b, cap, &mut n), e.clone());
        refused("peer_regions", orbite_peer_regions(no, 1, info, 4, &mut n), e.clone());
        refused("disconnect", orbite_disconnect(no, 1, 0), e.clone());
        refused("flush_nvlink_cache", orbite_flush_nvlink_cache(no, 0), e.clone());
        refused("close_requester", orbite_close_requester(no, 0), e.clone());
        refused("close_source", orbite_close_source(no, 0), e.clone());
        refused("close", orbite_close(no, 0), e);

        // A live engine, one argument wrong at a time.
        refused("engine_new out", orbite_engine_new(std::ptr::null(), std::ptr::null_mut()), null_arg("out_engine"));
        let dangling = std::ptr::NonNull::<orbite_engine>::dangling().as_ptr();
        let mut kept = dangling;
        let not_utf8 = c"{\"name\": \"\xff\"}";
        let st = orbite_engine_new(not_utf8.as_ptr(), &mut kept);
        refused("engine_new utf8", st, Error::InvalidArgument("config_json is not valid UTF-8".into()));
        assert_eq!(kept, dangling, "no engine written");
        refused("endpoint out_len", orbite_engine_endpoint(engine, b, cap, std::ptr::null_mut()), null_arg("out_len"));
        let st = orbite_engine_stats_json(engine, b, cap, std::ptr::null_mut());
        refused("stats_json out_len", st, null_arg("out_len"));
        refused("engine_transports out", orbite_engine_transports(engine, std::ptr::null_mut()), null_arg("out_mask"));
        let st = orbite_peer_transports(engine, unknown, std::ptr::null_mut());
        refused("peer_transports out", st, null_arg("out_mask"));
        let st = orbite_register_memory(engine, addr, 4096, 0, std::ptr::null_mut());
        refused("register_memory out", st, null_arg("out_region"));
        let st = orbite_register_memory(engine, std::ptr::null_mut(), 4096, ORBITE_ACCESS_READ, &mut id);
        refused("register_memory addr", st, null_arg("addr"));
        let zero = || Error::InvalidArgument("region id 0 is never valid".into());
        refused("unregister_memory 0", orbite_unregister_memory(engine, 0, 0), zero());
        refused("record_producer_stream 0", orbite_record_producer_stream(engine, 0, std::ptr::null_mut()), zero());
        refused("connect endpoint", orbite_connect(engine, std::ptr::null(), 1, &mut id), null_arg("endpoint"));
        refused("connect out", orbite_connect(engine, ep.as_ptr(), 1, std::ptr::null_mut()), null_arg("out_peer"));
        let st = orbite_connect(engine, c"127.0.0.1:\xff".as_ptr(), 1, &mut id);
        refused("connect utf8", st, Error::InvalidArgument("endpoint is not valid UTF-8".into()));
        refused("connect_name name", orbite_connect_name(engine, std::ptr::null(), 1, &mut id), null_arg("name"));
        let st = orbite_connect_name(engine, c"x".as_ptr(), 1, std::ptr::null_mut());
        refused("connect_name out", st, null_arg("out_peer"));
        let st = orbite_peer_regions_json(engine, unknown, b, cap, std::ptr::null_mut());
        refused("peer_regions_json out_len before the peer", st, null_arg("out_len"));
        let st = orbite_peer_regions(engine, unknown, info, 4, std::ptr::null_mut());
        refused("peer_regions out_count", st, null_arg("out_count"));

        assert_eq!((n, mask, id), (77, 77, 77), "an out-parameter was written");
        assert!(buf.iter().all(|&c| c == 0x7f), "buf was written");
        // SAFETY: engine is the live engine orbite_engine_new gave above.
        assert!(unsafe { &*engine }.engine.regions().is_empty(), "a refused registration registered");
        orbite_engine_free(engine);
    }

    /// orbite_engine_free(NULL) does nothing (the last error a failing call
    /// left stays); a handle of another type passed as the engine is left
    /// alone (still live, usable and freed by its own function afterwards)
    /// and the last error says what it is. Guards take_back's `return
    /// Ok(None)` for NULL and orbite_engine_free's `set_last_error`.
    #[test]
    fn freeing_null_or_another_handle_as_an_engine_does_nothing() {
        set_last_error("an earlier failure");
        orbite_engine_free(std::ptr::null_mut());
        assert_eq!(said(), "an earlier failure");
        let stats = give_out(orbite_stats { entries: Vec::new() });
        orbite_engine_free(stats.cast());
        assert_eq!(said(), "invalid argument: engine is an orbite_stats, not an orbite_engine");
        let back = take_back(stats, "stats").expect("still a live orbite_stats");
        assert!(back.expect("not NULL").entries.is_empty());
    }

    /// The text out-parameter rule at its edge (write_text, here through
    /// orbite_engine_endpoint): a cap of exactly the text's length (no room
    /// for the NUL) is BUFFER_TOO_SMALL with *out_len the length and not a
    /// byte written, even past cap; one byte more is OK. Guards `if cap <
    /// n + 1` and the too-small branch's `*out_len = n`.
    #[test]
    fn a_text_out_parameter_without_room_for_the_nul_is_buffer_too_small() {
        let mut engine: *mut orbite_engine = std::ptr::null_mut();
        assert_eq!(orbite_engine_new(std::ptr::null(), &mut engine), Status::Ok as u32);
        // SAFETY: engine is the live engine orbite_engine_new gave above.
        let ep = unsafe { &*engine }.engine.endpoint();
        let mut buf = vec![0x7f as c_char; ep.len() + 8];
        let mut n = 99usize;
        let st = orbite_engine_endpoint(engine, buf.as_mut_ptr(), ep.len(), &mut n);
        assert_eq!((st, n), (Status::BufferTooSmall as u32, ep.len()));
        let want = format!("needs {} bytes including the NUL, cap is {}", ep.len() + 1, ep.len());
        assert_eq!(said(), Error::BufferTooSmall(want).to_string());
        assert!(buf.iter().all(|&c| c == 0x7f), "written into a buffer too small");
        n = 99;
        assert_eq!(orbite_engine_endpoint(engine, buf.as_mut_ptr(), ep.len() + 1, &mut n), Status::Ok as u32);
        // SAFETY: OK means buf holds a NUL-terminated text.
        assert_eq!((unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap(), n), (ep.as_str(), ep.len()));
        assert_eq!(buf[ep.len() + 1], 0x7f, "written past cap");
        orbite_engine_free(engine);
    }
}
