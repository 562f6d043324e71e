//! A requester's cached IPC imports against sources that lie, go away and
//! come back, or want their memory back: a source's grant board never
//! widens what an import's mapping allows (a real hostile source process),
//! a disconnect gives the peer's imports back and a reconnect finds its
//! regions clean, and an unregistration takes an idle importer's cached
//! import back at once, or says which importer kept it.

mod common;
mod hostile_source;

use common::*;
use hostile_source::{Hostile, Script, LEN};
use orbite::transport::ipc::messages::{OP_READ, OP_WRITE};
use orbite::*;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

fn req(op: Op, local: u64, remote: u64, len: u64) -> Request {
    Request { op, local_addr: local, remote_addr: remote, len }
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
