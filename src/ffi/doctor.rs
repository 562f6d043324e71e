//! The doctor: which layer a CUDA transport stands on is broken, and what
//! to do (the engine's `doctor`; `orbite-doctor` prints the same).

use super::boundary::*;
use super::types::*;
use crate::{diagnose, DiagnoseOptions};
use std::ffi::c_char;

/// Diagnoses this machine for a CUDA transport and writes the diagnosis as
/// JSON: `{"transport", "handle_type", "usable", "checks": [{"layer",
/// "status", "cause", "text"}]}`. Layers, in order: `driver` (present, API
/// version), `devices`, `p2p` (the peer matrix), `fabric_attribute`,
/// `imex` (the channel files, their owner and mode, whether this process
/// may open one), `nvml` (each GPU's fabric state, cluster and clique),
/// `probe` (a real allocation and export with the handle type),
/// `fabric_domain` (what "auto" gives), and `peer` (a probe import against
/// a peer engine, when asked). `status` is "ok", "fail" (then `cause` names
/// the broken layer as the engine's stats and errors do: "no_driver",
/// "fabric_not_supported", "no_imex_channel", "imex_channel_denied",
/// "channel_not_shared", "different_clique", "daemon_not_ready",
/// "allocation_not_fabric", "driver_error", and `text` says what to do) or
/// "info" (a fact the transport does not need). `usable` is false when a
/// layer the requested transport needs failed (null without a transport).
/// Without a driver the walk stops at its `driver` line; useful on a
/// machine without a GPU all the same.
///
/// `options_json` may be NULL or "" (every layer, fabric handles, GPU 0, no
/// verdict); its keys: "transport" ("nvlink" or "mnnvl"), "handle_type"
/// ("fabric" or "posix_fd"), "device", "imex_channel_dir" (default
/// "/dev/nvidia-caps-imex-channels"), "peer" (an endpoint to probe),
/// "engine_config" (an object: the config of the engine that probes the
/// peer, e.g. its auth_key_file), "timeout_ms". An unknown key or a wrong
/// value is ORBITE_STATUS_INVALID_ARGUMENT naming it. Each call runs the
/// checks again (a probe allocation; with "peer", a connection): after
/// BUFFER_TOO_SMALL, call again with a larger buffer.
#[no_mangle]
pub extern "C" fn orbite_diagnose_json(
    options_json: *const c_char,
    buf: *mut c_char,
    cap: usize,
    out_len: *mut usize,
) -> orbite_status {
    guard(|| {
        need_mut(out_len, "out_len")?;
        let text = if options_json.is_null() { "" } else { need_str(options_json, "options_json")? };
        let options = DiagnoseOptions::from_json(text)?;
        write_text(&diagnose(&options).to_json(), buf, cap, out_len)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::boundary::said::said;
    use crate::Status;

    /// orbite_diagnose_json checks out_len before anything else: with
    /// out_len NULL, options naming an unknown key are NULL_ARGUMENT "out_len
    /// is NULL" (not the options' INVALID_ARGUMENT, and no diagnosis run),
    /// buf untouched. Guards its first line, `need_mut(out_len, ...)`.
    #[test]
    fn diagnose_json_refuses_a_null_out_len_before_reading_the_options() {
        let mut buf = [0x7f as c_char; 16];
        let st =
            orbite_diagnose_json(c"{\"transprot\": 1}".as_ptr(), buf.as_mut_ptr(), buf.len(), std::ptr::null_mut());
        let said = said();
        assert_eq!((st, said.as_str()), (Status::NullArgument as u32, "null argument: out_len is NULL"));
        assert!(buf.iter().all(|&c| c == 0x7f), "buf written");
    }
}
