//! A deterministic simulator of the IPC protocol's source side: the
//! channel cores (`ipc/proto/source.rs`, framing, answers in order, the
//! answer bound, stall bounds) and the export table's core
//! (`ipc/proto/exports.rs`: offers, answers, handles, revalidations,
//! receipts, revocations, lost channels, exited importers), fed by honest
//! requester processes through in-memory pipes with a simulated clock and
//! a seeded scheduler. The scheduler splits and delays bytes, freezes and
//! kills requester processes, cuts channels, opens new ones, makes some
//! grants wait for a producer stream on a worker (answered later, while
//! the channel goes on or ends), expires offers, and races unregistrations
//! (revocations) with all of it. After every step it checks:
//!
//! - every call a requester sent is answered exactly once, in order, with
//!   an answer of its kind, or its channel ended; none is answered with a
//!   protocol error;
//! - handles made minus handles unexported equals the exports whose handle
//!   was made (exposed or retained) plus those still being finished;
//! - every exposed or retained export's handle left the source or still
//!   rides on an answer of a live channel (none is exposed to nobody);
//! - an ended channel keeps no export but retained ones and those whose
//!   handle is still being made;
//! - receipts count at most once per validated subbatch;
//! - an unregistration revokes each export's slot at most once until it is
//!   resumed;
//! - an export whose handle is being made is never released under the
//!   driver that borrows from it;
//! - no export a requester still holds (and sent no close receipt for) is
//!   released: nothing proves its mapping gone;
//! - once the run drains (requesters close what they hold or exit, the
//!   source withdraws its offers and reclaims), the table is empty, every
//!   acknowledgement was sent or dropped, and every handle was unexported;
//! - in runs that end with the source's close (`close_source`: offers
//!   withdrawn, every slot revoked, requesters asked for their imports
//!   back, some of them silent past its deadline), the close ends empty or
//!   at its deadline, and then every export left is a silent requester's:
//!   an honest one gave back everything it holds, and released the grants
//!   whose handle it lost with a channel.
//!
//! The data path (copies through a mapping) is not the protocol's and is
//! not simulated here. The requester's side is a model of an honest
//! requester (what it asks, when, on which channel), but its opening
//! exchanges are the engine's requester core (`ipc/proto/requester.rs`,
//! `Opening`): it builds each export request, checks each offer (and gives
//! the accept or decline that answers it) and checks each handle, so that
//! one more invariant holds:
//!
//! - the engine's requester core accepts every offer and handle an honest
//!   source sends (the source and the requester agree on what an honest
//!   grant is).
//!
//! CI runs a fixed set of seeds; a failure prints the seed and the command
//! that replays it. `scripts/sim.sh ipc A-B` runs many more. Bugs switched
//! back on (`exports::Mutations`) must be found: a lost channel releasing a
//! grant whose handle is being made and a handle dropped unsent leaving its
//! export exposed to nobody (the grant completed after its channel ended),
//! a lost channel's offers kept (the grant that waited on a closed
//! channel), an unregistration revoking every slot again (the revoke
//! flood), a reclaim of a live importer's exports (a timeout taken for
//! proof), and operation receipts counted with no validated subbatch due
//! (found by the receipts invariant alone). Found by the simulator, not
//! by a review: a requester that
//! lost a handle with its channel held the source's close up (the switch
//! `Plan::release_lost_grants`; the engine now releases such grants at its
//! next flush).

mod common;

use common::{seeds, Rng};
use orbite::control::frame::{FrameHeader, MsgKind, FRAME_HEADER_LEN};
use orbite::control::identity::{Identity, ProcessIdentity};
use orbite::error::{Error, Status};
use orbite::transport::ipc::messages::{
    decode_reject, encode_reject, ExportOffer, ExportRef, ExportRequest, Revalidate, OFFERS_MAX, OP_READ, OP_WRITE,
};
use orbite::transport::ipc::proto::exports::{self, Answering, ExportState, ExportsCore, Finished, Grant};
use orbite::transport::ipc::proto::requester::{Offered, Opening};
use orbite::transport::ipc::proto::source::{Answer, AnswerHost, IpcSourceCore, Reply, ANSWERS_MAX};
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::rc::Rc;
use std::time::{Duration, Instant};

const ALLOCS: u64 = 4;
const ALLOC_LEN: u64 = 1 << 20;
const EPOCH: u64 = 1;
/// Offers unanswered this long expire.
const OFFER_TIMEOUT: Duration = Duration::from_secs(5);
/// The channel cores' stall bound.
const STALL: Duration = Duration::from_secs(10);
/// How long the source's close waits for its exports to come back.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(30);

fn base(alloc: u64) -> u64 {
    0x1000_0000 * (alloc + 1)
}

/// Allocations 1 and 3 have a producer stream to wait for: their grants
/// are answered by a worker.
fn waits(alloc: u64) -> bool {
    alloc % 2 == 1
}

/// What an export holds in the simulation (nothing: the counters of
/// handles made and unexported stand for its resources).
struct Held;

type Table = Rc<RefCell<ExportsCore<Held>>>;

/// An acknowledgement being sent (the engine's `AckGuard`).
struct AckTok(Table);

impl AckTok {
    fn new(t: &Table) -> AckTok {
        t.borrow_mut().ack_begin();
        AckTok(t.clone())
    }
}

impl Drop for AckTok {
    fn drop(&mut self) {
        self.0.borrow_mut().ack_end();
    }
}

/// A handle riding on an answer not sent yet.
struct HandleTok {
    id: u64,
    carried: Rc<RefCell<BTreeMap<u64, usize>>>,
}

impl Drop for HandleTok {
    fn drop(&mut self) {
        let mut c = self.carried.borrow_mut();
        let n = c.get_mut(&self.id).expect("carried");
        *n -= 1;
        if *n == 0 {
            c.remove(&self.id);
        }
    }
}

/// What rides with an answer.
#[derive(Default)]
struct Extra {
    _ack: Option<AckTok>,
    handle: Option<HandleTok>,
    /// The export whose handle it carries (the driver's `Attached::export`).
    export: Option<ExportRef>,
}

fn plain(kind: MsgKind, body: &[u8]) -> Answer<Extra> {
    Answer::new(kind, body, Extra::default())
}

fn reject(tag: u64, e: &Error) -> Answer<Extra> {
    plain(MsgKind::ExportReject, &encode_reject(tag, e.status(), e.message()))
}

