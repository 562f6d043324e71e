//! The grant board: how a cached import is used without a round trip.
//!
//! A source gives each requester's Unix IPC channel one small shared memory
//! file, the board, cut into slots, one per export granted on that channel.
//! In its slot the source publishes the export's *generation* and the
//! operations it allows now; the requester publishes how many of its groups
//! are copying through the export (*in flight*) and what the finished ones
//! moved. Before a group copies through a cached import, the requester
//! *enters* the slot: it counts itself in flight, then reads the
//! generation and the operations; if they are the ones its grant names, it
//! copies, and *leaves* (counts the requests and bytes, and itself out) once
//! the copies' completion is known. The source *revokes* a slot by clearing
//! its operations and moving its generation, then waits until nothing is in
//! flight.
//!
//! Why that keeps the seed's guarantees (every access is sequentially
//! consistent): a requester's entry is an increment followed by two reads; a
//! revocation is two writes followed by reads of the in-flight count. If the
//! requester's reads come before the source's writes in the single order of
//! these accesses, its increment does too, so the source sees it in flight
//! and waits for its leave, which follows its copies' completion; if they
//! come after, the requester sees the revocation and does not copy. So no
//! copy runs after a revocation returned, the source still decides every
//! use (a cached mapping grants nothing by itself: the source's words do),
//! and a requester that never leaves holds the revocation off only until
//! the source's deadline: the export then stays retained, as one whose close
//! receipt never comes.
//!
//! The source's words only withdraw: a requester enters a slot only for
//! operations its own grant allows, those its mapping was opened for (a
//! READ grant's mapping is read-only), whatever the slot claims.
//!
//! The requester can write the whole board; it learns nothing and gains
//! nothing by it (it holds the mapping of the allocation already, and the
//! source reads only the requester's words, bounded). The protocol itself
//! is generic over [`Words`] so that it is model-checked (`tests/models.rs`).

use super::alive::AliveView;
use crate::error::{Error, Result};
use crate::memory::owners;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::SeqCst};

/// The words of one slot, each read and written sequentially consistent.
pub trait Words {
    /// The export's generation (source).
    fn generation(&self) -> u64;
    /// Sets it.
    fn set_generation(&self, g: u64);
    /// The operations allowed now (source): `OP_READ | OP_WRITE` bits.
    fn ops(&self) -> u32;
    /// Sets them.
    fn set_ops(&self, ops: u32);
    /// Groups copying through the export now (requester).
    fn in_flight(&self) -> u32;
    /// Adds `d` (+1 or -1) to it.
    fn add_in_flight(&self, d: i32);
}

/// Requester: counts a group in flight and checks that the export, at
/// generation `generation`, still allows `need`. On `false` nothing is in
/// flight (the group must not copy through the cached import).
pub fn enter(w: &impl Words, generation: u64, need: u32) -> bool {
    w.add_in_flight(1);
    if w.generation() == generation && w.ops() & need == need {
        return true;
    }
    w.add_in_flight(-1);
    false
}

/// Requester: the group's copies are complete.
pub fn leave(w: &impl Words) {
    w.add_in_flight(-1);
}

/// Source: publishes a grant of `ops` at `generation`.
pub fn publish(w: &impl Words, generation: u64, ops: u32) {
    w.set_ops(0);
    w.set_generation(generation);
    w.set_ops(ops);
}

/// Source: no new group may enter (its generation moves to `next`); then
/// waits, by calling `pause` until it says stop, for the groups in flight.
/// `true`: nothing is in flight and none can enter.
pub fn revoke(w: &impl Words, next: u64, mut pause: impl FnMut() -> bool) -> bool {
    w.set_ops(0);
    w.set_generation(next);
    loop {
        if w.in_flight() == 0 {
            return true;
        }
        if !pause() {
            return false;
        }
    }
}

/// Bytes of one slot: a cache line each, so that slots do not share lines.
pub const SLOT_BYTES: usize = 64;
/// Slots of one board (one per export on a channel; exports beyond them use
/// the round-trip path).
pub const SLOTS: usize = 1024;
const BOARD_BYTES: usize = SLOT_BYTES * SLOTS;

/// One slot in a mapped board.
#[repr(C, align(64))]
pub struct Slot {
    generation: AtomicU64,
    ops: AtomicU32,
    in_flight: AtomicU32,
    /// Requests the requester's finished fast-path groups moved.
    requests: AtomicU64,
    /// Their bytes.
    bytes: AtomicU64,
}

const _: () = assert!(std::mem::size_of::<Slot>() == SLOT_BYTES);

