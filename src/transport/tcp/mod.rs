//! The TCP transport: payload carried over the control connection, after
//! the handshake (`handshake`: both sides).
//!
//! The requester side ([`requester::TcpConnection`]) is served by the
//! engine's I/O threads: frames leave as the socket takes them, responses
//! land straight in local registered memory. The source side
//! ([`source::serve`]) validates every request against its regions and
//! streams payload straight from or into them. The outbox ([`outbox::Outbox`])
//! sends a peer's notifications over its connection, each behind the
//! batches it must follow.

mod chunk;
pub mod executor;
pub mod handshake;
pub mod linger;
pub mod outbox;
pub mod pipe;
pub mod proto;
pub mod pump;
pub mod requester;
pub mod source;
pub mod torn;

pub use requester::{Chunk, Record, TcpConnection};
pub use source::{serve, SourceConn, SourceContext};
