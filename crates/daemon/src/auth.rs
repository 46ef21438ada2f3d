//! Registry credentials from image pull secrets, and which of them apply to an image.
//!
//! An ImagePullJob names pull secrets; before asking CRI to pull, the daemon has to pick the
//! credentials of those secrets that belong to the image's registry. Kubelet does this with its
//! credential keyring (`pkg/credentialprovider`), and users write their secrets for kubelet, so
//! [`Keyring`] follows the same rules: a secret's keys may be URLs, hosts, `host:port`, hosts with
//! a repository prefix or `*` wildcards in host labels; the scheme is ignored; every Docker Hub
//! alias means Docker Hub; and when several keys match, the more specific one comes first, so
//! that `quay.io/org` is tried before `quay.io` for `quay.io/org/app`.
//!
//! Where this departs from kubelet: a repository prefix matches whole path segments only
//! (kubelet's string prefix lets `quay.io/org` cover `quay.io/organisation`); hosts compare
//! case-insensitively, as DNS names do; `*` is the only wildcard (kubelet's `filepath.Match`
//! also reads `?` and `[…]`, which no registry host contains); Docker Hub keys are ranked with
//! the others instead of serving only as a fallback; and a credential is returned once however
//! many keys or secrets repeat it.
//!
//! Everything here is pure (no API calls, no logging) so that every rule is unit tested. Secret
//! material never reaches a message: [`Credential`]'s `Debug` redacts it, and [`SecretError`]
//! names the secret, the registry key and what is wrong, never a value.

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Map, Value};

use kruise_rs_api::image::{DEFAULT_REGISTRY, ImageRef};
use kruise_rs_api::quote::Quoted;

/// Secret type of a `~/.docker/config.json` style secret.
pub(crate) const DOCKER_CONFIG_JSON_TYPE: &str = "kubernetes.io/dockerconfigjson";
/// Data key holding the JSON of a [`DOCKER_CONFIG_JSON_TYPE`] secret: `{"auths": {KEY: {…}}}`.
pub(crate) const DOCKER_CONFIG_JSON_KEY: &str = ".dockerconfigjson";
/// Secret type of a legacy `~/.dockercfg` style secret.
pub(crate) const DOCKERCFG_TYPE: &str = "kubernetes.io/dockercfg";
/// Data key holding the JSON of a [`DOCKERCFG_TYPE`] secret: `{KEY: {…}}`.
pub(crate) const DOCKERCFG_KEY: &str = ".dockercfg";

/// Hosts that all mean Docker Hub, whose [`ImageRef::registry`] is [`DEFAULT_REGISTRY`].
const DOCKER_HUB_ALIASES: [&str; 3] = [DEFAULT_REGISTRY, "index.docker.io", "registry-1.docker.io"];

/// One usable credential from a pull secret.
///
/// At least one of `username`, `password`, `identity_token` and `registry_token` is non-empty:
/// entries without any are not added to a [`Keyring`]. `Debug` shows the user name but never the
/// password or the tokens.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Credential {
    pub username: String,
    pub password: String,
    /// `identitytoken` in the docker config (an OAuth refresh token).
    pub identity_token: String,
    /// `registrytoken` in the docker config (a bearer token sent as is).
    pub registry_token: String,
    /// The registry key exactly as written in the secret.
    pub server_address: String,
    /// Where it came from, for messages: `namespace/name`.
    pub source: String,
}

impl Credential {
    fn is_empty(&self) -> bool {
        self.username.is_empty()
            && self.password.is_empty()
            && self.identity_token.is_empty()
            && self.registry_token.is_empty()
    }

    /// Whether both would authenticate the same way, wherever they were written.
    pub(crate) fn same_material(&self, other: &Credential) -> bool {
        self.username == other.username
            && self.password == other.password
            && self.identity_token == other.identity_token
            && self.registry_token == other.registry_token
    }
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credential")
            .field("username", &self.username)
            .field("password", &Redacted(&self.password))
            .field("identity_token", &Redacted(&self.identity_token))
            .field("registry_token", &Redacted(&self.registry_token))
            .field("server_address", &self.server_address)
            .field("source", &self.source)
            .finish()
    }
}

