//! The reference grammar of docker/distribution v2.8.2 (`reference/regexp.go`,
//! `reference/normalize.go`), which upstream Kruise uses, checked without regexes.

use std::fmt;
use std::str::FromStr;

use crate::quote::Quoted;

/// Registry assumed when a reference names none (Docker Hub).
pub const DEFAULT_REGISTRY: &str = "docker.io";
/// Tag assumed when a reference has neither tag nor digest.
pub const DEFAULT_TAG: &str = "latest";
/// Longest normalized name (`registry/repository`) docker accepts.
pub const NAME_MAX_LEN: usize = 255;

/// Docker Hub's old name; docker rewrites it to [`DEFAULT_REGISTRY`].
const LEGACY_DEFAULT_REGISTRY: &str = "index.docker.io";
/// Namespace of Docker Hub's official images (`nginx` is `library/nginx`).
const OFFICIAL_NAMESPACE: &str = "library";
const TAG_MAX_LEN: usize = 128;

/// A parsed, normalized image reference.
///
/// Parsing follows docker's `ParseNormalizedNamed`: a missing registry is `docker.io`, a
/// single-component Docker Hub repository gets `library/`, `index.docker.io` becomes
/// `docker.io`. Tag and digest are kept as written; [`ImageRef::nodeimage_tag`] and
/// [`ImageRef::to_pull_ref`] apply upstream's "digest wins" rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ImageRef {
    /// `registry/repository`, fully qualified.
    name: String,
    /// Byte length of the registry prefix of `name`.
    registry_len: usize,
    tag: Option<String>,
    digest: Option<String>,
}

impl ImageRef {
    /// Parses and normalizes an image reference as upstream Kruise (docker/distribution
    /// v2.8.2 `ParseNormalizedNamed`) does. Never panics; the error quotes the input.
    pub fn parse(input: &str) -> Result<ImageRef, ImageRefError> {
        // Only a whole reference is refused for being bare hex: docker reads it as an image ID.
        // As a name with a separate tag (`from_nodeimage`) the same string is a valid name.
        if input.len() == 64 && input.bytes().all(is_lower_hex) {
            return Err(ImageRefError::new(input, ImageRefErrorKind::HexIdentifier));
        }
        parse_reference(input).map_err(|kind| ImageRefError::new(input, kind))
    }

    /// Builds the reference a NodeImage entry stands for: `name` is a `spec.images` key
    /// (normally a familiar name; any name without tag or digest is accepted) and `tag` a
    /// `tags[].tag`, which is a digest (`sha256:…`) when it contains a `:`, since tags cannot.
    pub fn from_nodeimage(name: &str, tag: &str) -> Result<ImageRef, ImageRefError> {
        let is_digest = is_digest_tag(tag);
        let joined = joined_ref(name, tag);
        let fail = |kind| ImageRefError::new(&joined, kind);
        // Parse the name alone so that a tag or digest inside it cannot be mistaken for the one
        // passed separately.
        let mut parsed = parse_reference(name).map_err(fail)?;
        if parsed.tag.is_some() || parsed.digest.is_some() {
            return Err(fail(ImageRefErrorKind::NameHasTagOrDigest(name.to_owned())));
        }
        if is_digest {
            validate_digest(tag).map_err(fail)?;
            parsed.digest = Some(tag.to_owned());
        } else {
            validate_tag(tag).map_err(fail)?;
            parsed.tag = Some(tag.to_owned());
        }
        Ok(parsed)
    }

    /// Registry host, with port if any: `docker.io`, `ghcr.io`, `127.0.0.1:5000`.
    pub fn registry(&self) -> &str {
        &self.name[..self.registry_len]
    }

    /// Repository path inside the registry: `library/nginx`, `org/app`.
    pub fn repository(&self) -> &str {
        &self.name[self.registry_len + 1..]
    }

    /// Fully qualified name without tag or digest: `docker.io/library/nginx`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Docker's `FamiliarName`, the NodeImage `spec.images` key: `docker.io/` is dropped, and
    /// `library/` too when exactly one component follows it (`docker.io/library/a/b` stays
    /// `library/a/b`, as in docker).
    pub fn familiar_name(&self) -> &str {
        if self.registry() != DEFAULT_REGISTRY {
            return &self.name;
        }
        let repository = self.repository();
        match repository.strip_prefix("library/") {
            Some(official) if !official.contains('/') => official,
            _ => repository,
        }
    }

    /// The tag as written, if any (kept even when a digest is present).
    pub fn tag(&self) -> Option<&str> {
        self.tag.as_deref()
    }

    /// The digest as written (`sha256:…`), if any.
    pub fn digest(&self) -> Option<&str> {
        self.digest.as_deref()
    }

    /// What upstream stores in a NodeImage tag entry: the digest if present (a tag next to a
    /// digest is dropped, as `ParseDockerRef` does), else the tag, else `latest`.
    pub fn nodeimage_tag(&self) -> &str {
        self.digest
            .as_deref()
            .or(self.tag.as_deref())
            .unwrap_or(DEFAULT_TAG)
    }

