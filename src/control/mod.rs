//! The control socket: framing, versioned messages (with the region
//! descriptors peers publish), identities and endpoint strings.

pub mod auth;
pub mod endpoint;
pub mod frame;
pub mod identity;
pub mod io;
pub mod message;
pub mod notify_frame;
pub mod pipe;
pub mod region_index;
pub mod seal;
pub mod wire;

pub use frame::{FrameHeader, MsgKind, FRAME_HEADER_LEN, PROTOCOL_VERSION};
pub use identity::{Identity, ProcessIdentity};
pub use message::{Describe, RegionInfo};
