//! The committed header must equal what build.rs generates, and the ABI
//! version must agree between the header, the library and the SONAME.

const GENERATED: &str = include_str!(concat!(env!("OUT_DIR"), "/orbite.h"));
const COMMITTED: &str = include_str!("../include/orbite.h");

#[test]
fn committed_header_is_fresh() {
    assert!(
        GENERATED == COMMITTED,
        "include/orbite.h is stale: refresh it with `ORBITE_WRITE_HEADER=1 cargo build` and commit it"
    );
}

#[test]
fn abi_version_agrees_everywhere() {
    let v = orbite::ABI_VERSION;
    // What the library returns to C, through its exported symbol.
    extern "C" {
        fn orbite_abi_version() -> u32;
    }
    // SAFETY: a C function of no arguments that returns a constant.
    assert_eq!(unsafe { orbite_abi_version() }, v);
    assert!(COMMITTED.contains(&format!("#define ORBITE_ABI_VERSION {v}\n")));
    // Written once, in Cargo.toml; build.rs (the SONAME, the header) and
    // CMakeLists.txt (the installed names) read it from there.
    let manifest = include_str!("../Cargo.toml");
    assert!(manifest.contains(&format!("\n[package.metadata.orbite]\nabi-version = {v}\n")));
    let cmake = include_str!("../CMakeLists.txt");
    assert!(cmake.contains("REGEX \"^abi-version = [0-9]+$\""), "CMakeLists.txt reads abi-version from Cargo.toml");
    assert!(!cmake.contains("set(ORBITE_ABI_VERSION"), "CMakeLists.txt must not write the ABI version itself");
}

#[test]
fn package_version_agrees_everywhere() {
    let v = env!("CARGO_PKG_VERSION");
    extern "C" {
        fn orbite_version() -> *const std::ffi::c_char;
    }
    // SAFETY: returns a pointer to a static NUL-terminated string.
    let got = unsafe { std::ffi::CStr::from_ptr(orbite_version()) };
    assert_eq!(got.to_str().unwrap(), v);
    assert!(COMMITTED.contains(&format!("#define ORBITE_VERSION_STRING \"{v}\"\n")));
    let cmake = include_str!("../CMakeLists.txt");
    assert!(cmake.contains("project(orbite VERSION ${ORBITE_VERSION}"), "CMake takes the version from Cargo.toml");
    let changelog = include_str!("../CHANGELOG.md");
    assert!(changelog.contains(&format!("\n## [{v}] - ")), "CHANGELOG.md has a section for {v}");
}

#[test]
fn header_defines_every_status_with_its_value() {
    for s in orbite::Status::ALL {
        let line = format!("#define {} {}\n", s.c_name(), s as u32);
        assert!(COMMITTED.contains(&line), "orbite.h lacks {line:?}");
    }
}

#[test]
fn header_declares_every_contract_function() {
    for f in [
        "orbite_abi_version",
        "orbite_version",
        "orbite_status_name",
        "orbite_last_error",
        "orbite_engine_new",
        "orbite_engine_endpoint",
        "orbite_engine_stats_json",
        "orbite_engine_free",
        "orbite_host_allocate_shared",
        "orbite_cuda_allocate",
        "orbite_cuda_allocate_ipc",
        "orbite_cuda_allocate_pinned_host",
        "orbite_allocate_mnnvl",
        "orbite_allocate_egm",
        "orbite_allocation_addr",
        "orbite_allocation_length",
        "orbite_allocation_free",
        "orbite_register_memory",
        "orbite_unregister_memory",
        "orbite_record_producer_stream",
        "orbite_connect",
        "orbite_peer_regions_json",
        "orbite_disconnect",
        "orbite_submit",
        "orbite_batch_poll",
        "orbite_batch_wait",
        "orbite_batch_results",
        "orbite_batch_cancel",
        "orbite_batch_free",
        "orbite_flush_nvlink_cache",
        "orbite_close_requester",
        "orbite_close_source",
        "orbite_close",
        "orbite_cuda_retained_resources_json",
    ] {
        let declared = COMMITTED.contains(&format!(" {f}(")) || COMMITTED.contains(&format!("*{f}("));
        assert!(declared, "orbite.h lacks {f}");
    }
}
