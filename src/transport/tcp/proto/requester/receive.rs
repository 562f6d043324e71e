//! The receive side of [`RequesterCore`]: where the next bytes go, frames
//! gathered and handled, answers matched to their requests (or dropped,
//! when their request was failed at its deadline).

use super::*;

impl<T: Startable, H, N> RequesterCore<T, H, N> {
    /// Where the next bytes read go.
    pub fn recv(&self) -> Recv {
        match &self.want {
            Want::Payload { addr, len, done_bytes, .. } => {
                Recv::Direct { addr: addr + done_bytes, len: len - done_bytes }
            }
            _ => Recv::Buffer,
        }
    }

    /// Payload bytes still to come (the receive low-water mark).
    pub fn payload_left(&self) -> Option<u64> {
        match &self.want {
            Want::Payload { len, done_bytes, .. } => Some(len - done_bytes),
            Want::Discard { left } => Some(*left),
            _ => None,
        }
    }

    /// `n` bytes read straight into the memory [`Recv::Direct`] named.
    pub fn landed(&mut self, n: u64) {
        if let Want::Payload { done_bytes, .. } = &mut self.want {
            *done_bytes += n;
        }
        self.payload_done();
    }

    fn payload_done(&mut self) {
        if matches!(&self.want, Want::Payload { len, done_bytes, .. } if done_bytes == len) {
            if let Want::Payload { record, hold, .. } = std::mem::replace(&mut self.want, Want::Header) {
                drop(hold);
                self.done.push((record, ChunkOutcome::ok(Op::Read)));
            }
        }
    }

