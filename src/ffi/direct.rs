//! Direct routes: one region of a same-host peer, copied to and from one
//! request at a time on the calling thread.

use super::boundary::*;
use super::handles::{give_out, live, take_back};
use super::transfer::{c_result, request_of, transport_from};
use super::types::*;
use crate::Error;

/// Opens a direct route to the region of `peer` that holds
/// [remote_addr, remote_addr+length), over `transport` (ORBITE_TRANSPORT_AUTO:
/// the first IPC transport of transport_policy that reaches the peer and
/// carries the region's memory). The peer is asked for its published regions
/// (one round trip, within timeout_ms; 0: the engine's default). The route
/// holds no mapping by itself: each orbite_direct_copy goes through the
/// engine's relocation cache and the peer's grants, as a submission does.
/// NOT_FOUND: no region of the peer holds the range; NOT_SUPPORTED:
/// ORBITE_TRANSPORT_TCP (it maps nothing), or a forced transport that cannot
/// carry the region's memory; UNAVAILABLE: no IPC transport reaches the peer
/// (another host) or carries that memory (orbite_last_error says which, per
/// transport). Free with orbite_direct_free; a route outliving its engine
/// only refuses copies.
#[no_mangle]
pub extern "C" fn orbite_direct_open(
    engine: *mut orbite_engine,
    peer: u64,
    remote_addr: u64,
    length: u64,
    transport: u32,
    timeout_ms: u32,
    out_direct: *mut *mut orbite_direct,
) -> orbite_status {
    guard(|| {
        let e = live(engine, "engine")?;
        let out = need_mut(out_direct, "out_direct")?;
        let t = transport_from(transport).ok_or_else(|| {
            Error::InvalidArgument(format!("transport is {transport} (use an ORBITE_TRANSPORT_* value)"))
        })?;
        let route = e.engine.open_direct(peer, remote_addr, length, t, timeout_opt(timeout_ms))?;
        *out = give_out(orbite_direct { route });
        Ok(())
    })
}

/// Copies one request through `direct` on the calling thread, and returns
/// once it has ended: OK with *out_result holding the request's outcome, as
/// orbite_batch_result gives it (never PENDING; when its status is not OK,
/// orbite_last_error names why). A copy that finds the peer's grant
/// revoked (the region unregistered) or the peer gone ends with that
/// failure; open a new route then, or submit. The call itself fails,
/// nothing moved and *out_result untouched, when `direct` belongs to
/// another engine, request->length is 0, the local range lies in no
/// registered region (NOT_FOUND), the route's transport cannot copy that
/// local memory (NOT_SUPPORTED), or the engine or its requester side is
/// closed (UNAVAILABLE). timeout_ms bounds what the copy may wait for
/// (0: the engine's default).
#[no_mangle]
pub extern "C" fn orbite_direct_copy(
    engine: *mut orbite_engine,
    direct: *const orbite_direct,
    request: *const orbite_request,
    timeout_ms: u32,
    out_result: *mut orbite_request_result,
) -> orbite_status {
    guard(|| {
        let e = live(engine, "engine")?;
        let d = live(direct, "direct")?;
        let r = need(request, "request")?;
        let out = need_mut(out_result, "out_result")?;
        let req = request_of(r, || "request".into())?;
        let (result, failure) = e.engine.copy_direct(&d.route, &req, timeout_opt(timeout_ms))?;
        if let Some(f) = failure {
            set_last_error(&f.to_string());
        }
        *out = c_result(&result);
        Ok(())
    })
}

/// Frees a direct route. NULL is a no-op.
#[no_mangle]
pub extern "C" fn orbite_direct_free(direct: *mut orbite_direct) {
    guard_value((), || {
        if let Err(e) = take_back(direct, "direct").map(drop) {
            set_last_error(&e.to_string());
        }
    })
}
