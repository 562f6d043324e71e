//! The cross-memory calls: copies between this process and a window that
//! stands for a range of another process's memory, moved with
//! `process_vm_readv` (the other process is the source) and
//! `process_vm_writev` (the destination), many ranges per call.
//!
//! A copy's address in the window `[window, window + len)` means
//! `remote + (address - window)` in the other process; its other address is
//! this process's. The window lies outside every address this process can
//! map (see [`WINDOW`]), so it is never dereferenced, and the protocol's
//! address checks (independence, coalescing) never confuse it with local
//! memory.

use crate::error::{Error, Result};
use crate::transport::ipc::backend::CopyOp;
use crate::transport::ipc::backends::cpu_copy::Mover;
use std::cell::RefCell;

/// Where a CMA import's window starts: a non-canonical address (bit 62),
/// above every user address of x86-64 (47 or 56 bits) and aarch64 (at most
/// 52 bits), so no local range ever meets it.
pub const WINDOW: u64 = 1 << 62;

/// Ranges per call: the kernel's `UIO_MAXIOV` (`IOV_MAX`).
pub const MAX_IOVECS: usize = libc::UIO_MAXIOV as usize;

/// Bytes per call at most: the kernel moves at most `MAX_RW_COUNT` (2 GiB
/// less a page) in one call and says nothing of the rest, which must not be
/// taken for a short copy.
pub const MAX_CALL_BYTES: u64 = 1 << 30;

/// One other process's range, moved through a window.
#[derive(Debug, Clone, Copy)]
pub struct Remote {
    /// The process (a pid of this PID namespace, checked when imported).
    pub pid: u32,
    /// The first byte of the range in that process.
    pub base: u64,
    /// The range's length.
    pub len: u64,
    /// Whether the grant allows WRITE (else only READ copies run).
    pub writable: bool,
}

/// Which way one copy goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    /// From the other process into this one.
    Read,
    /// From this process into the other one.
    Write,
}

impl Remote {
    /// Whether `[addr, addr + len)` lies in the window.
    fn in_window(&self, addr: u64, len: u64) -> bool {
        addr >= WINDOW && (addr - WINDOW).checked_add(len).is_some_and(|e| e <= self.len)
    }

    /// Which way `op` goes: exactly one of its ranges in the window, a WRITE
    /// only through a writable grant.
    fn way(&self, op: &CopyOp) -> Result<Way> {
        match (self.in_window(op.src, op.len), self.in_window(op.dst, op.len)) {
            (true, false) => Ok(Way::Read),
            (false, true) if self.writable => Ok(Way::Write),
            (false, true) => Err(Error::PermissionDenied(format!(
                "a WRITE of {} bytes through a READ-only cma grant of process {}",
                op.len, self.pid
            ))),
            _ => Err(Error::Protocol(format!(
                "a cma copy of {} bytes (0x{:x} -> 0x{:x}) has not exactly one range in the grant's window \
                 (0x{WINDOW:x}+{})",
                op.len, op.src, op.dst, self.len
            ))),
        }
    }

    /// The other process's address of window address `addr`.
    fn remote(&self, addr: u64) -> u64 {
        self.base + (addr - WINDOW)
    }
}

/// One call's ranges: this process's and the other process's, each list
/// merging a range into the one before it where the two abut. The kernel
/// moves the bytes of the remote list into the local list in order,
/// whatever the cuts of either, so the merged lists move exactly the bytes
/// of the ops; the kernel pins and locks the other process's memory once
/// per remote range, so a run contiguous on one side costs one range there
/// even when the other side is scattered (a READ of 16 abutting 4 KiB
/// remote blocks in one range ran at 0.99 GB/s against 0.77 as 16 ranges
/// here, loaded), and more ops fit in a call of [`MAX_IOVECS`] ranges.
#[derive(Default)]
struct Iovecs {
    local: Vec<libc::iovec>,
    remote: Vec<libc::iovec>,
}

impl Iovecs {
    fn clear(&mut self) {
        self.local.clear();
        self.remote.clear();
    }