impl Words for Slot {
    fn generation(&self) -> u64 {
        self.generation.load(SeqCst)
    }
    fn set_generation(&self, g: u64) {
        self.generation.store(g, SeqCst)
    }
    fn ops(&self) -> u32 {
        self.ops.load(SeqCst)
    }
    fn set_ops(&self, ops: u32) {
        self.ops.store(ops, SeqCst)
    }
    fn in_flight(&self) -> u32 {
        self.in_flight.load(SeqCst)
    }
    fn add_in_flight(&self, d: i32) {
        if d >= 0 {
            self.in_flight.fetch_add(d as u32, SeqCst);
        } else {
            self.in_flight.fetch_sub(d.unsigned_abs(), SeqCst);
        }
    }
}

impl Slot {
    /// Requester: a finished group's requests and bytes.
    pub fn count(&self, requests: u64, bytes: u64) {
        self.requests.fetch_add(requests, SeqCst);
        self.bytes.fetch_add(bytes, SeqCst);
    }

    /// Source: what the requester says it moved, and zero for the next export.
    pub fn take_counts(&self) -> (u64, u64) {
        (self.requests.swap(0, SeqCst), self.bytes.swap(0, SeqCst))
    }

    /// Source: a fresh slot for a new export.
    fn reset(&self) {
        self.ops.store(0, SeqCst);
        self.in_flight.store(0, SeqCst);
        self.requests.store(0, SeqCst);
        self.bytes.store(0, SeqCst);
    }
}

/// A board mapped into this process (the source's, or a requester's view).
pub struct Board {
    base: *const Slot,
    fd: OwnedFd,
    /// Requester: a duplicate of the channel the board came with, to see
    /// whether the source hung up (a dead source can no longer revoke),
    /// when the source sent no liveness page.
    channel: Option<OwnedFd>,
    /// Requester: the source's liveness page, which tells the same with one
    /// load (see [`super::alive`]).
    alive: Option<AliveView>,
}

// SAFETY: the mapping is only accessed through atomics; it stays mapped for
// the board's life.
unsafe impl Send for Board {}
// SAFETY: as above.
unsafe impl Sync for Board {}

impl Board {
    /// Source: a new board (a sealed memory file, zeroed).
    pub fn create() -> Result<Board> {
        let fd = owners::sealable_memfd(c"orbite-board", BOARD_BYTES as u64, "the grant board")?;
        owners::add_seals(&fd, owners::SIZE_SEALS | libc::F_SEAL_SEAL, "the grant board")?;
        Board::map(fd)
    }

    /// Requester: maps a board received from the source, after checking it
    /// is a memory file of the board's size that nobody can resize.
    pub fn map(fd: OwnedFd) -> Result<Board> {
        if !owners::is_sealed_memfd(&fd, owners::SIZE_SEALS, BOARD_BYTES as u64) {
            return Err(Error::Protocol("the grant board is not a sealed memory file of the board's size".into()));
        }
        let p = owners::map_shared(&fd, BOARD_BYTES as u64, true, "the grant board")?;
        Ok(Board { base: p as *const Slot, fd, channel: None, alive: None })
    }

    /// Requester: watches the source's liveness page `alive` or, without
    /// one, `channel` (a duplicate of the channel's socket) for the source
    /// hanging up.
    pub fn watch(mut self, channel: Option<OwnedFd>, alive: Option<AliveView>) -> Board {
        self.channel = channel;
        self.alive = alive;
        self
    }

    /// Requester: whether the source process died. Then its words no
    /// longer decide anything (it cannot revoke them): a group must not
    /// enter. With a liveness page, one load, which says only whether the
    /// process lives (a live source withdraws its words itself, before it
    /// unregisters or closes); without one, whether it hung up its end of
    /// the channel, one `poll` without waiting (`true` also when there is
    /// neither to watch).
    pub fn source_hung_up(&self) -> bool {
        if let Some(a) = &self.alive {
            return !a.source_lives();
        }
        let Some(fd) = &self.channel else { return true };
        let mut p = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLRDHUP, revents: 0 };
        // SAFETY: one valid pollfd for an fd we own, timeout 0.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        n != 0 && p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0
    }

    /// The board's memory file (sent to the requester with the Welcome).
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// Slot `i` (`None` beyond the board).
    pub fn slot(&self, i: u32) -> Option<&Slot> {
        // SAFETY: the mapping holds SLOTS slots, aligned (page-aligned base);
        // every field is an atomic, so any bytes are a valid Slot.
        ((i as usize) < SLOTS).then(|| unsafe { &*self.base.add(i as usize) })
    }
}

impl Drop for Board {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `map` mapped; no reference to a slot
        // outlives the board (slots are borrowed from it).
        unsafe { libc::munmap(self.base as *mut libc::c_void, BOARD_BYTES) };
    }
}

