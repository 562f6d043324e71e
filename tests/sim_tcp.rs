//! A deterministic simulator of the TCP protocol cores: a requester core
//! and a source core joined by two in-memory pipes with bounded capacity,
//! a simulated clock, and a seeded scheduler that delivers bytes in
//! arbitrary splits, delays them, freezes either side, races submissions,
//! cancellations, deadlines, notifications, Describe requests and Revokes,
//! and cuts the connection. The bytes move through the drivers' own I/O
//! pump (`transport::tcp::pump`, over a wire sealed in half the runs), its
//! budget often a single send or read; the pipes split what they take at
//! random and raise a readable edge only when bytes reach an empty pipe, so
//! a pump that stops reading before the pipe is drained leaves bytes no
//! edge will bring back. After every step it checks the invariants:
//!
//! - every accepted request ends exactly once, and every one ends once the
//!   run is drained (nothing hangs);
//! - an OK READ holds the source's bytes; an OK WRITE's bytes are in the
//!   source's memory when it is reported; only a WRITE may be UNKNOWN, and
//!   a WRITE reported NONE changed nothing;
//! - a request's local memory is let go only once nothing of it is still
//!   to be sent;
//! - no request outlives its deadline: once the requester checked its
//!   deadlines, a READ past its own has ended, and a WRITE past its own by
//!   `WRITE_OVERRUN` (its payload stuck) has ended with the connection;
//! - a connection's end (cut, Goodbye, close) ends every request on it at
//!   once;
//! - in a run with no fault and generous deadlines, every request is OK;
//! - the source's answers waiting stay within their bound;
//! - every notification is answered exactly once, OK only when the
//!   source's engine queued it, and none is queued twice or answered as
//!   never sent once it reached the source;
//! - the wire never breaks (no record that fails to open, no malformed
//!   frame: nothing here garbles bytes);
//! - once faults stop and both ends run, no frame stalls and everything
//!   ends by itself (progress).
//!
//! The notifications here go to the core as the outbox releases them; the
//! outbox's own rule (a notification leaves only once the batches before
//! it ended) is the driver's, proven by `tests/notify.rs`.
//!
//! CI runs a fixed set of seeds; a failure prints the seed and the command
//! that replays it (`SIM_SEEDS=N cargo test --release --features sim --test sim_tcp
//! seeded_runs_with_faults -- --nocapture`). `scripts/sim.sh` runs many
//! more (`SIM_SEEDS=A-B`).
//!
//! Past bugs, re-introduced through switches, are scenarios that must fail:
//! a WRITE answered early completing while its payload is still sent
//! (`Mutations::complete_early_writes`), a request queued behind a full
//! socket failed only when the queue reached it, past its deadline
//! (`Mutations::keep_queued_past_deadline`, found by this simulator's
//! deadline invariant), a driver that does not resume
//! reading once the answers it paused for have left (the lost readable
//! edge: the honest peer's requests hang until their deadline), a driver
//! that delivers what a connection's end failed only at its next event
//! (`Plan::deliver_at_end`: found by the end invariant alone), and a
//! WRITE past its deadline mid-payload letting its memory go
//! (`Mutations::release_expired_writes_mid_payload`: found by the memory
//! invariant alone).

mod common;

use common::seeds;
use orbite::control::frame::MsgKind;
use orbite::control::identity::Identity;
use orbite::control::message::{DataRequest, Describe};
use orbite::control::notify_frame::Notify;
use orbite::control::pipe::Got;
use orbite::control::seal::{SessionKeys, WireSecurity};
use orbite::control::wire::Wire;
use orbite::error::{Error, Result, Status};
use orbite::transfer::{Op, RemoteEffect};
use orbite::transport::tcp::proto::requester::{self, Event, RequesterCore, Startable};
use orbite::transport::tcp::proto::source::{self, AfterSend, Limits, Recv, Segment, SourceCore, SourceHost};
use orbite::transport::tcp::pump::{self, Incoming, Next, Outgoing, Pipe, Received, Sent};
use std::cell::Cell;
use std::collections::{BTreeMap, VecDeque};
use std::rc::Rc;
use std::time::{Duration, Instant};

use common::Rng;

const BLOCK: u64 = 16 * 1024;
/// The source's region: blocks 0..READ_BLOCKS are read, the rest written
/// (each WRITE to a block of its own).
const READ_BLOCKS: u64 = 16;
const WRITE_BLOCKS: u64 = 2048;
const BASE: u64 = 0x1000_0000;
/// A request's local buffer: a READ spans up to four blocks.
const SLOT: u64 = 4 * BLOCK;
const EPOCH: u64 = 1;

fn pattern(seed: u64, i: u64) -> u8 {
    (i.wrapping_mul(131).wrapping_add(seed.wrapping_mul(7)).wrapping_add(i >> 9)) as u8
}

/// The source's memory and its engine, for the core.
struct Host {
    mem: Vec<u8>,
    hold: Rc<()>,
    /// The source engine's Describe (the requester knows it from the
    /// handshake).
    describe: Describe,
    /// The notifications the source's engine queued, by the simulation's
    /// number each carries.
    admitted: Vec<u64>,
}

impl SourceHost for Host {
    type Held = Rc<()>;
    type Admitted = u64;
    fn validate(&mut self, req: &DataRequest, write: bool) -> Result<Rc<()>> {
        if req.region_epoch != EPOCH {
            return Err(Error::StalePeer("another epoch".into()));
        }
        let end = BASE + self.mem.len() as u64;
        if req.addr < BASE || req.addr + req.len > end {
            return Err(Error::OutOfRange("outside the region".into()));
        }
        if write && req.addr < BASE + READ_BLOCKS * BLOCK {
            return Err(Error::PermissionDenied("the read blocks are read-only".into()));
        }
        Ok(self.hold.clone())
    }
    fn describe(&mut self) -> Vec<u8> {
        self.describe.encode()
    }
    fn admit(&mut self, n: Notify) -> Result<u64> {
        let id = u64::from_le_bytes(n.msg[..8].try_into().expect("the simulation's number"));
        self.admitted.push(id);
        Ok(n.tag)
    }
    fn notify_max(&self) -> usize {
        256
    }
    fn land(&mut self, addr: u64, bytes: &[u8]) {
        let at = (addr - BASE) as usize;
        self.mem[at..at + bytes.len()].copy_from_slice(bytes);
    }
    fn served(&mut self, _ok: bool, _bytes: u64) {}
    fn notify_rejected(&mut self) {}
    fn torn(&mut self, _req: &DataRequest, _landed: u64, _held: Rc<()>, _why: &str) {}
}