/// Shows whether a secret value is set, not what it is.
struct Redacted<'a>(&'a str);

impl fmt::Debug for Redacted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            f.write_str("\"\"")
        } else {
            f.write_str("<redacted>")
        }
    }
}

/// Why a secret's credentials could not be read. Each message names the secret
/// (`namespace/name`) and, for an entry, its registry key; none quotes a credential.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum SecretError {
    #[error(
        "secret {secret} has type {}, so it holds no registry credentials (expected {DOCKER_CONFIG_JSON_TYPE} or {DOCKERCFG_TYPE})",
        Quoted(.secret_type)
    )]
    UnsupportedType { secret: String, secret_type: String },
    #[error("secret {secret} of type {secret_type} has no {data_key} data key")]
    MissingData {
        secret: String,
        secret_type: &'static str,
        data_key: &'static str,
    },
    /// `message` is serde_json's, which gives the position and never the input.
    #[error("secret {secret}: {data_key} is not valid JSON: {message}")]
    InvalidJson {
        secret: String,
        data_key: &'static str,
        message: String,
    },
    /// Valid JSON of the wrong shape, e.g. a number where a string belongs.
    #[error("secret {secret}: {data_key}: {problem}")]
    InvalidShape {
        secret: String,
        data_key: &'static str,
        problem: String,
    },
    #[error(
        "secret {secret}: the auth of registry {} is not valid base64 ({problem}); it must be base64 of user:password",
        Quoted(.registry)
    )]
    AuthNotBase64 {
        secret: String,
        registry: String,
        problem: String,
    },
    #[error(
        "secret {secret}: the auth of registry {} does not decode to UTF-8 text; it must be base64 of user:password",
        Quoted(.registry)
    )]
    AuthNotUtf8 { secret: String, registry: String },
    #[error(
        "secret {secret}: the auth of registry {} has no ':' between user name and password; it must be base64 of user:password",
        Quoted(.registry)
    )]
    AuthWithoutColon { secret: String, registry: String },
}

/// Registry credentials from pull secrets, indexed by the registry keys they were written for.
///
/// Build it with [`Keyring::add_secret`] once per secret, then ask [`Keyring::lookup`] which
/// credentials to try, in order, for an image.
#[derive(Default, Debug, Clone)]
pub(crate) struct Keyring {
    /// In insertion order; `lookup` sorts the matches, stably.
    entries: Vec<Entry>,
}

#[derive(Debug, Clone)]
struct Entry {
    pattern: RegistryPattern,
    credential: Credential,
}

impl Keyring {
    /// Adds the registries of one Secret; `source` (`namespace/name`) is recorded in each
    /// [`Credential`] and named in errors.
    ///
    /// `secret_type` is [`DOCKER_CONFIG_JSON_TYPE`] (data key [`DOCKER_CONFIG_JSON_KEY`], JSON
    /// `{"auths": {KEY: {…}}}`) or [`DOCKERCFG_TYPE`] (data key [`DOCKERCFG_KEY`], JSON
    /// `{KEY: {…}}`); any other type is an error. Entry fields, matched case-insensitively as Go's
    /// JSON decoder does, are `username`, `password`, `auth` (base64 of `user:password`, split at
    /// the first `:`, filling `username` and `password` where those are empty), `identitytoken`
    /// and `registrytoken`; `email` and unknown fields are ignored, a `null` field is empty.
    ///
    /// Returns how many entries were added. Left out without an error:
    /// - entries with no user name, password, identity token nor registry token (kubelet keeps
    ///   them as an empty credential, which is just an anonymous pull and needs no secret);
    /// - entries whose key has no usable host (empty, a non-numeric port, user info, characters
    ///   no registry host has): no image could match them, and kubelet skips them too;
    /// - everything of a [`DOCKER_CONFIG_JSON_TYPE`] secret without `auths` (e.g. a config.json
    ///   that only names a credential helper), as in kubelet.
    ///
    /// On error nothing of the secret is added. Entries of one secret are added in key order.
    pub(crate) fn add_secret(
        &mut self,
        source: &str,
        secret_type: &str,
        data: &BTreeMap<String, Vec<u8>>,
    ) -> Result<usize, SecretError> {
        let entries = parse_secret(source, secret_type, data)?;
        let added = entries.len();
        self.entries.extend(entries);
        Ok(added)
    }

