//! Submissions between two engines of this process, looked at from the
//! inside: what the planner read.

use super::*;
use crate::engine::config::EngineConfig;
use crate::memory::Access;
use crate::transfer::Op;
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

/// The peer's Describe and its region index are published once per
/// Describe, not per submission: two submissions plan from one version
/// (one `Arc`). A region the peer registers after the connection is read
/// by the next submission (exact bytes), and the Describe naming it is
/// published with its index (a new version, finding the region), which
/// the submissions after it plan from. Guards `c.published == now` in
/// `publish` of `tcp/requester.rs` (without it every release of the
/// connection republishes).
#[test]
fn submissions_plan_from_the_describe_published_once_per_describe() {
    let src = Engine::new(EngineConfig::default()).unwrap();
    let req = Engine::new(EngineConfig::default()).unwrap();
    let mut first_region = vec![7u8; 4096];
    let mut later_region: Vec<u8> = (0..4096).map(|i| (i % 251) as u8).collect();
    let (a, b) = (first_region.as_mut_ptr() as u64, later_region.as_mut_ptr() as u64);
    src.register_memory(a, 4096, Access::READ_WRITE).unwrap();
    let mut local = vec![0u8; 4096];
    let l = local.as_mut_ptr() as u64;
    req.register_memory(l, 4096, Access::NONE).unwrap();
    let peer = req.connect(&src.endpoint(), Some(T)).unwrap();
    let p = req.peer(peer).unwrap();
    let tcp = SubmitOptions { transport: Transport::Only(TransportKind::Tcp), timeout: Some(T) };
    let read = |remote_addr| {
        let r = Request { op: Op::Read, local_addr: l, remote_addr, len: 4096 };
        req.submit(peer, &[r], tcp).unwrap().wait(T).unwrap();
    };
    let published = p.describe.load();
    read(a);
    read(a);
    assert!(Arc::ptr_eq(&published, &p.describe.load()), "republished by a submission");
    assert_eq!(local, first_region);

    src.register_memory(b, 4096, Access::READ_WRITE).unwrap();
    read(b);
    assert_eq!(local, later_region);
    let fresh = p.describe.load();
    assert!(!Arc::ptr_eq(&published, &fresh), "the Describe naming the new region was not published");
    let index = (*fresh).as_ref().unwrap_or_else(|e| panic!("the connection ended: {e}"));
    assert_eq!(index.find_slot(b).map(|(r, _)| (r.addr, r.len)), Some((b, 4096)));
    read(b);
    assert!(Arc::ptr_eq(&fresh, &p.describe.load()), "republished by a submission");
    req.close(Some(T)).unwrap();
    src.close(Some(T)).unwrap();
}