/// A request's completion record in the simulation.
struct Rec {
    id: u64,
    cancelled: Rc<Cell<bool>>,
}

impl Startable for Rec {
    fn start(&self) -> bool {
        !self.cancelled.get()
    }
}

/// What the simulation knows of a request it submitted.
struct Info {
    op: Op,
    local: u64,
    remote: u64,
    len: u64,
    /// The WRITE's pattern seed, or the READ's source pattern seed.
    seed: u64,
    hold: Rc<()>,
    /// Payload bytes of this WRITE the requester has put on the wire.
    sent: u64,
    cancelled: Rc<Cell<bool>>,
    outcome: Option<(Status, RemoteEffect)>,
    /// When it must have ended: its deadline (a WRITE whose payload is
    /// still leaving, or that was answered before its buffer settled, may
    /// keep it until its bytes left, up to `WRITE_OVERRUN` later, when
    /// the connection ends instead).
    deadline: Duration,
    /// Its connection was cut while its payload was still leaving (its
    /// memory is rightly let go with the connection).
    cut: bool,
}

/// The scheduler's knobs for one run.
#[derive(Clone, Copy)]
struct Plan {
    steps: usize,
    /// Faults (freezes, cuts, tight deadlines, cancellations) happen.
    faults: bool,
    /// The driver model resumes a paused source once its answers left.
    resume_after_pause: bool,
    /// The source's stall bound (payload, frames, answers not read).
    stall: Duration,
    /// The requester reads its answers rarely: the source's answers pile up
    /// to their bound and it pauses reading.
    slow_reader: bool,
    /// The driver model delivers what a connection's end failed as it
    /// ends (the engine's `TcpConnection::kill` and `close` deliver it
    /// through `unlock`), not at the connection's next event.
    deliver_at_end: bool,
    mutations: requester::Mutations,
}

/// One direction of the simulated connection.
#[derive(Default)]
struct Chan {
    bytes: VecDeque<u8>,
    /// A readable edge waits for the reader: bytes arrived in the empty
    /// pipe, or its end (edge-triggered, as the reactor's sockets: bytes
    /// arriving behind bytes not read bring none).
    edge: bool,
    /// The writer ended the stream.
    closed: bool,
}

impl Chan {
    fn close(&mut self) {
        self.closed = true;
        self.edge = true;
    }
}

/// One end of the simulated connection, as the drivers' pump sees it:
/// reads and sends take a random share of what they could.
struct End<'a> {
    rx: &'a mut Chan,
    tx: &'a mut Chan,
    cap: usize,
    rng: &'a mut Rng,
}

impl Pipe for End<'_> {
    fn read(&mut self, buf: &mut [u8]) -> Result<Got> {
        if self.rx.bytes.is_empty() {
            return Ok(if self.rx.closed { Got::Eof } else { Got::Drained });
        }
        let k = 1 + self.rng.below(self.rx.bytes.len().min(buf.len()) as u64) as usize;
        for (d, b) in buf.iter_mut().zip(self.rx.bytes.drain(..k)) {
            *d = b;
        }
        Ok(Got::Bytes(k))
    }

    fn send(&mut self, parts: &[&[u8]], skip: u64, max: usize) -> std::io::Result<usize> {
        let room = self.cap.saturating_sub(self.tx.bytes.len());
        let avail = (parts.iter().map(|p| p.len() as u64).sum::<u64>() - skip) as usize;
        if room == 0 {
            return Err(std::io::ErrorKind::WouldBlock.into());
        }
        let n = 1 + self.rng.below(avail.min(room).min(max) as u64) as usize;
        if self.tx.bytes.is_empty() {
            self.tx.edge = true;
        }
        let (mut skip, mut left) = (skip as usize, n);
        for p in parts {
            if skip >= p.len() {
                skip -= p.len();
                continue;
            }
            let take = (p.len() - skip).min(left);
            self.tx.bytes.extend(&p[skip..skip + take]);
            (skip, left) = (0, left - take);
            if left == 0 {
                break;
            }
        }
        Ok(n)
    }
}

/// The requester's and the source's wires of a fresh connection.
fn wires(sealed: bool) -> (Wire, Wire) {
    if !sealed {
        return (Wire::Plain, Wire::Plain);
    }
    let key = b"the simulation's shared key here";
    let (c, s) = ([4u8; 32], [5u8; 32]);
    let halves = |connector| SessionKeys::derive(key, &c, &s, connector, WireSecurity::default()).split();
    (Wire::sealed(halves(true)), Wire::sealed(halves(false)))
}

/// The requester core's sending side for the pump; it counts the WRITE
/// payload bytes that left.
struct ReqOut<'a> {
    core: &'a mut RequesterCore<Rec, Rc<()>, u64>,
    local: &'a [u8],
    reqs: &'a mut BTreeMap<u64, Info>,
    at: Instant,
    /// The WRITE payloads among the parts last offered: where each starts
    /// in them, its length and its local address.
    owners: Vec<(u64, u64, u64)>,
    skip: u64,
}

impl Outgoing for ReqOut<'_> {
    fn parts(&mut self) -> (Vec<&[u8]>, u64) {
        let (segs, skip) = self.core.transmit(self.at);
        let (mut parts, mut at) = (Vec::new(), 0u64);
        self.owners.clear();
        self.skip = skip;
        for s in segs {
            let b = match s {
                Segment::Bytes(b) => b,
                Segment::Memory { addr, len } => {
                    self.owners.push((at, len, addr));
                    &self.local[addr as usize..(addr + len) as usize]
                }
            };
            at += b.len() as u64;
            parts.push(b);
        }
        (parts, skip)
    }

    fn sent(&mut self, n: usize) {
        let (from, to) = (self.skip, self.skip + n as u64);
        for &(start, len, addr) in &self.owners {
            let (lo, hi) = (start.max(from), (start + len).min(to));
            if hi > lo {
                let live = |r: &&mut Info| r.op == Op::Write && r.local == addr && Rc::strong_count(&r.hold) > 1;
                if let Some(r) = self.reqs.values_mut().find(live) {
                    r.sent += hi - lo;
                }
            }
        }
        self.core.sent(n as u64);
    }
}