/// Source: which slots of a board are taken.
#[derive(Debug)]
pub struct SlotFree {
    taken: Vec<bool>,
    /// Generations given out, never reused on this board.
    next_generation: u64,
}

impl Default for SlotFree {
    fn default() -> SlotFree {
        SlotFree { taken: vec![false; SLOTS], next_generation: 1 }
    }
}

impl SlotFree {
    /// A free slot, taken, with a fresh generation (None: the board is full).
    pub fn take(&mut self, board: &Board) -> Option<(u32, u64)> {
        let i = self.taken.iter().position(|t| !t)?;
        self.taken[i] = true;
        board.slot(i as u32).expect("within the board").reset();
        Some((i as u32, self.generation()))
    }

    /// A fresh generation.
    pub fn generation(&mut self) -> u64 {
        self.next_generation += 1;
        self.next_generation
    }

    /// Gives slot `i` back.
    pub fn give_back(&mut self, i: u32) {
        if let Some(t) = self.taken.get_mut(i as usize) {
            *t = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::FromRawFd;

    #[test]
    fn enter_needs_the_generation_and_the_operations() {
        let b = Board::create().unwrap();
        let s = b.slot(3).unwrap();
        publish(s, 7, 1);
        assert!(enter(s, 7, 1));
        assert_eq!(s.in_flight.load(SeqCst), 1);
        assert!(!enter(s, 7, 2), "WRITE not granted");
        assert!(!enter(s, 6, 1), "another generation");
        assert_eq!(s.in_flight.load(SeqCst), 1, "a refused entry counts nothing");
        // A revocation waits for the group in flight, and then nobody enters.
        let mut pauses = 0;
        assert!(!revoke(s, 8, || {
            pauses += 1;
            pauses < 3
        }));
        assert_eq!(pauses, 3);
        leave(s);
        assert!(revoke(s, 9, || false));
        assert!(!enter(s, 7, 1) && !enter(s, 9, 1));
        assert!(b.slot(SLOTS as u32).is_none());
    }

    #[test]
    fn a_requester_maps_the_sources_board_and_both_see_one_slot() {
        let source = Board::create().unwrap();
        // SAFETY: dup of our own fd.
        let dup = unsafe { OwnedFd::from_raw_fd(libc::dup(source.fd().as_raw_fd())) };
        let requester = Board::map(dup).unwrap();
        let mut free = SlotFree::default();
        let (i, g) = free.take(&source).unwrap();
        publish(source.slot(i).unwrap(), g, 3);
        assert!(enter(requester.slot(i).unwrap(), g, 2));
        requester.slot(i).unwrap().count(5, 5000);
        leave(requester.slot(i).unwrap());
        assert_eq!(source.slot(i).unwrap().take_counts(), (5, 5000));
        assert!(revoke(source.slot(i).unwrap(), free.generation(), || false));
        // An unsealed file is refused.
        // SAFETY: a memfd of our own, unsealed.
        let raw = unsafe { libc::memfd_create(c"x".as_ptr(), libc::MFD_CLOEXEC) };
        // SAFETY: fresh fd.
        let plain = unsafe { OwnedFd::from_raw_fd(raw) };
        assert!(Board::map(plain).is_err());
    }

    /// A slot given back while its requester still counts in it (a group
    /// entered and never left, requests and bytes never taken) starts its
    /// next export with no operation, nobody in flight and no counts: the
    /// next export's revocation does not wait for the old entry, and its
    /// counts are its own. Guards `SlotFree::take`'s `.reset()`.
    #[test]
    fn a_reused_slot_starts_empty() {
        let b = Board::create().unwrap();
        let mut free = SlotFree::default();
        let (i, g) = free.take(&b).unwrap();
        let s = b.slot(i).unwrap();
        publish(s, g, 3);
        assert!(enter(s, g, 2));
        s.count(5, 5000);
        free.give_back(i);
        let (again, g2) = free.take(&b).unwrap();
        assert_eq!(again, i, "the first free slot");
        assert_ne!(g2, g);
        assert_eq!((s.ops(), s.in_flight(), s.take_counts()), (0, 0, (0, 0)));
        assert!(revoke(s, free.generation(), || false), "nobody in flight");
    }

    /// A board watching a liveness page refuses entry once the source is
    /// reaped, with no channel to poll (the load alone decides).
    #[test]
    fn a_board_stops_trusting_a_reaped_source_by_its_word_alone() {
        let (pid, v) = super::super::alive::testing::page_of_a_child();
        let board = Board::create().unwrap().watch(None, Some(v));
        assert!(!board.source_hung_up(), "a live source's word grants");
        super::super::alive::testing::kill_and_reap(pid);
        assert!(board.source_hung_up(), "a reaped source's word grants nothing");
    }
}
