//! NVML (`libnvidia-ml.so.1`), loaded at run time for one question: each
//! GPU's NVLink fabric information (`nvmlDeviceGetGpuFabricInfoV`: its
//! registration state and status, cluster UUID and clique), from which
//! `fabric_domain: "auto"` derives an engine's fabric domain, as NCCL does.
//! A few declarations of our own, each with NVML's exact signature; a
//! missing library or symbol is a typed answer, never a crash. The
//! library stays loaded and initialised for the life of the process.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

/// `nvmlReturn_t`.
type NvmlReturn = c_int;
/// `nvmlDevice_t` (opaque).
type NvmlDevice = *mut c_void;

/// NVML_SUCCESS.
const SUCCESS: NvmlReturn = 0;

/// `nvmlGpuFabricInfo_v2_t` (the layout of NVML's header: the cluster
/// UUID at 4, status at 20, clique at 24, state at 28, health mask at 32).
#[repr(C)]
struct FabricInfoV2 {
    version: c_uint,
    cluster_uuid: [u8; 16],
    status: NvmlReturn,
    clique_id: c_uint,
    state: u8,
    health_mask: c_uint,
}

const _: () = assert!(std::mem::size_of::<FabricInfoV2>() == 36);
const _: () = assert!(std::mem::offset_of!(FabricInfoV2, state) == 28);

/// `nvmlGpuFabricInfo_v2`: `NVML_STRUCT_VERSION(GpuFabricInfo, 2)`, the
/// structure's size with the version in the top byte (0x02000024).
const FABRIC_INFO_V2: c_uint = std::mem::size_of::<FabricInfoV2>() as c_uint | (2 << 24);

/// Where a GPU stands in its registration with the NVLink fabric
/// (`NVML_GPU_FABRIC_STATE_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FabricState {
    /// The GPU has no NVLink fabric (a single GPU, a node without
    /// NVSwitch trays): fabric handles cannot leave it.
    NotSupported,
    /// Registration has not started.
    NotStarted,
    /// Registration is under way.
    InProgress,
    /// Registered: the cluster and clique are valid (if the status is
    /// success).
    Completed,
    /// A value this build does not know.
    Other(u8),
}

impl FabricState {
    fn from_raw(v: u8) -> FabricState {
        match v {
            0 => FabricState::NotSupported,
            1 => FabricState::NotStarted,
            2 => FabricState::InProgress,
            3 => FabricState::Completed,
            o => FabricState::Other(o),
        }
    }

    /// Its wire value (`NVML_GPU_FABRIC_STATE_*`).
    pub fn raw(self) -> u8 {
        match self {
            FabricState::NotSupported => 0,
            FabricState::NotStarted => 1,
            FabricState::InProgress => 2,
            FabricState::Completed => 3,
            FabricState::Other(o) => o,
        }
    }

    /// Its name in words.
    pub fn name(self) -> String {
        match self {
            FabricState::NotSupported => "not supported".into(),
            FabricState::NotStarted => "not started".into(),
            FabricState::InProgress => "in progress".into(),
            FabricState::Completed => "completed".into(),
            FabricState::Other(o) => format!("unknown ({o})"),
        }
    }
}

/// One GPU's fabric information, as NVML reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FabricInfo {
    /// The NVLink cluster's UUID.
    pub cluster_uuid: [u8; 16],
    /// The clique (NVLink partition) within the cluster.
    pub clique_id: u32,
    /// The registration state.
    pub state: FabricState,
    /// The registration's status (`nvmlReturn_t`; meaningful once completed).
    pub status: i32,
    /// The status in NVML's words (`nvmlErrorString`).
    pub status_text: String,
}

impl FabricInfo {
    /// Registered with success: the cluster and clique can be trusted.
    pub fn ready(&self) -> bool {
        self.state == FabricState::Completed && self.status == SUCCESS
    }
}

