//! The transport vocabulary every layer shares: which transport carries a
//! request ([`TransportKind`]) and what a submission asks for ([`Transport`]).

/// A payload transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TransportKind {
    /// Bytes over the TCP control connection (works anywhere).
    Tcp,
    /// Shared host memory (memfd) between processes of one host.
    Shm,
    /// CUDA IPC between processes of one host.
    Nvlink,
    /// CUDA fabric handles across an NVLink fabric.
    Mnnvl,
    /// Cross-memory attach (`process_vm_readv`/`process_vm_writev`): any
    /// registered host memory of another process of this host and user.
    Cma,
}

impl TransportKind {
    /// Best-first default policy.
    pub const DEFAULT_POLICY: [TransportKind; 5] =
        [TransportKind::Mnnvl, TransportKind::Nvlink, TransportKind::Shm, TransportKind::Cma, TransportKind::Tcp];

    /// Every transport, in stats order.
    pub const ALL: [TransportKind; 5] =
        [TransportKind::Tcp, TransportKind::Shm, TransportKind::Nvlink, TransportKind::Mnnvl, TransportKind::Cma];

    /// The name used in config and stats.
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::Tcp => "tcp",
            TransportKind::Shm => "shm",
            TransportKind::Nvlink => "nvlink",
            TransportKind::Mnnvl => "mnnvl",
            TransportKind::Cma => "cma",
        }
    }

    /// Parses a config/policy name.
    pub fn from_name(s: &str) -> Option<TransportKind> {
        match s {
            "tcp" => Some(TransportKind::Tcp),
            "shm" => Some(TransportKind::Shm),
            "nvlink" => Some(TransportKind::Nvlink),
            "mnnvl" => Some(TransportKind::Mnnvl),
            "cma" => Some(TransportKind::Cma),
            _ => None,
        }
    }

    /// The C constant (`ORBITE_TRANSPORT_TCP` = 1 .. `ORBITE_TRANSPORT_CMA`
    /// = 5; 0 is `ORBITE_TRANSPORT_AUTO`).
    pub const fn c_code(self) -> u32 {
        self as u32 + 1
    }

    /// The transport of a C constant (`None` for AUTO and unknown values).
    pub fn from_c_code(code: u32) -> Option<TransportKind> {
        TransportKind::ALL.iter().copied().find(|k| k.c_code() == code)
    }

    /// The bit of this transport in a C capability mask (`1u << c_code`).
    pub fn c_mask_bit(self) -> u32 {
        1 << self.c_code()
    }

    /// Capability bit advertised in Describe.
    pub fn capability_bit(self) -> u32 {
        1 << (self as u32)
    }

    /// Index into per-transport stat arrays.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// The transport a submission asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transport {
    /// Let `transport_policy` choose.
    #[default]
    Auto,
    /// A specific transport.
    Only(TransportKind),
}
