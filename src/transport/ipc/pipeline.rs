//! Calls in flight on one IPC channel, from any number of threads at once:
//! the thin driver of `proto::calls` (which numbers the calls, lends the
//! sending and the receiving half to one caller at a time, hands each
//! answer to its caller and decides how the channel ends). One lock guards
//! that core and the two halves; a caller sends or reads with it released,
//! then gives the half back and wakes the others. Any failure ends the
//! channel for every call on it, and every caller learns why.

use super::channel::{deadline_tick, Channel, Frame};
use super::proto::calls::{Calls, Next, Send};
use crate::control::frame::MsgKind;
use crate::error::{Error, Result};
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

/// One channel's calls: the core and the two halves it lends.
pub struct Pipeline {
    state: Mutex<State>,
    /// Signalled when a half came back, an answer was read, or the
    /// channel ended.
    moved: Condvar,
    /// A third handle on the socket, to shut it down under no lock.
    ctl: Channel,
}

struct State {
    calls: Calls<Frame>,
    /// The sending half; `None` while a caller sends with it.
    tx: Option<Channel>,
    /// The receiving half; `None` while a caller reads with it.
    rx: Option<Channel>,
}

impl Pipeline {
    /// Calls over `chan` (connected and past its handshake).
    pub fn new(mut chan: Channel) -> Result<Pipeline> {
        // A sealed channel's receiving half goes with the receiving handle.
        let half = chan.receiver()?;
        let ctl = chan.try_clone()?;
        let state = State { calls: Calls::new(), tx: Some(chan), rx: Some(half) };
        Ok(Pipeline { state: Mutex::new(state), moved: Condvar::new(), ctl })
    }

    /// Shuts the socket down: a reader blocked on it wakes, later sends fail.
    pub fn shutdown(&self) {
        self.ctl.shutdown();
    }

    /// Sends one request and returns its answer, within `deadline`. Other
    /// threads' calls on this channel go on meanwhile.
    pub fn call(&self, kind: MsgKind, body: &[u8], deadline: Instant, what: &str) -> Result<Frame> {
        let mut st = self.state.lock();
        let number = loop {
            match st.calls.begin_send() {
                Send::Go(n) => break n,
                Send::Failed(e) => return Err(e),
                // Nothing of this call left: giving up ends nothing.
                Send::Wait if self.moved.wait_until(&mut st, deadline).timed_out() => {
                    return Err(Error::TimedOut(format!("{what}: the channel was still sending at the deadline")));
                }
                Send::Wait => {}
            }
        };
        let mut tx = st.tx.take().expect("the sending half is lent to one caller at a time");
        let sent = MutexGuard::unlocked(&mut st, || tx.send(kind, body, &[], &mut || deadline_tick(deadline, what)));
        st.tx = Some(tx);
        self.moved.notify_all();
        match sent {
            Ok(()) => st.calls.send_done(),
            Err(e) => {
                let e = st.calls.send_failed(e);
                return Err(self.ended(e));
            }
        }
        loop {
            match st.calls.next(number) {
                Next::Answer(f) => return Ok(f),
                Next::Failed(e) => return Err(e),
                Next::Read => {
                    let mut half = st.rx.take().expect("the receiving half is lent to one caller at a time");
                    let got = MutexGuard::unlocked(&mut st, || half.recv(&mut || deadline_tick(deadline, what)));
                    st.rx = Some(half);
                    self.moved.notify_all();
                    match got {
                        Ok(f) => {
                            if let Some(f) = st.calls.read(number, f) {
                                return Ok(f);
                            }
                        }
                        Err(e) => {
                            if let Some(e) = st.calls.read_failed(e) {
                                return Err(self.ended(e));
                            }
                        }
                    }
                }
                Next::Wait => {
                    if self.moved.wait_until(&mut st, deadline).timed_out() {
                        let e = Error::TimedOut(format!("{what}: no answer before the deadline"));
                        if let Some(e) = st.calls.timed_out(number, e) {
                            return Err(self.ended(e));
                        }
                    }
                }
            }
        }
    }

