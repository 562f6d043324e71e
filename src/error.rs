//! The one error type of the library and the status codes it maps onto.
//!
//! Every [`Error`] variant corresponds to exactly one C status
//! (`ORBITE_STATUS_*`); [`Status`] holds the frozen numeric values.

use std::fmt;

/// Status codes, numerically identical to the C `ORBITE_STATUS_*` constants.
/// These values are frozen: the C ABI depends on them.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Status {
    /// Success.
    Ok = 0,
    /// The operation has not finished yet.
    Pending = 1,
    /// A required pointer argument was NULL.
    NullArgument = 2,
    /// An argument had an invalid value.
    InvalidArgument = 3,
    /// The configuration was rejected.
    InvalidConfig = 4,
    /// A peer, region or address is unknown.
    NotFound = 5,
    /// A range falls outside its region.
    OutOfRange = 6,
    /// The region does not permit the operation.
    PermissionDenied = 7,
    /// The resource or peer is not available now (closed, busy, gone).
    Unavailable = 8,
    /// A budget or pool is exhausted.
    ResourceExhausted = 9,
    /// A deadline passed.
    TimedOut = 10,
    /// The peer (or its region) is not the one this side knew.
    StalePeer = 11,
    /// Cleanup could not be confirmed; resources stay retained.
    Unquiesced = 12,
    /// At least one request of a batch failed.
    TransferFailed = 13,
    /// A peer violated the wire protocol.
    ProtocolError = 14,
    /// The operation is not supported by this build, driver or peer.
    NotSupported = 15,
    /// The CUDA driver reported an error.
    CudaError = 16,
    /// An operating-system I/O error.
    IoError = 17,
    /// An output buffer was too small.
    BufferTooSmall = 18,
    /// The request was cancelled before it started.
    Cancelled = 19,
    /// A panic was caught at the C boundary (a bug).
    Panic = 20,
}

impl Status {
    /// Every status, in numeric order.
    pub const ALL: [Status; 21] = [
        Status::Ok,
        Status::Pending,
        Status::NullArgument,
        Status::InvalidArgument,
        Status::InvalidConfig,
        Status::NotFound,
        Status::OutOfRange,
        Status::PermissionDenied,
        Status::Unavailable,
        Status::ResourceExhausted,
        Status::TimedOut,
        Status::StalePeer,
        Status::Unquiesced,
        Status::TransferFailed,
        Status::ProtocolError,
        Status::NotSupported,
        Status::CudaError,
        Status::IoError,
        Status::BufferTooSmall,
        Status::Cancelled,
        Status::Panic,
    ];

    /// The status for a raw value, if it is one.
    pub fn from_u32(v: u32) -> Option<Status> {
        Status::ALL.get(v as usize).copied()
    }

    /// The C constant name, e.g. `"ORBITE_STATUS_OK"`.
    pub fn c_name(self) -> &'static str {
        match self {
            Status::Ok => "ORBITE_STATUS_OK",
            Status::Pending => "ORBITE_STATUS_PENDING",
            Status::NullArgument => "ORBITE_STATUS_NULL_ARGUMENT",
            Status::InvalidArgument => "ORBITE_STATUS_INVALID_ARGUMENT",
            Status::InvalidConfig => "ORBITE_STATUS_INVALID_CONFIG",
            Status::NotFound => "ORBITE_STATUS_NOT_FOUND",
            Status::OutOfRange => "ORBITE_STATUS_OUT_OF_RANGE",
            Status::PermissionDenied => "ORBITE_STATUS_PERMISSION_DENIED",
            Status::Unavailable => "ORBITE_STATUS_UNAVAILABLE",
            Status::ResourceExhausted => "ORBITE_STATUS_RESOURCE_EXHAUSTED",
            Status::TimedOut => "ORBITE_STATUS_TIMED_OUT",
            Status::StalePeer => "ORBITE_STATUS_STALE_PEER",
            Status::Unquiesced => "ORBITE_STATUS_UNQUIESCED",
            Status::TransferFailed => "ORBITE_STATUS_TRANSFER_FAILED",
            Status::ProtocolError => "ORBITE_STATUS_PROTOCOL_ERROR",
            Status::NotSupported => "ORBITE_STATUS_NOT_SUPPORTED",
            Status::CudaError => "ORBITE_STATUS_CUDA_ERROR",
            Status::IoError => "ORBITE_STATUS_IO_ERROR",
            Status::BufferTooSmall => "ORBITE_STATUS_BUFFER_TOO_SMALL",
            Status::Cancelled => "ORBITE_STATUS_CANCELLED",
            Status::Panic => "ORBITE_STATUS_PANIC",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.c_name())
    }
}

