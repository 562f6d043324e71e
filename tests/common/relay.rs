//! A process in the middle of TCP connections: it relays every connection
//! made to it to `target`, both ways, and can flip one bit of byte number
//! `flip_down` (target to client) or `flip_up` (client to target) of a
//! connection, counted from that connection's start, once it passes. It
//! knows no key, but sees everything said in the clear (the handshake's
//! nonces) and can say words of its own made from it.
// Each test binary includes this file and uses a part of it.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// One relayed connection, as the relay sees it.
#[derive(Default)]
pub struct Leg {
    /// Bytes passed from the target to the client so far.
    pub down: AtomicU64,
    /// Bytes passed from the client to the target so far.
    pub up: AtomicU64,
    /// The byte (from the connection's start) whose low bit is flipped on
    /// the way down (`u64::MAX`: none).
    pub flip_down: AtomicU64,
    /// Likewise on the way up.
    pub flip_up: AtomicU64,
    /// Every byte the client sent, as the relay saw it.
    pub seen_up: Mutex<Vec<u8>>,
    /// Bytes of the relay's own to put into what goes down once the
    /// target sent this many (then none).
    pub inject_down: Mutex<Option<Injection>>,
    /// Every byte the target sent, as the relay saw it, while words of
    /// the relay's own are still due (kept only for making them).
    pub seen_down: Mutex<Vec<u8>>,
}

impl Leg {
    /// Flips the low bit of the byte `ahead` bytes past what has come down
    /// so far.
    pub fn flip_down_ahead(&self, ahead: u64) {
        self.flip_down.store(self.down.load(SeqCst) + ahead, SeqCst);
    }

    /// Flips the low bit of the byte `ahead` bytes past what has gone up
    /// so far.
    pub fn flip_up_ahead(&self, ahead: u64) {
        self.flip_up.store(self.up.load(SeqCst) + ahead, SeqCst);
    }
}

/// Bytes a relay puts in of its own, and after how many passed.
pub type Injection = (u64, Words);

/// What a relay says of its own.
#[derive(Clone)]
pub enum Words {
    /// These bytes.
    Fixed(Vec<u8>),
    /// The bytes this makes, when they are due, of what the relay saw of
    /// the connection so far: every byte up, then every byte down.
    Made(Arc<MakeWords>),
}

/// Makes a relay's words of what it saw: every byte up, every byte down.
pub type MakeWords = dyn Fn(&[u8], &[u8]) -> Vec<u8> + Send + Sync;

/// The relay: its port and its connections in the order they came.
pub struct Relay {
    port: u16,
    legs: Arc<(Mutex<Vec<Arc<Leg>>>, Condvar)>,
}

impl Relay {
    /// A relay to `target` on a free loopback port.
    pub fn to(target: &str) -> Relay {
        Relay::injecting(target, None)
    }

    /// A relay to `target` that, on every connection, puts `inject.1`
    /// into what goes down to the client once the target sent `inject.0`
    /// bytes: words of its own, as any relay without the key could say.
    pub fn injecting(target: &str, inject: Option<(u64, Vec<u8>)>) -> Relay {
        Relay::start(target, inject.map(|(at, b)| (at, Words::Fixed(b))), Duration::ZERO)
    }

    /// A relay to `target` that, on every connection, flips the low bit
    /// of byte `at` (from the connection's start) on its way up: damage
    /// set before the connection's first byte passes.
    pub fn flipping_up(target: &str, at: u64) -> Relay {
        Relay::start_flipping(target, None, Duration::ZERO, at)
    }

    /// A relay to `target` that, on every connection, puts what `words`
    /// makes of the bytes it saw (up, then down) into what goes down to
    /// the client once the target sent `at` bytes: a relay that read the
    /// handshake's nonces in passing and speaks with what they give it.
    pub fn forging(target: &str, at: u64, words: impl Fn(&[u8], &[u8]) -> Vec<u8> + Send + Sync + 'static) -> Relay {
        Relay::start(target, Some((at, Words::Made(Arc::new(words)))), Duration::ZERO)
    }

