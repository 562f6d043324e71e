//! The CUDA layer without a GPU: no driver at all, a driver that reports no
//! device, and a driver missing a symbol. Built only with `--features cuda`.
//! The fake drivers are tiny C libraries compiled here; each case runs in a
//! child process because the driver is probed once per process. On a host
//! with a real driver the children run where it cannot be loaded (every
//! libcuda file of the loader's cache covered by /dev/null in a private
//! mount namespace), so the cases hold on GPU hosts too.
#![cfg(feature = "cuda")]

use orbite::*;
use std::path::PathBuf;
use std::process::Command;

/// Every symbol the driver probe requires (cuInit is defined separately).
const SYMBOLS: &[&str] = orbite::cuda::driver::REQUIRED;

/// Builds a fake libcuda.so.1 whose cuInit returns `init_result`, omitting `skip`.
fn fake_driver(name: &str, init_result: i32, skip: Option<&str>) -> PathBuf {
    fake_driver_with(name, init_result, skip, "")
}

/// The same, with extra C definitions that replace the stubs they name.
fn fake_driver_with(name: &str, init_result: i32, skip: Option<&str>, extra: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("orbite-fake-cuda-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut c = format!("int cuInit(unsigned flags) {{ (void)flags; return {init_result}; }}\n{extra}\n");
    for s in SYMBOLS.iter().filter(|s| **s != "cuInit" && Some(**s) != skip && !extra.contains(&format!(" {s}("))) {
        // Never called: cuInit fails first. Present so the probe finds them.
        c.push_str(&format!("int {s}(void) {{ return 999; }}\n"));
    }
    let src = dir.join("fake.c");
    std::fs::write(&src, c).unwrap();
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(dir.join("libcuda.so.1"))
        .arg(&src)
        .output()
        .expect("a C compiler (cc)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Under both names the loader tries, so that neither finds another.
    let _ = std::fs::remove_file(dir.join("libcuda.so"));
    std::os::unix::fs::symlink("libcuda.so.1", dir.join("libcuda.so")).unwrap();
    dir
}

/// The libcuda files the loader finds through its cache (a host with a
/// driver installed; none here).
fn system_libcuda() -> Vec<String> {
    let out = Command::new("ldconfig").arg("-p").output().map(|o| o.stdout).unwrap_or_default();
    String::from_utf8_lossy(&out)
        .lines()
        .filter(|l| l.trim_start().starts_with("libcuda.so"))
        .filter_map(|l| l.rsplit_once("=> ").map(|(_, p)| p.trim().to_string()))
        .collect()
}

/// `program args` as a command that runs where the system's libcuda cannot
/// be loaded: as is when the loader's cache has none, else in a private
/// mount namespace (`unshare --mount`, with `--map-root-user` when not
/// root) with each of those files covered by /dev/null.
fn without_system_libcuda(program: &str, args: &[&str]) -> Command {
    let hide = system_libcuda();
    if hide.is_empty() {
        let mut c = Command::new(program);
        c.args(args);
        return c;
    }
    let mut c = Command::new("unshare");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        c.arg("--map-root-user");
    }
    c.args([
        "--mount",
        "sh",
        "-c",
        r#"for f in $ORBITE_HIDE; do mount --bind /dev/null "$f" || exit 97; done; exec "$@""#,
    ]);
    c.arg("sh").arg(program).args(args).env("ORBITE_HIDE", hide.join(" "));
    c
}

fn run_child(case: &str, libdir: Option<&PathBuf>) {
    let me = std::env::current_exe().unwrap();
    let args = ["--exact", "child_case", "--nocapture", "--test-threads", "1"];
    let mut cmd = without_system_libcuda(me.to_str().unwrap(), &args);
    cmd.env("ORBITE_CUDA_CASE", case);
    match libdir {
        Some(d) => cmd.env("LD_LIBRARY_PATH", d),
        None => cmd.env_remove("LD_LIBRARY_PATH"),
    };
    let out = cmd.output().unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("child case passed"),
        "case {case}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A driver from before fabric handles (12000, one device): MNNVL is
/// refused with the reason, engines asking for it start, selection skips it.
fn no_fabric_case() {
    let e = allocate_mnnvl(0, 4096).err().unwrap();
    assert_eq!(e.status(), Status::NotSupported, "{e}");
    assert!(e.message().contains("fabric-handle VMM symbols"), "{e}");
    let e = allocate_egm(0, 4096).err().unwrap();
    assert_eq!(e.status(), Status::NotSupported, "{e}");
    let src = Engine::from_json(r#"{"mnnvl": {"egm": true}}"#).unwrap();
    let req = Engine::from_json(r#"{"mnnvl": {}}"#).unwrap();
    let why = &src.stats().transports_available["mnnvl"];
    assert!(why.contains("fabric-handle VMM symbols"), "{why}");
    let a = allocate_shared_host(4096).unwrap();
    src.register_memory(a.addr(), 4096, Access::READ).unwrap();
    let mut local = vec![0u8; 4096];
    req.register_memory(local.as_mut_ptr() as u64, 4096, Access::NONE).unwrap();
    let peer = req.connect(&src.endpoint(), None).unwrap();
    let r = Request { op: Op::Read, local_addr: local.as_ptr() as u64, remote_addr: a.addr(), len: 4096 };
    let only = SubmitOptions { transport: Transport::Only(TransportKind::Mnnvl), timeout: None };
    assert_eq!(req.submit(peer, &[r], only).err().unwrap().status(), Status::Unavailable);
    req.submit(peer, &[r], SubmitOptions::default()).unwrap().wait(std::time::Duration::from_secs(60)).unwrap();
    assert_eq!(req.stats().transports["shm"].requests_completed, 1, "policy skipped mnnvl and nvlink");
    req.close(None).unwrap();
    src.close(None).unwrap();
    a.free().unwrap();
    println!("child case passed");
}

/// Runs in a child process; does nothing when run directly.
#[test]
fn child_case() {
    let Ok(case) = std::env::var("ORBITE_CUDA_CASE") else { return };
    if case == "no-fabric" {
        return no_fabric_case();
    }
    let (status, needle) = match case.as_str() {
        "absent" => (Status::Unavailable, "libcuda.so was not found"),
        "no-device" => (Status::Unavailable, "reports no device"),
        "missing-symbol" => (Status::NotSupported, "does not export cuIpcOpenMemHandle_v2"),
        other => panic!("unknown case {other}"),
    };
    let check = |e: Error| {
        assert_eq!(e.status(), status, "{e}");
        assert!(e.message().contains(needle), "{e}");
    };
    check(CudaMemory::allocate_ipc(0, 4096).err().unwrap());
    check(CudaMemory::allocate(0, 4096).err().unwrap());
    check(allocate_pinned_host(4096).err().unwrap());
    check(allocate_mnnvl(0, 4096).err().unwrap());
    check(allocate_egm(0, 4096).err().unwrap());
    // An engine asking for NVLink still starts; NVLink is not advertised and
    // the stats say why; SHM and TCP keep working.
    let src = Engine::from_json(r#"{"nvlink": true}"#).unwrap();
    let req = Engine::from_json(r#"{"nvlink": true}"#).unwrap();
    let why = &src.stats().transports_available["nvlink"];
    assert!(why.starts_with("not available") && why.contains(needle), "{why}");
    let a = allocate_shared_host(4096).unwrap();
    src.register_memory(a.addr(), 4096, Access::READ).unwrap();
    let mut local = vec![0u8; 4096];
    req.register_memory(local.as_mut_ptr() as u64, 4096, Access::NONE).unwrap();
    let peer = req.connect(&src.endpoint(), None).unwrap();
    let r = Request { op: Op::Read, local_addr: local.as_ptr() as u64, remote_addr: a.addr(), len: 4096 };
    let e = req
        .submit(peer, &[r], SubmitOptions { transport: Transport::Only(TransportKind::Nvlink), timeout: None })
        .err()
        .unwrap();
    assert_eq!(e.status(), Status::Unavailable, "{e}");
    let b = req.submit(peer, &[r], SubmitOptions::default()).unwrap();
    b.wait(std::time::Duration::from_secs(60)).unwrap();
    assert_eq!(req.stats().transports["shm"].requests_completed, 1);
    let json = retained_resources_json();
    assert!(json.contains("\"cuda_available\":false"), "{json}");
    req.close(None).unwrap();
    src.close(None).unwrap();
    a.free().unwrap();
    println!("child case passed");
}

#[test]
fn no_driver_on_the_loader_path() {
    run_child("absent", None);
}

#[test]
fn driver_present_without_a_device() {
    // CUDA_ERROR_NO_DEVICE = 100
    let dir = fake_driver("nodev", 100, None);
    run_child("no-device", Some(&dir));
}

#[test]
fn driver_missing_a_required_symbol() {
    let dir = fake_driver("nosym", 0, Some("cuIpcOpenMemHandle_v2"));
    run_child("missing-symbol", Some(&dir));
}

#[test]
fn driver_without_fabric_handles() {
    let extra = "int cuDriverGetVersion(int *v) { *v = 12000; return 0; }\n\
                 int cuDeviceGetCount(int *c) { *c = 1; return 0; }";
    let dir = fake_driver_with("nofabric", 0, None, extra);
    run_child("no-fabric", Some(&dir));
}

#[test]
fn qualification_script_reports_a_machine_without_cuda() {
    let root = env!("CARGO_MANIFEST_DIR");
    let script = format!("{root}/tests/hardware/qualify.py");
    let out_dir = std::env::temp_dir().join(format!("orbite-qualify-{}", std::process::id()));
    let args = [&script, "--binary", env!("CARGO_BIN_EXE_orbite-gpu-qual"), "--out", out_dir.to_str().unwrap()];
    let out = without_system_libcuda("python3", &args).env_remove("LD_LIBRARY_PATH").output().expect("python3");
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(String::from_utf8_lossy(&out.stdout).contains("no usable CUDA"));
}
