//! Helpers for multi-process tests: a real `orbite-peer` source process.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

pub mod relay;

/// Generous deadline for anything that must finish (2-core CI machines).
pub const LONG: Duration = Duration::from_secs(120);

/// The byte at offset `i` of pattern `seed` (same as orbite-peer).
pub fn pattern(seed: u64, i: u64) -> u8 {
    (i.wrapping_mul(131).wrapping_add(seed.wrapping_mul(7)).wrapping_add(i >> 12)) as u8
}

/// `len` bytes of pattern `seed`.
pub fn pattern_vec(seed: u64, len: usize) -> Vec<u8> {
    (0..len as u64).map(|i| pattern(seed, i)).collect()
}

/// FNV-1a of `bytes` (what orbite-peer's requester reports after a READ).
pub fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ *b as u64).wrapping_mul(0x100_0000_01b3))
}

/// A running orbite-peer source process.
pub struct PeerProc {
    pub child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    pub endpoint: String,
    pub addr: u64,
    pub len: u64,
    pub pid: u32,
    pub extra_addr: u64,
    pub extra_len: u64,
    pub addrs: Vec<u64>,
    /// Every engine's endpoint (`--engines N`; one otherwise).
    pub endpoints: Vec<String>,
}

/// Starts `orbite-peer` with `args`; returns it with its pipes and the
/// first line it printed.
fn launch(args: &[&str]) -> (Child, ChildStdin, BufReader<ChildStdout>, String) {
    launch_cmd(Command::new(env!("CARGO_BIN_EXE_orbite-peer")).args(args).stderr(Stdio::inherit()))
}

/// Starts `cmd` (which runs `orbite-peer`, its stderr set) with piped
/// stdin and stdout; returns it with its pipes and the first line it
/// printed.
fn launch_cmd(cmd: &mut Command) -> (Child, ChildStdin, BufReader<ChildStdout>, String) {
    let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("spawn orbite-peer");
    let stdin = child.stdin.take().expect("stdin");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("read the first line of orbite-peer");
    (child, stdin, stdout, line)
}

impl PeerProc {
    /// Starts `orbite-peer` with `args` and reads its description line.
    pub fn spawn(args: &[&str]) -> PeerProc {
        PeerProc::described(launch(args))
    }