/// The requester core's receiving side for the pump.
struct ReqIn<'a> {
    core: &'a mut RequesterCore<Rec, Rc<()>, u64>,
    local: &'a mut [u8],
    direct_min: u64,
}

impl Incoming for ReqIn<'_> {
    fn next(&mut self) -> Next<'_> {
        match self.core.recv() {
            requester::Recv::Direct { addr, len } if len >= self.direct_min => {
                Next::Direct(&mut self.local[addr as usize..(addr + len) as usize])
            }
            _ => Next::Buffer,
        }
    }
    fn landed(&mut self, n: usize) {
        self.core.landed(n as u64);
    }
    fn received(&mut self, bytes: &[u8]) -> Result<bool> {
        let local = &mut *self.local;
        let mut land = |addr: u64, b: &[u8]| local[addr as usize..addr as usize + b.len()].copy_from_slice(b);
        self.core.received(bytes, &mut land)
    }
    fn eof(&mut self) -> Result<()> {
        self.core.eof()
    }
    fn payload_left(&self) -> Option<u64> {
        self.core.payload_left()
    }
}

/// The source core's sending side for the pump.
struct SrcOut<'a> {
    core: &'a mut SourceCore<Host>,
    host: &'a mut Host,
    at: Instant,
}

impl Outgoing for SrcOut<'_> {
    fn parts(&mut self) -> (Vec<&[u8]>, u64) {
        let (segs, skip) = self.core.transmit(self.at);
        let mem = &self.host.mem;
        let parts = segs
            .into_iter()
            .map(|s| match s {
                Segment::Bytes(b) => b,
                Segment::Memory { addr, len } => &mem[(addr - BASE) as usize..(addr - BASE + len) as usize],
            })
            .collect();
        (parts, skip as u64)
    }
    fn sent(&mut self, n: usize) {
        self.core.sent(n, self.at);
    }
    fn nothing(&mut self) -> Option<Sent> {
        match self.core.after_send(self.host) {
            AfterSend::Close => Some(Sent::Closed),
            AfterSend::Idle => Some(Sent::Complete),
            AfterSend::More => None,
        }
    }
    fn closes(&mut self) -> bool {
        self.core.after_send(self.host) == AfterSend::Close
    }
}

/// The source core's receiving side for the pump.
struct SrcIn<'a> {
    core: &'a mut SourceCore<Host>,
    host: &'a mut Host,
    at: Instant,
    direct_min: u64,
}

impl Incoming for SrcIn<'_> {
    fn next(&mut self) -> Next<'_> {
        match self.core.recv(self.at) {
            Recv::Ended => Next::Stop(Received::Closed),
            Recv::Paused => Next::Stop(Received::More),
            Recv::Direct { addr, len } if len >= self.direct_min => {
                let off = (addr - BASE) as usize;
                Next::Direct(&mut self.host.mem[off..off + len as usize])
            }
            Recv::Direct { .. } | Recv::Buffer => Next::Buffer,
        }
    }
    fn landed(&mut self, n: usize) {
        self.core.landed(n as u64, self.at, self.host);
    }
    fn received(&mut self, bytes: &[u8]) -> Result<bool> {
        self.core.received(bytes, self.at, self.host).map(|_| true)
    }
    fn eof(&mut self) -> Result<()> {
        self.core.eof()
    }
    fn payload_left(&self) -> Option<u64> {
        self.core.payload_left()
    }
}

struct Sim {
    rng: Rng,
    plan: Plan,
    t0: Instant,
    now: Duration,
    req: RequesterCore<Rec, Rc<()>, u64>,
    src: SourceCore<Host>,
    host: Host,
    /// Requester to source, and back; `cap` bytes each.
    r2s: Chan,
    s2r: Chan,
    cap: usize,
    /// How each side's bytes travel: sealed in some runs.
    req_wire: Wire,
    src_wire: Wire,
    /// The runs' wires are sealed.
    sealed: bool,
    /// The last receive turn of the requester's, or the source's, driver
    /// stopped with bytes maybe left: it runs again without an edge.
    req_more: bool,
    src_more: bool,
    /// The source's core reads no more on this connection.
    src_read_over: bool,
    local: Vec<u8>,
    reqs: BTreeMap<u64, Info>,
    /// Local buffers of 128 KiB not used by a live request.
    free_slots: Vec<u64>,
    /// The slot of each request still holding one.
    slot_of: BTreeMap<u64, u64>,
    next_id: u64,
    next_write_block: u64,
    src_frozen_until: Duration,
    /// The connection was cut (both ends failed it).
    cut: bool,
    /// The source ended the connection after its answers (Goodbye).
    src_closed: bool,
    /// Notifications sent, by number: their answer once it came (Ok, or
    /// the reason and whether the frame may have reached the source).
    notes: BTreeMap<u64, Option<(bool, bool)>>,
    trace: Vec<String>,
}

impl Sim {
    fn new(seed: u64, plan: Plan) -> Sim {
        let mut rng = Rng(seed);
        let mem_len = ((READ_BLOCKS + WRITE_BLOCKS) * BLOCK) as usize;
        let mut mem = vec![0u8; mem_len];
        for (i, b) in mem.iter_mut().enumerate() {
            *b = pattern(1, i as u64);
        }
        let cap = [4096usize, 65536, 1 << 20][rng.below(3) as usize];
        let describe = Describe::bare(Identity::fresh().unwrap());
        let mut req = RequesterCore::new("peer 1".into(), describe.clone());
        req.mutations = plan.mutations;
        let stall = plan.stall;
        let sealed = rng.chance(50);
        let (req_wire, src_wire) = wires(sealed);
        Sim {
            rng,
            plan,
            t0: Instant::now(),
            now: Duration::ZERO,
            req,
            src: SourceCore::new(Limits { stall, min_rate: 0 }),
            host: Host { mem, hold: Rc::new(()), describe, admitted: Vec::new() },
            r2s: Chan::default(),
            s2r: Chan::default(),
            cap,
            req_wire,
            src_wire,
            sealed,
            req_more: false,
            src_more: false,
            src_read_over: false,
            local: vec![0u8; (512 * SLOT) as usize],
            reqs: BTreeMap::new(),
            free_slots: (0..512).rev().collect(),
            slot_of: BTreeMap::new(),
            next_id: 1,
            next_write_block: READ_BLOCKS,
            src_frozen_until: Duration::ZERO,
            cut: false,
            src_closed: false,
            notes: BTreeMap::new(),
            trace: Vec::new(),
        }
    }

