// The status table, written once: value, C name (after `ORBITE_STATUS_`),
// doc line and, for failures, the `Error` variant with its message prefix.
// `src/error.rs` builds `Status` and `Error` from it; `build.rs` builds the
// `ORBITE_STATUS_*` constants of include/orbite.h from it. The values are
// frozen: the C ABI depends on them.
status_table! {
    Ok = 0, "OK", "Success.";
    Pending = 1, "PENDING", "Not finished yet (poll).";
    NullArgument = 2, "NULL_ARGUMENT", "A required pointer was NULL.", NullArgument("null argument");
    InvalidArgument = 3, "INVALID_ARGUMENT", "An argument had an invalid value (unknown enum value, zero length, overlap).",
        InvalidArgument("invalid argument");
    InvalidConfig = 4, "INVALID_CONFIG", "The config JSON was rejected; orbite_last_error() names the key.",
        InvalidConfig("invalid config");
    NotFound = 5, "NOT_FOUND", "Unknown peer, region or address.", NotFound("not found");
    OutOfRange = 6, "OUT_OF_RANGE", "A range crosses the end of its region.", OutOfRange("out of range");
    PermissionDenied = 7, "PERMISSION_DENIED", "The region's access flags forbid the operation.",
        PermissionDenied("permission denied");
    Unavailable = 8, "UNAVAILABLE", "Closed, busy, gone or not built in.", Unavailable("unavailable");
    ResourceExhausted = 9, "RESOURCE_EXHAUSTED", "A budget, pool or limit is exhausted.",
        ResourceExhausted("resource exhausted");
    TimedOut = 10, "TIMED_OUT", "A deadline passed.", TimedOut("timed out");
    StalePeer = 11, "STALE_PEER", "The peer or region is no longer the one this side knew.", StalePeer("stale peer");
    Unquiesced = 12, "UNQUIESCED", "Cleanup could not be confirmed; resources stay retained.", Unquiesced("unquiesced");
    TransferFailed = 13, "TRANSFER_FAILED", "At least one request of the batch failed (see orbite_batch_results).",
        TransferFailed("transfer failed");
    ProtocolError = 14, "PROTOCOL_ERROR", "A peer broke the wire protocol.", Protocol("protocol error");
    NotSupported = 15, "NOT_SUPPORTED", "Not supported by this build, driver or peer.", NotSupported("not supported");
    CudaError = 16, "CUDA_ERROR", "The CUDA driver failed.", Cuda("CUDA error");
    IoError = 17, "IO_ERROR", "An operating-system I/O error.", Io("I/O error");
    BufferTooSmall = 18, "BUFFER_TOO_SMALL", "The output buffer is too small; *out_len holds the size needed.",
        BufferTooSmall("buffer too small");
    Cancelled = 19, "CANCELLED", "Cancelled before it started.", Cancelled("cancelled");
    Panic = 20, "PANIC", "A panic was caught inside the library (a bug; please report it).", Panic("internal panic");
}
