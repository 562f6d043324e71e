//! Discovery: engines find each other by name in etcd, and a dead engine
//! disappears by itself.
//!
//! While an engine lives it keeps `PREFIX/engines/NAME` (a JSON
//! [`Record`]: endpoint, epoch, capabilities, boot id, pid) under an etcd
//! lease it keeps alive; claiming the name is one transaction (the key must
//! not exist), so two live engines cannot hold one name. Closing revokes
//! the lease; a crashed (or frozen) engine's key goes when its lease
//! expires, and the engines connected to it hear of it through a watch.
//! The etcd client (gRPC) and its runtime live on one thread of their own
//! (`etcd.rs`, feature `etcd`); without the feature an engine configured
//! with discovery does not start (`NOT_SUPPORTED`).

#[cfg(feature = "etcd")]
mod etcd;
#[cfg(not(feature = "etcd"))]
mod unavailable;

#[cfg(feature = "etcd")]
use etcd::Client;
#[cfg(not(feature = "etcd"))]
use unavailable::Client;

mod record;

pub use record::{check_url, unreachable, DiscoveryConfig, DiscoveryStats, OnGone, Record};

use crate::control::auth::AuthKey;
use crate::error::Result;
use std::time::Instant;

/// A running discovery client.
pub struct Discovery {
    inner: Client,
}

impl Discovery {
    /// Connects to etcd and claims `me.name` under a lease, before
    /// `deadline`; with `key`, the record is signed with it and only
    /// records it signed are followed. `UNAVAILABLE`: etcd unreachable (the message names the
    /// addresses); `INVALID_CONFIG`: a live engine holds the name (named);
    /// `NOT_SUPPORTED`: a build without the `etcd` feature.
    pub fn start(cfg: &DiscoveryConfig, me: Record, key: Option<AuthKey>, deadline: Instant) -> Result<Discovery> {
        Ok(Discovery { inner: Client::start(cfg.clone(), me, key, deadline)? })
    }

    /// The live engine named `name`, if any.
    pub fn resolve(&self, name: &str, deadline: Instant) -> Result<Option<Record>> {
        self.inner.resolve(name, deadline)
    }

    /// Calls `on_gone` once when `name`'s key vanishes or names an epoch
    /// other than `epoch` (also when that happened while etcd was out of
    /// reach: checked again when it is back).
    pub fn watch(&self, name: &str, epoch: u64, on_gone: OnGone) {
        self.inner.watch(name, epoch, on_gone)
    }

    /// Revokes the lease (the name goes at once) and stops the client,
    /// waiting for etcd until `deadline` at most.
    pub fn close(&self, deadline: Instant) {
        self.inner.close(deadline)
    }

    /// Its counters.
    pub fn stats(&self) -> DiscoveryStats {
        self.inner.stats()
    }
}