    fn at(&self) -> Instant {
        self.t0 + self.now
    }

    fn src_frozen(&self) -> bool {
        self.now < self.src_frozen_until
    }

    fn submit(&mut self) {
        let n = 1 + self.rng.below(8);
        let mut sends = Vec::new();
        let cancelled = Rc::new(Cell::new(false));
        for _ in 0..n {
            let Some(slot) = self.free_slots.pop() else { break };
            let id = self.next_id;
            self.next_id += 1;
            self.slot_of.insert(id, slot);
            let local = slot * SLOT;
            let read = self.rng.chance(50) || self.next_write_block >= READ_BLOCKS + WRITE_BLOCKS;
            let len = 1 + self.rng.below(if read { SLOT } else { BLOCK });
            let (op, remote, seed) = if read {
                (Op::Read, BASE + self.rng.below(READ_BLOCKS * BLOCK - len + 1), 1)
            } else {
                let b = self.next_write_block;
                self.next_write_block += 1;
                let seed = 1000 + id;
                for i in 0..len {
                    self.local[(local + i) as usize] = pattern(seed, i);
                }
                (Op::Write, BASE + b * BLOCK, seed)
            };
            let slack = if self.plan.faults && self.rng.chance(30) {
                Duration::from_millis(5 + self.rng.below(500))
            } else {
                Duration::from_secs(3600)
            };
            let hold = Rc::new(());
            self.reqs.insert(
                id,
                Info {
                    op,
                    local,
                    remote,
                    len,
                    seed,
                    hold: hold.clone(),
                    sent: 0,
                    cancelled: cancelled.clone(),
                    outcome: None,
                    deadline: self.now + slack,
                    cut: false,
                },
            );
            sends.push(requester::Send {
                op,
                local_addr: local,
                remote_addr: remote,
                len,
                region_epoch: EPOCH,
                deadline: self.at() + slack,
                done: Rec { id, cancelled: cancelled.clone() },
                hold,
            });
        }
        self.trace.push(format!("t={:?} submit {n}", self.now));
        self.req.submit(sends);
    }

    /// A notification to the source's engine, numbered in its message.
    fn notify(&mut self) {
        let id = self.notes.len() as u64 + 1;
        self.notes.insert(id, None);
        let slack = if self.plan.faults && self.rng.chance(30) {
            Duration::from_millis(5 + self.rng.below(500))
        } else {
            Duration::from_secs(3600)
        };
        let body = move |tag: u64| Notify { tag, name: "sim".into(), msg: id.to_le_bytes().to_vec() }.encode();
        self.trace.push(format!("t={:?} notify {id}", self.now));
        self.req.notify(body, self.at() + slack, id);
    }

    /// A budget for one pump call: often a single send or read (the
    /// stepping that finds a pump stopping early), else a share or no bound.
    fn budget(&mut self) -> u64 {
        match self.rng.below(4) {
            0 | 1 => 1,
            2 => 1 + self.rng.below(self.cap as u64),
            _ => u64::MAX,
        }
    }

    /// A buffer size and the least payload read straight into memory, for
    /// one receive turn.
    fn buffers(&mut self) -> (Vec<u8>, u64) {
        let scratch = vec![0u8; 1 + self.rng.below(8192) as usize];
        (scratch, [1, 4096, u64::MAX][self.rng.below(3) as usize])
    }

    /// The requester's driver sends what the socket takes (the pump's
    /// write loop).
    fn req_send(&mut self) {
        if self.cut {
            return;
        }
        let (at, budget) = (self.at(), self.budget());
        let Sim { req, r2s, s2r, cap, rng, local, reqs, req_wire, .. } = self;
        let mut pipe = End { rx: s2r, tx: r2s, cap: *cap, rng };
        let mut out = ReqOut { core: req, local, reqs, at, owners: Vec::new(), skip: 0 };
        if let Err(e) = pump::write_out(&mut pipe, req_wire, &mut out, budget) {
            self.cut_with(Error::Unavailable(format!("the requester's send failed: {e}")));
        }
    }

    /// The source's driver reads what the socket holds (the pump's read
    /// loop), on a readable edge or when its last turn stopped early.
    fn src_recv(&mut self) -> std::result::Result<(), Error> {
        if self.cut || self.src_frozen() || self.src_closed || !(self.r2s.edge || self.src_more) {
            return Ok(());
        }
        self.r2s.edge = false;
        // Each of the driver's steps is a turn of its I/O thread.
        self.src.begin_turn(&mut self.host);
        let (at, mut budget) = (self.at(), self.budget());
        let (mut scratch, direct_min) = self.buffers();
        let Sim { src, host, r2s, s2r, cap, rng, src_wire, .. } = self;
        let mut pipe = End { rx: r2s, tx: s2r, cap: *cap, rng };
        let mut inc = SrcIn { core: src, host, at, direct_min };
        let r = pump::receive(&mut pipe, src_wire, &mut inc, &mut scratch, &mut budget, None);
        self.src_more = r.as_ref().is_ok_and(|r| *r == Received::More);
        self.src_read_over |= r.as_ref().is_ok_and(|r| *r == Received::Closed);
        r.map(drop)
    }

    /// The source's driver sends what the socket takes (the pump's write
    /// loop), then resumes reading once its answers have room.
    fn src_send(&mut self) {
        if self.cut || self.src_frozen() || self.src_closed {
            return;
        }
        self.src.begin_turn(&mut self.host);
        let (at, budget) = (self.at(), self.budget());
        let Sim { src, host, r2s, s2r, cap, rng, src_wire, .. } = self;
        let mut pipe = End { rx: r2s, tx: s2r, cap: *cap, rng };
        match pump::write_out(&mut pipe, src_wire, &mut SrcOut { core: src, host, at }, budget) {
            Ok(Sent::Closed) => {
                self.src_closed = true;
                self.s2r.close();
                return;
            }
            Ok(_) => {}
            Err(e) => return self.cut_with(Error::Unavailable(format!("the source's send failed: {e}"))),
        }
        self.src.take_published();
        if self.plan.resume_after_pause && self.src.stashed() && !self.src.answers_full() {
            if let Err(e) = self.src.resume(at, &mut self.host) {
                self.cut_with(e);
            }
        }
    }

