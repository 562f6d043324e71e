//! The receive side of [`SourceCore`]: bytes gathered into frames,
//! requests validated through the host and answered (READ payload by
//! address, WRITE payload landed), notifications admitted, the answers'
//! bound held before each frame.

use super::*;

impl<H: SourceHost> SourceCore<H> {
    /// Bytes read into the driver's buffer: requests are answered as they
    /// complete, a WRITE's payload among them landed through
    /// [`SourceHost::land`]. What cannot be handled yet (the answers are
    /// at their bound at a frame boundary) is kept for
    /// [`SourceCore::resume`]. `Err`: the connection must end (a protocol
    /// error is told to the peer by [`SourceCore::fail`]).
    pub fn received(&mut self, data: &[u8], now: Instant, host: &mut H) -> Result<()> {
        if self.stashed() {
            self.stash.extend_from_slice(data);
            return self.resume(now, host);
        }
        let used = self.feed(data, now, host)?;
        if used < data.len() {
            self.stash = data[used..].to_vec();
            self.stash_at = 0;
        }
        Ok(())
    }

    /// Handles what was read and not handled yet, as far as the bounds
    /// allow (after a send freed room, or in a new turn).
    pub fn resume(&mut self, now: Instant, host: &mut H) -> Result<()> {
        let data = std::mem::take(&mut self.stash);
        let used = self.feed(&data[self.stash_at..], now, host)?;
        self.stash_at += used;
        // Kept until it is all handled (an idle connection holds none).
        if self.stash_at < data.len() && !self.ended() {
            self.stash = data;
        } else {
            self.stash_at = 0;
        }
        Ok(())
    }

    /// Consumes bytes; stops (returning how many it used) at a frame
    /// boundary while the answers waiting are at their bound, or once
    /// this turn's frames are used.
    fn feed(&mut self, data: &[u8], now: Instant, host: &mut H) -> Result<usize> {
        let mut at = 0;
        while at < data.len() {
            // A frame boundary with the answers at their bound, or the
            // turn's share used: the rest waits.
            if matches!(self.want, Want::Header) && self.partial.is_empty() && (self.full() || self.turn_used()) {
                return Ok(at);
            }
            match &mut self.want {
                Want::Ended => return Ok(data.len()),
                Want::Landing { req, pace, .. } => {
                    let n = ((req.len - pace.done) as usize).min(data.len() - at);
                    host.land(req.addr + pace.done, &data[at..at + n]);
                    pace.advance(n as u64, &self.limits, now);
                    at += n;
                    self.landing_done(host);
                    continue;
                }
                Want::Discard { left, pace, .. } => {
                    let n = (*left as usize).min(data.len() - at);
                    *left -= n as u64;
                    pace.advance(n as u64, &self.limits, now);
                    at += n;
                    self.discarded(host);
                    continue;
                }
                _ => {}
            }
            let need = match &self.want {
                Want::Header => FRAME_HEADER_LEN,
                Want::Fixed(_) => DATA_REQUEST_LEN,
                Want::Body(h) => h.body_len as usize,
                Want::NotifyTag(_) => 8,
                _ => unreachable!("handled above"),
            };
            if self.deadline.is_none() {
                self.deadline = Some(now + self.limits.stall);
            }
            let take = (need - self.partial.len()).min(data.len() - at);
            self.partial.extend_from_slice(&data[at..at + take]);
            at += take;
            if self.partial.len() == need {
                self.complete(now, host)?;
            }
        }
        Ok(at)
    }

    /// A WRITE's payload is in, if it is: its answer joins the waiting ones.
    pub(super) fn landing_done(&mut self, host: &mut H) {
        if matches!(&self.want, Want::Landing { req, pace, .. } if pace.done == req.len) {
            if let Want::Landing { req, held, .. } = std::mem::replace(&mut self.want, Want::Header) {
                drop(held);
                host.served(true, req.len);
                let fixed = DataResponse { tag: req.tag, status: Status::Ok }.encode();
                self.push_bytes(&FrameHeader::encode(MsgKind::WriteResponse, fixed.len() as u32));
                self.push_bytes(&fixed);
            }
        }
    }

