//! A process in the middle of TCP connections: it relays every connection
//! made to it to `target`, both ways, and can flip one bit of byte number
//! `flip_down` (target to client) or `flip_up` (client to target) of a
//! connection, counted from that connection's start, once it passes. It
//! knows no key.
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

/// The relay: its port and its connections in the order they came.
pub struct Relay {
    port: u16,
    legs: Arc<(Mutex<Vec<Arc<Leg>>>, Condvar)>,
}

impl Relay {
    /// A relay to `target` on a free loopback port.
    pub fn to(target: &str) -> Relay {
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
                    flip_up: AtomicU64::new(u64::MAX),
                    ..Leg::default()
                });
                {
                    let (list, cv) = &*legs;
                    list.lock().unwrap().push(leg.clone());
                    cv.notify_all();
                }
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let down = leg.clone();
                std::thread::spawn(move || pump(s2, c2, &down.down, &down.flip_down, None));
                std::thread::spawn(move || pump(client, server, &leg.up, &leg.flip_up, Some(&leg.seen_up)));
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

/// Copies `from` to `to`, flipping the low bit of byte number `flip_at`,
/// keeping a copy in `seen` if given.
fn pump(mut from: TcpStream, mut to: TcpStream, count: &AtomicU64, flip_at: &AtomicU64, seen: Option<&Mutex<Vec<u8>>>) {
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
        if let Some(seen) = seen {
            seen.lock().unwrap().extend_from_slice(&buf[..n]);
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
        count.fetch_add(n as u64, SeqCst);
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
    let _ = from.shutdown(std::net::Shutdown::Both);
}