/// The source's shared state: the table, workers, counters.
struct Source {
    table: Table,
    /// Handles riding on answers not yet sent (export id → how many).
    carried: Rc<RefCell<BTreeMap<u64, usize>>>,
    /// Exports whose handle left the source.
    handles_sent: BTreeSet<u64>,
    made: Cell<u64>,
    unexported: Cell<u64>,
    /// Grants waiting for a producer stream, answered by a worker.
    workers: Vec<Worker>,
    /// Subbatches validated per export, and receipts counted.
    validated: BTreeMap<u64, u64>,
    counted: BTreeMap<u64, u64>,
    /// Slots revoked and not resumed.
    revoked: BTreeSet<u64>,
    /// Regions being unregistered.
    suspended_regions: BTreeSet<u64>,
    next_token: u64,
    /// The next handle made fails (the backend refuses).
    fail_next_make: bool,
    /// Events worth counting: grants whose channel ended while their
    /// handle was made, handles ended unsent, offers expired, exports
    /// reclaimed after their importer exited.
    abandoned: u64,
    unsent: u64,
    expired: u64,
    reclaimed: u64,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    /// Waiting for the producer stream.
    Waiting,
    /// The handle was made (or not): the answer is still to be finished.
    Made(bool),
}

struct Worker {
    conn: u64,
    ticket: u64,
    r: ExportRef,
    phase: Phase,
    base: u64,
    _ack: Option<AckTok>,
}

/// The core's view of one channel's answers.
struct Host<'a> {
    src: &'a mut Source,
    conn: u64,
    requester: Identity,
}

impl Source {
    fn make(&mut self) -> bool {
        let ok = !std::mem::take(&mut self.fail_next_make);
        if ok {
            self.made.set(self.made.get() + 1);
        }
        ok
    }

    /// The answer to a finished grant (the driver's `export_answer`).
    fn finish(&mut self, conn: u64, r: &ExportRef, made: bool, base_addr: u64) -> Answer<Extra> {
        let fin = self.table.borrow_mut().finish_answer(conn, r, made);
        match fin {
            Finished::Exposed => {
                *self.carried.borrow_mut().entry(r.export_id).or_insert(0) += 1;
                let mut a = plain(MsgKind::ExportHandle, &ExportRef { value: 0, extra: 0, ..*r }.encode());
                a.extra.handle = Some(HandleTok { id: r.export_id, carried: self.carried.clone() });
                a.extra.export = Some(*r);
                a
            }
            ended => {
                if let Finished::Ended(g) = ended {
                    assert!(!g.exported, "a grant that ended unexposed says it was exported");
                }
                if made {
                    assert!(base_addr != 0);
                    self.abandoned += 1;
                    self.unexported.set(self.unexported.get() + 1);
                }
                let e = if made {
                    Error::Unavailable("the channel ended while it was granted".into())
                } else {
                    Error::Unavailable("the backend could not make the handle".into())
                };
                reject(r.export_id, &e)
            }
        }
    }

    /// An answer dropped before its first byte left (the driver's
    /// `not_sent`).
    fn not_sent(&mut self, conn: u64, a: &Answer<Extra>) {
        if let Some(r) = &a.extra.export {
            let gone = self.table.borrow_mut().handle_not_sent(conn, r);
            self.unsent += gone.is_some() as u64;
            self.settle(gone.into_iter().collect());
        }
    }

    fn settle(&mut self, gone: Vec<exports::Released<Held>>) {
        for g in gone {
            if g.exported {
                self.unexported.set(self.unexported.get() + 1);
            }
        }
    }
}

impl AnswerHost<Extra> for Host<'_> {
    fn answer(&mut self, kind: MsgKind, body: &[u8], ticket: u64) -> orbite::error::Result<Reply<Extra>> {
        let (conn, src) = (self.conn, &mut *self.src);
        Ok(Reply::Now(match kind {
            MsgKind::ExportRequest => {
                let req = ExportRequest::decode(body)?;
                let alloc = (req.addr / 0x1000_0000).saturating_sub(1);
                if src.table.borrow().unanswered(conn) >= OFFERS_MAX {
                    return Ok(Reply::Now(reject(req.tag, &Error::ResourceExhausted("offers".into()))));
                }
                if alloc >= ALLOCS || req.addr + req.len > base(alloc) + ALLOC_LEN || req.region_epoch != EPOCH {
                    return Ok(Reply::Now(reject(req.tag, &Error::OutOfRange("outside".into()))));
                }
                if src.suspended_regions.contains(&alloc) {
                    return Ok(Reply::Now(reject(req.tag, &Error::Unavailable("being unregistered".into()))));
                }
                src.next_token += 1;
                let token = src.next_token.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                let grant = Grant {
                    conn,
                    requester: Some(self.requester),
                    token,
                    base: base(alloc),
                    logical: ALLOC_LEN,
                    physical: ALLOC_LEN,
                    region: alloc,
                    region_epoch: EPOCH,
                    ops: req.ops,
                    len: req.len,
                    has_slot: true,
                };
                let id = src.table.borrow_mut().offer(grant, now(), Held);
                src.validated.insert(id, 1);
                let offer = ExportOffer {
                    tag: req.tag,
                    export_id: id,
                    token,
                    base: base(alloc),
                    physical: ALLOC_LEN,
                    grant_addr: req.addr,
                    grant_len: req.len,
                    region_epoch: EPOCH,
                    ops: req.ops,
                    slot: 0,
                    slot_generation: 1,
                };
                plain(MsgKind::ExportOffer, &offer.encode())
            }
            MsgKind::ExportAnswer => {
                let r = ExportRef::decode(body, "ExportAnswer")?;
                let ack = AckTok::new(&src.table);
                let base_addr = src.table.borrow().offered_base(conn, &r);
                if r.value != 0 && base_addr.is_some_and(|b| waits(b / 0x1000_0000 - 1)) {
                    let base = base_addr.unwrap_or(0);
                    src.workers.push(Worker { conn, ticket, r, phase: Phase::Waiting, base, _ack: Some(ack) });
                    return Ok(Reply::Later);
                }
                let begun = src.table.borrow_mut().begin_answer(conn, &r);
                let mut a = match begun {
                    Err(e) => reject(r.export_id, &e),
                    Ok(Answering::Declined(g)) => {
                        src.settle(vec![g]);
                        plain(MsgKind::Ack, &ExportRef { value: 0, extra: MsgKind::ExportAnswer as u32, ..r }.encode())
                    }
                    Ok(Answering::Expose { base, .. }) => {
                        let made = src.make();
                        src.finish(conn, &r, made, base)
                    }
                };
                a.extra._ack = Some(ack);
                a
            }
            MsgKind::Revalidate => {
                let v = Revalidate::decode(body)?;
                let checked = src.table.borrow_mut().check_revalidate(conn, &v);
                let checked = checked.and_then(|()| match src.suspended_regions.contains(&((v.addr >> 28) - 1)) {
                    true => Err(Error::Unavailable("being unregistered".into())),
                    false => Ok(()),
                });
                match checked.and_then(|()| src.table.borrow_mut().revalidated(conn, &v).map(|h| h.is_some())) {
                    Ok(published) => {
                        *src.validated.entry(v.export_id).or_insert(0) += 1;
                        let mut b = v.tag.to_le_bytes().to_vec();
                        b.extend_from_slice(&(published as u64).to_le_bytes());
                        plain(MsgKind::RevalidateOk, &b)
                    }
                    Err(e) => reject(v.tag, &e),
                }
            }
            MsgKind::OpComplete | MsgKind::CloseReceipt => {
                let r = ExportRef::decode(body, "receipt")?;
                let ack = AckTok::new(&src.table);
                let res = if kind == MsgKind::OpComplete {
                    let counted = src.table.borrow_mut().op_complete(conn, &r);
                    counted.map(|c| {
                        if c {
                            *src.counted.entry(r.export_id).or_insert(0) += 1;
                        }
                    })
                } else {
                    let gone = src.table.borrow_mut().close_receipt(conn, Some(self.requester), &r, |_| false);
                    gone.map(|g| src.settle(g.into_iter().collect()))
                };
                let mut a = match res {
                    Ok(()) => plain(MsgKind::Ack, &ExportRef { value: 0, extra: kind as u32, ..r }.encode()),
                    Err(e) => reject(r.export_id, &e),
                };
                a.extra._ack = Some(ack);
                a
            }
            other => return Err(Error::Protocol(format!("unexpected {other:?}"))),
        }))
    }
}

