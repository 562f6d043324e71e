//! The planner's tests: plans made from requests, leases and a Describe
//! with no engine, no peer and no I/O.

use super::*;
use crate::control::identity::Identity;
use crate::control::message::Describe;
use crate::error::Status;
use crate::memory::region::RegionTable;
use crate::memory::Access;
use crate::transfer::Op;

fn region(id: u64, addr: u64, len: u64) -> RegionInfo {
    RegionInfo { id, epoch: 1, addr, len, access: Access::READ_WRITE, kind: MemoryKind::SharedHost }
}

/// A peer publishing a shared region (id 1 at 0x1000_0000) and a
/// host region (id 2 at 0x2000_0000), 64 KiB each; one local host
/// region of 64 KiB at 0x10_0000.
fn peer() -> (Describe, RegionTable) {
    let mut d = Describe::bare(Identity::gone());
    let host = RegionInfo { kind: MemoryKind::Host, ..region(2, 0x2000_0000, 0x1_0000) };
    d.regions = vec![region(1, 0x1000_0000, 0x1_0000), host];
    let table = RegionTable::default();
    table.register(0x10_0000, 0x1_0000, Access::READ_WRITE).unwrap();
    (d, table)
}

/// READs of 0x100 bytes: (remote address, local block).
fn reads(shape: &[(u64, u64)]) -> Vec<Request> {
    let read = |&(remote_addr, block): &(u64, u64)| Request {
        op: Op::Read,
        local_addr: 0x10_0000 + block * 0x100,
        remote_addr,
        len: 0x100,
    };
    shape.iter().map(read).collect()
}