    /// A discarded payload is through, if it is: its refusal follows.
    fn discarded(&mut self, host: &mut H) {
        if !matches!(&self.want, Want::Discard { left: 0, .. }) {
            return;
        }
        let Want::Discard { then, .. } = std::mem::replace(&mut self.want, Want::Header) else {
            unreachable!("matched above")
        };
        match then {
            AfterDiscard::Refuse { tag, err } => self.refuse(MsgKind::WriteResponse, tag, &err, host),
            AfterDiscard::RejectNotify { tag, len } => {
                host.notify_rejected();
                let e = Error::InvalidArgument(format!(
                    "a notification frame of {len} bytes exceeds the receiver's notification_max_bytes ({})",
                    host.notify_max()
                ));
                self.push_frame(MsgKind::NotifyAck, &crate::control::notify_frame::encode_ack(tag, &Err(e)));
            }
        }
    }

    fn push_bytes(&mut self, b: &[u8]) {
        self.bytes += b.len() as u64;
        if let Some(Item::Bytes(v)) = self.items.back_mut() {
            v.extend_from_slice(b);
        } else {
            self.items.push_back(Item::Bytes(b.to_vec()));
        }
    }

    /// Queues a whole control frame behind the answers waiting (a `Revoke`).
    pub fn push_frame(&mut self, kind: MsgKind, body: &[u8]) {
        self.push_bytes(&FrameHeader::encode(kind, body.len() as u32));
        self.push_bytes(body);
    }

    fn refuse(&mut self, kind: MsgKind, tag: u64, e: &Error, host: &mut H) {
        host.served(false, 0);
        let text = e.message();
        let text = message::cut_at_char(text, message::MAX_REASON).as_bytes();
        let fixed = DataResponse { tag, status: e.status() }.encode();
        self.push_bytes(&FrameHeader::encode(kind, (fixed.len() + text.len()) as u32));
        self.push_bytes(&fixed);
        self.push_bytes(text);
    }

    fn close_after_answers(&mut self) {
        self.want = Want::Ended;
        self.items.push_back(Item::Close);
    }

    /// Handles the unit `partial` completed and says what comes next.
    fn complete(&mut self, now: Instant, host: &mut H) -> Result<()> {
        let bytes = std::mem::take(&mut self.partial);
        self.deadline = None;
        match std::mem::replace(&mut self.want, Want::Header) {
            Want::Header => {
                self.turn_frames += 1;
                let h = FrameHeader::decode(bytes[..].try_into().expect("a whole header"))?;
                self.header(h, host)?;
            }
            Want::Fixed(h) => self.request(h, &bytes, now, host)?,
            Want::Body(h) => self.body(h, &bytes, host)?,
            Want::NotifyTag(h) => {
                let tag = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
                let len = h.body_len as usize;
                let pace = Pace::new(&self.limits, (len - 8) as u64, now);
                self.want =
                    Want::Discard { left: (len - 8) as u64, pace, then: AfterDiscard::RejectNotify { tag, len } };
                self.discarded(host);
            }
            Want::Landing { .. } | Want::Discard { .. } | Want::Ended => {
                unreachable!("payload is not gathered in `partial`")
            }
        }
        // The buffer is kept for the next unit unless a large body grew it
        // (an idle connection holds next to nothing).
        if bytes.capacity() <= 4096 && self.partial.is_empty() {
            self.partial = bytes;
            self.partial.clear();
        }
        Ok(())
    }

    /// Queues this engine's Describe (one waits at a time: its bytes count
    /// against the answers' bound like any answer's).
    pub(super) fn queue_describe(&mut self, host: &mut H) {
        let mine = host.describe();
        self.push_frame(MsgKind::Describe, &mine);
        self.items.push_back(Item::DescribeSent);
        self.describing = true;
        self.turn_described = true;
    }

