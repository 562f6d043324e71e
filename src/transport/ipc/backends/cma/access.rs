//! Who may copy with cross-memory attach, and how each side makes sure.
//!
//! The requester copies: `process_vm_readv` for a READ, `process_vm_writev`
//! for a WRITE, both into the *source* process. The kernel allows that when
//! the requester may ptrace the source (`PTRACE_MODE_ATTACH_REALCREDS`):
//!
//! - both run as the same user (its real, effective and saved ids), the
//!   source is dumpable and holds no capability the requester lacks (or the
//!   requester has `CAP_SYS_PTRACE`); OrbiTE asks for the same user
//!   whatever the kernel would allow ([`same_user`]: a root requester could
//!   read any process, yet CMA never crosses users, as SHM's channel does
//!   not by default);
//! - Yama (`/proc/sys/kernel/yama/ptrace_scope`): absent or 0, nothing
//!   more; 1, the requester must be an ancestor of the source or named by
//!   it with `PR_SET_PTRACER` — the source names the verified requester of
//!   its CMA channel when it admits it ([`decide`]); 2, only
//!   `CAP_SYS_PTRACE`; 3, nobody;
//! - no seccomp filter refuses the two calls in the requester
//!   ([`calls_allowed`], asked once per process);
//! - the source's pid names it in the requester's PID namespace
//!   ([`pid_names_it`]).
//!
//! What the kernel then allows is the whole source process, not a range:
//! the source's grants decide what OrbiTE copies (each request is checked
//! against the grant before a byte moves), the kernel's permission only
//! whether the copies can run.

use crate::control::identity::{process_start_time, ProcessIdentity};
use std::io::ErrorKind;

/// The Yama LSM's ptrace policy, as this host sets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Yama {
    /// No Yama (`/proc/sys/kernel/yama` absent): the classic ptrace checks.
    Absent,
    /// `ptrace_scope` 0 (classic), 1 (relational), 2 (admin only) or 3
    /// (no attach).
    Scope(u32),
}

impl Yama {
    /// This host's setting (read each time: an administrator may change it).
    pub fn read() -> Yama {
        match std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope") {
            Ok(s) => Yama::Scope(s.trim().parse().unwrap_or(3)),
            Err(_) => Yama::Absent,
        }
    }

    /// How the setting reads in a message.
    pub fn describe(self) -> String {
        match self {
            Yama::Absent => "no Yama LSM".into(),
            Yama::Scope(s) => format!("Yama ptrace_scope {s}"),
        }
    }
}

/// What a source does about its ptracer (config `cma_ptracer`) when Yama's
/// `ptrace_scope` is 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PtracerPolicy {
    /// Name the requester of the CMA channel being admitted, while the one
    /// named before (Yama keeps one per process) has exited or is the same.
    #[default]
    Peer,
    /// `PR_SET_PTRACER_ANY`: every process of this user may attach, as
    /// under `ptrace_scope` 0 (one source serving many requesters).
    Any,
    /// Never change it: only an ancestor of the source (or a requester with
    /// `CAP_SYS_PTRACE`) can copy.
    Never,
}

impl PtracerPolicy {
    /// The config name.
    pub fn name(self) -> &'static str {
        match self {
            PtracerPolicy::Peer => "peer",
            PtracerPolicy::Any => "any",
            PtracerPolicy::Never => "none",
        }
    }

    /// Parses a config name.
    pub fn from_name(s: &str) -> Option<PtracerPolicy> {
        match s {
            "peer" => Some(PtracerPolicy::Peer),
            "any" => Some(PtracerPolicy::Any),
            "none" => Some(PtracerPolicy::Never),
            _ => None,
        }
    }
}

/// What the source does when it admits a requester's CMA channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Naming {
    /// Nothing: the kernel's checks need no naming (no Yama, scope 0), or
    /// naming would not help (scope 2 and 3: the requester's probe tells).
    Nothing,
    /// `PR_SET_PTRACER` with this pid.
    Name(u32),
    /// This requester is the one named already.
    Named,
    /// `PR_SET_PTRACER_ANY` (once per process).
    Any,
    /// Another live requester holds the one name Yama keeps, or the policy
    /// forbids naming: nothing changes, and the requester's probe fails
    /// (it moves its requests over TCP). The text says why.
    Refused(String),
}

