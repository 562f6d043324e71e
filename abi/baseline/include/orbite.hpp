/*
 * orbite.hpp - a header-only C++17 layer over liborbite's C ABI (orbite.h).
 *
 * Every call below goes through the C functions of orbite.h, which stay the
 * contract; this header adds ownership, exceptions, typed values and the
 * text-buffer retry loop. Link against liborbite as for C (orbite::orbite_cpp
 * or orbite::orbite from CMake, or pkg-config) and compile as C++17 with
 * exceptions enabled.
 *
 * Errors
 *   Each fallible operation X comes twice:
 *   - X(...) throws orbite::Error (status + the C function + the message of
 *     orbite_last_error(), read on the failing thread right after the call);
 *   - try_X(...) returns orbite::Result<T> and never throws orbite::Error
 *     (only std::bad_alloc can escape): for hot paths and for code that
 *     treats failures as data.
 *   Batch::poll() and Batch::wait() return a Status: OK, PENDING,
 *   TRANSFER_FAILED and TIMED_OUT are outcomes, not exceptions.
 *
 * Ownership (all handle types are move-only)
 *   - Engine, and every Registration and Peer made from it, share one
 *     orbite_engine: orbite_engine_free runs when the last of them is
 *     destroyed, so a Registration or Peer can never use a freed engine.
 *     A Batch does not hold its engine and may outlive it (the C ABI allows
 *     that: its requests still end with a status, and its results stay
 *     readable).
 *   - Destructors never throw and never wait for peers. The last owner of an
 *     engine calls orbite_engine_free, which stops the engine's threads and
 *     connections without proving that a peer finished with anything. For an
 *     orderly close call Engine::close(timeout) first and look at its status.
 *   - A Registration either BORROWS its memory (register_memory(void*, size,
 *     access): the memory is yours and must stay valid until the region is
 *     unregistered, i.e. unregister() returned OK or NOT_FOUND, or the engine
 *     was closed or freed) or CO-OWNS it (register_memory(Allocation&&) or
 *     register_memory(std::shared_ptr<Allocation>): the Registration keeps
 *     the allocation alive, and it is freed only after the region is gone).
 *     ~Registration calls orbite_unregister_memory with the engine's default
 *     timeout (default_timeout_ms), which waits for copies that use the region.
 *   - ~Allocation calls orbite_allocation_free. The library refuses to free
 *     memory that is still registered or exported to a peer (UNAVAILABLE);
 *     then the memory is LEAKED ON PURPOSE: the handle moves to a
 *     process-wide list (retained_allocation_count()), and
 *     free_retained_allocations() tries again later, for example after the
 *     importing peer exited.
 *
 * What stays behind when a close does not finish (Engine::close runs two
 * halves, close_requester then close_source, and stops at the first that
 * fails; a non-OK close leaves the engine running, and its last owner's
 * orbite_engine_free still stops it):
 *   - TIMED_OUT from the requester half: requests this engine submitted are
 *     still in flight. Their local memory may still be written (READ) or read
 *     (WRITE): keep it valid, and keep its Registrations, until the engine is
 *     freed. The requester side stays fenced (no new submissions).
 *   - UNQUIESCED from the requester half: SHM or CUDA imports of a peer's
 *     memory whose close could not be confirmed stay with their
 *     mapping-budget charge (stats().ipc[...].imports_retained), mapped
 *     unless the unmap itself succeeded; on the peer, the export stays open
 *     and its allocation cannot be freed. (An import of a peer whose process
 *     exited is not such a case: it is unmapped and released by itself,
 *     counted in imports_released_after_exit.)
 *   - TIMED_OUT from the source half: peers' requests are still being served
 *     from or into this engine's registered memory: keep that memory valid.
 *   - UNQUIESCED from the source half: exports without a close receipt; the
 *     exported allocations stay exported (stats().ipc[...].exports_retained),
 *     orbite_allocation_free refuses them, and ~Allocation therefore keeps
 *     them in the retained list instead of unmapping memory a peer may map.
 *   Nothing else is leaked: engines, batches and peers are always freed.
 *
 * The header is the umbrella of its parts, one per type, under orbite/
 * (base, stats, values, allocation, registration, log, batch, peer, engine,
 * diagnose);
 * each compiles alone, but include this one.
 *
 * Peer regions and engine stats are read through the C ABI's typed calls
 * (orbite_peer_regions, orbite_engine_stats) into orbite::Region and
 * orbite::Stats: no JSON is parsed here. Stats::untyped names any path of a
 * newer library this header has no member for; Stats::numbers holds every
 * number by its path.
 */
#ifndef ORBITE_HPP
#define ORBITE_HPP

#include "orbite/base.hpp"
#include "orbite/stats.hpp"
#include "orbite/values.hpp"
#include "orbite/allocation.hpp"
#include "orbite/registration.hpp"
#include "orbite/log.hpp"
#include "orbite/batch.hpp"
#include "orbite/peer.hpp"
#include "orbite/engine.hpp"
#include "orbite/diagnose.hpp"

#endif  // ORBITE_HPP