    fn header(&mut self, h: FrameHeader, host: &mut H) -> Result<()> {
        match h.kind {
            MsgKind::ReadRequest if h.body_len as usize != DATA_REQUEST_LEN => {
                Err(Error::Protocol(format!("ReadRequest body of {} bytes", h.body_len)))
            }
            MsgKind::ReadRequest | MsgKind::WriteRequest => {
                self.want = Want::Fixed(h);
                Ok(())
            }
            MsgKind::DescribeRequest if h.body_len != 0 => Err(Error::Protocol("DescribeRequest with a body".into())),
            MsgKind::DescribeRequest if self.describing || self.turn_described => {
                self.describe_due = true;
                Ok(())
            }
            MsgKind::DescribeRequest => {
                self.queue_describe(host);
                Ok(())
            }
            MsgKind::Notify => {
                let len = h.body_len as usize;
                if len > NOTIFY_OVERHEAD + host.notify_max() {
                    if len < 8 {
                        return Err(Error::Protocol(format!("Notify body of {len} bytes")));
                    }
                    self.want = Want::NotifyTag(h);
                } else if len == 0 {
                    self.body(h, &[], host)?;
                } else {
                    self.want = Want::Body(h);
                }
                Ok(())
            }
            MsgKind::Goodbye => {
                self.close_after_answers();
                Ok(())
            }
            MsgKind::Error if h.body_len == 0 => self.body(h, &[], host),
            MsgKind::Error => {
                self.want = Want::Body(h);
                Ok(())
            }
            other => Err(Error::Protocol(format!("unexpected {other:?} from the requester side"))),
        }
    }

    /// A whole Notify or Error body.
    fn body(&mut self, h: FrameHeader, body: &[u8], host: &mut H) -> Result<()> {
        if h.kind == MsgKind::Error {
            let _ = message::decode_error(body)?;
            self.close_after_answers();
            return Ok(());
        }
        let n = Notify::decode(body)?;
        let tag = n.tag;
        let admitted = host.admit(n);
        let verdict = admitted.as_ref().map(|_| ()).map_err(Clone::clone);
        self.push_frame(MsgKind::NotifyAck, &crate::control::notify_frame::encode_ack(tag, &verdict));
        // Visible only once the sender's OK has left (a connection that
        // ends first drops it: the sender hears of no delivery).
        if let Ok(a) = admitted {
            self.items.push_back(Item::Publish(a));
        }
        Ok(())
    }

    /// The fixed part of a READ or WRITE request.
    fn request(&mut self, h: FrameHeader, fixed: &[u8], now: Instant, host: &mut H) -> Result<()> {
        let req = DataRequest::decode(fixed.try_into().expect("a whole fixed part"))?;
        if h.kind == MsgKind::ReadRequest {
            match host.validate(&req, false) {
                Ok(held) => {
                    // Counted before it leaves: a requester that has its
                    // answer sees it counted here.
                    host.served(true, req.len);
                    let fixed = DataResponse { tag: req.tag, status: Status::Ok }.encode();
                    self.push_bytes(&FrameHeader::encode(MsgKind::ReadResponse, (fixed.len() as u64 + req.len) as u32));
                    self.push_bytes(&fixed);
                    if req.len > 0 {
                        self.bytes += req.len;
                        self.items.push_back(Item::Payload { addr: req.addr, len: req.len, _held: held });
                    }
                }
                Err(e) => self.refuse(MsgKind::ReadResponse, req.tag, &e, host),
            }
            return Ok(());
        }
        if h.body_len as u64 != DATA_REQUEST_LEN as u64 + req.len {
            return Err(Error::Protocol(format!(
                "WriteRequest body of {} bytes does not match its length {}",
                h.body_len, req.len
            )));
        }
        let pace = Pace::new(&self.limits, req.len, now);
        match host.validate(&req, true) {
            Ok(held) => {
                self.want = Want::Landing { req, held, pace };
                self.landing_done(host);
            }
            Err(err) => {
                self.want = Want::Discard { left: req.len, pace, then: AfterDiscard::Refuse { tag: req.tag, err } };
                self.discarded(host);
            }
        }
        Ok(())
    }

    /// The peer ended the stream. `Err` when it did so mid-frame.
    pub fn eof(&mut self) -> Result<()> {
        if !matches!(self.want, Want::Header) || !self.partial.is_empty() {
            return Err(Error::Unavailable("peer closed the connection mid-frame".into()));
        }
        self.close_after_answers();
        Ok(())
    }
}
