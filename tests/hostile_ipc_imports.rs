//! A requester's cached IPC imports against sources that lie, go away and
//! come back, or want their memory back: a source's grant board never
//! widens what an import's mapping allows (a real hostile source process),
//! a disconnect gives the peer's imports back and a reconnect finds its
//! regions clean, and an unregistration takes an idle importer's cached
//! import back at once, or says which importer kept it; a handle sealed
//! against growing but not shrinking is never mapped, and a liveness page
//! its source can still write is never believed.

mod common;
mod hostile_source;

use common::*;
use hostile_source::{Hostile, Script, LEN};
use orbite::control::frame::MsgKind;
use orbite::transport::ipc::messages::{OP_READ, OP_WRITE};
use orbite::*;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

fn shm() -> SubmitOptions {
    SubmitOptions { transport: Transport::Only(TransportKind::Shm), timeout: Some(LONG) }
}

fn req(op: Op, local: u64, remote: u64, len: u64) -> Request {
    Request { op, local_addr: local, remote_addr: remote, len }
}

/// A source engine publishing `pools` shared allocations of 2 MiB (READ
/// only, pattern 11), and a requester engine in this process with 64 KiB
/// of local memory, both with the default relocation cache.
struct Pair {
    src: Engine,
    pools: Vec<Allocation>,
    regions: Vec<u64>,
    e: Engine,
    local: Vec<u8>,
}

impl Pair {
    fn new(pools: usize) -> Pair {
        let src = Engine::from_json("").unwrap();
        let pools: Vec<Allocation> = (0..pools).map(|_| allocate_shared_host(2 * MIB).unwrap()).collect();
        for a in &pools {
            // SAFETY: the allocation holds 2 MiB, written only here.
            let bytes = unsafe { std::slice::from_raw_parts_mut(a.addr() as *mut u8, 2 * MIB as usize) };
            bytes.copy_from_slice(&pattern_vec(11, 2 * MIB as usize));
        }
        let regions = pools.iter().map(|a| src.register_memory(a.addr(), 2 * MIB, Access::READ).unwrap()).collect();
        let e = Engine::from_json("").unwrap();
        let local = vec![0u8; 65536];
        e.register_memory(local.as_ptr() as u64, local.len() as u64, Access::NONE).unwrap();
        Pair { src, pools, regions, e, local }
    }

    /// A forced-SHM READ of `len` bytes at `off` in pool `i` through peer
    /// `p`: `Err` with the request's failure, else its bytes checked.
    fn read(&self, p: u64, i: usize, off: u64, len: u64) -> std::result::Result<(), String> {
        let r = req(Op::Read, self.local.as_ptr() as u64, self.pools[i].addr() + off, len);
        let b = self.e.submit(p, &[r], shm()).map_err(|e| e.to_string())?;
        b.wait(LONG).map_err(|_| format!("{:?}", b.error(0)))?;
        let want = pattern_vec(11, (off + len) as usize);
        assert!(self.local[..len as usize] == want[off as usize..], "the READ's bytes");
        Ok(())
    }

    /// Both engines closed OK, then the allocations freed.
    fn end(self) {
        self.e.close(Some(LONG)).unwrap();
        self.src.close(Some(LONG)).unwrap();
        for a in self.pools {
            a.free().unwrap();
        }
    }
}

/// The pattern the hostile source process fills its region with.
const HOSTILE_SEED: u64 = 5;

/// Set in the hostile source process (this test binary, run again).
const HOSTILE_CHILD: &str = "ORBITE_HOSTILE_BOARD_SOURCE";

/// The hostile source process: a source whose grant board claims READ and
/// WRITE for every grant, READ-only ones included. It prints
/// `hostile-source ENDPOINT ADDR`, then answers `fnv OFF LEN` with the
/// FNV-1a of those bytes of its region, until its stdin closes.
fn run_lying_board_source() {
    let script = Script { board: Some(|_granted| OP_READ | OP_WRITE), ..Script::honest() };
    let h = Hostile::start(script, |i| pattern(HOSTILE_SEED, i));
    println!("hostile-source {} {}", h.endpoint, h.addr);
    std::io::stdout().flush().unwrap();
    // SAFETY: the hostile source's region stays mapped for the process's life.
    let mem = unsafe { std::slice::from_raw_parts(h.addr as *const u8, LEN as usize) };
    for line in std::io::stdin().lock().lines() {
        let line = line.unwrap();
        let w: Vec<u64> = line.split_whitespace().skip(1).map(|x| x.parse().unwrap()).collect();
        println!("fnv {}", fnv(&mem[w[0] as usize..(w[0] + w[1]) as usize]));
        std::io::stdout().flush().unwrap();
    }
}

