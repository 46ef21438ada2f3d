//! Kubelet credential provider plugins (`CredentialProviderConfig`, `kubelet.config.k8s.io/v1`):
//! registry credentials for images no pull secret covers, from the same exec plugins a kubelet
//! uses for ECR, GCR/Artifact Registry or ACR.
//!
//! A node's kubelet may be configured with `--image-credential-provider-config` and
//! `--image-credential-provider-bin-dir`; upstream's kruise-daemon takes the same pair as
//! `--plugin-config-file` and `--plugin-bin-dir`, and so does ours. For every pull the daemon
//! asks each provider whose `matchImages` match the image, in config order, and tries the
//! credentials of their answers after the pull secrets' (`CredentialProviders::credentials`).
//!
//! The behaviour follows the kubelet's (`pkg/credentialprovider/plugin`), rule by rule:
//! - **Config.** Decoded strictly (an unknown field is an error) from YAML or JSON; every
//!   problem is reported at once, each naming its field (`providers[1].matchImages[0]`). A
//!   provider needs a `name` that is a file name in the bin dir (no `/`, no space, not `.` or
//!   `..`, unique), at least one `matchImages` entry, a non-negative `defaultCacheDuration` (Go
//!   duration syntax: `12h`, `90m`, `0s`) and `apiVersion: credentialprovider.kubelet.k8s.io/v1`.
//!   Only `v1` of both APIs is read (the kubelet also reads the older alpha and beta
//!   versions, which carry the same fields).
//! - **Matching.** A `matchImages` pattern matches when the image's host has as many
//!   dot-separated labels and each matches (`*` globs within one label: `*.azurecr.io`,
//!   `app*.k8s.io`), the ports are equal (a pattern without a port does not match an image
//!   whose registry has one, as in the kubelet's code), and the pattern's path is a prefix of
//!   the repository, in whole segments (see `super::auth` for the small ways the shared
//!   matcher is stricter than the kubelet's string prefix).
//! - **Exec.** `<bin-dir>/<name> args…`, with the daemon's environment plus the config's `env`
//!   (which wins), a `CredentialProviderRequest` as JSON on stdin whose `image` is the fully
//!   qualified repository without tag or digest (`docker.io/library/nginx`, as the kubelet
//!   sends it), and a `CredentialProviderResponse` of the same `apiVersion` expected on
//!   stdout. A plugin that runs longer than `EXEC_TIMEOUT` (one minute, the kubelet's) is
//!   killed; a non-zero exit is an error quoting its trimmed stderr.
//! - **Cache.** A response is kept for its `cacheDuration`, else the provider's
//!   `defaultCacheDuration`; zero keeps nothing. `cacheKeyType` says what it covers: `Image`
//!   (this repository), `Registry` (every image of the host) or `Global` (every image the
//!   provider matches). A lookup tries the image, then its registry, then the global entry.
//! - **Concurrency.** Pulls asking one provider for the same image at the same time share one
//!   exec (the kubelet's singleflight): the first starts it, the others wait for its answer.
//!
//! Out of scope: service account tokens for plugins (`tokenAttributes`, kubelet 1.33+). The
//! daemon pulls for no pod, so it has no pod service account to mint a token for; a config
//! using them is refused at start with the provider named, rather than half working.
//!
//! Secrets: a response's passwords never reach a message or a log line; a response that does
//! not decode is reported without its content. A plugin's stderr is quoted in errors, as the
//! kubelet does, so a plugin must not print secrets there.
//!
//! The config, matching, response and cache rules are pure functions, unit tested in
//! `credential_provider/tests.rs`; the exec is the thin async `exec_plugin`.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::FutureExt as _;
use futures::future::{BoxFuture, Shared};
use serde::Deserialize;
use serde_json::Value;
use tokio::io::AsyncWriteExt as _;
use tracing::{debug, info, warn};

use super::auth::{Credential, Keyring, RegistryPattern};
use kruise_rs_api::image::ImageRef;
use kruise_rs_api::quote::Quoted;

