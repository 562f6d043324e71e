//! The requester driven by a scripted source: a thread of this process
//! listening on the link's abstract name answers each frame the requester
//! sends with the frame its script says (or hangs up), and records what it
//! was sent. The "remote allocation" is a buffer of this process that a
//! test backend maps, so what each test checks is what the requester
//! decides: imports opened or declined, the status a refusal ends a group
//! with, receipts sent, cache entries given back, items ended.

use super::*;
use crate::control::Identity;
use crate::error::Status;
use crate::memory::{Access, MemoryKind};
use crate::transport::ipc::alive::AlivePage;
use crate::transport::ipc::channel::{deadline_tick, listen, Channel};
use crate::transport::ipc::link::{LocalEnd, Route};
use crate::transport::ipc::messages::{encode_reject, ExportRequest, Welcome, NO_SLOT};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

/// Where the source's region starts, in its own address space.
const REMOTE: u64 = 0x7000_0000;
/// The region's (and the allocation's) bytes.
const LEN: u64 = 4096;
const EXPORT_ID: u64 = 7;
const TOKEN: u64 = 0x5eed;

/// How the scripted source answers one frame: `None` hangs up.
type Reply = Box<dyn FnOnce(MsgKind, &[u8]) -> Option<(MsgKind, Vec<u8>)> + Send>;

/// An offer of the whole allocation for what the request asks, with the
/// board slot `slot` at generation 1 (or [`NO_SLOT`]).
fn offer(slot: u32) -> Reply {
    Box::new(move |_: MsgKind, body: &[u8]| {
        let r = ExportRequest::decode(body).expect("an export request");
        let o = ExportOffer {
            tag: r.tag,
            export_id: EXPORT_ID,
            token: TOKEN,
            base: REMOTE,
            physical: LEN,
            grant_addr: REMOTE,
            grant_len: LEN,
            region_epoch: r.region_epoch,
            ops: r.ops,
            slot,
            slot_generation: 1,
        };
        Some((MsgKind::ExportOffer, o.encode()))
    })
}

/// The handle answering an accept.
fn handle() -> Reply {
    Box::new(|_: MsgKind, _: &[u8]| {
        let mut b = ExportRef { export_id: EXPORT_ID, token: TOKEN, value: 0, extra: 0 }.encode();
        b.extend_from_slice(b"handle");
        Some((MsgKind::ExportHandle, b))
    })
}

/// The ACK of a receipt (or of an answer).
fn ack() -> Reply {
    Box::new(|kind: MsgKind, body: &[u8]| {
        let r = ExportRef::decode(body, "receipt").expect("a receipt");
        Some((MsgKind::Ack, ExportRef { value: 0, extra: kind as u32, ..r }.encode()))
    })
}

/// A refusal with `status`, tagged with the request's tag (its first word).
fn reject(status: Status, text: &'static str) -> Reply {
    Box::new(move |_: MsgKind, body: &[u8]| {
        let tag = u64::from_le_bytes(body[..8].try_into().expect("a tag"));
        Some((MsgKind::ExportReject, encode_reject(tag, status, text)))
    })
}

/// A revalidation accepted, naming the slot's generation `generation`.
fn revalidate_ok(generation: u64) -> Reply {
    Box::new(move |_: MsgKind, body: &[u8]| {
        let mut b = body[..8].to_vec();
        b.extend_from_slice(&generation.to_le_bytes());
        Some((MsgKind::RevalidateOk, b))
    })
}

fn hang_up() -> Reply {
    Box::new(|_: MsgKind, _: &[u8]| None)
}

/// What the source was sent, in order.
type Seen = Vec<(MsgKind, Vec<u8>)>;

