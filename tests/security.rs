//! Who may touch the memory: a shared key on every control connection and
//! IPC channel, IPC channels only for this user's processes, sealed shared
//! memory, local-only regions unpublished and unguessable epochs.

use orbite::control::frame::{FrameHeader, MsgKind, FRAME_HEADER_LEN};
use orbite::control::message;
use orbite::control::Identity;
use orbite::transport::ipc::channel::Channel;
use orbite::transport::ipc::messages::Hello;
use orbite::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::time::Instant;

mod hostile;
use hostile::{describe_bytes, LONG};

/// A private key file of `fill` bytes in a fresh directory.
fn key_file(name: &str, fill: u8) -> String {
    let dir = std::env::temp_dir().join(format!("orbite-security-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("key");
    std::fs::write(&p, [fill; 48]).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p.to_str().unwrap().to_string()
}

fn with_key(path: &str) -> String {
    format!(r#"{{"auth_key_file": "{path}"}}"#)
}

/// Two engines sharing a key move bytes over TCP and SHM as before.
#[test]
fn engines_sharing_a_key_move_bytes_over_tcp_and_shm() {
    let k = key_file("shared", 1);
    let src = Engine::from_json(&with_key(&k)).unwrap();
    let req = Engine::from_json(&with_key(&k)).unwrap();
    let shared = allocate_shared_host(4096).unwrap();
    // SAFETY: the allocation maps 4096 bytes.
    unsafe { std::ptr::write_bytes(shared.addr() as *mut u8, 0x5a, 4096) };
    let mut heap = vec![0x3cu8; 4096];
    src.register_memory(shared.addr(), 4096, Access::READ).unwrap();
    src.register_memory(heap.as_mut_ptr() as u64, 4096, Access::READ).unwrap();
    let mut local = vec![0u8; 8192];
    req.register_memory(local.as_mut_ptr() as u64, 8192, Access::NONE).unwrap();
    let peer = req.connect(&src.endpoint(), Some(LONG)).unwrap();
    let rd = |remote: u64, at: u64| Request {
        op: Op::Read,
        local_addr: local.as_ptr() as u64 + at,
        remote_addr: remote,
        len: 4096,
    };
    // The shared block goes over SHM (an authenticated IPC channel), the
    // heap block over TCP.
    let b = req.submit(peer, &[rd(shared.addr(), 0)], SubmitOptions::default()).unwrap();
    b.wait(LONG).unwrap();
    assert_eq!(b.transport(0).unwrap(), Some(TransportKind::Shm));
    let b = req.submit(peer, &[rd(heap.as_ptr() as u64, 4096)], SubmitOptions::default()).unwrap();
    b.wait(LONG).unwrap();
    assert_eq!(b.transport(0).unwrap(), Some(TransportKind::Tcp));
    assert!(local[..4096].iter().all(|x| *x == 0x5a) && local[4096..].iter().all(|x| *x == 0x3c));
    assert_eq!(src.stats().auth_failures, 0);
    req.close(Some(LONG)).unwrap();
    src.close(Some(LONG)).unwrap();
    shared.free().unwrap();
}

/// A wrong key, a missing key and an unexpected key are each refused with
/// PERMISSION_DENIED before anything is revealed, and counted.
#[test]
fn a_wrong_or_missing_key_is_refused_on_tcp() {
    let k = key_file("right", 1);
    let wrong = key_file("wrong", 2);
    let src = Engine::from_json(&with_key(&k)).unwrap();
    let mut remote = vec![9u8; 64];
    src.register_memory(remote.as_mut_ptr() as u64, 64, Access::READ).unwrap();
    let ep = src.endpoint();

    let other = Engine::from_json(&with_key(&wrong)).unwrap();
    let e = other.connect(&ep, Some(LONG)).unwrap_err();
    assert_eq!(e.status(), Status::PermissionDenied, "{e}");
    assert!(e.message().contains("does not know this engine's auth key"), "{e}");

    let none = Engine::from_json("").unwrap();
    let e = none.connect(&ep, Some(LONG)).unwrap_err();
    assert_eq!(e.status(), Status::PermissionDenied, "{e}");
    assert!(e.message().contains("requires authentication"), "{e}");

    // A raw peer that opens with a Describe learns nothing but the refusal.
    let mut s = TcpStream::connect(&ep).unwrap();
    s.write_all(&describe_bytes()).unwrap();
    let mut all = Vec::new();
    s.set_read_timeout(Some(LONG)).unwrap();
    let _ = s.read_to_end(&mut all);
    let h = FrameHeader::decode(all[..FRAME_HEADER_LEN].try_into().unwrap()).unwrap();
    assert_eq!(h.kind, MsgKind::Error, "only an Error frame comes back");
    assert_eq!(all.len(), FRAME_HEADER_LEN + h.body_len as usize, "nothing after the refusal");
    let (st, _) = message::decode_error(&all[FRAME_HEADER_LEN..]).unwrap();
    assert_eq!(st, Status::PermissionDenied);

    // The key on the connecting side only: refused by the keyless engine.
    let keyless = Engine::from_json("").unwrap();
    let e = other.connect(&keyless.endpoint(), Some(LONG)).unwrap_err();
    assert_eq!(e.status(), Status::PermissionDenied, "{e}");
    assert!(e.message().contains("no auth_key_file"), "{e}");

    assert_eq!(src.stats().auth_failures, 3);
    assert_eq!(keyless.stats().auth_failures, 1);
    let _ = &mut remote;
}

/// An engine refuses a key file others could read, or one too short.
#[test]
fn key_files_must_be_private() {
    let k = key_file("loose", 1);
    std::fs::set_permissions(&k, std::fs::Permissions::from_mode(0o640)).unwrap();
    let e = Engine::from_json(&with_key(&k)).err().unwrap();
    assert_eq!(e.status(), Status::InvalidConfig);
    assert!(e.message().contains("auth_key_file") && e.message().contains("chmod 600"), "{e}");
}

fn channel_name(e: &Engine) -> String {
    let id = e.identity();
    format!("orbite-{}-{:016x}", id.process.pid, id.engine_epoch)
}

fn read_frame(ch: &mut Channel) -> (MsgKind, Vec<u8>) {
    let deadline = Instant::now() + LONG;
    let f = ch.recv(&mut || orbite::transport::ipc::channel::deadline_tick(deadline, "answer")).unwrap();
    (f.kind, f.body)
}

/// With a key, an IPC channel that does not authenticate is refused before
/// its Hello is even read.
#[test]
fn an_ipc_channel_without_the_key_is_refused() {
    let k = key_file("ipc", 1);
    let src = Engine::from_json(&with_key(&k)).unwrap();
    let mut ch = Channel::connect(&channel_name(&src)).unwrap();
    let hello = Hello {
        identity: Identity::fresh(),
        expected_source_epoch: src.identity().engine_epoch,
        transport: TransportKind::Shm as u32,
        fabric_domain: [0; 16],
    };
    let deadline = Instant::now() + LONG;
    ch.send(MsgKind::IpcHello, &hello.encode(), None, &mut || {
        orbite::transport::ipc::channel::deadline_tick(deadline, "hello")
    })
    .unwrap();
    let (kind, body) = read_frame(&mut ch);
    assert_eq!(kind, MsgKind::Error);
    let (st, text) = message::decode_error(&body).unwrap();
    assert_eq!(st, Status::PermissionDenied, "{text}");
    assert!(text.contains("requires authentication"), "{text}");
    assert_eq!(src.stats().auth_failures, 1);
}

/// Only this user's processes (or listed uids) may open an IPC channel: a
/// process of user `nobody` is refused before it can say anything. Needs
/// root to change user, as CI runs.
#[test]
fn a_process_of_another_user_is_refused_an_ipc_channel() {
    // SAFETY: geteuid has no memory effects.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test changes user: run it as root (CI does)");
    let src = Engine::from_json("").unwrap();
    let name = channel_name(&src);
    // Everything the child needs is prepared before fork: after it, the
    // child only makes system calls.
    // SAFETY: an all-zero sockaddr_un is valid; the fields are set below.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path[1..].iter_mut().zip(name.as_bytes()) {
        *d = *s as libc::c_char;
    }
    let addr_len = (std::mem::size_of::<libc::sa_family_t>() + 1 + name.len()) as libc::socklen_t;
    let hello = Hello { identity: Identity::fresh(), expected_source_epoch: 1, transport: 1, fabric_domain: [0; 16] };
    let body = hello.encode();
    let mut frame = FrameHeader::encode(MsgKind::IpcHello, body.len() as u32).to_vec();
    frame.extend(body);
    let mut answer = [0u8; 256];
    // SAFETY: fork; the child below only calls async-signal-safe functions
    // on memory prepared before the fork, then _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: plain system calls on the prepared buffers; _exit never returns.
        unsafe {
            if libc::setgid(65534) != 0 || libc::setuid(65534) != 0 {
                libc::_exit(10);
            }
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            if libc::connect(fd, (&addr as *const libc::sockaddr_un).cast(), addr_len) != 0 {
                libc::_exit(11);
            }
            let _ = libc::write(fd, frame.as_ptr().cast(), frame.len());
            let mut got = 0usize;
            loop {
                let n = libc::read(fd, answer[got..].as_mut_ptr().cast(), answer.len() - got);
                if n <= 0 {
                    break;
                }
                got += n as usize;
            }
            // An Error frame (kind 7) whose status is PERMISSION_DENIED (7).
            let ok = got > FRAME_HEADER_LEN + 4 && answer[6] == 7 && answer[FRAME_HEADER_LEN] == 7;
            libc::_exit(if ok { 0 } else { 12 });
        }
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status), "child status {status}");
    assert_eq!(libc::WEXITSTATUS(status), 0, "the child was not refused with PERMISSION_DENIED");
    assert_eq!(src.stats().ipc_uid_refusals, 1);
    // The owner's own requester still gets its channel.
    let req = Engine::from_json("").unwrap();
    let a = allocate_shared_host(4096).unwrap();
    src.register_memory(a.addr(), 4096, Access::READ).unwrap();
    let mut local = vec![0u8; 4096];
    req.register_memory(local.as_mut_ptr() as u64, 4096, Access::NONE).unwrap();
    let peer = req.connect(&src.endpoint(), Some(LONG)).unwrap();
    let r = Request { op: Op::Read, local_addr: local.as_ptr() as u64, remote_addr: a.addr(), len: 4096 };
    let b = req
        .submit(peer, &[r], SubmitOptions { transport: Transport::Only(TransportKind::Shm), timeout: None })
        .unwrap();
    b.wait(LONG).unwrap();
    req.close(Some(LONG)).unwrap();
    src.close(Some(LONG)).unwrap();
    a.free().unwrap();
}
