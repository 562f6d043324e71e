//! A hostile source for the requester's checks: it speaks the control
//! handshake and the IPC protocol by hand (threads of the test process, so
//! SHM may serve it), publishes one shared-host region backed by a memfd it
//! owns, and answers export requests as the test scripts: an honest offer
//! (edited to lie), an offer followed by the handle of another export, or a
//! refusal. It records every IPC frame the requester sends, so a test can
//! assert what the requester accepted, declined and asked for. With a
//! grant board it gives each channel one and publishes in each export's
//! slot the operations the script says (honest: those granted).
#![allow(dead_code)]

use orbite::control::frame::MsgKind;
use orbite::control::io::{self, HeaderRead};
use orbite::control::message::{Describe, RegionInfo};
use orbite::control::Identity;
use orbite::transport::ipc::board::{self, Board};
use orbite::transport::ipc::channel::{self, Channel};
use orbite::transport::ipc::messages::{encode_reject, ExportOffer, ExportRef, ExportRequest, Hello, Welcome};
use orbite::{Access, MemoryKind, Status, TransportKind};
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};

/// The region's length (one 2 MiB physical extent).
pub const LEN: u64 = 2 << 20;
/// The region's epoch in the Describe.
pub const EPOCH: u64 = 7;

/// Every IPC frame received: kind and body.
pub type Seen = Arc<Mutex<Vec<(MsgKind, Vec<u8>)>>>;

/// How the source answers an export request.
#[derive(Clone, Copy)]
pub enum Answer {
    /// The honest offer, then edited by the function (identity: honest).
    Offer(fn(&mut ExportOffer, &ExportRequest)),
    /// An honest offer; after the requester accepts, the handle of another export.
    WrongHandle,
    /// A refusal with this status.
    Reject(Status),
}

/// What the hostile source says about itself.
#[derive(Clone, Copy)]
pub struct Script {
    pub answer: Answer,
    /// Edits the identity in the Describe (identity: honest, this process).
    pub describe: fn(&mut Identity),
    /// Edits the identity in the IpcWelcome (identity: the Describe's).
    pub welcome: fn(&mut Identity),
    /// With a grant board for each channel: what an export's slot says it
    /// allows, given the operations granted (identity: honest). `None`:
    /// no board (every use is revalidated).
    pub board: Option<fn(u32) -> u32>,
    /// Refuses every revalidation with this status (`None`: honest, OK).
    pub revalidate: Option<Status>,
    /// Sends, with its IpcWelcome, a board of the right size sealed
    /// against growing only, names its slot 0 in every offer, and shrinks
    /// it to nothing at the first export request (the requester has it by
    /// then): a board the requester must never take for a sealed one.
    pub shrinkable_board: bool,
    /// Sends, with its IpcWelcome and its board, a liveness page whose
    /// word says its keeper died, sealed against resizing but not against
    /// writes: a page whose word any holder of it could still rewrite, which
    /// the requester must never believe.
    pub writable_alive_page: bool,
    /// The published region's access (honest: `READ_WRITE`).
    pub access: Access,
    /// The seals of the memory file behind the region, the handle of every
    /// export (honest: shrink, grow and seal, as the library's own).
    pub seals: i32,
}

fn same(_: &mut Identity) {}
fn honest(_: &mut ExportOffer, _: &ExportRequest) {}

impl Script {
    /// Honest in every respect.
    pub fn honest() -> Script {
        Script {
            answer: Answer::Offer(honest),
            describe: same,
            welcome: same,
            board: None,
            revalidate: None,
            shrinkable_board: false,
            writable_alive_page: false,
            access: Access::READ_WRITE,
            seals: libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
        }
    }
    /// Honest but for the answer.
    pub fn answering(answer: Answer) -> Script {
        Script { answer, ..Script::honest() }
    }
}