    /// Adds one credential written for the registry key `key` (matched as a secret's keys are),
    /// e.g. an `auth` entry of a credential provider plugin's response. Returns whether it was
    /// added: a credential without user name, password or token, or a key no image could
    /// match, is left out as [`Keyring::add_secret`] leaves such entries out.
    pub(crate) fn add_credential(&mut self, key: &str, credential: Credential) -> bool {
        if credential.is_empty() {
            return false;
        }
        let Some(pattern) = RegistryPattern::parse(key) else {
            return false;
        };
        self.entries.push(Entry {
            pattern,
            credential,
        });
        true
    }

    /// Credentials whose key matches the image, in the order to try them: keys with a longer
    /// repository prefix first, then keys with more literal (non-`*`) host characters, then
    /// fewer `*`, so an exact host comes before a wildcard; ties keep insertion order. A
    /// credential whose user name, password and tokens equal an earlier one's is left out,
    /// whatever its source or key.
    pub(crate) fn lookup(&self, image: &ImageRef) -> Vec<&Credential> {
        let target = Target::new(image);
        let mut matches: Vec<&Entry> = self
            .entries
            .iter()
            .filter(|entry| entry.pattern.matches(&target))
            .collect();
        // Stable: equal specificity keeps insertion order.
        matches.sort_by_key(|entry| Reverse(entry.pattern.specificity()));
        let mut found: Vec<&Credential> = Vec::with_capacity(matches.len());
        for entry in matches {
            if !found.iter().any(|c| c.same_material(&entry.credential)) {
                found.push(&entry.credential);
            }
        }
        found
    }

    /// Whether no secret added any credential.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// How many entries all secrets added (a credential written for two keys counts twice).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

/// Reads every entry of a secret, or fails without a partial result.
fn parse_secret(
    source: &str,
    secret_type: &str,
    data: &BTreeMap<String, Vec<u8>>,
) -> Result<Vec<Entry>, SecretError> {
    let (secret_type, data_key) = match secret_type {
        DOCKER_CONFIG_JSON_TYPE => (DOCKER_CONFIG_JSON_TYPE, DOCKER_CONFIG_JSON_KEY),
        DOCKERCFG_TYPE => (DOCKERCFG_TYPE, DOCKERCFG_KEY),
        other => {
            return Err(SecretError::UnsupportedType {
                secret: source.to_owned(),
                secret_type: other.to_owned(),
            });
        }
    };
    let Some(bytes) = data.get(data_key) else {
        return Err(SecretError::MissingData {
            secret: source.to_owned(),
            secret_type,
            data_key,
        });
    };
    // Parsed as a `Value` and walked by hand: serde's typed errors quote the offending value
    // ("invalid type: string \"hunter2\""), which may be a password. Syntax errors never do.
    let root: Value = serde_json::from_slice(bytes).map_err(|err| SecretError::InvalidJson {
        secret: source.to_owned(),
        data_key,
        message: err.to_string(),
    })?;
    let shape = |problem: String| SecretError::InvalidShape {
        secret: source.to_owned(),
        data_key,
        problem,
    };
    let Value::Object(root) = &root else {
        return Err(shape(format!(
            "the top level is {}, not an object",
            kind(&root)
        )));
    };
    let registries = if secret_type == DOCKER_CONFIG_JSON_TYPE {
        match field(root, "auths") {
            None | Some(Value::Null) => return Ok(Vec::new()),
            Some(Value::Object(auths)) => auths,
            Some(other) => {
                return Err(shape(format!(
                    "\"auths\" is {}, not an object",
                    kind(other)
                )));
            }
        }
    } else {
        root
    };

    let mut registries: Vec<(&String, &Value)> = registries.iter().collect();
    // Deterministic whether or not serde_json keeps document order.
    registries.sort_by(|a, b| a.0.cmp(b.0));
    let mut entries = Vec::new();
    for (key, value) in registries {
        let fields = match value {
            Value::Null => continue,
            Value::Object(fields) => fields,
            other => {
                return Err(shape(format!(
                    "registry {} is {}, not an object",
                    Quoted(key),
                    kind(other)
                )));
            }
        };
        let text = |name: &str| {
            string_field(fields, name).map_err(|found| {
                shape(format!(
                    "field {name:?} of registry {} is {found}, not a string",
                    Quoted(key)
                ))
            })
        };
        let mut credential = Credential {
            username: text("username")?.to_owned(),
            password: text("password")?.to_owned(),
            identity_token: text("identitytoken")?.to_owned(),
            registry_token: text("registrytoken")?.to_owned(),
            server_address: key.clone(),
            source: source.to_owned(),
        };
        let auth = text("auth")?;
        if !auth.is_empty() {
            let (username, password) = decode_auth(auth)
                .map_err(|problem| problem.into_error(source.to_owned(), key.clone()))?;
            if credential.username.is_empty() {
                credential.username = username;
            }
            if credential.password.is_empty() {
                credential.password = password;
            }
        }
        if credential.is_empty() {
            continue;
        }
        if let Some(pattern) = RegistryPattern::parse(key) {
            entries.push(Entry {
                pattern,
                credential,
            });
        }
    }
    Ok(entries)
}

/// A field by its exact name, else by a case-insensitive match, as Go's `encoding/json` does.
fn field<'a>(object: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    object.get(name).or_else(|| {
        object
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value)
    })
}