/// The plan's transport, the indices on it and those split to TCP.
fn planned(reqs: &[Request], d: &Describe, table: &RegionTable, policy: &Policy<'_>) -> Result<Summary> {
    let leases = vec![Arc::new(table.lease(0x10_0000, 0x1_0000).unwrap())];
    let index = RegionIndex::new(Arc::new(d.clone()));
    let (items, missing) = resolve(reqs, &leases, &vec![0; reqs.len()], &index);
    let mut p = plan(7, items, missing, policy)?;
    let refused = p.take_refused(7).into_iter().map(|(i, e)| (i, e.status())).collect();
    let at = |v: &[Item<'_>]| v.iter().map(Item::at).collect();
    Ok(Summary { kind: p.kind, main: at(&p.main), tcp: at(&p.tcp), refused })
}

#[derive(Debug, PartialEq)]
struct Summary {
    kind: TransportKind,
    main: Vec<usize>,
    tcp: Vec<usize>,
    refused: Vec<(usize, Status)>,
}

fn auto<'p>(order: &'p [TransportKind], why_not: &'p dyn Fn(TransportKind) -> Option<String>) -> Policy<'p> {
    Policy { transport: Transport::Auto, order, shm_uncached: false, egm_both: false, why_not }
}

const SHM_TCP: &[TransportKind] = &[TransportKind::Shm, TransportKind::Tcp];

/// Guards `split` and `select`'s AUTO order: independent requests to a
/// shared and a host region split, SHM taking the shared ones and TCP
/// the others; once two of them read into the same local block they
/// are dependent and all go over TCP; with SHM uncached, TCP takes a
/// submission SHM alone could carry.
#[test]
fn auto_splits_independent_requests_between_shm_and_tcp() {
    let (d, table) = peer();
    let reach = |_: TransportKind| None;
    let mixed = reads(&[(0x1000_0000, 0), (0x2000_0000, 1), (0x1000_0100, 2), (0x2000_0100, 3)]);
    let s = planned(&mixed, &d, &table, &auto(SHM_TCP, &reach)).unwrap();
    let want = Summary { kind: TransportKind::Shm, main: vec![0, 2], tcp: vec![1, 3], refused: vec![] };
    assert_eq!(s, want);
    let dependent = reads(&[(0x1000_0000, 0), (0x2000_0000, 0)]);
    let s = planned(&dependent, &d, &table, &auto(SHM_TCP, &reach)).unwrap();
    assert_eq!(s, Summary { kind: TransportKind::Tcp, main: vec![0, 1], tcp: vec![], refused: vec![] });
    let shared = reads(&[(0x1000_0000, 0), (0x1000_0100, 1)]);
    let s = planned(&shared, &d, &table, &auto(SHM_TCP, &reach)).unwrap();
    assert_eq!(s.kind, TransportKind::Shm);
    let uncached = Policy { shm_uncached: true, ..auto(SHM_TCP, &reach) };
    assert_eq!(planned(&shared, &d, &table, &uncached).unwrap().kind, TransportKind::Tcp);
    // SHM unreachable: no split, TCP for all.
    let down = |_: TransportKind| Some("no link".to_string());
    let s = planned(&mixed, &d, &table, &auto(SHM_TCP, &down)).unwrap();
    assert_eq!((s.kind, s.tcp.len()), (TransportKind::Tcp, 0));
}

/// Guards `select`'s forced branch: a forced SHM that cannot reach the
/// peer is UNAVAILABLE with the reason; one that reaches it but cannot
/// carry request 1 (the peer's host memory) is NOT_SUPPORTED naming
/// that request; with no TCP in the policy and a request only TCP
/// carries, AUTO is UNAVAILABLE.
#[test]
fn a_forced_transport_refuses_what_it_cannot_carry() {
    let (d, table) = peer();
    let reqs = reads(&[(0x1000_0000, 0), (0x2000_0000, 1)]);
    let down = |_: TransportKind| Some("no link".to_string());
    let forced = |why_not| Policy { transport: Transport::Only(TransportKind::Shm), ..auto(SHM_TCP, why_not) };
    let Err(e) = planned(&reqs, &d, &table, &forced(&down)) else { panic!("forced over no link") };
    assert_eq!(e.status(), Status::Unavailable);
    assert!(e.message().contains("transport shm is not available to peer 7: no link"), "{e}");
    let reach = |_: TransportKind| None;
    let Err(e) = planned(&reqs, &d, &table, &forced(&reach)) else { panic!("forced misfit") };
    assert_eq!(e.status(), Status::NotSupported);
    assert!(e.message().starts_with("request 1 cannot go over the forced transport shm"), "{e}");
    let Err(e) = planned(&reqs, &d, &table, &auto(&[TransportKind::Shm], &reach)) else { panic!("no tcp") };
    assert_eq!(e.status(), Status::Unavailable);
}

/// Guards `Plan::take_refused`: a request naming no region is NOT_FOUND
/// and one crossing the end of its region OUT_OF_RANGE, both out of
/// the part; the others stay on it, in order. Also `resolve`'s shortcut
/// through the region the previous request named (`g.contains(
/// r.remote_addr, r.len.max(1))`): when the crossing request is the
/// submission's only bad one, it is still found out (were the shortcut
/// to check its start alone, nothing would say there is one to refuse).
#[test]
fn requests_outside_every_region_are_refused_one_by_one() {
    let (d, table) = peer();
    let mut reqs = reads(&[(0x1000_0000, 0), (0x3000_0000, 1), (0x1000_0100, 2), (0x1000_ff80, 3)]);
    reqs[3].len = 0x100;
    let reach = |_: TransportKind| None;
    let s = planned(&reqs, &d, &table, &auto(SHM_TCP, &reach)).unwrap();
    let refused = vec![(1, Status::NotFound), (3, Status::OutOfRange)];
    assert_eq!(s, Summary { kind: TransportKind::Shm, main: vec![0, 2], tcp: vec![], refused });
    reqs.remove(1);
    let s = planned(&reqs, &d, &table, &auto(SHM_TCP, &reach)).unwrap();
    let refused = vec![(2, Status::OutOfRange)];
    assert_eq!(s, Summary { kind: TransportKind::Shm, main: vec![0, 1], tcp: vec![], refused });
}

/// Guards `carries` (a direct route's check when opened).
#[test]
fn each_ipc_transport_carries_only_the_memory_it_maps() {
    assert!(carries(TransportKind::Shm, MemoryKind::SharedHost, false));
    assert!(!carries(TransportKind::Shm, MemoryKind::Host, false));
    assert!(!carries(TransportKind::Shm, MemoryKind::CudaIpc, false));
    assert!(carries(TransportKind::Nvlink, MemoryKind::CudaIpc, false));
    assert!(!carries(TransportKind::Nvlink, MemoryKind::SharedHost, false));
    assert!(!carries(TransportKind::Mnnvl, MemoryKind::Egm, false), "EGM needs both engines' opt-in");
}