/// Where the config is read from when `--plugin-config-file` is not given (upstream's default);
/// a missing file there means no plugins.
pub(crate) const DEFAULT_CONFIG_FILE: &str = "/kruise/CredentialProviderPlugin.yaml";
/// Where the plugin executables are when `--plugin-bin-dir` is not given (upstream's default).
pub(crate) const DEFAULT_BIN_DIR: &str = "/kruise/plugins";
/// The one `apiVersion` of a `CredentialProviderConfig` read.
pub(crate) const CONFIG_API_VERSION: &str = "kubelet.config.k8s.io/v1";
pub(crate) const CONFIG_KIND: &str = "CredentialProviderConfig";
/// The one exec protocol version spoken (a provider's `apiVersion`).
pub(crate) const PROVIDER_API_VERSION: &str = "credentialprovider.kubelet.k8s.io/v1";
const REQUEST_KIND: &str = "CredentialProviderRequest";
const RESPONSE_KIND: &str = "CredentialProviderResponse";
/// How long one plugin run may take before it is killed: the kubelet's catch-all minute.
pub(crate) const EXEC_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest stderr quoted in an error, in characters.
pub(crate) const STDERR_MAX_CHARS: usize = 500;

// --- config ------------------------------------------------------------------------------------

/// Where the daemon finds its plugins (`--plugin-config-file`, `--plugin-bin-dir`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CredentialProviderOptions {
    /// `--plugin-config-file` when given: it must exist and be valid. `None` reads
    /// `DEFAULT_CONFIG_FILE` if it exists, and runs without plugins if it does not.
    pub config_file: Option<PathBuf>,
    /// `--plugin-bin-dir`.
    pub bin_dir: PathBuf,
    /// How long one plugin run may take (`EXEC_TIMEOUT`).
    pub exec_timeout: Duration,
}

impl Default for CredentialProviderOptions {
    fn default() -> Self {
        CredentialProviderOptions {
            config_file: None,
            bin_dir: PathBuf::from(DEFAULT_BIN_DIR),
            exec_timeout: EXEC_TIMEOUT,
        }
    }
}

/// One validated provider of a `CredentialProviderConfig`.
#[derive(Clone, Debug)]
pub struct ProviderConfig {
    pub name: String,
    /// The `matchImages` entries as written, for logs.
    pub match_images: Vec<String>,
    patterns: Vec<RegistryPattern>,
    pub default_cache_duration: Duration,
    pub api_version: String,
    pub args: Vec<String>,
    /// `env`, in order; a later entry of the same name wins, as in a process environment.
    pub env: Vec<(String, String)>,
}

impl ProviderConfig {
    /// Whether one of the `matchImages` patterns matches the image.
    pub fn matches(&self, image: &ImageRef) -> bool {
        self.patterns.iter().any(|p| p.matches_image(image))
    }
}

/// One thing wrong with a config, at a field path such as `providers[0].name`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldProblem {
    pub field: String,
    pub message: String,
}

impl fmt::Display for FieldProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Why a config's text is not a usable `CredentialProviderConfig`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigProblem {
    /// Not YAML or JSON of the right shape (the decoder's message, with the position).
    #[error("{0}")]
    Decode(String),
    /// Decoded, but fields are invalid; all of them, in document order.
    #[error("{}", join_problems(.0))]
    Invalid(Vec<FieldProblem>),
}