type InitFn = unsafe extern "C" fn() -> NvmlReturn;
type ErrorStringFn = unsafe extern "C" fn(NvmlReturn) -> *const c_char;
type DriverVersionFn = unsafe extern "C" fn(*mut c_char, c_uint) -> NvmlReturn;
type CountFn = unsafe extern "C" fn(*mut c_uint) -> NvmlReturn;
type ByIndexFn = unsafe extern "C" fn(c_uint, *mut NvmlDevice) -> NvmlReturn;
type ByUuidFn = unsafe extern "C" fn(*const c_char, *mut NvmlDevice) -> NvmlReturn;
type FabricInfoFn = unsafe extern "C" fn(NvmlDevice, *mut FabricInfoV2) -> NvmlReturn;

/// NVML, loaded and initialised.
pub struct Nvml {
    error_string: ErrorStringFn,
    driver_version: Option<DriverVersionFn>,
    count: CountFn,
    by_index: ByIndexFn,
    by_uuid: ByUuidFn,
    fabric_info: FabricInfoFn,
}

/// The library's name on the loader path.
pub const LIBRARY: &str = "libnvidia-ml.so.1";

static NVML: OnceLock<Result<Nvml, String>> = OnceLock::new();

/// NVML, loaded and initialised once per process, or why not (no library,
/// a missing symbol, `nvmlInit_v2` refused).
pub fn nvml() -> Result<&'static Nvml, String> {
    NVML.get_or_init(load).as_ref().map_err(|e| e.clone())
}

fn load() -> Result<Nvml, String> {
    let name = std::ffi::CString::new(LIBRARY).expect("no NUL");
    // SAFETY: dlopen with a NUL-terminated name; the handle is never closed,
    // so the symbols below stay valid for the life of the process.
    let lib = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if lib.is_null() {
        return Err(format!("NVML ({LIBRARY}) was not found on the loader path"));
    }
    let sym = |s: &str| -> Result<*mut c_void, String> {
        let c = std::ffi::CString::new(s).expect("no NUL");
        // SAFETY: a live handle and a NUL-terminated symbol name.
        let p = unsafe { libc::dlsym(lib, c.as_ptr()) };
        if p.is_null() {
            Err(format!("{LIBRARY} does not export {s} (an NVIDIA driver older than the fabric information API)"))
        } else {
            Ok(p)
        }
    };
    // SAFETY (each transmute below): the symbol is NVML's function of that
    // name, whose C signature the target type spells exactly.
    let init: InitFn = unsafe { std::mem::transmute::<*mut c_void, InitFn>(sym("nvmlInit_v2")?) };
    let nvml = Nvml {
        // SAFETY: as above.
        error_string: unsafe { std::mem::transmute::<*mut c_void, ErrorStringFn>(sym("nvmlErrorString")?) },
        driver_version: sym("nvmlSystemGetDriverVersion")
            .ok()
            // SAFETY: as above.
            .map(|p| unsafe { std::mem::transmute::<*mut c_void, DriverVersionFn>(p) }),
        // SAFETY: as above.
        count: unsafe { std::mem::transmute::<*mut c_void, CountFn>(sym("nvmlDeviceGetCount_v2")?) },
        // SAFETY: as above.
        by_index: unsafe { std::mem::transmute::<*mut c_void, ByIndexFn>(sym("nvmlDeviceGetHandleByIndex_v2")?) },
        // SAFETY: as above.
        by_uuid: unsafe { std::mem::transmute::<*mut c_void, ByUuidFn>(sym("nvmlDeviceGetHandleByUUID")?) },
        // SAFETY: as above.
        fabric_info: unsafe { std::mem::transmute::<*mut c_void, FabricInfoFn>(sym("nvmlDeviceGetGpuFabricInfoV")?) },
    };
    // SAFETY: nvmlInit_v2 takes no arguments.
    let r = unsafe { init() };
    if r != SUCCESS {
        return Err(format!("nvmlInit_v2 failed: {} ({r})", nvml.text(r)));
    }
    Ok(nvml)
}

/// NVML's form of a CUDA device UUID: `GPU-` and the 16 bytes in 8-4-4-4-12
/// hexadecimal groups.
pub fn uuid_string(u: &[u8; 16]) -> String {
    let h: Vec<String> = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        h[..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..].concat()
    )
}