thread_local! {
    static T0: Instant = Instant::now();
    static NOW: Cell<Duration> = const { Cell::new(Duration::ZERO) };
}

fn now() -> Instant {
    T0.with(|t| *t) + NOW.with(|n| n.get())
}

/// A call a requester sent and waits to have answered. An export request
/// and the answer to its offer carry the engine's `Opening` of that
/// exchange.
#[derive(Debug, Clone, Copy)]
enum Call {
    Request {
        tag: u64,
        alloc: u64,
        ops: u32,
        opening: Opening,
    },
    Answer {
        id: u64,
        accept: bool,
        alloc: u64,
        ops: u32,
        opening: Opening,
    },
    Revalidate {
        tag: u64,
        id: u64,
    },
    OpComplete {
        id: u64,
    },
    Close {
        id: u64,
    },
    /// The release of a grant accepted whose handle was lost with its
    /// channel (a close receipt for what was never mapped).
    Release {
        id: u64,
    },
}

/// An import a requester holds (it got the handle).
#[derive(Debug, Clone, Copy)]
struct Import {
    token: u64,
    alloc: u64,
    ops: u32,
    /// The channel it was granted on (receipts other than the close go
    /// there only).
    conn: u64,
}

/// One channel, both ends.
struct Chan {
    conn: u64,
    pid: u32,
    core: IpcSourceCore<Extra>,
    /// Requester → source bytes not yet read by the source.
    r2s: VecDeque<u8>,
    /// Source → requester bytes not yet read by the requester.
    s2r: VecDeque<u8>,
    /// Calls sent and not answered yet, in order.
    calls: VecDeque<Call>,
    /// Bytes of an answer being gathered by the requester.
    rx: Vec<u8>,
    ended: bool,
}

struct Proc {
    ident: Identity,
    frozen_until: Duration,
    imports: BTreeMap<u64, Import>,
    /// Imports whose close receipt was sent and not answered (its export
    /// may be gone already).
    closing: BTreeSet<u64>,
    /// Grants accepted whose handle was lost with their channel: the
    /// release each is owed (the engine's `LostGrant`).
    lost: BTreeMap<u64, ExportRef>,
    next_tag: u64,
}

#[derive(Clone, Copy)]
struct Plan {
    steps: usize,
    faults: bool,
    /// The source closes after the steps, before the drain.
    close_source: bool,
    /// Requesters release grants whose handle was lost with their channel
    /// when asked for their imports back (the engine's flush does, since
    /// the simulator found the close held up without it).
    release_lost_grants: bool,
    mutations: exports::Mutations,
}

/// How a source's close ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CloseEnd {
    /// Every export came back.
    Closed,
    /// The deadline passed with exports left (`Unquiesced`).
    Unquiesced,
}

struct Sim {
    rng: Rng,
    plan: Plan,
    src: Source,
    chans: Vec<Chan>,
    procs: Vec<Proc>,
    next_conn: u64,
    calls_sent: u64,
    calls_answered: u64,
    calls_failed: u64,
    draining: bool,
    /// The source is closing: regions stay suspended, and every requester
    /// was asked to give its imports back (`Revoke`).
    source_closing: bool,
    /// Processes that exited (pid, start time).
    dead: BTreeSet<(u32, u64)>,
    trace: Vec<String>,
}

type Check = Result<(), String>;

impl Sim {
    fn new(seed: u64, plan: Plan) -> Sim {
        NOW.with(|n| n.set(Duration::ZERO));
        let mut core = ExportsCore::new(OFFER_TIMEOUT);
        core.mutations = plan.mutations;
        let table = Rc::new(RefCell::new(core));
        let procs = (0..3u32)
            .map(|i| Proc {
                ident: Identity {
                    boot_id: [1; 16],
                    process: ProcessIdentity { pid: 100 + i, start_time: 7 },
                    engine_epoch: 1 + i as u64,
                },
                frozen_until: Duration::ZERO,
                imports: BTreeMap::new(),
                closing: BTreeSet::new(),
                lost: BTreeMap::new(),
                next_tag: 1,
            })
            .collect();
        Sim {
            rng: Rng(seed),
            plan,
            src: Source {
                table,
                carried: Rc::new(RefCell::new(BTreeMap::new())),
                handles_sent: BTreeSet::new(),
                made: Cell::new(0),
                unexported: Cell::new(0),
                workers: Vec::new(),
                validated: BTreeMap::new(),
                counted: BTreeMap::new(),
                revoked: BTreeSet::new(),
                suspended_regions: BTreeSet::new(),
                next_token: seed,
                fail_next_make: false,
                abandoned: 0,
                unsent: 0,
                expired: 0,
                reclaimed: 0,
            },
            chans: Vec::new(),
            procs,
            next_conn: 1,
            calls_sent: 0,
            calls_answered: 0,
            calls_failed: 0,
            draining: false,
            source_closing: false,
            dead: BTreeSet::new(),
            trace: Vec::new(),
        }
    }

