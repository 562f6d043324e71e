//! Coalescing over SHM (issue 34): contiguous runs of block requests move
//! as one copy each, every request keeps its own result, and the bytes are
//! exact; runs never cross a local region or a dependency.

use orbite::*;
use std::time::Duration;

const T: Duration = Duration::from_secs(60);
const BLOCK: u64 = 4096;
/// Blocks in each of the source's two regions (and the local ones).
const BLOCKS: u64 = 64;

struct Pair {
    src: Engine,
    req: Engine,
    remote: Allocation,
    local: Allocation,
    peer: u64,
}

/// A source publishing two adjacent regions of one allocation (each word
/// holds its offset), a requester with two adjacent local regions.
fn pair(coalesce: bool) -> Pair {
    let src = Engine::from_json("{}").unwrap();
    let req = Engine::from_json(&format!(r#"{{"coalesce": {coalesce}}}"#)).unwrap();
    let len = 2 * BLOCKS * BLOCK;
    let remote = allocate_shared_host(len).unwrap();
    let local = allocate_shared_host(len).unwrap();
    // SAFETY: both allocations map `len` bytes, 8-byte aligned.
    let words = unsafe { std::slice::from_raw_parts_mut(remote.addr() as *mut u64, (len / 8) as usize) };
    for (i, w) in words.iter_mut().enumerate() {
        *w = i as u64 * 8;
    }
    for half in 0..2 {
        let at = half * BLOCKS * BLOCK;
        src.register_memory(remote.addr() + at, BLOCKS * BLOCK, Access::READ_WRITE).unwrap();
        req.register_memory(local.addr() + at, BLOCKS * BLOCK, Access::NONE).unwrap();
    }
    let peer = req.connect(&src.endpoint(), None).unwrap();
    Pair { src, req, remote, local, peer }
}

impl Pair {
    fn submit(&self, reqs: &[Request]) -> Batch {
        self.submit_on(TransportKind::Shm, reqs)
    }

    fn submit_on(&self, t: TransportKind, reqs: &[Request]) -> Batch {
        let opts = SubmitOptions { transport: Transport::Only(t), timeout: None };
        let b = self.req.submit(self.peer, reqs, opts).unwrap();
        b.wait(T).unwrap();
        assert!(b.results().iter().all(|r| r.status == Status::Ok), "{:?}", b.results());
        b
    }

    /// (copies issued, requests coalesced) on the requester's SHM.
    fn counts(&self) -> (u64, u64) {
        let s = &self.req.stats().ipc["shm"];
        (s.imports.copies_issued, s.imports.requests_coalesced)
    }

    /// Requests that moved in the TCP frame of the one before them.
    fn tcp_coalesced(&self) -> u64 {
        self.req.stats().transports["tcp"].requests_coalesced
    }

    fn local_word(&self, off: u64) -> u64 {
        // SAFETY: inside the local allocation; no copy is running.
        unsafe { std::ptr::read((self.local.addr() + off) as *const u64) }
    }

    fn remote_word(&self, off: u64) -> u64 {
        // SAFETY: inside the remote allocation; no copy is running.
        unsafe { std::ptr::read((self.remote.addr() + off) as *const u64) }
    }

    fn close(self) {
        self.req.close(Some(T)).unwrap();
        self.src.close(Some(T)).unwrap();
        self.remote.free().unwrap();
        self.local.free().unwrap();
    }
}

/// Block requests: (local block, remote block) for each, all going `op`.
fn blocks(p: &Pair, op: Op, pairs: &[(u64, u64)]) -> Vec<Request> {
    pairs
        .iter()
        .map(|&(l, r)| Request {
            op,
            local_addr: p.local.addr() + l * BLOCK,
            remote_addr: p.remote.addr() + r * BLOCK,
            len: BLOCK,
        })
        .collect()
}

/// Runs of (local start, remote start, length) as block pairs, in order.
fn runs(r: &[(u64, u64, u64)]) -> Vec<(u64, u64)> {
    r.iter().flat_map(|&(l, rm, n)| (0..n).map(move |k| (l + k, rm + k))).collect()
}

/// The KV shape in one remote region: three runs (4, 1 and 3 blocks) in
/// scattered order, each contiguous on both sides. One copy per run; every
/// block's bytes exact, READ and WRITE. Guards `coalesce::runs` and its use
/// in `IpcRequester::post` (without it: 8 copies, 0 coalesced).
#[test]
fn contiguous_runs_move_as_one_copy_each() {
    let p = pair(true);
    let layout = runs(&[(10, 40, 4), (2, 7, 1), (30, 20, 3)]);
    let (c0, k0) = p.counts();
    p.submit(&blocks(&p, Op::Read, &layout));
    assert_eq!(p.counts(), (c0 + 3, k0 + 5), "three runs of eight blocks");
    for &(l, r) in &layout {
        for w in [0, BLOCK - 8] {
            assert_eq!(p.local_word(l * BLOCK + w), r * BLOCK + w, "block {l} from {r}");
        }
    }
    // WRITE them back elsewhere: remote blocks 50.. of the first region.
    let back = runs(&[(10, 50, 4), (2, 60, 1), (30, 56, 3)]);
    let (c1, k1) = p.counts();
    p.submit(&blocks(&p, Op::Write, &back));
    assert_eq!(p.counts(), (c1 + 3, k1 + 5));
    for (&(_, from), &(_, to)) in layout.iter().zip(&back) {
        assert_eq!(p.remote_word(to * BLOCK), from * BLOCK, "remote block {to}");
        assert_eq!(p.remote_word(to * BLOCK + BLOCK - 8), from * BLOCK + BLOCK - 8);
    }
    p.close();
}

/// The smallest submission with something to coalesce, two contiguous
/// blocks, moves as one copy; a single block as one copy too. Guards the
/// bound in `local_spans` (only a submission of one request goes without
/// its local spans: with `< 3` there, the pair takes 2 copies).
#[test]
fn two_contiguous_blocks_move_as_one_copy() {
    let p = pair(true);
    let (c0, k0) = p.counts();
    let two = runs(&[(5, 9, 2)]);
    p.submit(&blocks(&p, Op::Read, &two));
    assert_eq!(p.counts(), (c0 + 1, k0 + 1), "two blocks, one run");
    let one = runs(&[(12, 3, 1)]);
    p.submit(&blocks(&p, Op::Read, &one));
    assert_eq!(p.counts(), (c0 + 2, k0 + 1), "one block");
    for &(l, r) in two.iter().chain(&one) {
        assert_eq!(p.local_word(l * BLOCK), r * BLOCK, "block {l} from {r}");
        assert_eq!(p.local_word(l * BLOCK + BLOCK - 8), r * BLOCK + BLOCK - 8);
    }
    p.close();
}

/// A run that is contiguous in memory but crosses from the first local
/// region into the second is cut there (a CUDA copy may not span two
/// allocations: the rule is one local region per run). Guards the span
/// check in `coalesce::runs` (without it: 1 copy).
#[test]
fn a_run_is_cut_at_a_local_region_boundary() {
    let p = pair(true);
    // Local blocks 62..66 cross the regions' boundary at 64; remote 0..4
    // lie in one region.
    let layout = runs(&[(62, 0, 4)]);
    let (c0, k0) = p.counts();
    p.submit(&blocks(&p, Op::Read, &layout));
    assert_eq!(p.counts(), (c0 + 2, k0 + 2));
    for &(l, r) in &layout {
        assert_eq!(p.local_word(l * BLOCK), r * BLOCK);
    }
    p.close();
}

/// Dependent requests are never merged: a WRITE chain where each block is
/// read again by the next request keeps one copy per request, in order.
/// Guards the `CopyPlan::Independent` condition in `IpcRequester::post`
/// (merged, the two WRITEs of one remote run would move as one).
#[test]
fn dependent_requests_keep_one_copy_each() {
    let p = pair(true);
    // Local block k holds remote block k's words.
    p.submit(&blocks(&p, Op::Read, &runs(&[(0, 0, 3)])));
    // WRITE local 0..2 to remote 10..12, then READ remote 11..13 to local
    // 1..3: the READ's local range overlaps a WRITE's source and its
    // remote range overlaps a WRITE's destination.
    let mut reqs = blocks(&p, Op::Write, &runs(&[(0, 10, 2)]));
    reqs.extend(blocks(&p, Op::Read, &runs(&[(1, 11, 2)])));
    let (c0, k0) = p.counts();
    p.submit(&reqs);
    assert_eq!(p.counts(), (c0 + 4, k0));
    // In order: remote 11 got local block 1 (remote block 1's words),
    // local 1 then read them back; local 2 read remote 12 (untouched).
    // Out of order, local 1 would hold remote block 11's words.
    assert_eq!(p.remote_word(11 * BLOCK), BLOCK);
    assert_eq!(p.local_word(BLOCK), BLOCK);
    assert_eq!(p.local_word(2 * BLOCK), 12 * BLOCK);
    p.close();
}

/// `coalesce: false` issues one copy per request and moves the same bytes.
/// Guards the config switch (`IpcRequester.coalesce`).
#[test]
fn coalescing_off_issues_a_copy_per_request() {
    let p = pair(false);
    let layout = runs(&[(10, 40, 4), (30, 20, 3)]);
    p.submit(&blocks(&p, Op::Read, &layout));
    assert_eq!(p.counts(), (7, 0));
    for &(l, r) in &layout {
        assert_eq!(p.local_word(l * BLOCK), r * BLOCK);
    }
    assert!(!Engine::from_json(r#"{"coalesce": false}"#).unwrap().config().coalesce);
    p.close();
}

/// TCP: READs and WRITEs in runs move as one frame each (three frames for
/// eight requests), every block exact. Guards the unit loop of
/// `engine/submit.rs` `enqueue_tcp` and `transport/tcp/chunk.rs`
/// `Record::finish` giving each member the unit's outcome (without it,
/// seven requests never end).
#[test]
fn tcp_reads_and_writes_in_runs_move_as_one_frame_each() {
    let p = pair(true);
    let layout = runs(&[(10, 40, 4), (2, 7, 1), (30, 20, 3)]);
    let k0 = p.tcp_coalesced();
    let b = p.submit_on(TransportKind::Tcp, &blocks(&p, Op::Read, &layout));
    assert_eq!(b.results(), vec![RequestResult { status: Status::Ok, remote_effect: RemoteEffect::None }; 8]);
    assert_eq!(p.tcp_coalesced(), k0 + 5);
    for &(l, r) in &layout {
        for w in [0, BLOCK - 8] {
            assert_eq!(p.local_word(l * BLOCK + w), r * BLOCK + w, "block {l} from {r}");
        }
    }
    let back = runs(&[(10, 50, 4), (2, 60, 1), (30, 56, 3)]);
    let b = p.submit_on(TransportKind::Tcp, &blocks(&p, Op::Write, &back));
    assert_eq!(b.results(), vec![RequestResult { status: Status::Ok, remote_effect: RemoteEffect::Applied }; 8]);
    assert_eq!(p.tcp_coalesced(), k0 + 10, "WRITE runs move as one frame each too");
    for (&(_, from), &(_, to)) in layout.iter().zip(&back) {
        assert_eq!(p.remote_word(to * BLOCK + BLOCK - 8), from * BLOCK + BLOCK - 8, "remote block {to}");
    }
    let st = p.req.stats().transports["tcp"].clone();
    assert_eq!((st.requests_completed, st.requests_failed), (16, 0));
    p.close();
}

/// TCP: a run crossing from one remote region into the next, or from one
/// local region into the next, is cut there (two frames for four READs,
/// each time). Guards the region and lease conditions of `enqueue_tcp`'s
/// unit loop (without them: one frame, and a source refuses a range
/// outside one region).
#[test]
fn a_tcp_run_is_cut_at_either_sides_region_boundary() {
    let p = pair(true);
    for layout in [runs(&[(10, 62, 4)]), runs(&[(62, 0, 4)])] {
        let k0 = p.tcp_coalesced();
        p.submit_on(TransportKind::Tcp, &blocks(&p, Op::Read, &layout));
        assert_eq!(p.tcp_coalesced(), k0 + 2, "{layout:?}");
        for &(l, r) in &layout {
            assert_eq!(p.local_word(l * BLOCK), r * BLOCK);
        }
    }
    p.close();
}

/// `coalesce: false` also keeps TCP at one frame per request.
#[test]
fn tcp_coalescing_off_sends_a_frame_per_request() {
    let p = pair(false);
    p.submit_on(TransportKind::Tcp, &blocks(&p, Op::Read, &runs(&[(10, 40, 4)])));
    assert_eq!(p.tcp_coalesced(), 0);
    assert_eq!(p.local_word(13 * BLOCK), 43 * BLOCK);
    p.close();
}
