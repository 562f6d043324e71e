//! The IPC protocol as state machines without sockets, threads or a
//! clock (as `tcp/proto` is for TCP): the serving side of a channel is fed
//! bytes and the time and polled for answers; `ipc/source.rs` drives it
//! on the reactor with one lock per channel and runs what it returns
//! after releasing it. The export table's lifecycle (offers, answers,
//! receipts, revocations, lost channels, exited importers) is
//! `exports.rs`, driven by `ipc/export/` under one lock; `holders.rs` is
//! what each requester holds of it (its count of exports and the bytes it
//! alone keeps charged), bounded. The requester's
//! decisions are `requester.rs`: an import's opening exchange (the offer
//! checked against the request, the answers, the handle), a revalidation's
//! answer and how a posted group ends; `ipc/requester/` makes the calls
//! over its link and carries out what it decides. `calls.rs` is the
//! requester's side of one channel: calls numbered in the order they
//! leave, each answer handed to its caller, how the channel ends;
//! `ipc/pipeline.rs` drives it.

pub mod calls;
pub mod exports;
pub mod holders;
pub mod requester;
pub mod source;