    /// The requester's driver reads what the socket holds (the pump's
    /// read loop), on a readable edge or when its last turn stopped early:
    /// false once the source ended the connection in order.
    fn req_recv(&mut self) -> std::result::Result<bool, Error> {
        if self.cut || !(self.s2r.edge || self.req_more) {
            return Ok(true);
        }
        self.s2r.edge = false;
        let mut budget = self.budget();
        let (mut scratch, direct_min) = self.buffers();
        let Sim { req, r2s, s2r, cap, rng, local, req_wire, .. } = self;
        let mut pipe = End { rx: s2r, tx: r2s, cap: *cap, rng };
        let mut inc = ReqIn { core: req, local, direct_min };
        let r = pump::receive(&mut pipe, req_wire, &mut inc, &mut scratch, &mut budget, None);
        self.req_more = r.as_ref().is_ok_and(|r| *r == Received::More);
        r.map(|r| r != Received::Closed)
    }

    /// Bytes in a pipe whose reader still reads always have a way to be
    /// read: a readable edge waits, or the reader's last turn stopped early
    /// and it runs again. A pump that stops reading before the pipe is
    /// drained, and says it drained it, strands them: no edge comes for
    /// bytes behind bytes not read, and the scenario would hang.
    fn no_bytes_stranded(&self) {
        if self.cut {
            return;
        }
        let src = !self.src_closed && !self.src_read_over && !self.r2s.bytes.is_empty();
        assert!(!src || self.r2s.edge || self.src_more, "{} bytes stranded before the source", self.r2s.bytes.len());
        let req = !self.s2r.bytes.is_empty();
        assert!(!req || self.s2r.edge || self.req_more, "{} bytes stranded before the requester", self.s2r.bytes.len());
    }

    /// A read failed: nothing in this simulation garbles or forges bytes,
    /// so a record that does not open or a malformed frame is the pump's
    /// (or a core's) bug; anything else ends the connection.
    fn read_failed(&mut self, e: Error) {
        if let Error::Protocol(_) | Error::PermissionDenied(_) = e {
            panic!("the wire broke: {e}");
        }
        self.cut_with(e);
    }

    fn cut_with(&mut self, e: Error) {
        if self.cut {
            return;
        }
        self.trace.push(format!("t={:?} cut: {e}", self.now));
        if std::env::var_os("SIM_TRACE").is_some() {
            eprintln!("t={:?} cut: {e}", self.now);
        }
        self.cut = true;
        for r in self.reqs.values_mut().filter(|r| r.sent < r.len) {
            r.cut = true;
        }
        let at = self.at();
        self.req.kill(e.clone(), at);
        self.src.fail(&e, &mut self.host);
        self.r2s = Chan::default();
        self.s2r = Chan::default();
        (self.req_more, self.src_more) = (false, false);
        // A connection's end (a cut, a Goodbye, the engine's close) ends
        // every request on it at once: none waits for a deadline.
        if self.plan.deliver_at_end {
            self.settle();
        }
        if let Some((id, r)) = self.reqs.iter().find(|(_, r)| r.outcome.is_none()) {
            panic!("request {id} ({:?}) is still pending after its connection ended: {e}", r.op);
        }
    }

    /// A new connection after a cut (the requester reconnects to the same
    /// source): fresh cores, empty pipes.
    fn reconnect(&mut self) {
        self.trace.push(format!("t={:?} reconnect", self.now));
        let mut req = RequesterCore::new("peer 1".into(), self.host.describe.clone());
        req.mutations = self.plan.mutations;
        self.req = req;
        self.src = SourceCore::new(Limits { stall: self.plan.stall, min_rate: 0 });
        (self.req_wire, self.src_wire) = wires(self.sealed);
        self.src_read_over = false;
        self.r2s = Chan::default();
        self.s2r = Chan::default();
        (self.req_more, self.src_more) = (false, false);
        self.cut = false;
        self.src_closed = false;
    }

    /// One scheduler step.
    fn step(&mut self) {
        if self.cut && self.rng.chance(10) {
            self.reconnect();
        }
        let live = self.reqs.values().filter(|r| r.outcome.is_none()).count();
        match self.rng.below(100) {
            0..=14 if !self.cut && live < 400 => self.submit(),
            15..=34 => self.req_send(),
            35..=54 => {
                if let Err(e) = self.src_recv() {
                    self.read_failed(e);
                }
            }
            55..=74 => self.src_send(),
            75..=89 if !self.plan.slow_reader || self.rng.chance(10) => match self.req_recv() {
                Ok(true) => {}
                Ok(false) => self.cut_with(Error::Unavailable("goodbye".into())),
                Err(e) => self.read_failed(e),
            },
            90..=93 => {
                self.now += Duration::from_millis(self.rng.below(60));
                let at = self.at();
                if let Err(e) = self.req.expire(at) {
                    self.cut_with(e);
                }
                if !self.src_frozen() {
                    if let Err(e) = self.src.check(at) {
                        self.cut_with(e);
                    }
                }
                self.settle();
                self.nothing_outlives_its_deadline();
            }
            94 if self.plan.faults && !self.src_frozen() => {
                let d = Duration::from_millis(100 + self.rng.below(3000));
                self.trace.push(format!("t={:?} freeze the source {d:?}", self.now));
                self.src_frozen_until = self.now + d;
            }
            95 if self.plan.faults => {
                if let Some(r) = self.reqs.values().rfind(|r| r.outcome.is_none()) {
                    r.cancelled.set(true);
                }
            }
            96 if self.plan.faults && self.rng.chance(5) => self.cut_with(Error::Unavailable("the network cut".into())),
            97 if !self.cut => {
                let _ = self.req.request_describe();
            }
            98 if !self.cut && !self.src_frozen() => self.src.push_frame(MsgKind::Revoke, &[]),
            99 if !self.cut => self.notify(),
            _ => self.now += Duration::from_micros(self.rng.below(500)),
        }
        self.settle();
    }

