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
    pair_with(&format!(r#"{{"coalesce": {coalesce}}}"#))
}

/// [`pair`] with the requester's configuration `cfg`.
fn pair_with(cfg: &str) -> Pair {
    let src = Engine::from_json("{}").unwrap();
    let req = Engine::from_json(cfg).unwrap();
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

    /// TCP requests the source served (one per frame it read).
    fn tcp_served(&self) -> u64 {
        self.src.stats().transports["tcp"].served_requests
    }

    /// Bytes the source served over TCP.
    fn tcp_served_bytes(&self) -> u64 {
        self.src.stats().transports["tcp"].served_bytes
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
/// `transport/tcp/executor.rs` `TcpExecutor::run` and `transport/tcp/chunk.rs`
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
/// each time). Guards the region and lease conditions of `TcpExecutor::run`'s
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

/// Requests (local block, remote block) in order, `op` each, of `blocks`
/// blocks each.
fn sized(p: &Pair, op: Op, blocks: u64, pairs: &[(u64, u64)]) -> Vec<Request> {
    pairs
        .iter()
        .map(|&(l, r)| Request {
            op,
            local_addr: p.local.addr() + l * BLOCK,
            remote_addr: p.remote.addr() + r * BLOCK,
            len: blocks * BLOCK,
        })
        .collect()
}

/// TCP: two requests that follow each other on one side only never join
/// a run: local blocks that follow each other over remote blocks that do
/// not (a gap, or the same block again), and the reverse, READ and
/// WRITE. Each moves in its own frame and every block holds exactly its
/// bytes. Guards the `==` of the local and the remote condition of the
/// TCP unit loop (`transport/tcp/executor.rs` `units`: with `>=` either way,
/// the run moves the blocks in between; with `<=`, the overlapping ones).
#[test]
fn a_tcp_run_needs_both_sides_to_follow_on() {
    let p = pair(true);
    let tcp = Transport::Only(TransportKind::Tcp);
    let go = |reqs: &[Request]| {
        let (k0, s0) = (p.tcp_coalesced(), p.tcp_served());
        let b = p.req.submit(p.peer, reqs, SubmitOptions { transport: tcp, timeout: None }).unwrap();
        b.wait(T).unwrap();
        let effect = if reqs[0].op == Op::Write { RemoteEffect::Applied } else { RemoteEffect::None };
        assert_eq!(b.results(), vec![RequestResult { status: Status::Ok, remote_effect: effect }; reqs.len()]);
        assert_eq!((p.tcp_coalesced() - k0, p.tcp_served() - s0), (0, 2), "one frame each: {reqs:?}");
    };
    // READs: (local, remote) blocks; the local block that the later
    // request names holds its remote block.
    let reads = [
        [(10, 40), (11, 45)], // local follows on, remote skips four blocks
        [(20, 50), (25, 51)], // remote follows on, local skips four blocks
        [(30, 55), (31, 55)], // local follows on, remote reads its block again
        [(36, 57), (36, 58)], // remote follows on, local is read into again
    ];
    for pairs in reads {
        go(&blocks(&p, Op::Read, &pairs));
        for (l, r) in pairs {
            if (l, r) == (36, 57) {
                continue; // read over by the next request
            }
            for w in [0, BLOCK - 8] {
                assert_eq!(p.local_word(l * BLOCK + w), r * BLOCK + w, "{pairs:?}: local block {l} from {r}");
            }
        }
    }
    // WRITEs from those blocks (local 10, 11, 20 and 25 hold remote 40,
    // 45, 50 and 51) to the second remote region.
    let writes = [
        [(10, 104), (11, 110)], // local follows on, remote skips
        [(20, 100), (25, 101)], // remote follows on, local skips
        [(10, 112), (11, 112)], // local follows on, remote written again
        [(20, 116), (20, 117)], // remote follows on, local sent again
    ];
    for pairs in writes {
        go(&blocks(&p, Op::Write, &pairs));
    }
    for (to, from) in [(104, 40), (110, 45), (100, 50), (101, 51), (112, 45), (116, 50), (117, 50)] {
        for w in [0, BLOCK - 8] {
            assert_eq!(p.remote_word(to * BLOCK + w), from * BLOCK + w, "remote block {to} holds block {from}'s words");
        }
    }
    // The blocks skipped stayed as they were.
    assert_eq!(p.remote_word(105 * BLOCK), 105 * BLOCK);
    assert_eq!(p.local_word(21 * BLOCK), 0);
    p.close();
}

/// TCP: a run of contiguous requests is bounded by `max_transfer_bytes`
/// (a request that would take the run past it starts the next), and a
/// request larger than it moves in pieces of it. With a bound of three
/// blocks, four contiguous READs of two blocks move in four frames (none
/// coalesced), a READ of eight blocks in three; the same for WRITEs; every
/// block exact. Guards the run's bound in `transport/tcp/executor.rs` `units`
/// (`len + n.req.len <= max_chunk`: without it, two pairs of requests
/// join, 2 coalesced) and each piece's bound (`.min(max_chunk)`).
#[test]
fn a_tcp_run_stops_at_the_chunk_bound() {
    let p = pair_with(&format!(r#"{{"coalesce": true, "max_transfer_bytes": {}}}"#, 3 * BLOCK));
    let tcp = Transport::Only(TransportKind::Tcp);
    for op in [Op::Read, Op::Write] {
        // Four contiguous requests of two blocks, then one of eight.
        let (l0, r0) = if op == Op::Read { (0, 10) } else { (0, 80) };
        let mut reqs = sized(&p, op, 2, &[(l0, r0), (l0 + 2, r0 + 2), (l0 + 4, r0 + 4), (l0 + 6, r0 + 6)]);
        reqs.extend(sized(&p, op, 8, &[(l0 + 20, r0 + 20)]));
        let (k0, s0, b0) = (p.tcp_coalesced(), p.tcp_served(), p.tcp_served_bytes());
        let b = p.req.submit(p.peer, &reqs, SubmitOptions { transport: tcp, timeout: None }).unwrap();
        b.wait(T).unwrap();
        assert!(b.results().iter().all(|r| r.status == Status::Ok), "{op:?}: {:?}", b.results());
        assert_eq!((p.tcp_coalesced() - k0, p.tcp_served() - s0), (0, 4 + 3), "{op:?}: frames of at most 3 blocks");
        assert_eq!(p.tcp_served_bytes() - b0, 16 * BLOCK, "{op:?}: each byte once");
        let st = p.req.stats().transports["tcp"].clone();
        assert_eq!(st.bytes_failed, 0);
        for k in (0..8).chain(20..28) {
            let (l, r) = (l0 + k, r0 + k);
            for w in [0, BLOCK - 8] {
                let (got, want) = match op {
                    Op::Read => (p.local_word(l * BLOCK + w), r * BLOCK + w),
                    Op::Write => (p.remote_word(r * BLOCK + w), (10 + k) * BLOCK + w),
                };
                assert_eq!(got, want, "{op:?} block {k}");
            }
        }
    }
    p.close();
}

/// AUTO splits a submission between SHM and TCP: requests 0 and 2 (the
/// source's plain host memory, which SHM cannot map) go over TCP, request
/// 1 over SHM. Requests 0 and 2 follow each other on both sides, but not
/// in the submission: they move in two frames, and each request ends once,
/// with its own bytes and its own transport. Guards the order condition of
/// the TCP unit loop (`transport/tcp/executor.rs` `units`, `n.at() == i +
/// count`: with `>=`, the run of 0 and 2 ends requests 0 and 1, and
/// request 2 never ends).
#[test]
fn a_tcp_run_never_joins_a_request_another_transport_carries() {
    let p = pair_with(r#"{"coalesce": true, "transport_policy": ["shm", "tcp"]}"#);
    // The source's plain host memory: each word holds 2^40 + its offset.
    let mut host: Vec<u64> = (0..2 * BLOCK / 8).map(|i| (1 << 40) + i * 8).collect();
    let h = host.as_mut_ptr() as u64;
    p.src.register_memory(h, 2 * BLOCK, Access::READ_WRITE).unwrap();
    let l = |k: u64| p.local.addr() + k * BLOCK;
    let reqs = [
        Request { op: Op::Read, local_addr: l(10), remote_addr: h, len: BLOCK },
        Request { op: Op::Read, local_addr: l(5), remote_addr: p.remote.addr() + 3 * BLOCK, len: BLOCK },
        Request { op: Op::Read, local_addr: l(11), remote_addr: h + BLOCK, len: BLOCK },
    ];
    let (k0, s0) = (p.tcp_coalesced(), p.tcp_served());
    let b = p.req.submit(p.peer, &reqs, SubmitOptions { transport: Transport::Auto, timeout: Some(T) }).unwrap();
    b.wait(T).unwrap();
    assert_eq!(b.results(), vec![RequestResult { status: Status::Ok, remote_effect: RemoteEffect::None }; 3]);
    let kinds: Vec<_> = (0..3).map(|i| b.transport(i).unwrap()).collect();
    assert_eq!(kinds, [Some(TransportKind::Tcp), Some(TransportKind::Shm), Some(TransportKind::Tcp)]);
    assert_eq!((p.tcp_coalesced() - k0, p.tcp_served() - s0), (0, 2), "two frames");
    let st = p.req.stats();
    let (tcp, shm) = (&st.transports["tcp"], &st.transports["shm"]);
    assert_eq!((tcp.requests_completed, shm.requests_completed), (2, 1));
    for (k, off) in [(10, 0), (11, BLOCK)] {
        for w in [0, BLOCK - 8] {
            assert_eq!(p.local_word(k * BLOCK + w), (1 << 40) + off + w, "local block {k}");
        }
    }
    assert_eq!(p.local_word(5 * BLOCK), 3 * BLOCK);
    p.close();
    drop(host);
}
