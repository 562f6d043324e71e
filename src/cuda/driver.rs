//! The CUDA driver, loaded at run time through cudarc. cudarc panics when
//! libcuda or a symbol is missing, so nothing here calls a driver function
//! before `is_culib_present()` and a symbol probe have both said yes.

use crate::error::{Error, Result};
use cudarc::driver::sys;
use once_cell::sync::OnceCell;
use parking_lot::Mutex;
use std::collections::HashMap;

/// What the probe found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Driver {
    /// `cuDriverGetVersion` (e.g. 13000).
    pub version: i32,
    /// Visible devices.
    pub devices: i32,
    /// `cuMemcpyBatchAsync_v2` is present (driver API 13000+).
    pub batch_v2: bool,
    /// Fabric-handle VMM symbols are present (driver API 12030+).
    pub fabric_symbols: bool,
}

/// Symbols the NVLink transport calls; all must exist.
pub const REQUIRED: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDevicePrimaryCtxRetain",
    "cuCtxSetCurrent",
    "cuCtxGetCurrent",
    "cuCtxSynchronize",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemsetD8_v2",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuIpcGetMemHandle",
    "cuIpcOpenMemHandle_v2",
    "cuIpcCloseMemHandle",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamWaitEvent",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuMemcpyAsync",
    "cuMemcpy",
];

/// Symbols MNNVL needs (probed only when MNNVL is requested).
pub const FABRIC: &[&str] = &[
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemSetAccess",
    "cuMemGetAllocationGranularity",
    "cuMemExportToShareableHandle",
    "cuMemImportFromShareableHandle",
    "cuMemGetAllocationPropertiesFromHandle",
    "cuMemGetAddressRange_v2",
    "cuDeviceGetAttribute",
    "cuDeviceCanAccessPeer",
    "cuMemsetD8Async",
];

static DRIVER: OnceCell<std::result::Result<Driver, Error>> = OnceCell::new();

/// Whether libcuda exports `name` (only after the library is known present).
pub fn has_symbol(name: &str) -> bool {
    // SAFETY: only called after `is_culib_present()` returned true, so
    // `culib()` finds the library instead of panicking; `get` only looks the
    // symbol up.
    unsafe { sys::culib().get::<*const ()>(name.as_bytes()).is_ok() }
}

/// Maps a driver result to our error, recording a sticky one (see
/// [`usable`]).
pub fn check(r: sys::CUresult, what: &str) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let text = format!("{what} failed: {r:?} ({})", r as i32);
    if is_sticky(r as i32) {
        let _ = STICKY.set(text.clone());
    }
    Err(Error::Cuda(text))
}

/// Whether a driver result is one of the errors after which, in the
/// runtime reference's words for `cudaErrorIllegalAddress` (and likewise
/// 714-719: hardware stack error, illegal instruction, misaligned address,
/// invalid address space, invalid PC, launch failure), "the process is
/// left in an inconsistent state and any further CUDA work will return the
/// same error. To continue using CUDA, the process must be terminated and
/// relaunched."
pub fn is_sticky(code: i32) -> bool {
    code == 700 || (714..=719).contains(&code)
}

/// The first sticky error this process saw, in words.
static STICKY: OnceCell<String> = OnceCell::new();

/// `Ok` while this process may still do CUDA work; after a sticky error
/// (every context of the process is lost with it, not only the one it
/// hit) `Unavailable`, naming that error and the restart it takes. The
/// CUDA transports ask it before each group and each export, so that
/// later work is refused at once, before anything is posted, and AUTO
/// moves it to TCP.
pub fn usable() -> Result<()> {
    match STICKY.get() {
        None => Ok(()),
        Some(first) => Err(Error::Unavailable(format!(
            "this process's CUDA hit a sticky error ({first}); the driver does no further CUDA work in it: restart the process to use the GPU again"
        ))),
    }
}

