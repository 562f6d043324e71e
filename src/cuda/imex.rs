//! IMEX channels: the device files (`/dev/nvidia-caps-imex-channels/channelN`)
//! through which the driver lets a process create, export and import
//! fabric-handle memory. They are not created by default and do not
//! survive a reboot; a process needs at least one it may open, and an
//! exporter and its importer must share one (the driver's per-user
//! isolation). Without one the driver refuses with an insufficient
//! permission error that names none of this: these are the facts that
//! explain it.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Where the driver's IMEX channel device files live.
pub const CHANNEL_DIR: &str = "/dev/nvidia-caps-imex-channels";

/// One channel file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Channel {
    /// N of `channelN`.
    pub number: u32,
    /// Its path.
    pub path: PathBuf,
    /// A character device (what the driver creates; anything else is not
    /// a channel the driver will use).
    pub char_device: bool,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Permission bits.
    pub mode: u32,
    /// Whether this process may open it read-write (the kernel's answer).
    pub usable: bool,
}

impl Channel {
    /// `channel0 (char device, uid 0 gid 0, mode 0666, usable)`.
    pub fn describe(&self) -> String {
        format!(
            "channel{} ({}, uid {} gid {}, mode {:04o}, {})",
            self.number,
            if self.char_device { "char device" } else { "not a char device" },
            self.uid,
            self.gid,
            self.mode & 0o7777,
            if self.usable { "usable by this process" } else { "this process may not open it" }
        )
    }
}

/// The channel files of `dir`, by number; `Err` when the directory cannot
/// be read (absent: no channel was ever created since boot).
pub fn channels(dir: &Path) -> Result<Vec<Channel>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut out = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(n) = name.to_str().and_then(|s| s.strip_prefix("channel")).and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let path = e.path();
        let Ok(meta) = std::fs::metadata(&path) else { continue };
        let usable = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
            // SAFETY: a NUL-terminated path; faccessat only asks the kernel.
            .map(|c| unsafe { libc::faccessat(libc::AT_FDCWD, c.as_ptr(), libc::R_OK | libc::W_OK, libc::AT_EACCESS) } == 0)
            .unwrap_or(false);
        out.push(Channel {
            number: n,
            path,
            char_device: meta.file_type().is_char_device(),
            uid: meta.uid(),
            gid: meta.gid(),
            mode: meta.mode(),
            usable,
        });
    }
    out.sort_by_key(|c| c.number);
    Ok(out)
}

/// The channel this process would use: the lowest-numbered one it may
/// open (`None`: none).
pub fn usable_channel(dir: &Path) -> Option<u32> {
    channels(dir).ok()?.iter().find(|c| c.usable).map(|c| c.number)
}

/// The major number the driver registered for IMEX channels
/// (`nvidia-caps-imex-channels` in `/proc/devices`), needed to create one.
pub fn registered_major() -> Option<u32> {
    let text = std::fs::read_to_string("/proc/devices").ok()?;
    text.lines().find_map(|l| {
        let mut w = l.split_whitespace();
        let major = w.next()?.parse().ok()?;
        (w.next()? == "nvidia-caps-imex-channels").then_some(major)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn channels_are_listed_by_number_with_their_owner_and_mode() {
        let dir = std::env::temp_dir().join(format!("orbite-imex-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (n, mode) in [(3u32, 0o600), (1, 0o666)] {
            let p = dir.join(format!("channel{n}"));
            std::fs::write(&p, b"").unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        std::fs::write(dir.join("README"), b"").unwrap();
        let c = channels(&dir).unwrap();
        assert_eq!(c.iter().map(|c| c.number).collect::<Vec<_>>(), vec![1, 3]);
        assert_eq!(c[0].mode & 0o777, 0o666);
        assert!(!c[0].char_device);
        assert_eq!(usable_channel(&dir), Some(1));
        assert!(c[1].describe().starts_with("channel3 (not a char device, uid "), "{}", c[1].describe());
        assert!(channels(&dir.join("absent")).unwrap_err().contains("absent"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