impl Nvml {
    /// `nvmlErrorString` of `r`.
    pub fn text(&self, r: i32) -> String {
        // SAFETY: NVML returns a static NUL-terminated string (or NULL).
        let p = unsafe { (self.error_string)(r) };
        if p.is_null() {
            return format!("NVML error {r}");
        }
        // SAFETY: non-NULL and NUL-terminated, owned by NVML.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// The kernel driver's version (`nvmlSystemGetDriverVersion`).
    pub fn driver_version(&self) -> Option<String> {
        let f = self.driver_version?;
        let mut buf = [0 as c_char; 96];
        // SAFETY: a writable buffer of the length passed.
        let r = unsafe { f(buf.as_mut_ptr(), buf.len() as c_uint) };
        // SAFETY: NVML NUL-terminates on success; the buffer was zeroed.
        (r == SUCCESS).then(|| unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned())
    }

    /// GPUs NVML sees (every GPU of the host, whatever the process's
    /// `CUDA_VISIBLE_DEVICES`).
    pub fn device_count(&self) -> Result<u32, String> {
        let mut n: c_uint = 0;
        // SAFETY: writes one unsigned int.
        let r = unsafe { (self.count)(&mut n) };
        self.ok(r, "nvmlDeviceGetCount_v2").map(|_| n)
    }

    fn ok(&self, r: NvmlReturn, what: &str) -> Result<(), String> {
        if r == SUCCESS {
            Ok(())
        } else {
            Err(format!("{what} failed: {} ({r})", self.text(r)))
        }
    }

    fn fabric(&self, d: NvmlDevice) -> Result<FabricInfo, String> {
        let mut info = FabricInfoV2 {
            version: FABRIC_INFO_V2,
            cluster_uuid: [0; 16],
            status: 0,
            clique_id: 0,
            state: 0,
            health_mask: 0,
        };
        // SAFETY: `d` is a handle NVML gave; the structure is the v2 layout
        // its version field announces.
        let r = unsafe { (self.fabric_info)(d, &mut info) };
        self.ok(r, "nvmlDeviceGetGpuFabricInfoV")?;
        Ok(FabricInfo {
            cluster_uuid: info.cluster_uuid,
            clique_id: info.clique_id,
            state: FabricState::from_raw(info.state),
            status: info.status,
            status_text: self.text(info.status),
        })
    }

    /// The fabric information of the GPU whose CUDA UUID is `uuid` (CUDA
    /// ordinals and NVML indices differ: the UUID names the same GPU in both).
    pub fn fabric_by_uuid(&self, uuid: &[u8; 16]) -> Result<FabricInfo, String> {
        let s = std::ffi::CString::new(uuid_string(uuid)).expect("hex has no NUL");
        let mut d: NvmlDevice = std::ptr::null_mut();
        // SAFETY: a NUL-terminated UUID string; writes one handle.
        let r = unsafe { (self.by_uuid)(s.as_ptr(), &mut d) };
        self.ok(r, &format!("nvmlDeviceGetHandleByUUID({})", uuid_string(uuid)))?;
        self.fabric(d)
    }

    /// The fabric information of NVML's GPU `index`.
    pub fn fabric_by_index(&self, index: u32) -> Result<FabricInfo, String> {
        let mut d: NvmlDevice = std::ptr::null_mut();
        // SAFETY: writes one handle.
        let r = unsafe { (self.by_index)(index, &mut d) };
        self.ok(r, &format!("nvmlDeviceGetHandleByIndex_v2({index})"))?;
        self.fabric(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fabric_structure_and_uuid_forms_are_nvmls() {
        assert_eq!(FABRIC_INFO_V2, 0x0200_0024);
        assert_eq!(std::mem::offset_of!(FabricInfoV2, cluster_uuid), 4);
        assert_eq!(std::mem::offset_of!(FabricInfoV2, status), 20);
        assert_eq!(std::mem::offset_of!(FabricInfoV2, clique_id), 24);
        assert_eq!(std::mem::offset_of!(FabricInfoV2, health_mask), 32);
        let u: [u8; 16] = std::array::from_fn(|i| i as u8 * 17);
        assert_eq!(uuid_string(&u), "GPU-00112233-4455-6677-8899-aabbccddeeff");
    }
}