    fn exited(&self) -> impl Fn(&ProcessIdentity) -> bool + '_ {
        move |p| self.dead.contains(&(p.pid, p.start_time))
    }

    fn live_chan(&self, pid: u32) -> Option<usize> {
        self.chans.iter().position(|c| c.pid == pid && !c.ended)
    }

    /// A requester sends `call` on channel `i`.
    fn send(&mut self, i: usize, call: Call) {
        let p = (self.chans[i].pid - 100) as usize;
        let (kind, body) = match call {
            Call::Request { opening, .. } => (MsgKind::ExportRequest, opening.request().encode()),
            Call::Answer { accept, opening, .. } => (MsgKind::ExportAnswer, opening.answer(accept).encode()),
            Call::Revalidate { tag, id } => {
                let imp = self.procs[p].imports[&id];
                let v = Revalidate {
                    tag,
                    export_id: id,
                    token: imp.token,
                    region_epoch: EPOCH,
                    addr: base(imp.alloc),
                    len: 8192,
                    ops: imp.ops,
                };
                (MsgKind::Revalidate, v.encode())
            }
            Call::OpComplete { id } => {
                let imp = self.procs[p].imports[&id];
                (MsgKind::OpComplete, ExportRef { export_id: id, token: imp.token, value: 2 * 16, extra: 2 }.encode())
            }
            Call::Release { id } => (MsgKind::CloseReceipt, self.procs[p].lost[&id].encode()),
            Call::Close { id } => {
                let imp = self.procs[p].imports[&id];
                self.procs[p].closing.insert(id);
                (MsgKind::CloseReceipt, ExportRef { export_id: id, token: imp.token, value: 0, extra: 0 }.encode())
            }
        };
        let c = &mut self.chans[i];
        c.r2s.extend(FrameHeader::encode(kind, body.len() as u32));
        c.r2s.extend(body);
        c.calls.push_back(call);
        self.calls_sent += 1;
        self.trace.push(format!("conn {} sends {call:?}", c.conn));
    }

    /// Ends channel `i` on both sides (the socket is gone).
    fn cut(&mut self, i: usize, why: &str) {
        let c = &mut self.chans[i];
        if c.ended {
            return;
        }
        c.ended = true;
        let mid = c.core.mid_answer();
        let dropped = c.core.end();
        let p = (c.pid - 100) as usize;
        for call in &c.calls {
            if let Call::Answer { id, accept: true, opening, .. } = call {
                self.procs[p].lost.insert(*id, opening.answer(false));
            }
        }
        let failed = c.calls.len() as u64;
        c.calls.clear();
        c.r2s.clear();
        c.s2r.clear();
        self.calls_failed += failed;
        let conn = c.conn;
        for a in dropped.iter().skip(mid as usize) {
            self.src.not_sent(conn, a);
        }
        drop(dropped);
        let lost = self.src.table.borrow_mut().connection_lost(conn, self.exited(), |_| true);
        self.src.settle(lost.released);
        self.trace.push(format!("conn {conn} cut: {why}"));
    }

    /// The source reads what channel `i` holds, in a random split.
    fn source_reads(&mut self, i: usize) -> Check {
        let c = &mut self.chans[i];
        if c.ended || c.r2s.is_empty() || !c.core.wants_bytes() {
            return Ok(());
        }
        let n = 1 + self.rng.below(c.r2s.len() as u64) as usize;
        let bytes: Vec<u8> = c.r2s.drain(..n).collect();
        let mut host = Host { src: &mut self.src, conn: c.conn, requester: self.procs[(c.pid - 100) as usize].ident };
        let r = c.core.receive(&bytes, now(), &mut host);
        self.after_core(i, r)
    }

    fn after_core(&mut self, i: usize, r: orbite::error::Result<()>) -> Check {
        if let Err(e) = r {
            if e.status() == Status::ProtocolError {
                return Err(format!("an honest requester's channel ended with a protocol error: {e}"));
            }
            self.cut(i, &e.to_string());
        }
        Ok(())
    }

    /// The source sends what it can of channel `i`'s answers.
    fn source_sends(&mut self, i: usize) -> Check {
        let budget = 1 + self.rng.below(4096) as usize;
        let c = &mut self.chans[i];
        let mut left = budget;
        while left > 0 && !c.ended {
            let Some((bytes, first, x)) = c.core.to_send() else { break };
            // The descriptor rides on the first byte: from here the
            // requester may hold the export.
            if let (true, Some(h)) = (first, &x.handle) {
                self.src.handles_sent.insert(h.id);
            }
            let n = bytes.len().min(left);
            c.s2r.extend(&bytes[..n]);
            left -= n;
            drop(c.core.sent(n, now()));
        }
        // The core may have paused reading at its bound: handle again.
        if !c.ended {
            let mut host =
                Host { src: &mut self.src, conn: c.conn, requester: self.procs[(c.pid - 100) as usize].ident };
            let r = c.core.handle(now(), &mut host);
            return self.after_core(i, r);
        }
        Ok(())
    }

    /// The requester of channel `i` reads its answers.
    fn requester_reads(&mut self, i: usize) -> Check {
        let c = &mut self.chans[i];
        if c.ended || c.s2r.is_empty() {
            return Ok(());
        }
        let n = 1 + self.rng.below(c.s2r.len() as u64) as usize;
        c.rx.extend(c.s2r.drain(..n));
        loop {
            let c = &mut self.chans[i];
            if c.rx.len() < FRAME_HEADER_LEN {
                return Ok(());
            }
            let h = FrameHeader::decode(c.rx[..FRAME_HEADER_LEN].try_into().unwrap()).map_err(|e| e.to_string())?;
            let end = FRAME_HEADER_LEN + h.body_len as usize;
            if c.rx.len() < end {
                return Ok(());
            }
            let body: Vec<u8> = c.rx[FRAME_HEADER_LEN..end].to_vec();
            c.rx.drain(..end);
            let Some(call) = c.calls.pop_front() else {
                return Err(format!("conn {}: an answer {:?} with no call waiting", c.conn, h.kind));
            };
            self.calls_answered += 1;
            self.answered(i, call, h.kind, &body)?;
        }
    }

    /// Checks that `kind`/`body` answers `call`, and acts on it.
    fn answered(&mut self, i: usize, call: Call, kind: MsgKind, body: &[u8]) -> Check {
        let (conn, pid) = (self.chans[i].conn, self.chans[i].pid);
        let p = (pid - 100) as usize;
        let u64_at = |at: usize| u64::from_le_bytes(body[at..at + 8].try_into().unwrap());
        if kind == MsgKind::ExportReject {
            let (tag, e) = decode_reject(body).map_err(|e| e.to_string())?;
            let want = match call {
                Call::Request { tag, .. } | Call::Revalidate { tag, .. } => tag,
                Call::Answer { id, .. } | Call::OpComplete { id } | Call::Close { id } | Call::Release { id } => id,
            };
            if tag != want || e.status() == Status::ProtocolError {
                return Err(format!("conn {conn}: {call:?} answered by a reject of {tag}: {e}"));
            }
            // A close refused (its export was reclaimed): nothing to hold.
            if let Call::Close { id } = call {
                self.procs[p].imports.remove(&id);
                self.procs[p].closing.remove(&id);
            }
            // A release refused: the source no longer knows the grant
            // (never exposed, ended, reclaimed), or is still answering it
            // on the lost channel (tried again later).
            if let Call::Release { id } = call {
                if e.status() != Status::Unavailable {
                    self.procs[p].lost.remove(&id);
                }
            }
            return Ok(());
        }
        match (call, kind) {
            (Call::Request { alloc, ops, mut opening, .. }, MsgKind::ExportOffer) => {
                let refused =
                    |e: Error| format!("conn {conn}: the engine's requester core refused an honest offer: {e}");
                let o = match opening.offered(kind, body, "sim source").map_err(refused)? {
                    Offered::Checked(o) => o,
                    Offered::Declined { error, .. } => return Err(refused(error)),
                };
                if o.base != base(alloc) {
                    return Err(format!("conn {conn}: offer {o:?} answers {call:?}"));
                }
                // The core's accept or decline (15%) answers it; the answer
                // may come late (after the offer expired).
                let accept = !self.rng.chance(15);
                self.send(i, Call::Answer { id: o.export_id, accept, alloc, ops, opening });
            }
            (Call::Answer { id, accept: true, alloc, ops, opening }, MsgKind::ExportHandle) => {
                if let Err(e) = opening.handle(kind, body) {
                    return Err(format!(
                        "conn {conn}: the engine's requester core refused the handle for {call:?}: {e}"
                    ));
                }
                let token = opening.answer(true).token;
                self.procs[p].imports.insert(id, Import { token, alloc, ops, conn });
            }
            (Call::Answer { id, accept: false, .. }, MsgKind::Ack)
            | (Call::OpComplete { id }, MsgKind::Ack)
            | (Call::Close { id }, MsgKind::Ack)
            | (Call::Release { id }, MsgKind::Ack) => {
                if u64_at(0) != id {
                    return Err(format!("conn {conn}: ack of {} answers {call:?}", u64_at(0)));
                }
                if let Call::Release { id } = call {
                    self.procs[p].lost.remove(&id);
                }
                if let Call::Close { id } = call {
                    self.procs[p].imports.remove(&id);
                    self.procs[p].closing.remove(&id);
                }
            }
            (Call::Revalidate { tag, .. }, MsgKind::RevalidateOk) => {
                if u64_at(0) != tag {
                    return Err(format!("conn {conn}: revalidation {} answers {call:?}", u64_at(0)));
                }
            }
            _ => return Err(format!("conn {conn}: {call:?} answered by {kind:?}")),
        }
        Ok(())
    }

    /// Advances one worker (a grant waiting for its producer stream).
    fn work(&mut self, w: usize) -> Check {
        let wk = &self.src.workers[w];
        let (conn, r, phase) = (wk.conn, wk.r, wk.phase);
        match phase {
            Phase::Waiting => {
                let offered = self.src.table.borrow().offered_base(conn, &r);
                if offered.is_none() {
                    // Expired or its channel ended: refused.
                    let wk = self.src.workers.remove(w);
                    let mut a = reject(r.export_id, &Error::NotFound("no such offer".into()));
                    a.extra._ack = wk._ack;
                    self.fill(conn, wk.ticket, a);
                    return Ok(());
                }
                let begun = self.src.table.borrow_mut().begin_answer(conn, &r);
                match begun {
                    Ok(Answering::Expose { .. }) => {
                        let made = self.src.make();
                        self.src.workers[w].phase = Phase::Made(made);
                    }
                    other => panic!("an offered export began as {:?}", other.is_ok()),
                }
            }
            Phase::Made(made) => {
                let state = self.src.table.borrow().state(r.export_id);
                if !matches!(state, Some(ExportState::Exposing | ExportState::Abandoned)) {
                    return Err(format!(
                        "export {} was released ({state:?}) while its handle was being made: what the driver \
                         borrowed to make it went with it",
                        r.export_id
                    ));
                }
                let wk = self.src.workers.remove(w);
                let mut a = self.src.finish(conn, &r, made, wk.base);
                a.extra._ack = wk._ack;
                self.fill(conn, wk.ticket, a);
            }
        }
        Ok(())
    }

    fn fill(&mut self, conn: u64, ticket: u64, a: Answer<Extra>) {
        let c = self.chans.iter_mut().find(|c| c.conn == conn).expect("a channel");
        let refused = c.core.fill(ticket, a, now()).err();
        if let Some(a) = &refused {
            self.src.not_sent(conn, a);
        }
        drop(refused);
        self.trace.push(format!("conn {conn}: ticket {ticket} filled"));
    }

    /// One scheduler step.
    fn step(&mut self) -> Check {
        let pick = self.rng.below(100);
        let np = self.procs.len() as u64;
        let p = self.rng.below(np) as usize;
        let pid = 100 + p as u32;
        let t = NOW.with(|n| n.get());
        let frozen = self.procs[p].frozen_until > t;
        match pick {
            0..=4 if !frozen && self.live_chan(pid).is_none() => {
                let conn = self.next_conn;
                self.next_conn += 1;
                self.chans.push(Chan {
                    conn,
                    pid,
                    core: IpcSourceCore::new(STALL),
                    r2s: VecDeque::new(),
                    s2r: VecDeque::new(),
                    calls: VecDeque::new(),
                    rx: Vec::new(),
                    ended: false,
                });
                self.trace.push(format!("pid {pid} opens conn {conn}"));
            }
            5..=24 if !frozen && !self.draining => self.new_call(p, pid),
            25..=29 if !frozen => self.close_one(p, pid),
            30..=44 => {
                if let Some(i) = self.pick_chan() {
                    self.source_reads(i)?;
                }
            }
            45..=59 => {
                if let Some(i) = self.pick_chan() {
                    self.source_sends(i)?;
                }
            }
            60..=74 if !frozen => {
                if let Some(i) = self.live_chan(pid) {
                    self.requester_reads(i)?;
                }
            }
            75..=82 if !self.src.workers.is_empty() => {
                let w = self.rng.below(self.src.workers.len() as u64) as usize;
                self.work(w)?;
            }
            83..=86 => self.advance(),
            87..=89 if self.plan.faults && !self.draining && self.rng.chance(8) => {
                if let Some(i) = self.pick_chan() {
                    self.cut(i, "fault");
                }
            }
            90 if self.plan.faults && !self.draining && self.rng.chance(25) => {
                // The process dies; a new one takes its pid (another start
                // time, another engine).
                let old = self.procs[p].ident;
                self.dead.insert((pid, old.process.start_time));
                self.procs[p].imports.clear();
                self.procs[p].closing.clear();
                for i in 0..self.chans.len() {
                    if self.chans[i].pid == pid {
                        self.cut(i, "its process died");
                    }
                }
                self.procs[p].lost.clear();
                self.procs[p].ident.process.start_time += 1;
                self.procs[p].ident.engine_epoch += 100;
                self.trace.push(format!("pid {pid} died and was started again"));
            }
            91 if self.plan.faults && !self.draining && self.rng.chance(30) => {
                self.procs[p].frozen_until = t + Duration::from_secs(1 + self.rng.below(15));
                self.trace.push(format!("pid {pid} freezes"));
            }
            92..=93 => {
                let gone = self.src.table.borrow_mut().reclaim_exited(self.exited(), |_| true);
                self.src.reclaimed += gone.len() as u64;
                self.src.settle(gone);
                self.check_reclaimed()?;
            }
            94..=96 if self.plan.faults && !self.source_closing => self.unregister(),
            97 if self.plan.faults => self.src.fail_next_make = true,
            _ => {}
        }
        Ok(())
    }

    fn pick_chan(&mut self) -> Option<usize> {
        let live: Vec<usize> = (0..self.chans.len()).filter(|i| !self.chans[*i].ended).collect();
        (!live.is_empty()).then(|| live[self.rng.below(live.len() as u64) as usize])
    }

    /// A new call on process `p`'s live channel: an export request, or a
    /// revalidation or receipt for one of its imports.
    fn new_call(&mut self, p: usize, pid: u32) {
        let Some(i) = self.live_chan(pid) else { return };
        let conn = self.chans[i].conn;
        let unanswered = self.chans[i].calls.iter().filter(|c| matches!(c, Call::Request { .. })).count();
        let mine: Vec<u64> = self.procs[p].imports.iter().filter(|(_, m)| m.conn == conn).map(|(k, _)| *k).collect();
        let tag = self.procs[p].next_tag;
        self.procs[p].next_tag += 1;
        // An honest requester keeps its offers within its offer places
        // (requests in flight plus offers it has not answered).
        let offers_open = unanswered + self.chans[i].calls.iter().filter(|c| matches!(c, Call::Answer { .. })).count();
        if mine.is_empty() || self.rng.chance(50) {
            if offers_open < OFFERS_MAX {
                let alloc = self.rng.below(ALLOCS);
                let ops = [OP_READ, OP_WRITE, OP_READ | OP_WRITE][self.rng.below(3) as usize];
                // The same envelope as ever: 4 to 16 KiB at one of the
                // first eight pages of the allocation.
                let env = (base(alloc) + 4096 * (tag % 8), 4096 * (1 + (tag % 4)));
                let opening = Opening::new(tag, EPOCH, env, ops, 0);
                self.send(i, Call::Request { tag, alloc, ops, opening });
            }
            return;
        }
        let id = mine[self.rng.below(mine.len() as u64) as usize];
        if self.chans[i].calls.iter().any(|c| matches!(c, Call::Close { id: x } if *x == id)) {
            return;
        }
        if self.rng.chance(50) {
            self.send(i, Call::Revalidate { tag, id });
        } else {
            self.send(i, Call::OpComplete { id });
        }
    }

    /// The export ids of process `pid`'s calls in flight on its live
    /// channels that `pick` names.
    fn in_flight(&self, pid: u32, pick: impl Fn(&Call) -> Option<u64>) -> BTreeSet<u64> {
        self.chans.iter().filter(|c| c.pid == pid && !c.ended).flat_map(|c| c.calls.iter()).filter_map(pick).collect()
    }

    /// Process `p` closes one import, on whatever live channel it has.
    fn close_one(&mut self, p: usize, pid: u32) {
        let Some(i) = self.live_chan(pid) else { return };
        let closing = self.in_flight(pid, |c| if let Call::Close { id } = c { Some(*id) } else { None });
        let ids: Vec<u64> = self.procs[p].imports.keys().copied().filter(|id| !closing.contains(id)).collect();
        // Asked for its imports back (`Revoke`), a requester gives them
        // all back at once (the engine's flush), with the grants whose
        // handle it lost.
        if self.source_closing && self.plan.release_lost_grants {
            let releasing = self.in_flight(pid, |c| if let Call::Release { id } = c { Some(*id) } else { None });
            let owed: Vec<u64> = self.procs[p].lost.keys().copied().filter(|id| !releasing.contains(id)).collect();
            for id in owed {
                self.send(i, Call::Release { id });
            }
        }
        if ids.is_empty() {
            return;
        }
        if self.source_closing {
            for id in ids {
                self.send(i, Call::Close { id });
            }
            return;
        }
        let id = ids[self.rng.below(ids.len() as u64) as usize];
        self.send(i, Call::Close { id });
    }

    /// Time passes; every live channel's bounds and offers are checked.
    fn advance(&mut self) {
        // While the source closes, time passes slowly enough for every
        // honest requester to have many turns before the deadline (a
        // close that times out then has a silent requester to blame, not
        // the scheduler).
        let most = if self.plan.faults && !self.source_closing { 2500 } else { 200 };
        let d = Duration::from_millis(self.rng.below(most));
        NOW.with(|n| n.set(n.get() + d));
        for i in 0..self.chans.len() {
            if self.chans[i].ended {
                continue;
            }
            if let Err(e) = self.chans[i].core.check(now()) {
                self.cut(i, &e.to_string());
                continue;
            }
            let conn = self.chans[i].conn;
            let gone = self.src.table.borrow_mut().expire_offers(conn, now());
            self.src.expired += gone.len() as u64;
            self.src.settle(gone);
        }
    }

    /// A region is unregistered (its slots revoked) or, if one is, it is
    /// resumed.
    fn unregister(&mut self) {
        let region = self.rng.below(ALLOCS);
        // An unregistration that timed out resumes; another one of the
        // same region may come while it is revoked.
        if self.rng.chance(70) && self.src.suspended_regions.remove(&region) {
            for id in self.src.table.borrow_mut().resume(region) {
                self.src.revoked.remove(&id);
            }
            return;
        }
        self.src.suspended_regions.insert(region);
        for id in self.src.table.borrow_mut().suspend(Some(region)) {
            if !self.src.revoked.insert(id) {
                self.trace.push(format!("export {id} revoked twice"));
                self.src.revoked.insert(u64::MAX);
            }
        }
    }

    fn check_reclaimed(&self) -> Check {
        let dead = self.exited();
        for (id, _, state, who) in self.src.table.borrow().list() {
            if state == ExportState::Retained && who.as_ref().is_some_and(&dead) {
                return Err(format!("export {id} of an exited importer survived a reclaim"));
            }
        }
        Ok(())
    }

    /// The invariants that hold after every step.
    fn check(&self) -> Check {
        if self.src.revoked.contains(&u64::MAX) {
            return Err("an unregistration revoked a slot it had already revoked".into());
        }
        let t = self.src.table.borrow();
        let list = t.list();
        let exported = list.iter().filter(|e| matches!(e.2, ExportState::Exposed | ExportState::Retained)).count();
        let finishing = self.src.workers.iter().filter(|w| w.phase == Phase::Made(true)).count();
        let live = self.src.made.get() - self.src.unexported.get();
        if live != (exported + finishing) as u64 {
            return Err(format!(
                "{} handles made, {} unexported: {live} live, but {exported} exports hold one and {finishing} are being \
                 finished",
                self.src.made.get(),
                self.src.unexported.get()
            ));
        }
        let carried = self.src.carried.borrow();
        for (id, conn, state, _) in &list {
            let ended = self.chans.iter().any(|c| c.conn == *conn && c.ended);
            if matches!(state, ExportState::Exposed | ExportState::Retained)
                && !self.src.handles_sent.contains(id)
                && !carried.contains_key(id)
            {
                return Err(format!("export {id} ({state:?}) was exposed to nobody: its handle never left"));
            }
            let made = self.src.workers.iter().any(|w| w.r.export_id == *id && matches!(w.phase, Phase::Made(_)));
            let allowed = match state {
                ExportState::Retained => true,
                ExportState::Abandoned => made,
                _ => !ended,
            };
            if !allowed {
                return Err(format!("export {id} is {state:?} on ended channel {conn}"));
            }
        }
        // No export an importer still holds (and has not sent a close
        // receipt for) is released: nothing proves its mapping gone.
        for p in &self.procs {
            for id in p.imports.keys().filter(|id| !p.closing.contains(id)) {
                if !matches!(t.state(*id), Some(ExportState::Exposed | ExportState::Retained)) {
                    return Err(format!(
                        "export {id} was released while its importer (pid {}) still holds it",
                        p.ident.process.pid
                    ));
                }
            }
        }
        for (id, n) in &self.src.counted {
            if *n > self.src.validated.get(id).copied().unwrap_or(0) {
                return Err(format!("export {id}: {n} receipts counted for fewer validated subbatches"));
            }
        }
        for c in &self.chans {
            let (ready, making) = c.core.waiting();
            if ready + making > ANSWERS_MAX {
                return Err(format!("conn {}: {ready} + {making} answers over the bound", c.conn));
            }
        }
        Ok(())
    }

    /// The source closes in the middle of the run, as
    /// `Engine::close_source` does: offers withdrawn, every slot revoked,
    /// every requester asked to give its imports back; about a third of
    /// the requesters are silent (frozen past the close's deadline), the
    /// others honest. The close ends when the table is empty (`Closed`),
    /// or at its deadline (`Unquiesced`), reclaiming what exited
    /// importers held as it waits. Checked: a close that reaches its
    /// deadline has a silent importer to blame for every export left
    /// (an honest one gave everything back in time), and (after every
    /// step, as always) no import a requester still holds was released.
    fn close_source(&mut self) -> Result<CloseEnd, String> {
        self.draining = true;
        self.source_closing = true;
        let deadline = NOW.with(|n| n.get()) + CLOSE_TIMEOUT;
        let mut silent = BTreeSet::new();
        for p in 0..self.procs.len() {
            let quiet = self.rng.chance(30);
            self.procs[p].frozen_until = if quiet { deadline + Duration::from_secs(1) } else { Duration::ZERO };
            if quiet {
                silent.insert((self.procs[p].ident.process.pid, self.procs[p].ident.process.start_time));
            }
        }
        let gone = self.src.table.borrow_mut().withdraw_offers();
        self.src.settle(gone);
        self.src.suspended_regions.extend(0..ALLOCS);
        for id in self.src.table.borrow_mut().suspend(None) {
            if !self.src.revoked.insert(id) {
                self.src.revoked.insert(u64::MAX);
            }
        }
        self.trace.push(format!("the source closes; silent: {silent:?}"));
        let end = loop {
            let gone = self.src.table.borrow_mut().reclaim_exited(self.exited(), |_| true);
            self.src.settle(gone);
            if self.src.table.borrow().is_empty() {
                break CloseEnd::Closed;
            }
            if NOW.with(|n| n.get()) >= deadline {
                break CloseEnd::Unquiesced;
            }
            self.step()?;
            self.check()?;
        };
        for (id, _, state, who) in self.src.table.borrow().list() {
            if !who.is_some_and(|w| silent.contains(&(w.pid, w.start_time))) {
                return Err(format!(
                    "the close timed out on export {id} ({state:?}) of {who:?}, not a silent requester ({silent:?})"
                ));
            }
        }
        self.trace.push(format!("the source's close ended: {end:?}"));
        Ok(end)
    }

    /// Ends the run: no more faults or new requests; requesters close what
    /// they hold (live ones), everything in flight is delivered, channels
    /// end, the source withdraws and reclaims. Then the table is empty.
    fn drain(&mut self) -> Check {
        self.draining = true;
        for p in &mut self.procs {
            p.frozen_until = Duration::ZERO;
        }
        for round in 0..20_000 {
            self.step()?;
            self.check()?;
            let held: usize = self.procs.iter().map(|p| p.imports.len()).sum();
            let busy = self.chans.iter().any(|c| !c.ended && (!c.calls.is_empty() || !c.r2s.is_empty()));
            if held == 0 && !busy && self.src.workers.is_empty() {
                break;
            }
            if round == 19_999 {
                return Err(format!("the run did not drain: {held} imports held, busy {busy}"));
            }
        }
        for i in 0..self.chans.len() {
            self.cut(i, "closed");
        }
        let gone = self.src.table.borrow_mut().withdraw_offers();
        self.src.settle(gone);
        for p in &self.procs {
            self.dead.insert((p.ident.process.pid, p.ident.process.start_time));
        }
        let gone = self.src.table.borrow_mut().reclaim_exited(self.exited(), |_| true);
        self.src.settle(gone);
        self.check()?;
        let t = self.src.table.borrow();
        if !t.is_empty() {
            return Err(format!("the table did not empty: {:?}", t.list()));
        }
        if self.src.made.get() != self.src.unexported.get() {
            return Err(format!("{} handles made, {} unexported", self.src.made.get(), self.src.unexported.get()));
        }
        if self.calls_sent != self.calls_answered + self.calls_failed {
            return Err(format!(
                "{} calls sent, {} answered, {} failed with their channel",
                self.calls_sent, self.calls_answered, self.calls_failed
            ));
        }
        Ok(())
    }
}

