//! Importers that push a source's export table to its edges, each a real
//! process (`orbite-peer --import`: the SHM channel spoken by hand, no
//! close receipt ever): one that hoards exports, one that hoards the
//! mapping budget, one whose main thread exits while another thread goes
//! on writing, one that forks a child holding its mapping and exits. The
//! source keeps each bounded, and never takes a live writer for dead. And
//! a raw channel of this process asking READ|WRITE of a READ-only region:
//! refused, never granted writable.

mod common;

use common::*;
use orbite::control::frame::MsgKind;
use orbite::control::identity::{process_start_time, ProcessIdentity};
use orbite::control::Identity;
use orbite::transport::ipc::channel::Channel;
use orbite::transport::ipc::export::process_exited;
use orbite::transport::ipc::messages::{decode_reject, ExportOffer, ExportRef, ExportRequest, OP_READ, OP_WRITE};
use orbite::*;
use std::time::{Duration, Instant};

const SZ: u64 = 1 << 20;

/// A source engine (`cfg`) with `allocs` registered READ|WRITE; their
/// region ids.
fn source(cfg: &str, allocs: &[&Allocation]) -> (Engine, Vec<u64>) {
    let e = Engine::from_json(cfg).unwrap();
    let ids = allocs.iter().map(|a| e.register_memory(a.addr(), a.len(), Access::READ_WRITE).unwrap()).collect();
    (e, ids)
}

fn shm(e: &Engine) -> orbite::engine::stats::IpcStats {
    e.stats().ipc["shm"].clone()
}

/// The state letter of process `pid` (`/proc/PID/stat`), if it is there.
fn state_of(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rfind(')').and_then(|i| stat[i + 1..].split_whitespace().next().map(str::to_string))
}