/// A string field; absent and `null` are empty. The error is the kind of value found.
fn string_field<'a>(object: &'a Map<String, Value>, name: &str) -> Result<&'a str, &'static str> {
    match field(object, name) {
        None | Some(Value::Null) => Ok(""),
        Some(Value::String(text)) => Ok(text),
        Some(other) => Err(kind(other)),
    }
}

/// The kind of a JSON value, for messages that must not show the value.
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// What is wrong with an `auth` field; the registry and secret are added by the caller.
#[derive(Debug)]
enum AuthProblem {
    NotBase64(String),
    NotUtf8,
    NoColon,
}

impl AuthProblem {
    fn into_error(self, secret: String, registry: String) -> SecretError {
        match self {
            AuthProblem::NotBase64(problem) => SecretError::AuthNotBase64 {
                secret,
                registry,
                problem,
            },
            AuthProblem::NotUtf8 => SecretError::AuthNotUtf8 { secret, registry },
            AuthProblem::NoColon => SecretError::AuthWithoutColon { secret, registry },
        }
    }
}

/// `base64(user:password)` → `(user, password)`, split at the first ':' since passwords may
/// hold one. Line breaks are skipped, as Go's decoder does.
fn decode_auth(auth: &str) -> Result<(String, String), AuthProblem> {
    let compact: String = auth.chars().filter(|c| !matches!(c, '\r' | '\n')).collect();
    let bytes = STANDARD.decode(compact.as_bytes()).map_err(|err| {
        // base64's own messages include the offending byte, which is a character of the secret.
        AuthProblem::NotBase64(match err {
            base64::DecodeError::InvalidByte(offset, _) => {
                format!("invalid character at offset {offset}")
            }
            base64::DecodeError::InvalidLength(_) => "invalid length".to_owned(),
            base64::DecodeError::InvalidLastSymbol(offset, _) => {
                format!("invalid last character at offset {offset}")
            }
            base64::DecodeError::InvalidPadding => "invalid padding".to_owned(),
        })
    })?;
    let text = String::from_utf8(bytes).map_err(|_| AuthProblem::NotUtf8)?;
    let (username, password) = text.split_once(':').ok_or(AuthProblem::NoColon)?;
    Ok((username.to_owned(), password.to_owned()))
}

/// A registry key, parsed for matching: `[scheme://]host[:port][/path]`. Also the matcher of
/// a credential provider's `matchImages` (`super::credential_provider`), whose patterns
/// kubelet matches by the same rules as keyring keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RegistryPattern {
    /// Lower-case host labels, possibly with `*`; Docker Hub aliases are `docker`, `io`.
    labels: Vec<String>,
    port: Option<String>,
    /// Repository prefix, in whole segments.
    path: Vec<String>,
}