/// A running hostile source.
pub struct Hostile {
    pub endpoint: String,
    /// The published region's first byte (this process's memfd mapping).
    pub addr: u64,
    /// Every IPC frame received: kind and body.
    pub seen: Seen,
    memfd: Arc<std::os::fd::OwnedFd>,
}

impl Hostile {
    /// Starts a source publishing LEN bytes holding `fill(i)` at offset i.
    pub fn start(script: Script, fill: impl Fn(u64) -> u8) -> Hostile {
        // SAFETY: memfd_create with a static name; the fd is owned below.
        let raw =
            unsafe { libc::memfd_create(c"orbite-hostile".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
        assert!(raw >= 0, "memfd_create");
        // SAFETY: `raw` is a fresh descriptor nobody else owns.
        let memfd: std::os::fd::OwnedFd = unsafe { std::os::fd::FromRawFd::from_raw_fd(raw) };
        // SAFETY: resizing our own memfd.
        assert_eq!(unsafe { libc::ftruncate(raw, LEN as i64) }, 0);
        // Sealed as the script says (honest: against resizing, as the
        // library's shared memory is; an importer insists on it).
        // SAFETY: fcntl on our own memfd.
        assert_eq!(unsafe { libc::fcntl(raw, libc::F_ADD_SEALS, script.seals) }, 0);
        // SAFETY: a fresh shared mapping of LEN bytes of our memfd, kept for
        // the process's life (the region must stay mapped while published).
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), LEN as usize, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, raw, 0)
        };
        assert_ne!(p, libc::MAP_FAILED);
        // SAFETY: the mapping holds LEN writable bytes.
        let bytes = unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), LEN as usize) };
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = fill(i as u64);
        }
        let addr = p as u64;
        let mut identity = Identity::fresh().unwrap();
        (script.describe)(&mut identity);
        let name = format!("orbite-hostile-{}-{:016x}", std::process::id(), identity.engine_epoch);
        let ipc = channel::listen(&name).expect("IPC listener");
        let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = tcp.local_addr().unwrap().to_string();
        let describe = Describe {
            identity,
            capabilities: TransportKind::Tcp.capability_bit() | TransportKind::Shm.capability_bit(),
            fabric_domain: [0; 16],
            endpoint: endpoint.clone(),
            ipc_name: name,
            regions: vec![RegionInfo {
                id: 1,
                epoch: EPOCH,
                addr,
                len: LEN,
                access: script.access,
                kind: MemoryKind::SharedHost,
            }],
        };
        let seen = Arc::new(Mutex::new(Vec::new()));
        let memfd = Arc::new(memfd);
        // The control port: answer the handshake's Describe and every
        // later DescribeRequest (frame by frame) until the requester hangs
        // up; other frames are read and dropped.
        std::thread::spawn(move || {
            for s in tcp.incoming() {
                let Ok(mut s) = s else { break };
                let describe = describe.clone();
                std::thread::spawn(move || {
                    let mut tick = || -> orbite::Result<()> { Ok(()) };
                    s.set_read_timeout(Some(io::TICK)).unwrap();
                    while let Ok(HeaderRead::Frame(h)) = io::read_header(&mut s, &mut tick) {
                        if io::read_body(&mut s, h.body_len, &mut tick).is_err() {
                            return;
                        }
                        if matches!(h.kind, MsgKind::Describe | MsgKind::DescribeRequest)
                            && io::write_frame(&mut s, MsgKind::Describe, &describe.encode(), &mut tick).is_err()
                        {
                            return;
                        }
                    }
                });
            }
        });
        let (log, fd) = (seen.clone(), memfd.clone());
        std::thread::spawn(move || {
            for s in ipc.incoming() {
                let Ok(s) = s else { break };
                let (log, fd) = (log.clone(), fd.clone());
                std::thread::spawn(move || serve(Channel::from_stream(s).unwrap(), script, identity, addr, log, fd));
            }
        });
        Hostile { endpoint, addr, seen, memfd }
    }

    /// The frames of `kind` received so far.
    pub fn frames(&self, kind: MsgKind) -> Vec<Vec<u8>> {
        self.seen.lock().unwrap().iter().filter(|(k, _)| *k == kind).map(|(_, b)| b.clone()).collect()
    }

    /// Truncates the memory file behind the region to `len` bytes (its
    /// seals permitting): what a source that later shrinks the memory an
    /// importer maps does. The region's own mapping must not be read past
    /// `len` afterwards.
    pub fn truncate(&self, len: u64) -> std::io::Result<()> {
        // SAFETY: ftruncate on our own memfd; nothing here reads the
        // mapping past `len` afterwards.
        if unsafe { libc::ftruncate(self.memfd.as_raw_fd(), len as i64) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// The export requests received so far.
    pub fn requests(&self) -> Vec<ExportRequest> {
        self.frames(MsgKind::ExportRequest).iter().map(|b| ExportRequest::decode(b).unwrap()).collect()
    }

    /// The requester's answers to offers: (export id, accepted).
    pub fn answers(&self) -> Vec<(u64, bool)> {
        self.frames(MsgKind::ExportAnswer)
            .iter()
            .map(|b| ExportRef::decode(b, "answer").unwrap())
            .map(|r| (r.export_id, r.value == 1))
            .collect()
    }
}

fn serve(mut ch: Channel, script: Script, identity: Identity, addr: u64, log: Seen, memfd: Arc<std::os::fd::OwnedFd>) {
    let mut next_export = 100u64;
    let mut offered: Option<ExportOffer> = None;
    let mut tick = || Ok(());
    let board = script.board.map(|says| (Board::create().expect("a grant board"), says));
    let shrinkable = script.shrinkable_board.then(shrinkable_board);
    let alive = script.writable_alive_page.then(writable_alive_page);
    while let Ok(f) = ch.recv(&mut tick) {
        log.lock().unwrap().push((f.kind, f.body.clone()));
        let (kind, body, fds): (MsgKind, Vec<u8>, Vec<i32>) = match f.kind {
            MsgKind::IpcHello => {
                Hello::decode(&f.body).unwrap();
                let mut w = identity;
                (script.welcome)(&mut w);
                let fd = board.as_ref().map(|(b, _)| b.fd().as_raw_fd()).or(shrinkable.as_ref().map(|f| f.as_raw_fd()));
                // The liveness page rides second, after the board.
                let fds = fd.into_iter().chain(alive.as_ref().map(|f| f.as_raw_fd())).collect();
                (MsgKind::IpcWelcome, Welcome { identity: w }.encode(), fds)
            }
            MsgKind::ExportRequest => {
                let req = ExportRequest::decode(&f.body).unwrap();
                next_export += 1;
                let mut o = ExportOffer {
                    tag: req.tag,
                    export_id: next_export,
                    token: 0x5eed_0000 + next_export,
                    base: addr,
                    physical: LEN,
                    grant_addr: req.addr,
                    grant_len: req.len,
                    region_epoch: req.region_epoch,
                    ops: req.ops,
                    slot: orbite::transport::ipc::messages::NO_SLOT,
                    slot_generation: 0,
                };
                // The shrinkable board, shrunk now under the requester's
                // mapping (if it took it), named in the offer.
                if let Some(f) = &shrinkable {
                    // SAFETY: truncating our own memfd (not sealed against shrinking).
                    assert_eq!(unsafe { libc::ftruncate(f.as_raw_fd(), 0) }, 0);
                    (o.slot, o.slot_generation) = (0, 1);
                }
                // Slot i for the i-th export of the channel, generation 1,
                // saying what the script says.
                if let Some((b, says)) = &board {
                    let index = (next_export - 101) as u32;
                    if let Some(slot) = b.slot(index) {
                        board::publish(slot, 1, says(req.ops));
                        (o.slot, o.slot_generation) = (index, 1);
                    }
                }
                match script.answer {
                    Answer::Reject(st) => {
                        (MsgKind::ExportReject, encode_reject(req.tag, st, "scripted refusal"), vec![])
                    }
                    Answer::Offer(edit) => {
                        edit(&mut o, &req);
                        offered = Some(o);
                        (MsgKind::ExportOffer, o.encode(), vec![])
                    }
                    Answer::WrongHandle => {
                        offered = Some(o);
                        (MsgKind::ExportOffer, o.encode(), vec![])
                    }
                }
            }
            MsgKind::ExportAnswer => {
                let r = ExportRef::decode(&f.body, "answer").unwrap();
                match (r.value, offered.take()) {
                    (1, Some(o)) => {
                        let named = match script.answer {
                            Answer::WrongHandle => {
                                ExportRef { export_id: o.export_id + 1, token: o.token, value: 0, extra: 0 }
                            }
                            _ => ExportRef { export_id: o.export_id, token: o.token, value: 0, extra: 0 },
                        };
                        (MsgKind::ExportHandle, named.encode(), vec![memfd.as_raw_fd()])
                    }
                    _ => (
                        MsgKind::Ack,
                        ExportRef { value: 0, extra: MsgKind::ExportAnswer as u32, ..r }.encode(),
                        vec![],
                    ),
                }
            }
            MsgKind::CloseReceipt | MsgKind::OpComplete => {
                let r = ExportRef::decode(&f.body, "receipt").unwrap();
                (MsgKind::Ack, ExportRef { value: 0, extra: f.kind as u32, ..r }.encode(), vec![])
            }
            MsgKind::Revalidate => match script.revalidate {
                None => (MsgKind::RevalidateOk, f.body[..8].to_vec(), vec![]),
                Some(st) => {
                    let tag = u64::from_le_bytes(f.body[..8].try_into().unwrap());
                    (MsgKind::ExportReject, encode_reject(tag, st, "scripted revalidation refusal"), vec![])
                }
            },
            _ => return,
        };
        if ch.send(kind, &body, &fds, &mut tick).is_err() {
            return;
        }
    }
}

/// A memory file of a grant board's size, sealed against growing only.
fn shrinkable_board() -> std::os::fd::OwnedFd {
    let board = std::fs::File::from(Board::create().unwrap().fd().try_clone().unwrap());
    let len = board.metadata().unwrap().len();
    // SAFETY: memfd_create with a static name; the fd is owned below.
    let raw = unsafe { libc::memfd_create(c"orbite-lax-board".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    assert!(raw >= 0, "memfd_create");
    // SAFETY: `raw` is a fresh descriptor nobody else owns.
    let fd: std::os::fd::OwnedFd = unsafe { std::os::fd::FromRawFd::from_raw_fd(raw) };
    // SAFETY: sizing and sealing our own memfd.
    assert_eq!(unsafe { libc::ftruncate(raw, len as i64) }, 0);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::fcntl(raw, libc::F_ADD_SEALS, libc::F_SEAL_GROW) }, 0);
    fd
}

/// A liveness page of one 4 KiB page, its word 0 (a keeper that died),
/// sealed against resizing and further seals but NOT against future
/// writes (`F_SEAL_FUTURE_WRITE`): whoever holds it may still map it
/// writable and rewrite the word.
fn writable_alive_page() -> std::os::fd::OwnedFd {
    // SAFETY: memfd_create with a static name; the fd is owned below.
    let raw = unsafe { libc::memfd_create(c"orbite-lax-alive".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    assert!(raw >= 0, "memfd_create");
    // SAFETY: `raw` is a fresh descriptor nobody else owns.
    let fd: std::os::fd::OwnedFd = unsafe { std::os::fd::FromRawFd::from_raw_fd(raw) };
    // SAFETY: sizing and sealing our own memfd.
    assert_eq!(unsafe { libc::ftruncate(raw, 4096) }, 0);
    // SAFETY: as above.
    assert_eq!(
        unsafe { libc::fcntl(raw, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL) },
        0
    );
    fd
}