/// A process asks for 40 exports with a bound of 16 per requester: 16
/// offers, then `RESOURCE_EXHAUSTED` naming the key; a new channel of the
/// same process, and its channels lost (its exports retained), change
/// nothing; an honest requester process is served over SHM throughout;
/// the hoarder's exit gives everything back. (Before, nothing bounded
/// exports per requester: it held all 40, and 90 000 as easily.) Guards
/// the count check of `Holders::admit` (src/transport/ipc/proto/holders.rs).
#[test]
fn one_requester_cannot_hold_more_exports_than_its_bound() {
    let a = allocate_shared_host(SZ).unwrap();
    let (src, _) = source(r#"{"ipc_max_exports_per_requester": 16}"#, &[&a]);
    let (mut hoarder, first) = PeerProc::spawn_importer(&src.endpoint(), a.addr(), 4096, false, 40);
    assert!(first.starts_with("held 16 refused ORBITE_STATUS_RESOURCE_EXHAUSTED"), "{first}");
    assert!(first.contains("ipc_max_exports_per_requester = 16"), "{first}");
    assert_eq!(shm(&src).exports.open, 16);
    let more = hoarder.cmd("more 5");
    assert!(more.starts_with("held 0 refused ORBITE_STATUS_RESOURCE_EXHAUSTED"), "a second channel: {more}");
    assert_eq!(hoarder.cmd("hangup"), "ok");
    eventually("the hoarder's exports are retained", || shm(&src).exports.retained == 16);
    let more = hoarder.cmd("more 1");
    assert!(more.starts_with("held 0 refused ORBITE_STATUS_RESOURCE_EXHAUSTED"), "retained exports count: {more}");
    let mut honest =
        PeerProc::spawn_requester(&src.endpoint(), &format!("{}:4096", a.addr()), r#"{"shm_cache_entries": 2}"#);
    let st = shm(&src);
    assert_eq!((st.exports.open, st.exports.retained), (1, 16), "the honest requester reads over SHM");
    assert_eq!(honest.cmd("flush"), "ok");
    let st = shm(&src);
    assert_eq!((st.exports.open, st.exports.retained), (0, 16), "its close receipt ended the honest export");
    honest.kill();
    hoarder.kill();
    eventually("the hoarder's exports are reclaimed", || shm(&src).exports.retained == 0);
    assert_eq!(shm(&src).exports.reclaimed_after_exit, 16);
    src.close(Some(LONG)).unwrap();
    a.free().map_err(|(_, e)| e).unwrap();
}

/// A mapping budget of 4 MiB and three allocations of 2 MiB: a hoarder
/// holding one of them alone cannot take a second (its share is 50%),
/// so an honest requester still gets the third over SHM. (Before, the
/// hoarder held two, the budget was full, and every other allocation was
/// `RESOURCE_EXHAUSTED` over SHM.) Guards the share check of
/// `Holders::admit`.
#[test]
fn one_requester_cannot_take_the_whole_mapping_budget() {
    const ALLOC: u64 = 2 << 20;
    let (x, y, z) = (
        allocate_shared_host(ALLOC).unwrap(),
        allocate_shared_host(ALLOC).unwrap(),
        allocate_shared_host(ALLOC).unwrap(),
    );
    assert_eq!((x.physical_len(), y.physical_len(), z.physical_len()), (ALLOC, ALLOC, ALLOC));
    let (src, _) = source(r#"{"max_inflight_bytes": 4194304, "max_transfer_bytes": 1048576}"#, &[&x, &y, &z]);
    let (mut hoarder, first) = PeerProc::spawn_importer(&src.endpoint(), x.addr(), 4096, false, 1);
    assert_eq!(first, "held 1");
    let second = hoarder.cmd(&format!("more 1 {}:4096", y.addr()));
    assert!(second.starts_with("held 0 refused ORBITE_STATUS_RESOURCE_EXHAUSTED"), "{second}");
    assert!(second.contains("ipc_requester_budget_percent"), "{second}");
    // More exports of what it holds cost nothing more.
    assert_eq!(hoarder.cmd(&format!("more 2 {}:4096", x.addr())), "held 2");
    let mut honest =
        PeerProc::spawn_requester(&src.endpoint(), &format!("{}:4096", z.addr()), r#"{"shm_cache_entries": 2}"#);
    let st = shm(&src);
    assert_eq!(st.exports.open, 4, "the honest requester reads its allocation over SHM");
    assert_eq!(st.mapping_bytes_charged, 2 * ALLOC);
    assert_eq!(honest.cmd("flush"), "ok");
    assert_eq!(shm(&src).mapping_bytes_charged, ALLOC, "its close receipt ended the honest export");
    honest.kill();
    hoarder.kill();
    eventually("the hoarder's exports end", || shm(&src).exports.open + shm(&src).exports.retained == 0);
    src.close(Some(LONG)).unwrap();
    for a in [x, y, z] {
        a.free().map_err(|(_, e)| e).unwrap();
    }
}

/// What a source must see of an importer that left a survivor writing into
/// its allocation: its export stays (retained), unregistering its region
/// and freeing it fail, the survivor's writes land; once the survivor is
/// gone too, the export is reclaimed and both succeed.
fn survivor_keeps_its_export(
    src: &Engine,
    a: Allocation,
    region: u64,
    survivor: &mut PeerProc,
    wait_survivor: impl FnOnce(&mut PeerProc),
) {
    eventually("the channel's end is handled", || {
        let st = shm(src);
        st.exports.retained + st.exports.reclaimed_after_exit == 1
    });
    let st = shm(src);
    assert_eq!(
        (st.exports.retained, st.exports.reclaimed_after_exit),
        (1, 0),
        "a live importer's export was reclaimed"
    );
    let refused = src.unregister_memory(region, Some(Duration::from_secs(2))).unwrap_err();
    assert_eq!(refused.status(), Status::TimedOut, "{refused}");
    let a = match a.free() {
        Ok(()) => panic!("the allocation was freed under a live importer"),
        Err((a, _)) => a,
    };
    assert_eq!(survivor.cmd("poke 100 171"), "ok");
    // SAFETY: the allocation maps at least 4096 bytes and lives here.
    let seen = unsafe { std::ptr::read_volatile((a.addr() + 100) as *const u8) };
    assert_eq!(seen, 171, "the survivor writes into the allocation");
    assert_eq!(shm(src).exports.retained, 1);
    survivor.send("exit");
    wait_survivor(survivor);
    eventually("the export is reclaimed once the survivor is gone", || shm(src).exports.reclaimed_after_exit == 1);
    assert_eq!(shm(src).exports.retained, 0);
    src.unregister_memory(region, Some(LONG)).unwrap();
    free_eventually(a);
}

/// An importer's main thread exits alone (`pthread_exit` in `main`: the
/// leader is a zombie while another thread runs and keeps the mapping),
/// then that thread hangs the channel up. The source retains the export:
/// the process lives. (Before, a zombie leader counted as exited: the
/// export was reclaimed at once, and unregister and free succeeded while
/// the survivor went on writing.) Guards `all_threads_exited` in
/// `process_exited` (src/transport/ipc/export/mod.rs), which decides for
/// every backend; over SHM the mark of the mapping the survivor keeps
/// (`an_importer_whose_forked_child...`) would keep the export too.
#[test]
fn an_importer_whose_main_thread_exited_keeps_its_export() {
    let a = allocate_shared_host(SZ).unwrap();
    let (src, ids) = source("", &[&a]);
    let (mut imp, first) = PeerProc::spawn_importer(&src.endpoint(), a.addr(), 4096, true, 1);
    assert_eq!(first, "held 1");
    assert_eq!(imp.cmd("main_exits"), "ok");
    let pid = imp.pid;
    let who = ProcessIdentity { pid, start_time: process_start_time(pid) };
    eventually("the leader is a zombie", || state_of(pid).as_deref() == Some("Z"));
    // What decides for every backend (SHM also sees the mapping itself).
    assert!(!process_exited(&who), "a process whose main thread exited was taken for exited");
    assert_eq!(imp.cmd("hangup"), "ok", "another thread answers");
    survivor_keeps_its_export(&src, a, ids[0], &mut imp, |p| {
        p.child.wait().unwrap();
    });
    assert!(process_exited(&who));
    src.close(Some(LONG)).unwrap();
}

/// A process that exited and was not reaped yet (a zombie: every thread
/// gone, its memory and mappings released) has exited for the source,
/// before its parent reaps it as after. Guards `all_threads_exited` in
/// `process_exited` (src/transport/ipc/export/mod.rs) from the other
/// side: without it, a zombie importer (a parent that does not reap)
/// counts as alive where `process_exited` decides: a lost channel's
/// exports (`connection_lost`: retained, not reclaimed), the close
/// (`reclaim_exited`) and watches without a process descriptor. Where a
/// pidfd watch runs, it sees the exit by itself and reclaims them a
/// moment later, so no engine-level outcome tells the two apart reliably:
/// the decision is checked here, on a real zombie.
#[test]
fn a_zombie_process_has_exited() {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    let who = ProcessIdentity { pid, start_time: process_start_time(pid) };
    assert_ne!(who.start_time, 0, "the zombie's start time is readable until it is reaped");
    eventually("the child is a zombie", || state_of(pid).as_deref() == Some("Z"));
    assert!(process_exited(&who), "a zombie was taken for a live process");
    child.wait().unwrap();
    assert!(process_exited(&who));
}

/// An importer forks (the child inherits its mapping and its channel) and
/// exits; the child hangs the channel up. The importing process is gone,
/// but its child still maps the export: retained until the child exits.
/// (Before, the importer's exit was taken as proof that the mapping was
/// gone.) Guards `self.let_go(h)` in `ExportTable::connection_lost` and
/// `reclaim_of` (src/transport/ipc/export/ending.rs) and the SHM mark it
/// reads (src/transport/ipc/backends/held_file.rs).
#[test]
fn an_importer_whose_forked_child_holds_the_mapping_keeps_its_export() {
    let a = allocate_shared_host(SZ).unwrap();
    let (src, ids) = source("", &[&a]);
    let (mut imp, first) = PeerProc::spawn_importer(&src.endpoint(), a.addr(), 4096, true, 1);
    assert_eq!(first, "held 1");
    let forked = imp.cmd("fork");
    let child_pid: u32 = forked.strip_prefix("forked ").and_then(|p| p.parse().ok()).expect(&forked);
    imp.child.wait().unwrap();
    assert_eq!(shm(&src).exports.open, 1, "the child holds the channel open");
    assert_eq!(imp.cmd("hangup"), "ok", "the child answers");
    survivor_keeps_its_export(&src, a, ids[0], &mut imp, |_| {
        eventually("the child is gone", || state_of(child_pid).is_none_or(|s| s == "Z" || s == "X"));
    });
    src.close(Some(LONG)).unwrap();
}

/// An importer forks a child that keeps its mapping, then unmaps its own
/// and sends its close receipt (what an honest engine does when it flushes
/// after a fork). The receipt is acknowledged, but the kernel shows the
/// handle still mapped: the export lingers, counted as retained, and holds
/// the region and the allocation until the child is gone. (Before, the
/// receipt released everything while the child could still write.)
/// Guards the `held` check in `ExportTable::close_receipt`
/// (src/transport/ipc/export/mod.rs).
#[test]
fn a_close_receipt_while_a_forked_child_maps_the_export_lingers() {
    let a = allocate_shared_host(SZ).unwrap();
    let (src, ids) = source("", &[&a]);
    let (mut imp, first) = PeerProc::spawn_importer(&src.endpoint(), a.addr(), 4096, true, 1);
    assert_eq!(first, "held 1");
    let spawned = imp.cmd("holder");
    let holder: u32 = spawned.strip_prefix("holder ").and_then(|p| p.parse().ok()).expect(&spawned);
    assert_eq!(imp.cmd("close"), "closed 1");
    let st = shm(&src);
    assert_eq!((st.exports.open, st.exports.retained), (0, 1), "a receipt released an export a child still maps");
    let refused = src.unregister_memory(ids[0], Some(Duration::from_secs(2))).unwrap_err();
    assert_eq!(refused.status(), Status::TimedOut, "{refused}");
    let a = match a.free() {
        Ok(()) => panic!("the allocation was freed while a child maps it"),
        Err((a, _)) => a,
    };
    assert_eq!(imp.cmd("drop_holder"), "ok");
    eventually("the holder is gone", || state_of(holder).is_none_or(|s| s == "Z" || s == "X"));
    eventually("the export ends once nothing maps it", || shm(&src).exports.retained == 0);
    assert_eq!(shm(&src).exports.reclaimed_after_exit, 1);
    src.unregister_memory(ids[0], Some(LONG)).unwrap();
    free_eventually(a);
    imp.kill();
    src.close(Some(LONG)).unwrap();
}

/// An importer holds one export of each of two regions and gives neither
/// back: unregistering either times out naming the one export of that
/// region (its id, its importing process, its state), not the other
/// region's. Guards `ExportTable::holding`'s
/// `h.lease.region().id == region` (src/transport/ipc/export/mod.rs;
/// round 18 S10: without it every export was named as holding the region,
/// "2 of them are exports").
#[test]
fn an_unregistration_that_times_out_names_only_the_exports_of_its_region() {
    let (a, b) = (allocate_shared_host(SZ).unwrap(), allocate_shared_host(SZ).unwrap());
    let (src, ids) = source("", &[&a, &b]);
    let (mut hoarder, first) = PeerProc::spawn_importer(&src.endpoint(), a.addr(), 4096, false, 1);
    assert_eq!(first, "held 1");
    assert_eq!(hoarder.cmd(&format!("more 1 {}:4096", b.addr())), "held 1");
    assert_eq!(shm(&src).exports.open, 2);
    for (export, region) in [(1, ids[0]), (2, ids[1])] {
        let e = src.unregister_memory(region, Some(Duration::from_millis(500))).unwrap_err();
        assert_eq!(e.status(), Status::TimedOut, "{e}");
        let named = format!(
            "region {region} is still used by 1 in-flight copies; it stays registered; 1 of them are exports whose \
             importers did not give them back in time: shm export {export} to process {} (Exposed)",
            hoarder.pid
        );
        assert_eq!(e.message(), named);
    }
    assert_eq!(shm(&src).exports.open, 2, "the timed-out unregistrations ended an export");
    hoarder.kill();
    eventually("the hoarder's exports are reclaimed", || shm(&src).exports.reclaimed_after_exit == 2);
    for region in ids {
        src.unregister_memory(region, Some(LONG)).unwrap();
    }
    src.close(Some(LONG)).unwrap();
    free_eventually(a);
    free_eventually(b);
}

/// A hostile requester on a raw IPC channel asks an export of a region
/// published READ-only for READ|WRITE: `ExportReject` PERMISSION_DENIED
/// naming the WRITE the region does not allow, no handle sent, no export
/// opened; the same channel asking READ alone is offered it (the refusal
/// is the WRITE's). (Checked against READ only, the READ|WRITE export was
/// offered and its handle would have been opened writable: the requester
/// could write into memory published READ-only.) Honest requesters ask
/// READ|WRITE only of regions allowing both, so only a hostile one reaches
/// this. Guards `access_of` (src/transport/ipc/messages.rs)
/// `let write = if ops & OP_WRITE != 0 {` against `ops == OP_WRITE`
/// (round 6 F12).
#[test]
fn an_export_asking_read_and_write_of_a_read_only_region_is_refused() {
    let a = allocate_shared_host(SZ).unwrap();
    let src = Engine::from_json("").unwrap();
    let id = src.register_memory(a.addr(), SZ, Access::READ).unwrap();
    let r = src.regions()[0];
    let (mut ch, kind, _) = ipc_hello(&src.endpoint(), TransportKind::Shm, Identity::fresh().unwrap(), None);
    assert_eq!(kind, MsgKind::IpcWelcome);
    let deadline = Instant::now() + LONG;
    let ask = |ops| ExportRequest { tag: 7, region_epoch: r.epoch, addr: a.addr(), len: 4096, ops, wait_ms: 1000 };
    let f = ch.call(MsgKind::ExportRequest, &ask(OP_READ | OP_WRITE).encode(), deadline, "export request").unwrap();
    assert_eq!(f.kind, MsgKind::ExportReject, "READ|WRITE of a READ-only region answered {:?}", f.kind);
    assert!(f.fd.is_none(), "a refusal carried a handle");
    let (tag, why) = decode_reject(&f.body).unwrap();
    assert_eq!(tag, 7);
    assert_eq!(why.status(), Status::PermissionDenied, "{why}");
    assert!(
        why.message().ends_with(&format!("region {id} (0x{:x}+{SZ}) does not allow remote WRITE", a.addr())),
        "{why}"
    );
    assert_eq!(shm(&src).exports.open, 0, "an export opened");
    let f = ch.call(MsgKind::ExportRequest, &ask(OP_READ).encode(), deadline, "export request").unwrap();
    assert_eq!(f.kind, MsgKind::ExportOffer, "READ alone answered {:?}", f.kind);
    let o = ExportOffer::decode(&f.body).unwrap();
    assert_eq!(o.ops, OP_READ);
    let decline = ExportRef { export_id: o.export_id, token: o.token, value: 0, extra: 0 };
    ch.call(MsgKind::ExportAnswer, &decline.encode(), deadline, "decline").unwrap();
    drop(ch);
    src.close(Some(LONG)).unwrap();
    a.free().unwrap();
}

/// Passes every frame, and the descriptors riding on it, from `from` to
/// `to` until either end ends; then shuts both down.
fn pass_frames(mut from: Channel, mut to: Channel) {
    use std::os::fd::AsRawFd;
    let mut tick = || Ok(());
    while let Ok(f) = from.recv(&mut tick) {
        let fds: Vec<i32> = f.fd.iter().chain(&f.second_fd).map(|fd| fd.as_raw_fd()).collect();
        if to.send(f.kind, &f.body, &fds, &mut tick).is_err() {
            break;
        }
    }
    from.shutdown();
    to.shutdown();
}

/// Reads and drops everything a fake source's socket brings.
fn drain(mut s: std::net::TcpStream) {
    use std::io::Read;
    let _ = s.read_to_end(&mut Vec::new());
}

/// A source whose IPC channel has an abstract name of exactly
/// MAX_IPC_NAME bytes (a longest name, here this process passing every
/// frame and descriptor to a real source's channel) serves a READ over
/// SHM: its exact bytes land. A Describe naming one byte more is refused
/// at the handshake, PROTOCOL_ERROR naming the bound. Guards
/// `transport/ipc/channel.rs` `Channel::connect_until`'s `name.len() >
/// crate::control::message::MAX_IPC_NAME` (round 17 R12: with `>=` the
/// longest name a Describe may carry could not be connected to, and the
/// READ failed).
#[test]
fn a_source_on_the_longest_ipc_name_is_served_over_shm() {
    use orbite::control::message::MAX_IPC_NAME;
    let a = allocate_shared_host(SZ).unwrap();
    let remote = pattern_vec(5, 4096);
    // SAFETY: the allocation maps SZ writable bytes, more than 4096.
    unsafe { std::ptr::copy_nonoverlapping(remote.as_ptr(), a.addr() as *mut u8, 4096) };
    let (src, _) = source("", &[&a]);
    let real = describe_of(&src.endpoint());
    let prefix = format!("orbite-longest-{}-", std::process::id());
    let name = format!("{prefix}{}", "n".repeat(MAX_IPC_NAME - prefix.len()));
    assert_eq!(name.len(), MAX_IPC_NAME);
    let l = orbite::transport::ipc::channel::listen(&name).unwrap();
    let source_name = real.ipc_name.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { break };
            let near = Channel::from_stream(s).unwrap();
            let far = Channel::connect(&source_name).unwrap();
            let back = (far.try_clone().unwrap(), near.try_clone().unwrap());
            std::thread::spawn(move || pass_frames(near, far));
            std::thread::spawn(move || pass_frames(back.0, back.1));
        }
    });
    let req = Engine::from_json(r#"{"shm_cache_entries": 0}"#).unwrap();
    let local = vec![0u8; 4096];
    req.register_memory(local.as_ptr() as u64, 4096, Access::NONE).unwrap();
    let longest = orbite::control::message::Describe { ipc_name: name.clone(), ..real.clone() };
    let p = connect_fake_source_as(&req, &longest, drain);
    let read = Request { op: Op::Read, local_addr: local.as_ptr() as u64, remote_addr: a.addr(), len: 4096 };
    let opts = SubmitOptions { transport: Transport::Only(TransportKind::Shm), timeout: Some(LONG) };
    let b = req.submit(p, &[read], opts).unwrap();
    b.wait(LONG).unwrap_or_else(|e| panic!("{e}: {:?}", b.error(0)));
    assert_eq!(b.transport(0).unwrap(), Some(TransportKind::Shm));
    assert_eq!(local, remote);
    let longer = orbite::control::message::Describe { ipc_name: format!("{name}n"), ..real };
    let e = try_connect_fake_source_as(&req, &longer, drain).unwrap_err();
    assert_eq!(e.status(), Status::ProtocolError, "{e}");
    let why = format!(
        "Describe IPC name {:?}... ({} bytes) is not printable ASCII of at most {MAX_IPC_NAME} bytes",
        &name[..48],
        MAX_IPC_NAME + 1
    );
    assert!(e.message().contains(&why), "{e}");
    req.close(Some(LONG)).unwrap();
    src.close(Some(LONG)).unwrap();
    a.free().unwrap();
}