    /// Starts `orbite-peer` with `args` in a PID namespace of its own with
    /// the `/proc` of it, as a container beside this process on the host's
    /// network runs it (`unshare --pid --fork --mount-proc --kill-child`;
    /// `--user` too when not root). `pid` is `unshare`'s, which `signal`
    /// reaches: its death kills the peer.
    pub fn spawn_in_pid_namespace(args: &[&str]) -> PeerProc {
        let mut cmd = Command::new("unshare");
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            cmd.args(["--user", "--map-root-user"]);
        }
        cmd.args(["--pid", "--fork", "--mount-proc", "--kill-child", env!("CARGO_BIN_EXE_orbite-peer")]).args(args);
        let mut p = PeerProc::described(launch_cmd(cmd.stderr(Stdio::inherit())));
        p.pid = p.child.id();
        p
    }

    /// Starts `orbite-peer` with `args` and `stderr` (a pipe nobody reads,
    /// a file) and reads its description line.
    pub fn spawn_with_stderr(args: &[&str], stderr: Stdio) -> PeerProc {
        PeerProc::described(launch_cmd(Command::new(env!("CARGO_BIN_EXE_orbite-peer")).args(args).stderr(stderr)))
    }

    /// A peer from its process, pipes and description line.
    fn described((child, stdin, stdout, line): (Child, ChildStdin, BufReader<ChildStdout>, String)) -> PeerProc {
        let v: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("bad peer line {line:?}: {e}"));
        PeerProc {
            endpoint: v["endpoint"].as_str().expect("endpoint").to_string(),
            addr: v["addr"].as_u64().expect("addr"),
            len: v["len"].as_u64().expect("len"),
            pid: v["pid"].as_u64().expect("pid") as u32,
            extra_addr: v["extra_addr"].as_u64().unwrap_or(0),
            extra_len: v["extra_len"].as_u64().unwrap_or(0),
            addrs: v["addrs"].as_array().map(|a| a.iter().filter_map(|x| x.as_u64()).collect()).unwrap_or_default(),
            endpoints: v["endpoints"]
                .as_array()
                .map(|a| a.iter().filter_map(|x| x.as_str().map(String::from)).collect())
                .unwrap_or_default(),
            child,
            stdin,
            stdout,
        }
    }

    /// Starts `orbite-peer` as a requester of `endpoint` that READs `spec`
    /// (`ADDR:LEN`) once with `config`; asserts the read succeeded.
    pub fn spawn_requester(endpoint: &str, spec: &str, config: &str) -> PeerProc {
        let (child, stdin, stdout, line) = launch(&["--connect", endpoint, "--read", spec, "--config", config]);
        assert!(line.starts_with("ok "), "the requester's first read failed: {line:?}");
        PeerProc::of_requester(child, stdin, stdout, endpoint)
    }

    /// Starts `orbite-peer --import` (a hostile importer, see
    /// `src/bin/common/importer.rs`) on the SHM channel of the engine at
    /// `endpoint`, asking for `count` exports of `[addr, addr+len)`
    /// (writable with `w`); returns it and its first line ("held ...").
    pub fn spawn_importer(endpoint: &str, addr: u64, len: u64, w: bool, count: u64) -> (PeerProc, String) {
        let grant = format!("{addr}:{len}{}", if w { ":w" } else { "" });
        let (child, stdin, stdout, line) =
            launch(&["--import", endpoint, "--grant", &grant, "--count", &count.to_string()]);
        (PeerProc::of_requester(child, stdin, stdout, endpoint), line.trim().to_string())
    }

    /// A requester-side peer (no buffers of its own) of `endpoint`.
    fn of_requester(child: Child, stdin: ChildStdin, stdout: BufReader<ChildStdout>, endpoint: &str) -> PeerProc {
        PeerProc {
            endpoint: endpoint.to_string(),
            addr: 0,
            len: 0,
            pid: child.id(),
            extra_addr: 0,
            extra_len: 0,
            addrs: Vec::new(),
            endpoints: Vec::new(),
            child,
            stdin,
            stdout,
        }
    }

    /// Sends a command line and returns the reply line.
    pub fn cmd(&mut self, c: &str) -> String {
        self.send(c);
        self.reply()
    }

    /// Sends a command line without waiting for its reply.
    pub fn send(&mut self, c: &str) {
        writeln!(self.stdin, "{c}").expect("write command");
        self.stdin.flush().expect("flush");
    }

    /// The next reply line.
    pub fn reply(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("read reply");
        line.trim().to_string()
    }

    /// The peer's stats, parsed.
    pub fn stats(&mut self) -> serde_json::Value {
        serde_json::from_str(&self.cmd("stats")).expect("stats JSON")
    }

    /// Sends a signal to the process.
    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid; no memory is touched.
        let r = unsafe { libc::kill(self.pid as i32, sig) };
        assert_eq!(r, 0, "kill({}, {sig})", self.pid);
    }

    /// Stops the process (SIGSTOP) and waits until every thread of it has
    /// stopped (waitpid with WUNTRACED reports the completed group stop).
    pub fn freeze(&self) {
        self.signal(libc::SIGSTOP);
        let mut status = 0;
        // SAFETY: waitpid on our own child; status is a valid out-pointer.
        let r = unsafe { libc::waitpid(self.pid as i32, &mut status, libc::WUNTRACED) };
        assert_eq!(r, self.pid as i32, "waitpid(WUNTRACED)");
        assert!(libc::WIFSTOPPED(status), "child did not stop: status {status}");
    }

    /// SIGKILL and reap.
    pub fn kill(mut self) {
        self.signal(libc::SIGKILL);
        let _ = self.child.wait();
    }

    /// Orderly close and reap; asserts a clean exit.
    pub fn close(mut self) {
        assert_eq!(self.cmd("close"), "closed");
        let st = self.child.wait().expect("wait");
        assert!(st.success(), "peer exited with {st}");
    }
}