    /// Appends `len` bytes at `mine` (this process) and `theirs` (the
    /// other) unless that would take either list past `max` ranges:
    /// whether it did.
    fn push(&mut self, mine: u64, theirs: u64, len: u64, max: usize) -> bool {
        let (l, r) = (abuts(&self.local, mine), abuts(&self.remote, theirs));
        if (!l && self.local.len() >= max) || (!r && self.remote.len() >= max) {
            return false;
        }
        extend(&mut self.local, l, mine, len);
        extend(&mut self.remote, r, theirs, len);
        true
    }
}

/// Whether a range starting at `at` continues the last one of `list`.
fn abuts(list: &[libc::iovec], at: u64) -> bool {
    list.last().is_some_and(|p| p.iov_base as u64 + p.iov_len as u64 == at)
}

/// Appends `[at, at + len)` to `list`, into its last range when `merge`.
fn extend(list: &mut Vec<libc::iovec>, merge: bool, at: u64, len: u64) {
    match list.last_mut() {
        Some(last) if merge => last.iov_len += len as usize,
        _ => list.push(libc::iovec { iov_base: at as *mut libc::c_void, iov_len: len as usize }),
    }
}

thread_local! {
    /// A call's ranges (reused from call to call).
    static IOVECS: RefCell<Iovecs> = RefCell::new(Iovecs::default());
}

/// One call over `iov` (going `way`): the bytes it moved, or the call's
/// error.
fn call(r: &Remote, way: Way, iov: &Iovecs) -> std::io::Result<usize> {
    let (pid, nl, nr) = (r.pid as libc::pid_t, iov.local.len() as libc::c_ulong, iov.remote.len() as libc::c_ulong);
    let (local, remote) = (iov.local.as_ptr(), iov.remote.as_ptr());
    // SAFETY: every local range lies in a region of this process the
    // caller leased for the copy (checked against its registration before
    // the group was posted), alive until the call returns (merged ranges
    // cover exactly the ops' ranges); the kernel checks the remote ranges
    // against the other process's mappings and answers EFAULT (or a short
    // count) for any that is not mapped, touching nothing of this process
    // outside the local ranges.
    let moved = unsafe {
        match way {
            Way::Read => libc::process_vm_readv(pid, local, nl, remote, nr, 0),
            Way::Write => libc::process_vm_writev(pid, local, nl, remote, nr, 0),
        }
    };
    if moved < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(moved as usize)
}

/// What a call that moved `moved` of its bytes (`Ok`) or failed (`Err`)
/// comes to: the first op it did not complete names the range.
fn failure(r: &Remote, way: Way, ops: &[CopyOp], got: std::io::Result<usize>) -> Error {
    let name = match way {
        Way::Read => "process_vm_readv",
        Way::Write => "process_vm_writev",
    };
    let (moved, e) = match got {
        Ok(m) => (m as u64, None),
        Err(e) => (0, Some(e)),
    };
    // The op in which the call stopped, and where in it: the kernel counts
    // the bytes it moved up to the first one it could not reach.
    let mut at = moved;
    let stopped = ops.iter().find_map(|o| match at < o.len {
        true => Some((o, at)),
        false => {
            at -= o.len;
            None
        }
    });
    let range = stopped.map_or(String::new(), |(o, off)| {
        let remote = r.remote(if way == Way::Read { o.src } else { o.dst });
        format!(" at the source's 0x{:x} (of 0x{remote:x}+{})", remote + off, o.len)
    });
    let total: u64 = ops.iter().map(|o| o.len).sum();
    let pid = r.pid;
    match e.as_ref().and_then(|e| e.raw_os_error()) {
        None | Some(libc::EFAULT) => Error::Io(format!(
            "{name} with process {pid} moved {moved} of {total} bytes: the memory{range} is not mapped (freed or \
             unmapped while registered?)"
        )),
        Some(libc::ESRCH) => Error::Unavailable(format!("{name}: the source process {pid} exited")),
        Some(libc::EPERM) | Some(libc::EACCES) | Some(libc::ENOSYS) => Error::NotSupported(format!(
            "{name} into process {pid} was refused: {}",
            super::access::explain(super::access::Yama::read(), e.as_ref().expect("an error"), pid)
        )),
        Some(libc::ENOMEM) => Error::ResourceExhausted(format!("{name} with process {pid}: out of memory")),
        Some(_) => Error::Io(format!("{name} with process {pid}{range}: {}", e.expect("an error"))),
    }
}

