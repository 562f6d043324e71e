//! Calls in flight on one IPC channel, from any number of threads at once.
//! A call's frame leaves under the send lock, which numbers it; the source
//! answers in request order (`proto::source`), so the n-th answer read is
//! the n-th call's. Whoever waits for an answer and finds nobody reading
//! takes the receiving half and reads, handing other callers their answers
//! as they pass; nobody holds a lock across a read. Any failure — a send or
//! a read that fails, a caller whose deadline passes before its answer —
//! ends the channel for every call on it (its answers could no longer be
//! matched), and every caller learns why.

use super::channel::{deadline_tick, Channel, Frame};
use crate::control::frame::MsgKind;
use crate::error::{Error, Result, Status};
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// One channel's calls: the sending half, the receiving half, and the
/// answers read for callers that have not collected them yet.
pub struct Pipeline {
    /// The sending half; its lock orders (and numbers) the calls.
    tx: Mutex<Channel>,
    /// Calls sent so far (the last call's number).
    sent: AtomicU64,
    rx: Mutex<Receiving>,
    /// Signalled when an answer was read, the reader gave its half back, or
    /// the channel ended.
    moved: Condvar,
    /// A third handle on the socket, to shut it down under neither lock.
    ctl: Channel,
}

struct Receiving {
    /// The receiving half; `None` while a caller reads with it.
    half: Option<Channel>,
    /// Answers read so far (the last answer's call number).
    received: u64,
    /// Answers read for other callers, by call number.
    ready: HashMap<u64, Frame>,
    /// Why the channel ended, once it did.
    ended: Option<Error>,
}

impl Pipeline {
    /// Calls over `chan` (connected and past its handshake).
    pub fn new(mut chan: Channel) -> Result<Pipeline> {
        // A sealed channel's receiving half goes with the receiving handle.
        let half = chan.receiver()?;
        let ctl = chan.try_clone()?;
        Ok(Pipeline {
            tx: Mutex::new(chan),
            sent: AtomicU64::new(0),
            rx: Mutex::new(Receiving { half: Some(half), received: 0, ready: HashMap::new(), ended: None }),
            moved: Condvar::new(),
            ctl,
        })
    }

    /// Shuts the socket down: a reader blocked on it wakes, later sends fail.
    pub fn shutdown(&self) {
        self.ctl.shutdown();
    }

    /// Sends one request and returns its answer, within `deadline`. Other
    /// threads' calls on this channel go on meanwhile.
    pub fn call(&self, kind: MsgKind, body: &[u8], deadline: Instant, what: &str) -> Result<Frame> {
        let number = {
            let mut tx = self.tx.lock();
            if let Some(e) = &self.rx.lock().ended {
                return Err(under_another(e));
            }
            if let Err(e) = tx.send(kind, body, &[], &mut || deadline_tick(deadline, what)) {
                // Part of the frame may have left: nothing after it could
                // be understood.
                return Err(self.end(&mut self.rx.lock(), e));
            }
            self.sent.fetch_add(1, Ordering::AcqRel) + 1
        };
        self.answer(number, deadline, what)
    }

    /// The answer of call `number`: collected, read, or waited for.
    fn answer(&self, number: u64, deadline: Instant, what: &str) -> Result<Frame> {
        let mut rx = self.rx.lock();
        loop {
            if let Some(f) = rx.ready.remove(&number) {
                return Ok(f);
            }
            if let Some(e) = &rx.ended {
                return Err(under_another(e));
            }
            let Some(mut half) = rx.half.take() else {
                let waited = self.moved.wait_until(&mut rx, deadline);
                if waited.timed_out() && !rx.ready.contains_key(&number) && rx.ended.is_none() {
                    let e = Error::TimedOut(format!("{what}: no answer before the deadline"));
                    return Err(self.end(&mut rx, e));
                }
                continue;
            };
            let got = MutexGuard::unlocked(&mut rx, || half.recv(&mut || deadline_tick(deadline, what)));
            rx.half = Some(half);
            self.moved.notify_all();
            let f = match got {
                Ok(f) => f,
                // Our read failed because another call ended the channel.
                Err(_) if rx.ended.is_some() => continue,
                Err(e) => return Err(self.end(&mut rx, e)),
            };
            rx.received += 1;
            if rx.received == number {
                return Ok(f);
            }
            let n = rx.received;
            rx.ready.insert(n, f);
        }
    }

    /// Ends the channel with `e` (the first failure is the one every other
    /// caller is told); returns the error for the caller that met it.
    fn end(&self, rx: &mut Receiving, e: Error) -> Error {
        // Answers already read stay collectable: they came before the end.
        if rx.ended.is_none() {
            rx.ended = Some(e.clone());
        }
        self.ctl.shutdown();
        self.moved.notify_all();
        e
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
    use crate::control::io::{read_body, write_frame};
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
        let rx = p.rx.lock();
        assert_eq!((rx.received, rx.ready.len(), p.sent.load(Ordering::Relaxed)), (2, 0, 2));
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
}
