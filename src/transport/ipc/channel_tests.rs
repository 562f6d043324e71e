use super::*;
use std::time::Duration;

/// Guards `admits_uid`: only this process's user and the allowed ones.
#[test]
fn only_this_user_and_allowed_users_are_admitted() {
    // SAFETY: geteuid has no memory effects.
    let me = unsafe { libc::geteuid() };
    let other = me.wrapping_add(1);
    assert!(admits_uid(me, &[]));
    assert!(!admits_uid(other, &[]));
    assert!(!admits_uid(other, &[other.wrapping_add(1)]));
    assert!(admits_uid(other, &[other]));
}

#[test]
fn frames_and_fds_cross_the_channel() {
    let name = format!("orbite-test-{}-{}", std::process::id(), line!());
    let l = listen(&name).unwrap();
    let t = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let mut c = Channel::from_stream(s).unwrap();
        // SAFETY: geteuid has no memory effects.
        assert_eq!(c.peer_cred().unwrap(), (std::process::id(), unsafe { libc::geteuid() }));
        let f = c.recv(&mut io::no_abort).unwrap();
        assert_eq!(f.kind, MsgKind::ExportAnswer);
        assert_eq!(f.body, b"hi");
        let a = crate::memory::owners::allocate_shared_host(100).unwrap();
        // SAFETY: the allocation maps at least 100 bytes.
        unsafe { *(a.addr() as *mut u8) = 42 };
        c.send(MsgKind::ExportHandle, b"fd!", a.memfd().as_slice(), &mut io::no_abort).unwrap();
        // Keep the allocation until the peer has mapped it.
        let f = c.recv(&mut io::no_abort).unwrap();
        assert_eq!(f.kind, MsgKind::CloseReceipt);
        a.free().unwrap();
    });
    let mut c = Channel::connect(&name).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let f = c.call(MsgKind::ExportAnswer, b"hi", deadline, "test").unwrap();
    assert_eq!(f.kind, MsgKind::ExportHandle);
    assert_eq!(f.body, b"fd!");
    let fd = f.fd.expect("an fd");
    // SAFETY: mapping the received memfd read-only, 4096 bytes.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ, libc::MAP_SHARED, fd.as_raw_fd(), 0) };
    assert_ne!(p, libc::MAP_FAILED);
    // SAFETY: p maps 4096 readable bytes.
    assert_eq!(unsafe { *(p as *const u8) }, 42);
    // SAFETY: unmapping what we mapped.
    unsafe { libc::munmap(p, 4096) };
    c.send(MsgKind::CloseReceipt, b"", &[], &mut io::no_abort).unwrap();
    t.join().unwrap();
    assert!(matches!(Channel::connect("orbite-no-such-socket-xyz"), Err(Error::StalePeer(_))));
}

/// A listener whose backlog is full (a frozen source, or a process on
/// its name that never accepts) holds a connecting requester until its
/// deadline, not for good. Guards the send timeout `connect_until` sets
/// before it connects.
#[test]
fn a_connect_to_a_full_backlog_ends_at_its_deadline() {
    let name = format!("orbite-test-backlog-{}-{}", std::process::id(), line!());
    let l = listen(&name).unwrap();
    // SAFETY: listen(2) again on a listening socket only sets its backlog.
    assert_eq!(unsafe { libc::listen(l.as_raw_fd(), 0) }, 0);
    // Never accepted: it fills the backlog.
    let _first = Channel::connect_until(&name, Instant::now() + Duration::from_secs(60)).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let n = name.clone();
    std::thread::spawn(move || {
        let t0 = Instant::now();
        let r = Channel::connect_until(&n, t0 + Duration::from_millis(200));
        let _ = tx.send((r.map(|_| ()).map_err(|e| e.status()), t0.elapsed()));
    });
    let (got, took) = rx.recv_timeout(Duration::from_secs(20)).expect("the connect waited past its deadline");
    assert_eq!(got, Err(crate::error::Status::TimedOut));
    assert!(took < Duration::from_secs(10), "took {took:?}");
    drop(l);
}