    /// The core ended the channel with `e`: shut the socket (a reader
    /// blocked on it wakes) and wake every waiting caller; returns `e`.
    fn ended(&self, e: Error) -> Error {
        self.ctl.shutdown();
        self.moved.notify_all();
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::io::{read_body, write_frame};
    use crate::error::Status;
    use std::os::unix::net::UnixStream;
    use std::sync::Arc;
    use std::time::Duration;

    /// A pipeline and the source's end of its socket.
    fn pair() -> (Arc<Pipeline>, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        (Arc::new(Pipeline::new(Channel::from_stream(a).unwrap()).unwrap()), b)
    }

    fn long() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    /// The source side reads one request frame: its body.
    fn request(s: &mut UnixStream) -> Vec<u8> {
        let mut h = [0u8; crate::control::frame::FRAME_HEADER_LEN];
        std::io::Read::read_exact(s, &mut h).unwrap();
        let h = crate::control::frame::FrameHeader::decode(&h).unwrap();
        read_body(s, h.body_len, &mut || Ok(())).unwrap()
    }

    fn reply(s: &mut UnixStream, body: &[u8]) {
        write_frame(s, MsgKind::Ack, body, &mut || Ok(())).unwrap();
    }

    #[test]
    fn calls_from_two_threads_are_in_flight_at_once_and_get_their_own_answers() {
        let (p, mut src) = pair();
        let p1 = p.clone();
        let first = std::thread::spawn(move || p1.call(MsgKind::Ack, b"one", long(), "first").map(|f| f.body));
        assert_eq!(request(&mut src), b"one");
        // The first call's answer has not left: a second call still goes out.
        let p2 = p.clone();
        let second = std::thread::spawn(move || p2.call(MsgKind::Ack, b"two", long(), "second").map(|f| f.body));
        assert_eq!(request(&mut src), b"two");
        reply(&mut src, b"answer one");
        reply(&mut src, b"answer two");
        assert_eq!(first.join().unwrap().unwrap(), b"answer one");
        assert_eq!(second.join().unwrap().unwrap(), b"answer two");
        assert_eq!(p.state.lock().calls.counts(), (2, 2, 0));
    }

    #[test]
    fn an_answer_read_by_a_later_caller_reaches_the_earlier_one() {
        let (p, mut src) = pair();
        let p1 = p.clone();
        let first = std::thread::spawn(move || p1.call(MsgKind::Ack, b"1", long(), "first").map(|f| f.body));
        request(&mut src);
        let p2 = p.clone();
        let second = std::thread::spawn(move || p2.call(MsgKind::Ack, b"2", long(), "second").map(|f| f.body));
        request(&mut src);
        // Whoever reads, each gets the answer of its own position.
        reply(&mut src, b"A");
        assert_eq!(first.join().unwrap().unwrap(), b"A");
        reply(&mut src, b"B");
        assert_eq!(second.join().unwrap().unwrap(), b"B");
    }

    #[test]
    fn a_caller_whose_deadline_passes_ends_the_channel_for_every_call_on_it() {
        let (p, mut src) = pair();
        let p1 = p.clone();
        let patient = std::thread::spawn(move || p1.call(MsgKind::Ack, b"1", long(), "patient"));
        request(&mut src);
        let e = p.call(MsgKind::Ack, b"2", Instant::now() + Duration::from_millis(200), "hasty").err().unwrap();
        assert_eq!(e.status(), Status::TimedOut, "{e}");
        let e = patient.join().unwrap().err().unwrap();
        assert_eq!(e.status(), Status::Unavailable, "{e}");
        assert!(e.message().contains("ended under another call") && e.message().contains("hasty"), "{e}");
        // The socket was shut down: the source reads the second request,
        // then the end of the stream.
        assert_eq!(request(&mut src), b"2");
        assert_eq!(std::io::Read::read(&mut src, &mut [0u8; 1]).unwrap(), 0);
        let e = p.call(MsgKind::Ack, b"3", long(), "later").err().unwrap();
        assert_eq!(e.status(), Status::Unavailable, "{e}");
    }

    #[test]
    fn a_caller_that_never_got_to_send_gives_up_alone_at_its_deadline() {
        let (p, mut src) = pair();
        // The first call's frame is far larger than the socket holds: its
        // caller keeps the sending half until the source reads.
        let big = vec![7u8; 1 << 20];
        let p1 = p.clone();
        let first = std::thread::spawn(move || p1.call(MsgKind::Ack, &big, long(), "big").map(|f| f.body));
        // Wait (bounded) until the first caller holds the sending half.
        let until = Instant::now() + Duration::from_secs(60);
        while p.state.lock().tx.is_some() {
            assert!(Instant::now() < until, "the first call never started sending");
            std::thread::yield_now();
        }
        let e = p.call(MsgKind::Ack, b"2", Instant::now() + Duration::from_millis(100), "hasty").err().unwrap();
        assert_eq!(e.status(), Status::TimedOut, "{e}");
        assert!(e.message().contains("still sending"), "{e}");
        // Nothing of it left and the channel goes on: the big call is
        // answered, and a later call after it.
        assert_eq!(request(&mut src).len(), 1 << 20);
        reply(&mut src, b"big answer");
        assert_eq!(first.join().unwrap().unwrap(), b"big answer");
        let p3 = p.clone();
        let third = std::thread::spawn(move || p3.call(MsgKind::Ack, b"3", long(), "third").map(|f| f.body));
        assert_eq!(request(&mut src), b"3");
        reply(&mut src, b"answer three");
        assert_eq!(third.join().unwrap().unwrap(), b"answer three");
        assert_eq!(p.state.lock().calls.counts(), (2, 2, 0));
    }
}
