//! A process whose seccomp filter refuses the cross-memory calls (as a
//! container's profile may) offers no CMA: its requests for a peer's plain
//! host memory move over TCP, and it says so once, at WARN, when its engine
//! starts, and in its stats. One test per binary: the filter stays on the
//! thread that installs it and on every thread that thread starts, and the
//! log sink is process-wide.

mod common;

use common::*;
use orbite::log::{set_sink, Level};
use orbite::*;
use parking_lot::Mutex;
use std::sync::Arc;

/// Installs, on this thread (and the threads it starts from now on), a
/// seccomp filter that answers `process_vm_readv` and `process_vm_writev`
/// with EPERM and lets every other call through.
fn refuse_cross_memory_calls() {
    let stmt = |code: u32, k: u32| libc::sock_filter { code: code as u16, jt: 0, jf: 0, k };
    let jeq = |k: i64, jt: u8| libc::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt,
        jf: 0,
        k: k as u32,
    };
    let mut filter = [
        // The call's number (`seccomp_data.nr`, offset 0).
        stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0),
        jeq(libc::SYS_process_vm_readv, 2),
        jeq(libc::SYS_process_vm_writev, 1),
        stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW),
        stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32),
    ];
    let prog = libc::sock_fprog { len: filter.len() as u16, filter: filter.as_mut_ptr() };
    // SAFETY: prctl with integers, then with a pointer to a filter program
    // that lives across the call (the kernel copies it).
    unsafe {
        assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1 as libc::c_ulong, 0, 0, 0), 0);
        let r = libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER as libc::c_ulong, &prog as *const _, 0, 0);
        assert_eq!(r, 0, "seccomp: {}", std::io::Error::last_os_error());
    }
}

/// Guards `CmaBackend::new`'s `access::calls_allowed()`: without it the
/// engine offers CMA, AUTO picks it for the peer's heap memory and the
/// READ fails with the kernel's refusal instead of moving over TCP.
#[test]
fn refused_calls_move_requests_over_tcp_and_say_so_once() {
    // The source starts before the filter: it is not filtered.
    let src = PeerProc::spawn(&["--size", "65536", "--seed", "8"]);
    let lines: Arc<Mutex<Vec<(Level, String)>>> = Arc::new(Mutex::new(Vec::new()));
    let sink = lines.clone();
    set_sink(Some(Box::new(move |l, m| sink.lock().push((l, m.to_string()))))).unwrap();
    refuse_cross_memory_calls();
    let e = Engine::from_json("").unwrap();
    assert!(!e.transports().contains(&TransportKind::Cma));
    let cma: Vec<(Level, String)> = lines.lock().iter().filter(|(_, m)| m.contains("cma")).cloned().collect();
    assert_eq!(cma.len(), 1, "{cma:?}");
    assert_eq!(cma[0].0, Level::Warn);
    assert!(cma[0].1.contains("cma is not offered: process_vm_readv is refused in this process"), "{cma:?}");
    let avail = e.stats().transports_available["cma"].clone();
    assert!(avail.starts_with("not available: process_vm_readv is refused"), "{avail}");
    let mut l = vec![0u8; 65536];
    e.register_memory(l.as_mut_ptr() as u64, 65536, Access::NONE).unwrap();
    let p = e.connect(&src.endpoint, None).unwrap();
    assert!(!e.peer_transports(p).unwrap().contains(&TransportKind::Cma));
    let r = Request { op: Op::Read, local_addr: l.as_ptr() as u64, remote_addr: src.addr, len: 65536 };
    let b = e.submit(p, &[r], SubmitOptions::default()).unwrap();
    b.wait(LONG).unwrap();
    assert_eq!(b.transport(0).unwrap(), Some(TransportKind::Tcp));
    assert!((0..65536).all(|i| l[i] == pattern(8, i as u64)));
    // Said once: nothing more about cma since the start.
    assert_eq!(lines.lock().iter().filter(|(_, m)| m.contains("cma")).count(), 1);
    set_sink(None).unwrap();
    e.close(Some(LONG)).unwrap();
    src.close();
}