/// A loopback TCP port bound, never listened on, and kept bound for the
/// process's life (its socket is leaked): connecting to it is refused.
fn bound_unlistened_port() -> u16 {
    // SAFETY: plain socket calls on a descriptor made here, with a
    // zeroed sockaddr_in of the right size.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(fd >= 0);
        let mut a: libc::sockaddr_in = std::mem::zeroed();
        a.sin_family = libc::AF_INET as libc::sa_family_t;
        a.sin_addr.s_addr = u32::from_ne_bytes([127, 0, 0, 1]);
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        assert_eq!(libc::bind(fd, (&a as *const libc::sockaddr_in).cast(), len), 0);
        let mut got = len;
        assert_eq!(libc::getsockname(fd, (&mut a as *mut libc::sockaddr_in).cast(), &mut got), 0);
        u16::from_be(a.sin_port)
    }
}

#[test]
fn tcp_channels_carry_frames_but_no_descriptors() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let ep = l.local_addr().unwrap().to_string();
    let t = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let mut c = Channel::from_tcp(s).unwrap();
        assert!(c.is_tcp());
        assert_eq!(c.peer_cred().unwrap_err().status(), crate::error::Status::NotSupported);
        let f = c.recv(&mut io::no_abort).unwrap();
        assert_eq!((f.kind, f.body.as_slice(), f.fd.is_none()), (MsgKind::IpcHello, &b"hello"[..], true));
        let a = crate::memory::owners::allocate_shared_host(100).unwrap();
        let e = c.send(MsgKind::ExportHandle, b"fd", a.memfd().as_slice(), &mut io::no_abort).unwrap_err();
        assert_eq!(e.status(), crate::error::Status::NotSupported, "{e}");
        c.send(MsgKind::IpcWelcome, b"welcome", &[], &mut io::no_abort).unwrap();
        a.free().unwrap();
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut c = Channel::connect_tcp(&ep, deadline).unwrap();
    let f = c.call(MsgKind::IpcHello, b"hello", deadline, "test").unwrap();
    assert_eq!((f.kind, f.body.as_slice()), (MsgKind::IpcWelcome, &b"welcome"[..]));
    t.join().unwrap();
    // Nobody listens at a port held bound without listening (a freed
    // port could be taken by another test's listener meanwhile): the
    // source is gone.
    let held = bound_unlistened_port();
    let nobody = format!("127.0.0.1:{held}");
    assert!(matches!(Channel::connect_tcp(&nobody, deadline), Err(Error::StalePeer(_))));
}

/// A frame carrying more descriptors than its kind may is refused,
/// whatever the count (those beyond the kept two are counted too).
#[test]
fn a_frame_with_too_many_descriptors_is_refused() {
    let memfd = || crate::memory::owners::sealable_memfd(c"t", 4096, "a test file").unwrap();
    let files = [memfd(), memfd(), memfd()];
    let raw: Vec<RawFd> = files.iter().map(|f| f.as_raw_fd()).collect();
    for (kind, count, refused) in [
        (MsgKind::IpcWelcome, 2, false),
        (MsgKind::IpcWelcome, 3, true),
        (MsgKind::ExportHandle, 1, false),
        (MsgKind::ExportHandle, 2, true),
        (MsgKind::MnnvlProbeAnswer, 1, false),
        (MsgKind::MnnvlProbeAnswer, 2, true),
        (MsgKind::Ack, 1, true),
    ] {
        let (a, b) = UnixStream::pair().unwrap();
        let (tx, mut rx) = (Channel::from_stream(a).unwrap(), Channel::from_stream(b).unwrap());
        let frame = FrameHeader::encode(kind, 0);
        // One sendmsg carrying `count` descriptors (Channel::send
        // carries at most MAX_FDS; a hostile peer is not bound by it).
        let mut iov = libc::iovec { iov_base: frame.as_ptr() as *mut libc::c_void, iov_len: frame.len() };
        let mut cbuf = [0u64; 8];
        // SAFETY: an all-zero msghdr is valid; the fields are set below.
        let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
        mh.msg_iov = &mut iov;
        mh.msg_iovlen = 1;
        let payload = (count * std::mem::size_of::<RawFd>()) as u32;
        // SAFETY: CMSG_SPACE is a pure size computation; mh points at
        // cbuf, which has room for one cmsg of three fds; the sendmsg
        // reads buffers alive for the call.
        unsafe {
            mh.msg_control = cbuf.as_mut_ptr().cast();
            mh.msg_controllen = libc::CMSG_SPACE(payload) as _;
            let c = libc::CMSG_FIRSTHDR(&mh);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(payload) as _;
            for (k, fd) in raw[..count].iter().enumerate() {
                std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>().add(k), *fd);
            }
            assert_eq!(libc::sendmsg(tx.raw_fd(), &mh, 0), frame.len() as isize);
        }
        let got = rx.recv(&mut io::no_abort);
        assert_eq!(got.is_err(), refused, "{kind:?} with {count} descriptors");
        if let Ok(f) = got {
            assert_eq!(f.fd.is_some() as usize + f.second_fd.is_some() as usize, count);
        }
    }
}

