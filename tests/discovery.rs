//! Discovery on a real etcd (Debian's `etcd-server`, started here on free
//! loopback ports with its data in a temporary folder): engines in separate
//! processes find each other by name and move bytes; a frozen engine's
//! name vanishes within its TTL and its peers' pending requests end at
//! once; a restarted engine is a new epoch; duplicate names are refused;
//! with etcd stopped, established transfers go on, `connect_name` fails
//! `UNAVAILABLE` within its timeout, and everything recovers when etcd is
//! back.
#![cfg(feature = "etcd")]

mod common;

use common::*;
use orbite::*;
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const TTL: u64 = 2;

/// A real etcd on loopback.
struct Etcd {
    child: Option<Child>,
    dir: std::path::PathBuf,
    client: u16,
    peer: u16,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl Etcd {
    fn start() -> Etcd {
        let dir = std::env::temp_dir().join(format!("orbite-etcd-{}-{}", std::process::id(), free_port()));
        let mut e = Etcd { child: None, dir, client: free_port(), peer: free_port() };
        e.run();
        e
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client)
    }

    /// Starts etcd (again, on the same ports and data) and waits until its
    /// client port accepts.
    fn run(&mut self) {
        let bin = ["/usr/bin/etcd", "/usr/local/bin/etcd"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .expect("etcd is not installed: scripts/ensure-tools.sh installs Debian's etcd-server");
        let (c, p) = (self.url(), format!("http://127.0.0.1:{}", self.peer));
        let child = Command::new(bin)
            .args(["--name", "orbite-test", "--data-dir", self.dir.to_str().unwrap()])
            .args(["--listen-client-urls", &c, "--advertise-client-urls", &c])
            .args(["--listen-peer-urls", &p, "--initial-advertise-peer-urls", &p])
            .args(["--initial-cluster", &format!("orbite-test={p}"), "--log-level", "error"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn etcd");
        self.child = Some(child);
        let until = Instant::now() + LONG;
        while TcpStream::connect(("127.0.0.1", self.client)).is_err() {
            assert!(Instant::now() < until, "etcd did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn config(&self, name: &str) -> String {
        format!(
            r#"{{"name": "{name}", "discovery": {{"etcd": ["{}"], "prefix": "/orbite-test", "ttl_s": {TTL}}}}}"#,
            self.url()
        )
    }

    /// [`Etcd::config`] with the auth key file at `key`.
    fn keyed_config(&self, name: &str, key: &str) -> String {
        format!(r#"{{"auth_key_file": "{key}", {}"#, &self.config(name)[1..])
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// An orbite-peer source process registered under `name`.
fn source(etcd: &Etcd, name: &str, seed: u64) -> PeerProc {
    PeerProc::spawn(&["--size", &MIB.to_string(), "--seed", &seed.to_string(), "--config", &etcd.config(name)])
}

/// One READ over TCP: its status (the submission's, if it was refused).
fn read(e: &Engine, peer: u64, local: &[u8], remote: u64, len: u64, timeout: Duration) -> Status {
    let r = Request { op: Op::Read, local_addr: local.as_ptr() as u64, remote_addr: remote, len };
    let opts = SubmitOptions { transport: Transport::Only(TransportKind::Tcp), timeout: Some(timeout) };
    match e.submit(peer, &[r], opts) {
        Err(x) => x.status(),
        Ok(b) => {
            let _ = b.wait(LONG);
            b.results()[0].status
        }
    }
}

/// Three engines in three processes (two sources, this test's requester)
/// find each other by name and move bytes, each verified.
#[test]
fn engines_find_each_other_by_name_and_move_bytes() {
    let etcd = Etcd::start();
    let mut a = source(&etcd, "src-a", 3);
    let mut b = source(&etcd, "src-b", 4);
    let e = Engine::from_json(&etcd.config("reader")).unwrap();
    let local = vec![0u8; MIB as usize];
    e.register_memory(local.as_ptr() as u64, MIB, Access::NONE).unwrap();
    for (name, p, seed) in [("src-a", &mut a, 3), ("src-b", &mut b, 4)] {
        let peer = e.connect_name(name, Some(LONG)).unwrap();
        assert_eq!(e.peer_endpoint(peer).unwrap(), p.endpoint);
        assert_eq!(read(&e, peer, &local, p.addr, MIB, LONG), Status::Ok);
        assert_eq!(local, pattern_vec(seed, MIB as usize), "{name}");
    }
    let err = e.connect_name("nobody", Some(LONG)).unwrap_err();
    assert_eq!(err.status(), Status::NotFound, "{err}");
    assert!(err.message().contains("nobody"), "{err}");
    // The sources see the reader by name too.
    assert!(a.cmd("stats").contains(r#""discovery":{"enabled":true,"connected":true"#));
    let st = e.stats().discovery;
    assert_eq!((st.enabled, st.connected, st.watched), (true, true, 2));
    e.close(Some(LONG)).unwrap();
    a.close();
    b.close();
}

/// A second live engine claiming a taken name is refused at start, naming
/// the holder; once the holder closes (its lease revoked) the name is free
/// at once.
#[test]
fn a_taken_name_is_refused_and_freed_by_close() {
    let etcd = Etcd::start();
    let first = Engine::from_json(&etcd.config("dup")).unwrap();
    let err = Engine::from_json(&etcd.config("dup")).map(|_| ()).unwrap_err();
    assert_eq!(err.status(), Status::InvalidConfig, "{err}");
    assert!(err.message().contains(&first.endpoint()), "the holder is named: {err}");
    first.close(Some(LONG)).unwrap();
    drop(first);
    let second = Engine::from_json(&etcd.config("dup")).unwrap();
    second.close(Some(LONG)).unwrap();
}

/// A frozen engine stops keeping its lease: its name vanishes within the
/// TTL (plus a second), and a request pending on it ends then with
/// STALE_PEER instead of at its deadline. Killed and restarted under the
/// same name, it is a new epoch: the old peer id stays STALE_PEER and a
/// fresh `connect_name` works.
#[test]
fn a_dead_engine_vanishes_and_a_restarted_one_is_a_new_epoch() {
    let etcd = Etcd::start();
    let src = source(&etcd, "victim", 5);
    let e = Engine::from_json(&etcd.config("watcher")).unwrap();
    let local = vec![0u8; 4096];
    e.register_memory(local.as_ptr() as u64, 4096, Access::NONE).unwrap();
    let old = e.connect_name("victim", Some(LONG)).unwrap();
    assert_eq!(read(&e, old, &local, src.addr, 4096, LONG), Status::Ok);
    src.freeze();
    let t0 = Instant::now();
    let pending = read(&e, old, &local, src.addr, 4096, Duration::from_secs(120));
    let took = t0.elapsed();
    assert_eq!(pending, Status::StalePeer);
    assert!(took < Duration::from_secs(TTL + 20), "ended after {took:?}, not at its 120 s deadline");
    let gone = Instant::now();
    loop {
        match e.connect_name("victim", Some(Duration::from_secs(5))) {
            Err(x) if x.status() == Status::NotFound => break,
            _ => assert!(gone.elapsed() < Duration::from_secs(TTL + 20), "the name stayed"),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    src.kill();
    let src2 = source(&etcd, "victim", 6);
    let fresh = e.connect_name("victim", Some(LONG)).unwrap();
    assert_ne!(fresh, old);
    assert_eq!(read(&e, fresh, &local, src2.addr, 4096, LONG), Status::Ok);
    assert_eq!(local, pattern_vec(6, 4096));
    assert_eq!(read(&e, old, &local, src2.addr, 4096, LONG), Status::StalePeer);
    assert!(e.stats().discovery.peers_gone >= 1);
    src2.close();
}

/// etcd stopped mid-run: established transfers continue, `connect_name`
/// fails UNAVAILABLE within its timeout; when etcd is back, names resolve
/// again and the engines' own names are still (or again) there.
#[test]
fn an_etcd_outage_leaves_transfers_working_and_heals() {
    let mut etcd = Etcd::start();
    let src = source(&etcd, "steady", 7);
    let e = Engine::from_json(&etcd.config("client")).unwrap();
    let local = vec![0u8; 4096];
    e.register_memory(local.as_ptr() as u64, 4096, Access::NONE).unwrap();
    let peer = e.connect_name("steady", Some(LONG)).unwrap();
    etcd.stop();
    for _ in 0..20 {
        assert_eq!(read(&e, peer, &local, src.addr, 4096, LONG), Status::Ok);
    }
    let t0 = Instant::now();
    let err = e.connect_name("steady", Some(Duration::from_millis(1500))).unwrap_err();
    assert_eq!(err.status(), Status::Unavailable, "{err}");
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    // Outlast the TTL, so that the leases may have expired meanwhile.
    let until = Instant::now() + Duration::from_secs(TTL + 1);
    while Instant::now() < until {
        assert_eq!(read(&e, peer, &local, src.addr, 4096, LONG), Status::Ok);
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!e.stats().discovery.connected);
    etcd.run();
    let t0 = Instant::now();
    let again = loop {
        match e.connect_name("steady", Some(Duration::from_secs(5))) {
            Ok(p) => break p,
            Err(x) => assert!(t0.elapsed() < LONG, "never healed: {x}"),
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(read(&e, again, &local, src.addr, 4096, LONG), Status::Ok);
    assert_eq!(read(&e, peer, &local, src.addr, 4096, LONG), Status::Ok);
    assert_eq!(local, pattern_vec(7, 4096));
    // The engine's own client notices on its next keep-alive (a resolve
    // may succeed before it).
    eventually("the discovery client reconnected", || {
        let st = e.stats().discovery;
        st.connected && st.failures >= 1 && st.reconnects >= 1
    });
    src.close();
}

/// An engine of this host that crashed is replaced at once by a new one
/// under its name (its process is gone; the lease need not expire first):
/// peers connected to the old one are told (the key names another epoch)
/// and find the new one.
#[test]
fn a_crashed_engine_of_this_host_is_replaced_at_once() {
    let etcd = Etcd::start();
    let old_src = source(&etcd, "phoenix", 8);
    let e = Engine::from_json(&etcd.config("observer")).unwrap();
    let local = vec![0u8; 4096];
    e.register_memory(local.as_ptr() as u64, 4096, Access::NONE).unwrap();
    let old = e.connect_name("phoenix", Some(LONG)).unwrap();
    assert_eq!(read(&e, old, &local, old_src.addr, 4096, LONG), Status::Ok);
    old_src.kill();
    let t0 = Instant::now();
    let new_src = source(&etcd, "phoenix", 9);
    assert!(t0.elapsed() < Duration::from_secs(TTL * 5), "the restart waited {:?}", t0.elapsed());
    let fresh = e.connect_name("phoenix", Some(LONG)).unwrap();
    assert_eq!(e.peer_endpoint(fresh).unwrap(), new_src.endpoint);
    assert_eq!(read(&e, fresh, &local, new_src.addr, 4096, LONG), Status::Ok);
    assert_eq!(local, pattern_vec(9, 4096));
    let until = Instant::now() + LONG;
    while read(&e, old, &local, new_src.addr, 4096, LONG) != Status::StalePeer {
        assert!(Instant::now() < until, "the old peer was never marked gone");
        std::thread::sleep(Duration::from_millis(20));
    }
    new_src.close();
}

/// Writes to etcd as any etcd writer could (no lease): `value` under
/// `key`, or deletes the key.
fn etcd_write(etcd: &Etcd, key: &str, value: Option<&[u8]>) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut c = etcd_client::Client::connect([etcd.url()], None).await.unwrap();
        match value {
            Some(v) => drop(c.put(key, v, None).await.unwrap()),
            None => drop(c.delete(key, None).await.unwrap()),
        }
    });
}

/// The value under `key`, if any.
fn etcd_read(etcd: &Etcd, key: &str) -> Option<Vec<u8>> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut c = etcd_client::Client::connect([etcd.url()], None).await.unwrap();
        c.get(key, None).await.unwrap().kvs().first().map(|kv| kv.value().to_vec())
    })
}

/// Whether `key` (under the tests' prefix) holds a valid record naming
/// `endpoint`.
fn names(etcd: &Etcd, key: &str, endpoint: &str) -> bool {
    let cfg = discovery::DiscoveryConfig { etcd: vec![], prefix: "/orbite-test".into(), ttl_s: TTL as u32 };
    let name = key.rsplit('/').next().unwrap();
    etcd_read(etcd, key).is_some_and(|v| cfg.read(name, &v, None).is_ok_and(|r| r.endpoint == endpoint))
}

/// A value that is not a record, put by an etcd writer over a connected
/// peer's key, is ignored and counted: the peer is not retired and still
/// serves; the holder, alive, puts its record back at its next keep-alive,
/// also after the key was deleted. A name holding such a value resolves to
/// nothing.
#[test]
fn a_value_that_is_not_a_record_retires_nobody_and_the_live_holder_puts_its_own_back() {
    let etcd = Etcd::start();
    let src = source(&etcd, "victim", 3);
    let e = Engine::from_json(&etcd.config("watcher")).unwrap();
    let local = vec![0u8; 4096];
    e.register_memory(local.as_ptr() as u64, 4096, Access::NONE).unwrap();
    let peer = e.connect_name("victim", Some(LONG)).unwrap();
    assert_eq!(read(&e, peer, &local, src.addr, 4096, LONG), Status::Ok);
    let key = "/orbite-test/engines/victim";
    etcd_write(&etcd, key, Some(b"not a record"));
    eventually("the watcher reads the junk", || e.stats().discovery.invalid_records >= 1);
    assert_eq!(read(&e, peer, &local, src.addr, 4096, LONG), Status::Ok, "the junk retired the peer");
    assert_eq!(local, pattern_vec(3, 4096));
    assert_eq!(e.stats().discovery.peers_gone, 0);
    eventually("the live holder puts its record back", || names(&etcd, key, &src.endpoint));
    assert_eq!(read(&e, peer, &local, src.addr, 4096, LONG), Status::Ok);
    // A name whose value is not a record resolves to nothing.
    etcd_write(&etcd, "/orbite-test/engines/ghost", Some(br#"{"endpoint": 5}"#));
    let err = e.connect_name("ghost", Some(LONG)).map(|_| ()).unwrap_err();
    assert_eq!(err.status(), Status::NotFound, "{err}");
    // Deleted by hand while its lease lives: put back too.
    etcd_write(&etcd, key, None);
    eventually("the live holder puts its deleted record back", || names(&etcd, key, &src.endpoint));
    let again = e.connect_name("victim", Some(LONG)).unwrap();
    assert_eq!(read(&e, again, &local, src.addr, 4096, LONG), Status::Ok);
    src.close();
}

/// A stale record: a name whose record (put by hand, as a crashed engine's
/// would stay until its lease expired) names the endpoint of a live engine
/// of another epoch, as when a restarted engine took the port. Following
/// it, `connect_name` reaches that engine but answers STALE_PEER naming
/// both epochs and drops the connection (no peer stays, nothing is
/// watched); under its own name the engine is reached and serves. Guards
/// `engine/peers.rs` `connect_name`: the epoch compared with the record's
/// is the one the connected engine describes
/// (`p.conn.describe().identity.engine_epoch`).
#[test]
fn a_record_naming_another_epochs_endpoint_is_stale_and_dropped() {
    let etcd = Etcd::start();
    let src = source(&etcd, "heir", 10);
    let cfg = discovery::DiscoveryConfig { etcd: vec![], prefix: "/orbite-test".into(), ttl_s: TTL as u32 };
    let heir = cfg.read("heir", &etcd_read(&etcd, &cfg.key("heir")).unwrap(), None).unwrap();
    assert_eq!(heir.endpoint, src.endpoint);
    let stale = discovery::Record { name: "former".into(), epoch: heir.epoch ^ 1, ..heir.clone() };
    etcd_write(&etcd, &cfg.key("former"), Some(cfg.store(&stale, None).as_bytes()));
    let e = Engine::from_json(&etcd.config("asker")).unwrap();
    let local = vec![0u8; 4096];
    e.register_memory(local.as_ptr() as u64, 4096, Access::NONE).unwrap();
    match e.connect_name("former", Some(LONG)) {
        Ok(p) => panic!("connect_name(\"former\") returned peer {p} at {}", e.peer_endpoint(p).unwrap()),
        Err(err) => {
            assert_eq!(err.status(), Status::StalePeer, "{err}");
            let (published, answered) = (format!("epoch {:x}", stale.epoch), format!("is epoch {:x}", heir.epoch));
            assert!(err.message().contains(&published) && err.message().contains(&answered), "{err}");
        }
    }
    let st = e.stats();
    assert_eq!((st.peers, st.discovery.watched, st.discovery.peers_gone), (0, 0, 0));
    let p = e.connect_name("heir", Some(LONG)).unwrap();
    assert_eq!(e.peer_endpoint(p).unwrap(), src.endpoint);
    assert_eq!(read(&e, p, &local, src.addr, 4096, LONG), Status::Ok);
    assert_eq!(local, pattern_vec(10, 4096));
    assert_eq!(e.stats().peers, 1);
    e.close(Some(LONG)).unwrap();
    src.close();
}

/// An engine started under a live engine's name in another PID namespace
/// of the host (a container) cannot see the holder's pid, but must not
/// take the name: it is refused, naming the holder, and the holder stays
/// published and reachable.
#[test]
fn an_engine_of_another_pid_namespace_cannot_take_a_live_name() {
    let etcd = Etcd::start();
    let holder = source(&etcd, "held", 4);
    let mut intruder = Command::new("unshare");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        intruder.args(["--user", "--map-root-user"]);
    }
    intruder.args(["--pid", "--fork", "--mount-proc", env!("CARGO_BIN_EXE_orbite-peer")]);
    intruder.args(["--size", &MIB.to_string(), "--seed", "5", "--config", &etcd.config("held")]);
    let out = intruder.stdin(Stdio::null()).output().expect("run unshare (util-linux)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the intruder took the name: {}", String::from_utf8_lossy(&out.stdout));
    assert!(stderr.contains("is held by the live engine") && stderr.contains(&holder.endpoint), "{stderr}");
    let e = Engine::from_json(&etcd.config("asker")).unwrap();
    let local = vec![0u8; 4096];
    e.register_memory(local.as_ptr() as u64, 4096, Access::NONE).unwrap();
    let p = e.connect_name("held", Some(LONG)).unwrap();
    assert_eq!(e.peer_endpoint(p).unwrap(), holder.endpoint);
    assert_eq!(read(&e, p, &local, holder.addr, 4096, LONG), Status::Ok);
    assert_eq!(local, pattern_vec(4, 4096));
    holder.close();
}

/// With an auth key, records are signed: engines sharing the key find
/// each other; a record an etcd writer put without the signature (naming
/// an endpoint of its choice) is never followed, and counted.
#[test]
fn with_a_key_only_signed_records_are_followed() {
    let etcd = Etcd::start();
    let key = key_file("discovery-signed", 0x5a);
    let keyed = |name: &str| etcd.keyed_config(name, &key);
    let src = PeerProc::spawn(&["--size", &MIB.to_string(), "--seed", "6", "--config", &keyed("signed")]);
    let stored = etcd_read(&etcd, "/orbite-test/engines/signed").unwrap();
    assert!(String::from_utf8_lossy(&stored).contains(r#""sig":""#), "the record is signed");
    let e = Engine::from_json(&keyed("reader")).unwrap();
    let local = vec![0u8; 4096];
    e.register_memory(local.as_ptr() as u64, 4096, Access::NONE).unwrap();
    let p = e.connect_name("signed", Some(LONG)).unwrap();
    assert_eq!(read(&e, p, &local, src.addr, 4096, LONG), Status::Ok);
    assert_eq!(local, pattern_vec(6, 4096));
    // The forger copies the real record without its signature.
    let forged = String::from_utf8_lossy(&stored).replace("\"signed\"", "\"forged\"");
    let forged = forged.split(r#","sig":"#).next().unwrap().to_string() + "}";
    etcd_write(&etcd, "/orbite-test/engines/forged", Some(forged.as_bytes()));
    let before = e.stats().discovery.invalid_records;
    let err = e.connect_name("forged", Some(LONG)).map(|_| ()).unwrap_err();
    assert_eq!(err.status(), Status::NotFound, "{err}");
    assert!(e.stats().discovery.invalid_records > before);
    src.close();
}

/// With an auth key a record is bound to its name (issue 58, item 8): an
/// etcd writer without the key copies engine C's signed record under a
/// name nobody holds and over engine B's own key. `connect_name` never
/// reaches C under another name (the copy is not a valid record there:
/// counted, resolving to nothing), the requester connected to B is not
/// retired and keeps reading B, and B puts its own record back. Guards
/// `discovery/record.rs` `DiscoveryConfig::read`: the record's name must
/// be the one looked up (and the signature covers the key of etcd).
#[test]
fn with_a_key_a_record_copied_under_another_name_is_never_followed() {
    let etcd = Etcd::start();
    let key = key_file("discovery-bound", 0x6b);
    let keyed = |name: &str| etcd.keyed_config(name, &key);
    let b = PeerProc::spawn(&["--size", &MIB.to_string(), "--seed", "7", "--config", &keyed("b")]);
    let c = PeerProc::spawn(&["--size", &MIB.to_string(), "--seed", "8", "--config", &keyed("c")]);
    let e = Engine::from_json(&keyed("reader")).unwrap();
    let local = vec![0u8; 4096];
    e.register_memory(local.as_ptr() as u64, 4096, Access::NONE).unwrap();
    let to_b = e.connect_name("b", Some(LONG)).unwrap();
    assert_eq!(read(&e, to_b, &local, b.addr, 4096, LONG), Status::Ok);
    assert_eq!(local, pattern_vec(7, 4096));
    let c_record = etcd_read(&etcd, "/orbite-test/engines/c").unwrap();
    // Under a name nobody holds (nobody puts anything back): nothing.
    etcd_write(&etcd, "/orbite-test/engines/ghost", Some(&c_record));
    let before = e.stats().discovery;
    match e.connect_name("ghost", Some(LONG)) {
        Ok(p) => panic!("connect_name(\"ghost\") reached {}", e.peer_endpoint(p).unwrap()),
        Err(err) => assert_eq!(err.status(), Status::NotFound, "{err}"),
    }
    assert!(e.stats().discovery.invalid_records > before.invalid_records, "the copy was not counted");
    // Over B's own key, while B's requester is connected.
    let before = e.stats().discovery;
    etcd_write(&etcd, "/orbite-test/engines/b", Some(&c_record));
    eventually("the watcher hears of the copy", || {
        let d = e.stats().discovery;
        d.invalid_records > before.invalid_records || d.peers_gone > before.peers_gone
    });
    assert_eq!(e.stats().discovery.peers_gone, 0, "the copy retired the requester connected to B");
    for _ in 0..5 {
        match e.connect_name("b", Some(LONG)) {
            Ok(p) => assert_eq!(e.peer_endpoint(p).unwrap(), b.endpoint, "connect_name(\"b\") reached C"),
            Err(err) => assert_eq!(err.status(), Status::NotFound, "{err}"),
        }
    }
    assert_eq!(read(&e, to_b, &local, b.addr, 4096, LONG), Status::Ok, "B's requester was retired");
    eventually("B puts its own record back", || names(&etcd, "/orbite-test/engines/b", &b.endpoint));
    let again = e.connect_name("b", Some(LONG)).unwrap();
    assert_eq!(e.peer_endpoint(again).unwrap(), b.endpoint);
    assert_eq!(read(&e, again, &local, b.addr, 4096, LONG), Status::Ok);
    assert_eq!(local, pattern_vec(7, 4096));
    e.close(Some(LONG)).unwrap();
    b.close();
    c.close();
}

/// The lease the value under `key` is held by (0: none), if any value.
fn etcd_lease(etcd: &Etcd, key: &str) -> Option<i64> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut c = etcd_client::Client::connect([etcd.url()], None).await.unwrap();
        c.get(key, None).await.unwrap().kvs().first().map(|kv| kv.lease())
    })
}

/// A name held by an engine of another host (another boot id), in a PID
/// namespace whose inode matches ours (init namespaces share one inode
/// number across hosts) and under a pid that names no process here, is
/// not taken over: that pid means nothing here. A new engine under the
/// name is refused, naming the holder, and the holder's record stays.
/// Guards `discovery/etcd.rs` `provably_gone`'s
/// `h.boot_id == me.boot_id &&`.
#[test]
fn a_name_held_on_another_boot_is_never_taken_over() {
    let etcd = Etcd::start();
    let probe = Engine::from_json(&etcd.config("probe")).unwrap();
    let cfg = discovery::DiscoveryConfig { etcd: vec![], prefix: "/orbite-test".into(), ttl_s: TTL as u32 };
    let mine = cfg.read("probe", &etcd_read(&etcd, &cfg.key("probe")).unwrap(), None).unwrap();
    assert_ne!(mine.pid_ns, 0, "this host does not say its PID namespace");
    let mut gone = Command::new("true").spawn().unwrap();
    gone.wait().unwrap();
    let other_boot = if mine.boot_id.starts_with('0') { "1" } else { "0" }.to_string() + &mine.boot_id[1..];
    let far = discovery::Record { name: "far".into(), boot_id: other_boot, pid: gone.id(), ..mine.clone() };
    let value = cfg.store(&far, None);
    etcd_write(&etcd, &cfg.key("far"), Some(value.as_bytes()));
    match Engine::from_json(&etcd.config("far")) {
        Ok(e) => panic!("the name held on another boot was taken over by {}", e.endpoint()),
        Err(err) => {
            assert_eq!(err.status(), Status::InvalidConfig, "{err}");
            let holder = format!("is held by the live engine at {} (pid {}", far.endpoint, far.pid);
            assert!(err.message().contains(&holder), "{err}");
        }
    }
    assert_eq!(etcd_read(&etcd, &cfg.key("far")).unwrap(), value.as_bytes());
    probe.close(Some(LONG)).unwrap();
}

/// A copy of this engine's own record put under its key without its lease
/// (by an etcd writer) is put back under the lease at the next keep-alive
/// (one reclaim), so that the name still goes with the engine: its close
/// removes it. Guards `discovery/etcd.rs` `State::hold`'s
/// `let ours = kv.lease() == lease`.
#[test]
fn a_lease_less_copy_of_our_own_record_is_put_back_under_the_lease() {
    let etcd = Etcd::start();
    let e = Engine::from_json(&etcd.config("keeper")).unwrap();
    let key = "/orbite-test/engines/keeper";
    let lease = etcd_lease(&etcd, key).unwrap();
    assert_ne!(lease, 0);
    assert_eq!(e.stats().discovery.reclaims, 0);
    etcd_write(&etcd, key, Some(&etcd_read(&etcd, key).unwrap()));
    // Its next keep-alive (a third of the TTL away) finds the copy.
    eventually("the engine puts its record back", || e.stats().discovery.reclaims == 1);
    assert_eq!(etcd_lease(&etcd, key), Some(lease));
    assert!(names(&etcd, key, &e.endpoint()));
    e.close(Some(LONG)).unwrap();
    assert_eq!(etcd_read(&etcd, key), None, "the name outlived its engine");
}

/// A name held (on this boot, in this PID namespace) by a record naming
/// pid 0, which is no process, is taken over at once by a new engine under
/// the name: the holder is provably gone. `kill(0, 0)` would signal this
/// process's own group and read as alive, refusing the name until the
/// lease expired (this record has none: forever). Guards
/// `control/identity.rs` `process_alive`'s `pid == 0 ||` (round 13 M15).
#[test]
fn a_name_held_by_a_record_naming_pid_0_is_taken_over() {
    let etcd = Etcd::start();
    let probe = Engine::from_json(&etcd.config("probe")).unwrap();
    let cfg = discovery::DiscoveryConfig { etcd: vec![], prefix: "/orbite-test".into(), ttl_s: TTL as u32 };
    let mine = cfg.read("probe", &etcd_read(&etcd, &cfg.key("probe")).unwrap(), None).unwrap();
    assert_ne!(mine.pid_ns, 0, "this host does not say its PID namespace");
    let zero = discovery::Record { name: "zero".into(), pid: 0, ..mine.clone() };
    etcd_write(&etcd, &cfg.key("zero"), Some(cfg.store(&zero, None).as_bytes()));
    let e = match Engine::from_json(&etcd.config("zero")) {
        Ok(e) => e,
        Err(err) => panic!("the name held by pid 0 was not taken over: {err}"),
    };
    assert!(names(&etcd, &cfg.key("zero"), &e.endpoint()), "the key names the new engine");
    e.close(Some(LONG)).unwrap();
    probe.close(Some(LONG)).unwrap();
}
