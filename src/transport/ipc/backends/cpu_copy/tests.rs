//! Unit tests of the copy pool.

use super::kernel::run;
use super::pieces::{guided, shares, Pieces};
use super::policy::*;
use super::pool::*;
use super::*;
use crate::error::Error;
use std::sync::atomic::{AtomicUsize, Ordering};

#[test]
fn shares_cover_every_byte_once_in_order() {
    let ops = [CopyOp { dst: 0, src: 1000, len: 10 }, CopyOp { dst: 100, src: 2000, len: 7 }];
    let s = shares(ops.iter().copied(), 3);
    assert_eq!(s.len(), 3);
    let piece = |i| s.get(i).unwrap().iter().map(|o: &CopyOp| (o.dst, o.src, o.len)).collect::<Vec<_>>();
    assert_eq!(piece(0), vec![(0, 1000, 6)]);
    assert_eq!(piece(1), vec![(6, 1006, 4), (100, 2000, 2)]);
    assert_eq!(piece(2), vec![(102, 2002, 5)]);
    assert!(s.get(3).is_none());
}

/// The pieces of `p` as (dst, src, len) lists.
fn listed(p: &Pieces) -> Vec<Vec<(u64, u64, u64)>> {
    (0..p.len()).map(|i| p.get(i).unwrap().iter().map(|o| (o.dst, o.src, o.len)).collect()).collect()
}

/// Guards `guided`: each piece a copier's share of what the pieces
/// before it left, rounded up to whole pages, at least the minimum, the
/// last what is left; ops cut exactly at the piece boundaries.
#[test]
fn guided_pieces_halve_what_is_left_in_whole_pages_down_to_the_minimum() {
    const K: u64 = 1024;
    // A batch of 16 x 64 KiB blocks, two copiers: 512, 256, 128, 64,
    // 32 and 32 KiB, each block whole in one piece.
    let ops: Vec<CopyOp> =
        (0..16).map(|b| CopyOp { dst: b * 100 * K, src: (1 << 40) + b * 64 * K, len: 64 * K }).collect();
    let p = guided(&ops, 16 * 64 * K, 2, 32 * K);
    let sizes: Vec<u64> = (0..p.len()).map(|i| p.get(i).unwrap().iter().map(|o| o.len).sum()).collect();
    assert_eq!(sizes, [512 * K, 256 * K, 128 * K, 64 * K, 32 * K, 32 * K]);
    assert_eq!(p.each, 512 * K);
    let pieces = listed(&p);
    let block = |b: u64| (b * 100 * K, (1 << 40) + b * 64 * K, 64 * K);
    assert_eq!(pieces[0], (0..8).map(block).collect::<Vec<_>>());
    assert_eq!(pieces[1], (8..12).map(block).collect::<Vec<_>>());
    assert_eq!(pieces[3], [block(14)]);
    // The last block cut in two halves of 32 KiB.
    assert_eq!(pieces[4], [(15 * 100 * K, (1 << 40) + 15 * 64 * K, 32 * K)]);
    assert_eq!(pieces[5], [(15 * 100 * K + 32 * K, (1 << 40) + 15 * 64 * K + 32 * K, 32 * K)]);
    // 100 000 bytes in one op: halves rounded up to pages (50 000 ->
    // 53 248), a page at least, the rest last; cut where they end.
    let one = [CopyOp { dst: 0, src: 1 << 40, len: 100_000 }];
    let p = guided(&one, 100_000, 2, 4096);
    let at = |d: u64, len: u64| (d, (1 << 40) + d, len);
    assert_eq!(
        listed(&p),
        [[at(0, 53_248)], [at(53_248, 24_576)], [at(77_824, 12_288)], [at(90_112, 8192)], [at(98_304, 1696)]]
    );
    // Three copiers take a third each time; a 64 KiB group for two is
    // two pieces of 32 KiB.
    let p = guided(&one, 100_000, 3, 4096);
    assert_eq!(listed(&p)[..2], [[at(0, 36_864)], [at(36_864, 24_576)]]);
    let small = [CopyOp { dst: 0, src: 1 << 40, len: 64 * K }];
    assert_eq!(listed(&guided(&small, 64 * K, 2, 32 * K)), [[at(0, 32 * K)], [at(32 * K, 32 * K)]]);
}