/// Errors of the OrbiTE engine. Each variant maps one-to-one onto a failing
/// [`Status`]; the text names the cause (argument, key, limit, peer).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A required pointer was NULL (C boundary only).
    #[error("null argument: {0}")]
    NullArgument(String),
    /// An argument had an invalid value.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The configuration was rejected; the text names the key.
    #[error("invalid config: {0}")]
    InvalidConfig(String),
    /// A peer, region or address is unknown.
    #[error("not found: {0}")]
    NotFound(String),
    /// A range falls outside its region.
    #[error("out of range: {0}")]
    OutOfRange(String),
    /// The region does not permit the operation.
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// Closed, busy or gone.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// A budget or pool is exhausted.
    #[error("resource exhausted: {0}")]
    ResourceExhausted(String),
    /// A deadline passed.
    #[error("timed out: {0}")]
    TimedOut(String),
    /// The peer or region is not the one this side knew.
    #[error("stale peer: {0}")]
    StalePeer(String),
    /// Cleanup could not be confirmed; resources stay retained.
    #[error("unquiesced: {0}")]
    Unquiesced(String),
    /// At least one request of a batch failed.
    #[error("transfer failed: {0}")]
    TransferFailed(String),
    /// A peer violated the wire protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// Not supported by this build, driver or peer.
    #[error("not supported: {0}")]
    NotSupported(String),
    /// The CUDA driver reported an error.
    #[error("CUDA error: {0}")]
    Cuda(String),
    /// An operating-system I/O error.
    #[error("I/O error: {0}")]
    Io(String),
    /// An output buffer was too small.
    #[error("buffer too small: {0}")]
    BufferTooSmall(String),
    /// Cancelled before it started.
    #[error("cancelled: {0}")]
    Cancelled(String),
    /// A panic was caught (a bug in the library).
    #[error("internal panic: {0}")]
    Panic(String),
}

impl Error {
    /// The status this error maps onto.
    pub fn status(&self) -> Status {
        match self {
            Error::NullArgument(_) => Status::NullArgument,
            Error::InvalidArgument(_) => Status::InvalidArgument,
            Error::InvalidConfig(_) => Status::InvalidConfig,
            Error::NotFound(_) => Status::NotFound,
            Error::OutOfRange(_) => Status::OutOfRange,
            Error::PermissionDenied(_) => Status::PermissionDenied,
            Error::Unavailable(_) => Status::Unavailable,
            Error::ResourceExhausted(_) => Status::ResourceExhausted,
            Error::TimedOut(_) => Status::TimedOut,
            Error::StalePeer(_) => Status::StalePeer,
            Error::Unquiesced(_) => Status::Unquiesced,
            Error::TransferFailed(_) => Status::TransferFailed,
            Error::Protocol(_) => Status::ProtocolError,
            Error::NotSupported(_) => Status::NotSupported,
            Error::Cuda(_) => Status::CudaError,
            Error::Io(_) => Status::IoError,
            Error::BufferTooSmall(_) => Status::BufferTooSmall,
            Error::Cancelled(_) => Status::Cancelled,
            Error::Panic(_) => Status::Panic,
        }
    }

    /// Builds the error for a failing `status` with `message`.
    /// `Ok` and `Pending` are not failures; they map to `InvalidArgument`.
    pub fn from_status(status: Status, message: impl Into<String>) -> Error {
        let m = message.into();
        match status {
            Status::NullArgument => Error::NullArgument(m),
            Status::InvalidArgument | Status::Ok | Status::Pending => Error::InvalidArgument(m),
            Status::InvalidConfig => Error::InvalidConfig(m),
            Status::NotFound => Error::NotFound(m),
            Status::OutOfRange => Error::OutOfRange(m),
            Status::PermissionDenied => Error::PermissionDenied(m),
            Status::Unavailable => Error::Unavailable(m),
            Status::ResourceExhausted => Error::ResourceExhausted(m),
            Status::TimedOut => Error::TimedOut(m),
            Status::StalePeer => Error::StalePeer(m),
            Status::Unquiesced => Error::Unquiesced(m),
            Status::TransferFailed => Error::TransferFailed(m),
            Status::ProtocolError => Error::Protocol(m),
            Status::NotSupported => Error::NotSupported(m),
            Status::CudaError => Error::Cuda(m),
            Status::IoError => Error::Io(m),
            Status::BufferTooSmall => Error::BufferTooSmall(m),
            Status::Cancelled => Error::Cancelled(m),
            Status::Panic => Error::Panic(m),
        }
    }

    /// The message without the status prefix.
    pub fn message(&self) -> &str {
        match self {
            Error::NullArgument(m)
            | Error::InvalidArgument(m)
            | Error::InvalidConfig(m)
            | Error::NotFound(m)
            | Error::OutOfRange(m)
            | Error::PermissionDenied(m)
            | Error::Unavailable(m)
            | Error::ResourceExhausted(m)
            | Error::TimedOut(m)
            | Error::StalePeer(m)
            | Error::Unquiesced(m)
            | Error::TransferFailed(m)
            | Error::Protocol(m)
            | Error::NotSupported(m)
            | Error::Cuda(m)
            | Error::Io(m)
            | Error::BufferTooSmall(m)
            | Error::Cancelled(m)
            | Error::Panic(m) => m,
        }
    }

    /// An I/O error with context.
    pub fn io(context: &str, e: &std::io::Error) -> Error {
        Error::Io(format!("{context}: {e}"))
    }
}

/// Result alias used throughout the crate.
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_dense_and_round_trip() {
        for (i, s) in Status::ALL.iter().enumerate() {
            assert_eq!(*s as u32, i as u32);
            assert_eq!(Status::from_u32(i as u32), Some(*s));
        }
        assert_eq!(Status::from_u32(21), None);
    }

    #[test]
    fn every_failing_status_maps_back_from_its_error() {
        for s in Status::ALL.iter().skip(2) {
            assert_eq!(Error::from_status(*s, "x").status(), *s);
        }
    }
}
