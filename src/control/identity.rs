//! Who a peer is: boot id, process identity and engine epoch. These detect
//! stale peers (a restarted process on the same endpoint); they are not
//! authentication.

use crate::error::Result;
use once_cell::sync::Lazy;

/// A process: pid plus its start time (clock ticks since boot), so that a
/// reused pid is told apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProcessIdentity {
    /// Process id.
    pub pid: u32,
    /// Start time in clock ticks since boot (field 22 of /proc/PID/stat).
    pub start_time: u64,
}

/// Everything a Describe says about who sent it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    /// The kernel's boot id (16 bytes).
    pub boot_id: [u8; 16],
    /// The process.
    pub process: ProcessIdentity,
    /// A value fresh for every engine instance.
    pub engine_epoch: u64,
}

fn read_boot_id() -> [u8; 16] {
    let mut out = [0u8; 16];
    if let Ok(s) = std::fs::read_to_string("/proc/sys/kernel/random/boot_id") {
        let hex: Vec<u8> = s.bytes().filter(|b| b.is_ascii_hexdigit()).collect();
        if hex.len() == 32 {
            for (i, o) in out.iter_mut().enumerate() {
                let pair = std::str::from_utf8(&hex[2 * i..2 * i + 2]).unwrap_or("00");
                *o = u8::from_str_radix(pair, 16).unwrap_or(0);
            }
        }
    }
    out
}

/// Start time of process `pid` from /proc (0 if unreadable).
pub fn process_start_time(pid: u32) -> u64 {
    // rest starts with " S ppid ...": field 3 is index 0 here, field 22 is index 19.
    stat_fields(pid).and_then(|rest| rest.split_whitespace().nth(19).and_then(|s| s.parse().ok())).unwrap_or(0)
}

/// The fields of `/proc/PID/stat` after the command name (which may hold
/// spaces and parentheses): field 3 (the state) first.
fn stat_fields(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rfind(')').map(|i| stat[i + 1..].to_string())
}

/// Whether the thread-group leader of process `pid` has exited (a zombie,
/// or dead). Alone that does not prove the process gone: its other threads
/// may still run ([`all_threads_exited`]).
pub fn is_zombie(pid: u32) -> bool {
    stat_fields(pid).is_some_and(|rest| matches!(rest.split_whitespace().next(), Some("Z" | "X")))
}

/// Whether every thread of process `pid` has exited (or the process is
/// gone): a zombie leader alone is not enough, since a leader that called
/// `pthread_exit` stays a zombie while the process's other threads run
/// (and keep its memory). Threads are read from `/proc/PID/task`.
pub fn all_threads_exited(pid: u32) -> bool {
    if !is_zombie(pid) {
        return stat_fields(pid).is_none();
    }
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return true };
    tasks.flatten().all(|t| {
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        let state = stat.rfind(')').and_then(|i| stat[i + 1..].split_whitespace().next().map(str::to_string));
        state.is_none_or(|s| s == "Z" || s == "X")
    })
}

/// Whether process `pid` of this PID namespace may still run: `/proc`
/// shows it and it is not a zombie, or the kernel says it exists though
/// `/proc` hides it (`hidepid`: `kill(pid, 0)` answers `EPERM`, not
/// `ESRCH`). False only when it provably is gone.
pub fn process_alive(pid: u32) -> bool {
    if pid == 0 || pid > i32::MAX as u32 {
        return false;
    }
    if let Some(rest) = stat_fields(pid) {
        return !matches!(rest.split_whitespace().next(), Some("Z" | "X"));
    }
    // SAFETY: signal 0 only checks that the process exists and may be
    // signalled; nothing is sent.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Whether `p`, the process a peer on this boot names as itself, is the
/// process of that pid in this PID namespace. `Some(false)` when provably
/// not: no process has that pid here, or the one that has it started at
/// another time (the peer runs in another PID namespace, a container, or
/// names a process it is not); `Some(true)` when `/proc` shows that pid
/// with that start time; `None` when it cannot be told (`/proc` hides the
/// process, `hidepid`).
pub fn process_is_here(p: &ProcessIdentity) -> Option<bool> {
    if p.pid == 0 || p.pid > i32::MAX as u32 {
        return Some(false);
    }
    if stat_fields(p.pid).is_some() {
        return Some(process_start_time(p.pid) == p.start_time);
    }
    // SAFETY: signal 0 only checks that the process exists and may be
    // signalled; nothing is sent.
    let r = unsafe { libc::kill(p.pid as libc::pid_t, 0) };
    let gone = r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
    if gone {
        Some(false)
    } else {
        None
    }
}

/// The inode of this process's PID namespace (`/proc/self/ns/pid`): two
/// processes whose values differ cannot judge each other's pids. 0 when
/// it cannot be read.
pub fn pid_namespace() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").map(|m| m.ino()).unwrap_or(0)
}

