//! Pulls never fill the node's image filesystem (upstream #1995): before it pulls, the daemon
//! asks the runtime where its images live (`ImageFsInfo`) and how full that filesystem is
//! (`statvfs`), and refuses the pull at or above a limit, by default the kubelet's image GC high
//! threshold (85%), so a pre-download never pushes the kubelet into collecting the images its
//! pods are about to need.
//!
//! Usage is the kubelet's: `100 − available × 100 / capacity`, with the blocks an unprivileged
//! user may take as available (the kubelet's `usagePercent` from cAdvisor's numbers).
//!
//! The runtime names its image filesystem by its path on the host. The chart mounts that path
//! (`daemon.imageFsPath`, read-only) at the same place in the daemon's container; where the
//! daemon cannot see it (not mounted, another runtime), the check cannot judge: the pull goes
//! ahead, and the daemon says so once in its log.

use std::collections::HashSet;
use std::io;
use std::path::Path;
use std::sync::Mutex;

/// The default limit: the kubelet's default `imageGCHighThresholdPercent`.
pub const DEFAULT_HIGH_PERCENT: u8 = 85;

/// A filesystem's size and free space, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FsSpace {
    pub capacity: u64,
    /// What an unprivileged writer may still take (`f_bavail`).
    pub available: u64,
}

impl FsSpace {
    /// The kubelet's usage percent: `100 − available × 100 / capacity` (0 for an empty size).
    pub(crate) fn used_percent(self) -> u8 {
        if self.capacity == 0 {
            return 0;
        }
        let free = u128::from(self.available.min(self.capacity)) * 100 / u128::from(self.capacity);
        100 - u8::try_from(free).unwrap_or(100)
    }
}

/// `statvfs(path)`.
pub(crate) fn space_of(path: &Path) -> io::Result<FsSpace> {
    let stat = rustix::fs::statvfs(path)?;
    let block = stat.f_frsize.max(1);
    Ok(FsSpace {
        capacity: stat.f_blocks.saturating_mul(block),
        available: stat.f_bavail.saturating_mul(block),
    })
}

/// The limit a pull is held to, and the filesystems it could not judge (said once each).
#[derive(Debug)]
pub(crate) struct ImageFsGuard {
    /// Pulls are refused at or above this usage; 100 turns the check off.
    pub high_percent: u8,
    unseen: Mutex<HashSet<String>>,
}

impl ImageFsGuard {
    pub(crate) fn new(high_percent: u8) -> Self {
        Self {
            high_percent,
            unseen: Mutex::default(),
        }
    }

    /// Whether a pull may go ahead on the filesystems at `mountpoints`, measured by `space`:
    /// `Err` is the message for the tag's status. Filesystems `space` cannot measure are
    /// passed over (logged once each).
    pub(crate) fn check(
        &self,
        mountpoints: &[String],
        space: impl Fn(&Path) -> io::Result<FsSpace>,
    ) -> Result<(), String> {
        if self.high_percent >= 100 {
            return Ok(());
        }
        for mountpoint in mountpoints {
            match space(Path::new(mountpoint)) {
                Ok(space) if space.used_percent() >= self.high_percent => {
                    return Err(format!(
                        "ImageFilesystemFull: not pulling: the image filesystem {mountpoint} is {}% \
                         full ({} of {} bytes free), at or above --image-fs-high-threshold-percent \
                         {}% (the kubelet's image GC starts there); it is tried again after the \
                         backoff, so free space on the node or raise the limit",
                        space.used_percent(),
                        space.available,
                        space.capacity,
                        self.high_percent
                    ));
                }
                Ok(_) => {}
                Err(err) => {
                    let first = self
                        .unseen
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(mountpoint.clone());
                    if first {
                        tracing::warn!(
                            mountpoint,
                            error = %err,
                            "cannot measure the runtime's image filesystem, so pulls are not held \
                             to --image-fs-high-threshold-percent; mount it into the daemon's \
                             container at the same path (chart value daemon.imageFsPath)"
                        );
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space(capacity: u64, available: u64) -> FsSpace {
        FsSpace {
            capacity,
            available,
        }
    }

    #[test]
    fn usage_is_the_kubelets_percent() {
        assert_eq!(space(100, 100).used_percent(), 0);
        assert_eq!(space(100, 15).used_percent(), 85);
        // 14.5% free: the kubelet's integer division reads 14, so 86% used.
        assert_eq!(space(1000, 145).used_percent(), 86);
        assert_eq!(space(100, 0).used_percent(), 100);
        assert_eq!(space(0, 0).used_percent(), 0, "no size, no usage");
        assert_eq!(space(100, 200).used_percent(), 0, "more free than size");
        assert_eq!(
            space(u64::MAX, u64::MAX / 2).used_percent(),
            51,
            "no overflow (49.99% free reads as 49)"
        );
    }

    #[test]
    fn a_pull_is_refused_at_the_limit_and_says_where_and_why() {
        let guard = ImageFsGuard::new(85);
        let mounts = vec!["/images".to_owned()];
        assert_eq!(guard.check(&mounts, |_| Ok(space(100, 16))), Ok(()));
        let refused = guard
            .check(&mounts, |_| Ok(space(100, 15)))
            .expect_err("85% is the limit");
        assert!(
            refused.starts_with("ImageFilesystemFull: ")
                && refused.contains("/images is 85% full")
                && refused.contains("--image-fs-high-threshold-percent 85%"),
            "{refused}"
        );
    }

    #[test]
    fn any_full_filesystem_refuses_and_an_unmeasurable_one_lets_the_pull_go() {
        let guard = ImageFsGuard::new(85);
        let mounts = vec!["/a".to_owned(), "/b".to_owned()];
        let b_full = |p: &Path| {
            Ok(if p == Path::new("/b") {
                space(100, 1)
            } else {
                space(100, 90)
            })
        };
        assert!(guard.check(&mounts, b_full).is_err());
        let unseen = |_: &Path| Err(io::Error::from(io::ErrorKind::NotFound));
        assert_eq!(guard.check(&mounts, unseen), Ok(()));
        assert_eq!(
            guard.check(&mounts, unseen),
            Ok(()),
            "said once, still no hold"
        );
        assert_eq!(guard.unseen.lock().unwrap().len(), 2);
    }

    #[test]
    fn a_limit_of_100_turns_the_check_off() {
        let guard = ImageFsGuard::new(100);
        assert_eq!(
            guard.check(&["/full".to_owned()], |_| Ok(space(100, 0))),
            Ok(())
        );
    }

    #[test]
    fn statvfs_of_a_real_directory_has_a_size() {
        let measured = space_of(Path::new("/")).expect("statvfs of /");
        assert!(measured.capacity > 0 && measured.available <= measured.capacity);
        assert!(space_of(Path::new("/no/such/dir")).is_err());
    }
}