fn probe() -> Result<Driver> {
    // SAFETY: is_culib_present only tries to dlopen candidate names.
    if !unsafe { sys::is_culib_present() } {
        return Err(Error::Unavailable("no CUDA driver: libcuda.so was not found on the loader path".into()));
    }
    if let Some(missing) = REQUIRED.iter().find(|s| !has_symbol(s)) {
        return Err(Error::NotSupported(format!("the CUDA driver does not export {missing}")));
    }
    // SAFETY: symbol present (probed above); cuInit takes flags 0.
    let r = unsafe { sys::cuInit(0) };
    match r {
        sys::CUresult::CUDA_SUCCESS => {}
        sys::CUresult::CUDA_ERROR_NO_DEVICE => {
            return Err(Error::Unavailable("a CUDA driver is present but reports no device".into()))
        }
        sys::CUresult::CUDA_ERROR_STUB_LIBRARY => {
            return Err(Error::Unavailable(
                "the libcuda.so found first on the loader path is the toolkit's stub; put the real driver first".into(),
            ))
        }
        other => return Err(Error::Cuda(format!("cuInit failed: {other:?} ({})", other as i32))),
    }
    let mut version = 0;
    // SAFETY: symbol present; writes one int.
    check(unsafe { sys::cuDriverGetVersion(&mut version) }, "cuDriverGetVersion")?;
    let mut devices = 0;
    // SAFETY: symbol present; writes one int.
    check(unsafe { sys::cuDeviceGetCount(&mut devices) }, "cuDeviceGetCount")?;
    if devices <= 0 {
        return Err(Error::Unavailable("a CUDA driver is present but reports no device".into()));
    }
    Ok(Driver {
        version,
        devices,
        batch_v2: version >= 13000 && has_symbol("cuMemcpyBatchAsync_v2"),
        fabric_symbols: version >= 12030 && FABRIC.iter().all(|s| has_symbol(s)),
    })
}

/// The driver, probed once per process.
pub fn driver() -> Result<&'static Driver> {
    DRIVER.get_or_init(probe).as_ref().map_err(|e| e.clone())
}

/// Whether GPU `dev` can reach memory resident on GPU `peer` (ordinals;
/// `cuDeviceCanAccessPeer`; a device reaches its own memory).
pub fn can_access_peer(dev: i32, peer: i32) -> Result<bool> {
    if dev == peer {
        return Ok(true);
    }
    driver()?;
    let handle = |o: i32| -> Result<sys::CUdevice> {
        let mut d = 0;
        // SAFETY: the driver is loaded; writes one device handle.
        check(unsafe { sys::cuDeviceGet(&mut d, o) }, "cuDeviceGet")?;
        Ok(d)
    };
    let (d, p) = (handle(dev)?, handle(peer)?);
    let mut can = 0;
    // SAFETY: writes one int.
    check(unsafe { sys::cuDeviceCanAccessPeer(&mut can, d, p) }, "cuDeviceCanAccessPeer")?;
    Ok(can != 0)
}

/// A device ordinal that exists.
pub fn check_device(device: i32) -> Result<()> {
    let d = driver()?;
    if device < 0 || device >= d.devices {
        return Err(Error::InvalidArgument(format!("CUDA device {device} does not exist ({} visible)", d.devices)));
    }
    Ok(())
}

static PRIMARY: Mutex<Option<HashMap<i32, usize>>> = Mutex::new(None);

/// An opaque CUDA context handle (`CUcontext` as an integer).
pub type Ctx = usize;

/// The primary context of `device` (retained once, for the process).
pub fn primary_context(device: i32) -> Result<Ctx> {
    check_device(device)?;
    let mut m = PRIMARY.lock();
    let map = m.get_or_insert_with(HashMap::new);
    if let Some(c) = map.get(&device) {
        return Ok(*c);
    }
    let mut dev = 0;
    // SAFETY: driver probed; writes one CUdevice.
    check(unsafe { sys::cuDeviceGet(&mut dev, device) }, "cuDeviceGet")?;
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: driver probed; writes one context handle.
    check(unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) }, "cuDevicePrimaryCtxRetain")?;
    map.insert(device, ctx as usize);
    Ok(ctx as usize)
}

