//! Memory: registered regions (bounds, access, epoch), the allocations the
//! library owns (shared host memory here, CUDA memory through `cuda`), the
//! holds exports take of them and the fences local GPU groups put on pinned
//! memory, and leases that keep a region alive while a copy uses it.

pub mod cuda;
pub mod memfd;
pub mod owners;
pub mod rank;
pub mod region;

pub use owners::{Allocation, MemoryKind};
pub use region::{Access, Region, RegionLease, RegionTable};
