//! Generates `orbite.h` with cbindgen into OUT_DIR (and, when
//! ORBITE_WRITE_HEADER=1, into include/orbite.h), and sets the SONAME.

use std::path::PathBuf;

/// The C ABI's version, `abi-version` of `[package.metadata.orbite]` in
/// Cargo.toml: the one place it is written (docs/versioning.md).
fn abi_version(manifest: &str) -> u32 {
    let section = manifest.split("[package.metadata.orbite]").nth(1).expect("Cargo.toml has [package.metadata.orbite]");
    let line = section.lines().find(|l| l.trim_start().starts_with("abi-version")).expect("abi-version in Cargo.toml");
    let value = line.split('=').nth(1).expect("abi-version = N").trim();
    value.parse().unwrap_or_else(|_| panic!("abi-version must be a whole number, not {value:?}"))
}

/// Reads the status table (`src/status_table.rs`) as (value, C name, doc).
macro_rules! status_table {
    ($( $name:ident = $value:literal, $cname:literal, $doc:literal $(, $err:ident($what:literal))? ; )*) => {
        [$( ($value, $cname, $doc) ),*]
    };
}

/// The `ORBITE_STATUS_*` constants of the header, from the status table.
fn status_constants() -> String {
    let rows: &[(u32, &str, &str)] = &include!("src/status_table.rs");
    rows.iter().map(|(v, name, doc)| format!("\n// {doc}\n#define ORBITE_STATUS_{name} {v}\n")).collect()
}

fn main() {
    let crate_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("manifest dir"));
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("out dir"));
    println!("cargo:rerun-if-changed=src/ffi");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    println!("cargo:rerun-if-changed=src/status_table.rs");
    println!("cargo:rerun-if-changed=Cargo.toml");
    println!("cargo:rerun-if-env-changed=ORBITE_WRITE_HEADER");
    let manifest = std::fs::read_to_string(crate_dir.join("Cargo.toml")).expect("read Cargo.toml");
    let abi = abi_version(&manifest);
    println!("cargo:rustc-env=ORBITE_ABI_VERSION={abi}");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,liborbite.so.{abi}");

    let mut config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("read cbindgen.toml");
    let version = std::env::var("CARGO_PKG_VERSION").expect("version");
    config.after_includes = config
        .after_includes
        .map(|s| s.replace("@VERSION@", &version).replace("@ABI_VERSION@", &abi.to_string()) + &status_constants());
    let header = out_dir.join("orbite.h");
    match cbindgen::Builder::new()
        .with_config(config)
        .with_src(crate_dir.join("src/ffi/types.rs"))
        .with_src(crate_dir.join("src/ffi/engine.rs"))
        .with_src(crate_dir.join("src/ffi/stats.rs"))
        .with_src(crate_dir.join("src/ffi/memory.rs"))
        .with_src(crate_dir.join("src/ffi/cuda.rs"))
        .with_src(crate_dir.join("src/ffi/doctor.rs"))
        .with_src(crate_dir.join("src/ffi/transfer.rs"))
        .with_src(crate_dir.join("src/ffi/direct.rs"))
        .with_src(crate_dir.join("src/ffi/notify.rs"))
        .with_src(crate_dir.join("src/ffi/log.rs"))
        .generate()
    {
        Ok(b) => {
            b.write_to_file(&header);
            if std::env::var("ORBITE_WRITE_HEADER").as_deref() == Ok("1") {
                b.write_to_file(crate_dir.join("include/orbite.h"));
            }
        }
        Err(e) => panic!("cbindgen failed to generate orbite.h: {e}"),
    }
}
