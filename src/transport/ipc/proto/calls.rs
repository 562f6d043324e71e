//! The requester's calls on one IPC channel as a state machine without
//! I/O: no lock, thread, clock or socket. Many threads call at once; the
//! source answers in request order (`proto::source`), so the n-th answer
//! read is the n-th call's. [`Calls`] numbers the calls in the order their
//! frames leave, lends the sending half and the receiving half to one
//! caller at a time, hands each answer read to its caller, and decides how
//! the channel ends: any failure that could leave the two sides counting
//! differently (a send or a read that fails, an answer that did not come
//! by its caller's deadline) ends it for every call, and every caller
//! learns why. `ipc/pipeline.rs` drives it under one lock, sending and
//! reading with that lock released.

use crate::error::{Error, Status};
use std::collections::HashMap;

/// What a caller does next for its call.
#[derive(Debug)]
pub enum Next<F> {
    /// Its answer.
    Answer(F),
    /// The channel ended: the call fails with this.
    Failed(Error),
    /// The receiving half is the caller's: read one frame with no lock
    /// held, then report it with [`Calls::read`] or [`Calls::read_failed`].
    Read,
    /// Another caller is reading: wait until an answer moves, then ask
    /// again (or give up at the deadline with [`Calls::timed_out`]).
    Wait,
}

/// What a caller that wants to send does.
#[derive(Debug)]
pub enum Send {
    /// The sending half is the caller's and its call is `number`: send
    /// the frame with no lock held, then report [`Calls::send_done`] or
    /// [`Calls::send_failed`].
    Go(u64),
    /// Another caller is sending: wait, then ask again. Giving up here
    /// touches nothing (nothing of the call left).
    Wait,
    /// The channel ended: the call fails with this before sending.
    Failed(Error),
}

/// One channel's calls.
#[derive(Debug)]
pub struct Calls<F> {
    /// Calls numbered so far (the last call's number).
    sent: u64,
    /// Answers read so far (the last answer's call number).
    received: u64,
    /// Answers read for callers that have not collected them yet.
    ready: HashMap<u64, F>,
    /// Whether a caller holds the sending half.
    sending: bool,
    /// Whether a caller holds the receiving half.
    reading: bool,
    /// Why the channel ended, once it did.
    ended: Option<Error>,
}

impl<F> Default for Calls<F> {
    fn default() -> Calls<F> {
        Calls { sent: 0, received: 0, ready: HashMap::new(), sending: false, reading: false, ended: None }
    }
}

impl<F> Calls<F> {
    /// A channel with no call yet.
    pub fn new() -> Calls<F> {
        Calls::default()
    }

    /// A caller wants to send its request.
    pub fn begin_send(&mut self) -> Send {
        if let Some(e) = &self.ended {
            return Send::Failed(under_another(e));
        }
        if self.sending {
            return Send::Wait;
        }
        self.sending = true;
        self.sent += 1;
        Send::Go(self.sent)
    }

    /// The caller's frame left whole; the sending half is back.
    pub fn send_done(&mut self) {
        self.sending = false;
    }

    /// The caller's send failed (part of the frame may have left, so
    /// nothing after it could be understood): the channel ends; returns
    /// the error for that caller.
    pub fn send_failed(&mut self, e: Error) -> Error {
        self.sending = false;
        self.end(e)
    }

    /// What call `number` (sent) does next.
    pub fn next(&mut self, number: u64) -> Next<F> {
        debug_assert!(number <= self.sent, "call {number} was not sent");
        if let Some(f) = self.ready.remove(&number) {
            return Next::Answer(f);
        }
        if let Some(e) = &self.ended {
            return Next::Failed(under_another(e));
        }
        if self.reading {
            return Next::Wait;
        }
        self.reading = true;
        Next::Read
    }