/// Counts of one run, for the totals.
#[derive(Default, Debug)]
struct Counts {
    calls: u64,
    answered: u64,
    handles: u64,
    channels: u64,
    abandoned: u64,
    unsent: u64,
    expired: u64,
    reclaimed: u64,
    closed: u64,
    unquiesced: u64,
}

impl Counts {
    fn add(&mut self, c: &Counts) {
        self.calls += c.calls;
        self.answered += c.answered;
        self.handles += c.handles;
        self.channels += c.channels;
        self.abandoned += c.abandoned;
        self.unsent += c.unsent;
        self.expired += c.expired;
        self.reclaimed += c.reclaimed;
        self.closed += c.closed;
        self.unquiesced += c.unquiesced;
    }
}

fn run_seed(seed: u64, plan: Plan) -> Result<Counts, String> {
    let mut sim = Sim::new(seed, plan);
    let mut result = Ok(());
    for _ in 0..plan.steps {
        result = sim.step().and_then(|()| sim.check());
        if result.is_err() {
            break;
        }
    }
    let mut closed = None;
    if result.is_ok() && plan.close_source {
        match sim.close_source() {
            Ok(end) => closed = Some(end),
            Err(e) => result = Err(e),
        }
    }
    if result.is_ok() {
        result = sim.drain();
    }
    match result {
        Ok(()) => Ok(Counts {
            calls: sim.calls_sent,
            answered: sim.calls_answered,
            handles: sim.src.made.get(),
            channels: sim.next_conn - 1,
            abandoned: sim.src.abandoned,
            unsent: sim.src.unsent,
            expired: sim.src.expired,
            reclaimed: sim.src.reclaimed,
            closed: (closed == Some(CloseEnd::Closed)) as u64,
            unquiesced: (closed == Some(CloseEnd::Unquiesced)) as u64,
        }),
        Err(e) => {
            let tail: Vec<&String> = sim.trace.iter().rev().take(12).rev().collect();
            Err(format!("{e}\nlast events: {tail:#?}"))
        }
    }
}