#[test]
fn a_synchronous_copy_takes_one_copier_per_core() {
    // The caller and the helpers: as many copiers as pool threads.
    assert_eq!(helpers(2), 1);
    assert_eq!(helpers(8), 7);
    assert_eq!(helpers(1), 0);
}

/// Source and target of `blocks` 4 KiB blocks, and the ops between
/// them in reverse block order.
fn blocks(src: &[u8], dst: &mut [u8]) -> Vec<CopyOp> {
    (0..src.len() / 4096)
        .rev()
        .map(|b| CopyOp {
            dst: dst.as_mut_ptr() as u64 + (b * 4096) as u64,
            src: src.as_ptr() as u64 + (b * 4096) as u64,
            len: 4096,
        })
        .collect()
}

#[test]
fn a_group_whose_helpers_never_come_is_copied_by_its_caller() {
    let src: Vec<u8> = (0..64 * 4096).map(|i| (i % 251) as u8).collect();
    let mut dst = vec![0u8; src.len()];
    let job = Job::new(blocks(&src, &mut dst).into_iter(), 8, false, None);
    assert_eq!(job.pieces.len(), 8);
    // No copy thread took the job: the caller claims every piece and
    // does not wait for anyone.
    job.help();
    assert!(job.is_done());
    job.wait();
    assert!(dst == src);
    // A helper that wakes after finds nothing left to claim.
    job.help();
    assert_eq!(job.done.load(Ordering::Acquire), 8);
}

#[test]
fn groups_are_cut_into_pieces_of_64_kib_within_bounds() {
    assert_eq!(piece_count(1 << 20, 2), 16);
    assert_eq!(piece_count((1 << 20) + 1, 2), 17);
    // Never fewer pieces than copiers, nor more than MAX_PIECES.
    assert_eq!(piece_count(4096, 2), 2);
    assert_eq!(piece_count(1 << 30, 2), MAX_PIECES);
}

#[test]
fn the_timed_first_piece_copies_exactly_its_bytes_and_leaves_the_rest() {
    let src: Vec<u8> = (0..12).collect();
    let mut dst = vec![0u8; 12];
    let (s, d) = (src.as_ptr() as u64, dst.as_mut_ptr() as u64);
    let ops = [
        CopyOp { dst: d, src: s, len: 3 },
        CopyOp { dst: d + 3, src: s + 3, len: 5 },
        CopyOp { dst: d + 8, src: s + 8, len: 4 },
    ];
    // 6 bytes: the first op whole, the second cut after 3 of its 5.
    let rest = copy_prefix(&ops, 6, false);
    assert_eq!(dst, [0, 1, 2, 3, 4, 5, 0, 0, 0, 0, 0, 0]);
    let left: Vec<_> = rest.ops().map(|o| (o.dst - d, o.src - s, o.len)).collect();
    assert_eq!(left, [(6, 6, 2), (8, 8, 4)]);
    copy_rest(&rest, 6, &[], false);
    assert!(dst == src);
    // A mark at an op's end cuts nothing; past the group, nothing is left.
    assert_eq!(copy_prefix(&ops, 3, false).ops().map(|o| o.len).collect::<Vec<_>>(), [5, 4]);
    assert_eq!(copy_prefix(&ops, 100, false).ops().count(), 0);
}

#[test]
fn the_rest_of_a_group_moves_whole_with_helpers_or_without() {
    let src: Vec<u8> = (0..256 * 4096).map(|i| (i * 13 % 241) as u8).collect();
    let helpers: Vec<&Worker> = pool().workers.iter().collect();
    for (with, stream) in [(&helpers[..], false), (&[], false), (&helpers[..], true), (&[], true)] {
        let mut dst = vec![0u8; src.len()];
        let ops = blocks(&src, &mut dst);
        let rest = copy_prefix(&ops, PIECE_BYTES, stream);
        copy_rest(&rest, (256 - 16) * 4096, with, stream);
        assert!(dst == src, "with {} helpers, streaming {stream}", with.len());
    }
}

