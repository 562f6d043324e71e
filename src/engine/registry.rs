//! The process-wide list of live engines, and the report of what each one
//! retains after unconfirmed cleanups (`orbite_cuda_retained_resources_json`).

use parking_lot::Mutex;
use std::sync::Weak;

/// What the process-wide report asks of a live engine.
pub(crate) trait Reporting: Send + Sync {
    /// Its endpoint and what it retains, per IPC transport; `None` once closed.
    fn retained(&self) -> Option<(String, serde_json::Value)>;
}

/// Every engine of the process, for process-wide reports.
static ENGINES: Mutex<Vec<Weak<dyn Reporting>>> = Mutex::new(Vec::new());

/// Adds a started engine to the list (pruning engines that are gone).
pub(crate) fn add(engine: Weak<dyn Reporting>) {
    let mut all = ENGINES.lock();
    all.retain(|w| w.strong_count() > 0);
    all.push(engine);
}

/// What every live engine of this process retains after unconfirmed
/// cleanups (exports without a close receipt, imports whose close was not
/// confirmed, quarantined CUDA streams), by engine endpoint.
pub fn retained_resources_all() -> serde_json::Value {
    let engines: Vec<_> = {
        let mut v = ENGINES.lock();
        v.retain(|w| w.strong_count() > 0);
        v.iter().filter_map(|w| w.upgrade()).collect()
    };
    serde_json::Value::Object(engines.iter().filter_map(|e| e.retained()).collect())
}

/// The CUDA driver as probed and, under `engines`, what every live engine
/// of the process retains, as JSON text.
pub fn retained_resources_json() -> String {
    let mut v = crate::cuda::driver_json();
    v["engines"] = retained_resources_all();
    v.to_string()
}
