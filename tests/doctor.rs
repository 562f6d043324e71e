//! `orbite-doctor` and `orbite_diagnose_json` where no CUDA driver is
//! present (this build host): one line saying so, a non-zero exit for a
//! requested CUDA transport, and the C ABI's conventions (text
//! out-parameter, NULL arguments, options checked). The layers behind a
//! driver are tested through the stand-ins in tests/mnnvl_fabric.rs.

use std::ffi::{c_char, CStr, CString};

extern "C" {
    fn orbite_diagnose_json(options: *const c_char, buf: *mut c_char, cap: usize, out_len: *mut usize) -> u32;
    fn orbite_last_error() -> *const c_char;
}

/// The one line a machine without a driver gets: what this build says.
fn no_driver_line() -> &'static str {
    if cfg!(feature = "cuda") {
        "FAIL driver: no_driver: no CUDA driver: libcuda.so was not found on the loader path; install the NVIDIA \
         driver (libcuda.so.1) on a machine with a GPU"
    } else {
        "FAIL driver: no_driver: this build of liborbite has no CUDA support (rebuild with the `cuda` feature; CMake \
         enables it with -DORBITE_CUDA=ON); install the NVIDIA driver (libcuda.so.1) on a machine with a GPU"
    }
}

/// Whether this host has a real driver (then the doctor walks on).
fn driver_here() -> bool {
    orbite::cuda::ready().is_ok()
}

#[test]
fn without_a_driver_the_doctor_says_so_in_one_line_and_fails_mnnvl() {
    if driver_here() {
        // A GPU host: the driver line is the first and it is sound.
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_orbite-doctor")).output().unwrap();
        assert!(String::from_utf8_lossy(&out.stdout).starts_with("ok   driver: "));
        return;
    }
    for (args, code) in [(&["--transport", "mnnvl"][..], 1), (&["--transport", "nvlink"][..], 1), (&[][..], 0)] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_orbite-doctor")).args(args).output().unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{}\n", no_driver_line()), "{args:?}");
        assert_eq!(out.status.code(), Some(code), "{args:?}: with a transport asked, non-zero");
    }
    let out =
        std::process::Command::new(env!("CARGO_BIN_EXE_orbite-doctor")).args(["--transport", "tcp"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("diagnose option `transport`"));
}

fn last_error() -> String {
    // SAFETY: the library returns a NUL-terminated string valid until the
    // next failing call on this thread.
    unsafe { CStr::from_ptr(orbite_last_error()) }.to_string_lossy().into_owned()
}

#[test]
fn diagnose_json_follows_the_text_out_parameter_rules() {
    let opts = CString::new(r#"{"transport": "mnnvl"}"#).unwrap();
    let mut len = 0usize;
    // SAFETY (each call): NUL-terminated options or NULL; `buf` of `cap`
    // writable bytes or NULL with cap 0; `len` a valid out-parameter.
    let s = unsafe { orbite_diagnose_json(opts.as_ptr(), std::ptr::null_mut(), 0, &mut len) };
    assert_eq!(s, orbite::Status::BufferTooSmall as u32);
    assert!(len > 0);
    let mut buf = vec![0 as c_char; len + 1];
    let mut got = 0usize;
    // SAFETY: as above.
    let s = unsafe { orbite_diagnose_json(opts.as_ptr(), buf.as_mut_ptr(), buf.len(), &mut got) };
    assert_eq!(s, orbite::Status::Ok as u32, "{}", last_error());
    // SAFETY: NUL-terminated on OK.
    let text = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap().to_string();
    assert_eq!(got, text.len());
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["transport"], "mnnvl");
    if !driver_here() {
        assert_eq!(v["usable"], false, "{v}");
        assert_eq!(v["checks"].as_array().unwrap().len(), 1, "{v}");
        assert_eq!(v["checks"][0]["cause"], "no_driver", "{v}");
        assert_eq!(v["checks"][0]["status"], "fail", "{v}");
    }
    // NULL options: every layer, no verdict.
    // SAFETY: as above.
    let s = unsafe { orbite_diagnose_json(std::ptr::null(), buf.as_mut_ptr(), buf.len(), &mut got) };
    assert_eq!(s, orbite::Status::Ok as u32);
    // SAFETY: NUL-terminated on OK.
    let v: serde_json::Value = serde_json::from_str(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap()).unwrap();
    assert_eq!(v["usable"], serde_json::Value::Null);
    // A NULL out_len, and options naming an unknown key.
    // SAFETY: as above (out_len NULL is the case under test).
    let s = unsafe { orbite_diagnose_json(opts.as_ptr(), buf.as_mut_ptr(), buf.len(), std::ptr::null_mut()) };
    assert_eq!(s, orbite::Status::NullArgument as u32);
    let bad = CString::new(r#"{"transprot": "mnnvl"}"#).unwrap();
    let mut untouched = 7usize;
    // SAFETY: as above.
    let s = unsafe { orbite_diagnose_json(bad.as_ptr(), buf.as_mut_ptr(), buf.len(), &mut untouched) };
    assert_eq!(s, orbite::Status::InvalidArgument as u32);
    assert!(last_error().contains("`transprot`: unknown option"), "{}", last_error());
    assert_eq!(untouched, 7, "out-parameters are written only on OK");
}