/// What [`Remote::run_bounded`] did: its calls, the ranges they passed on
/// each side (after merging), and the most bytes one call moved.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Calls {
    calls: u32,
    local: u32,
    remote: u32,
    largest: u64,
}

impl Remote {
    /// This process's and the other process's address of `op`, going `way`.
    fn ends(&self, way: Way, op: &CopyOp) -> (u64, u64) {
        match way {
            Way::Read => (op.dst, self.remote(op.src)),
            Way::Write => (op.src, self.remote(op.dst)),
        }
    }

    /// One call over `iov`, the ranges of `batch` (all going `way`), which
    /// must move every byte.
    fn whole(&self, way: Way, batch: &[CopyOp], iov: &Iovecs, done: &mut Calls) -> Result<()> {
        let want: u64 = batch.iter().map(|o| o.len).sum();
        done.calls += 1;
        done.local += iov.local.len() as u32;
        done.remote += iov.remote.len() as u32;
        done.largest = done.largest.max(want);
        match call(self, way, iov) {
            Ok(m) if m as u64 == want => Ok(()),
            got => Err(failure(self, way, batch, got)),
        }
    }

    /// [`Mover::run`] with calls of at most `max_bytes` bytes and
    /// `max_iovecs` ranges a side: what calls it made.
    fn run_bounded(&self, ops: &[CopyOp], max_bytes: u64, max_iovecs: usize) -> Result<Calls> {
        IOVECS.with(|v| {
            let iov = &mut *v.borrow_mut();
            let (mut i, mut done) = (0, Calls::default());
            while i < ops.len() {
                let way = self.way(&ops[i])?;
                iov.clear();
                if ops[i].len > max_bytes {
                    // One op larger than a call moves: in calls of its pieces.
                    let o = ops[i];
                    let mut off = 0;
                    while off < o.len {
                        let len = (o.len - off).min(max_bytes);
                        let piece = CopyOp { dst: o.dst + off, src: o.src + off, len };
                        let (mine, theirs) = self.ends(way, &piece);
                        iov.clear();
                        iov.push(mine, theirs, len, max_iovecs);
                        self.whole(way, &[piece], iov, &mut done)?;
                        off += len;
                    }
                    i += 1;
                    continue;
                }
                let (mine, theirs) = self.ends(way, &ops[i]);
                iov.push(mine, theirs, ops[i].len, max_iovecs);
                let (mut j, mut bytes) = (i + 1, ops[i].len);
                while j < ops.len() && bytes + ops[j].len <= max_bytes && self.way(&ops[j])? == way {
                    let (mine, theirs) = self.ends(way, &ops[j]);
                    if !iov.push(mine, theirs, ops[j].len, max_iovecs) {
                        break;
                    }
                    bytes += ops[j].len;
                    j += 1;
                }
                self.whole(way, &ops[i..j], iov, &mut done)?;
                i = j;
            }
            Ok(done)
        })
    }
}

