//! The copy pool's decisions: when a group is copied by the caller alone,
//! on the caller and the pool's threads, or started on the pool; how
//! large its pieces are; when its copies stream; how long copiers spin.
//! Every figure here was measured on the 2-core Xeon VM (see each one).

/// Below this many bytes a group is copied by the caller alone (handing work
/// to another core costs a wake-up of some microseconds).
pub const PARALLEL_MIN_BYTES: u64 = 512 * 1024;

/// Bytes of a piece: small enough that a copier that wakes late finds most
/// of a synchronous group still unclaimed, or none of it (the caller took
/// it all), rather than a fixed half it must still copy while the caller
/// waits. (On a 2-core VM, a 1 MiB group cut in two fixed halves ran at
/// 9.5-13 GB/s in TENT's tebench against 35-39 for one caller's memcpy:
/// the caller waited for the helper's wake-up.)
pub(super) const PIECE_BYTES: u64 = 64 * 1024;

/// From this many bytes a group's copies store around the caches
/// ([`stream_copy`]): its destination outgrows a core's L2 anyway, and such
/// stores skip reading every destination line before writing it. On the
/// 2-core Xeon VM (2 MiB of L2 a core), two threads copying 1 MiB blocks
/// through a 16 MiB working set moved 27.0-27.7 GB/s with memcpy and
/// 31.5-32.7 streaming, through 256 MiB 13.9-14.1 and 18.9-19.1; within
/// the L2 (2 MiB) streaming lost, 48-54 against 39.
pub const STREAM_MIN_BYTES: u64 = 8 << 20;

/// Whether a group of `total` bytes streams whatever its data
/// ([`STREAM_MIN_BYTES`]).
pub(super) fn streams(total: u64) -> bool {
    total >= STREAM_MIN_BYTES
}

/// Pieces of one group at most (a larger group gets larger pieces).
pub(super) const MAX_PIECES: usize = 256;

/// Groups waiting for each copy thread at most; past it the caller copies
/// what no thread takes.
pub(super) const QUEUED_JOBS: usize = 256;

/// A synchronous group wakes pool threads only when, timed on its first
/// piece, the rest would take the caller longer than this: a helper starts
/// some tens of microseconds after its wake-up on a VM, and a copy the
/// caller finishes sooner (cache-resident data, at 35-39 GB/s a core here)
/// is only slowed by it. In TENT's tebench (a 1 MiB group copied again and
/// again, in cache) helpers cut 34-35 GB/s to 22-29; in orbite-bench (a
/// working set far larger than the caches, 11 GB/s a core) they raise
/// 10-12 GB/s to 14-18.
pub(super) const HELP_MIN_REST: std::time::Duration = std::time::Duration::from_micros(50);

/// Whether a group whose first piece took `first` is worth waking helpers
/// for, with `rest` pieces still unclaimed.
pub(super) fn worth_helpers(first: std::time::Duration, rest: u32) -> bool {
    first * rest > HELP_MIN_REST
}

/// How long a synchronous copy's caller spins for its helpers' last pieces
/// before it sleeps (a helper descheduled mid-piece).
pub(super) const SPIN_LIMIT: std::time::Duration = std::time::Duration::from_micros(50);

/// How many pieces a group of `total` bytes is cut into, for `copiers` at
/// once.
pub(super) fn piece_count(total: u64, copiers: usize) -> usize {
    (total.div_ceil(PIECE_BYTES) as usize).clamp(copiers.max(1), MAX_PIECES)
}

/// How long a copy thread that finished a group looks for the next one,
/// spinning, before it sleeps: a caller that copies group after group
/// (a batch waited for, then the next submitted, some microseconds apart)
/// then finds it awake, and its group pays no wake-up (tens of
/// microseconds on a VM, more than a 64 KiB group takes to copy).
pub(super) const IDLE_SPIN: std::time::Duration = std::time::Duration::from_micros(50);

/// From this many bytes an independent group is started on the pool and
/// the submission returns at admission: the copy is long enough that the
/// hand-offs (waking the workers, then the completion) cost little of it.
pub const ASYNC_MIN_BYTES: u64 = 8 << 20;

/// Pieces larger than this are left to the copy threads: a poll that
/// copies one returns within about 100 us even from memory (groups up to
/// 256 MiB).
pub(super) const ASSIST_MAX_PIECE: u64 = 1 << 20;

/// Pool threads that help the caller with a synchronous copy when the pool
/// has `workers` (one per core): one fewer, since the caller copies too. A
/// copier more than there are cores only adds switches: on 2 cores, 3
/// copiers of a 1 MiB batch of 64 KiB blocks reached 18.5-20.0 GB/s in
/// TENT's tebench, 2 copiers 27.3-28.1.
pub(super) fn helpers(workers: usize) -> usize {
    workers.saturating_sub(1)
}

/// From this many bytes a [`Mover`]'s independent group is split over the
/// caller and an idle pool thread. A kernel call costs the same from a
/// cache or from memory (it pins every page it moves), so the split does
/// not wait for a timed first piece; a pool thread awake from the group
/// before ([`IDLE_SPIN`]) takes its share within a microsecond or so.
pub(super) const MOVER_MIN_BYTES: u64 = 64 * 1024;

/// The smallest piece of a [`Mover`]'s group ([`guided`]): one call each.
pub(super) const MOVER_MIN_PIECE: u64 = 32 * 1024;

/// A first piece (64 KiB) slower than this, under 16 GB/s, came from
/// memory, not from a cache: the rest of its group streams
/// ([`STREAM_MIN_BYTES`] says why). On the 2-core Xeon VM a 64 KiB piece
/// takes about 2 us in cache and 6-9 us from memory; orbite-bench's SHM
/// batches of 16 x 64 KiB from 1 GiB buffers went from 7.5-8.6 to
/// 10.6-11.0 GB/s, and tebench's (the same 1 MiB again and again, in
/// cache) stayed at 21-22.
pub(super) const FROM_MEMORY_PIECE: std::time::Duration = std::time::Duration::from_micros(4);

/// Whether a group whose first piece took `first` copies from memory.
pub(super) fn from_memory(first: std::time::Duration) -> bool {
    first > FROM_MEMORY_PIECE
}
