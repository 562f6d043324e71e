//! The serving side of an IPC channel as a state machine without sockets,
//! threads or a clock: it is fed the bytes the driver read and the time,
//! gathers frames (header, then body), asks its [`AnswerHost`] for the
//! answer to each complete request, and is polled for the answer bytes to
//! send next. Answers leave in request order. An answer the host makes
//! elsewhere (an export whose producer stream must be waited for) holds
//! its place as a ticket until the driver [`fills`](IpcSourceCore::fill)
//! it; the answers behind it wait, the channel's reading goes on up to the
//! bound.
//!
//! Bounds: no more requests are handled while `ANSWERS_MAX` answers wait
//! (a requester asks one thing at a time); a frame once started must be
//! complete within the stall bound (restarted when the core itself paused
//! reading, so a pause of ours is never the peer's fault); an answer ready
//! to leave must have left within the stall bound (a requester that does
//! not read cannot pin the channel). An answer being made is not the
//! peer's to read yet, so it starts no such bound.

use crate::control::frame::{FrameHeader, MsgKind, FRAME_HEADER_LEN, MAX_CONTROL_BODY};
use crate::error::{Error, Result};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Answers waiting beyond which no more requests are handled.
pub const ANSWERS_MAX: usize = 64;

/// One answer: its frame and what rides with it (`X`: a descriptor to send
/// with the first byte, guards to drop once it left; opaque to the core).
pub struct Answer<X> {
    /// The whole frame, header included.
    pub bytes: Vec<u8>,
    /// What the driver sends with it and keeps until it left.
    pub extra: X,
}

impl<X> Answer<X> {
    /// An answer frame of `kind` carrying `body`.
    pub fn new(kind: MsgKind, body: &[u8], extra: X) -> Answer<X> {
        let mut bytes = FrameHeader::encode(kind, body.len() as u32).to_vec();
        bytes.extend_from_slice(body);
        Answer { bytes, extra }
    }
}

/// The host's reply to one request.
pub enum Reply<X> {
    /// The answer, made now.
    Now(Answer<X>),
    /// Made elsewhere: the driver fills the ticket it was given.
    Later,
}

/// What the protocol needs of its engine: the answer to each request.
pub trait AnswerHost<X> {
    /// The answer to one complete frame of `kind` with `body`; `ticket`
    /// names its place if the host answers [`Reply::Later`]. An error ends
    /// the channel (a protocol error is told to the peer).
    fn answer(&mut self, kind: MsgKind, body: &[u8], ticket: u64) -> Result<Reply<X>>;
}

/// One place in the answer queue.
enum Slot<X> {
    Ready(Answer<X>),
    Making(u64),
}

/// One IPC channel's serving state.
pub struct IpcSourceCore<X> {
    stall: Duration,
    /// Bytes read and not yet handled.
    stash: Vec<u8>,
    /// Bytes of the frame being gathered (header, then body).
    partial: Vec<u8>,
    header: Option<FrameHeader>,
    /// When the frame being gathered must be complete.
    frame_deadline: Option<Instant>,
    /// Handling stopped at the answer bound with bytes left.
    paused: bool,
    items: VecDeque<Slot<X>>,
    /// Bytes of the first answer already sent.
    at: usize,
    /// When the first answer, ready, must have left.
    out_deadline: Option<Instant>,
    next_ticket: u64,
    ended: bool,
}

impl<X> IpcSourceCore<X> {
    /// A channel whose frames and answers must move within `stall`.
    pub fn new(stall: Duration) -> IpcSourceCore<X> {
        IpcSourceCore {
            stall,
            stash: Vec::new(),
            partial: Vec::new(),
            header: None,
            frame_deadline: None,
            paused: false,
            items: VecDeque::new(),
            at: 0,
            out_deadline: None,
            next_ticket: 1,
            ended: false,
        }
    }

    /// Whether answers are below their bound (requests can be handled).
    pub fn has_room(&self) -> bool {
        !self.ended && self.items.len() < ANSWERS_MAX
    }

    /// Whether the driver should read more: the channel lives, nothing
    /// read waits to be handled, and answers are below their bound.
    pub fn wants_bytes(&self) -> bool {
        !self.ended && self.stash.is_empty() && self.items.len() < ANSWERS_MAX
    }