impl Drop for PeerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The Describe of the engine at `endpoint` (a control handshake, frame by
/// frame, with a fresh identity of this process).
pub fn describe_of(endpoint: &str) -> orbite::control::message::Describe {
    use orbite::control::frame::MsgKind;
    use orbite::control::io::{self, HeaderRead};
    use orbite::control::message::Describe;
    let mine = Describe {
        identity: orbite::control::Identity::fresh().unwrap(),
        capabilities: 1,
        fabric_domain: [0; 16],
        endpoint: "127.0.0.1:1".into(),
        ipc_name: String::new(),
        regions: vec![],
    };
    let mut s = std::net::TcpStream::connect(endpoint).expect("connect");
    s.set_read_timeout(Some(io::TICK)).unwrap();
    let deadline = std::time::Instant::now() + LONG;
    let mut tick = || {
        if std::time::Instant::now() >= deadline {
            return Err(orbite::Error::TimedOut("handshake".into()));
        }
        Ok(())
    };
    io::write_frame(&mut s, MsgKind::Describe, &mine.encode(), &mut tick).expect("send Describe");
    let HeaderRead::Frame(h) = io::read_header(&mut s, &mut tick).expect("answer") else { panic!("no answer") };
    assert_eq!(h.kind, MsgKind::Describe);
    Describe::decode(&io::read_body(&mut s, h.body_len, &mut tick).expect("body")).expect("Describe")
}

/// Opens the IPC channel of the engine at `endpoint` for `transport`, as
/// this process (honest pid and boot) expecting `epoch` (None: the engine's
/// own), and returns the channel and the first answer's kind and body.
pub fn ipc_hello(
    endpoint: &str,
    transport: orbite::TransportKind,
    identity: orbite::control::Identity,
    epoch: Option<u64>,
) -> (orbite::transport::ipc::channel::Channel, orbite::control::frame::MsgKind, Vec<u8>) {
    use orbite::transport::ipc::{channel::Channel, messages::Hello};
    let d = describe_of(endpoint);
    let mut ch = Channel::connect(&d.ipc_name).expect("IPC channel");
    let hello = Hello {
        identity,
        expected_source_epoch: epoch.unwrap_or(d.identity.engine_epoch),
        transport: transport as u32,
        fabric_domain: [0; 16],
    };
    let f =
        ch.call(orbite::control::frame::MsgKind::IpcHello, &hello.encode(), std::time::Instant::now() + LONG, "hello");
    let f = f.expect("an answer to the hello");
    (ch, f.kind, f.body)
}

/// A hand-made export request for `[addr, addr+len)` (READ) to the engine
/// at `endpoint` over `transport`'s IPC channel: the source's offer, or the
/// status it refused with. An offer is declined again at once.
pub fn ipc_export_request(
    endpoint: &str,
    transport: orbite::TransportKind,
    addr: u64,
    len: u64,
) -> Result<orbite::transport::ipc::messages::ExportOffer, orbite::Status> {
    use orbite::control::frame::MsgKind;
    use orbite::transport::ipc::messages::{decode_reject, ExportOffer, ExportRef, ExportRequest, OP_READ};
    let d = describe_of(endpoint);
    let region = d.regions.iter().find(|r| r.contains(addr, len)).expect("a published region");
    let (mut ch, kind, _) = ipc_hello(endpoint, transport, orbite::control::Identity::fresh().unwrap(), None);
    assert_eq!(kind, MsgKind::IpcWelcome);
    let deadline = std::time::Instant::now() + LONG;
    let req = ExportRequest { tag: 1, region_epoch: region.epoch, addr, len, ops: OP_READ, wait_ms: 1000 };
    let f = ch.call(MsgKind::ExportRequest, &req.encode(), deadline, "export request").expect("an answer");
    match f.kind {
        MsgKind::ExportOffer => {
            let o = ExportOffer::decode(&f.body).expect("offer");
            let decline = ExportRef { export_id: o.export_id, token: o.token, value: 0, extra: 0 };
            let _ = ch.call(MsgKind::ExportAnswer, &decline.encode(), deadline, "decline");
            Ok(o)
        }
        MsgKind::ExportReject => Err(decode_reject(&f.body).expect("reject").1.status()),
        other => panic!("export request answered with {other:?}"),
    }
}

/// A private key file (48 bytes of `fill`, mode 0600) in a fresh
/// directory named after this process and `tag`; its path.
pub fn key_file(tag: &str, fill: u8) -> String {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("orbite-key-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("key");
    std::fs::write(&p, [fill; 48]).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p.to_str().unwrap().to_string()
}

/// Threads of this process now.
pub fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").expect("/proc/self/task").count()
}

/// This process's resident memory, in KiB.
pub fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS");
    line.split_whitespace().nth(1).and_then(|x| x.parse().ok()).expect("VmRSS value")
}