    /// The reader (call `number`) read `frame`, the next answer in order,
    /// and gives the receiving half back: its own answer, or `None` when
    /// it is an earlier call's (kept for it; ask [`Calls::next`] again).
    pub fn read(&mut self, number: u64, frame: F) -> Option<F> {
        self.reading = false;
        self.received += 1;
        if self.received == number {
            return Some(frame);
        }
        self.ready.insert(self.received, frame);
        None
    }

    /// The reader's read failed and it gives the receiving half back.
    /// When another call had already ended the channel (shutting the
    /// socket is what failed the read) the reader asks [`Calls::next`]
    /// again and learns that end (`None`); otherwise the channel ends with
    /// `e`, returned for the reader.
    pub fn read_failed(&mut self, e: Error) -> Option<Error> {
        self.reading = false;
        if self.ended.is_some() {
            return None;
        }
        Some(self.end(e))
    }

    /// Call `number`'s deadline passed while it waited: unless its answer
    /// came or the channel ended meanwhile (then [`Calls::next`] says so,
    /// `None`), the channel ends with `e` — the answers after it could no
    /// longer be matched — and `e` is returned for the caller.
    pub fn timed_out(&mut self, number: u64, e: Error) -> Option<Error> {
        if self.ready.contains_key(&number) || self.ended.is_some() {
            return None;
        }
        Some(self.end(e))
    }

    /// Ends the channel with `e` (the first end is the one every later
    /// caller is told; answers already read stay collectable, they came
    /// before it); returns `e`.
    pub fn end(&mut self, e: Error) -> Error {
        if self.ended.is_none() {
            self.ended = Some(e.clone());
        }
        e
    }

    /// Whether the channel ended.
    pub fn ended(&self) -> bool {
        self.ended.is_some()
    }

    /// (calls sent, answers read, answers waiting for their caller).
    pub fn counts(&self) -> (u64, u64, usize) {
        (self.sent, self.received, self.ready.len())
    }
}