    /// Bytes the driver read, at `now`: every complete request is
    /// answered, up to the bound (what is left waits for
    /// [`handle`](Self::handle)).
    pub fn receive(&mut self, data: &[u8], now: Instant, host: &mut impl AnswerHost<X>) -> Result<()> {
        self.stash.extend_from_slice(data);
        self.handle(now, host)
    }

    /// Handles what was read and not yet handled, as far as the bound
    /// allows. The driver calls it once answers left (its pause may have
    /// stopped handling with complete requests read).
    pub fn handle(&mut self, now: Instant, host: &mut impl AnswerHost<X>) -> Result<()> {
        if self.ended || self.stash.is_empty() {
            return Ok(());
        }
        if self.paused && self.items.len() < ANSWERS_MAX {
            // Resumed after a pause of ours: the frame's bound starts now.
            self.paused = false;
            if self.frame_deadline.is_some() {
                self.frame_deadline = Some(now + self.stall);
            }
        }
        let stash = std::mem::take(&mut self.stash);
        let used = self.parse(&stash, now, host);
        self.stash = stash[used.as_ref().copied().unwrap_or(stash.len())..].to_vec();
        used?;
        if !self.stash.is_empty() {
            self.paused = true;
        }
        Ok(())
    }

    /// Gathers frames from `data` and answers each complete one; stops
    /// once `ANSWERS_MAX` answers wait. The bytes used.
    fn parse(&mut self, data: &[u8], now: Instant, host: &mut impl AnswerHost<X>) -> Result<usize> {
        let mut at = 0;
        while at < data.len() && self.items.len() < ANSWERS_MAX {
            if self.frame_deadline.is_none() {
                self.frame_deadline = Some(now + self.stall);
            }
            let need = match &self.header {
                None => FRAME_HEADER_LEN,
                Some(h) => h.body_len as usize,
            };
            let take = (need - self.partial.len()).min(data.len() - at);
            self.partial.extend_from_slice(&data[at..at + take]);
            at += take;
            if self.partial.len() < need {
                continue;
            }
            let h = match self.header.take() {
                Some(h) => h,
                None => {
                    let h = FrameHeader::decode(self.partial[..].try_into().expect("a whole header"))?;
                    if h.body_len > MAX_CONTROL_BODY {
                        return Err(Error::Protocol(format!("IPC frame of {} bytes is too large", h.body_len)));
                    }
                    self.partial.clear();
                    if h.body_len > 0 {
                        self.header = Some(h);
                        continue;
                    }
                    h
                }
            };
            let body = std::mem::take(&mut self.partial);
            self.frame_deadline = None;
            let ticket = self.next_ticket;
            self.next_ticket += 1;
            let slot = match host.answer(h.kind, &body, ticket)? {
                Reply::Now(a) => Slot::Ready(a),
                Reply::Later => Slot::Making(ticket),
            };
            self.items.push_back(slot);
            self.arm(now);
        }
        Ok(at)
    }

    /// The answer made for `ticket`, at `now`; `false` (and the answer
    /// handed back to be dropped) when the channel no longer waits for it.
    pub fn fill(&mut self, ticket: u64, answer: Answer<X>, now: Instant) -> std::result::Result<(), Answer<X>> {
        if self.ended {
            return Err(answer);
        }
        match self.items.iter_mut().find(|s| matches!(s, Slot::Making(t) if *t == ticket)) {
            Some(s) => {
                *s = Slot::Ready(answer);
                self.arm(now);
                Ok(())
            }
            None => Err(answer),
        }
    }

    /// Starts the first answer's bound once it is ready to leave.
    fn arm(&mut self, now: Instant) {
        if self.out_deadline.is_none() && matches!(self.items.front(), Some(Slot::Ready(_))) {
            self.out_deadline = Some(now + self.stall);
        }
    }

    /// The bytes to send next (the rest of the first answer), whether they
    /// start it (a descriptor rides on its first byte) and what rides with
    /// it; `None` when nothing is ready.
    pub fn to_send(&self) -> Option<(&[u8], bool, &X)> {
        match self.items.front() {
            Some(Slot::Ready(a)) => Some((&a.bytes[self.at..], self.at == 0, &a.extra)),
            _ => None,
        }
    }