impl RegistryPattern {
    /// `None` when the key has no usable host: no image could match it.
    ///
    /// The scheme, a query or fragment, empty path segments (so a trailing `/`) and a leading
    /// `v1` or `v2` path segment (the registry API version in `https://index.docker.io/v1/`,
    /// which kubelet and docker drop too) are ignored.
    pub(crate) fn parse(key: &str) -> Option<RegistryPattern> {
        let key = key.trim();
        let rest = match key.split_once("://") {
            Some((scheme, rest)) if is_scheme(scheme) => rest,
            _ => key,
        };
        let rest = rest.split(['?', '#']).next().unwrap_or_default();
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (host, port) = match authority.split_once(':') {
            Some((host, port)) => {
                if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                (host, Some(port.to_owned()))
            }
            None => (authority, None),
        };
        let host = host.to_ascii_lowercase();
        let label_ok = |label: &str| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'*')
        };
        if !host.split('.').all(label_ok) {
            return None;
        }
        let host = if port.is_none() && DOCKER_HUB_ALIASES.contains(&host.as_str()) {
            DEFAULT_REGISTRY.to_owned()
        } else {
            host
        };
        let mut path: Vec<String> = path
            .split('/')
            .filter(|segment| !segment.is_empty())
            .map(str::to_owned)
            .collect();
        if path
            .first()
            .is_some_and(|first| first == "v1" || first == "v2")
        {
            path.remove(0);
        }
        Some(RegistryPattern {
            labels: host.split('.').map(str::to_owned).collect(),
            port,
            path,
        })
    }

    /// Whether the image's registry and repository match this pattern.
    pub(crate) fn matches_image(&self, image: &ImageRef) -> bool {
        self.matches(&Target::new(image))
    }

    fn matches(&self, target: &Target<'_>) -> bool {
        self.port.as_deref() == target.port
            && self.labels.len() == target.labels.len()
            && self
                .labels
                .iter()
                .zip(&target.labels)
                .all(|(pattern, label)| glob_match(pattern.as_bytes(), label.as_bytes()))
            && self.path.len() <= target.path.len()
            && self.path.iter().zip(&target.path).all(|(a, b)| a == b)
    }

    /// Larger is more specific: more repository prefix segments, then more literal host
    /// characters, then fewer `*`.
    fn specificity(&self) -> (usize, usize, Reverse<usize>) {
        let stars: usize = self
            .labels
            .iter()
            .map(|label| label.bytes().filter(|&b| b == b'*').count())
            .sum();
        let chars: usize = self.labels.iter().map(String::len).sum();
        (self.path.len(), chars - stars, Reverse(stars))
    }
}

/// An image's registry and repository, split as [`RegistryPattern`] is.
struct Target<'a> {
    labels: Vec<String>,
    port: Option<&'a str>,
    path: Vec<&'a str>,
}

impl<'a> Target<'a> {
    fn new(image: &'a ImageRef) -> Target<'a> {
        let (host, port) = match image.registry().split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (image.registry(), None),
        };
        let host = host.to_ascii_lowercase();
        let host = if port.is_none() && DOCKER_HUB_ALIASES.contains(&host.as_str()) {
            DEFAULT_REGISTRY.to_owned()
        } else {
            host
        };
        Target {
            labels: host.split('.').map(str::to_owned).collect(),
            port,
            path: image.repository().split('/').collect(),
        }
    }
}

/// URI scheme syntax: a letter, then letters, digits, `+`, `-` or `.`.
fn is_scheme(scheme: &str) -> bool {
    let mut bytes = scheme.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_alphabetic())
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
}

/// Whether `text` matches `pattern`, where `*` stands for any run of bytes (possibly empty).
/// Greedy with one backtrack point, so linear in practice and never recursive.
fn glob_match(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    // Position of the last `*` seen and the text position it currently stands up to.
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some(b'*') => {
                star = Some((p, t));
                p += 1;
            }
            Some(&b) if b == text[t] => {
                p += 1;
                t += 1;
            }
            _ => match star {
                Some((star_p, star_t)) => {
                    p = star_p + 1;
                    t = star_t + 1;
                    star = Some((star_p, t));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&b| b == b'*')
}

#[cfg(test)]
mod tests;