    /// Right after the requester's deadlines were checked: a READ past its
    /// deadline has ended (TIMED_OUT at the latest), and so has a WRITE
    /// past its deadline by `WRITE_OVERRUN` (whose payload could not leave
    /// by then ends the connection, and with it the WRITE).
    fn nothing_outlives_its_deadline(&self) {
        for (id, r) in &self.reqs {
            let bound = match r.op {
                Op::Read => r.deadline,
                Op::Write => r.deadline + requester::WRITE_OVERRUN,
            };
            assert!(
                r.outcome.is_some() || self.now < bound,
                "request {id} ({:?}) is still pending {:?} after its deadline",
                r.op,
                self.now - r.deadline
            );
        }
    }

    /// Takes the requester's completions and checks each against the
    /// invariants.
    fn settle(&mut self) {
        for (rec, out) in self.req.take_done() {
            let info = self.reqs.get_mut(&rec.id).expect("a request the simulation submitted");
            let status = out.result.as_ref().err().map_or(Status::Ok, |e| e.status());
            assert!(info.outcome.is_none(), "request {} ended twice", rec.id);
            info.outcome = Some((status, out.effect));
            let (op, local, remote, len, seed) = (info.op, info.local, info.remote, info.len, info.seed);
            match (op, status, out.effect) {
                (Op::Read, Status::Ok, RemoteEffect::None) => {
                    for i in 0..len {
                        let want = pattern(seed, remote - BASE + i);
                        assert_eq!(self.local[(local + i) as usize], want, "request {} READ byte {i}", rec.id);
                    }
                }
                (Op::Read, Status::Ok, e) => panic!("request {}: an OK READ with effect {e:?}", rec.id),
                (Op::Read, _, RemoteEffect::None) => {}
                (Op::Read, s, e) => panic!("request {}: a READ failed {s:?} with effect {e:?}", rec.id),
                (Op::Write, Status::Ok, RemoteEffect::Applied) => {
                    for i in 0..len {
                        let got = self.host.mem[(remote - BASE + i) as usize];
                        assert_eq!(got, pattern(seed, i), "request {}: an OK WRITE's byte {i} is not there", rec.id);
                    }
                }
                (Op::Write, Status::Ok, e) => panic!("request {}: an OK WRITE with effect {e:?}", rec.id),
                (Op::Write, _, RemoteEffect::None) => {
                    for i in 0..len {
                        let got = self.host.mem[(remote - BASE + i) as usize];
                        assert_eq!(
                            got,
                            pattern(1, remote - BASE + i),
                            "request {}: a WRITE said NONE changed byte {i}",
                            rec.id
                        );
                    }
                }
                // Only the payload that may have left may have landed: a
                // coalesced run's requests beyond it say NONE by it.
                (Op::Write, _, RemoteEffect::Unknown) => {
                    for i in out.reached.unwrap_or(len)..len {
                        let got = self.host.mem[(remote - BASE + i) as usize];
                        assert_eq!(
                            got,
                            pattern(1, remote - BASE + i),
                            "request {}: a WRITE said at most {:?} bytes left, and byte {i} changed",
                            rec.id,
                            out.reached
                        );
                    }
                }
                (Op::Write, s, e) => panic!("request {}: a WRITE failed {s:?} with effect {e:?}", rec.id),
            }
        }
        // Memory let go only once nothing of it is still to be sent.
        for (id, r) in &self.reqs {
            if r.op == Op::Write && r.outcome.is_some() && Rc::strong_count(&r.hold) == 1 && !r.cut {
                assert!(
                    r.sent == 0 || r.sent == r.len,
                    "request {id}: its memory was released with {} of {} payload bytes sent",
                    r.sent,
                    r.len
                );
            }
        }
        // Each notification is answered once; OK only if the source's
        // engine queued it, and one it queued was sent.
        for ev in self.req.take_events() {
            if let Event::NotifyAnswer(id, outcome, sent) = ev {
                let slot = self.notes.get_mut(&id).expect("a notification the simulation sent");
                assert!(slot.is_none(), "notification {id} answered twice");
                *slot = Some((outcome.is_ok(), sent));
                if outcome.is_ok() {
                    assert!(sent, "notification {id} answered OK without being sent");
                    assert!(self.host.admitted.contains(&id), "notification {id} answered OK, never queued");
                }
            }
        }
        for id in &self.host.admitted {
            assert!(self.notes.contains_key(id), "the source queued a notification nobody sent ({id})");
            if let Some(Some((_, sent))) = self.notes.get(id) {
                assert!(*sent, "notification {id} reached the source but was answered as never sent");
            }
        }
        // Buffers of requests that ended and let go of their memory are free.
        let freed: Vec<u64> = self
            .slot_of
            .keys()
            .copied()
            .filter(|id| self.reqs[id].outcome.is_some() && Rc::strong_count(&self.reqs[id].hold) == 1)
            .collect();
        for id in freed {
            self.free_slots.push(self.slot_of.remove(&id).expect("held"));
        }
    }

    /// No more faults: the source runs, bytes flow and time passes until
    /// nothing is left in flight; then every request has ended and every
    /// hold is released.
    fn drain(&mut self) {
        self.src_frozen_until = Duration::ZERO;
        let start = self.now;
        let mut settled = false;
        for _ in 0..200_000 {
            if self.reqs.values().all(|r| r.outcome.is_some())
                && self.notes.values().all(Option::is_some)
                && self.r2s.bytes.is_empty()
                && self.s2r.bytes.is_empty()
            {
                settled = true;
                break;
            }
            self.req_send();
            if let Err(e) = self.src_recv() {
                self.read_failed(e);
            }
            self.src_send();
            match self.req_recv() {
                Ok(true) => {}
                Ok(false) => self.cut_with(Error::Unavailable("goodbye".into())),
                Err(e) => self.read_failed(e),
            }
            self.now += Duration::from_millis(1);
            let at = self.at();
            if let Err(e) = self.req.expire(at) {
                self.cut_with(e);
            }
            if let Err(e) = self.src.check(at) {
                // Both ends run every millisecond now: bytes the pump left
                // in a pipe (a readable edge lost) stall a frame.
                assert!(self.now - start <= self.plan.stall, "a frame stalled while both ends run: {e}");
                self.cut_with(e);
            }
            self.settle();
        }
        // Progress: with both ends running, everything ends by itself.
        assert!(settled, "the drain made no progress in {:?}", self.now - start);
        // The end of the connection fails whatever is left.
        self.cut_with(Error::Unavailable("the simulation ends".into()));
        self.settle();
        for (id, n) in &self.notes {
            assert!(n.is_some(), "notification {id} was never answered");
        }
        let mut seen = self.host.admitted.clone();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), self.host.admitted.len(), "a notification was queued twice at the source");
        for (id, r) in &self.reqs {
            assert!(r.outcome.is_some(), "request {id} never ended");
            assert_eq!(Rc::strong_count(&r.hold), 1, "request {id}'s memory is still held");
        }
        assert_eq!(Rc::strong_count(&self.host.hold), 1, "the source still holds a region lease");
    }
}