    /// The socket took `n` of the bytes [`to_send`](Self::to_send) gave,
    /// at `now`; the answer that left is handed back (its guards dropped
    /// by the driver, outside its lock).
    pub fn sent(&mut self, n: usize, now: Instant) -> Option<Answer<X>> {
        self.at += n;
        let done = matches!(self.items.front(), Some(Slot::Ready(a)) if self.at >= a.bytes.len());
        if !done {
            return None;
        }
        self.at = 0;
        self.out_deadline = None;
        let Some(Slot::Ready(a)) = self.items.pop_front() else { unreachable!("checked above") };
        self.arm(now);
        Some(a)
    }

    /// Whether part of an answer has been sent (another frame cannot be
    /// put on the wire before it is whole).
    pub fn mid_answer(&self) -> bool {
        self.at > 0
    }

    /// Answers waiting: ready to leave and being made.
    pub fn waiting(&self) -> (usize, usize) {
        let making = self.items.iter().filter(|s| matches!(s, Slot::Making(_))).count();
        (self.items.len() - making, making)
    }

    /// The earliest time [`IpcSourceCore::check`] can fail.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.frame_deadline.into_iter().chain(self.out_deadline).min()
    }

    /// The stall bounds at `now`.
    pub fn check(&self, now: Instant) -> Result<()> {
        if self.frame_deadline.is_some_and(|d| now >= d) {
            return Err(Error::Protocol(format!("IPC frame not completed within {:?} (peer too slow)", self.stall)));
        }
        if self.out_deadline.is_some_and(|d| now >= d) {
            return Err(Error::Protocol(
                "answer not read within the stall bound (the requester is not reading)".into(),
            ));
        }
        Ok(())
    }

    /// Whether the channel has ended.
    pub fn is_ended(&self) -> bool {
        self.ended
    }

    /// The channel is over: the answers waiting are handed back to be
    /// dropped outside the driver's lock; tickets filled later are refused.
    pub fn end(&mut self) -> Vec<Answer<X>> {
        self.ended = true;
        self.stash.clear();
        self.at = 0;
        self.out_deadline = None;
        self.frame_deadline = None;
        self.items
            .drain(..)
            .filter_map(|s| match s {
                Slot::Ready(a) => Some(a),
                Slot::Making(_) => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers every request at once with an Ack echoing its body, except
    /// `Revalidate`, answered later.
    #[derive(Default)]
    struct Host {
        asked: Vec<(MsgKind, Vec<u8>)>,
        later: Vec<u64>,
    }

    impl AnswerHost<u32> for Host {
        fn answer(&mut self, kind: MsgKind, body: &[u8], ticket: u64) -> Result<Reply<u32>> {
            self.asked.push((kind, body.to_vec()));
            if kind == MsgKind::Revalidate {
                self.later.push(ticket);
                return Ok(Reply::Later);
            }
            Ok(Reply::Now(Answer::new(MsgKind::Ack, body, self.asked.len() as u32)))
        }
    }

    fn frame(kind: MsgKind, body: &[u8]) -> Vec<u8> {
        Answer::new(kind, body, ()).bytes
    }

    const STALL: Duration = Duration::from_secs(5);

    /// Drains what is ready to send: (frames' bytes, extras).
    fn drain(c: &mut IpcSourceCore<u32>, now: Instant) -> (Vec<u8>, Vec<u32>) {
        let (mut bytes, mut extras) = (Vec::new(), Vec::new());
        while let Some((b, _, _)) = c.to_send() {
            let b = b.to_vec();
            bytes.extend_from_slice(&b);
            extras.push(c.sent(b.len(), now).expect("a whole answer").extra);
        }
        (bytes, extras)
    }

    /// Frames split at every byte are gathered whole and answered in order.
    #[test]
    fn frames_split_anywhere_are_answered_in_order() {
        let t0 = Instant::now();
        let mut c = IpcSourceCore::new(STALL);
        let mut h = Host::default();
        let wire: Vec<u8> = [
            frame(MsgKind::ExportRequest, b"one"),
            frame(MsgKind::OpComplete, &[]),
            frame(MsgKind::CloseReceipt, b"3"),
        ]
        .concat();
        for b in &wire {
            c.receive(std::slice::from_ref(b), t0, &mut h).unwrap();
        }
        let kinds: Vec<MsgKind> = h.asked.iter().map(|(k, _)| *k).collect();
        assert_eq!(kinds, vec![MsgKind::ExportRequest, MsgKind::OpComplete, MsgKind::CloseReceipt]);
        let (bytes, extras) = drain(&mut c, t0);
        assert_eq!(bytes, [frame(MsgKind::Ack, b"one"), frame(MsgKind::Ack, &[]), frame(MsgKind::Ack, b"3")].concat());
        assert_eq!(extras, vec![1, 2, 3]);
        assert_eq!(c.waiting(), (0, 0));
    }

    /// An answer made later holds its place: the ones behind it wait, then
    /// all leave in request order once it is filled; a ticket filled after
    /// the channel ended is handed back.
    #[test]
    fn an_answer_made_later_keeps_its_place() {
        let t0 = Instant::now();
        let mut c = IpcSourceCore::new(STALL);
        let mut h = Host::default();
        let wire = [frame(MsgKind::Revalidate, b"a"), frame(MsgKind::OpComplete, b"b")].concat();
        c.receive(&wire, t0, &mut h).unwrap();
        assert_eq!(c.waiting(), (1, 1));
        assert!(c.to_send().is_none(), "an answer overtook the one being made");
        // Long after: no stall bound runs for an answer we are making.
        c.check(t0 + 10 * STALL).unwrap();
        let ticket = h.later[0];
        assert!(c.fill(ticket + 100, Answer::new(MsgKind::Ack, b"x", 9), t0).is_err());
        assert!(c.fill(ticket, Answer::new(MsgKind::RevalidateOk, b"a", 7), t0).is_ok());
        let (bytes, extras) = drain(&mut c, t0);
        assert_eq!(bytes, [frame(MsgKind::RevalidateOk, b"a"), frame(MsgKind::Ack, b"b")].concat());
        assert_eq!(extras, vec![7, 2]);
        c.receive(&frame(MsgKind::Revalidate, b"c"), t0, &mut h).unwrap();
        assert!(c.end().is_empty());
        assert!(c.fill(h.later[1], Answer::new(MsgKind::Ack, b"c", 8), t0).is_err());
    }

    /// At the bound, handling stops with the rest stashed and reading off;
    /// once answers left, the rest is handled, and a frame caught half
    /// read by our pause gets its whole stall bound from the resume.
    #[test]
    fn the_answer_bound_pauses_and_a_resume_restarts_the_frame_bound() {
        let t0 = Instant::now();
        let mut c = IpcSourceCore::new(STALL);
        let mut h = Host::default();
        let mut wire: Vec<u8> = (0..ANSWERS_MAX + 1).flat_map(|_| frame(MsgKind::OpComplete, b"zz")).collect();
        let half = frame(MsgKind::CloseReceipt, b"tail");
        wire.extend_from_slice(&half[..5]);
        c.receive(&wire, t0, &mut h).unwrap();
        assert_eq!(h.asked.len(), ANSWERS_MAX);
        assert!(!c.wants_bytes(), "read on past the bound");
        // The peer reads everything, late in our pause.
        let later = t0 + STALL - Duration::from_millis(1);
        let (_, extras) = drain(&mut c, later);
        assert_eq!(extras.len(), ANSWERS_MAX);
        c.handle(later, &mut h).unwrap();
        assert_eq!(h.asked.len(), ANSWERS_MAX + 1);
        assert!(c.wants_bytes());
        // The half frame was started before the pause; its bound restarted
        // at the resume.
        c.check(t0 + STALL + Duration::from_millis(10)).unwrap();
        assert!(c.check(later + STALL).is_err());
        c.receive(&half[5..], later, &mut h).unwrap();
        assert_eq!(h.asked.last().unwrap(), &(MsgKind::CloseReceipt, b"tail".to_vec()));
    }

    /// Stall bounds: a frame begun and not completed, and a ready answer
    /// the peer does not read, each end the channel at their deadline and
    /// not before.
    #[test]
    fn stall_bounds_hold_for_frames_and_answers() {
        let t0 = Instant::now();
        let mut c = IpcSourceCore::new(STALL);
        let mut h = Host::default();
        c.receive(&frame(MsgKind::OpComplete, b"x")[..3], t0, &mut h).unwrap();
        c.check(t0 + STALL - Duration::from_millis(1)).unwrap();
        let e = c.check(t0 + STALL).unwrap_err();
        assert!(e.message().contains("not completed"), "{e}");
        let mut c = IpcSourceCore::new(STALL);
        c.receive(&frame(MsgKind::OpComplete, b"x"), t0, &mut h).unwrap();
        let (_, first, _) = c.to_send().unwrap();
        assert!(first);
        assert!(c.sent(2, t0).is_none());
        assert!(c.mid_answer());
        assert!(!c.to_send().unwrap().1, "a descriptor would ride twice");
        let e = c.check(t0 + STALL).unwrap_err();
        assert!(e.message().contains("not read"), "{e}");
    }

    /// An answer the requester does not read keeps its bound among the
    /// core's wake-ups: alone, and ahead of a frame begun later,
    /// `next_deadline` is the answer's bound; checked only then, the
    /// channel ends there as "not read". Guards `next_deadline`'s chain of
    /// `out_deadline` with `frame_deadline` (round 7 G19: with
    /// `frame_deadline` alone there was no wake-up for an unread answer,
    /// or only the later frame's).
    #[test]
    fn an_unread_answer_is_woken_for_at_its_bound() {
        let t0 = Instant::now();
        let mut c = IpcSourceCore::new(STALL);
        let mut h = Host::default();
        c.receive(&frame(MsgKind::OpComplete, b"x"), t0, &mut h).unwrap();
        assert_eq!(c.waiting(), (1, 0));
        assert_eq!(c.next_deadline(), Some(t0 + STALL), "no wake-up for the unread answer");
        let t1 = t0 + Duration::from_secs(1);
        c.receive(&frame(MsgKind::CloseReceipt, b"y")[..3], t1, &mut h).unwrap();
        assert_eq!(c.next_deadline(), Some(t0 + STALL), "the later frame's bound hid the answer's");
        c.check(t0 + STALL - Duration::from_millis(1)).unwrap();
        let e = c.check(c.next_deadline().unwrap()).unwrap_err();
        assert!(e.message().contains("not read"), "{e}");
    }

    /// A header announcing a body beyond the control bound ends the
    /// channel with a protocol error before any of it is gathered.
    #[test]
    fn an_oversized_frame_is_a_protocol_error() {
        let mut c: IpcSourceCore<u32> = IpcSourceCore::new(STALL);
        let mut h = Host::default();
        let hdr = FrameHeader::encode(MsgKind::ExportRequest, MAX_CONTROL_BODY + 1);
        let e = c.receive(&hdr, Instant::now(), &mut h).unwrap_err();
        assert!(matches!(e, Error::Protocol(_)), "{e}");
        assert!(h.asked.is_empty());
    }

    /// A header naming a payload kind (`WriteRequest`, whose frames on a
    /// data connection may carry up to a GiB) with a body just beyond the
    /// control bound is refused from its header alone: no payload kind
    /// travels on an IPC channel, so its frames are bounded by
    /// `MAX_CONTROL_BODY` whatever kind they name. Guards `parse`'s
    /// `h.body_len > MAX_CONTROL_BODY` (round 9 I10: bounded by the kind's
    /// `max_body`, the header passed and the core waited for the body).
    /// A frame of exactly the bound is gathered whole and handed on
    /// (sweep B: with `>=` it was refused).
    #[test]
    fn a_payload_kind_header_beyond_the_control_bound_is_refused() {
        let mut c: IpcSourceCore<u32> = IpcSourceCore::new(STALL);
        let mut h = Host::default();
        let len = MAX_CONTROL_BODY + 1;
        assert!(u64::from(len) <= MsgKind::WriteRequest.max_body());
        let hdr = FrameHeader::encode(MsgKind::WriteRequest, len);
        let e = c.receive(&hdr, Instant::now(), &mut h).unwrap_err();
        assert_eq!(e.message(), format!("IPC frame of {len} bytes is too large"));
        assert!(matches!(e, Error::Protocol(_)), "{e}");
        assert!(h.asked.is_empty());
        // Exactly the bound: the header is taken, the body gathered.
        let mut c: IpcSourceCore<u32> = IpcSourceCore::new(STALL);
        let body = vec![0x5a; MAX_CONTROL_BODY as usize];
        c.receive(&FrameHeader::encode(MsgKind::WriteRequest, MAX_CONTROL_BODY), Instant::now(), &mut h).unwrap();
        assert!(h.asked.is_empty(), "handed on before its body");
        c.receive(&body, Instant::now(), &mut h).unwrap();
        assert_eq!(h.asked, [(MsgKind::WriteRequest, body)]);
    }
}