const FAULTS: Plan =
    Plan { steps: 10_000, faults: true, close_source: false, release_lost_grants: true, mutations: NO_MUTATION };
const NO_MUTATION: exports::Mutations = exports::Mutations {
    release_exports_being_made: false,
    forget_unsent_handles: false,
    suspend_again: false,
    keep_offers_of_lost_channels: false,
    reclaim_live_importers: false,
    count_undue_receipts: false,
};

/// The fixed seed set CI runs: faults everywhere, every invariant.
#[test]
fn seeded_runs_with_faults_keep_every_invariant() {
    let mut total = Counts::default();
    for seed in seeds(1..=3000) {
        match run_seed(seed, FAULTS) {
            Ok(c) => total.add(&c),
            Err(e) => panic!(
                "IPC simulation seed {seed} failed: {e}\nreplay: SIM_SEEDS={seed} cargo test --release --features sim --test sim_ipc \
                 seeded_runs_with_faults -- --nocapture"
            ),
        }
    }
    eprintln!("IPC simulation totals: {total:?}");
    // The runs exercised the protocol and each race, not just idled.
    let every = [total.handles, total.abandoned, total.unsent, total.expired, total.reclaimed];
    assert!(every.iter().all(|n| *n > 0) && total.answered > total.calls / 2, "{total:?}");
}