#[test]
fn helpers_are_woken_only_for_groups_slower_than_their_wake_up() {
    let us = std::time::Duration::from_micros;
    // 1 MiB in cache: 64 KiB pieces of 1.8 us, 15 left (27 us).
    assert!(!worth_helpers(us(2), 15));
    // 1 MiB from memory: pieces of 6 us, 15 left (90 us).
    assert!(worth_helpers(us(6), 15));
    assert!(!worth_helpers(us(6), 0));
}

/// Guards `from_memory`: the rest of a group whose first piece came
/// from memory streams; one from a cache does not.
#[test]
fn a_group_streams_the_rest_when_its_first_piece_came_from_memory() {
    let us = std::time::Duration::from_micros;
    // 64 KiB in cache: 1.8 us here; from memory (1 GiB buffers): 6-9 us.
    assert!(!from_memory(us(2)));
    assert!(from_memory(us(6)));
    assert!(!from_memory(FROM_MEMORY_PIECE));
}

#[test]
fn a_started_group_moves_every_byte() {
    let src: Vec<u8> = (0..1024 * 4096).map(|i| (i * 7 % 253) as u8).collect();
    let mut dst = vec![0u8; src.len()];
    let pending = start(&blocks(&src, &mut dst));
    pending.wait();
    assert!(pending.is_done());
    assert!(dst == src);
}

#[test]
fn a_poller_copies_the_pieces_of_a_started_group_no_thread_took() {
    let src: Vec<u8> = (0..64 * 4096).map(|i| (i * 5 % 239) as u8).collect();
    let mut dst = vec![0u8; src.len()];
    let pending = start_unattended(&blocks(&src, &mut dst));
    let mut lent = 0;
    while !pending.is_done() {
        // Another test's started group may come first; ours is listed
        // until its last piece is claimed, so some piece always is.
        assert!(assist(), "a listed group with pieces unclaimed, yet nothing to copy");
        lent += 1;
        assert!(lent < 10_000);
    }
    assert!(dst == src);
}

#[test]
fn polls_copy_pieces_of_groups_up_to_256_mib_only() {
    // Shares only: nothing is copied.
    let group = |len: u64| Job::new(std::iter::once(CopyOp { dst: 0, src: 0, len }), piece_count(len, 2), false, None);
    assert!(assistable(&group(16 << 20)));
    assert!(assistable(&group(256 << 20)), "pieces of 1 MiB");
    assert!(!assistable(&group((256 << 20) + 256)), "pieces over 1 MiB");
}

/// Guards `stream_copy` (head to the aligned destination, 64-byte
/// body, tail) and `run`'s test that the two ranges lie apart.
#[test]
fn streamed_copies_move_exactly_their_bytes_at_any_alignment() {
    let src: Vec<u8> = (0..8192u32).map(|i| (i * 7 % 251) as u8 + 1).collect();
    for len in [64usize, 65, 127, 128, 1000, 4096 + 13] {
        for (d_off, s_off) in [(0, 0), (1, 0), (0, 3), (15, 9), (16, 1), (33, 17)] {
            let mut dst = vec![0u8; 8192 + 64];
            let op = CopyOp { dst: dst.as_mut_ptr() as u64 + d_off, src: src.as_ptr() as u64 + s_off, len: len as u64 };
            run(&[op], true);
            let (d, s) = (d_off as usize, s_off as usize);
            assert!(dst[..d].iter().all(|&b| b == 0), "len {len}, offsets {d_off}/{s_off}: bytes before");
            assert!(dst[d..d + len] == src[s..s + len], "len {len}, offsets {d_off}/{s_off}");
            assert!(dst[d + len..].iter().all(|&b| b == 0), "len {len}, offsets {d_off}/{s_off}: bytes after");
        }
    }
    // Overlapping ranges (8 bytes apart in one buffer) move as memmove
    // would, forward and backward.
    for forward in [true, false] {
        let mut buf: Vec<u8> = (0..4096u32).map(|i| (i % 253) as u8).collect();
        let want = {
            let mut w = buf.clone();
            if forward {
                w.copy_within(0..4000, 8)
            } else {
                w.copy_within(8..4008, 0)
            }
            w
        };
        let base = buf.as_mut_ptr() as u64;
        let op = match forward {
            true => CopyOp { dst: base + 8, src: base, len: 4000 },
            false => CopyOp { dst: base, src: base + 8, len: 4000 },
        };
        run(&[op], true);
        assert!(buf == want, "overlapping, forward {forward}");
    }
}