    /// Fully qualified reference for CRI `PullImage`: `docker.io/library/nginx:latest`, or
    /// `registry/repo@sha256:…` when a digest is present (the tag is then dropped, which is
    /// also what containerd does with `name:tag@digest`).
    pub fn to_pull_ref(&self) -> String {
        match &self.digest {
            Some(digest) => format!("{}@{digest}", self.name),
            None => format!("{}:{}", self.name, self.nodeimage_tag()),
        }
    }
}

/// Whether a NodeImage `tags[].tag` is a digest (`sha256:…`): tags cannot contain a `:`.
fn is_digest_tag(tag: &str) -> bool {
    tag.contains(':')
}

/// A NodeImage entry (`spec.images` key, `tags[].tag`) as one reference, for messages, events
/// and logs: `nginx:1.25`, or `ghcr.io/org/app@sha256:…` for a digest entry (never
/// `name:sha256:…`, which is no reference). Nothing is validated or normalized, so any pair,
/// even an invalid one, reads back as written.
pub fn joined_ref(name: &str, tag: &str) -> String {
    if is_digest_tag(tag) {
        format!("{name}@{tag}")
    } else {
        format!("{name}:{tag}")
    }
}

/// The reference CRI should pull for a NodeImage entry (`spec.images` key, `tags[].tag`):
/// `docker.io/library/nginx:1.25`, or `ghcr.io/org/app@sha256:…` for a digest entry.
pub fn pull_ref_for(familiar_name: &str, nodeimage_tag: &str) -> Result<String, ImageRefError> {
    ImageRef::from_nodeimage(familiar_name, nodeimage_tag).map(|r| r.to_pull_ref())
}

impl FromStr for ImageRef {
    type Err = ImageRefError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ImageRef::parse(s)
    }
}

/// Displays as [`ImageRef::to_pull_ref`].
impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_pull_ref())
    }
}

/// An image reference that does not parse: the input and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid image reference {}: {kind}", Quoted(.input))]
pub struct ImageRefError {
    input: String,
    kind: ImageRefErrorKind,
}

impl ImageRefError {
    fn new(input: &str, kind: ImageRefErrorKind) -> Self {
        ImageRefError {
            input: input.to_owned(),
            kind,
        }
    }

    /// The rejected input.
    pub fn input(&self) -> &str {
        &self.input
    }

    /// What is wrong with it.
    pub fn kind(&self) -> &ImageRefErrorKind {
        &self.kind
    }
}

/// What is wrong with a rejected image reference.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ImageRefErrorKind {
    #[error("it is empty")]
    Empty,
    // Docker refuses these because they are ambiguous with image IDs.
    #[error("a 64-character hex string is an image ID, not a repository name")]
    HexIdentifier,
    #[error("it has no repository name before the tag or digest")]
    MissingName,
    #[error("registry {} is not a valid host[:port]", Quoted(.0))]
    InvalidRegistry(String),
    #[error("repository name must be lowercase (component {})", Quoted(.0))]
    UppercaseRepository(String),
    #[error(
        "repository path component {} must be lowercase letters and digits separated by '.', '_', '__' or dashes",
        Quoted(.0)
    )]
    InvalidPathComponent(String),
    #[error("the normalized name {} is {len} characters long, more than {NAME_MAX_LEN}", Quoted(.name))]
    NameTooLong { name: String, len: usize },
    #[error(
        "tag {} must be 1 to 128 characters of [A-Za-z0-9_.-] not starting with '.' or '-'",
        Quoted(.0)
    )]
    InvalidTag(String),
    #[error("digest algorithm {} is not supported (sha256, sha384 or sha512)", Quoted(.0))]
    UnsupportedDigestAlgorithm(String),
    #[error("digest {} must be <algorithm>:<lowercase hex>", Quoted(.0))]
    InvalidDigest(String),
    #[error("a {algorithm} digest has {expected} hex characters, not {actual}")]
    DigestLength {
        algorithm: String,
        expected: usize,
        actual: usize,
    },
    #[error(
        "Docker Hub namespace {} looks like a registry host, so its NodeImage name would read back as another registry",
        Quoted(.0)
    )]
    AmbiguousFamiliarName(String),
    #[error("image name {} must not carry a tag or digest", Quoted(.0))]
    NameHasTagOrDigest(String),
}

