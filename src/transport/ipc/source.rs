//! Source side: serves one requester's IPC channel.

use super::channel::{deadline_tick, Channel, ChannelIo, Frame};
use super::export::ExportTable;
use super::messages::{self, ExportRef, ExportRequest, Hello, Revalidate, Welcome};
use crate::control::auth::{self, AuthKey, FrameIo};
use crate::control::frame::MsgKind;
use crate::control::identity::process_start_time;
use crate::control::message;
use crate::control::Identity;
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the IPC serving side needs.
pub struct IpcSourceContext {
    /// The exports of each IPC transport this engine offers.
    pub tables: Vec<(crate::kinds::TransportKind, Arc<ExportTable>)>,
    /// This engine's identity.
    pub identity: Identity,
    /// The fabric domain for which MNNVL channels are accepted over TCP.
    pub fabric_domain: Option<[u8; 16]>,
    /// Counters (fabric channels accepted).
    pub stats: Arc<crate::counters::Counters>,
    /// Set when the engine stops.
    pub stopping: Arc<AtomicBool>,
    /// Handshake deadline, and the stall bound of every answer.
    pub handshake_timeout: Duration,
    /// The shared key an IPC channel must prove, if any (fabric channels
    /// prove it on the TCP listener before they get here).
    pub auth: Option<AuthKey>,
    /// Users besides this process's own who may open a Unix channel.
    pub allowed_uids: Vec<u32>,
}

impl IpcSourceContext {
    /// Whether processes of `uid` may open a Unix IPC channel here.
    fn admits(&self, uid: u32) -> bool {
        // SAFETY: geteuid has no memory effects.
        uid == unsafe { libc::geteuid() } || self.allowed_uids.contains(&uid)
    }
}

/// The tick of one answer: the requester must read it within the stall
/// bound, or the channel ends (it cannot pin this thread).
fn answer_tick<'a>(stall: Duration, stop: &'a dyn Fn() -> Result<()>) -> impl FnMut() -> Result<()> + 'a {
    let deadline = Instant::now() + stall;
    move || {
        stop()?;
        if Instant::now() >= deadline {
            return Err(Error::Protocol(
                "answer not read within the stall bound (the requester is not reading)".into(),
            ));
        }
        Ok(())
    }
}

/// Serves one accepted IPC connection until it closes: a Unix channel
/// (`hello: None`: its uid is checked and, with a key, it authenticates
/// first), or a TCP fabric channel whose listener already authenticated it
/// and read its `IpcHello`.
pub fn serve(ctx: Arc<IpcSourceContext>, mut ch: Channel, conn: u64, hello: Option<Frame>) {
    let mut table = None;
    let r = serve_inner(&ctx, &mut ch, conn, &mut table, hello);
    if let Err(Error::Protocol(m)) = &r {
        let deadline = Instant::now() + Duration::from_secs(1);
        let mut tick = || deadline_tick(deadline, "error");
        let body = messages::encode_reject(0, crate::error::Status::ProtocolError, m);
        let _ = ch.send(MsgKind::ExportReject, &body, None, &mut tick);
    }
    ch.shutdown();
    if let Some(t) = table {
        t.connection_lost(conn);
    }
}