fn join_problems(problems: &[FieldProblem]) -> String {
    problems
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Why the daemon cannot start with its credential provider config.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "the credential provider config {} (--plugin-config-file) does not exist",
        .path.display()
    )]
    Missing { path: PathBuf },
    #[error("cannot read the credential provider config {}", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the credential provider config {} is invalid: {problem}", .path.display())]
    Invalid {
        path: PathBuf,
        problem: ConfigProblem,
    },
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    api_version: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    providers: Option<Vec<RawProvider>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawProvider {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    match_images: Option<Vec<String>>,
    #[serde(default)]
    default_cache_duration: Option<String>,
    #[serde(default)]
    api_version: Option<String>,
    #[serde(default)]
    args: Option<Vec<String>>,
    #[serde(default)]
    env: Option<Vec<RawEnv>>,
    /// Read only to refuse it by name (see the module docs).
    #[serde(default)]
    token_attributes: Option<serde_yaml::Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawEnv {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    value: Option<String>,
}

/// Parses and validates a `CredentialProviderConfig` (YAML, or JSON, which is YAML).
pub fn parse_config(text: &str) -> Result<Vec<ProviderConfig>, ConfigProblem> {
    let raw: RawConfig =
        serde_yaml::from_str(text).map_err(|err| ConfigProblem::Decode(err.to_string()))?;
    let mut problems = Vec::new();
    let mut problem = |field: String, message: String| {
        problems.push(FieldProblem { field, message });
    };
    match raw.api_version.as_deref() {
        None | Some("") => problem("apiVersion".into(), required(CONFIG_API_VERSION)),
        Some(CONFIG_API_VERSION) => {}
        Some(other) => problem(
            "apiVersion".into(),
            format!(
                "{} is not supported; use {CONFIG_API_VERSION}",
                Quoted(other)
            ),
        ),
    }
    match raw.kind.as_deref() {
        None | Some("") => problem("kind".into(), required(CONFIG_KIND)),
        Some(CONFIG_KIND) => {}
        Some(other) => problem(
            "kind".into(),
            format!("{} is not {CONFIG_KIND}", Quoted(other)),
        ),
    }
    let raw_providers = raw.providers.unwrap_or_default();
    if raw_providers.is_empty() {
        problem(
            "providers".into(),
            "at least one provider is required".into(),
        );
    }
    let mut providers = Vec::with_capacity(raw_providers.len());
    let mut seen: Vec<String> = Vec::new();
    for (i, raw) in raw_providers.into_iter().enumerate() {
        let at = |field: &str| format!("providers[{i}].{field}");
        let name = raw.name.unwrap_or_default();
        let named = if name.is_empty() {
            String::new()
        } else {
            format!(" (provider {})", Quoted(&name))
        };
        if name.is_empty() {
            problem(
                at("name"),
                "required: the plugin's file name in --plugin-bin-dir".into(),
            );
        } else if let Some(why) = bad_name(&name) {
            problem(at("name"), format!("{} {why}", Quoted(&name)));
        } else if seen.contains(&name) {
            problem(
                at("name"),
                format!("{} is the name of an earlier provider", Quoted(&name)),
            );
        }
        seen.push(name.clone());

        let api_version = raw.api_version.unwrap_or_default();
        match api_version.as_str() {
            "" => problem(at("apiVersion"), required(PROVIDER_API_VERSION) + &named),
            PROVIDER_API_VERSION => {}
            other => problem(
                at("apiVersion"),
                format!(
                    "{} is not supported{named}; use {PROVIDER_API_VERSION}",
                    Quoted(other)
                ),
            ),
        }

        let match_images = raw.match_images.unwrap_or_default();
        if match_images.is_empty() {
            problem(
                at("matchImages"),
                format!("at least one image pattern is required{named}"),
            );
        }
        let mut patterns = Vec::with_capacity(match_images.len());
        for (j, text) in match_images.iter().enumerate() {
            match RegistryPattern::parse(text) {
                Some(pattern) => patterns.push(pattern),
                None => problem(
                    format!("providers[{i}].matchImages[{j}]"),
                    format!(
                        "{} is not an image pattern like registry.io, *.azurecr.io or \
                         registry.io:5000/path{named}",
                        Quoted(text)
                    ),
                ),
            }
        }

        let default_cache_duration = match raw.default_cache_duration.as_deref() {
            None => {
                problem(
                    at("defaultCacheDuration"),
                    format!("required, e.g. 12h, or 0s for no cache{named}"),
                );
                Duration::ZERO
            }
            Some(text) => match parse_go_duration(text) {
                Ok((false, duration)) => duration,
                Ok((true, _)) => {
                    problem(
                        at("defaultCacheDuration"),
                        format!("{} must not be negative{named}", Quoted(text)),
                    );
                    Duration::ZERO
                }
                Err(message) => {
                    problem(at("defaultCacheDuration"), message + &named);
                    Duration::ZERO
                }
            },
        };

        let args = raw.args.unwrap_or_default();
        for (j, arg) in args.iter().enumerate() {
            if arg.contains('\0') {
                problem(
                    format!("providers[{i}].args[{j}]"),
                    format!("contains a NUL character{named}"),
                );
            }
        }
        let mut env = Vec::new();
        for (j, var) in raw.env.unwrap_or_default().into_iter().enumerate() {
            let field = |f: &str| format!("providers[{i}].env[{j}].{f}");
            let var_name = var.name.unwrap_or_default();
            let value = var.value.unwrap_or_default();
            if var_name.is_empty() {
                problem(field("name"), format!("required{named}"));
            } else if var_name.contains(['=', '\0']) {
                problem(
                    field("name"),
                    format!(
                        "{} must not contain '=' or a NUL character{named}",
                        Quoted(&var_name)
                    ),
                );
            }
            if value.contains('\0') {
                problem(field("value"), format!("contains a NUL character{named}"));
            }
            env.push((var_name, value));
        }

        if raw.token_attributes.as_ref().is_some_and(|v| !v.is_null()) {
            problem(
                at("tokenAttributes"),
                format!(
                    "service account tokens for credential providers are not supported by the \
                     kruise-rs daemon, which pulls for no pod{named}; remove tokenAttributes or \
                     give this provider to the kubelet only"
                ),
            );
        }

        providers.push(ProviderConfig {
            name,
            match_images,
            patterns,
            default_cache_duration,
            api_version,
            args,
            env,
        });
    }
    if problems.is_empty() {
        Ok(providers)
    } else {
        Err(ConfigProblem::Invalid(problems))
    }
}

fn required(example: &str) -> String {
    format!("required: {example}")
}

/// Why a provider name cannot be a file in the bin dir, if it cannot.
fn bad_name(name: &str) -> Option<&'static str> {
    if name == "." || name == ".." {
        Some("is not a file name")
    } else if name.contains('/') {
        Some("must not contain '/': it is a file name in --plugin-bin-dir")
    } else if name.contains(char::is_whitespace) {
        Some("must not contain spaces")
    } else if name.contains('\0') {
        Some("must not contain a NUL character")
    } else {
        None
    }
}

