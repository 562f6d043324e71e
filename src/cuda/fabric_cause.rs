//! Why MNNVL cannot be used: the layer that is broken, named the same way
//! in the stats, the log, a forced MNNVL request's error and the doctor's
//! lines, each with what an operator does about it.

/// The broken layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// No CUDA driver (or no CUDA support in this build).
    NoDriver,
    /// The GPU or driver has no fabric handles (a single GPU without an
    /// NVLink fabric, a driver older than API 12030).
    FabricNotSupported,
    /// No IMEX channel file exists for this process to use.
    NoImexChannel,
    /// An IMEX channel exists but this process may not open it (another
    /// user owns it).
    ImexChannelDenied,
    /// The importer and the exporter do not share an IMEX channel (or the
    /// IMEX daemons refuse them as one domain).
    ChannelNotShared,
    /// The two GPUs are in different NVLink cliques or clusters.
    DifferentClique,
    /// A GPU's fabric registration is not complete, or the IMEX daemon
    /// does not serve both nodes.
    DaemonNotReady,
    /// The memory was not created with fabric handles.
    AllocationNotFabric,
    /// The driver refused for a reason none of the above explains.
    DriverError,
}

impl Cause {
    /// Every cause.
    pub const ALL: [Cause; 9] = [
        Cause::NoDriver,
        Cause::FabricNotSupported,
        Cause::NoImexChannel,
        Cause::ImexChannelDenied,
        Cause::ChannelNotShared,
        Cause::DifferentClique,
        Cause::DaemonNotReady,
        Cause::AllocationNotFabric,
        Cause::DriverError,
    ];

    /// The name used in stats, logs and errors.
    pub fn name(self) -> &'static str {
        match self {
            Cause::NoDriver => "no_driver",
            Cause::FabricNotSupported => "fabric_not_supported",
            Cause::NoImexChannel => "no_imex_channel",
            Cause::ImexChannelDenied => "imex_channel_denied",
            Cause::ChannelNotShared => "channel_not_shared",
            Cause::DifferentClique => "different_clique",
            Cause::DaemonNotReady => "daemon_not_ready",
            Cause::AllocationNotFabric => "allocation_not_fabric",
            Cause::DriverError => "driver_error",
        }
    }

    /// What to do about it.
    pub fn remedy(self) -> &'static str {
        match self {
            Cause::NoDriver => "install the NVIDIA driver (libcuda.so.1) on a machine with a GPU",
            Cause::FabricNotSupported => {
                "fabric handles need GPUs of one NVLink fabric (GB200/GB300 NVL72) and a driver with API 12030+; \
                 for peers on this host set mnnvl.handle_type \"posix_fd\""
            }
            Cause::NoImexChannel => {
                "create an IMEX channel (it does not survive a reboot): \
                 sudo mknod -m 666 /dev/nvidia-caps-imex-channels/channel0 c <major of nvidia-caps-imex-channels \
                 in /proc/devices> 0 (in Kubernetes, request one through the DRA driver's ComputeDomain)"
            }
            Cause::ImexChannelDenied => {
                "give this process's user read-write access to the channel (chmod/chown it, or create one for \
                 this user) or run as the channel's owner"
            }
            Cause::ChannelNotShared => {
                "run both processes with access to the same /dev/nvidia-caps-imex-channels/channelN, and check \
                 that the IMEX daemons of both nodes form one domain (nvidia-imex-ctl -N)"
            }
            Cause::DifferentClique => {
                "MNNVL reaches only GPUs of one NVLink clique: place the two engines in one NVL72 partition, or \
                 let them use the next transport"
            }
            Cause::DaemonNotReady => {
                "wait for the GPU's fabric registration (nvidia-smi -q | grep -A3 Fabric) and check the fabric \
                 manager and IMEX daemon (systemctl status nvidia-fabricmanager nvidia-imex; nvidia-imex-ctl -N)"
            }
            Cause::AllocationNotFabric => {
                "allocate the memory with orbite_allocate_mnnvl, or create it with CU_MEM_HANDLE_TYPE_FABRIC in \
                 its requested handle types"
            }
            Cause::DriverError => "run orbite-doctor --transport mnnvl on both hosts to find the layer",
        }
    }
}

/// The CUDA driver's results a fabric allocation, export or import may
/// give (`CUresult` values).
pub mod cu {
    /// CUDA_ERROR_INVALID_HANDLE ("invalid resource handle").
    pub const INVALID_HANDLE: i32 = 400;
    /// CUDA_ERROR_NOT_PERMITTED ("operation not permitted").
    pub const NOT_PERMITTED: i32 = 800;
    /// CUDA_ERROR_NOT_SUPPORTED.
    pub const NOT_SUPPORTED: i32 = 801;
}

/// The cause of a failed local fabric allocation or export (driver result
/// `code`), given whether any IMEX channel file exists and whether this
/// process may use one.
pub fn of_local_refusal(code: i32, any_channel: bool, usable_channel: bool) -> Cause {
    match code {
        cu::NOT_SUPPORTED => Cause::FabricNotSupported,
        cu::NOT_PERMITTED if any_channel && !usable_channel => Cause::ImexChannelDenied,
        cu::NOT_PERMITTED => Cause::NoImexChannel,
        _ => Cause::DriverError,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_refusal_names_its_layer() {
        assert_eq!(of_local_refusal(cu::NOT_PERMITTED, false, false), Cause::NoImexChannel);
        assert_eq!(of_local_refusal(cu::NOT_PERMITTED, true, false), Cause::ImexChannelDenied);
        assert_eq!(of_local_refusal(cu::NOT_SUPPORTED, true, true), Cause::FabricNotSupported);
        assert_eq!(of_local_refusal(2, true, true), Cause::DriverError);
        assert_eq!(Cause::DifferentClique.name(), "different_clique");
    }
}