static BOOT_ID: Lazy<[u8; 16]> = Lazy::new(read_boot_id);

/// The engine epoch of [`Identity::gone`], never drawn by [`Identity::fresh`].
const GONE_EPOCH: u64 = u64::MAX;

/// This host's boot id.
pub fn boot_id() -> [u8; 16] {
    *BOOT_ID
}

/// This process.
pub fn this_process() -> ProcessIdentity {
    let pid = std::process::id();
    ProcessIdentity { pid, start_time: process_start_time(pid) }
}

impl Identity {
    /// A fresh identity for a new engine of this process: its epoch is a
    /// random nonzero value (`random.rs`), so an engine restarted in the same
    /// process or under a recycled pid never reuses one. Fails only when the
    /// kernel supplies no randomness.
    pub fn fresh() -> Result<Identity> {
        let engine_epoch = loop {
            let e = crate::random::nonzero_u64()?;
            if e != GONE_EPOCH {
                break e;
            }
        };
        Ok(Identity { boot_id: boot_id(), process: this_process(), engine_epoch })
    }

    /// The identity a source's connection answers with once its engine is
    /// gone: this process, and an epoch no live engine is given
    /// (`GONE_EPOCH`), so a requester sees a stale peer.
    pub fn gone() -> Identity {
        Identity { boot_id: boot_id(), process: this_process(), engine_epoch: GONE_EPOCH }
    }

    /// Whether `other` runs on the same boot of the same host.
    pub fn same_boot(&self, other: &Identity) -> bool {
        self.boot_id == other.boot_id && self.boot_id != [0u8; 16]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_are_fresh_and_local() {
        let a = Identity::fresh().unwrap();
        let b = Identity::fresh().unwrap();
        assert_ne!(a.engine_epoch, b.engine_epoch);
        assert!(a.same_boot(&b));
        assert_eq!(a.process.pid, std::process::id());
        assert!(a.process.start_time > 0);
    }

    /// Two identities whose boot id is unknown (all zero: this host's
    /// `/proc/sys/kernel/random/boot_id` could not be read, or a peer sent
    /// none) are not of the same boot, even of the same process: equal
    /// zeros say nothing about the host, and SHM or CMA across hosts would
    /// read the wrong memory. A known id equal on both sides is the same
    /// boot; one known and one unknown are not. Guards `same_boot`'s
    /// `self.boot_id != [0u8; 16]`.
    #[test]
    fn an_unknown_boot_id_is_never_the_same_boot() {
        let (a, b) = (Identity::fresh().unwrap(), Identity::fresh().unwrap());
        let unknown = |i: Identity| Identity { boot_id: [0; 16], ..i };
        let known = |i: Identity| Identity { boot_id: [0x5a; 16], ..i };
        assert!(!unknown(a).same_boot(&unknown(b)));
        assert!(!unknown(a).same_boot(&unknown(a)));
        assert!(known(a).same_boot(&known(b)));
        assert!(!known(a).same_boot(&unknown(b)));
        assert!(!unknown(a).same_boot(&known(b)));
    }

    /// This process is here; the same pid with another start time, or a
    /// pid no process has, is not.
    #[test]
    fn a_process_is_here_only_with_its_pid_and_start_time() {
        let me = this_process();
        assert_eq!(process_is_here(&me), Some(true));
        let restarted = ProcessIdentity { start_time: me.start_time + 1, ..me };
        assert_eq!(process_is_here(&restarted), Some(false));
        assert_eq!(process_is_here(&ProcessIdentity { pid: 0, start_time: me.start_time }), Some(false));
        // Above the kernel's pid_max (at most 2^22): no process has it.
        assert_eq!(process_is_here(&ProcessIdentity { pid: (1 << 22) + 1, start_time: 1 }), Some(false));
    }
}