/// Parses Go's `time.ParseDuration` syntax (`300ms`, `1.5h`, `2h45m`, `-1s`, `0`) into a sign
/// (`true` when negative) and a magnitude. The error quotes the text.
pub(crate) fn parse_go_duration(text: &str) -> Result<(bool, Duration), String> {
    let invalid = || format!("{} is not a duration like 30s, 5m or 12h", Quoted(text));
    let (negative, mut rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    if rest == "0" {
        return Ok((negative, Duration::ZERO));
    }
    if rest.is_empty() {
        return Err(invalid());
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let digits = |s: &str| s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let (whole, after) = rest.split_at(digits(rest));
        let (fraction, after) = match after.strip_prefix('.') {
            Some(after) => after.split_at(digits(after)),
            None => ("", after),
        };
        if whole.is_empty() && fraction.is_empty() {
            return Err(invalid());
        }
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let scale: u128 = match unit {
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return Err(invalid()),
        };
        let whole: u128 = if whole.is_empty() {
            0
        } else {
            whole.parse().map_err(|_| invalid())?
        };
        let mut nanos = whole.checked_mul(scale).ok_or_else(invalid)?;
        let mut place = scale;
        for digit in fraction.bytes() {
            place /= 10;
            if place == 0 {
                break;
            }
            nanos += u128::from(digit - b'0') * place;
        }
        total = total.checked_add(nanos).ok_or_else(invalid)?;
        rest = after;
    }
    // Go's durations are int64 nanoseconds.
    let nanos = u64::try_from(total)
        .ok()
        .filter(|&n| n <= i64::MAX as u64)
        .ok_or_else(invalid)?;
    Ok((negative, Duration::from_nanos(nanos)))
}

// --- the exec protocol -------------------------------------------------------------------------

/// What a response's credentials cover in the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum CacheKeyType {
    Image,
    Registry,
    Global,
}