/// What a call learns when the channel ended under another call: the
/// channel is unavailable (the deadline that passed was not its own), or
/// the source is stale when that is what was found.
fn under_another(e: &Error) -> Error {
    let status = if e.status() == Status::StalePeer { Status::StalePeer } else { Status::Unavailable };
    Error::from_status(status, format!("the IPC channel ended under another call: {}", e.message()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn go(c: &mut Calls<&'static str>) -> u64 {
        match c.begin_send() {
            Send::Go(n) => {
                c.send_done();
                n
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn calls_are_numbered_in_the_order_their_frames_leave_one_sender_at_a_time() {
        let mut c = Calls::<&str>::new();
        let Send::Go(1) = c.begin_send() else { panic!() };
        // The first caller still sends: the second waits, numbered later.
        assert!(matches!(c.begin_send(), Send::Wait));
        c.send_done();
        assert!(matches!(c.begin_send(), Send::Go(2)));
        c.send_done();
        assert_eq!(c.counts(), (2, 0, 0));
    }

    #[test]
    fn one_reader_at_a_time_hands_earlier_answers_to_their_callers() {
        let mut c = Calls::new();
        let (a, b, d) = (go(&mut c), go(&mut c), go(&mut c));
        // The last caller reads first: the two answers before its own are
        // kept for their callers.
        assert!(matches!(c.next(d), Next::Read));
        assert!(matches!(c.next(a), Next::Wait), "a second reader while one reads");
        assert_eq!(c.read(d, "A"), None);
        assert!(matches!(c.next(d), Next::Read));
        assert_eq!(c.read(d, "B"), None);
        assert_eq!(c.counts(), (3, 2, 2));
        assert!(matches!(c.next(b), Next::Answer("B")));
        assert!(matches!(c.next(a), Next::Answer("A")));
        assert!(matches!(c.next(d), Next::Read));
        assert_eq!(c.read(d, "D"), Some("D"));
        assert_eq!(c.counts(), (3, 3, 0));
    }

    #[test]
    fn a_failed_send_ends_the_channel_for_every_call_and_for_later_ones() {
        let mut c = Calls::<&str>::new();
        let first = go(&mut c);
        let Send::Go(_) = c.begin_send() else { panic!() };
        let e = c.send_failed(Error::Unavailable("broken pipe".into()));
        assert_eq!(e.status(), Status::Unavailable);
        assert!(c.ended());
        let Next::Failed(e) = c.next(first) else { panic!() };
        assert_eq!(e.status(), Status::Unavailable);
        assert!(e.message().contains("ended under another call") && e.message().contains("broken pipe"), "{e}");
        let Send::Failed(e) = c.begin_send() else { panic!() };
        assert!(e.message().contains("broken pipe"), "{e}");
        // Nothing was numbered after the end.
        assert_eq!(c.counts(), (2, 0, 0));
    }

    #[test]
    fn a_deadline_that_passes_ends_the_channel_unless_the_answer_came() {
        let mut c = Calls::new();
        let (a, b, hasty) = (go(&mut c), go(&mut c), go(&mut c));
        // The hasty caller reads a's answer just as a's deadline passes:
        // a collects it, nothing ends.
        assert!(matches!(c.next(hasty), Next::Read));
        assert_eq!(c.read(hasty, "A"), None);
        assert!(c.timed_out(a, Error::TimedOut("a: no answer".into())).is_none());
        assert!(!c.ended());
        // The hasty caller's own deadline passes with b's answer not come.
        let e = c.timed_out(hasty, Error::TimedOut("hasty: no answer".into())).expect("ends");
        assert_eq!(e.status(), Status::TimedOut);
        // A second deadline changes nothing: the first end is told.
        assert!(c.timed_out(b, Error::TimedOut("b: no answer".into())).is_none());
        assert!(matches!(c.next(a), Next::Answer("A")));
        let Next::Failed(e) = c.next(b) else { panic!() };
        assert!(e.message().contains("hasty"), "{e}");
        let Send::Failed(e) = c.begin_send() else { panic!() };
        assert!(e.message().contains("hasty"), "{e}");
    }

    #[test]
    fn an_answer_read_before_the_end_stays_collectable() {
        let mut c = Calls::new();
        let (a, b) = (go(&mut c), go(&mut c));
        assert!(matches!(c.next(b), Next::Read));
        assert_eq!(c.read(b, "A"), None);
        assert!(matches!(c.next(b), Next::Read));
        assert_eq!(c.read_failed(Error::Unavailable("reset".into())).map(|e| e.status()), Some(Status::Unavailable));
        assert!(matches!(c.next(a), Next::Answer("A")));
        assert!(matches!(c.next(b), Next::Failed(_)));
        // A deadline after the end adds nothing.
        assert!(c.timed_out(b, Error::TimedOut("late".into())).is_none());
    }

    #[test]
    fn a_read_failed_by_another_calls_end_learns_that_end() {
        let mut c = Calls::<&str>::new();
        let (a, b) = (go(&mut c), go(&mut c));
        assert!(matches!(c.next(a), Next::Read));
        // b's deadline passes while a reads; b ends the channel (the driver
        // shuts the socket, which fails a's read).
        assert!(c.timed_out(b, Error::TimedOut("b: no answer".into())).is_some());
        assert!(c.read_failed(Error::Unavailable("shut down".into())).is_none());
        let Next::Failed(e) = c.next(a) else { panic!() };
        assert_eq!(e.status(), Status::Unavailable);
        assert!(e.message().contains("b: no answer"), "{e}");
    }

    #[test]
    fn a_stale_source_is_what_every_caller_learns() {
        let mut c = Calls::<&str>::new();
        let a = go(&mut c);
        c.end(Error::StalePeer("the source restarted".into()));
        let Next::Failed(e) = c.next(a) else { panic!() };
        assert_eq!(e.status(), Status::StalePeer);
    }
}