/// What a source admitting `requester` does, with Yama `yama`, policy
/// `policy`, and `named` the requester it named before (and whether that
/// process still lives).
pub fn decide(yama: Yama, policy: PtracerPolicy, requester: ProcessIdentity, named: Option<(Named, bool)>) -> Naming {
    match yama {
        Yama::Scope(1) => {}
        _ => return Naming::Nothing,
    }
    match (policy, named) {
        (PtracerPolicy::Never, _) => Naming::Refused(
            "Yama ptrace_scope is 1 and this source's cma_ptracer is \"none\": only its ancestors may copy".into(),
        ),
        (PtracerPolicy::Any, Some((Named::Any, _))) => Naming::Named,
        (PtracerPolicy::Any, _) => Naming::Any,
        (PtracerPolicy::Peer, Some((Named::Any, _))) => Naming::Named,
        (PtracerPolicy::Peer, Some((Named::Process(p), _))) if p == requester => Naming::Named,
        (PtracerPolicy::Peer, Some((Named::Process(p), true))) => Naming::Refused(format!(
            "Yama ptrace_scope is 1 and lets a process name one ptracer; this source names process {} \
             (another requester); set cma_ptracer to \"any\" on the source to serve every process of its user",
            p.pid
        )),
        (PtracerPolicy::Peer, _) => Naming::Name(requester.pid),
    }
}

/// Whom this process named with `PR_SET_PTRACER`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Named {
    /// One requester process.
    Process(ProcessIdentity),
    /// `PR_SET_PTRACER_ANY`.
    Any,
}

/// The ptracer this process named (process-wide, as the kernel keeps it).
static NAMED: parking_lot::Mutex<Option<Named>> = parking_lot::Mutex::new(None);

/// Source side: does what [`decide`] says for `requester` now. `Ok(None)`:
/// done or nothing to do; `Ok(Some(why))`: the requester will be refused by
/// the kernel (it falls back to TCP), `why` says so; `Err`: the kernel
/// refused the naming.
pub fn admit(policy: PtracerPolicy, requester: ProcessIdentity) -> std::io::Result<Option<String>> {
    let mut named = NAMED.lock();
    let alive = |n: &Named| match n {
        Named::Process(p) => process_start_time(p.pid) == p.start_time,
        Named::Any => true,
    };
    let before = named.map(|n| (n, alive(&n)));
    let (arg, now) = match decide(Yama::read(), policy, requester, before) {
        Naming::Nothing | Naming::Named => return Ok(None),
        Naming::Refused(why) => return Ok(Some(why)),
        Naming::Name(pid) => (pid as libc::c_ulong, Named::Process(requester)),
        Naming::Any => (libc::PR_SET_PTRACER_ANY as libc::c_ulong, Named::Any),
    };
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_PTRACER, arg, 0 as libc::c_ulong, 0 as libc::c_ulong, 0 as libc::c_ulong) }
        != 0
    {
        return Err(std::io::Error::last_os_error());
    }
    *named = Some(now);
    Ok(None)
}

/// Whether the requester and `source` run as the same user: every user id
/// of the source process (real, effective, saved, filesystem) is this
/// process's effective one. `Err`: why not, or why it cannot be told.
pub fn same_user(source: &ProcessIdentity) -> Result<(), String> {
    // SAFETY: geteuid has no memory effects.
    let me = unsafe { libc::geteuid() };
    let status = std::fs::read_to_string(format!("/proc/{}/status", source.pid))
        .map_err(|e| format!("cannot read /proc/{}/status to learn its user: {e}", source.pid))?;
    users_agree(&status, me, source.pid)
}

