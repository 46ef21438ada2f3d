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

use crate::image::{DEFAULT_REGISTRY, ImageRef};

/// Secret type of a `~/.docker/config.json` style secret.
pub const DOCKER_CONFIG_JSON_TYPE: &str = "kubernetes.io/dockerconfigjson";
/// Data key holding the JSON of a [`DOCKER_CONFIG_JSON_TYPE`] secret: `{"auths": {KEY: {…}}}`.
pub const DOCKER_CONFIG_JSON_KEY: &str = ".dockerconfigjson";
/// Secret type of a legacy `~/.dockercfg` style secret.
pub const DOCKERCFG_TYPE: &str = "kubernetes.io/dockercfg";
/// Data key holding the JSON of a [`DOCKERCFG_TYPE`] secret: `{KEY: {…}}`.
pub const DOCKERCFG_KEY: &str = ".dockercfg";

/// Hosts that all mean Docker Hub, whose [`ImageRef::registry`] is [`DEFAULT_REGISTRY`].
const DOCKER_HUB_ALIASES: [&str; 3] = [DEFAULT_REGISTRY, "index.docker.io", "registry-1.docker.io"];
/// Keys and types are quoted in messages up to this many characters.
const QUOTE_MAX_CHARS: usize = 200;

/// One usable credential from a pull secret.
///
/// At least one of `username`, `password`, `identity_token` and `registry_token` is non-empty:
/// entries without any are not added to a [`Keyring`]. `Debug` shows the user name but never the
/// password or the tokens.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential {
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
    fn same_material(&self, other: &Credential) -> bool {
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
pub enum SecretError {
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
pub struct Keyring {
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
    pub fn add_secret(
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

    /// Credentials whose key matches the image, in the order to try them: keys with a longer
    /// repository prefix first, then keys with more literal (non-`*`) host characters, then
    /// fewer `*`, so an exact host comes before a wildcard; ties keep insertion order. A
    /// credential whose user name, password and tokens equal an earlier one's is left out,
    /// whatever its source or key.
    pub fn lookup(&self, image: &ImageRef) -> Vec<&Credential> {
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
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// How many entries all secrets added (a credential written for two keys counts twice).
    pub fn len(&self) -> usize {
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

/// A registry key, parsed for matching: `[scheme://]host[:port][/path]`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RegistryPattern {
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
    fn parse(key: &str) -> Option<RegistryPattern> {
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

/// Debug-quotes a string (escaping control characters), cut to [`QUOTE_MAX_CHARS`].
struct Quoted<'a>(&'a str);

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.char_indices().nth(QUOTE_MAX_CHARS) {
            Some((cut, _)) => write!(f, "{:?}…", &self.0[..cut]),
            None => write!(f, "{:?}", self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOURCE: &str = "ns/pull";

    fn b64(text: &str) -> String {
        STANDARD.encode(text)
    }

    fn image(reference: &str) -> ImageRef {
        ImageRef::parse(reference).unwrap()
    }

    fn data(key: &str, json: &str) -> BTreeMap<String, Vec<u8>> {
        BTreeMap::from([(key.to_owned(), json.as_bytes().to_vec())])
    }

    fn config_json(json: &str) -> BTreeMap<String, Vec<u8>> {
        data(DOCKER_CONFIG_JSON_KEY, json)
    }

    /// A `.dockerconfigjson` with one username/password entry per `(key, username)`.
    fn auths(entries: &[(&str, &str)]) -> BTreeMap<String, Vec<u8>> {
        let auths: Map<String, Value> = entries
            .iter()
            .map(|(key, user)| {
                let entry = serde_json::json!({"username": user, "password": format!("pw-{user}")});
                ((*key).to_owned(), entry)
            })
            .collect();
        config_json(&serde_json::json!({ "auths": auths }).to_string())
    }

    fn add(keyring: &mut Keyring, source: &str, json: &str) -> Result<usize, SecretError> {
        keyring.add_secret(source, DOCKER_CONFIG_JSON_TYPE, &config_json(json))
    }

    fn add_err(secret_type: &str, data: &BTreeMap<String, Vec<u8>>) -> SecretError {
        Keyring::default()
            .add_secret(SOURCE, secret_type, data)
            .unwrap_err()
    }

    /// A keyring with one secret per key, added in order, whose username is the key.
    fn keyring_of(keys: &[&str]) -> Keyring {
        let mut keyring = Keyring::default();
        for (i, key) in keys.iter().enumerate() {
            let added = keyring
                .add_secret(
                    &format!("ns/s{i}"),
                    DOCKER_CONFIG_JSON_TYPE,
                    &auths(&[(key, key)]),
                )
                .unwrap();
            assert_eq!(added, 1, "key {key:?}");
        }
        keyring
    }

    fn users<'a>(keyring: &'a Keyring, reference: &str) -> Vec<&'a str> {
        keyring
            .lookup(&image(reference))
            .into_iter()
            .map(|c| c.username.as_str())
            .collect()
    }

    fn matches(key: &str, reference: &str) -> bool {
        !users(&keyring_of(&[key]), reference).is_empty()
    }

    fn single(json: &str) -> Credential {
        let mut keyring = Keyring::default();
        assert_eq!(add(&mut keyring, SOURCE, json).unwrap(), 1, "{json}");
        keyring.entries[0].credential.clone()
    }

    // ---- Reading secrets ----

    #[test]
    fn dockerconfigjson_username_password() {
        let mut keyring = Keyring::default();
        let json = r#"{"auths": {"ghcr.io": {"username": "u", "password": "p", "email": "e@x"}}}"#;
        assert!(keyring.is_empty());
        assert_eq!(add(&mut keyring, SOURCE, json).unwrap(), 1);
        assert!(!keyring.is_empty());
        assert_eq!(keyring.len(), 1);
        let found = keyring.lookup(&image("ghcr.io/org/app:1"));
        assert_eq!(
            found,
            [&Credential {
                username: "u".into(),
                password: "p".into(),
                identity_token: String::new(),
                registry_token: String::new(),
                server_address: "ghcr.io".into(),
                source: SOURCE.into(),
            }]
        );
    }

    #[test]
    fn dockercfg_entries_are_top_level() {
        let mut keyring = Keyring::default();
        let json = format!(
            r#"{{"https://index.docker.io/v1/": {{"auth": "{}", "email": "e@x"}}, "quay.io": {{"username": "q", "password": "qp"}}}}"#,
            b64("hub:hubpw")
        );
        let added = keyring
            .add_secret(SOURCE, DOCKERCFG_TYPE, &data(DOCKERCFG_KEY, &json))
            .unwrap();
        assert_eq!(added, 2);
        let hub = keyring.lookup(&image("nginx"));
        assert_eq!(hub.len(), 1);
        assert_eq!(
            (hub[0].username.as_str(), hub[0].password.as_str()),
            ("hub", "hubpw")
        );
        assert_eq!(hub[0].server_address, "https://index.docker.io/v1/");
        assert_eq!(users(&keyring, "quay.io/org/app"), ["q"]);
    }

    #[test]
    fn dockercfg_with_auths_wrapper_has_no_usable_entries() {
        // `auths` is read as a registry key whose "fields" are registries: no credential.
        let json = r#"{"auths": {"ghcr.io": {"username": "u", "password": "p"}}}"#;
        let added = Keyring::default()
            .add_secret(SOURCE, DOCKERCFG_TYPE, &data(DOCKERCFG_KEY, json))
            .unwrap();
        assert_eq!(added, 0);
    }

    #[test]
    fn auth_only_entry_fills_username_and_password() {
        let c = single(&format!(
            r#"{{"auths": {{"r.io": {{"auth": "{}"}}}}}}"#,
            b64("alice:s3cret")
        ));
        assert_eq!(
            (c.username.as_str(), c.password.as_str()),
            ("alice", "s3cret")
        );
    }

    #[test]
    fn auth_splits_at_the_first_colon() {
        let c = single(&format!(
            r#"{{"auths": {{"r.io": {{"auth": "{}"}}}}}}"#,
            b64("bob:a:b:c")
        ));
        assert_eq!((c.username.as_str(), c.password.as_str()), ("bob", "a:b:c"));
    }

    #[test]
    fn auth_with_empty_user_or_password() {
        let c = single(&format!(
            r#"{{"auths": {{"r.io": {{"auth": "{}"}}}}}}"#,
            b64(":tok")
        ));
        assert_eq!((c.username.as_str(), c.password.as_str()), ("", "tok"));
        let c = single(&format!(
            r#"{{"auths": {{"r.io": {{"auth": "{}"}}}}}}"#,
            b64("u:")
        ));
        assert_eq!((c.username.as_str(), c.password.as_str()), ("u", ""));
    }

    #[test]
    fn auth_only_fills_empty_fields() {
        let both = format!(
            r#"{{"auths": {{"r.io": {{"username": "u", "password": "p", "auth": "{}"}}}}}}"#,
            b64("other:otherpw")
        );
        let c = single(&both);
        assert_eq!((c.username.as_str(), c.password.as_str()), ("u", "p"));

        let user_only = format!(
            r#"{{"auths": {{"r.io": {{"username": "u", "auth": "{}"}}}}}}"#,
            b64("u:frompw")
        );
        let c = single(&user_only);
        assert_eq!((c.username.as_str(), c.password.as_str()), ("u", "frompw"));

        let password_only = format!(
            r#"{{"auths": {{"r.io": {{"password": "p", "auth": "{}"}}}}}}"#,
            b64("fromuser:x")
        );
        let c = single(&password_only);
        assert_eq!(
            (c.username.as_str(), c.password.as_str()),
            ("fromuser", "p")
        );
    }

    #[test]
    fn auth_tolerates_line_breaks_like_go() {
        let encoded = b64("user:a-rather-long-password-that-wraps");
        let wrapped = format!("{}\\r\\n{}\\n", &encoded[..20], &encoded[20..]);
        let c = single(&format!(
            r#"{{"auths": {{"r.io": {{"auth": "{wrapped}"}}}}}}"#
        ));
        assert_eq!(c.password, "a-rather-long-password-that-wraps");
    }

    #[test]
    fn tokens_alone_make_a_credential() {
        let c = single(r#"{"auths": {"r.io": {"identitytoken": "idt"}}}"#);
        assert_eq!(c.identity_token, "idt");
        assert!(c.username.is_empty() && c.password.is_empty() && c.registry_token.is_empty());
        let c = single(r#"{"auths": {"r.io": {"registrytoken": "rt"}}}"#);
        assert_eq!(c.registry_token, "rt");
        let c = single(
            r#"{"auths": {"r.io": {"username": "u", "identitytoken": "idt", "registrytoken": "rt"}}}"#,
        );
        assert_eq!(
            (
                c.username.as_str(),
                c.identity_token.as_str(),
                c.registry_token.as_str()
            ),
            ("u", "idt", "rt")
        );
    }

    #[test]
    fn a_username_or_password_alone_is_kept() {
        assert_eq!(
            single(r#"{"auths": {"r.io": {"username": "u"}}}"#).username,
            "u"
        );
        assert_eq!(
            single(r#"{"auths": {"r.io": {"password": "p"}}}"#).password,
            "p"
        );
    }

    #[test]
    fn entries_without_credentials_are_skipped() {
        let mut keyring = Keyring::default();
        let json = r#"{"auths": {
            "a.io": {},
            "b.io": {"email": "e@x"},
            "c.io": {"username": "", "password": "", "auth": "", "identitytoken": null},
            "d.io": null,
            "e.io": {"username": "u", "password": "p"}
        }}"#;
        assert_eq!(add(&mut keyring, SOURCE, json).unwrap(), 1);
        assert!(keyring.lookup(&image("a.io/x")).is_empty());
        assert!(keyring.lookup(&image("d.io/x")).is_empty());
        assert_eq!(users(&keyring, "e.io/x"), ["u"]);
    }

    #[test]
    fn a_secret_of_only_empty_entries_leaves_the_keyring_empty() {
        let mut keyring = Keyring::default();
        assert_eq!(
            add(&mut keyring, SOURCE, r#"{"auths": {"a.io": {}}}"#).unwrap(),
            0
        );
        assert!(keyring.is_empty());
    }

    #[test]
    fn missing_or_null_auths_adds_nothing() {
        let mut keyring = Keyring::default();
        for json in [
            "{}",
            r#"{"auths": null}"#,
            r#"{"auths": {}}"#,
            r#"{"credsStore": "desktop"}"#,
            r#"{"credHelpers": {"ghcr.io": "gh"}, "HttpHeaders": {"X": "y"}}"#,
        ] {
            assert_eq!(add(&mut keyring, SOURCE, json).unwrap(), 0, "{json}");
        }
        assert!(keyring.is_empty());
    }

    #[test]
    fn field_names_match_case_insensitively_like_go() {
        let json = format!(
            r#"{{"Auths": {{"r.io": {{"Username": "U", "PASSWORD": "P", "IdentityToken": "I", "RegistryToken": "R"}}, "s.io": {{"Auth": "{}"}}}}}}"#,
            b64("a:b")
        );
        let mut keyring = Keyring::default();
        assert_eq!(add(&mut keyring, SOURCE, &json).unwrap(), 2);
        let c = keyring.lookup(&image("r.io/x"))[0];
        assert_eq!(
            [
                &c.username,
                &c.password,
                &c.identity_token,
                &c.registry_token
            ],
            ["U", "P", "I", "R"]
        );
        assert_eq!(users(&keyring, "s.io/x"), ["a"]);
    }

    #[test]
    fn exact_field_name_wins_over_case_variant() {
        let c = single(r#"{"auths": {"r.io": {"USERNAME": "upper", "username": "exact"}}}"#);
        assert_eq!(c.username, "exact");
    }

    #[test]
    fn unknown_fields_are_ignored() {
        let c = single(
            r#"{"auths": {"r.io": {"username": "u", "serveraddress": "x", "extra": [1, 2], "email": 5}}}"#,
        );
        assert_eq!(c.username, "u");
    }

    #[test]
    fn entries_of_one_secret_keep_key_order_for_equal_keys() {
        // Two keys normalizing to the same pattern: ties keep key (insertion) order.
        let json = r#"{"auths": {
            "https://index.docker.io/v1/": {"username": "b-url"},
            "docker.io": {"username": "a-host"}
        }}"#;
        let mut keyring = Keyring::default();
        assert_eq!(add(&mut keyring, SOURCE, json).unwrap(), 2);
        assert_eq!(users(&keyring, "nginx"), ["a-host", "b-url"]);
    }

    #[test]
    fn every_credential_records_its_source_and_key() {
        let mut keyring = Keyring::default();
        add(
            &mut keyring,
            "team-a/creds",
            r#"{"auths": {"HTTPS://GHCR.IO/": {"username": "a"}}}"#,
        )
        .unwrap();
        add(
            &mut keyring,
            "team-b/creds",
            r#"{"auths": {"ghcr.io/org": {"username": "b"}}}"#,
        )
        .unwrap();
        let found = keyring.lookup(&image("ghcr.io/org/app"));
        let seen: Vec<(&str, &str)> = found
            .iter()
            .map(|c| (c.source.as_str(), c.server_address.as_str()))
            .collect();
        assert_eq!(
            seen,
            [
                ("team-b/creds", "ghcr.io/org"),
                ("team-a/creds", "HTTPS://GHCR.IO/")
            ]
        );
    }

    // ---- Errors ----

    #[test]
    fn unknown_type_is_an_error_naming_secret_and_type() {
        for secret_type in [
            "Opaque",
            "",
            "kubernetes.io/DockerConfigJson",
            "kubernetes.io/tls",
        ] {
            let err = add_err(secret_type, &config_json(r#"{"auths": {}}"#));
            assert_eq!(
                err,
                SecretError::UnsupportedType {
                    secret: SOURCE.into(),
                    secret_type: secret_type.into()
                }
            );
            let message = err.to_string();
            assert!(message.contains(SOURCE), "{message}");
            assert!(message.contains(&format!("{secret_type:?}")), "{message}");
            assert!(message.contains(DOCKER_CONFIG_JSON_TYPE), "{message}");
            assert!(message.contains(DOCKERCFG_TYPE), "{message}");
        }
    }

    #[test]
    fn unknown_type_message_is_cut() {
        let long = "x".repeat(1000);
        let message = add_err(&long, &BTreeMap::new()).to_string();
        assert!(message.len() < 400, "{message}");
        assert!(message.contains('…'));
    }

    #[test]
    fn missing_data_key_is_an_error_naming_the_key() {
        // A dockercfg key in a dockerconfigjson secret does not count.
        let err = add_err(DOCKER_CONFIG_JSON_TYPE, &data(DOCKERCFG_KEY, "{}"));
        assert_eq!(
            err.to_string(),
            "secret ns/pull of type kubernetes.io/dockerconfigjson has no .dockerconfigjson data key"
        );
        let err = add_err(DOCKERCFG_TYPE, &config_json("{}"));
        assert_eq!(
            err.to_string(),
            "secret ns/pull of type kubernetes.io/dockercfg has no .dockercfg data key"
        );
        let err = add_err(DOCKERCFG_TYPE, &BTreeMap::new());
        assert!(matches!(
            err,
            SecretError::MissingData {
                data_key: DOCKERCFG_KEY,
                ..
            }
        ));
    }

    #[test]
    fn invalid_json_carries_serde_message() {
        for bad in ["", "{", "{\"auths\": }", "not json", "\u{feff}{}"] {
            let err = add_err(DOCKER_CONFIG_JSON_TYPE, &config_json(bad));
            let SecretError::InvalidJson { ref message, .. } = err else {
                panic!("{bad:?}: {err:?}");
            };
            assert!(message.contains("line 1 column"), "{message}");
            let text = err.to_string();
            assert!(
                text.starts_with("secret ns/pull: .dockerconfigjson is not valid JSON: "),
                "{text}"
            );
        }
        let err = add_err(DOCKERCFG_TYPE, &data(DOCKERCFG_KEY, "[1,"));
        assert!(
            err.to_string()
                .starts_with("secret ns/pull: .dockercfg is not valid JSON: ")
        );
    }

    #[test]
    fn invalid_utf8_data_is_invalid_json() {
        let data = BTreeMap::from([(DOCKER_CONFIG_JSON_KEY.to_owned(), vec![b'"', 0xff, b'"'])]);
        let err = add_err(DOCKER_CONFIG_JSON_TYPE, &data);
        assert!(matches!(err, SecretError::InvalidJson { .. }), "{err:?}");
    }

    #[test]
    fn wrong_shapes_are_errors_that_do_not_show_values() {
        let cases = [
            (r#"["hunter2"]"#, "the top level is an array, not an object"),
            (r#""hunter2""#, "the top level is a string, not an object"),
            (
                r#"{"auths": "hunter2"}"#,
                "\"auths\" is a string, not an object",
            ),
            (
                r#"{"auths": ["hunter2"]}"#,
                "\"auths\" is an array, not an object",
            ),
            (
                r#"{"auths": {"r.io": "hunter2"}}"#,
                "registry \"r.io\" is a string, not an object",
            ),
            (
                r#"{"auths": {"r.io": true}}"#,
                "registry \"r.io\" is a boolean, not an object",
            ),
            (
                r#"{"auths": {"r.io": {"username": "u", "password": 12345}}}"#,
                "field \"password\" of registry \"r.io\" is a number, not a string",
            ),
            (
                r#"{"auths": {"r.io": {"auth": ["hunter2"]}}}"#,
                "field \"auth\" of registry \"r.io\" is an array, not a string",
            ),
            (
                r#"{"auths": {"r.io": {"identitytoken": {"t": "hunter2"}}}}"#,
                "field \"identitytoken\" of registry \"r.io\" is an object, not a string",
            ),
            (
                r#"{"auths": {"r.io": {"registrytoken": false}}}"#,
                "field \"registrytoken\" of registry \"r.io\" is a boolean, not a string",
            ),
        ];
        for (json, problem) in cases {
            let err = add_err(DOCKER_CONFIG_JSON_TYPE, &config_json(json));
            let message = err.to_string();
            assert_eq!(
                message,
                format!("secret ns/pull: .dockerconfigjson: {problem}"),
                "{json}"
            );
            assert!(
                !message.contains("hunter2") && !message.contains("12345"),
                "{message}"
            );
        }
    }

    #[test]
    fn dockercfg_shape_errors_name_the_dockercfg_key() {
        let err = add_err(DOCKERCFG_TYPE, &data(DOCKERCFG_KEY, r#"{"r.io": 1}"#));
        assert_eq!(
            err.to_string(),
            "secret ns/pull: .dockercfg: registry \"r.io\" is a number, not an object"
        );
    }

    #[test]
    fn auth_not_base64_is_an_error_without_the_secret() {
        // A common mistake: the plain `user:password` instead of its base64.
        let json = r#"{"auths": {"ghcr.io": {"auth": "alice:hunter2"}}}"#;
        let err = add_err(DOCKER_CONFIG_JSON_TYPE, &config_json(json));
        assert_eq!(
            err,
            SecretError::AuthNotBase64 {
                secret: SOURCE.into(),
                registry: "ghcr.io".into(),
                problem: "invalid character at offset 5".into(),
            }
        );
        let message = err.to_string();
        assert_eq!(
            message,
            "secret ns/pull: the auth of registry \"ghcr.io\" is not valid base64 (invalid character at offset 5); it must be base64 of user:password"
        );
        assert!(!message.contains("hunter2") && !message.contains("alice"));
        // base64's own message would name the byte (58 is ':').
        assert!(!message.contains("58"));
    }

    #[test]
    fn auth_base64_problems_are_described() {
        let problem = |auth: &str| {
            let json = format!(r#"{{"auths": {{"r.io": {{"auth": "{auth}"}}}}}}"#);
            match add_err(DOCKER_CONFIG_JSON_TYPE, &config_json(&json)) {
                SecretError::AuthNotBase64 { problem, .. } => problem,
                other => panic!("{auth}: {other:?}"),
            }
        };
        assert_eq!(problem("YWJj!"), "invalid character at offset 4");
        assert_eq!(problem("YQ"), "invalid padding");
        assert_eq!(problem("YWJjZ"), "invalid length");
        assert_eq!(problem("YR=="), "invalid last character at offset 1");
        assert_eq!(problem("YQ==YQ=="), "invalid character at offset 2");
    }

    #[test]
    fn auth_without_colon_is_an_error() {
        let json = format!(
            r#"{{"auths": {{"r.io": {{"auth": "{}"}}}}}}"#,
            b64("justatoken")
        );
        let err = add_err(DOCKER_CONFIG_JSON_TYPE, &config_json(&json));
        assert_eq!(
            err,
            SecretError::AuthWithoutColon {
                secret: SOURCE.into(),
                registry: "r.io".into()
            }
        );
        let message = err.to_string();
        assert!(
            message.contains("ns/pull") && message.contains("\"r.io\""),
            "{message}"
        );
        assert!(message.contains("no ':'"), "{message}");
        assert!(!message.contains("justatoken"));
    }

    #[test]
    fn auth_not_utf8_is_an_error() {
        let encoded = STANDARD.encode([b'u', b':', 0xff, 0xfe]);
        let json = format!(r#"{{"auths": {{"r.io": {{"auth": "{encoded}"}}}}}}"#);
        let err = add_err(DOCKER_CONFIG_JSON_TYPE, &config_json(&json));
        assert_eq!(
            err,
            SecretError::AuthNotUtf8 {
                secret: SOURCE.into(),
                registry: "r.io".into()
            }
        );
        assert!(err.to_string().contains("UTF-8"));
    }

    #[test]
    fn a_bad_auth_fails_even_when_username_and_password_are_set() {
        let json = r#"{"auths": {"r.io": {"username": "u", "password": "p", "auth": "%%%"}}}"#;
        let err = add_err(DOCKER_CONFIG_JSON_TYPE, &config_json(json));
        assert!(matches!(err, SecretError::AuthNotBase64 { .. }), "{err:?}");
    }

    #[test]
    fn a_failing_secret_adds_nothing() {
        let mut keyring = keyring_of(&["ghcr.io"]);
        let json = format!(
            r#"{{"auths": {{"a.io": {{"username": "ok"}}, "z.io": {{"auth": "{}"}}}}}}"#,
            b64("nocolon")
        );
        assert!(add(&mut keyring, SOURCE, &json).is_err());
        assert_eq!(keyring.len(), 1);
        assert!(keyring.lookup(&image("a.io/x")).is_empty());
        assert_eq!(users(&keyring, "ghcr.io/x"), ["ghcr.io"]);
    }

    #[test]
    fn long_registry_keys_are_cut_in_messages() {
        let key = format!("{}.io", "r".repeat(5000));
        let json = format!(r#"{{"auths": {{"{key}": 1}}}}"#);
        let message = add_err(DOCKER_CONFIG_JSON_TYPE, &config_json(&json)).to_string();
        assert!(message.len() < 400, "{} chars", message.len());
        assert!(
            message.contains("\"… is a number, not an object"),
            "{message}"
        );
    }

    #[test]
    fn control_characters_in_keys_are_escaped_in_messages() {
        let json = r#"{"auths": {"r.io\n\u001b[31m": 1}}"#;
        let message = add_err(DOCKER_CONFIG_JSON_TYPE, &config_json(json)).to_string();
        assert!(
            !message.contains('\n') && !message.contains('\u{1b}'),
            "{message}"
        );
        assert!(message.contains("\\n"), "{message}");
    }

    // ---- Debug never shows secrets ----

    #[test]
    fn debug_redacts_password_and_tokens() {
        let mut keyring = Keyring::default();
        let json = r#"{"auths": {"r.io": {"username": "visible-user", "password": "hunter2", "identitytoken": "id-tok-1", "registrytoken": "reg-tok-1"}}}"#;
        add(&mut keyring, SOURCE, json).unwrap();
        let credential = keyring.lookup(&image("r.io/x"))[0];
        for text in [
            format!("{credential:?}"),
            format!("{credential:#?}"),
            format!("{keyring:?}"),
            format!("{keyring:#?}"),
        ] {
            assert!(text.contains("visible-user"), "{text}");
            assert!(text.contains("<redacted>"), "{text}");
            for secret in ["hunter2", "id-tok-1", "reg-tok-1"] {
                assert!(!text.contains(secret), "{text}");
            }
        }
    }

    #[test]
    fn debug_shows_which_secrets_are_unset() {
        let c = single(r#"{"auths": {"r.io": {"username": "u"}}}"#);
        let text = format!("{c:?}");
        assert!(text.contains(r#"password: """#), "{text}");
        assert!(!text.contains("<redacted>"), "{text}");
    }

    #[test]
    fn errors_do_not_show_credentials_from_other_entries() {
        let json = r#"{"auths": {"a.io": {"username": "u", "password": "hunter2"}, "b.io": {"username": 7}}}"#;
        let err = add_err(DOCKER_CONFIG_JSON_TYPE, &config_json(json));
        assert!(!format!("{err} {err:?}").contains("hunter2"));
    }

    // ---- Matching: hosts, schemes, case ----

    #[test]
    fn host_key_matches_its_registry_only() {
        assert!(matches("ghcr.io", "ghcr.io/org/app"));
        assert!(matches("ghcr.io", "ghcr.io/app:v1"));
        assert!(matches(
            "ghcr.io",
            "ghcr.io/org/app@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
        ));
        assert!(!matches("ghcr.io", "quay.io/org/app"));
        assert!(!matches("ghcr.io", "gcr.io/org/app"));
        assert!(!matches("ghcr.io", "eu.ghcr.io/org/app"));
        assert!(!matches("ghcr.io", "nginx"));
        assert!(!matches("gcr.io", "ghcr.io/org/app"));
    }

    #[test]
    fn scheme_is_ignored() {
        for key in [
            "https://ghcr.io",
            "http://ghcr.io",
            "https://ghcr.io/",
            "HTTPS://ghcr.io",
            "oci+https://ghcr.io",
            "  https://ghcr.io/  ",
        ] {
            assert!(matches(key, "ghcr.io/org/app"), "{key}");
        }
        assert!(matches("http://127.0.0.1:5000", "127.0.0.1:5000/x"));
        assert!(matches("https://quay.io/org/", "quay.io/org/app"));
        assert!(!matches("https://quay.io/org/", "quay.io/other/app"));
    }

    #[test]
    fn query_and_fragment_are_ignored() {
        assert!(matches("https://ghcr.io/?x=1", "ghcr.io/a"));
        assert!(matches("https://ghcr.io#frag", "ghcr.io/a"));
        assert!(matches("https://quay.io/org?x=1", "quay.io/org/a"));
        assert!(!matches("https://quay.io/org?x=1", "quay.io/b/a"));
    }

    #[test]
    fn host_comparison_ignores_case() {
        assert!(matches("GHCR.IO", "ghcr.io/org/app"));
        assert!(matches("Ghcr.Io/org", "ghcr.io/org/app"));
        assert!(matches("ghcr.io", "GHCR.IO/org/app"));
        assert!(matches("*.EXAMPLE.com", "a.example.COM/x"));
        assert!(matches("DOCKER.IO", "nginx"));
        assert!(matches("Registry.Local:5000", "registry.local:5000/x"));
    }

    #[test]
    fn paths_compare_case_sensitively() {
        // Repositories are lowercase; a key with an uppercase path names no repository.
        assert!(!matches("quay.io/Org", "quay.io/org/app"));
    }

    #[test]
    fn trailing_slash_is_ignored() {
        assert!(matches("ghcr.io/", "ghcr.io/a"));
        assert!(matches("quay.io/org/", "quay.io/org/app"));
        assert!(matches("quay.io/org//", "quay.io/org/app"));
        assert!(!matches("quay.io/org/", "quay.io/organisation/app"));
    }

    #[test]
    fn localhost_and_ip_registries() {
        assert!(matches("localhost:5000", "localhost:5000/a"));
        assert!(matches("localhost", "localhost/a"));
        assert!(!matches("localhost", "localhost:5000/a"));
        assert!(matches("10.0.0.1", "10.0.0.1/a"));
        assert!(!matches("10.0.0.1", "10.0.0.2/a"));
    }

    // ---- Matching: ports ----

    #[test]
    fn port_must_match_exactly() {
        assert!(matches("127.0.0.1:5000", "127.0.0.1:5000/x"));
        assert!(matches("127.0.0.1:5000/", "127.0.0.1:5000/x/y:tag"));
        assert!(!matches("127.0.0.1", "127.0.0.1:5000/x"));
        assert!(!matches("127.0.0.1:5000", "127.0.0.1:5001/x"));
        assert!(!matches("127.0.0.1:5000", "127.0.0.1/x"));
        assert!(!matches("ghcr.io:443", "ghcr.io/x"));
        assert!(!matches("ghcr.io", "ghcr.io:443/x"));
        assert!(!matches("127.0.0.1:05000", "127.0.0.1:5000/x"));
    }

    #[test]
    fn port_with_path_prefix() {
        assert!(matches(
            "registry.local:5000/team",
            "registry.local:5000/team/app"
        ));
        assert!(!matches(
            "registry.local:5000/team",
            "registry.local:5000/other/app"
        ));
        assert!(!matches(
            "registry.local:5000/team",
            "registry.local/team/app"
        ));
    }

    // ---- Matching: path prefixes ----

    #[test]
    fn path_prefix_matches_whole_segments() {
        assert!(matches("quay.io/org", "quay.io/org/app"));
        assert!(matches("quay.io/org", "quay.io/org/team/app"));
        assert!(matches("quay.io/org", "quay.io/org"));
        assert!(matches("quay.io/org/app", "quay.io/org/app:1.0"));
        assert!(!matches("quay.io/org", "quay.io/organisation/app"));
        assert!(!matches("quay.io/org", "quay.io/or/app"));
        assert!(!matches("quay.io/org/app", "quay.io/org"));
        assert!(!matches("quay.io/org/app", "quay.io/org/application"));
        assert!(!matches("quay.io/org", "ghcr.io/org/app"));
    }

    #[test]
    fn v1_and_v2_path_segments_are_api_versions() {
        assert!(matches("https://ghcr.io/v2/", "ghcr.io/any/app"));
        assert!(matches("https://ghcr.io/v1/", "ghcr.io/any/app"));
        assert!(matches("ghcr.io/v2", "ghcr.io/any/app"));
        assert!(matches("https://quay.io/v2/org", "quay.io/org/app"));
        assert!(!matches("https://quay.io/v2/org", "quay.io/other/app"));
        // Only a leading segment is a version.
        assert!(matches("quay.io/org/v2", "quay.io/org/v2/app"));
        assert!(!matches("quay.io/org/v2", "quay.io/org/app"));
    }

    // ---- Matching: wildcards ----

    #[test]
    fn wildcard_matches_one_label() {
        assert!(matches("*.example.com", "a.example.com/x"));
        assert!(matches("*.example.com", "registry-1.example.com/x/y"));
        assert!(!matches("*.example.com", "a.b.example.com/x"));
        assert!(!matches("*.example.com", "example.com/x"));
        assert!(!matches("*.example.com", "a.example.org/x"));
        assert!(!matches("*.example.com", "a.example.com:5000/x"));
    }

    #[test]
    fn wildcard_within_labels() {
        assert!(matches("registry*.example.com", "registry.example.com/x"));
        assert!(matches(
            "registry*.example.com",
            "registry-eu.example.com/x"
        ));
        assert!(!matches("registry*.example.com", "mirror.example.com/x"));
        assert!(matches("*-docker.pkg.dev", "europe-docker.pkg.dev/p/r/i"));
        assert!(!matches("*-docker.pkg.dev", "docker.pkg.dev/p/r/i"));
        assert!(matches("a*b*c.io", "axxbyyc.io/x"));
        assert!(matches("a*b*c.io", "abc.io/x"));
        assert!(!matches("a*b*c.io", "acb.io/x"));
        assert!(matches("**.io", "x.io/y"));
        assert!(matches("*.*.io", "a.b.io/y"));
        assert!(!matches("*.*.io", "b.io/y"));
    }

    #[test]
    fn wildcard_in_every_position() {
        assert!(matches("*.example.*", "a.example.com/x"));
        assert!(matches("a.*.com", "a.example.com/x"));
        assert!(matches("*", "localhost/x"));
        assert!(!matches("*", "ghcr.io/x"));
        assert!(matches("*.*", "ghcr.io/x"));
    }

    #[test]
    fn wildcard_with_port_and_path() {
        assert!(matches("*.example.com:5000", "a.example.com:5000/x"));
        assert!(!matches("*.example.com:5000", "a.example.com/x"));
        assert!(!matches("*.example.com:5000", "a.example.com:5001/x"));
        assert!(matches(
            "https://*.example.com/team/",
            "a.example.com/team/app"
        ));
        assert!(!matches(
            "https://*.example.com/team/",
            "a.example.com/teams/app"
        ));
    }

    #[test]
    fn wildcard_does_not_reach_docker_hub_by_alias() {
        // Images on Docker Hub are matched as `docker.io`, two labels.
        assert!(!matches("*.docker.io", "nginx"));
        assert!(matches("*.io", "nginx"));
    }

    #[test]
    fn glob_match_cases() {
        let m = |p: &str, t: &str| glob_match(p.as_bytes(), t.as_bytes());
        assert!(m("", ""));
        assert!(m("*", ""));
        assert!(!m("", "a"));
        assert!(m("a*", "a"));
        assert!(m("*a", "aaa"));
        assert!(!m("*a", "aab"));
        assert!(m("*ab*ab", "abxabab"));
        assert!(!m("a*a", "a"));
        assert!(m(&"*a".repeat(30), &"a".repeat(100)));
        assert!(!m(&format!("{}b", "*a".repeat(30)), &"a".repeat(200)));
    }

    // ---- Matching: Docker Hub ----

    #[test]
    fn docker_hub_aliases_match_every_spelling_of_a_hub_image() {
        let keys = [
            "docker.io",
            "index.docker.io",
            "registry-1.docker.io",
            "https://index.docker.io/v1/",
            "https://index.docker.io/v1",
            "http://index.docker.io/v1/",
            "https://registry-1.docker.io/v2/",
            "https://docker.io",
            "Index.Docker.IO",
        ];
        let images = [
            "nginx",
            "nginx:1.25",
            "library/nginx",
            "docker.io/library/nginx",
            "docker.io/nginx",
            "index.docker.io/library/nginx",
            "registry-1.docker.io/library/nginx",
            "user/app",
            "docker.io/user/app:tag",
        ];
        for key in keys {
            for reference in images {
                assert!(matches(key, reference), "{key} should match {reference}");
            }
            for reference in [
                "ghcr.io/library/nginx",
                "quay.io/user/app",
                "docker.com/x",
                "localhost:5000/nginx",
            ] {
                assert!(
                    !matches(key, reference),
                    "{key} should not match {reference}"
                );
            }
        }
    }

    #[test]
    fn docker_hub_alias_with_port_is_not_docker_hub() {
        assert!(!matches("docker.io:443", "nginx"));
        assert!(!matches("index.docker.io:443", "nginx"));
        assert!(matches(
            "index.docker.io:443",
            "index.docker.io:443/library/nginx"
        ));
    }

    #[test]
    fn docker_hub_path_prefixes_use_the_normalized_repository() {
        assert!(matches("docker.io/library", "nginx"));
        assert!(matches(
            "https://index.docker.io/v1/library",
            "docker.io/library/nginx"
        ));
        assert!(!matches("docker.io/library", "user/app"));
        assert!(matches("docker.io/user", "user/app"));
        assert!(matches("index.docker.io/user/", "docker.io/user/app"));
        assert!(!matches("docker.io/user", "other/app"));
        assert!(!matches("docker.io/user", "username/app"));
        // `nginx` is `library/nginx`: a key for `docker.io/nginx` is the `nginx` namespace.
        assert!(!matches("docker.io/nginx", "nginx"));
        assert!(matches("docker.io/nginx", "nginx/unit"));
    }

    #[test]
    fn docker_io_lookalikes_are_not_docker_hub() {
        assert!(!matches("docker.com", "nginx"));
        assert!(!matches("hub.docker.com", "nginx"));
        assert!(!matches("registry-2.docker.io", "nginx"));
        assert!(!matches("io", "nginx"));
    }

    // ---- Unusable keys ----

    #[test]
    fn unusable_keys_are_skipped() {
        let json = r#"{"auths": {
            "": {"username": "empty"},
            "   ": {"username": "blank"},
            "https://": {"username": "scheme-only"},
            "/org": {"username": "path-only"},
            "ghcr.io:": {"username": "empty-port"},
            "ghcr.io:abc": {"username": "named-port"},
            "ghcr.io:5000:6000": {"username": "two-ports"},
            "user@ghcr.io": {"username": "userinfo"},
            "a..b": {"username": "empty-label"},
            ".ghcr.io": {"username": "leading-dot"},
            "ghcr.io.": {"username": "trailing-dot"},
            "[::1]:5000": {"username": "ipv6"},
            "bad host.io": {"username": "space"},
            "b\u00fccher.de": {"username": "unicode"},
            "ghcr.io": {"username": "good"}
        }}"#;
        let mut keyring = Keyring::default();
        assert_eq!(add(&mut keyring, SOURCE, json).unwrap(), 1);
        assert_eq!(users(&keyring, "ghcr.io/x"), ["good"]);
    }

    #[test]
    fn unusable_keys_still_have_their_auth_checked() {
        let json = r#"{"auths": {"": {"auth": "not base64!"}}}"#;
        let err = add_err(DOCKER_CONFIG_JSON_TYPE, &config_json(json));
        assert!(
            matches!(err, SecretError::AuthNotBase64 { ref registry, .. } if registry.is_empty())
        );
    }

    #[test]
    fn pattern_parse_details() {
        let p = RegistryPattern::parse("HTTPS://Index.Docker.IO/v1/").unwrap();
        assert_eq!(
            p,
            RegistryPattern {
                labels: vec!["docker".into(), "io".into()],
                port: None,
                path: vec![]
            }
        );
        let p = RegistryPattern::parse("http://Reg.Local:5000/a/b/").unwrap();
        assert_eq!(p.labels, ["reg", "local"]);
        assert_eq!(p.port.as_deref(), Some("5000"));
        assert_eq!(p.path, ["a", "b"]);
        // Not a scheme: `://` preceded by something that is not one.
        assert_eq!(RegistryPattern::parse("1http://x.io"), None);
        assert_eq!(
            RegistryPattern::parse("ghcr.io/a://b").unwrap().path,
            ["a:", "b"]
        );
    }

    // ---- Several secrets, ordering, duplicates ----

    #[test]
    fn all_secrets_for_a_registry_are_returned_in_insertion_order() {
        let keyring = keyring_of(&["ghcr.io", "https://ghcr.io", "GHCR.io/", "quay.io"]);
        assert_eq!(
            users(&keyring, "ghcr.io/a/b"),
            ["ghcr.io", "https://ghcr.io", "GHCR.io/"]
        );
        assert_eq!(users(&keyring, "quay.io/a/b"), ["quay.io"]);
        assert!(users(&keyring, "gcr.io/a/b").is_empty());
    }

    #[test]
    fn longer_path_prefix_comes_first() {
        let keyring = keyring_of(&[
            "quay.io",
            "quay.io/org",
            "quay.io/org/team",
            "quay.io/other",
        ]);
        assert_eq!(
            users(&keyring, "quay.io/org/team/app"),
            ["quay.io/org/team", "quay.io/org", "quay.io"]
        );
        assert_eq!(
            users(&keyring, "quay.io/org/app"),
            ["quay.io/org", "quay.io"]
        );
        assert_eq!(
            users(&keyring, "quay.io/other/app"),
            ["quay.io/other", "quay.io"]
        );
        assert_eq!(users(&keyring, "quay.io/x"), ["quay.io"]);
    }

    #[test]
    fn exact_host_comes_before_wildcards() {
        let keyring = keyring_of(&[
            "*.example.com",
            "*",
            "a*.example.com",
            "a.example.com",
            "*.*.*",
        ]);
        assert_eq!(
            users(&keyring, "a.example.com/x"),
            ["a.example.com", "a*.example.com", "*.example.com", "*.*.*"]
        );
        assert_eq!(
            users(&keyring, "b.example.com/x"),
            ["*.example.com", "*.*.*"]
        );
        assert_eq!(users(&keyring, "localhost/x"), ["*"]);
    }

    #[test]
    fn path_prefix_outranks_exact_host() {
        let keyring = keyring_of(&["a.example.com", "*.example.com/team"]);
        assert_eq!(
            users(&keyring, "a.example.com/team/x"),
            ["*.example.com/team", "a.example.com"]
        );
        assert_eq!(users(&keyring, "a.example.com/other/x"), ["a.example.com"]);
    }

    #[test]
    fn docker_hub_aliases_tie_and_keep_insertion_order() {
        let keyring = keyring_of(&[
            "https://index.docker.io/v1/",
            "docker.io",
            "registry-1.docker.io",
            "docker.io/library",
        ]);
        assert_eq!(
            users(&keyring, "nginx"),
            [
                "docker.io/library",
                "https://index.docker.io/v1/",
                "docker.io",
                "registry-1.docker.io"
            ]
        );
        assert_eq!(
            users(&keyring, "user/app"),
            [
                "https://index.docker.io/v1/",
                "docker.io",
                "registry-1.docker.io"
            ]
        );
    }

    #[test]
    fn identical_credentials_are_returned_once_most_specific_first() {
        let mut keyring = Keyring::default();
        let same = r#"{"username": "u", "password": "p"}"#;
        add(
            &mut keyring,
            "ns/a",
            &format!(r#"{{"auths": {{"quay.io": {same}}}}}"#),
        )
        .unwrap();
        add(
            &mut keyring,
            "ns/b",
            &format!(r#"{{"auths": {{"quay.io/org": {same}}}}}"#),
        )
        .unwrap();
        add(
            &mut keyring,
            "ns/c",
            &format!(r#"{{"auths": {{"https://quay.io/": {same}}}}}"#),
        )
        .unwrap();
        let found = keyring.lookup(&image("quay.io/org/app"));
        assert_eq!(found.len(), 1);
        assert_eq!(
            (found[0].source.as_str(), found[0].server_address.as_str()),
            ("ns/b", "quay.io/org")
        );
        let found = keyring.lookup(&image("quay.io/x/app"));
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].source, "ns/a");
        assert_eq!(keyring.len(), 3);
    }

    #[test]
    fn credentials_differing_in_any_secret_field_are_distinct() {
        let mut keyring = Keyring::default();
        for (i, entry) in [
            r#"{"username": "u", "password": "p"}"#,
            r#"{"username": "u", "password": "p2"}"#,
            r#"{"username": "u2", "password": "p"}"#,
            r#"{"username": "u", "password": "p", "identitytoken": "i"}"#,
            r#"{"username": "u", "password": "p", "registrytoken": "r"}"#,
            r#"{"username": "u", "password": "p"}"#,
        ]
        .iter()
        .enumerate()
        {
            add(
                &mut keyring,
                &format!("ns/{i}"),
                &format!(r#"{{"auths": {{"r.io": {entry}}}}}"#),
            )
            .unwrap();
        }
        let sources: Vec<&str> = keyring
            .lookup(&image("r.io/x"))
            .iter()
            .map(|c| c.source.as_str())
            .collect();
        assert_eq!(sources, ["ns/0", "ns/1", "ns/2", "ns/3", "ns/4"]);
    }

    #[test]
    fn auth_and_explicit_fields_giving_the_same_credential_are_duplicates() {
        let mut keyring = Keyring::default();
        add(
            &mut keyring,
            "ns/a",
            r#"{"auths": {"r.io": {"username": "u", "password": "p"}}}"#,
        )
        .unwrap();
        add(
            &mut keyring,
            "ns/b",
            &format!(r#"{{"auths": {{"r.io": {{"auth": "{}"}}}}}}"#, b64("u:p")),
        )
        .unwrap();
        assert_eq!(keyring.lookup(&image("r.io/x")).len(), 1);
    }

    #[test]
    fn one_secret_with_several_registries() {
        let mut keyring = Keyring::default();
        let added = keyring
            .add_secret(
                SOURCE,
                DOCKER_CONFIG_JSON_TYPE,
                &auths(&[
                    ("ghcr.io", "g"),
                    ("quay.io/org", "q"),
                    ("127.0.0.1:5000", "l"),
                    ("docker.io", "d"),
                ]),
            )
            .unwrap();
        assert_eq!(added, 4);
        assert_eq!(users(&keyring, "ghcr.io/x"), ["g"]);
        assert_eq!(users(&keyring, "quay.io/org/x"), ["q"]);
        assert!(users(&keyring, "quay.io/x").is_empty());
        assert_eq!(users(&keyring, "127.0.0.1:5000/x"), ["l"]);
        assert_eq!(users(&keyring, "busybox"), ["d"]);
    }

    #[test]
    fn empty_keyring_finds_nothing() {
        let keyring = Keyring::default();
        assert!(keyring.is_empty());
        assert_eq!(keyring.len(), 0);
        assert!(keyring.lookup(&image("nginx")).is_empty());
    }

    #[test]
    fn clone_is_independent() {
        let mut keyring = keyring_of(&["ghcr.io"]);
        let copy = keyring.clone();
        add(
            &mut keyring,
            "ns/x",
            r#"{"auths": {"ghcr.io": {"username": "second"}}}"#,
        )
        .unwrap();
        assert_eq!(users(&copy, "ghcr.io/a"), ["ghcr.io"]);
        assert_eq!(users(&keyring, "ghcr.io/a"), ["ghcr.io", "second"]);
    }

    // ---- Robustness ----

    #[test]
    fn odd_keys_and_data_never_panic() {
        let keys = [
            "",
            "*",
            "**",
            ":",
            "::",
            "/",
            "//",
            "///",
            "://",
            "http://",
            "http:///",
            "*:*",
            "a:",
            ":5000",
            "*.",
            ".*",
            "[",
            "]",
            "[::1]",
            "[::1]:5000",
            "é.io",
            "ü",
            "\u{0}",
            "a\u{0}b.io",
            "x.io/\u{0}",
            "\u{1F600}.io",
            "x.io:99999999999999999999",
            "?",
            "#",
            "a?b#c",
            "v1",
            "/v1/",
            "https://v1",
            "https:///v1/",
            "x.io/v1",
            "x.io/v2/v1",
            "*.*.*.*.*.*.*.*",
        ];
        let images = [
            "nginx",
            "ghcr.io/a/b",
            "localhost/x",
            "localhost:5000/x",
            "a.b.c.d.e.f.g.h/x",
            "x.io:5000/v1/app",
            "docker.io/user/app",
        ];
        let mut keyring = Keyring::default();
        for key in keys {
            let entry = serde_json::json!({"auths": {key: {"username": key}}}).to_string();
            add(&mut keyring, SOURCE, &entry).unwrap();
            let entry = serde_json::json!({key: {"username": key}}).to_string();
            keyring
                .add_secret(SOURCE, DOCKERCFG_TYPE, &data(DOCKERCFG_KEY, &entry))
                .unwrap();
        }
        for reference in images {
            let _ = keyring.lookup(&image(reference));
        }
        assert!(users(&keyring, "localhost/x").contains(&"*"));
        assert!(users(&keyring, "a.b.c.d.e.f.g.h/x").contains(&"*.*.*.*.*.*.*.*"));
    }

    #[test]
    fn arbitrary_bytes_are_errors_not_panics() {
        let registries = [
            r#"{"r.io": {"auth": "\ud800"}}"#,
            r#"{"r.io": {"auth": "===="}}"#,
            r#"{"r.io": {"auth": "="}}"#,
            r#"{"r.io": {"auth": "\u0000"}}"#,
            r#"{"r.io": {"auth": "YQ==\u0000"}}"#,
        ];
        let mut inputs: Vec<(&str, Vec<u8>)> = Vec::new();
        for garbage in [
            &b"\xff\xfe\xfd"[..],
            b"\0",
            b"null",
            b"1e999999",
            b"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[",
            b"{\"a\": 1, \"a\":",
        ] {
            inputs.push((DOCKER_CONFIG_JSON_TYPE, garbage.to_vec()));
            inputs.push((DOCKERCFG_TYPE, garbage.to_vec()));
        }
        for registries in registries {
            let wrapped = format!(r#"{{"auths": {registries}}}"#);
            inputs.push((DOCKER_CONFIG_JSON_TYPE, wrapped.into_bytes()));
            inputs.push((DOCKERCFG_TYPE, registries.as_bytes().to_vec()));
        }
        for (secret_type, input) in inputs {
            let key = if secret_type == DOCKERCFG_TYPE {
                DOCKERCFG_KEY
            } else {
                DOCKER_CONFIG_JSON_KEY
            };
            let data = BTreeMap::from([(key.to_owned(), input.clone())]);
            let result = Keyring::default().add_secret(SOURCE, secret_type, &data);
            assert!(
                result.is_err(),
                "{secret_type} {:?}: {result:?}",
                String::from_utf8_lossy(&input)
            );
        }
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        let err = add_err(DOCKER_CONFIG_JSON_TYPE, &config_json(&deep));
        assert!(matches!(err, SecretError::InvalidJson { .. }));
    }
}