/// The scripted source: one script per channel it accepts (each welcomed
/// with the descriptors `fds`: a board and a liveness page, or none). A
/// script that ends with a hang-up lets the next channel come; after the
/// last script the source records frames until the link hangs up.
fn source(name: &str, me: Identity, fds: Vec<RawFd>, scripts: Vec<Vec<Reply>>) -> std::thread::JoinHandle<Seen> {
    let l = listen(name).unwrap();
    std::thread::spawn(move || {
        let mut seen = Seen::new();
        let patient = Instant::now() + Duration::from_secs(60);
        let n = scripts.len();
        for (i, script) in scripts.into_iter().enumerate() {
            let (s, _) = l.accept().unwrap();
            let mut c = Channel::from_stream(s).unwrap();
            let hello = c.recv(&mut || deadline_tick(patient, "hello")).unwrap();
            assert_eq!(hello.kind, MsgKind::IpcHello);
            c.send(MsgKind::IpcWelcome, &Welcome { identity: me }.encode(), &fds, &mut || Ok(())).unwrap();
            let mut hung_up = false;
            for reply in script {
                // A channel the requester closed lets the next one come.
                let Ok(f) = c.recv(&mut || deadline_tick(patient, "a frame")) else {
                    hung_up = true;
                    break;
                };
                seen.push((f.kind, f.body.clone()));
                match reply(f.kind, &f.body) {
                    Some((kind, body)) => c.send(kind, &body, &[], &mut || Ok(())).unwrap(),
                    None => {
                        hung_up = true;
                        break;
                    }
                }
            }
            if !hung_up && i + 1 == n {
                while let Ok(f) = c.recv(&mut || deadline_tick(patient, "the end")) {
                    seen.push((f.kind, f.body));
                }
            }
        }
        seen
    })
}

/// The kinds of `seen`.
fn kinds(seen: &Seen) -> Vec<MsgKind> {
    seen.iter().map(|(k, _)| *k).collect()
}

/// A backend whose imports map `remote` (a buffer of this process standing
/// for the source's allocation), counting imports, copies and closes.
struct Heap {
    remote: u64,
    imports: AtomicUsize,
    copies: Arc<AtomicUsize>,
    closes: Arc<AtomicUsize>,
    stall: Arc<Stall>,
}

struct HeapMapping {
    base: u64,
    copies: Arc<AtomicUsize>,
    closes: Arc<AtomicUsize>,
    stall: Arc<Stall>,
}

/// Holds the next copy once armed: it meets the test at `meet` (its group
/// holds its import, the copy not done), then waits there until the test
/// meets it again.
struct Stall {
    armed: std::sync::atomic::AtomicBool,
    meet: std::sync::Barrier,
}

impl IpcBackend for Heap {
    fn transport(&self) -> crate::kinds::TransportKind {
        crate::kinds::TransportKind::Shm
    }
    fn export(&self, _: u64, _: bool) -> Result<super::super::backend::ExportedHandle> {
        unreachable!("the requester exports nothing")
    }
    fn import(&self, h: ReceivedHandle, physical: u64, _: bool, _: Option<i32>) -> Result<Box<dyn Mapping>> {
        assert_eq!((h.bytes.as_slice(), physical), (&b"handle"[..], LEN));
        self.imports.fetch_add(1, Ordering::SeqCst);
        Ok(Box::new(HeapMapping {
            base: self.remote,
            copies: self.copies.clone(),
            closes: self.closes.clone(),
            stall: self.stall.clone(),
        }))
    }
}

