//! Whether the runtime's socket the daemon holds is a dead inode it can never reach again.
//!
//! The chart mounts the runtime's socket file alone
//! ([decision 0010](../../docs/decisions/0010-daemon-mounts-only-its-cri-socket.md)). A bind mount
//! of a file keeps the inode it was made with, and a runtime that restarts unlinks its socket and
//! binds a new one. On Linux a refused `connect()` to a unix socket means nothing listens on that
//! inode, and nothing will again: a listener always binds a new inode. So when the socket's path
//! is a mount point of its own and a connection to it is refused, waiting is useless; the daemon
//! exits, and the kubelet starts the container again with a mount of the new socket. A path that
//! is not a mount point (the daemon on the host, or a mount of the socket's directory) follows
//! the runtime's new socket, and the daemon waits for it as before (`liveness`).

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long one connection attempt may take: a refusal comes at once, so a slow answer is not one.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The daemon's runtime socket and whether it is a mount point of its own.
#[derive(Clone, Debug)]
pub(crate) struct SocketMount {
    path: PathBuf,
    mounted: bool,
}

impl SocketMount {
    /// Reads this process's mount table once: the kubelet mounts the socket when it creates the
    /// container, and nothing mounts over it later.
    pub(crate) fn of(path: &Path) -> Self {
        let mounted = std::fs::read_to_string("/proc/self/mountinfo")
            .map(|table| is_mount_point(&table, path))
            .unwrap_or(false);
        Self {
            path: path.to_owned(),
            mounted,
        }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the socket is a mount of an inode nobody listens on: refused through a mount of
    /// its own, it stays refused for good.
    pub(crate) async fn is_stale(&self) -> bool {
        self.mounted && refused(&self.path).await
    }
}

/// Whether a connection to the unix socket at `path` is refused (not: times out, or the path is
/// missing; those can change without a new mount).
async fn refused(path: &Path) -> bool {
    match tokio::time::timeout(PROBE_TIMEOUT, tokio::net::UnixStream::connect(path)).await {
        Ok(Err(err)) => err.kind() == io::ErrorKind::ConnectionRefused,
        Ok(Ok(_)) | Err(_) => false,
    }
}

/// Whether `path` is the mount point of some line of a `/proc/self/mountinfo` table, as given or
/// with its symbolic links resolved.
fn is_mount_point(mountinfo: &str, path: &Path) -> bool {
    let resolved = std::fs::canonicalize(path).ok();
    mountinfo
        .lines()
        // id, parent id, major:minor, root, then the mount point.
        .filter_map(|line| line.split(' ').nth(4))
        .map(unescape)
        .any(|point| {
            let point = Path::new(&point);
            point == path || resolved.as_deref() == Some(point)
        })
}

/// The kernel writes a space, tab, newline and backslash in a mountinfo path as `\040`, `\011`,
/// `\012` and `\134`.
fn unescape(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut rest = field;
    while let Some(at) = rest.find('\\') {
        out.push_str(&rest[..at]);
        let code = rest.get(at + 1..at + 4);
        match code.and_then(|digits| u8::from_str_radix(digits, 8).ok()) {
            Some(byte) if byte.is_ascii() => {
                out.push(char::from(byte));
                rest = &rest[at + 4..];
            }
            _ => {
                out.push('\\');
                rest = &rest[at + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A container's table as the kubelet sets it up: the socket file mounted alone.
    const TABLE: &str = "\
2203 1874 0:312 / / ro,relatime master:583 - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w
2204 2203 0:315 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
2219 2203 0:26 /containerd/containerd.sock /run/cri/cri.sock ro,nosuid,nodev,noexec,relatime - tmpfs tmpfs rw,size=1620608k,mode=755
2220 2203 253:1 /var/lib/kubelet/pods/0f/etc-hosts /etc/hosts rw,relatime - ext4 /dev/vda1 rw
2221 2203 0:26 /my\\040dir/cri.sock /run/my\\040dir/cri.sock ro,relatime - tmpfs tmpfs rw
";

    #[test]
    fn the_socket_mounted_alone_is_a_mount_point() {
        assert!(is_mount_point(TABLE, Path::new("/run/cri/cri.sock")));
    }

    #[test]
    fn a_socket_under_a_mounted_directory_is_not() {
        assert!(!is_mount_point(TABLE, Path::new("/run/cri")));
        assert!(!is_mount_point(
            TABLE,
            Path::new("/proc/host/run/containerd/containerd.sock")
        ));
        assert!(!is_mount_point(TABLE, Path::new("/run/cri/cri.sock/x")));
        assert!(!is_mount_point("", Path::new("/run/cri/cri.sock")));
    }

    #[test]
    fn escaped_spaces_in_mount_points_are_read() {
        assert!(is_mount_point(TABLE, Path::new("/run/my dir/cri.sock")));
        assert!(!is_mount_point(
            TABLE,
            Path::new("/run/my\\040dir/cri.sock")
        ));
    }

    #[test]
    fn malformed_lines_are_skipped() {
        let table = "garbage\n1 2 3\n\n9 8 0:1 / /run/cri/cri.sock ro - tmpfs tmpfs rw\n";
        assert!(is_mount_point(table, Path::new("/run/cri/cri.sock")));
    }

    #[test]
    fn unescape_reads_octal_escapes_and_keeps_stray_backslashes() {
        assert_eq!(unescape("/a\\040b\\011c\\012d\\134e"), "/a b\tc\nd\\e");
        assert_eq!(unescape("/a\\"), "/a\\");
        assert_eq!(unescape("/a\\04"), "/a\\04");
        assert_eq!(unescape("/a\\999"), "/a\\999");
        assert_eq!(unescape("/a\\400"), "/a\\400");
        assert_eq!(unescape("/plain"), "/plain");
    }

    #[tokio::test]
    async fn a_socket_nobody_listens_on_refuses_and_a_listening_one_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cri.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        assert!(!refused(&path).await, "a listener accepts");
        drop(listener);
        // The inode stays, nobody listens on it: what a mount of a restarted runtime's socket holds.
        assert!(path.exists());
        assert!(refused(&path).await);
        // A missing path is not a refusal: a runtime that starts will create it.
        assert!(!refused(&dir.path().join("missing.sock")).await);
    }

    #[tokio::test]
    async fn a_refused_socket_is_stale_only_when_it_is_a_mount_point() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cri.sock");
        drop(tokio::net::UnixListener::bind(&path).unwrap());
        let mounted = SocketMount {
            path: path.clone(),
            mounted: true,
        };
        assert!(mounted.is_stale().await);
        let on_the_host = SocketMount {
            path,
            mounted: false,
        };
        assert!(!on_the_host.is_stale().await);
        // This test's own socket is on no mount of its own.
        assert!(!SocketMount::of(on_the_host.path()).mounted);
    }
}