/// One `auth` entry of a response: the registry key it was written for and the credential.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct AuthEntry {
    pub key: String,
    pub username: String,
    pub password: String,
}

impl fmt::Debug for AuthEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AuthEntry")
            .field("key", &self.key)
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// A decoded `CredentialProviderResponse`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Response {
    pub cache_key_type: CacheKeyType,
    /// `cacheDuration`, when given; a negative one is zero.
    pub cache_duration: Option<Duration>,
    /// `auth`, in key order.
    pub auth: Vec<AuthEntry>,
}

/// The request written to a plugin's stdin.
pub(crate) fn request_json(api_version: &str, image: &str) -> Vec<u8> {
    serde_json::json!({
        "apiVersion": api_version,
        "kind": REQUEST_KIND,
        "image": image,
    })
    .to_string()
    .into_bytes()
}

/// Decodes a plugin's stdout, which must be a `CredentialProviderResponse` of `api_version`.
/// Messages name fields and the kinds of values, never a value of `auth`.
pub(crate) fn parse_response(stdout: &[u8], api_version: &str) -> Result<Response, String> {
    let root: Value =
        serde_json::from_slice(stdout).map_err(|err| format!("its output is not JSON ({err})"))?;
    let Value::Object(root) = root else {
        return Err("its output is not a JSON object".into());
    };
    let text = |name: &str| match root.get(name) {
        None | Some(Value::Null) => Ok(""),
        Some(Value::String(s)) => Ok(s.as_str()),
        Some(_) => Err(format!("its {name} is not a string")),
    };
    let got_version = text("apiVersion")?;
    if got_version != api_version {
        return Err(format!(
            "it answered with apiVersion {}, not {api_version}",
            Quoted(got_version)
        ));
    }
    let kind = text("kind")?;
    if kind != RESPONSE_KIND {
        return Err(format!(
            "it answered with kind {}, not {RESPONSE_KIND}",
            Quoted(kind)
        ));
    }
    let cache_key_type = match text("cacheKeyType")? {
        "Image" => CacheKeyType::Image,
        "Registry" => CacheKeyType::Registry,
        "Global" => CacheKeyType::Global,
        other => {
            return Err(format!(
                "its cacheKeyType {} is not Image, Registry or Global",
                Quoted(other)
            ));
        }
    };
    let cache_duration = match root.get("cacheDuration") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => {
            let (negative, duration) =
                parse_go_duration(s).map_err(|why| format!("its cacheDuration: {why}"))?;
            Some(if negative { Duration::ZERO } else { duration })
        }
        Some(_) => return Err("its cacheDuration is not a string".into()),
    };
    let mut auth = Vec::new();
    match root.get("auth") {
        None | Some(Value::Null) => {}
        Some(Value::Object(entries)) => {
            for (key, entry) in entries {
                let Value::Object(fields) = entry else {
                    return Err(format!("its auth entry {} is not an object", Quoted(key)));
                };
                let field = |name: &str| match fields.get(name) {
                    None | Some(Value::Null) => Ok(String::new()),
                    Some(Value::String(s)) => Ok(s.clone()),
                    Some(_) => Err(format!(
                        "the {name} of its auth entry {} is not a string",
                        Quoted(key)
                    )),
                };
                auth.push(AuthEntry {
                    key: key.clone(),
                    username: field("username")?,
                    password: field("password")?,
                });
            }
        }
        Some(_) => return Err("its auth is not an object".into()),
    }
    auth.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(Response {
        cache_key_type,
        cache_duration,
        auth,
    })
}

