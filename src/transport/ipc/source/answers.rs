//! The answers a served channel makes: one per request (exports never wait
//! for each other), the MNNVL probe's, an offer answered on a thread of its
//! own once its producer stream is done, a handle's answer, and what an
//! answer dropped unsent ends.

use super::*;
use crate::transport::ipc::backend::ExportedHandle;

impl IpcServed {
    /// The answer to one request (exports never wait for each other: an
    /// offer is made or refused at once; an accepted offer whose producer
    /// stream must be waited for is answered on a thread of its own).
    pub(super) fn answer(&self, kind: MsgKind, body: &[u8], ticket: u64) -> Result<Reply<Attached>> {
        let (table, conn) = (&self.table, self.conn);
        let verified = (!self.ch.is_tcp()).then_some(self.requester);
        Ok(Reply::Now(match kind {
            MsgKind::ExportRequest => {
                let req = ExportRequest::decode(body)?;
                // An honest requester keeps within OFFERS_MAX (its link's
                // offer places); one that pipelines more requests cannot
                // hold the mapping budget.
                if table.unanswered_offers(conn) >= messages::OFFERS_MAX {
                    let e = Error::ResourceExhausted(format!(
                        "{} offers on this IPC channel are still unanswered; answer them first",
                        messages::OFFERS_MAX
                    ));
                    return Ok(Reply::Now(reject(req.tag, &e)));
                }
                // Only a kernel-verified requester can later be proven gone.
                match table.offer(conn, verified, &req) {
                    Ok(offer) => plain(MsgKind::ExportOffer, &offer.encode()),
                    Err(e) => reject(req.tag, &e),
                }
            }
            MsgKind::ExportAnswer => {
                let r = ExportRef::decode(body, "ExportAnswer")?;
                // A decline releases the offer: the close waits for its ACK.
                let acking = table.ack_guard();
                if table.answer_waits(conn, &r) && self.answer_later(ticket, r) {
                    return Ok(Reply::Later);
                }
                let mut a = self.export_answer(table.answer(conn, &r), &r)?;
                a.extra._ack = Some(acking);
                a
            }
            MsgKind::Revalidate => {
                let v = Revalidate::decode(body)?;
                match table.revalidate(conn, &v) {
                    Ok(generation) => {
                        let mut b = v.tag.to_le_bytes().to_vec();
                        b.extend_from_slice(&generation.to_le_bytes());
                        plain(MsgKind::RevalidateOk, &b)
                    }
                    Err(e) => reject(v.tag, &e),
                }
            }
            MsgKind::OpComplete | MsgKind::CloseReceipt => {
                let r = ExportRef::decode(body, "receipt")?;
                // The release is visible before the ACK leaves, and the
                // source's close (woken by the release) waits for the ACK.
                let acking = table.ack_guard();
                let res = if kind == MsgKind::OpComplete {
                    table.op_complete(conn, &r)
                } else {
                    table.close_receipt(conn, verified, &r)
                };
                let mut a = match res {
                    Ok(()) => plain(MsgKind::Ack, &ExportRef { value: 0, extra: kind as u32, ..r }.encode()),
                    Err(e) => reject(r.export_id, &e),
                };
                a.extra._ack = Some(acking);
                a
            }
            MsgKind::MnnvlProbe => self.probe_answer()?,
            other => return Err(Error::Protocol(format!("unexpected {other:?} on the IPC channel"))),
        }))
    }

    /// The answer to `MnnvlProbe`: this engine's fabric place and its probe
    /// allocation's handle, on an MNNVL channel of an engine that made one;
    /// a refusal otherwise (the channel goes on).
    pub(super) fn probe_answer(&self) -> Result<Answer> {
        let mnnvl = self.ctx.tables.iter().any(|(k, t)| *k == TransportKind::Mnnvl && Arc::ptr_eq(t, &self.table));
        let made = match &self.ctx.probe {
            Some(probe) if mnnvl => probe(),
            _ => Err(Error::NotSupported("this engine answers MNNVL probes only on an MNNVL channel".into())),
        };
        Ok(match made {
            Ok((_, Some(_))) if self.ch.is_tcp() => {
                reject(0, &Error::NotSupported("a POSIX-fd probe handle cannot cross a TCP (fabric) channel".into()))
            }
            Ok((body, fd)) => {
                let mut a = plain(MsgKind::MnnvlProbeAnswer, &body);
                a.extra.fd = fd;
                a
            }
            Err(e) => reject(0, &e),
        })
    }

    /// Answers offer `r` on a thread of its own, which waits for the
    /// producer stream (no lock held), makes the handle and fills in
    /// `ticket`. `false` when no thread could be started (the caller
    /// answers inline).
    pub(super) fn answer_later(&self, ticket: u64, r: ExportRef) -> bool {
        let (me, table, conn, acking) = (self.me.clone(), self.table.clone(), self.conn, self.table.ack_guard());
        let job = move || {
            let made = table.answer_after_wait(conn, &r);
            let Some(s) = me.upgrade() else { return };
            let core = s.core.lock();
            let a = match s.export_answer(made, &r) {
                Ok(mut a) => {
                    a.extra._ack = Some(acking);
                    a
                }
                Err(e) => return s.fail(&e, core),
            };
            let mut core = core;
            let refused = core.fill(ticket, a, Instant::now()).err();
            drop(core);
            if let Some(a) = &refused {
                s.not_sent(a);
            }
            drop(refused);
            if let Some(reg) = s.reg.get() {
                reg.wake();
            }
        };
        std::thread::Builder::new().name("orbite-export".into()).spawn(job).is_ok()
    }

    /// An answer dropped before its first byte left: the export whose
    /// handle it carries ends.
    pub(super) fn not_sent(&self, a: &Answer) {
        if let Some(r) = &a.extra.export {
            self.table.handle_not_sent(self.conn, r);
        }
    }

    /// The answer to an accepted offer: the handle (its descriptor owned
    /// by the answer), an ACK of a decline, or the refusal.
    pub(super) fn export_answer(&self, made: Result<Option<ExportedHandle>>, r: &ExportRef) -> Result<Answer> {
        Ok(match made {
            Ok(Some(h)) => {
                let mut b = ExportRef { value: 0, extra: 0, ..*r }.encode();
                b.extend_from_slice(&h.bytes);
                let mut a = plain(MsgKind::ExportHandle, &b);
                // The answer owns what it passes (the table made the
                // handle own its descriptor while the export was held).
                a.extra.fd = h.owned_fd;
                a.extra.export = Some(*r);
                if a.extra.fd.is_some() && self.ch.is_tcp() {
                    self.not_sent(&a);
                    return Err(Error::NotSupported(
                        "ExportHandle carries a file descriptor, which cannot cross a TCP (fabric) channel".into(),
                    ));
                }
                a
            }
            Ok(None) => {
                plain(MsgKind::Ack, &ExportRef { value: 0, extra: MsgKind::ExportAnswer as u32, ..*r }.encode())
            }
            Err(e) => reject(r.export_id, &e),
        })
    }
}