    /// A relay to `target` that holds whatever it reads for `delay`
    /// before passing it on, both ways: a peer across a slow network.
    pub fn delaying(target: &str, delay: Duration) -> Relay {
        Relay::start(target, None, delay)
    }

    fn start(target: &str, inject: Option<Injection>, delay: Duration) -> Relay {
        Relay::start_flipping(target, inject, delay, u64::MAX)
    }

    fn start_flipping(target: &str, inject: Option<Injection>, delay: Duration, flip_up: u64) -> Relay {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let legs: Arc<(Mutex<Vec<Arc<Leg>>>, Condvar)> = Arc::default();
        let r = Relay { port: l.local_addr().unwrap().port(), legs: legs.clone() };
        let target = target.to_string();
        std::thread::spawn(move || {
            for client in l.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(&target) else { return };
                let leg = Arc::new(Leg {
                    flip_down: AtomicU64::new(u64::MAX),
                    flip_up: AtomicU64::new(flip_up),
                    inject_down: Mutex::new(inject.clone()),
                    ..Leg::default()
                });
                {
                    let (list, cv) = &*legs;
                    list.lock().unwrap().push(leg.clone());
                    cv.notify_all();
                }
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let down = leg.clone();
                std::thread::spawn(move || pump(s2, c2, &down, false, delay));
                std::thread::spawn(move || pump(client, server, &leg, true, delay));
            }
        });
        r
    }

    /// Where clients connect.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Connection number `i` (from 0), waiting up to a minute for it.
    pub fn leg(&self, i: usize) -> Arc<Leg> {
        let (list, cv) = &*self.legs;
        let (l, _) = cv.wait_timeout_while(list.lock().unwrap(), Duration::from_secs(60), |l| l.len() <= i).unwrap();
        l.get(i).cloned().unwrap_or_else(|| panic!("no connection {i} came through the relay"))
    }

    /// How many connections came through so far.
    pub fn legs(&self) -> usize {
        self.legs.0.lock().unwrap().len()
    }
}

/// Copies `from` to `to` (client to target when `up`), flipping the low
/// bit of the byte the leg names, keeping what went up (and what came
/// down while words of the relay's own are due), putting those words in
/// at the byte they name, each read passed on `delay` after it came.
fn pump(mut from: TcpStream, mut to: TcpStream, leg: &Leg, up: bool, delay: Duration) {
    let (count, flip_at) = match up {
        true => (&leg.up, &leg.flip_up),
        false => (&leg.down, &leg.flip_down),
    };
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let (at, flip) = (count.load(SeqCst), flip_at.load(SeqCst));
        if flip >= at && flip < at + n as u64 {
            buf[(flip - at) as usize] ^= 1;
        }
        // Counted as passed before it is written: whatever the other end
        // has received is in the count (a flip set from it after a reply
        // arrived lands where it was aimed).
        count.fetch_add(n as u64, SeqCst);
        let mut out = buf[..n].to_vec();
        if up {
            leg.seen_up.lock().unwrap().extend_from_slice(&out);
        } else {
            let mut slot = leg.inject_down.lock().unwrap();
            if slot.is_some() {
                leg.seen_down.lock().unwrap().extend_from_slice(&out);
            }
            if slot.as_ref().is_some_and(|(i, _)| *i >= at && *i <= at + n as u64) {
                let (i, words) = slot.take().unwrap();
                let bytes = match words {
                    Words::Fixed(b) => b,
                    Words::Made(make) => {
                        let down = leg.seen_down.lock().unwrap();
                        make(&leg.seen_up.lock().unwrap(), &down[..down.len() - n + (i - at) as usize])
                    }
                };
                out.splice((i - at) as usize..(i - at) as usize, bytes);
            }
        }
        // The network's latency, not synchronisation.
        std::thread::sleep(delay);
        if to.write_all(&out).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
    let _ = from.shutdown(std::net::Shutdown::Both);
}
