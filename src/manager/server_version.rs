//! The Kubernetes versions the manager runs against. The floor is the oldest version the API
//! types are built for (k8s-openapi's `v1_33`) and the test suite runs at; an older server is
//! refused at start with a message rather than failing later in ways that look like our bugs.

use std::fmt;

/// The oldest Kubernetes minor supported (and tested): 1.33.
pub(crate) const FLOOR: ServerVersion = ServerVersion {
    major: 1,
    minor: 33,
};

/// The newest Kubernetes minor the test suite runs at.
pub(crate) const NEWEST_TESTED: ServerVersion = ServerVersion {
    major: 1,
    minor: 36,
};

/// A Kubernetes `major.minor`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ServerVersion {
    pub major: u32,
    pub minor: u32,
}

impl fmt::Display for ServerVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// The server is older than `FLOOR`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "the API server runs Kubernetes {git_version} ({version}); kruise-rs needs {FLOOR} or newer \
     (tested with {FLOOR} and {NEWEST_TESTED}): upgrade the cluster, or keep upstream OpenKruise \
     on it"
)]
pub struct ServerTooOld {
    pub version: ServerVersion,
    pub git_version: String,
}

/// Leading decimal digits of `s` ("33+" on some managed clusters is 33).
fn leading_number(s: &str) -> Option<u32> {
    let digits: &str = &s[..s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len())];
    digits.parse().ok()
}

/// Reads `major.minor` from the `/version` fields, falling back to `gitVersion`
/// (`v1.33.13-gke.100`) where `major`/`minor` are empty or odd.
pub(crate) fn parse(major: &str, minor: &str, git_version: &str) -> Option<ServerVersion> {
    if let (Some(major), Some(minor)) = (leading_number(major), leading_number(minor)) {
        return Some(ServerVersion { major, minor });
    }
    let mut parts = git_version.strip_prefix('v')?.split('.');
    let major = leading_number(parts.next()?)?;
    let minor = leading_number(parts.next()?)?;
    Some(ServerVersion { major, minor })
}

/// Whether the manager may run against this server. `Ok(None)`: the version could not be
/// read; the caller warns and goes on (a server that hides its version is not refused).
pub fn check(
    major: &str,
    minor: &str,
    git_version: &str,
) -> Result<Option<ServerVersion>, ServerTooOld> {
    match parse(major, minor, git_version) {
        Some(version) if version < FLOOR => Err(ServerTooOld {
            version,
            git_version: git_version.to_owned(),
        }),
        found => Ok(found),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(major: u32, minor: u32) -> ServerVersion {
        ServerVersion { major, minor }
    }

    #[test]
    fn the_floor_and_newer_pass() {
        assert_eq!(check("1", "33", "v1.33.13"), Ok(Some(v(1, 33))));
        assert_eq!(check("1", "36", "v1.36.3"), Ok(Some(v(1, 36))));
        assert_eq!(check("1", "40", "v1.40.0"), Ok(Some(v(1, 40))));
        assert_eq!(check("2", "0", "v2.0.0"), Ok(Some(v(2, 0))));
    }

    #[test]
    fn older_servers_are_refused_with_what_to_do() {
        let err = check("1", "32", "v1.32.9").unwrap_err();
        assert_eq!(err.version, v(1, 32));
        let message = err.to_string();
        assert!(message.contains("Kubernetes v1.32.9 (1.32)"), "{message}");
        assert!(message.contains("needs 1.33 or newer"), "{message}");
        assert!(message.contains("tested with 1.33 and 1.36"), "{message}");
        assert!(check("1", "9", "v1.9.0").is_err(), "compared as numbers");
        assert!(check("0", "99", "v0.99.0").is_err());
    }

    #[test]
    fn managed_cluster_spellings_are_read() {
        // GKE and EKS report "33+" as the minor and a suffixed gitVersion.
        assert_eq!(check("1", "33+", "v1.33.5-gke.1000"), Ok(Some(v(1, 33))));
        assert!(check("1", "31+", "v1.31.2-eks-7f9249a").is_err());
        // Empty fields: gitVersion decides.
        assert_eq!(parse("", "", "v1.34.1+k3s1"), Some(v(1, 34)));
        assert!(check("", "", "v1.30.0").is_err());
    }

    #[test]
    fn an_unreadable_version_is_not_refused() {
        assert_eq!(check("", "", ""), Ok(None));
        assert_eq!(check("x", "y", "devel"), Ok(None));
        assert_eq!(parse("", "", "v1"), None);
    }
}