/// The source closes after a run with faults: it ends within its
/// deadline, empty unless a silent requester holds what is left, and
/// never releases what a requester still holds.
#[test]
fn seeded_source_closes_end_within_their_bound() {
    let mut total = Counts::default();
    for seed in seeds(1..=1000) {
        match run_seed(seed, Plan { steps: 3000, close_source: true, ..FAULTS }) {
            Ok(c) => total.add(&c),
            Err(e) => panic!(
                "IPC simulation seed {seed} failed: {e}\nreplay: SIM_SEEDS={seed} cargo test --release --features sim --test sim_ipc \
                 seeded_source_closes -- --nocapture"
            ),
        }
    }
    eprintln!("IPC close_source totals: {total:?}");
    // Both ends happened: closes that got everything back, and closes a
    // silent requester kept from it.
    assert!(total.closed > 0 && total.unquiesced > 0 && total.reclaimed > 0, "{total:?}");
}

/// A requester that does not release a grant whose handle was lost with
/// its channel (the engine before `LostGrant`): an honest requester holds
/// the source's close up. Found by the simulator, not by a review.
#[test]
fn the_simulator_finds_a_lost_handle_holding_a_close_up() {
    let plan = Plan { steps: 3000, close_source: true, release_lost_grants: false, ..FAULTS };
    let e = (1..=300u64).find_map(|seed| run_seed(seed, plan).err()).expect("not found");
    assert!(e.contains("not a silent requester"), "{e}");
}