/// Binds a context on this thread and restores the previous one on drop.
pub struct ContextGuard {
    prev: sys::CUcontext,
    restored: bool,
}

impl ContextGuard {
    /// Binds `ctx`.
    pub fn bind(ctx: Ctx) -> Result<ContextGuard> {
        let mut prev: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: driver probed by whoever produced `ctx`.
        check(unsafe { sys::cuCtxGetCurrent(&mut prev) }, "cuCtxGetCurrent")?;
        // SAFETY: as above.
        check(unsafe { sys::cuCtxSetCurrent(ctx as sys::CUcontext) }, "cuCtxSetCurrent")?;
        Ok(ContextGuard { prev, restored: false })
    }

    /// Restores the previous context, reporting failure (a failed
    /// restoration makes the work's outcome uncertain).
    pub fn restore(mut self) -> Result<()> {
        self.restored = true;
        // SAFETY: restoring the context that was current before `bind`.
        check(unsafe { sys::cuCtxSetCurrent(self.prev) }, "restoring the caller's CUDA context")
    }
}

impl Drop for ContextGuard {
    fn drop(&mut self) {
        if !self.restored {
            // SAFETY: as in `restore`; errors cannot be reported from drop.
            let _ = unsafe { sys::cuCtxSetCurrent(self.prev) };
        }
    }
}

static UUIDS: OnceCell<Vec<Option<[u8; 16]>>> = OnceCell::new();

/// The UUID of every visible device (`cuDeviceGetUuid_v2`), by ordinal; `None`
/// where the driver cannot say. Ordinals differ between processes (each
/// may see its own `CUDA_VISIBLE_DEVICES`); UUIDs do not.
fn uuids() -> &'static [Option<[u8; 16]>] {
    UUIDS.get_or_init(|| {
        let Ok(d) = driver() else { return Vec::new() };
        if !has_symbol("cuDeviceGetUuid_v2") {
            return vec![None; d.devices as usize];
        }
        (0..d.devices)
            .map(|i| {
                let mut dev = 0;
                // SAFETY: the driver was probed; writes one CUdevice.
                if unsafe { sys::cuDeviceGet(&mut dev, i) } != sys::CUresult::CUDA_SUCCESS {
                    return None;
                }
                // SAFETY: all-zero is a valid CUuuid to be written.
                let mut u: sys::CUuuid = unsafe { std::mem::zeroed() };
                // SAFETY: symbol probed above; writes 16 bytes.
                let r = unsafe { sys::cuDeviceGetUuid_v2(&mut u, dev) };
                (r == sys::CUresult::CUDA_SUCCESS).then(|| u.bytes.map(|b| b as u8))
            })
            .collect()
    })
}

/// The UUID of visible device `device`, when the driver reports one.
pub fn device_uuid(device: i32) -> Option<[u8; 16]> {
    uuids().get(usize::try_from(device).ok()?).copied().flatten()
}

/// The ordinal under which this process sees the device with `uuid`.
pub fn device_with_uuid(uuid: &[u8; 16]) -> Option<i32> {
    if *uuid == [0; 16] {
        return None;
    }
    uuids().iter().position(|u| u.as_ref() == Some(uuid)).map(|i| i as i32)
}

/// The name the driver gives visible device `device` (`cuDeviceGetName`,
/// when the driver exports it).
pub fn device_name(device: i32) -> Option<String> {
    check_device(device).ok()?;
    if !has_symbol("cuDeviceGetName") {
        return None;
    }
    let mut d = 0;
    // SAFETY: the driver was probed; writes one device handle.
    check(unsafe { sys::cuDeviceGet(&mut d, device) }, "cuDeviceGet").ok()?;
    let mut name = [0 as std::ffi::c_char; 256];
    // SAFETY: symbol probed; writes at most name.len() bytes, NUL-terminated.
    check(unsafe { sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, d) }, "cuDeviceGetName").ok()?;
    // SAFETY: the driver NUL-terminated it within the buffer.
    Some(unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }.to_string_lossy().into_owned())
}