/// Raises this process's descriptor limit to its hard limit (children
/// inherit it); asserts at least `need` are allowed.
pub fn raise_fd_limit(need: u64) {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit with a valid rlimit out-/in-pointer.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        lim.rlim_cur = lim.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
    }
    assert!(lim.rlim_cur >= need, "this test needs {need} file descriptors; the hard limit is {}", lim.rlim_max);
}

/// A raw control connection to `endpoint` after its handshake (this
/// process's fresh identity, TCP only), and the source's Describe.
pub fn raw_control(endpoint: &str) -> (std::net::TcpStream, orbite::control::message::Describe) {
    raw_control_over(std::net::TcpStream::connect(endpoint).unwrap())
}

/// [`raw_control`] over a stream already connected.
pub fn raw_control_over(mut s: std::net::TcpStream) -> (std::net::TcpStream, orbite::control::message::Describe) {
    use orbite::control::frame::{FrameHeader, MsgKind, FRAME_HEADER_LEN};
    use orbite::control::message::Describe;
    use std::io::Read;
    let mine = Describe {
        identity: orbite::control::Identity::fresh().unwrap(),
        capabilities: orbite::TransportKind::Tcp.capability_bit(),
        fabric_domain: [0; 16],
        endpoint: "127.0.0.1:1".into(),
        ipc_name: String::new(),
        regions: vec![],
    };
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let body = mine.encode();
    s.write_all(&FrameHeader::encode(MsgKind::Describe, body.len() as u32)).unwrap();
    s.write_all(&body).unwrap();
    let mut h = [0u8; FRAME_HEADER_LEN];
    s.read_exact(&mut h).unwrap();
    let h = FrameHeader::decode(&h).unwrap();
    assert_eq!(h.kind, MsgKind::Describe);
    let mut body = vec![0u8; h.body_len as usize];
    s.read_exact(&mut body).unwrap();
    (s, Describe::decode(&body).unwrap())
}

/// Frees `a`, retrying while the exports that hold it end (up to `LONG`).
pub fn free_eventually(mut a: orbite::Allocation) {
    let t0 = std::time::Instant::now();
    loop {
        match a.free() {
            Ok(()) => return,
            Err((back, e)) => {
                assert!(t0.elapsed() < LONG, "the allocation stays exported: {e}");
                a = back;
                std::thread::yield_now();
            }
        }
    }
}