fn parse_reference(input: &str) -> Result<ImageRef, ImageRefErrorKind> {
    use ImageRefErrorKind as E;
    if input.is_empty() {
        return Err(E::Empty);
    }
    // Names and tags never contain '@', so the first one starts the digest; a second one fails
    // the digest grammar.
    let (rest, digest) = match input.split_once('@') {
        Some((rest, digest)) => (rest, Some(digest)),
        None => (input, None),
    };
    // A ':' followed by no '/' starts the tag; any other ':' is a registry port.
    let (name, tag) = match rest.rfind(':') {
        Some(i) if !rest[i + 1..].contains('/') => (&rest[..i], Some(&rest[i + 1..])),
        _ => (rest, None),
    };
    if name.is_empty() {
        return Err(E::MissingName);
    }

    // docker's splitDockerDomain: the first component is a registry only if it looks like a
    // host (has '.' or ':', or is localhost); otherwise the whole name is a Docker Hub path.
    let (registry, path) = match name.split_once('/') {
        Some((first, path)) if first.contains(['.', ':']) || first == "localhost" => {
            // docker would re-read an invalid host such as `a_b.c` as a registry-less path and
            // yield a name no runtime can pull; rejecting it is clearer.
            if !is_valid_registry(first) {
                return Err(E::InvalidRegistry(first.to_owned()));
            }
            (first, path)
        }
        _ => (DEFAULT_REGISTRY, name),
    };
    let registry = if registry == LEGACY_DEFAULT_REGISTRY {
        DEFAULT_REGISTRY
    } else {
        registry
    };
    for component in path.split('/') {
        if !is_valid_path_component(component) {
            if is_valid_path_component(&component.to_ascii_lowercase()) {
                return Err(E::UppercaseRepository(component.to_owned()));
            }
            return Err(E::InvalidPathComponent(component.to_owned()));
        }
    }
    // docker's FamiliarName drops `docker.io/`, so `docker.io/localhost/x` would be keyed
    // `localhost/x`, which reads back (upstream's daemon included) as registry `localhost`.
    if registry == DEFAULT_REGISTRY
        && let Some((first, _)) = path.split_once('/')
        && (first.contains('.') || first == "localhost")
    {
        return Err(E::AmbiguousFamiliarName(first.to_owned()));
    }
    let official = registry == DEFAULT_REGISTRY && !path.contains('/');
    let full = if official {
        format!("{registry}/{OFFICIAL_NAMESPACE}/{path}")
    } else {
        format!("{registry}/{path}")
    };
    // docker limits the normalized name, so `docker.io/library/` counts against it.
    if full.len() > NAME_MAX_LEN {
        let len = full.len();
        return Err(E::NameTooLong { name: full, len });
    }
    if let Some(tag) = tag {
        validate_tag(tag)?;
    }
    if let Some(digest) = digest {
        validate_digest(digest)?;
    }
    Ok(ImageRef {
        name: full,
        registry_len: registry.len(),
        tag: tag.map(str::to_owned),
        digest: digest.map(str::to_owned),
    })
}

fn is_lower_hex(b: u8) -> bool {
    b.is_ascii_digit() || (b'a'..=b'f').contains(&b)
}

/// `host[:port]`: dot-separated labels of ASCII letters, digits and inner dashes, then an
/// optional all-digit port. (IPv6 literals came to docker's grammar only after v2.8.2.)
fn is_valid_registry(registry: &str) -> bool {
    let (host, port) = match registry.split_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (registry, None),
    };
    let label_ok = |label: &str| {
        !label.is_empty()
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
    };
    host.split('.').all(label_ok)
        && port.is_none_or(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// `[a-z0-9]+(?:(?:[._]|__|[-]*)[a-z0-9]+)*`: lowercase alphanumeric runs joined by one '.',
/// one or two '_', or any number of '-'.
fn is_valid_path_component(component: &str) -> bool {
    let bytes = component.as_bytes();
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let mut i = 0;
    loop {
        let run_start = i;
        while i < bytes.len() && alnum(bytes[i]) {
            i += 1;
        }
        if i == run_start {
            return false;
        }
        if i == bytes.len() {
            return true;
        }
        match bytes[i] {
            b'.' => i += 1,
            b'_' => {
                i += 1;
                if bytes.get(i) == Some(&b'_') {
                    i += 1;
                }
            }
            b'-' => {
                while bytes.get(i) == Some(&b'-') {
                    i += 1;
                }
            }
            _ => return false,
        }
    }
}

/// `[\w][\w.-]{0,127}` with Go's ASCII-only `\w`.
fn validate_tag(tag: &str) -> Result<(), ImageRefErrorKind> {
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let ok = tag.len() <= TAG_MAX_LEN
        && tag.bytes().next().is_some_and(word)
        && tag.bytes().all(|b| word(b) || b == b'.' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(ImageRefErrorKind::InvalidTag(tag.to_owned()))
    }
}

/// go-digest v1.0.0 as linked into upstream: sha256/sha384/sha512 with lowercase hex of exactly
/// the hash's length; any other algorithm is unsupported.
fn validate_digest(digest: &str) -> Result<(), ImageRefErrorKind> {
    use ImageRefErrorKind as E;
    let Some((algorithm, hex)) = digest.split_once(':') else {
        return Err(E::InvalidDigest(digest.to_owned()));
    };
    let expected = match algorithm {
        "sha256" => 64,
        "sha384" => 96,
        "sha512" => 128,
        "" => return Err(E::InvalidDigest(digest.to_owned())),
        other => return Err(E::UnsupportedDigestAlgorithm(other.to_owned())),
    };
    if !hex.bytes().all(is_lower_hex) {
        return Err(E::InvalidDigest(digest.to_owned()));
    }
    if hex.len() != expected {
        return Err(E::DigestLength {
            algorithm: algorithm.to_owned(),
            expected,
            actual: hex.len(),
        });
    }
    Ok(())
}