/// One run; returns the outcomes counted by status.
fn run(seed: u64, plan: Plan) -> BTreeMap<String, u64> {
    let mut sim = Sim::new(seed, plan);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for _ in 0..plan.steps {
            sim.step();
            sim.no_bytes_stranded();
            // The answers waiting stay within their bound (one frame's
            // answer beyond it at most: it is checked before each frame).
            let (bytes, items) = sim.src.queued();
            assert!(bytes <= source::OUT_BYTES_MAX + SLOT + 4096, "{bytes} bytes of answers wait");
            assert!(items <= source::OUT_ITEMS_MAX + 3, "{items} answers wait");
        }
        sim.drain();
    }));
    if let Err(p) = result {
        let msg = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
        let tail: Vec<&String> = sim.trace.iter().rev().take(8).collect();
        panic!(
            "simulation seed {seed} failed: {}\nlast events: {tail:?}\nreplay: {}",
            msg.unwrap_or_default(),
            match plan.faults {
                true => format!(
                    "SIM_SEEDS={seed} cargo test --release --features sim --test sim_tcp seeded_runs_with_faults -- --nocapture"
                ),
                false => "cargo test --release --features sim --test sim_tcp seeded_runs_without_faults -- --nocapture".to_string(),
            }
        );
    }
    let mut counts = BTreeMap::new();
    for r in sim.reqs.values() {
        let (s, _) = r.outcome.expect("ended");
        *counts.entry(format!("{s:?}")).or_insert(0) += 1;
    }
    for n in sim.notes.values() {
        let (ok, _) = n.expect("answered");
        *counts.entry(if ok { "NotifyOk" } else { "NotifyFailed" }.to_string()).or_insert(0) += 1;
    }
    counts
}

const NO_MUTATION: requester::Mutations = requester::Mutations {
    complete_early_writes: false,
    keep_queued_past_deadline: false,
    release_expired_writes_mid_payload: false,
};
const FAULTS: Plan = Plan {
    steps: 20_000,
    faults: true,
    resume_after_pause: true,
    stall: Duration::from_secs(5),
    slow_reader: false,
    deliver_at_end: true,
    mutations: NO_MUTATION,
};
/// No faults; the simulated network may be slow (a few hundred KB per
/// simulated second), so the stall bound is far beyond it.
const CLEAN: Plan = Plan {
    steps: 20_000,
    faults: false,
    resume_after_pause: true,
    stall: Duration::from_secs(600),
    slow_reader: false,
    deliver_at_end: true,
    mutations: NO_MUTATION,
};

/// The fixed seed set CI runs: faults everywhere, every invariant.
#[test]
fn seeded_runs_with_faults_keep_every_invariant() {
    let mut total = BTreeMap::new();
    let set = seeds(1..=40);
    let many = set.end() - set.start() >= 10;
    for seed in set {
        for (k, v) in run(seed, FAULTS) {
            *total.entry(k).or_insert(0) += v;
        }
    }
    eprintln!("outcomes: {total:?}");
    if many {
        // The runs exercised both ends: successes and each kind of failure.
        assert!(total.get("Ok").copied().unwrap_or(0) > 1000, "{total:?}");
        assert!(total.get("TimedOut").copied().unwrap_or(0) > 0, "{total:?}");
        assert!(total.get("NotifyOk").copied().unwrap_or(0) > 100, "{total:?}");
        assert!(total.get("NotifyFailed").copied().unwrap_or(0) > 0, "{total:?}");
    }
}

/// Without faults and with generous deadlines every request is OK, however
/// the bytes are split and delayed.
#[test]
fn seeded_runs_without_faults_complete_every_request() {
    for seed in 100..=120u64 {
        let c = run(seed, CLEAN);
        assert_eq!(c.keys().collect::<Vec<_>>(), vec!["NotifyOk", "Ok"], "seed {seed}: {c:?}");
    }
    // A requester that reads its answers rarely pauses the source (its
    // answers at their bound) and is served all the same once it reads.
    for seed in 150..=155u64 {
        let c = run(seed, Plan { slow_reader: true, ..CLEAN });
        assert!(c.keys().all(|k| k == "Ok" || k == "NotifyOk"), "seed {seed}: {c:?}");
    }
}