// --- the cache ---------------------------------------------------------------------------------

/// What a cached response covers.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum CacheKey {
    /// A fully qualified repository, e.g. `docker.io/library/nginx`.
    Image(String),
    /// A registry host with its port, e.g. `127.0.0.1:5000`.
    Registry(String),
    Global,
}

impl CacheKey {
    pub(crate) fn new(kind: CacheKeyType, image: &ImageRef) -> CacheKey {
        match kind {
            CacheKeyType::Image => CacheKey::Image(image.name().to_owned()),
            CacheKeyType::Registry => CacheKey::Registry(image.registry().to_owned()),
            CacheKeyType::Global => CacheKey::Global,
        }
    }

    /// The keys a lookup for `image` tries, most specific first.
    fn candidates(image: &ImageRef) -> [CacheKey; 3] {
        [
            CacheKey::Image(image.name().to_owned()),
            CacheKey::Registry(image.registry().to_owned()),
            CacheKey::Global,
        ]
    }
}

/// How long to keep a response: its `cacheDuration` if it gave one, else the provider's
/// default; `None` (do not keep it) when that is zero.
pub(crate) fn cache_lifetime(response: Option<Duration>, default: Duration) -> Option<Duration> {
    let lifetime = response.unwrap_or(default);
    (!lifetime.is_zero()).then_some(lifetime)
}

/// One provider's cached responses.
#[derive(Debug, Default)]
pub(crate) struct Cache {
    entries: BTreeMap<CacheKey, Cached>,
}

#[derive(Debug)]
struct Cached {
    response: Arc<Response>,
    expires_at: Instant,
}

impl Cache {
    /// The unexpired response covering `image`: the image's entry, else its registry's, else
    /// the global one.
    pub(crate) fn get(&self, image: &ImageRef, now: Instant) -> Option<Arc<Response>> {
        CacheKey::candidates(image).iter().find_map(|key| {
            self.entries
                .get(key)
                .filter(|cached| now < cached.expires_at)
                .map(|cached| cached.response.clone())
        })
    }