#[test]
fn a_streamed_parallel_copy_moves_every_byte() {
    let n = STREAM_MIN_BYTES as usize + 4097;
    let src: Vec<u8> = (0..n).map(|i| (i * 29 % 251) as u8).collect();
    let mut dst = vec![0u8; n];
    let op = CopyOp { dst: dst.as_mut_ptr() as u64 + 1, src: src.as_ptr() as u64, len: n as u64 - 1 };
    copy(&[op], CopyPlan::Independent);
    assert_eq!(dst[0], 0);
    assert!(dst[1..] == src[..n - 1]);
}

/// A mover that copies with memcpy and counts its calls, failing any
/// op whose source is `poison`.
struct Counting {
    calls: AtomicUsize,
    poison: u64,
}

impl Mover for Counting {
    fn run(&self, ops: &[CopyOp]) -> Result<()> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if ops.iter().any(|o| o.src <= self.poison && self.poison < o.src + o.len) {
            return Err(Error::Io(format!("poisoned 0x{:x}", self.poison)));
        }
        run(ops, false);
        Ok(())
    }
}

/// Guards `copy_with`: a mover's group moves every byte through the
/// mover (small: one call; large: its pieces, on the caller and the
/// pool), and a piece that fails fails the group with its error, the
/// other pieces still done.
#[test]
fn a_movers_group_moves_every_byte_and_reports_its_first_failure() {
    let n = 4 * PARALLEL_MIN_BYTES as usize;
    let src: Vec<u8> = (0..n).map(|i| (i * 17 % 251) as u8).collect();
    let mut dst = vec![0u8; n];
    let ops = blocks(&src, &mut dst);
    let counting = Arc::new(Counting { calls: AtomicUsize::new(0), poison: 0 });
    let mover: Arc<dyn Mover> = counting.clone();
    copy_with(&mover, &ops[..1], CopyPlan::Independent).unwrap();
    assert_eq!(counting.calls.load(Ordering::Relaxed), 1);
    copy_with(&mover, &ops, CopyPlan::Independent).unwrap();
    assert!(dst == src);
    assert!(counting.calls.load(Ordering::Relaxed) > 2, "cut into pieces");
    let poison = src.as_ptr() as u64 + n as u64 / 2 + 5;
    let failing: Arc<dyn Mover> = Arc::new(Counting { calls: AtomicUsize::new(0), poison });
    dst.fill(0);
    let e = copy_with(&failing, &ops, CopyPlan::Independent).unwrap_err();
    assert_eq!(e.message(), format!("poisoned 0x{poison:x}"));
    let e = copy_with(&failing, &ops, CopyPlan::Ordered).unwrap_err();
    assert_eq!(e.status(), crate::error::Status::IoError);
}

#[test]
fn a_parallel_copy_moves_every_byte() {
    let n = 3 * PARALLEL_MIN_BYTES as usize + 4097;
    let src: Vec<u8> = (0..n).map(|i| (i * 31 % 251) as u8).collect();
    let mut dst = vec![0u8; n];
    // Scattered 4 KiB blocks, reversed, then the tail.
    let mut ops: Vec<CopyOp> = (0..n / 4096)
        .rev()
        .map(|b| CopyOp {
            dst: dst.as_mut_ptr() as u64 + (b * 4096) as u64,
            src: src.as_ptr() as u64 + (b * 4096) as u64,
            len: 4096,
        })
        .collect();
    let tail = n / 4096 * 4096;
    ops.push(CopyOp {
        dst: dst.as_mut_ptr() as u64 + tail as u64,
        src: src.as_ptr() as u64 + tail as u64,
        len: (n - tail) as u64,
    });
    copy(&ops, CopyPlan::Independent);
    assert!(dst == src);
}
