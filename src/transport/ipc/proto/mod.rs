//! The IPC protocol as state machines without sockets, threads or a
//! clock (as `tcp/proto` is for TCP): the serving side of a channel is fed
//! bytes and the time and polled for answers; `ipc/source.rs` drives it
//! on the reactor with one lock per channel and runs what it returns
//! after releasing it.

pub mod source;