impl Mapping for HeapMapping {
    fn base(&self) -> u64 {
        self.base
    }
    fn copy(&self, ops: &[CopyOp], _: CopyPlan) -> Result<Posting> {
        if self.stall.armed.swap(false, Ordering::SeqCst) {
            self.stall.meet.wait();
            self.stall.meet.wait();
        }
        for op in ops {
            // SAFETY: the tests READ only: `src` lies in the remote buffer
            // and `dst` in a local one, both alive for the whole test and
            // apart from each other.
            unsafe { std::ptr::copy_nonoverlapping(op.src as *const u8, op.dst as *mut u8, op.len as usize) };
        }
        self.copies.fetch_add(ops.len(), Ordering::SeqCst);
        Ok(0)
    }
    fn wait(&self, _: Posting) -> Result<()> {
        Ok(())
    }
    fn close(&self) -> Result<()> {
        self.closes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// One test's world: the remote buffer, the requester over it (a cache of
/// `capacity` entries), a link to a scripted source, and its region.
struct World {
    remote: Vec<u8>,
    heap: Arc<Heap>,
    req: Arc<IpcRequester>,
    link: Arc<IpcLink>,
    region: RegionInfo,
    name: String,
    me: Identity,
}

fn world(capacity: usize, test: u32) -> World {
    let remote: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
    let heap = Arc::new(Heap {
        remote: remote.as_ptr() as u64,
        imports: AtomicUsize::new(0),
        copies: Default::default(),
        closes: Default::default(),
        stall: Arc::new(Stall { armed: Default::default(), meet: std::sync::Barrier::new(2) }),
    });
    let log = Arc::new(crate::log::Logger::new(crate::log::Level::Error, "test"));
    let req = Arc::new(IpcRequester::new(
        heap.clone(),
        Budget::new(1 << 30),
        capacity,
        false,
        Arc::new(Faults::default()),
        log,
    ));
    let me = Identity::fresh().unwrap();
    let name = format!("orbite-requester-test-{}-{test}", std::process::id());
    let link = link_to(&name, me, "127.0.0.1:1", Identity::fresh().unwrap());
    let region =
        RegionInfo { id: 3, epoch: 1, addr: REMOTE, len: LEN, access: Access::READ, kind: MemoryKind::SharedHost };
    World { remote, heap, req, link, region, name, me }
}

/// A link of the engine `local` to the source `me` listening on `name`
/// (its endpoint `endpoint`).
fn link_to(name: &str, me: Identity, endpoint: &str, local: Identity) -> Arc<IpcLink> {
    let local = LocalEnd {
        identity: local,
        auth: None,
        faults: Arc::new(Faults::default()),
        reconnect_timeout: Duration::from_secs(10),
        log: Arc::new(crate::log::Logger::new(crate::log::Level::Error, "test")),
    };
    Arc::new(IpcLink::new(
        crate::kinds::TransportKind::Shm,
        Route::Unix(name.to_string()),
        me,
        endpoint.into(),
        "test source".into(),
        local,
    ))
}

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(30)
}

fn host() -> GroupLocal {
    GroupLocal { device: None, pinned: false, group_ops: 0, spans: LocalSpans::none(), independent: false }
}

/// READs of `len` bytes at each remote offset in `at`, into `local`
/// (one after another from its start), numbered from 0.
fn reads(local: &mut [u8], at: &[u64], len: u64) -> Vec<(usize, Request)> {
    let base = local.as_mut_ptr() as u64;
    at.iter()
        .enumerate()
        .map(|(i, off)| {
            let r = Request { op: Op::Read, local_addr: base + i as u64 * len, remote_addr: REMOTE + off, len };
            (i, r)
        })
        .collect()
}

impl World {
    fn run(&self, items: Vec<(usize, Request)>) -> std::result::Result<Finished, (Error, Vec<(usize, Request)>)> {
        match self.req.run_group(&self.link, &self.region, items, host(), deadline(), None::<fn() -> OnDone>) {
            Ok(GroupRun::Done(f)) => Ok(f),
            Ok(GroupRun::Deferred) => panic!("a group of CPU copies was deferred"),
            Err(GroupError::NotPosted(e, items)) => Err((e, items)),
        }
    }

