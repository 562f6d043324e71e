//! A build without the `etcd` feature: an engine configured with
//! discovery does not start, and says why.

use super::record::{DiscoveryConfig, DiscoveryStats, OnGone, Record};
use crate::error::{Error, Result};
use std::time::Instant;

/// No client can exist in this build.
pub enum Client {}

impl Client {
    /// Refuses: `NOT_SUPPORTED`, naming the feature.
    pub fn start(
        _cfg: DiscoveryConfig,
        _me: Record,
        _key: Option<crate::control::auth::AuthKey>,
        _deadline: Instant,
    ) -> Result<Client> {
        Err(Error::NotSupported(
            "config `discovery` needs a build with the `etcd` feature (cargo build --features etcd; CMake -DORBITE_ETCD=ON)"
                .into(),
        ))
    }

    pub fn resolve(&self, _name: &str, _deadline: Instant) -> Result<Option<Record>> {
        match *self {}
    }

    pub fn watch(&self, _name: &str, _epoch: u64, _on_gone: OnGone) {
        match *self {}
    }

    pub fn close(&self, _deadline: Instant) {
        match *self {}
    }

    pub fn stats(&self) -> DiscoveryStats {
        match *self {}
    }
}