    /// Keeps `response` for `image` as its `cacheKeyType` says, for as long as
    /// [`cache_lifetime`] says (not at all for zero), and drops what has expired.
    pub(crate) fn insert(
        &mut self,
        image: &ImageRef,
        response: Arc<Response>,
        default: Duration,
        now: Instant,
    ) {
        self.entries.retain(|_, cached| now < cached.expires_at);
        let Some(lifetime) = cache_lifetime(response.cache_duration, default) else {
            return;
        };
        let Some(expires_at) = now.checked_add(lifetime) else {
            return;
        };
        self.entries.insert(
            CacheKey::new(response.cache_key_type, image),
            Cached {
                response,
                expires_at,
            },
        );
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

// --- running plugins ---------------------------------------------------------------------------

/// Why one plugin run gave no response.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ExecError {
    #[error("cannot run {}: {message}", .path.display())]
    Spawn { path: PathBuf, message: String },
    #[error("it did not answer within {}s and was killed", .timeout.as_secs_f64())]
    Timeout { timeout: Duration },
    #[error("it exited with {status}{}", stderr_suffix(.stderr))]
    Failed { status: String, stderr: String },
    #[error("{message}{}", stderr_suffix(.stderr))]
    BadResponse { message: String, stderr: String },
}

fn stderr_suffix(stderr: &str) -> String {
    if stderr.is_empty() {
        String::new()
    } else {
        format!(": {stderr}")
    }
}

/// A plugin's stderr for a message: trimmed, and cut after [`STDERR_MAX_CHARS`] characters.
pub(crate) fn trim_stderr(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let text = text.trim();
    match text.char_indices().nth(STDERR_MAX_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

/// Runs the plugin `path` once with `args`, the daemon's environment plus `env`, and
/// `request` on stdin; returns its decoded answer. Killed after `timeout`.
pub(crate) async fn exec_plugin(
    path: &Path,
    args: &[String],
    env: &[(String, String)],
    request: &[u8],
    api_version: &str,
    timeout: Duration,
) -> Result<Response, ExecError> {
    let mut command = tokio::process::Command::new(path);
    command
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().map_err(|err| ExecError::Spawn {
        path: path.to_owned(),
        message: err.to_string(),
    })?;
    let stdin = child.stdin.take();
    let write = async move {
        if let Some(mut stdin) = stdin {
            // A plugin that exits without reading its request closes the pipe; what it
            // answers (or its exit status) tells what went wrong, not this write.
            let _ = stdin.write_all(request).await;
        }
    };
    // Dropping the child on timeout kills it (`kill_on_drop`).
    let run = async { tokio::join!(write, child.wait_with_output()).1 };
    let output = match tokio::time::timeout(timeout, run).await {
        Ok(Ok(output)) => output,
        Ok(Err(err)) => {
            return Err(ExecError::Spawn {
                path: path.to_owned(),
                message: err.to_string(),
            });
        }
        Err(_) => return Err(ExecError::Timeout { timeout }),
    };
    let stderr = trim_stderr(&output.stderr);
    if !output.status.success() {
        return Err(ExecError::Failed {
            status: output.status.to_string(),
            stderr,
        });
    }
    parse_response(&output.stdout, api_version)
        .map_err(|message| ExecError::BadResponse { message, stderr })
}

type InFlight = Shared<BoxFuture<'static, Result<Arc<Response>, ExecError>>>;

/// One configured provider with its cache and its runs in flight.
struct Provider {
    config: ProviderConfig,
    path: PathBuf,
    timeout: Duration,
    cache: Mutex<Cache>,
    /// Runs in flight by requested image, shared by concurrent lookups of that image, with an
    /// id for each run.
    in_flight: Mutex<HashMap<String, (u64, InFlight)>>,
    next_run: AtomicU64,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update is a single insert or remove, so a poisoned lock holds consistent data.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Provider {
    /// The provider's answer for `image`: cached, joined to a run in flight, or a new run.
    async fn provide(self: &Arc<Self>, image: &ImageRef) -> Result<Arc<Response>, ExecError> {
        if let Some(hit) = lock(&self.cache).get(image, Instant::now()) {
            debug!(provider = %self.config.name, image = %image.name(), "credential provider answer from the cache");
            return Ok(hit);
        }
        let requested = image.name().to_owned();
        let (id, run) = lock(&self.in_flight)
            .entry(requested.clone())
            .or_insert_with(|| {
                let provider = self.clone();
                let image = image.clone();
                let id = self.next_run.fetch_add(1, Ordering::Relaxed);
                (
                    id,
                    async move { provider.run(&image).await }.boxed().shared(),
                )
            })
            .clone();
        // A finished `Shared` forgets its identity, hence the id to remove it by.
        let result = run.await;
        let mut in_flight = lock(&self.in_flight);
        if in_flight
            .get(&requested)
            .is_some_and(|(current, _)| *current == id)
        {
            in_flight.remove(&requested);
        }
        result
    }

    /// Runs the plugin once for `image` and caches its answer.
    async fn run(&self, image: &ImageRef) -> Result<Arc<Response>, ExecError> {
        debug!(provider = %self.config.name, image = %image.name(), "running credential provider");
        let request = request_json(&self.config.api_version, image.name());
        let response = exec_plugin(
            &self.path,
            &self.config.args,
            &self.config.env,
            &request,
            &self.config.api_version,
            self.timeout,
        )
        .await?;
        let response = Arc::new(response);
        lock(&self.cache).insert(
            image,
            response.clone(),
            self.config.default_cache_duration,
            Instant::now(),
        );
        Ok(response)
    }
}

/// The daemon's credential provider plugins; empty when none are configured.
#[derive(Clone, Default)]
pub(crate) struct CredentialProviders {
    providers: Vec<Arc<Provider>>,
}

impl fmt::Debug for CredentialProviders {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.providers.iter().map(|p| &p.config.name))
            .finish()
    }
}

impl CredentialProviders {
    /// Reads the config the options name (see [`CredentialProviderOptions::config_file`]).
    pub(crate) fn load(
        opts: &CredentialProviderOptions,
    ) -> Result<CredentialProviders, ConfigError> {
        let (path, explicit) = match &opts.config_file {
            Some(path) => (path.clone(), true),
            None => (PathBuf::from(DEFAULT_CONFIG_FILE), false),
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                if explicit {
                    return Err(ConfigError::Missing { path });
                }
                info!(
                    config = %path.display(),
                    "no credential provider config; pulls use pull secrets only"
                );
                return Ok(CredentialProviders::default());
            }
            Err(source) => return Err(ConfigError::Read { path, source }),
        };
        let configs = parse_config(&text).map_err(|problem| ConfigError::Invalid {
            path: path.clone(),
            problem,
        })?;
        for config in &configs {
            let binary = opts.bin_dir.join(&config.name);
            if !binary.is_file() {
                warn!(
                    provider = %config.name,
                    binary = %binary.display(),
                    "credential provider plugin not found; pulls it matches will report it"
                );
            }
            info!(
                provider = %config.name,
                match_images = ?config.match_images,
                default_cache_duration = ?config.default_cache_duration,
                "credential provider configured"
            );
        }
        Ok(CredentialProviders::new(
            configs,
            &opts.bin_dir,
            opts.exec_timeout,
        ))
    }

    /// Providers from validated configs, whose binaries are in `bin_dir`.
    pub(crate) fn new(configs: Vec<ProviderConfig>, bin_dir: &Path, timeout: Duration) -> Self {
        CredentialProviders {
            providers: configs
                .into_iter()
                .map(|config| {
                    Arc::new(Provider {
                        path: bin_dir.join(&config.name),
                        config,
                        timeout,
                        cache: Mutex::default(),
                        in_flight: Mutex::default(),
                        next_run: AtomicU64::new(0),
                    })
                })
                .collect(),
        }
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.providers.is_empty()
    }

    /// How many lookups wait for the run in flight for `image` (the repository name) of the
    /// provider `name`.
    #[cfg(test)]
    fn waiting(&self, name: &str, image: &str) -> usize {
        self.providers
            .iter()
            .filter(|p| p.config.name == name)
            .filter_map(|p| lock(&p.in_flight).get(image)?.1.strong_count())
            // The map holds one handle; each waiting lookup holds one.
            .map(|handles| handles.saturating_sub(1))
            .sum()
    }

    /// The credentials the matching providers give for `image`, as a keyring whose keys are
    /// the responses' `auth` keys (so [`Keyring::lookup`] picks those that apply), and why any
    /// provider gave none. A failure is logged without secrets and the other providers still
    /// answer.
    pub(crate) async fn credentials(&self, image: &ImageRef) -> (Keyring, Vec<String>) {
        let mut keyring = Keyring::default();
        let mut problems = Vec::new();
        for provider in &self.providers {
            if !provider.config.matches(image) {
                continue;
            }
            let name = &provider.config.name;
            match provider.provide(image).await {
                Ok(response) => {
                    let source = format!("credential provider {name}");
                    for entry in &response.auth {
                        keyring.add_credential(
                            &entry.key,
                            Credential {
                                username: entry.username.clone(),
                                password: entry.password.clone(),
                                identity_token: String::new(),
                                registry_token: String::new(),
                                server_address: entry.key.clone(),
                                source: source.clone(),
                            },
                        );
                    }
                }
                Err(err) => {
                    warn!(provider = %name, image = %image.name(), error = %err, "credential provider failed");
                    problems.push(format!("credential provider {name} failed: {err}"));
                }
            }
        }
        (keyring, problems)
    }
}

#[cfg(test)]
mod tests;