impl Mover for Remote {
    /// Moves `ops` in input order: each run of consecutive ops going one
    /// way in calls of up to [`MAX_IOVECS`] ranges a side (abutting ranges
    /// merged, see [`Iovecs`]) and [`MAX_CALL_BYTES`] bytes (a call copies
    /// its ranges in order, so dependent ops keep theirs). The first
    /// failure ends the group.
    fn run(&self, ops: &[CopyOp]) -> Result<()> {
        self.run_bounded(ops, MAX_CALL_BYTES, MAX_IOVECS).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This process as the "other" one: its own buffer behind the window.
    fn me(buf: &[u8], writable: bool) -> Remote {
        Remote { pid: std::process::id(), base: buf.as_ptr() as u64, len: buf.len() as u64, writable }
    }

    /// Guards `run`: scattered READs and WRITEs through the window, more
    /// ranges than one call takes, land exactly; a READ-only grant refuses
    /// a WRITE; an op with no range (or both) in the window is refused.
    #[test]
    fn scattered_copies_through_the_window_move_exactly_their_bytes() {
        let remote: Vec<u8> = (0..3000 * 64).map(|i| (i * 7 % 251) as u8).collect();
        let mut local = vec![0u8; remote.len()];
        let r = me(&remote, false);
        // 3000 64-byte blocks in reverse order: three calls.
        let ops: Vec<CopyOp> = (0..3000u64)
            .rev()
            .map(|b| CopyOp { dst: local.as_mut_ptr() as u64 + b * 64, src: WINDOW + b * 64, len: 64 })
            .collect();
        r.run(&ops).unwrap();
        assert!(local == remote);
        let w = CopyOp { dst: WINDOW, src: local.as_ptr() as u64, len: 8 };
        assert_eq!(r.run(&[w]).unwrap_err().status(), crate::error::Status::PermissionDenied);
        let mut target = vec![0u8; 4096];
        let rw = me(&target, true);
        let src: Vec<u8> = (0..4096).map(|i| (i % 13) as u8 + 1).collect();
        let ops = [
            CopyOp { dst: WINDOW + 100, src: src.as_ptr() as u64, len: 1000 },
            CopyOp { dst: WINDOW, src: src.as_ptr() as u64 + 2000, len: 50 },
        ];
        rw.run(&ops).unwrap();
        assert_eq!(&target[100..1100], &src[..1000]);
        assert_eq!(&target[..50], &src[2000..2050]);
        assert!(target[50..100].iter().all(|&b| b == 0) && target[1100..].iter().all(|&b| b == 0));
        let neither = CopyOp { dst: local.as_mut_ptr() as u64, src: remote.as_ptr() as u64, len: 8 };
        assert_eq!(r.run(&[neither]).unwrap_err().status(), crate::error::Status::ProtocolError);
        let past = CopyOp { dst: local.as_mut_ptr() as u64, src: WINDOW + remote.len() as u64 - 4, len: 8 };
        assert_eq!(r.run(&[past]).unwrap_err().status(), crate::error::Status::ProtocolError);
        // One byte past the window is past it (C17 of the third mutant
        // round: `in_window`'s `e <= self.len`); its last byte is inside.
        let one_past = CopyOp { dst: local.as_mut_ptr() as u64, src: WINDOW + remote.len() as u64 - 7, len: 8 };
        let e = r.run(&[one_past]).unwrap_err();
        assert_eq!(e.status(), crate::error::Status::ProtocolError, "{e}");
        let last = CopyOp { dst: local.as_mut_ptr() as u64, src: WINDOW + remote.len() as u64 - 8, len: 8 };
        r.run(&[last]).unwrap();
        target[0] = 0;
    }

    /// Guards `run_bounded`'s byte bound: calls of at most the bound (an op
    /// larger than a call cut into several), every byte landing exactly,
    /// in order.
    #[test]
    fn calls_bounded_in_bytes_move_every_byte_in_order() {
        let remote: Vec<u8> = (0..64 * 1024).map(|i| (i * 31 % 253) as u8).collect();
        let r = me(&remote, false);
        let mut local = vec![0u8; remote.len()];
        let l = local.as_mut_ptr() as u64;
        // 10 000 bytes (three calls of 4096 at most), then 1000-byte ops
        // that share calls, then a READ over the first 3 bytes again.
        let mut ops = vec![CopyOp { dst: l, src: WINDOW, len: 10_000 }];
        ops.extend((10u64..40).map(|k| CopyOp { dst: l + k * 1000, src: WINDOW + k * 1000, len: 1000 }));
        ops.push(CopyOp { dst: l + 50_000, src: WINDOW + 5, len: 3 });
        // 3 calls for the first op; then 7 of 4 ops (4000 bytes) and one of
        // the last two 1000-byte ops with the 3-byte one.
        assert_eq!(r.run_bounded(&ops, 4096, MAX_IOVECS).unwrap().calls, 11);
        assert_eq!(&local[..40_000], &remote[..40_000]);
        assert_eq!(&local[50_000..50_003], &remote[5..8]);
        assert!(local[40_000..50_000].iter().all(|&b| b == 0));
    }

    /// An op larger than one call's byte bound but at most twice it is
    /// cut too: 4097, 6000 and 8192 bytes at a bound of 4096 each go in
    /// exactly 2 calls of at most 4096 bytes (one range a side each), 4096
    /// in one, 8193 in three, READ and WRITE, every byte landing exactly.
    /// Guards `ops[i].len > max_bytes` in `run_bounded` (with
    /// `> max_bytes * 2` such an op goes whole into one call of up to twice
    /// the bound; round 6 F11).
    #[test]
    fn an_op_up_to_twice_the_bound_is_cut_into_calls_of_at_most_the_bound() {
        let other: Vec<u8> = (0..16 * 1024).map(|i| (i * 29 % 241) as u8 + 1).collect();
        let r = me(&other, false);
        for (len, calls, largest) in
            [(4096u64, 1, 4096), (4097, 2, 4096), (6000, 2, 4096), (8192, 2, 4096), (8193, 3, 4096)]
        {
            let mut local = vec![0u8; 16 * 1024];
            let op = CopyOp { dst: local.as_mut_ptr() as u64 + 100, src: WINDOW + 7, len };
            let want = Calls { calls, local: calls, remote: calls, largest };
            assert_eq!(r.run_bounded(&[op], 4096, MAX_IOVECS).unwrap(), want, "READ of {len}");
            let n = len as usize;
            assert_eq!(&local[100..100 + n], &other[7..7 + n], "READ of {len}");
            assert!(local[..100].iter().all(|&b| b == 0) && local[100 + n..].iter().all(|&b| b == 0));
        }
        let mut target = vec![0u8; 8 * 1024];
        let w = me(&target, true);
        let op = CopyOp { dst: WINDOW + 50, src: other.as_ptr() as u64 + 3, len: 6000 };
        assert_eq!(
            w.run_bounded(&[op], 4096, MAX_IOVECS).unwrap(),
            Calls { calls: 2, local: 2, remote: 2, largest: 4096 }
        );
        assert_eq!(&target[50..6050], &other[3..6003]);
        assert!(target[..50].iter().all(|&b| b == 0) && target[6050..].iter().all(|&b| b == 0));
        target[0] = 0;
    }

    /// Guards `Iovecs::push`'s merging: ranges that abut on one side share
    /// one range there whatever the other side does, so a call holds more
    /// ops than it has ranges (exact calls and ranges), and every byte
    /// lands where its op says, READ and WRITE.
    #[test]
    fn abutting_ranges_merge_on_each_side_into_fewer_ranges_and_calls() {
        let other: Vec<u8> = (0..64 * 1024).map(|i| (i * 13 % 251) as u8 + 1).collect();
        let r = me(&other, false);
        let mut local = vec![0u8; 64 * 1024];
        let l = local.as_mut_ptr() as u64;
        // Six 1000-byte blocks contiguous in the other process, landing in
        // two runs of three here (at 0 and at 20 000).
        let ops: Vec<CopyOp> = (0..6u64)
            .map(|k| CopyOp { dst: l + (k / 3) * 20_000 + (k % 3) * 1000, src: WINDOW + k * 1000, len: 1000 })
            .collect();
        // Two ranges a side at most: one call of 2 local and 1 remote range
        // (six calls' worth of unmerged ranges).
        assert_eq!(
            r.run_bounded(&ops, MAX_CALL_BYTES, 2).unwrap(),
            Calls { calls: 1, local: 2, remote: 1, largest: 6000 }
        );
        assert_eq!(&local[..3000], &other[..3000]);
        assert_eq!(&local[20_000..23_000], &other[3000..6000]);
        assert!(local[3000..20_000].iter().all(|&b| b == 0) && local[23_000..].iter().all(|&b| b == 0));
        // Scattered on both sides (every other block): no merging, one
        // range per op, calls of at most 2.
        local.fill(0);
        let sparse: Vec<CopyOp> =
            (0..5u64).map(|k| CopyOp { dst: l + k * 2000, src: WINDOW + k * 2000, len: 1000 }).collect();
        assert_eq!(
            r.run_bounded(&sparse, MAX_CALL_BYTES, 2).unwrap(),
            Calls { calls: 3, local: 5, remote: 5, largest: 2000 }
        );
        for k in 0..5 {
            assert_eq!(&local[k * 2000..k * 2000 + 1000], &other[k * 2000..k * 2000 + 1000]);
            assert!(local[k * 2000 + 1000..k * 2000 + 2000].iter().all(|&b| b == 0));
        }
        // WRITE: contiguous here, scattered there (three runs of two).
        let mut target = vec![0u8; 16 * 1024];
        let w = me(&target, true);
        let src: Vec<u8> = (0..6000).map(|i| (i % 199) as u8 + 1).collect();
        let s0 = src.as_ptr() as u64;
        let writes: Vec<CopyOp> = (0..6u64)
            .map(|k| CopyOp { dst: WINDOW + (k / 2) * 5000 + (k % 2) * 1000, src: s0 + k * 1000, len: 1000 })
            .collect();
        assert_eq!(
            w.run_bounded(&writes, MAX_CALL_BYTES, 2).unwrap(),
            Calls { calls: 2, local: 2, remote: 3, largest: 4000 }
        );
        for run in 0..3 {
            assert_eq!(&target[run * 5000..run * 5000 + 2000], &src[run * 2000..run * 2000 + 2000]);
            assert!(target[run * 5000 + 2000..(run * 5000 + 5000).min(target.len())].iter().all(|&b| b == 0));
        }
        target[0] = 0;
    }

    /// Guards the ordered runs: dependent ops (a READ into a block, then a
    /// WRITE of that block, then a READ over it) keep their input order
    /// across calls of different ways, and within one call.
    #[test]
    fn dependent_copies_keep_their_order() {
        let mut other: Vec<u8> = (0..256).map(|i| i as u8).collect();
        let r = me(&other, true);
        let mut local = vec![0u8; 64];
        let l = local.as_mut_ptr() as u64;
        let ops = [
            CopyOp { dst: l, src: WINDOW, len: 64 },
            CopyOp { dst: WINDOW + 128, src: l, len: 64 },
            CopyOp { dst: l, src: WINDOW + 64, len: 32 },
            CopyOp { dst: l + 16, src: WINDOW + 200, len: 8 },
        ];
        r.run(&ops).unwrap();
        let want: Vec<u8> = (0..64).map(|i| i as u8).collect();
        assert_eq!(&other[128..192], &want[..]);
        let mut l_want: Vec<u8> = (64..96).map(|i| i as u8).chain(32..64).collect();
        l_want[16..24].copy_from_slice(&[200, 201, 202, 203, 204, 205, 206, 207]);
        assert_eq!(local, l_want);
        other[0] = 0;
    }

    /// Guards `failure`: a range the other process does not map fails the
    /// group with IO_ERROR naming that range and the bytes moved, never a
    /// fault here; a process that does not exist is UNAVAILABLE.
    #[test]
    fn an_unmapped_range_fails_exactly_and_a_gone_process_is_unavailable() {
        let len = 3 * 4096usize;
        // SAFETY: a fresh anonymous mapping of `len` bytes.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        // SAFETY: writing the mapping just made.
        unsafe { std::ptr::write_bytes(p.cast::<u8>(), 7, len) };
        // SAFETY: taking every access to its last page away, as a source
        // freeing memory would. Not munmap: another test thread of this
        // binary could map the freed page again before the copy runs.
        assert_eq!(unsafe { libc::mprotect(p.cast::<u8>().add(2 * 4096).cast(), 4096, libc::PROT_NONE) }, 0);
        let r = Remote { pid: std::process::id(), base: p as u64, len: len as u64, writable: true };
        let mut local = vec![0u8; len];
        let ops = [
            CopyOp { dst: local.as_mut_ptr() as u64, src: WINDOW, len: 4096 },
            CopyOp { dst: local.as_mut_ptr() as u64 + 4096, src: WINDOW + 4096, len: 8192 },
        ];
        let e = r.run(&ops).unwrap_err();
        assert_eq!(e.status(), crate::error::Status::IoError, "{e}");
        assert!(e.message().contains("moved 8192 of 12288 bytes"), "{e}");
        let at = format!("at the source's 0x{:x} (of 0x{:x}+8192)", p as u64 + 8192, p as u64 + 4096);
        assert!(e.message().contains(&at), "{e}");
        assert!(local[..8192].iter().all(|&b| b == 7));
        // The readable part alone still moves.
        r.run(&ops[..1]).unwrap();
        let gone = Remote { pid: i32::MAX as u32, ..r };
        assert_eq!(gone.run(&ops[..1]).unwrap_err().status(), crate::error::Status::Unavailable);
        // SAFETY: unmapping the whole mapping made above.
        assert_eq!(unsafe { libc::munmap(p, len) }, 0);
    }
}
