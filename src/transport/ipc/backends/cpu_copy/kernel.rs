//! The copy kernels: memcpy (`ptr::copy`) in input order, stores that
//! bypass the caches for large groups, or a [`Mover`]'s calls.

use crate::error::Result;
use crate::transport::ipc::backend::CopyOp;
use std::sync::Arc;

/// Moves the bytes of copies that are not two ranges of this process's
/// memory (CMA: one range lies in another process), in place of memcpy.
pub trait Mover: Send + Sync {
    /// Moves `ops` in input order; an error says what failed (the pieces
    /// before it may have moved).
    fn run(&self, ops: &[CopyOp]) -> Result<()>;
}

/// Moves `ops` in input order with `mover`, or with memcpy ([`run`]).
pub(super) fn run_by(mover: Option<&Arc<dyn Mover>>, ops: &[CopyOp], stream: bool) -> Result<()> {
    match mover {
        Some(m) => m.run(ops),
        None => {
            run(ops, stream);
            Ok(())
        }
    }
}

/// Copies `ops` in input order; with `stream`, each op of at least a
/// cache line whose two ranges lie apart through [`stream_copy`].
pub(super) fn run(ops: &[CopyOp], stream: bool) {
    let mut streamed = false;
    for o in ops {
        let apart = || o.dst.saturating_add(o.len) <= o.src || o.src.saturating_add(o.len) <= o.dst;
        if stream && o.len >= 64 && apart() {
            // SAFETY: as below, and the two ranges do not overlap (checked).
            unsafe { stream_copy(o.dst as *mut u8, o.src as *const u8, o.len as usize) };
            streamed = true;
            continue;
        }
        // SAFETY: the protocol checked every range against a leased local
        // region and a live mapping before handing the group over, and the
        // caller of `copy` (or the holder of `start`'s `Pending`) keeps both
        // alive until every piece is done; `ptr::copy` tolerates overlap.
        unsafe { std::ptr::copy(o.src as *const u8, o.dst as *mut u8, o.len as usize) };
    }
    if streamed {
        store_fence();
    }
}

/// Copies `len` bytes from `src` to `dst` with stores that bypass the
/// caches (x86-64; elsewhere a plain copy). Weakly ordered: a
/// [`store_fence`] must follow before anything that tells another thread
/// or process the bytes are there.
///
/// # Safety
/// `src` readable and `dst` writable for `len` bytes, the two not
/// overlapping.
#[cfg(target_arch = "x86_64")]
pub(super) unsafe fn stream_copy(dst: *mut u8, src: *const u8, len: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    // Streaming stores need 16-byte aligned destinations: the bytes before
    // the first such address go plainly.
    let head = dst.align_offset(16).min(len);
    // SAFETY: within the ranges the caller vouches for, which do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
    let (mut d, mut s, mut left) = (dst.wrapping_add(head), src.wrapping_add(head), len - head);
    while left >= 64 {
        // SAFETY: 64 bytes at `s` and at `d` lie within the caller's ranges
        // (`left` counts what remains of both); `d` is 16-byte aligned
        // (advanced by multiples of 16 from an aligned address); SSE2 is
        // part of every x86-64 processor; unaligned loads are allowed.
        unsafe {
            let a = _mm_loadu_si128(s.cast::<__m128i>());
            let b = _mm_loadu_si128(s.add(16).cast::<__m128i>());
            let c = _mm_loadu_si128(s.add(32).cast::<__m128i>());
            let e = _mm_loadu_si128(s.add(48).cast::<__m128i>());
            _mm_stream_si128(d.cast::<__m128i>(), a);
            _mm_stream_si128(d.add(16).cast::<__m128i>(), b);
            _mm_stream_si128(d.add(32).cast::<__m128i>(), c);
            _mm_stream_si128(d.add(48).cast::<__m128i>(), e);
            (d, s) = (d.add(64), s.add(64));
        }
        left -= 64;
    }
    // SAFETY: the last `left` bytes of both ranges.
    unsafe { std::ptr::copy_nonoverlapping(s, d, left) };
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) unsafe fn stream_copy(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: the caller's ranges, which do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
}

/// Orders the streaming stores before every later store (the count of
/// pieces done, a completion another process reads).
pub(super) fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of every x86-64 processor; a fence has no operands.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}