    /// Bytes read into the driver's buffer; READ payload among them goes
    /// through `land`. `Ok(false)`: the peer said Goodbye. `Err`: the
    /// connection must end ([`RequesterCore::kill`]).
    pub fn received(&mut self, mut data: &[u8], land: &mut impl Land) -> Result<bool> {
        while !data.is_empty() {
            match &mut self.want {
                Want::Discard { left } => {
                    let n = (*left).min(data.len() as u64);
                    *left -= n;
                    data = &data[n as usize..];
                    if *left == 0 {
                        self.want = Want::Header;
                    }
                    continue;
                }
                Want::Payload { addr, len, done_bytes, .. } => {
                    let n = ((*len - *done_bytes) as usize).min(data.len());
                    land.land(*addr + *done_bytes, &data[..n]);
                    *done_bytes += n as u64;
                    data = &data[n..];
                    self.payload_done();
                    continue;
                }
                _ => {}
            }
            let need = match &self.want {
                Want::Header => FRAME_HEADER_LEN,
                Want::Body(h) => h.body_len as usize,
                Want::Fixed(_) => DATA_RESPONSE_LEN,
                Want::Reason { len, .. } => *len,
                Want::Payload { .. } | Want::Discard { .. } => unreachable!("handled above"),
            };
            let take = (need - self.partial.len()).min(data.len());
            self.partial.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.partial.len() == need && !self.complete()? {
                self.closed_by_peer = true;
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The peer ended the stream: in order between frames (`Ok`), or
    /// mid-frame (`Err`).
    pub fn eof(&mut self) -> Result<()> {
        match (&self.want, self.partial.is_empty()) {
            (Want::Header, true) => {
                self.closed_by_peer = true;
                Ok(())
            }
            _ => Err(Error::Unavailable("peer closed the connection mid-frame".into())),
        }
    }

    /// Whether the peer ended the stream in order.
    pub fn closed_by_peer(&self) -> bool {
        self.closed_by_peer
    }

    /// Handles the unit `partial` completed. `Ok(false)`: Goodbye.
    fn complete(&mut self) -> Result<bool> {
        let bytes = std::mem::take(&mut self.partial);
        match std::mem::replace(&mut self.want, Want::Header) {
            Want::Header => {
                let h = FrameHeader::decode(bytes[..].try_into().expect("a whole header"))?;
                match h.kind {
                    MsgKind::ReadResponse | MsgKind::WriteResponse => {
                        if (h.body_len as usize) < DATA_RESPONSE_LEN {
                            return Err(Error::Protocol(format!("{:?} of {} bytes is too short", h.kind, h.body_len)));
                        }
                        self.want = Want::Fixed(h);
                    }
                    MsgKind::Describe | MsgKind::Error | MsgKind::NotifyAck if h.body_len > 0 => {
                        self.want = Want::Body(h)
                    }
                    MsgKind::Describe | MsgKind::Error | MsgKind::NotifyAck => return self.control_frame(h, &[]),
                    MsgKind::Goodbye | MsgKind::Revoke if h.body_len != 0 => {
                        return Err(Error::Protocol(format!("{:?} with a body", h.kind)))
                    }
                    MsgKind::Goodbye => return Ok(false),
                    MsgKind::Revoke => self.events.push(Event::Revoke),
                    other => return Err(Error::Protocol(format!("unexpected {other:?} from the source side"))),
                }
            }
            Want::Body(h) => return self.control_frame(h, &bytes),
            Want::Fixed(h) => self.answer(h, &bytes)?,
            Want::Reason { done, tag, status, .. } => {
                let msg = String::from_utf8_lossy(&bytes).into_owned();
                let e = Error::from_status(status, format!("{}: {msg}", self.label));
                match done {
                    Some((d, _)) => self.done.push((d, ChunkOutcome::failed(e, RemoteEffect::None))),
                    None => self.answered_early(tag, ChunkOutcome::failed(e, RemoteEffect::None)),
                }
            }
            Want::Payload { .. } | Want::Discard { .. } => unreachable!("payload is not gathered in `partial`"),
        }
        if bytes.capacity() <= 4096 {
            self.partial = bytes;
            self.partial.clear();
        }
        Ok(true)
    }

    fn control_frame(&mut self, h: FrameHeader, body: &[u8]) -> Result<bool> {
        match h.kind {
            MsgKind::Describe => {
                let d = Describe::decode(body)?;
                if d.identity.engine_epoch != self.describe.identity.engine_epoch {
                    return Err(Error::Protocol("peer changed its engine epoch mid-connection".into()));
                }
                self.describe = Arc::new(d);
                self.describe_generation += 1;
                self.describes_awaited = self.describes_awaited.saturating_sub(1);
                self.events.push(Event::Described);
            }
            MsgKind::Error => {
                let (st, text) = message::decode_error(body)?;
                return Err(Error::from_status(
                    if st == Status::Ok { Status::Unavailable } else { st },
                    format!("{} closed the connection: {text}", self.label),
                ));
            }
            MsgKind::NotifyAck => {
                let (tag, outcome) = crate::control::notify_frame::decode_ack(body)?;
                let Some(p) = self.notes.remove(&tag) else {
                    return Err(Error::Protocol(format!("NotifyAck for unknown tag {tag}")));
                };
                let label = &self.label;
                let outcome = outcome.map_err(|e| {
                    Error::from_status(e.status(), format!("{label} refused the notification: {}", e.message()))
                });
                self.events.push(Event::NotifyAnswer(p.answer, outcome, true));
            }
            other => return Err(Error::Protocol(format!("unexpected {other:?} from the source side"))),
        }
        Ok(true)
    }

    /// The fixed part of a READ/WRITE answer: finds its request and says
    /// what follows (nothing, its failure text, or its payload).
    fn answer(&mut self, h: FrameHeader, fixed: &[u8]) -> Result<()> {
        let resp = DataResponse::decode(fixed.try_into().expect("a whole fixed part"))?;
        let rest = h.body_len as u64 - DATA_RESPONSE_LEN as u64;
        let want = if h.kind == MsgKind::ReadResponse { Op::Read } else { Op::Write };
        match self.pending.get(&resp.tag) {
            Some(e) if e.op == want && e.early.is_some() => {
                return Err(Error::Protocol(format!("{:?} for tag {} answered twice", h.kind, resp.tag)))
            }
            Some(e) if e.op == want => {}
            Some(_) => {
                return Err(Error::Protocol(format!("{:?} for tag {} of the other direction", h.kind, resp.tag)))
            }
            None => return self.abandoned_answer(h, resp, rest, want),
        }
        if self.pending[&resp.tag].sending {
            return self.early_answer(resp, rest);
        }
        let mut e = self.pending.remove(&resp.tag).expect("present");
        // The local memory is needed only by a READ's payload, still to
        // land; otherwise it is free before the outcome is recorded.
        let hold = e.hold.take();
        if resp.status != Status::Ok {
            drop(hold);
            if rest > MAX_REASON as u64 + 2 {
                let err = Error::Protocol(format!("failure text of {rest} bytes is too long"));
                self.done.push((e.done, ChunkOutcome::failed(err.clone(), RemoteEffect::None)));
                return Err(err);
            }
            if rest == 0 {
                let err = Error::from_status(resp.status, format!("{}: ", self.label));
                self.done.push((e.done, ChunkOutcome::failed(err, RemoteEffect::None)));
            } else {
                let done = Some((e.done, e.deadline));
                self.want = Want::Reason { done, tag: resp.tag, len: rest as usize, status: resp.status };
            }
            return Ok(());
        }
        match want {
            Op::Write if rest != 0 => {
                drop(hold);
                let err = Error::Protocol("WRITE success carries a body".into());
                self.done.push((e.done, ChunkOutcome::failed(err.clone(), RemoteEffect::Unknown)));
                Err(err)
            }
            Op::Write => {
                drop(hold);
                self.done.push((e.done, ChunkOutcome::ok(Op::Write)));
                Ok(())
            }
            Op::Read if rest != e.len => {
                drop(hold);
                let err = Error::Protocol(format!("READ answer carries {rest} bytes, asked for {}", e.len));
                self.done.push((e.done, ChunkOutcome::failed(err.clone(), RemoteEffect::None)));
                Err(err)
            }
            Op::Read => {
                // The hold keeps the local memory until the payload landed.
                self.want = Want::Payload {
                    addr: e.local_addr,
                    len: rest,
                    done_bytes: 0,
                    deadline: e.deadline,
                    record: e.done,
                    hold,
                };
                self.payload_done();
                Ok(())
            }
        }
    }

    /// The answer to a WRITE still being sent: recorded on its entry (or,
    /// for a failure with text, once the text is in).
    fn early_answer(&mut self, resp: DataResponse, rest: u64) -> Result<()> {
        if resp.status == Status::Ok {
            if rest != 0 {
                return Err(Error::Protocol("WRITE success carries a body".into()));
            }
            self.answered_early(resp.tag, ChunkOutcome::ok(Op::Write));
            return Ok(());
        }
        if rest > MAX_REASON as u64 + 2 {
            return Err(Error::Protocol(format!("failure text of {rest} bytes is too long")));
        }
        if rest == 0 {
            let e = Error::from_status(resp.status, format!("{}: ", self.label));
            self.answered_early(resp.tag, ChunkOutcome::failed(e, RemoteEffect::None));
        } else {
            self.want = Want::Reason { done: None, tag: resp.tag, len: rest as usize, status: resp.status };
        }
        Ok(())
    }

    /// Applies the answer of WRITE `tag`: kept on its entry while its
    /// payload is still being sent (its memory in use), at once otherwise.
    fn answered_early(&mut self, tag: u64, outcome: ChunkOutcome) {
        let Some(e) = self.pending.get_mut(&tag) else { return };
        if e.sending && !mutated!(self.mutations.complete_early_writes) {
            e.early = Some(outcome);
            return;
        }
        let mut e = self.pending.remove(&tag).expect("present");
        drop(e.hold.take());
        self.done.push((e.done, outcome));
    }

    /// The answer to a request that was failed at its deadline: checked as
    /// any answer is, then dropped (its payload or failure text too).
    fn abandoned_answer(&mut self, h: FrameHeader, resp: DataResponse, rest: u64, want: Op) -> Result<()> {
        let Some((op, len)) = self.abandoned.remove(&resp.tag) else {
            return Err(Error::Protocol(format!("{:?} for unknown tag {}", h.kind, resp.tag)));
        };
        let fits = match (op == want, resp.status == Status::Ok, want) {
            (false, _, _) => false,
            (true, false, _) => rest <= MAX_REASON as u64 + 2,
            (true, true, Op::Read) => rest == len,
            (true, true, Op::Write) => rest == 0,
        };
        if !fits {
            return Err(Error::Protocol(format!("{:?} for tag {} does not match its request", h.kind, resp.tag)));
        }
        self.dropped += 1;
        if rest > 0 {
            self.want = Want::Discard { left: rest };
        }
        Ok(())
    }
}
