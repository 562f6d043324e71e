//! The TCP data protocol as state machines without sockets, threads or a
//! clock: each side is fed what happened (bytes received, bytes the socket
//! took, the time) and polled for what to do (bytes to send, when to look
//! again, completions). The drivers in `tcp/requester.rs` and
//! `tcp/source.rs` own the sockets and one lock around their core, and act
//! on its outputs after releasing it.

pub mod requester;
pub mod source;