/// Waits (polling, up to `LONG`) until `f` holds; `what` names it.
pub fn eventually(what: &str, f: impl Fn() -> bool) {
    let t0 = std::time::Instant::now();
    while !f() {
        assert!(t0.elapsed() < LONG, "never: {what}");
        std::thread::yield_now();
    }
}

/// Connects `req` to a fake source on loopback: it answers the handshake
/// with `real_source`'s Describe (TCP only), then `behave`s with the
/// socket. Returns the peer id.
pub fn connect_fake_source(
    req: &orbite::Engine,
    real_source: &str,
    behave: impl FnOnce(std::net::TcpStream) + Send + 'static,
) -> u64 {
    let mut d = describe_of(real_source);
    d.capabilities = orbite::TransportKind::Tcp.capability_bit();
    d.ipc_name = String::new();
    connect_fake_source_as(req, &d, behave)
}

/// Connects `req` to a fake source on loopback that answers the handshake
/// with `d`, then `behave`s with the socket: the connect's outcome (a
/// Describe the requester refuses is its Err).
pub fn try_connect_fake_source_as(
    req: &orbite::Engine,
    d: &orbite::control::message::Describe,
    behave: impl FnOnce(std::net::TcpStream) + Send + 'static,
) -> orbite::Result<u64> {
    use orbite::control::frame::{FrameHeader, MsgKind, FRAME_HEADER_LEN};
    use std::io::Read;
    let body = d.encode();
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let ep = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut h = [0u8; FRAME_HEADER_LEN];
        s.read_exact(&mut h).unwrap();
        let h = FrameHeader::decode(&h).unwrap();
        let mut theirs = vec![0u8; h.body_len as usize];
        s.read_exact(&mut theirs).unwrap();
        s.write_all(&FrameHeader::encode(MsgKind::Describe, body.len() as u32)).unwrap();
        s.write_all(&body).unwrap();
        behave(s);
    });
    req.connect(&ep, None)
}

/// Connects `req` to a fake source on loopback that answers the handshake
/// with `d`, then `behave`s with the socket. Returns the peer id.
pub fn connect_fake_source_as(
    req: &orbite::Engine,
    d: &orbite::control::message::Describe,
    behave: impl FnOnce(std::net::TcpStream) + Send + 'static,
) -> u64 {
    try_connect_fake_source_as(req, d, behave).unwrap()
}

/// Closes `s` with a reset: SO_LINGER {on, 0} makes close() send RST
/// (a peer that dies, or resets on purpose).
pub fn reset(s: std::net::TcpStream) {
    use std::os::fd::AsRawFd;
    let l = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: setsockopt on a socket this function owns, with a valid linger.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&l as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "SO_LINGER: {}", std::io::Error::last_os_error());
    drop(s);
}

/// Reads one request frame (header and fixed part; a WRITE's payload is
/// left in the socket) and returns its tag.
pub fn read_request(s: &mut std::net::TcpStream) -> u64 {
    use orbite::control::frame::FRAME_HEADER_LEN;
    use orbite::control::message::DATA_REQUEST_LEN;
    use std::io::Read;
    let mut h = [0u8; FRAME_HEADER_LEN];
    s.read_exact(&mut h).unwrap();
    let mut fixed = [0u8; DATA_REQUEST_LEN];
    s.read_exact(&mut fixed).unwrap();
    u64::from_le_bytes(fixed[..8].try_into().unwrap())
}

/// SplitMix64: small, seeded, the same on every machine.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// The seeds to run: `SIM_SEEDS` (`N` or `A-B`), else `default`.
pub fn seeds(default: std::ops::RangeInclusive<u64>) -> std::ops::RangeInclusive<u64> {
    let Ok(v) = std::env::var("SIM_SEEDS") else { return default };
    let (a, b) = v.split_once('-').unwrap_or((&v, &v));
    a.parse().expect("SIM_SEEDS: a seed")..=b.parse().expect("SIM_SEEDS: a seed")
}