fn serve_inner(
    ctx: &IpcSourceContext,
    ch: &mut Channel,
    conn: u64,
    chosen: &mut Option<Arc<ExportTable>>,
    hello: Option<Frame>,
) -> Result<()> {
    let stop = || {
        if ctx.stopping.load(Ordering::Acquire) {
            return Err(Error::Unavailable("engine is shutting down".into()));
        }
        Ok(())
    };
    // Every answer must be read within the stall bound.
    let send = |ch: &mut Channel, kind: MsgKind, body: &[u8], fd: Option<std::os::fd::RawFd>| {
        ch.send(kind, body, fd, &mut answer_tick(ctx.handshake_timeout, &stop))
    };
    // Handshake: check the requester's claimed identity against the kernel.
    let hs_deadline = Instant::now() + ctx.handshake_timeout;
    let mut hs_tick = || {
        stop()?;
        if Instant::now() >= hs_deadline {
            return Err(Error::Protocol("no IpcHello within the handshake timeout".into()));
        }
        Ok(())
    };
    let f = match hello {
        Some(f) => f,
        None => {
            // A Unix channel: only this user's processes (and the allowed
            // uids) may open one; others learn nothing more.
            let (_, uid) = ch.peer_cred()?;
            if !ctx.admits(uid) {
                ctx.stats.ipc_uid_refusals.fetch_add(1, Ordering::Relaxed);
                let e = Error::PermissionDenied(format!(
                    "processes of user {uid} may not open an IPC channel to this engine (ipc_allowed_uids)"
                ));
                let deadline = Instant::now() + Duration::from_secs(1);
                let body = message::encode_error(e.status(), e.message());
                let _ = ch.send(MsgKind::Error, &body, None, &mut || deadline_tick(deadline, "refusal"));
                return Ok(());
            }
            let f = ch.recv(&mut hs_tick)?;
            if ctx.auth.is_none() && f.kind != MsgKind::AuthChallenge {
                f
            } else {
                let mut io = ChannelIo { ch: &mut *ch, deadline: hs_deadline, stop: &stop };
                if let Err(e) = auth::accept(&mut io, ctx.auth.as_ref(), (f.kind, &f.body)) {
                    ctx.stats.auth_failures.fetch_add(1, Ordering::Relaxed);
                    let _ = io.send_frame(MsgKind::Error, &auth::refusal(&e));
                    return Ok(());
                }
                ch.recv(&mut hs_tick)?
            }
        }
    };
    if f.kind != MsgKind::IpcHello {
        return Err(Error::Protocol(format!("expected IpcHello first, got {:?}", f.kind)));
    }
    let hello = Hello::decode(&f.body)?;
    let requester = hello.identity;
    let refuse = |ch: &mut Channel, e: Error| -> Result<()> {
        let body = messages::encode_reject(0, e.status(), e.message());
        send(ch, MsgKind::ExportReject, &body, None)?;
        Ok(())
    };
    if ch.is_tcp() {
        // A fabric channel: no kernel identity; only MNNVL with fabric
        // handles, and only for this engine's own nonzero fabric domain.
        let mnnvl = crate::kinds::TransportKind::Mnnvl as u32;
        match ctx.fabric_domain {
            Some(d) if hello.transport == mnnvl && hello.fabric_domain == d => {
                ctx.stats.fabric_channels.fetch_add(1, Ordering::Relaxed);
            }
            Some(_) if hello.transport == mnnvl => {
                return refuse(ch, Error::PermissionDenied("the requester's fabric domain is not this engine's".into()))
            }
            _ => {
                return refuse(
                    ch,
                    Error::NotSupported(
                        "this engine accepts IPC over TCP only for MNNVL with fabric handles and a fabric domain"
                            .into(),
                    ),
                )
            }
        }
    } else {
        let (pid, _) = ch.peer_cred()?;
        if pid != requester.process.pid || process_start_time(pid) != requester.process.start_time {
            return refuse(
                ch,
                Error::StalePeer(format!(
                    "requester claims pid {} (start {}), the kernel says pid {pid}",
                    requester.process.pid, requester.process.start_time
                )),
            );
        }
        if !ctx.identity.same_boot(&requester) {
            return refuse(ch, Error::StalePeer("requester runs on another boot; SHM needs the same host".into()));
        }
    }
    if hello.expected_source_epoch != ctx.identity.engine_epoch {
        return refuse(
            ch,
            Error::StalePeer(format!(
                "requester expects source epoch {:x}, this engine is {:x} (restarted?)",
                hello.expected_source_epoch, ctx.identity.engine_epoch
            )),
        );
    }
    let Some(table) = ctx.tables.iter().find(|(k, _)| *k as u32 == hello.transport).map(|(_, t)| t.clone()) else {
        return refuse(
            ch,
            Error::NotSupported(format!("this engine offers no IPC transport with code {}", hello.transport)),
        );
    };
    *chosen = Some(table.clone());
    // A Unix channel gets a grant board (a fabric channel crosses hosts:
    // every submission takes the round trip there). A board that cannot be
    // made only costs the round trips.
    let board = if ch.is_tcp() { None } else { super::export::ChannelBoard::create().ok().map(Arc::new) };
    if let Some(b) = &board {
        table.attach_board(conn, b.clone());
    }
    let board_fd = board.as_ref().map(|b| std::os::fd::AsRawFd::as_raw_fd(b.board().fd()));
    send(ch, MsgKind::IpcWelcome, &Welcome { identity: ctx.identity }.encode(), board_fd)?;

    loop {
        // An idle channel may wait for its next request without end; while
        // it waits, offers it never answered expire.
        let mut idle = || {
            stop()?;
            table.expire_offers(conn);
            Ok(())
        };
        let f = match ch.recv_bounded(&mut idle, Some(ctx.handshake_timeout)) {
            Ok(f) => f,
            Err(Error::Unavailable(_)) => return Ok(()),
            Err(e) => return Err(e),
        };
        match f.kind {
            MsgKind::ExportRequest => {
                let req = ExportRequest::decode(&f.body)?;
                // Only a kernel-verified requester can later be proven gone.
                let verified = (!ch.is_tcp()).then_some(requester);
                match table.offer(conn, verified, &req) {
                    Ok(offer) => send(ch, MsgKind::ExportOffer, &offer.encode(), None)?,
                    Err(e) => {
                        let body = messages::encode_reject(req.tag, e.status(), e.message());
                        send(ch, MsgKind::ExportReject, &body, None)?
                    }
                }
            }
            MsgKind::ExportAnswer => {
                let r = ExportRef::decode(&f.body, "ExportAnswer")?;
                // A decline releases the offer: the close waits for its ACK.
                let _acking = table.ack_guard();
                match table.answer(conn, &r) {
                    Ok(Some(h)) => {
                        let mut body = ExportRef { value: 0, extra: 0, ..r }.encode();
                        body.extend_from_slice(&h.bytes);
                        let fd = h.fd.or(h.owned_fd.as_ref().map(std::os::fd::AsRawFd::as_raw_fd));
                        send(ch, MsgKind::ExportHandle, &body, fd)?
                    }
                    Ok(None) => send(
                        ch,
                        MsgKind::Ack,
                        &ExportRef { value: 0, extra: MsgKind::ExportAnswer as u32, ..r }.encode(),
                        None,
                    )?,
                    Err(e) => {
                        let body = messages::encode_reject(r.export_id, e.status(), e.message());
                        send(ch, MsgKind::ExportReject, &body, None)?
                    }
                }
            }
            MsgKind::Revalidate => {
                let v = Revalidate::decode(&f.body)?;
                match table.revalidate(conn, &v) {
                    Ok(generation) => {
                        let mut body = v.tag.to_le_bytes().to_vec();
                        body.extend_from_slice(&generation.to_le_bytes());
                        send(ch, MsgKind::RevalidateOk, &body, None)?
                    }
                    Err(e) => {
                        let body = messages::encode_reject(v.tag, e.status(), e.message());
                        send(ch, MsgKind::ExportReject, &body, None)?
                    }
                }
            }
            MsgKind::OpComplete | MsgKind::CloseReceipt => {
                let r = ExportRef::decode(&f.body, "receipt")?;
                // The release is visible before the ACK leaves, and the
                // source's close (woken by the release) waits for the ACK.
                let _acking = table.ack_guard();
                let res = if f.kind == MsgKind::OpComplete {
                    table.op_complete(conn, &r)
                } else {
                    table.close_receipt(conn, (!ch.is_tcp()).then_some(requester), &r)
                };
                match res {
                    Ok(()) => {
                        let ack = ExportRef { value: 0, extra: f.kind as u32, ..r };
                        send(ch, MsgKind::Ack, &ack.encode(), None)?
                    }
                    Err(e) => {
                        let body = messages::encode_reject(r.export_id, e.status(), e.message());
                        send(ch, MsgKind::ExportReject, &body, None)?
                    }
                }
            }
            other => return Err(Error::Protocol(format!("unexpected {other:?} on the IPC channel"))),
        }
    }
}
