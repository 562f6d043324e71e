//! The requester core's two sides as the pump sees them: what a turn
//! writes (the core's frames and WRITE payloads) and where what it reads
//! lands (a READ's payload straight into local memory, or the core's
//! buffer).

use crate::counters::Counters;
use crate::error::Result;
use crate::kinds::TransportKind;
use crate::transport::reactor::SCRATCH;
use crate::transport::tcp::proto::requester::{Recv, RequesterCore, Startable};
use crate::transport::tcp::pump::segment_bytes;
use crate::transport::tcp::pump::{self, Next};
use std::time::Instant;

/// The core's sending side, for the pump.
pub(super) struct Out<'a, T, H, N> {
    pub(super) core: &'a mut RequesterCore<T, H, N>,
    pub(super) stats: &'a Counters,
    pub(super) now: Instant,
}

impl<T: Startable, H, N> pump::Outgoing for Out<'_, T, H, N> {
    fn parts(&mut self) -> (Vec<&[u8]>, u64) {
        let (segs, skip) = self.core.transmit(self.now);
        // SAFETY: a WRITE's payload: the core keeps its request's lease on
        // the local region holding [addr, addr+len) (the submission checked
        // the range) until these bytes have left; the pump drops the parts
        // before the core hears what was sent.
        (segs.into_iter().map(|s| unsafe { segment_bytes(s) }).collect(), skip)
    }

    fn sent(&mut self, n: usize) {
        self.stats.record_wire_sent(TransportKind::Tcp, n as u64);
        self.core.sent(n as u64);
    }
}

/// The core's receiving side, for the pump.
pub(super) struct In<'a, T, H, N> {
    pub(super) core: &'a mut RequesterCore<T, H, N>,
}

impl<T: Startable, H, N> pump::Incoming for In<'_, T, H, N> {
    fn next(&mut self) -> Next<'_> {
        match self.core.recv() {
            // SAFETY: a READ's payload: the core keeps its request's lease
            // on the local region holding [addr, addr+len) until it
            // completes; only the holder of the connection's lock writes
            // it. Sealed, only bytes of records that checked are copied
            // there.
            Recv::Direct { addr, len } if len >= (SCRATCH / 2) as u64 => {
                Next::Direct(unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len as usize) })
            }
            _ => Next::Buffer,
        }
    }

    fn landed(&mut self, n: usize) {
        self.core.landed(n as u64);
    }

    fn received(&mut self, bytes: &[u8]) -> Result<bool> {
        // SAFETY: the core lands READ payload only inside the range its
        // request's lease keeps registered; only the holder of the
        // connection's lock writes it.
        let mut land =
            |addr: u64, b: &[u8]| unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), addr as *mut u8, b.len()) };
        self.core.received(bytes, &mut land)
    }

    fn eof(&mut self) -> Result<()> {
        self.core.eof()
    }

    fn payload_left(&self) -> Option<u64> {
        self.core.payload_left()
    }
}