/// No IPC frame is larger than a control body, whatever its kind: a peer
/// announcing a data frame (whose header bound is a payload's, 1 GiB) of
/// one byte more is refused on its header, its body left unread (a frame
/// of exactly the bound is taken). Guards `recv_bounded`'s
/// `header.body_len > MAX_CONTROL_BODY` (widened, the body is read and the
/// frame handed on).
#[test]
fn an_ipc_frame_larger_than_a_control_body_is_refused() {
    use crate::control::frame::MAX_CONTROL_BODY;
    for (len, refused) in [(MAX_CONTROL_BODY, false), (MAX_CONTROL_BODY + 1, true)] {
        let (a, b) = UnixStream::pair().unwrap();
        let mut rx = Channel::from_stream(b).unwrap();
        // The whole frame is written (the reader may stop after its header).
        let writer = std::thread::spawn(move || {
            let mut a = a;
            let _ = a.write_all(&FrameHeader::encode(MsgKind::WriteRequest, len));
            let _ = a.write_all(&vec![0x5a; len as usize]);
        });
        match rx.recv(&mut io::no_abort) {
            Ok(f) => {
                assert!(!refused, "a frame of {len} bytes taken");
                assert_eq!((f.kind, f.body.len()), (MsgKind::WriteRequest, len as usize));
            }
            Err(e) => {
                assert!(refused, "a frame of {len} bytes refused: {e}");
                assert!(
                    matches!(&e, Error::Protocol(m) if m == &format!("IPC frame of {len} bytes is too large")),
                    "{e}"
                );
            }
        }
        drop(rx);
        writer.join().unwrap();
    }
}

/// An abstract socket name of exactly `MAX_IPC_NAME` bytes (all of
/// `sun_path` after its leading NUL) is connectable: the listener takes
/// the connection and the frame sent on it. One byte longer is refused
/// `INVALID_ARGUMENT` before any socket is made, naming the name. Guards
/// `connect_until`'s `name.len() > crate::control::message::MAX_IPC_NAME`
/// (round 17 R12: with `>=` the longest name was refused).
#[test]
fn the_longest_abstract_name_connects_and_one_byte_more_is_refused() {
    use crate::control::message::MAX_IPC_NAME;
    let prefix = format!("orbite-test-longest-{}-", std::process::id());
    let name = format!("{prefix}{}", "n".repeat(MAX_IPC_NAME - prefix.len()));
    assert_eq!(name.len(), MAX_IPC_NAME);
    let l = listen(&name).unwrap();
    let t = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let f = Channel::from_stream(s).unwrap().recv(&mut io::no_abort).unwrap();
        (f.kind, f.body)
    });
    let mut c = Channel::connect(&name).unwrap();
    c.send(MsgKind::IpcHello, b"longest", &[], &mut io::no_abort).unwrap();
    assert_eq!(t.join().unwrap(), (MsgKind::IpcHello, b"longest".to_vec()));
    let longer = format!("{name}n");
    let e = Channel::connect(&longer).map(|_| ()).unwrap_err();
    assert_eq!(e.status(), crate::error::Status::InvalidArgument, "{e}");
    assert_eq!(e.message(), format!("{longer:?} is not an abstract socket name"));
}