    /// Closes the link and returns what the source was sent.
    fn end(self, src: std::thread::JoinHandle<Seen>) -> Seen {
        self.link.close();
        src.join().unwrap()
    }
}

/// Each item's index and status, in order.
fn statuses(f: Finished) -> Vec<(usize, Status)> {
    f.into_pairs().map(|(i, o)| (i, o.result.map_or_else(|e| e.status(), |()| Status::Ok))).collect()
}

#[test]
fn an_accepted_opening_maps_the_allocation_copies_and_closes_it_with_its_receipt() {
    let w = world(0, line!());
    let src = source(&w.name, w.me, vec![], vec![vec![offer(NO_SLOT), handle(), ack()]]);
    let mut local = vec![0u8; 200];
    let f = w.run(reads(&mut local, &[0, 1000], 100)).unwrap_or_else(|(e, _)| panic!("{e}"));
    assert_eq!(statuses(f), [(0, Status::Ok), (1, Status::Ok)]);
    assert_eq!((&local[..100], &local[100..]), (&w.remote[..100], &w.remote[1000..1100]));
    let n = w.req.counts();
    assert_eq!((n.opened, n.closed, n.copies_issued, n.cached, n.retained), (1, 1, 2, 0, 0));
    assert_eq!((w.heap.imports.load(Ordering::SeqCst), w.heap.closes.load(Ordering::SeqCst)), (1, 1));
    let seen = w.end(src);
    assert_eq!(kinds(&seen), [MsgKind::ExportRequest, MsgKind::ExportAnswer, MsgKind::CloseReceipt]);
    let asked = ExportRequest::decode(&seen[0].1).unwrap();
    assert_eq!((asked.addr, asked.len, asked.ops, asked.region_epoch), (REMOTE, 1100, OP_READ, 1));
    let accept = ExportRef::decode(&seen[1].1, "answer").unwrap();
    assert_eq!((accept.export_id, accept.token, accept.value), (EXPORT_ID, TOKEN, 1));
}

#[test]
fn each_refusal_of_an_export_request_ends_the_group_unposted_with_its_status() {
    let refusals = [
        Status::PermissionDenied,
        Status::StalePeer,
        Status::NotFound,
        Status::ResourceExhausted,
        Status::Unavailable,
        Status::NotSupported,
        Status::TimedOut,
    ];
    let w = world(0, line!());
    let script = refusals.iter().map(|st| reject(*st, "refused by the script")).collect();
    let src = source(&w.name, w.me, vec![], vec![script]);
    for st in refusals {
        let mut local = vec![0u8; 64];
        let items = reads(&mut local, &[0, 64], 32);
        let (e, back) = w.run(items.clone()).err().unwrap_or_else(|| panic!("{st:?}: the group ran"));
        assert_eq!((e.status(), e.message()), (st, "refused by the script"), "{e}");
        assert_eq!(back, items, "{st:?}: the requests are not given back as they came");
    }
    let n = w.req.counts();
    assert_eq!((n.opened, n.copies_issued), (0, 0));
    assert_eq!(w.heap.imports.load(Ordering::SeqCst), 0);
    let seen = w.end(src);
    assert_eq!(kinds(&seen), vec![MsgKind::ExportRequest; refusals.len()]);
}

#[test]
fn a_refusal_of_the_accept_maps_nothing_and_keeps_its_status() {
    let w = world(0, line!());
    let src = source(&w.name, w.me, vec![], vec![vec![offer(NO_SLOT), reject(Status::ResourceExhausted, "no room")]]);
    let mut local = vec![0u8; 64];
    let (e, back) = w.run(reads(&mut local, &[0], 64)).err().expect("the group ran");
    assert_eq!((e.status(), back.len()), (Status::ResourceExhausted, 1), "{e}");
    assert_eq!(w.heap.imports.load(Ordering::SeqCst), 0);
    assert_eq!(kinds(&w.end(src)), [MsgKind::ExportRequest, MsgKind::ExportAnswer]);
}

#[test]
fn an_offer_beyond_the_mapping_budget_is_declined_and_refused_resource_exhausted() {
    let mut w = world(0, line!());
    let log = Arc::new(crate::log::Logger::new(crate::log::Level::Error, "test"));
    w.req = Arc::new(IpcRequester::new(w.heap.clone(), Budget::new(LEN - 1), 0, false, Default::default(), log));
    let src = source(&w.name, w.me, vec![], vec![vec![offer(NO_SLOT), ack()]]);
    let mut local = vec![0u8; 64];
    let (e, _) = w.run(reads(&mut local, &[0], 64)).err().expect("the group ran");
    assert_eq!(e.status(), Status::ResourceExhausted, "{e}");
    assert!(e.message().contains("mapping budget"), "{e}");
    let seen = w.end(src);
    assert_eq!(kinds(&seen), [MsgKind::ExportRequest, MsgKind::ExportAnswer]);
    assert_eq!(ExportRef::decode(&seen[1].1, "answer").unwrap().value, 0, "the offer was not declined");
}

#[test]
fn a_revalidation_sets_the_slot_generation_it_names_and_a_stale_one_gives_the_import_back() {
    let w = world(4, line!());
    let script = vec![
        offer(NO_SLOT),
        handle(),
        ack(),                                                // the first group's OpComplete
        revalidate_ok(9),                                     // the second group's revalidation
        ack(),                                                // its OpComplete
        reject(Status::StalePeer, "region epoch 1 is stale"), // the third's
        ack(),                                                // the flush's CloseReceipt
    ];
    let src = source(&w.name, w.me, vec![], vec![script]);
    let mut local = vec![0u8; 64];
    for at in [0, 100] {
        let f = w.run(reads(&mut local, &[at], 64)).unwrap_or_else(|(e, _)| panic!("{e}"));
        assert_eq!(statuses(f), [(0, Status::Ok)]);
        assert_eq!(local, w.remote[at as usize..at as usize + 64]);
    }
    let entries = w.req.cache.entries();
    assert_eq!(entries.len(), 1);
    let imp = entries[0].3.clone().expect("a cached import");
    assert_eq!(imp.slot_generation.load(Ordering::SeqCst), 9, "the revalidation's generation was not kept");
    drop(imp);
    let (e, back) = w.run(reads(&mut local, &[200], 64)).err().expect("a stale import was used");
    assert_eq!((e.status(), back.len()), (Status::StalePeer, 1), "{e}");
    assert_eq!(w.req.counts().groups_with_round_trips, 3);
    // The refused group gave its import back: a flush closes it at once.
    let left = w.req.flush(Instant::now() + Duration::from_secs(5));
    assert!(left.is_empty(), "{left:?}");
    assert_eq!((w.req.counts().opened, w.req.counts().closed, w.req.counts().cached), (1, 1, 0));
    let seen = w.end(src);
    use MsgKind::*;
    assert_eq!(
        kinds(&seen),
        [ExportRequest, ExportAnswer, OpComplete, Revalidate, OpComplete, Revalidate, CloseReceipt]
    );
}

#[test]
fn a_channel_lost_after_the_copies_ends_every_item_once_with_its_status() {
    let w = world(0, line!());
    let src = source(&w.name, w.me, vec![], vec![vec![offer(NO_SLOT), handle(), hang_up()]]);
    let mut local = vec![0u8; 96];
    let f = w.run(reads(&mut local, &[0, 500, 900], 32)).unwrap_or_else(|(e, _)| panic!("{e}"));
    assert_eq!(statuses(f), [(0, Status::Unavailable), (1, Status::Unavailable), (2, Status::Unavailable)]);
    // Mapped and closed natively; its close receipt is owed.
    let n = w.req.counts();
    assert_eq!((n.opened, n.closed, n.retained), (1, 0, 1));
    assert_eq!(w.heap.closes.load(Ordering::SeqCst), 1);
    assert_eq!(kinds(&w.end(src)), [MsgKind::ExportRequest, MsgKind::ExportAnswer, MsgKind::CloseReceipt]);
}

#[test]
fn a_channel_lost_with_the_accept_gives_the_requests_back_and_owes_the_grant() {
    let w = world(0, line!());
    let src = source(&w.name, w.me, vec![], vec![vec![offer(NO_SLOT), hang_up()]]);
    let mut local = vec![0u8; 64];
    let items = reads(&mut local, &[0, 32], 32);
    let (e, back) = w.run(items.clone()).err().expect("the group ran");
    assert_eq!((e.status(), back), (Status::Unavailable, items), "{e}");
    let owed = w.req.retained.lock().grants.iter().map(|g| g.r).collect::<Vec<_>>();
    assert_eq!(owed, [ExportRef { export_id: EXPORT_ID, token: TOKEN, value: 0, extra: 0 }]);
    assert_eq!(w.heap.imports.load(Ordering::SeqCst), 0);
    assert_eq!(kinds(&w.end(src)), [MsgKind::ExportRequest, MsgKind::ExportAnswer]);
}

/// A world (test `line`) whose source runs `scripts` (the first one
/// offering board slot 0 and its handle) and whose first group, one READ
/// of 64 bytes, went through that import: the world, the source, and
/// the board and alive page it exported (kept until the end).
fn imported(line: u32, scripts: Vec<Vec<Reply>>) -> (World, std::thread::JoinHandle<Seen>, (Board, AlivePage)) {
    let w = world(4, line);
    let board = Board::create().unwrap();
    let alive = AlivePage::create().unwrap();
    let fds = vec![board.fd().as_raw_fd(), alive.fd().as_raw_fd()];
    let src = source(&w.name, w.me, fds, scripts);
    board::publish(board.slot(0).unwrap(), 1, OP_READ);
    let mut local = vec![0u8; 64];
    let f = w.run(reads(&mut local, &[0], 64)).unwrap_or_else(|(e, _)| panic!("{e}"));
    assert_eq!(statuses(f), [(0, Status::Ok)]);
    (w, src, (board, alive))
}

/// Guards `!imp.maps_range((req.remote_addr, req.len))` in `copy_held`:
/// a direct copy whose first byte lies in the held import's mapping but
/// which runs 8 bytes past its end is not tried there (None, nothing
/// copied); the same copy 8 bytes earlier goes through.
#[test]
fn a_held_copy_running_past_the_imports_mapping_is_not_tried() {
    let (w, src, pages) = imported(line!(), vec![vec![offer(0), handle()]]);
    let held = w.req.held(&w.link, &w.region);
    let mut direct = vec![0u8; 16];
    let dst = direct.as_mut_ptr() as u64;
    let at = |remote_addr: u64| Request { op: Op::Read, local_addr: dst, remote_addr, len: 16 };
    let copies = w.heap.copies.load(Ordering::SeqCst);
    assert!(w.req.copy_held(&held, &at(REMOTE + LEN - 8)).is_none(), "a copy ran past the mapping");
    assert_eq!(w.heap.copies.load(Ordering::SeqCst), copies);
    assert!(matches!(w.req.copy_held(&held, &at(REMOTE + LEN - 16)), Some(Ok(()))));
    assert_eq!(direct, w.remote[LEN as usize - 16..]);
    assert_eq!(w.req.counts().direct_copies, 1);
    w.end(src);
    drop(pages);
}

#[test]
fn a_held_import_of_a_replaced_channel_copies_nothing() {
    // Channel 1: an import in board slot 0, then a hang-up; channel 2: up.
    let scripts = vec![vec![offer(0), handle(), hang_up()], vec![]];
    let (w, src, pages) = imported(line!(), scripts);
    assert_eq!(w.req.counts().groups_without_round_trip, 1);
    // A direct route holds the import and copies through it.
    let held = w.req.held(&w.link, &w.region);
    let mut direct = vec![0u8; 16];
    let r = Request { op: Op::Read, local_addr: direct.as_mut_ptr() as u64, remote_addr: REMOTE + 300, len: 16 };
    assert!(matches!(w.req.copy_held(&held, &r), Some(Ok(()))));
    assert_eq!(direct, w.remote[300..316]);
    // The channel is lost and replaced; the grant's words still allow READ.
    let e = w.link.call(MsgKind::Ack, b"ping", deadline(), "ping").err().expect("the source answered");
    assert_eq!(e.status(), Status::Unavailable, "{e}");
    w.link.settle_reconnect(deadline());
    assert_eq!(w.link.generation(), 2);
    let copies = w.heap.copies.load(Ordering::SeqCst);
    direct.fill(0);
    assert!(w.req.copy_held(&held, &r).is_none(), "a copy went through an import of a replaced channel");
    assert!(w.req.copy_held(&w.req.held(&w.link, &w.region), &r).is_none());
    assert_eq!((direct, w.heap.copies.load(Ordering::SeqCst)), (vec![0u8; 16], copies));
    assert_eq!(w.req.counts().direct_copies, 1);
    let seen = w.end(src);
    assert_eq!(kinds(&seen), [MsgKind::ExportRequest, MsgKind::ExportAnswer, MsgKind::Ack]);
    drop(pages);
}

/// Guards `l.source == link.source` in `channel_for`: the close receipt
/// of an import whose link this engine closed goes out on a later link to
/// the same source only. With a link to another source open (and the
/// import's own source not yet reached again) the receipt is not sent
/// anywhere: the import stays retained, and the other source is sent
/// nothing of it; once a new link to the import's source is tracked, the
/// receipt goes out there and the import is closed.
#[test]
fn a_receipt_owed_through_a_closed_link_never_goes_to_another_source() {
    let w = world(4, line!());
    // Source A (the world's): its import, then (the link closed here) a
    // second channel that acknowledges the receipt.
    let src_a = source(&w.name, w.me, vec![], vec![vec![offer(NO_SLOT), handle(), ack(), hang_up()], vec![ack()]]);
    // Source B: its own import; a receipt for A's export would be refused.
    let (name_b, me_b) = (format!("{}-b", w.name), Identity::fresh().unwrap());
    let script_b = vec![offer(NO_SLOT), handle(), ack(), reject(Status::NotFound, "no such export")];
    let src_b = source(&name_b, me_b, vec![], vec![script_b]);
    let engine = Identity::fresh().unwrap();
    let link_b = link_to(&name_b, me_b, "127.0.0.1:2", engine);
    w.req.track(&w.link);
    w.req.track(&link_b);
    let mut local = vec![0u8; 64];
    let f = w.run(reads(&mut local, &[0], 64)).unwrap_or_else(|(e, _)| panic!("{e}"));
    assert_eq!(statuses(f), [(0, Status::Ok)]);
    let items = reads(&mut local, &[64], 64);
    match w.req.run_group(&link_b, &w.region, items, host(), deadline(), None::<fn() -> OnDone>) {
        Ok(GroupRun::Done(f)) => assert_eq!(statuses(f), [(0, Status::Ok)]),
        _ => panic!("the group through source B did not run"),
    }
    assert_eq!((w.req.counts().opened, w.req.counts().cached), (2, 2));
    // This engine disconnects from A: A's import is closed natively, its
    // receipt owed; no link to A is left to carry it.
    w.link.close();
    let left = w.req.flush_link(&w.link, deadline());
    assert_eq!(left.len(), 1, "{left:?}");
    let n = w.req.counts();
    assert_eq!((n.closed, n.retained, n.cached), (0, 1, 1));
    assert_eq!(w.heap.closes.load(Ordering::SeqCst), 1);
    // A new link to A carries it.
    let link_a2 = link_to(&w.name, w.me, "127.0.0.1:1", engine);
    w.req.track(&link_a2);
    let left = w.req.flush_link(&w.link, deadline());
    assert!(left.is_empty(), "{left:?}");
    let n = w.req.counts();
    assert_eq!((n.closed, n.retained, n.cached), (1, 0, 1));
    link_a2.close();
    link_b.close();
    use MsgKind::*;
    let seen_b = src_b.join().unwrap();
    assert_eq!(kinds(&seen_b), [ExportRequest, ExportAnswer, OpComplete], "source B was sent A's receipt");
    let seen_a = w.end(src_a);
    assert_eq!(kinds(&seen_a), [ExportRequest, ExportAnswer, OpComplete, CloseReceipt]);
    let receipt = ExportRef::decode(&seen_a[3].1, "receipt").unwrap();
    assert_eq!((receipt.export_id, receipt.token), (EXPORT_ID, TOKEN));
}

/// A cached import whose channel was replaced while a group still copies
/// through it is not closed under that copy: a second group of the same
/// key waits for it (here until its own short deadline: `TimedOut`, the
/// import neither closed nor replaced), and once the copy is done and the
/// group ended `Ok`, the stale import is closed through the new channel
/// with its receipt. Guards `SlotState::Ready(_) if slot.users == 0` in
/// `RelocationCache::acquire` (src/transport/ipc/cache.rs; round 18 S9:
/// without `slot.users == 0` the second group unmapped the import under
/// the running copy and opened another). No engine-level test can hold a
/// group's copy still while its channel is replaced: a backend that stalls
/// one copy does it here.
#[test]
fn a_stale_import_still_copied_through_is_not_closed_under_the_copy() {
    // Channel 1: the import (board slot 0), then a hang-up; channel 2: the
    // stale import's close receipt.
    let scripts = vec![vec![offer(0), handle(), hang_up()], vec![ack()]];
    let (w, src, pages) = imported(line!(), scripts);
    let mut first = vec![0u8; 64];
    let mut second = vec![0u8; 64];
    let (g1, g2, closes_meanwhile) = std::thread::scope(|s| {
        w.heap.stall.armed.store(true, Ordering::SeqCst);
        let items = reads(&mut first, &[100], 64);
        let g1 = s.spawn(|| w.run(items).map(statuses).map_err(|(e, _)| e));
        // Group 1 holds the import, its copy not done.
        w.heap.stall.meet.wait();
        // Its channel is lost and replaced: the import is no longer current.
        let e = w.link.call(MsgKind::Ack, b"ping", deadline(), "ping").err().expect("the source answered");
        assert_eq!(e.status(), Status::Unavailable, "{e}");
        w.link.settle_reconnect(deadline());
        assert_eq!(w.link.generation(), 2);
        // Group 2 of the same key waits for group 1, until its deadline.
        let soon = Instant::now() + Duration::from_millis(200);
        let items = reads(&mut second, &[200], 64);
        let g2 = match w.req.run_group(&w.link, &w.region, items, host(), soon, None::<fn() -> OnDone>) {
            Err(GroupError::NotPosted(e, back)) => Err((e, back.len())),
            Ok(_) => Ok(()),
        };
        let closes_meanwhile = w.heap.closes.load(Ordering::SeqCst);
        // Group 1's copy goes on.
        w.heap.stall.meet.wait();
        (g1.join().unwrap(), g2, closes_meanwhile)
    });
    assert_eq!(closes_meanwhile, 0, "the import was closed under the copy running through it");
    let (e, back) = g2.expect_err("group 2 ran while group 1 held the stale import");
    assert_eq!((e.status(), back), (Status::TimedOut, 1), "{e}");
    assert_eq!(e.message(), "test source region 3: cached import still being set up or used");
    assert_eq!(g1.unwrap_or_else(|e| panic!("{e}")), [(0, Status::Ok)]);
    assert_eq!(first, w.remote[100..164]);
    assert_eq!((w.heap.imports.load(Ordering::SeqCst), w.heap.closes.load(Ordering::SeqCst)), (1, 0));
    // Group 1 ended: the stale import is closed through the new channel.
    let left = w.req.flush(deadline());
    assert!(left.is_empty(), "{left:?}");
    let n = w.req.counts();
    assert_eq!((n.opened, n.closed, n.cached, n.retained), (1, 1, 0, 0));
    assert_eq!(w.heap.closes.load(Ordering::SeqCst), 1);
    let seen = w.end(src);
    use MsgKind::*;
    assert_eq!(kinds(&seen), [ExportRequest, ExportAnswer, Ack, CloseReceipt]);
    drop(pages);
}