/// A source process that writes READ|WRITE into the board slot of a
/// READ-only grant: a direct route holding that READ-only import (its
/// mapping is read-only) gets a WRITE. Before, the route's fast path
/// entered the slot on the board's word and copied into the read-only
/// mapping: SIGSEGV, the requester process gone (3 of 3 runs). Now the
/// import's own grant bounds what the board may allow: the WRITE takes the
/// full path, which opens a writable import, and lands. Guards
/// `Import::enter` refusing operations beyond the grant it was mapped for
/// (`transport/ipc/requester/mod.rs`).
#[test]
fn a_source_widening_a_read_grant_on_its_board_cannot_make_a_write_use_the_read_only_mapping() {
    const NAME: &str = "a_source_widening_a_read_grant_on_its_board_cannot_make_a_write_use_the_read_only_mapping";
    if std::env::var_os(HOSTILE_CHILD).is_some() {
        run_lying_board_source();
        return;
    }
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", NAME, "--nocapture", "--test-threads", "1"])
        .env(HOSTILE_CHILD, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut to_child = child.stdin.take().unwrap();
    let mut from_child = BufReader::new(child.stdout.take().unwrap());
    let mut next_line = |prefix: &str| loop {
        let mut line = String::new();
        assert!(from_child.read_line(&mut line).unwrap() > 0, "the hostile source process ended");
        // The test harness may print its own words before the child's.
        if let Some((_, rest)) = line.trim().split_once(prefix) {
            break rest.to_string();
        }
    };
    let first = next_line("hostile-source ");
    let (endpoint, addr) = first.split_once(' ').unwrap();
    let addr: u64 = addr.parse().unwrap();

    let e = Engine::from_json("").unwrap();
    let local = pattern_vec(3, 3 * 4096);
    e.register_memory(local.as_ptr() as u64, local.len() as u64, Access::READ_WRITE).unwrap();
    let peer = e.connect(endpoint, Some(LONG)).unwrap();
    let route = e.open_direct(peer, addr, LEN, Transport::Only(TransportKind::Shm), Some(LONG)).unwrap();
    let l = local.as_ptr() as u64;
    // Two READs: the first opens the region's READ-only import, the second
    // copies through it on the route's fast path (the board granting it).
    for _ in 0..2 {
        let (r, err) = e.copy_direct(&route, &req(Op::Read, l + 8192, addr, 4096), Some(LONG)).unwrap();
        assert_eq!(r.status, Status::Ok, "{err:?}");
    }
    assert!(local[8192..] == pattern_vec(HOSTILE_SEED, 4096)[..], "the READ's bytes");
    let st = e.stats().ipc["shm"].imports.clone();
    assert_eq!((st.opened, st.direct_copies), (1, 1), "the second READ did not take the fast path");

    // The WRITE, its slot claiming READ|WRITE over a read-only mapping.
    let (r, err) = e.copy_direct(&route, &req(Op::Write, l, addr + 65536, 4096), Some(LONG)).unwrap();
    assert_eq!((r.status, r.remote_effect), (Status::Ok, RemoteEffect::Applied), "{err:?}");
    let st = e.stats().ipc["shm"].imports.clone();
    assert_eq!((st.opened, st.direct_copies), (2, 1), "the WRITE went through the READ-only import");
    writeln!(to_child, "fnv 65536 4096").unwrap();
    let landed: u64 = next_line("fnv ").parse().unwrap();
    assert_eq!(landed, fnv(&local[..4096]), "the WRITE's bytes in the source's memory");
    drop(to_child);
    let _ = child.wait();
}

/// 50 cycles (`ORBITE_RECONNECT_CYCLES` sets another count) of connect, a
/// forced-SHM READ (its import cached, the default), disconnect: every READ
/// succeeds with the source's bytes, every disconnect leaves the source no
/// export, and the region unregisters at once at the end. Before, the
/// disconnect left the import cached on the closed link for the engine's
/// life: after the first cycle every forced READ failed UNAVAILABLE "the
/// import is retained…" and the source kept the export (and its region)
/// until the requester process exited. Guards the flush of the peer's
/// links in `Engine::disconnect` (`engine/peers.rs`).
#[test]
fn disconnect_reconnect_cycles_over_shm_all_move_and_leave_no_export() {
    let cycles: u64 = std::env::var("ORBITE_RECONNECT_CYCLES").map_or(50, |v| v.parse().unwrap());
    let t = Pair::new(1);
    let t0 = Instant::now();
    for cycle in 0..cycles {
        let p = t.e.connect(&t.src.endpoint(), Some(LONG)).unwrap();
        t.read(p, 0, (cycle % 16) * 65536, 65536).unwrap_or_else(|e| panic!("cycle {cycle}: {e}"));
        assert_eq!(t.e.stats().ipc["shm"].imports.cached, 1, "cycle {cycle}");
        t.e.disconnect(p, Some(LONG)).unwrap();
        let im = t.e.stats().ipc["shm"].imports.clone();
        assert_eq!((im.cached, im.retained), (0, 0), "cycle {cycle}");
        let ex = t.src.stats().ipc["shm"].exports;
        assert_eq!((ex.open, ex.retained), (0, 0), "cycle {cycle}: the disconnect left the source an export");
    }
    println!("{cycles} connect/READ/disconnect cycles over SHM, all OK: {:?}", t0.elapsed());
    let t0 = Instant::now();
    t.src.unregister_memory(t.regions[0], Some(LONG)).unwrap();
    println!("unregister after them: {:?}", t0.elapsed());
    t.end();
}

/// A disconnect whose close receipt cannot be confirmed (its
/// acknowledgement lost twice: the receipt and its one retry) leaves the
/// import owed; after a reconnect to the same source, the next forced-SHM
/// READ sends that receipt on the new channel, which the source
/// acknowledges, and opens a fresh import: OK, nothing retained. Before,
/// the receipt went on the closed link and failed for good: the READ
/// failed UNAVAILABLE "the import is retained…", and so did every flush.
/// Guards `IpcRequester::channel_for` sending what a link closed here owes
/// on the next link to the same source (`transport/ipc/requester/closing.rs`).
#[test]
fn a_receipt_owed_by_a_disconnected_link_goes_out_on_the_next_channel() {
    use std::sync::atomic::Ordering::SeqCst;
    let t = Pair::new(1);
    let p = t.e.connect(&t.src.endpoint(), Some(LONG)).unwrap();
    t.read(p, 0, 0, 4096).unwrap();
    t.e.faults().lose_ack.store(2, SeqCst);
    t.e.disconnect(p, Some(LONG)).unwrap();
    assert_eq!(t.e.faults().lose_ack.load(SeqCst), 0, "the receipt was not sent");
    assert_eq!(t.e.stats().ipc["shm"].imports.retained, 1, "the unconfirmed receipt is owed");

    let p = t.e.connect(&t.src.endpoint(), Some(LONG)).unwrap();
    let b = t.e.submit(p, &[req(Op::Read, t.local.as_ptr() as u64, t.pools[0].addr(), 4096)], shm()).unwrap();
    b.wait(LONG).unwrap_or_else(|_| panic!("{:?}", b.error(0)));
    let st = t.e.stats().ipc["shm"].imports.clone();
    assert_eq!((st.cached, st.retained, st.opened), (1, 0, 2), "{st:?}");
    t.e.flush_nvlink_cache(Some(LONG)).unwrap();
    let ex = t.src.stats().ipc["shm"].exports;
    assert_eq!((ex.open, ex.retained), (0, 0));
    t.end();
}

/// An honest requester that READ once from each of two regions of a
/// source and idles, its imports cached (the default): the source's
/// unregistration of the first asks it for that import back (a `Revoke`),
/// it gives it back, and the call returns OK in well under its timeout
/// (20 s here). Before, nothing asked: every unregistration waited out its
/// timeout, TIMED_OUT "still used by 1 in-flight copies", and
/// `revokes_received` stayed 0. The import of the other region, whose
/// grant stands, stays cached. Guards the `Revoke` in
/// `Engine::unregister_memory` (`engine/regions.rs`), and `Import::withdrawn`
/// choosing what a `Revoke` asks back (`transport/ipc/requester/mod.rs`).
#[test]
fn an_unregistration_takes_an_idle_cached_import_back_at_once() {
    let t = Pair::new(2);
    let p = t.e.connect(&t.src.endpoint(), Some(LONG)).unwrap();
    t.read(p, 0, 0, 4096).unwrap();
    t.read(p, 1, 0, 4096).unwrap();
    assert_eq!(t.src.stats().ipc["shm"].exports.open, 2);
    assert_eq!(t.e.stats().ipc["shm"].imports.cached, 2);
    let t0 = Instant::now();
    t.src.unregister_memory(t.regions[0], Some(Duration::from_secs(20))).unwrap();
    let took = t0.elapsed();
    println!("unregister with an idle cached importer: {took:?}");
    assert!(took < Duration::from_secs(10), "{took:?}: the import was not asked back");
    assert_eq!(t.e.stats().events.revokes_received, 1);
    // The pass that gave the import back ended: it left the other one.
    eventually("the give-back pass ended", || t.e.stats().events.revoke_passes == 1);
    assert_eq!(t.e.stats().ipc["shm"].imports.cached, 1, "the other region's import stays cached");
    assert_eq!(t.src.stats().ipc["shm"].exports.open, 1);
    // The other region is still read through its cached import.
    t.read(p, 1, 4096, 4096).unwrap();
    assert_eq!(t.e.stats().ipc["shm"].imports.opened, 2);
    t.end();
}

/// The same with the importer frozen (SIGSTOP): the unregistration ends at
/// its timeout, TIMED_OUT, naming the export it waited for and the
/// importing process, and the region stays registered, its grant
/// published again. Once the importer runs again it reads the `Revoke`,
/// finds the grant standing and keeps its import: its next READ
/// revalidates once and is back on the board. The next unregistration
/// takes the import back, OK. Guards the message built in
/// `Engine::unregister_memory` from `ExportTable::holding`, and the
/// unregistration's `resume` (without it the grant stays withdrawn and the
/// import is given back and opened again).
#[test]
fn an_unregistration_blocked_by_a_frozen_importer_ends_at_its_timeout_naming_it() {
    let src = Engine::from_json("").unwrap();
    let pool = allocate_shared_host(2 * MIB).unwrap();
    let id = src.register_memory(pool.addr(), 2 * MIB, Access::READ).unwrap();
    let mut r = PeerProc::spawn_requester(&src.endpoint(), &format!("{}:4096", pool.addr()), "{}");
    r.freeze();
    let t0 = Instant::now();
    let err = src.unregister_memory(id, Some(Duration::from_secs(1))).unwrap_err();
    let took = t0.elapsed();
    println!("unregister with a frozen importer (timeout 1 s): {took:?}: {err}");
    assert_eq!(err.status(), Status::TimedOut, "{err}");
    let m = err.message();
    assert!(m.contains("shm export") && m.contains(&format!("to process {}", r.pid)), "{err}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert!(src.regions().iter().any(|g| g.id == id), "the region stays registered");
    r.signal(libc::SIGCONT);
    let trips = |st: &serde_json::Value| {
        let shm = &st["ipc"]["shm"];
        (
            shm["imports_opened"].as_u64(),
            shm["groups_without_round_trip"].as_u64(),
            shm["groups_with_round_trips"].as_u64(),
        )
    };
    assert_eq!(trips(&r.stats()), (Some(1), Some(1), Some(0)), "the first READ opened the import");
    for _ in 0..2 {
        let got = r.cmd("read");
        assert!(got.starts_with("ok "), "{got}");
    }
    let st = r.stats();
    assert_eq!(trips(&st), (Some(1), Some(2), Some(1)), "one revalidation, then the board: {st}");
    let t0 = Instant::now();
    src.unregister_memory(id, Some(LONG)).unwrap();
    println!("unregister once the importer runs again: {:?}", t0.elapsed());
    assert!(r.stats()["revokes_received"].as_u64().unwrap() >= 2);
    pool.free().unwrap();
}

/// A hostile source (threads of this process) whose region's memory file,
/// the handle of its every export, is sealed against growing but NOT
/// against shrinking: a forced-SHM READ of 4 KiB accepts the (sound) offer,
/// refuses the handle PROTOCOL_ERROR "not sealed against shrinking and
/// growing", lands nothing and opens no import. Once the source shrinks the
/// file to nothing (what the seal exists to rule out), a second READ is
/// refused alike: this process never mapped it, so it never faults.
/// (Taking one size seal for both, the handle was mapped and the READ
/// answered OK; a source shrinking it then made the next copy through the
/// cached import fault, SIGBUS.) Guards `ShmBackend::import`
/// (src/transport/ipc/backends/shm.rs)
/// `seals & owners::SIZE_SEALS != owners::SIZE_SEALS` against
/// `seals & owners::SIZE_SEALS == 0` (round 6 F16).
#[test]
fn a_handle_sealed_against_growing_only_is_never_mapped() {
    let script = Script { seals: libc::F_SEAL_GROW | libc::F_SEAL_SEAL, ..Script::honest() };
    let h = Hostile::start(script, |i| pattern(HOSTILE_SEED, i));
    let e = Engine::from_json("").unwrap();
    let local = vec![0xeeu8; 8192];
    e.register_memory(local.as_ptr() as u64, local.len() as u64, Access::NONE).unwrap();
    let peer = e.connect(&h.endpoint, Some(LONG)).unwrap();
    let read = || {
        let b = e.submit(peer, &[req(Op::Read, local.as_ptr() as u64, h.addr + 8192, 4096)], shm()).unwrap();
        assert_eq!(b.wait(LONG).unwrap_err().status(), Status::TransferFailed);
        assert_eq!(
            b.result(0).unwrap(),
            RequestResult { status: Status::ProtocolError, remote_effect: RemoteEffect::None }
        );
        let why = b.error(0).expect("the READ's failure");
        assert!(why.message().contains("not sealed against shrinking and growing"), "{why}");
    };
    read();
    assert_eq!(h.answers(), vec![(101, true)], "the offer itself is sound: accepted");
    assert!(local.iter().all(|b| *b == 0xee), "bytes moved");
    assert_eq!(e.stats().ipc["shm"].imports.opened, 0, "an import opened");
    h.truncate(0).unwrap();
    read();
    assert_eq!(h.answers(), vec![(101, true), (102, true)]);
    assert!(local.iter().all(|b| *b == 0xee), "bytes moved");
    assert_eq!(e.stats().ipc["shm"].imports.opened, 0, "an import opened");
    e.close(Some(LONG)).unwrap();
}

/// A hostile source (threads of this process) with an honest grant board
/// that sends, with its IpcWelcome, a liveness page sealed against resizing
/// but not against writes, its word saying the keeper died: the requester
/// refuses the page (and watches the channel instead, which is up), so
/// both READs (the first on its fresh offer, the second through the cached
/// import) run inside their board slot: two groups without a round trip,
/// none with one, no Revalidate. (Taking a page sealed against resizing
/// alone, the word its holders may rewrite decided whether the board
/// grants: its forged "dead" sent both READs round trips.)
/// Guards `AliveView::map` (`transport/ipc/alive.rs`) checking
/// `READ_ONLY_SEALS` (the future-write seal too), not `owners::SIZE_SEALS`
/// (round 10 J14).
#[test]
fn a_liveness_page_its_source_can_still_write_is_never_believed() {
    let script = Script { board: Some(|granted| granted), writable_alive_page: true, ..Script::honest() };
    let h = Hostile::start(script, |i| pattern(HOSTILE_SEED, i));
    let e = Engine::from_json("").unwrap();
    let local = vec![0u8; 8192];
    e.register_memory(local.as_ptr() as u64, local.len() as u64, Access::NONE).unwrap();
    let peer = e.connect(&h.endpoint, Some(LONG)).unwrap();
    // The first READ opens the import (and caches it); the second runs through it.
    for off in [0, 4096] {
        let b = e.submit(peer, &[req(Op::Read, local.as_ptr() as u64 + off, h.addr + off, 4096)], shm()).unwrap();
        b.wait(LONG).unwrap();
    }
    assert!(local == pattern_vec(HOSTILE_SEED, 8192), "the READs' bytes");
    let st = e.stats().ipc["shm"].imports.clone();
    assert_eq!((st.opened, st.groups_without_round_trip, st.groups_with_round_trips), (1, 2, 0));
    assert_eq!(h.frames(MsgKind::Revalidate).len(), 0);
    e.close(Some(LONG)).unwrap();
}