/// A source that answers each WRITE as soon as its header is in, before
/// its payload (hostile, or one whose answer overtakes the requester's
/// bookkeeping), against the requester core: splits of sends and answers
/// drawn from `seed`. Checks that a WRITE's memory is let go only once its
/// payload has left, and that every WRITE ends OK.
fn early_answers(seed: u64, mutations: requester::Mutations) {
    let mut rng = Rng(seed);
    let t0 = Instant::now();
    let mut req: RequesterCore<Rec, Rc<()>, u64> =
        RequesterCore::new("peer 1".into(), Describe::bare(Identity::fresh().unwrap()));
    req.mutations = mutations;
    let local: Vec<u8> = (0..(8 * BLOCK) as usize).map(|i| pattern(5, i as u64)).collect();
    let n = 1 + rng.below(8);
    let holds: Vec<Rc<()>> = (0..n).map(|_| Rc::new(())).collect();
    let sends: Vec<_> = (0..n)
        .map(|k| requester::Send {
            op: Op::Write,
            local_addr: k * BLOCK,
            remote_addr: BASE + k * BLOCK,
            len: 1 + rng.below(BLOCK),
            region_epoch: EPOCH,
            deadline: t0 + Duration::from_secs(3600),
            done: Rec { id: k, cancelled: Rc::new(Cell::new(false)) },
            hold: holds[k as usize].clone(),
        })
        .collect();
    req.submit(sends);
    // What the source has read, and the WRITE payload bytes still to skip.
    let (mut wire, mut skip, mut answered, mut done) = (Vec::<u8>::new(), 0usize, 0u64, 0u64);
    let mut sent_of = vec![0u64; n as usize];
    let mut lens = vec![0u64; n as usize];
    for _ in 0..10_000 {
        let (segs, at) = req.transmit(t0);
        let mut bytes = Vec::new();
        let mut owners = Vec::new();
        for s in &segs {
            match s {
                Segment::Bytes(b) => bytes.extend_from_slice(b),
                Segment::Memory { addr, len } => {
                    owners.push((bytes.len(), *len as usize, addr / BLOCK));
                    bytes.extend_from_slice(&local[*addr as usize..(*addr + *len) as usize]);
                }
            }
        }
        drop(segs);
        if bytes.len() > at as usize {
            let k = 1 + rng.below((bytes.len() - at as usize) as u64) as usize;
            let (from, to) = (at as usize, at as usize + k);
            for (start, len, who) in owners {
                let (lo, hi) = (start.max(from), (start + len).min(to));
                if hi > lo {
                    sent_of[who as usize] += (hi - lo) as u64;
                    lens[who as usize] = len as u64;
                }
            }
            wire.extend_from_slice(&bytes[from..to]);
            req.sent(k as u64);
        }
        // The source: a WRITE's header in, its answer out at once.
        loop {
            if skip > 0 {
                let k = skip.min(wire.len());
                wire.drain(..k);
                skip -= k;
                if skip > 0 {
                    break;
                }
            }
            if wire.len() < 48 {
                break;
            }
            let h = orbite::control::frame::FrameHeader::decode(wire[..16].try_into().unwrap()).unwrap();
            let r = DataRequest::decode(wire[16..48].try_into().unwrap()).unwrap();
            wire.drain(..48);
            skip = (h.body_len - 32) as usize;
            let fixed = orbite::control::message::DataResponse { tag: r.tag, status: Status::Ok }.encode();
            let mut a = orbite::control::frame::FrameHeader::encode(MsgKind::WriteResponse, 16).to_vec();
            a.extend_from_slice(&fixed);
            let mut land = |_: u64, _: &[u8]| {};
            req.received(&a, &mut land).expect("an early answer is a valid answer");
            answered += 1;
        }
        for (rec, out) in req.take_done() {
            assert!(out.result.is_ok(), "request {}: {:?}", rec.id, out.result);
            done += 1;
        }
        for (k, h) in holds.iter().enumerate() {
            if Rc::strong_count(h) == 1 {
                assert_eq!(
                    sent_of[k], lens[k],
                    "seed {seed}: WRITE {k}'s memory let go with its payload still to send"
                );
            }
        }
        if done == n {
            break;
        }
    }
    assert_eq!((answered, done), (n, n), "seed {seed}");
}

#[test]
fn writes_answered_early_keep_their_memory_until_their_payload_left() {
    for seed in 1..=200u64 {
        early_answers(seed, NO_MUTATION);
    }
}

/// The past bug: a WRITE answered while its payload was still being sent
/// ended its batch (its memory released) early. The scenario finds it.
#[test]
fn the_simulator_finds_a_write_completed_before_its_payload_left() {
    let bug = requester::Mutations { complete_early_writes: true, ..NO_MUTATION };
    let found = (1..=200u64).any(|seed| std::panic::catch_unwind(|| early_answers(seed, bug)).is_err());
    assert!(found, "no seed caught the early WRITE completion");
}

/// The past bug: a source that paused reading (too many answers waiting)
/// and was not resumed once they left (a lost readable edge) left its
/// honest peer's requests to hang until their deadline. The simulator
/// finds it as requests that do not complete in a fault-free run.
#[test]
fn the_simulator_finds_a_source_that_does_not_resume_after_a_pause() {
    let plan = Plan { resume_after_pause: false, slow_reader: true, ..CLEAN };
    let found = (300..=310u64).any(|seed| {
        std::panic::catch_unwind(|| run(seed, plan))
            .map(|c| c.keys().any(|k| k != "Ok" && k != "NotifyOk") || !c.contains_key("Ok"))
            .unwrap_or(true)
    });
    assert!(found, "no seed caught the lost resume");
}

/// A bug this simulator found: a request queued behind a buffer the socket
/// did not take (the source frozen, or slow) was failed only once the
/// queue reached it, long after its deadline, and never while the socket
/// stayed full. The deadline invariant finds it again with the old
/// behaviour switched back on.
#[test]
fn the_simulator_finds_a_queued_request_outliving_its_deadline() {
    let bug = Plan { mutations: requester::Mutations { keep_queued_past_deadline: true, ..NO_MUTATION }, ..FAULTS };
    let found = (1..=20u64).any(|seed| std::panic::catch_unwind(|| run(seed, bug)).is_err());
    assert!(found, "no seed caught a queued request past its deadline");
}

/// A driver that takes what a connection's end failed only at the
/// connection's next event (the engine's `kill` releasing its lock
/// without `unlock`'s delivery): every request still ends, and in time
/// for its deadline, but not with its connection. The end invariant alone
/// finds it (`cut_with`: none pending once the connection ended).
#[test]
fn the_simulator_finds_a_connections_end_delivered_late() {
    let bug = Plan { deliver_at_end: false, ..FAULTS };
    let found = (1..=20u64).find_map(|seed| std::panic::catch_unwind(|| run(seed, bug)).err());
    let msg = found.expect("no seed caught a late delivery at the end");
    let text = msg.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(text.contains("still pending after its connection ended"), "{text}");
}

/// A WRITE whose deadline passes while its payload is being sent lets its
/// local memory go at once (the rest of its payload then read from memory
/// the application may reuse): the memory invariant alone finds it (the
/// request's outcome, UNKNOWN, allows any bytes at the source).
#[test]
fn the_simulator_finds_a_write_let_go_mid_payload() {
    let bug =
        Plan { mutations: requester::Mutations { release_expired_writes_mid_payload: true, ..NO_MUTATION }, ..FAULTS };
    let found = (1..=40u64).find_map(|seed| std::panic::catch_unwind(|| run(seed, bug)).err());
    let msg = found.expect("no seed caught a WRITE let go mid-payload");
    let text = msg.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(text.contains("its memory was released with"), "{text}");
}