/// Without faults every call is answered and nothing is cut.
#[test]
fn seeded_runs_without_faults_answer_every_call() {
    for seed in 500..=530u64 {
        let mut sim = Sim::new(seed, Plan { faults: false, ..FAULTS });
        for _ in 0..2000 {
            sim.step().and_then(|()| sim.check()).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        }
        sim.drain().unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert!(sim.calls_sent > 0);
        let cut_early = sim.trace.iter().filter(|t| t.contains("cut") && !t.ends_with("closed")).count();
        assert_eq!((sim.calls_failed, cut_early), (0, 0), "seed {seed}");
    }
}

/// Runs seeds with `bug` switched on; returns the first failure's text.
fn found(bug: exports::Mutations) -> Option<String> {
    (1..=300u64).find_map(|seed| run_seed(seed, Plan { mutations: bug, ..FAULTS }).err())
}

/// A lost channel releasing a grant whose handle is being made: the
/// simulator finds it.
#[test]
fn the_simulator_finds_a_grant_released_while_its_handle_is_made() {
    let e = found(exports::Mutations { release_exports_being_made: true, ..NO_MUTATION }).expect("not found");
    assert!(e.contains("while its handle was being made"), "{e}");
}

/// A handle dropped unsent (its channel ended first) leaving its export
/// exposed to nobody: the simulator finds it.
#[test]
fn the_simulator_finds_a_handle_dropped_unsent() {
    let e = found(exports::Mutations { forget_unsent_handles: true, ..NO_MUTATION }).expect("not found");
    assert!(e.contains("exposed to nobody"), "{e}");
}

/// A lost channel's offers kept (a grant that waits on after its channel
/// closed): the simulator finds it.
#[test]
fn the_simulator_finds_offers_kept_after_their_channel_ended() {
    let e = found(exports::Mutations { keep_offers_of_lost_channels: true, ..NO_MUTATION }).expect("not found");
    assert!(e.contains("Offered on ended channel"), "{e}");
}

/// A reclaim releasing the retained exports of importers that still live
/// (a timeout taken for proof that an import closed): the simulator
/// finds it.
#[test]
fn the_simulator_finds_a_live_importers_export_reclaimed() {
    let e = found(exports::Mutations { reclaim_live_importers: true, ..NO_MUTATION }).expect("not found");
    assert!(e.contains("released while its importer"), "{e}");
}

/// An unregistration revoking every slot again (the revoke flood): the
/// simulator finds it.
#[test]
fn the_simulator_finds_a_slot_revoked_again() {
    let e = found(exports::Mutations { suspend_again: true, ..NO_MUTATION }).expect("not found");
    assert!(e.contains("already revoked"), "{e}");
}

/// Operation receipts counted with no validated subbatch due (a
/// requester's repeated or unrevalidated receipts taken as traffic):
/// the simulator finds it, by its receipts invariant alone (the count is
/// nothing else's).
#[test]
fn the_simulator_finds_receipts_counted_without_a_validated_subbatch() {
    let e = found(exports::Mutations { count_undue_receipts: true, ..NO_MUTATION }).expect("not found");
    assert!(e.contains("receipts counted for fewer validated subbatches"), "{e}");
}