/// Whether the `Uid:` line of `status` (process `pid`'s `/proc/PID/status`)
/// names `me` as every user id of that process: real, effective, saved and
/// filesystem. `Err`: the first that differs, or that the line is missing.
fn users_agree(status: &str, me: u32, pid: u32) -> Result<(), String> {
    let ids: Vec<u32> = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .map(|v| v.split_whitespace().filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_default();
    match ids.iter().find(|&&id| id != me) {
        _ if ids.is_empty() => Err(format!("/proc/{pid}/status names no user")),
        None => Ok(()),
        Some(other) => {
            Err(format!("the source process runs as user {other} and this one as user {me}: cma never crosses users"))
        }
    }
}

/// Whether `source`'s pid names the source process in this process's PID
/// namespace (the calls take a pid): the process there started when the
/// source says it did. `Err`: why not.
pub fn pid_names_it(source: &ProcessIdentity) -> Result<(), String> {
    match process_start_time(source.pid) {
        t if t == source.start_time => Ok(()),
        0 => Err(format!(
            "no process {} is visible in this PID namespace: cma needs both processes in one PID namespace \
             (containers: a shared PID namespace)",
            source.pid
        )),
        _ => Err(format!(
            "process {} of this PID namespace is not the source (another start time): cma needs both processes \
             in one PID namespace",
            source.pid
        )),
    }
}

/// Requester side: whether this process may attach to `source` now, asked
/// of the kernel without touching a byte of it (opening its
/// `/proc/PID/mem` read-only takes the same ptrace access check, Yama's
/// included, as the copies). `Err`: the kernel's refusal, explained.
pub fn may_attach(source: &ProcessIdentity) -> Result<(), String> {
    let path = format!("/proc/{}/mem", source.pid);
    match std::fs::File::open(&path) {
        Ok(_) => Ok(()),
        Err(e) => Err(explain(Yama::read(), &e, source.pid)),
    }
}

/// Why the kernel refused this process access to process `pid` (error
/// `e`), with what would allow it under `yama`.
pub fn explain(yama: Yama, e: &std::io::Error, pid: u32) -> String {
    let what = format!("the kernel refuses this process access to process {pid} ({e})");
    let denied = matches!(e.kind(), ErrorKind::PermissionDenied) || e.raw_os_error() == Some(libc::EPERM);
    if !denied {
        return what;
    }
    let fix = match yama {
        Yama::Absent | Yama::Scope(0) => {
            "the classic ptrace rules refuse it: the source is not dumpable (PR_SET_DUMPABLE 0) or holds \
             capabilities this process lacks"
        }
        Yama::Scope(1) => {
            "Yama ptrace_scope is 1: the source must name this process as its ptracer (its cma_ptracer \"peer\" \
             does so for the first requester, \"any\" for all) or be its descendant"
        }
        Yama::Scope(2) => "Yama ptrace_scope is 2: only a requester with CAP_SYS_PTRACE may copy",
        Yama::Scope(_) => "Yama ptrace_scope is 3: no process may attach to another",
    };
    format!("{what}: {fix}")
}

/// Whether this process may call `process_vm_readv` and
/// `process_vm_writev` at all: each moves one byte within this process,
/// which the ptrace rules always allow, so a refusal is a seccomp filter's
/// (a container's profile) or the kernel's lack of them. `Err`: why not.
pub fn calls_allowed() -> Result<(), String> {
    let mut a = [0x5au8];
    let mut b = [0u8];
    let pid = std::process::id() as libc::pid_t;
    for write in [false, true] {
        let local = libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: 1 };
        let remote = libc::iovec { iov_base: a.as_mut_ptr().cast(), iov_len: 1 };
        // SAFETY: both iovecs name one byte of this thread's stack, alive
        // across the call; the "remote" process is this one.
        let n = unsafe {
            match write {
                false => libc::process_vm_readv(pid, &local, 1, &remote, 1, 0),
                true => libc::process_vm_writev(pid, &local, 1, &remote, 1, 0),
            }
        };
        if n != 1 {
            let call = if write { "process_vm_writev" } else { "process_vm_readv" };
            let e = std::io::Error::last_os_error();
            return Err(format!(
                "{call} is refused in this process ({e}): a seccomp profile (a container's) refuses it, or the \
                 kernel lacks it; allow process_vm_readv and process_vm_writev to use cma"
            ));
        }
        b[0] = 0x33;
    }
    match a[0] {
        0x33 => Ok(()),
        _ => Err("process_vm_writev moved no byte within this process".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::identity::this_process;

    fn p(pid: u32) -> ProcessIdentity {
        ProcessIdentity { pid, start_time: 1000 + pid as u64 }
    }

    /// Guards `decide`: nothing to name without Yama or at scope 0 (and
    /// naming cannot help at 2 and 3); at scope 1 the first requester is
    /// named, named again only while it is the one named, another live one
    /// refused with the reason and the key that changes it, a dead one
    /// replaced; `any` names every process once; `none` never names.
    #[test]
    fn the_source_names_its_requester_only_where_yama_asks_and_keeps_one() {
        let (a, b) = (p(10), p(11));
        for yama in [Yama::Absent, Yama::Scope(0), Yama::Scope(2), Yama::Scope(3)] {
            for policy in [PtracerPolicy::Peer, PtracerPolicy::Any, PtracerPolicy::Never] {
                assert_eq!(decide(yama, policy, a, None), Naming::Nothing, "{yama:?} {policy:?}");
            }
        }
        let one = Yama::Scope(1);
        assert_eq!(decide(one, PtracerPolicy::Peer, a, None), Naming::Name(10));
        assert_eq!(decide(one, PtracerPolicy::Peer, a, Some((Named::Process(a), true))), Naming::Named);
        match decide(one, PtracerPolicy::Peer, b, Some((Named::Process(a), true))) {
            Naming::Refused(why) => {
                assert!(why.contains("names process 10") && why.contains("cma_ptracer"), "{why}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(decide(one, PtracerPolicy::Peer, b, Some((Named::Process(a), false))), Naming::Name(11));
        // A pid reused by another process is another requester.
        let reused = ProcessIdentity { pid: 10, start_time: 5 };
        assert!(matches!(
            decide(one, PtracerPolicy::Peer, reused, Some((Named::Process(a), true))),
            Naming::Refused(_)
        ));
        assert_eq!(decide(one, PtracerPolicy::Any, b, Some((Named::Process(a), true))), Naming::Any);
        assert_eq!(decide(one, PtracerPolicy::Any, b, Some((Named::Any, true))), Naming::Named);
        assert_eq!(decide(one, PtracerPolicy::Peer, b, Some((Named::Any, true))), Naming::Named);
        assert!(matches!(decide(one, PtracerPolicy::Never, a, None), Naming::Refused(w) if w.contains("\"none\"")));
    }

    /// Guards `explain`: a refusal names what allows the access under each
    /// Yama setting; another error is reported as it is.
    #[test]
    fn a_refusal_says_what_would_allow_it() {
        let denied = std::io::Error::from_raw_os_error(libc::EPERM);
        assert!(explain(Yama::Scope(1), &denied, 7).contains("name this process as its ptracer"));
        assert!(explain(Yama::Scope(2), &denied, 7).contains("CAP_SYS_PTRACE"));
        assert!(explain(Yama::Scope(3), &denied, 7).contains("no process may attach"));
        assert!(explain(Yama::Absent, &denied, 7).contains("not dumpable"));
        let gone = std::io::Error::from_raw_os_error(libc::ENOENT);
        let text = explain(Yama::Scope(1), &gone, 7);
        assert!(text.contains("process 7") && !text.contains("ptracer"), "{text}");
    }

    /// Guards `same_user`, `pid_names_it` and `may_attach` on this process
    /// (always allowed) and on identities that name no process.
    #[test]
    fn this_process_may_be_reached_and_a_stranger_may_not() {
        let me = this_process();
        assert_eq!(same_user(&me), Ok(()));
        assert_eq!(pid_names_it(&me), Ok(()));
        assert_eq!(may_attach(&me), Ok(()));
        let reused = ProcessIdentity { start_time: me.start_time + 1, ..me };
        assert!(pid_names_it(&reused).unwrap_err().contains("another start time"));
        let none = ProcessIdentity { pid: i32::MAX as u32, start_time: 1 };
        assert!(pid_names_it(&none).unwrap_err().contains("no process"));
        assert!(same_user(&none).is_err());
        assert!(may_attach(&none).is_err());
    }

    /// Guards `same_user`'s check of every user id of the source
    /// (`users_agree`): a source whose real id is this process's user but
    /// whose effective, saved or filesystem id is another's (a setuid
    /// program, one that changed its effective id) is refused, naming the
    /// other user; all four this user's: allowed; no `Uid:` line: refused.
    #[test]
    fn a_source_with_any_user_id_of_another_user_is_refused() {
        let status = |ids: [u32; 4]| {
            format!(
                "Name:\tsource\nState:\tS (sleeping)\nUid:\t{}\t{}\t{}\t{}\nGid:\t1000\t1000\t1000\t1000\n",
                ids[0], ids[1], ids[2], ids[3]
            )
        };
        assert_eq!(users_agree(&status([1000; 4]), 1000, 7), Ok(()));
        for (i, which) in ["real", "effective", "saved", "filesystem"].iter().enumerate() {
            let mut ids = [1000; 4];
            ids[i] = 0;
            assert_eq!(
                users_agree(&status(ids), 1000, 7),
                Err("the source process runs as user 0 and this one as user 1000: cma never crosses users".into()),
                "only the {which} user id differs"
            );
        }
        assert_eq!(users_agree("Name:\tsource\n", 1000, 7), Err("/proc/7/status names no user".into()));
    }

    #[test]
    fn the_calls_are_allowed_here_and_policies_round_trip() {
        assert_eq!(calls_allowed(), Ok(()));
        for p in [PtracerPolicy::Peer, PtracerPolicy::Any, PtracerPolicy::Never] {
            assert_eq!(PtracerPolicy::from_name(p.name()), Some(p));
        }
        assert_eq!(PtracerPolicy::from_name("all"), None);
    }
}
