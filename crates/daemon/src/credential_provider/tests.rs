use super::*;

fn image(reference: &str) -> ImageRef {
    ImageRef::parse(reference).unwrap()
}

const MINIMAL: &str = r#"
apiVersion: kubelet.config.k8s.io/v1
kind: CredentialProviderConfig
providers:
  - name: ecr-credential-provider
    matchImages: ["*.dkr.ecr.*.amazonaws.com", "registry.io:8080/team"]
    defaultCacheDuration: 12h
    apiVersion: credentialprovider.kubelet.k8s.io/v1
    args: [get-credentials]
    env:
      - name: AWS_PROFILE
        value: nodes
"#;

fn problems(text: &str) -> Vec<String> {
    match parse_config(text) {
        Err(ConfigProblem::Invalid(problems)) => problems.iter().map(|p| p.to_string()).collect(),
        other => panic!("expected field problems, got {other:?}"),
    }
}

fn provider(fields: &str) -> String {
    format!(
        "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n  - {}\n",
        fields.trim().replace('\n', "\n    ")
    )
}

const GOOD_FIELDS: &str = "name: p
matchImages: [registry.io]
defaultCacheDuration: 1m
apiVersion: credentialprovider.kubelet.k8s.io/v1";

#[test]
fn a_complete_config_parses() {
    let providers = parse_config(MINIMAL).unwrap();
    assert_eq!(providers.len(), 1);
    let p = &providers[0];
    assert_eq!(p.name, "ecr-credential-provider");
    assert_eq!(p.default_cache_duration, Duration::from_secs(12 * 3600));
    assert_eq!(p.api_version, PROVIDER_API_VERSION);
    assert_eq!(p.args, ["get-credentials"]);
    assert_eq!(p.env, [("AWS_PROFILE".to_owned(), "nodes".to_owned())]);
    assert_eq!(
        p.match_images,
        ["*.dkr.ecr.*.amazonaws.com", "registry.io:8080/team"]
    );
}

#[test]
fn json_is_read_too() {
    let json = serde_json::json!({
        "apiVersion": "kubelet.config.k8s.io/v1",
        "kind": "CredentialProviderConfig",
        "providers": [{
            "name": "acr", "matchImages": ["*.azurecr.io"], "defaultCacheDuration": "10m",
            "apiVersion": "credentialprovider.kubelet.k8s.io/v1"
        }]
    });
    let providers = parse_config(&json.to_string()).unwrap();
    assert_eq!(providers[0].name, "acr");
    assert!(providers[0].args.is_empty() && providers[0].env.is_empty());
}

#[test]
fn the_config_needs_its_api_version_and_kind_and_a_provider() {
    assert_eq!(
        problems("providers: []"),
        [
            "apiVersion: required: kubelet.config.k8s.io/v1",
            "kind: required: CredentialProviderConfig",
            "providers: at least one provider is required",
        ]
    );
    let old = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: Other\nproviders: []";
    assert_eq!(
        problems(old),
        [
            "apiVersion: \"kubelet.config.k8s.io/v1beta1\" is not supported; use kubelet.config.k8s.io/v1",
            "kind: \"Other\" is not CredentialProviderConfig",
            "providers: at least one provider is required",
        ]
    );
}

#[test]
fn every_missing_provider_field_is_named() {
    assert_eq!(
        problems(&provider("args: []")),
        [
            "providers[0].name: required: the plugin's file name in --plugin-bin-dir",
            "providers[0].apiVersion: required: credentialprovider.kubelet.k8s.io/v1",
            "providers[0].matchImages: at least one image pattern is required",
            "providers[0].defaultCacheDuration: required, e.g. 12h, or 0s for no cache",
        ]
    );
}

#[test]
fn names_must_be_file_names_and_unique() {
    for (name, why) in [
        ("a/b", "must not contain '/'"),
        ("'a b'", "must not contain spaces"),
        ("'.'", "is not a file name"),
        ("'..'", "is not a file name"),
    ] {
        let text = provider(&GOOD_FIELDS.replace("name: p", &format!("name: {name}")));
        let found = problems(&text);
        assert_eq!(found.len(), 1, "{name}: {found:?}");
        assert!(
            found[0].starts_with("providers[0].name: ") && found[0].contains(why),
            "{name}: {found:?}"
        );
    }
    let two = format!(
        "{}  - {}\n",
        provider(GOOD_FIELDS),
        GOOD_FIELDS.replace('\n', "\n    ")
    );
    assert_eq!(
        problems(&two),
        ["providers[1].name: \"p\" is the name of an earlier provider"]
    );
}

#[test]
fn api_version_of_the_exec_protocol_must_be_v1() {
    let text = provider(&GOOD_FIELDS.replace(
        "credentialprovider.kubelet.k8s.io/v1",
        "credentialprovider.kubelet.k8s.io/v1alpha1",
    ));
    assert_eq!(
        problems(&text),
        [
            "providers[0].apiVersion: \"credentialprovider.kubelet.k8s.io/v1alpha1\" is not \
             supported (provider \"p\"); use credentialprovider.kubelet.k8s.io/v1"
        ]
    );
}

#[test]
fn bad_match_images_are_named_with_their_index() {
    let text = provider(&GOOD_FIELDS.replace(
        "[registry.io]",
        "[registry.io, 'bad host', 'registry.io:port']",
    ));
    let found = problems(&text);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(
        found[0].starts_with("providers[0].matchImages[1]: \"bad host\" is not an image pattern")
    );
    assert!(found[1].starts_with("providers[0].matchImages[2]: \"registry.io:port\""));
    assert!(found[1].ends_with("(provider \"p\")"), "{found:?}");
}

#[test]
fn default_cache_duration_is_a_non_negative_go_duration() {
    for (value, want) in [
        ("0s", Duration::ZERO),
        ("'0'", Duration::ZERO),
        ("90m", Duration::from_secs(5400)),
        ("1h30m", Duration::from_secs(5400)),
    ] {
        let text = provider(&GOOD_FIELDS.replace("1m", value));
        assert_eq!(
            parse_config(&text).unwrap()[0].default_cache_duration,
            want,
            "{value}"
        );
    }
    let negative = provider(&GOOD_FIELDS.replace("1m", "-1s"));
    assert_eq!(
        problems(&negative),
        ["providers[0].defaultCacheDuration: \"-1s\" must not be negative (provider \"p\")"]
    );
    let garbage = provider(&GOOD_FIELDS.replace("1m", "soon"));
    assert_eq!(
        problems(&garbage),
        [
            "providers[0].defaultCacheDuration: \"soon\" is not a duration like 30s, 5m or 12h \
             (provider \"p\")"
        ]
    );
}

#[test]
fn env_needs_names_and_nothing_carries_a_nul() {
    let text = provider(&format!(
        "{GOOD_FIELDS}\nargs: [\"a\\0b\"]\nenv: [{{value: x}}, {{name: 'A=B', value: y}}, {{name: OK, value: \"\\0\"}}]"
    ));
    assert_eq!(
        problems(&text),
        [
            "providers[0].args[0]: contains a NUL character (provider \"p\")",
            "providers[0].env[0].name: required (provider \"p\")",
            "providers[0].env[1].name: \"A=B\" must not contain '=' or a NUL character (provider \"p\")",
            "providers[0].env[2].value: contains a NUL character (provider \"p\")",
        ]
    );
}

#[test]
fn token_attributes_are_refused_naming_the_provider() {
    let text = provider(&format!(
        "{GOOD_FIELDS}\ntokenAttributes:\n  serviceAccountTokenAudience: sts.example.com\n  requireServiceAccount: true"
    ));
    let found = problems(&text);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("providers[0].tokenAttributes: service account tokens")
            && found[0].contains("(provider \"p\")"),
        "{found:?}"
    );
    // An explicit null is no use of the feature.
    let null = provider(&format!("{GOOD_FIELDS}\ntokenAttributes: null"));
    assert!(parse_config(&null).is_ok());
}

#[test]
fn unknown_fields_and_wrong_shapes_are_decode_errors() {
    let unknown = provider(&format!("{GOOD_FIELDS}\nmatchImage: [x]"));
    match parse_config(&unknown) {
        Err(ConfigProblem::Decode(message)) => {
            assert!(message.contains("unknown field `matchImage`"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        parse_config("providers: 3"),
        Err(ConfigProblem::Decode(_))
    ));
    // An empty file is a config with nothing set.
    assert_eq!(problems("").len(), 3);
    assert!(matches!(
        parse_config("{not yaml"),
        Err(ConfigProblem::Decode(_))
    ));
}

#[test]
fn go_durations_parse_like_go() {
    let ok = |text: &str, negative: bool, nanos: u64| {
        assert_eq!(
            parse_go_duration(text),
            Ok((negative, Duration::from_nanos(nanos))),
            "{text}"
        );
    };
    ok("0", false, 0);
    ok("-0", true, 0);
    ok("0s", false, 0);
    ok("300ms", false, 300_000_000);
    ok("1.5h", false, 5_400_000_000_000);
    ok("2h45m", false, 9_900_000_000_000);
    ok("-1s", true, 1_000_000_000);
    ok("+5s", false, 5_000_000_000);
    ok("1us", false, 1_000);
    ok("1µs", false, 1_000);
    ok("1μs", false, 1_000);
    ok("7ns", false, 7);
    ok(".5s", false, 500_000_000);
    ok("1.s", false, 1_000_000_000);
    ok("0.1234567891s", false, 123_456_789);
    for bad in [
        "",
        "-",
        "5",
        "s",
        "1d",
        "1.2.3s",
        "1 s",
        "99999999999999999999h",
        "2562048h",
    ] {
        assert!(parse_go_duration(bad).is_err(), "{bad:?}");
    }
    assert_eq!(
        parse_go_duration("1d").unwrap_err(),
        "\"1d\" is not a duration like 30s, 5m or 12h"
    );
}

fn config_matching(patterns: &[&str]) -> ProviderConfig {
    let list = patterns
        .iter()
        .map(|p| format!("'{p}'"))
        .collect::<Vec<_>>()
        .join(", ");
    let text = provider(&GOOD_FIELDS.replace("[registry.io]", &format!("[{list}]")));
    parse_config(&text).unwrap().remove(0)
}

#[test]
fn match_images_follow_the_kubelets_rules() {
    let cases: &[(&str, &str, bool)] = &[
        // A glob stands for one whole or partial label.
        ("*.azurecr.io", "myreg.azurecr.io/app:1", true),
        ("*.azurecr.io", "a.b.azurecr.io/app:1", false),
        ("*.azurecr.io", "azurecr.io/app:1", false),
        ("app*.k8s.io", "app1.k8s.io/x", true),
        ("app*.k8s.io", "web.k8s.io/x", false),
        ("k8s.*", "k8s.io/x", true),
        ("*.*.registry.io", "a.b.registry.io/x", true),
        (
            "*.dkr.ecr.*.amazonaws.com",
            "123.dkr.ecr.us-east-1.amazonaws.com/app:v1",
            true,
        ),
        // Ports must be equal: a pattern without one does not match a registry with one.
        ("registry.io:8080", "registry.io:8080/app", true),
        ("registry.io:8080", "registry.io:9090/app", false),
        ("registry.io:8080", "registry.io/app", false),
        ("registry.io", "registry.io:8080/app", false),
        (
            "127.0.0.1:5000",
            "127.0.0.1:5000/team/app@sha256:0000000000000000000000000000000000000000000000000000000000000000",
            true,
        ),
        // A path is a repository prefix, in whole segments.
        ("registry.io/team", "registry.io/team/app", true),
        ("registry.io/team", "registry.io/team", true),
        ("registry.io/team", "registry.io/teams/app", false),
        ("registry.io/team", "registry.io/other/app", false),
        // Hosts compare case-insensitively; Docker Hub's aliases are one host.
        ("Registry.IO", "registry.io/app", true),
        ("index.docker.io", "nginx", true),
        ("docker.io/library", "nginx:1.25", true),
        ("gcr.io", "us.gcr.io/p/app", false),
    ];
    for (pattern, reference, want) in cases {
        assert_eq!(
            config_matching(&[pattern]).matches(&image(reference)),
            *want,
            "{pattern} vs {reference}"
        );
    }
    let two = config_matching(&["gcr.io", "*.gcr.io"]);
    assert!(two.matches(&image("gcr.io/p/a")) && two.matches(&image("eu.gcr.io/p/a")));
}

fn response_json(value: serde_json::Value) -> Vec<u8> {
    value.to_string().into_bytes()
}

#[test]
fn a_response_decodes_with_its_cache_rules_and_credentials() {
    let out = response_json(serde_json::json!({
        "apiVersion": PROVIDER_API_VERSION,
        "kind": "CredentialProviderResponse",
        "cacheKeyType": "Registry",
        "cacheDuration": "6h",
        "auth": {
            "registry.io": {"username": "u", "password": "p"},
            "*.registry.io": {"username": "w"},
        },
    }));
    let response = parse_response(&out, PROVIDER_API_VERSION).unwrap();
    assert_eq!(response.cache_key_type, CacheKeyType::Registry);
    assert_eq!(response.cache_duration, Some(Duration::from_secs(6 * 3600)));
    assert_eq!(
        response.auth,
        [
            AuthEntry {
                key: "*.registry.io".into(),
                username: "w".into(),
                password: String::new()
            },
            AuthEntry {
                key: "registry.io".into(),
                username: "u".into(),
                password: "p".into()
            },
        ]
    );
    // Debug never shows a password.
    assert!(!format!("{response:?}").contains("\"p\""));

    let bare = response_json(serde_json::json!({
        "apiVersion": PROVIDER_API_VERSION,
        "kind": "CredentialProviderResponse",
        "cacheKeyType": "Image",
    }));
    let response = parse_response(&bare, PROVIDER_API_VERSION).unwrap();
    assert_eq!(
        (
            response.cache_key_type,
            response.cache_duration,
            response.auth.len()
        ),
        (CacheKeyType::Image, None, 0)
    );
    let negative = response_json(serde_json::json!({
        "apiVersion": PROVIDER_API_VERSION,
        "kind": "CredentialProviderResponse",
        "cacheKeyType": "Global",
        "cacheDuration": "-5m",
    }));
    assert_eq!(
        parse_response(&negative, PROVIDER_API_VERSION)
            .unwrap()
            .cache_duration,
        Some(Duration::ZERO)
    );
}

#[test]
fn bad_responses_are_named_without_their_secrets() {
    let base = || {
        serde_json::json!({
            "apiVersion": PROVIDER_API_VERSION,
            "kind": "CredentialProviderResponse",
            "cacheKeyType": "Image",
        })
    };
    let with = |key: &str, value: serde_json::Value| {
        let mut v = base();
        v[key] = value;
        response_json(v)
    };
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"not json".to_vec(), "its output is not JSON"),
        (b"[]".to_vec(), "its output is not a JSON object"),
        (
            with(
                "apiVersion",
                "credentialprovider.kubelet.k8s.io/v1beta1".into(),
            ),
            "it answered with apiVersion \"credentialprovider.kubelet.k8s.io/v1beta1\", not credentialprovider.kubelet.k8s.io/v1",
        ),
        (
            with("kind", "Other".into()),
            "it answered with kind \"Other\"",
        ),
        (
            with("cacheKeyType", "Pod".into()),
            "its cacheKeyType \"Pod\" is not Image, Registry or Global",
        ),
        (
            with("cacheKeyType", serde_json::Value::Null),
            "its cacheKeyType \"\"",
        ),
        (
            with("cacheDuration", "soon".into()),
            "its cacheDuration: \"soon\"",
        ),
        (
            with("cacheDuration", 5.into()),
            "its cacheDuration is not a string",
        ),
        (with("auth", "hunter2".into()), "its auth is not an object"),
        (
            with("auth", serde_json::json!({"r.io": "hunter2"})),
            "its auth entry \"r.io\" is not an object",
        ),
        (
            with(
                "auth",
                serde_json::json!({"r.io": {"username": "u", "password": 12345}}),
            ),
            "the password of its auth entry \"r.io\" is not a string",
        ),
    ];
    for (out, want) in cases {
        let err = parse_response(&out, PROVIDER_API_VERSION).unwrap_err();
        assert!(err.starts_with(want), "{err:?} should start with {want:?}");
        assert!(!err.contains("hunter2") && !err.contains("12345"), "{err}");
    }
}

#[test]
fn requests_carry_the_api_version_and_the_image() {
    let request: serde_json::Value = serde_json::from_slice(&request_json(
        PROVIDER_API_VERSION,
        "docker.io/library/nginx",
    ))
    .unwrap();
    assert_eq!(
        request,
        serde_json::json!({
            "apiVersion": PROVIDER_API_VERSION,
            "kind": "CredentialProviderRequest",
            "image": "docker.io/library/nginx",
        })
    );
}

#[test]
fn cache_lifetime_prefers_the_response_and_zero_means_none() {
    let (m, h) = (Duration::from_secs(60), Duration::from_secs(3600));
    assert_eq!(cache_lifetime(Some(m), h), Some(m));
    assert_eq!(cache_lifetime(None, h), Some(h));
    assert_eq!(cache_lifetime(Some(Duration::ZERO), h), None);
    assert_eq!(cache_lifetime(None, Duration::ZERO), None);
    assert_eq!(cache_lifetime(Some(m), Duration::ZERO), Some(m));
}

fn response(kind: CacheKeyType, duration: Option<Duration>, user: &str) -> Arc<Response> {
    Arc::new(Response {
        cache_key_type: kind,
        cache_duration: duration,
        auth: vec![AuthEntry {
            key: "r.io".into(),
            username: user.into(),
            password: "pw".into(),
        }],
    })
}

fn cached_user(cache: &Cache, reference: &str, now: Instant) -> Option<String> {
    cache
        .get(&image(reference), now)
        .map(|r| r.auth[0].username.clone())
}

#[test]
fn the_cache_covers_what_the_key_type_says_until_it_expires() {
    let now = Instant::now();
    let minute = Duration::from_secs(60);
    let mut cache = Cache::default();
    cache.insert(
        &image("r.io/team/app:v1"),
        response(CacheKeyType::Image, Some(minute), "image"),
        Duration::ZERO,
        now,
    );
    // Image: this repository, any tag or digest; not another repository.
    assert_eq!(
        cached_user(&cache, "r.io/team/app:v2", now).as_deref(),
        Some("image")
    );
    assert_eq!(cached_user(&cache, "r.io/team/other:v1", now), None);
    // Until it expires.
    assert_eq!(cached_user(&cache, "r.io/team/app:v1", now + minute), None);

    cache.insert(
        &image("r.io/x:1"),
        response(CacheKeyType::Registry, None, "registry"),
        minute,
        now,
    );
    assert_eq!(
        cached_user(&cache, "r.io/team/other:v1", now).as_deref(),
        Some("registry")
    );
    assert_eq!(cached_user(&cache, "s.io/team/other:v1", now), None);
    // The image's own entry comes before its registry's.
    assert_eq!(
        cached_user(&cache, "r.io/team/app:v1", now).as_deref(),
        Some("image")
    );

    cache.insert(
        &image("q.io/x:1"),
        response(CacheKeyType::Global, Some(2 * minute), "global"),
        Duration::ZERO,
        now,
    );
    assert_eq!(
        cached_user(&cache, "s.io/y:1", now).as_deref(),
        Some("global")
    );
    assert_eq!(
        cached_user(&cache, "r.io/z:1", now).as_deref(),
        Some("registry")
    );
    assert_eq!(cached_user(&cache, "s.io/y:1", now + 2 * minute), None);
    assert_eq!(cache.len(), 3);
    // Expired entries go on the next insert.
    cache.insert(
        &image("t.io/x:1"),
        response(CacheKeyType::Image, Some(Duration::ZERO), "zero"),
        minute,
        now + 3 * minute,
    );
    assert!(cache.is_empty());
}

#[test]
fn zero_durations_cache_nothing_and_a_newer_answer_replaces_an_older() {
    let now = Instant::now();
    let mut cache = Cache::default();
    cache.insert(
        &image("r.io/a:1"),
        response(CacheKeyType::Image, Some(Duration::ZERO), "x"),
        Duration::from_secs(60),
        now,
    );
    cache.insert(
        &image("r.io/a:1"),
        response(CacheKeyType::Image, None, "x"),
        Duration::ZERO,
        now,
    );
    assert!(cache.is_empty());
    let minute = Duration::from_secs(60);
    cache.insert(
        &image("r.io/a:1"),
        response(CacheKeyType::Image, None, "old"),
        minute,
        now,
    );
    cache.insert(
        &image("r.io/a:1"),
        response(CacheKeyType::Image, None, "new"),
        minute,
        now,
    );
    assert_eq!(cached_user(&cache, "r.io/a:1", now).as_deref(), Some("new"));
}

#[test]
fn stderr_is_trimmed_and_cut() {
    assert_eq!(trim_stderr(b"  no token\n\n"), "no token");
    assert_eq!(trim_stderr(b""), "");
    let long = "x".repeat(2 * STDERR_MAX_CHARS);
    let cut = trim_stderr(long.as_bytes());
    assert_eq!(cut.chars().count(), STDERR_MAX_CHARS + 1);
    assert!(cut.ends_with('…'));
    // Not UTF-8: replaced, never a panic.
    assert_eq!(trim_stderr(&[0xff, b'a']), "\u{fffd}a");
}

// --- the exec adapter, against real shell-script plugins ---------------------------------------

/// Writes an executable `sh` script `name` into `dir`, through a child `sh`, so that this
/// process never holds a write descriptor to it: a sibling test that forks while one is open
/// carries it into its child until that child execs, and running the script in that window fails
/// with ETXTBSY ("Text file busy"). (The test kit's `write_executable` does the same; this crate
/// cannot depend on the test kit.)
fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    use std::io::Write as _;
    let path = dir.join(name);
    let mut sh = std::process::Command::new("sh")
        .args(["-c", "cat > \"$1\" && chmod 755 \"$1\"", "sh"])
        .arg(&path)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    sh.stdin
        .take()
        .unwrap()
        .write_all(format!("#!/bin/sh\n{body}\n").as_bytes())
        .unwrap();
    assert!(sh.wait().unwrap().success(), "writing {}", path.display());
    path
}

const ANSWER: &str = r#"{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderResponse","cacheKeyType":"Image","auth":{"r.io":{"username":"u","password":"p"}}}"#;

#[tokio::test]
async fn a_plugin_gets_the_request_args_and_env_and_answers() {
    let dir = tempfile::tempdir().unwrap();
    let seen = dir.path().join("seen");
    let path = script(
        dir.path(),
        "p",
        &format!(
            "cat > {seen}.stdin; echo \"$@|$EXTRA|${{HOME:+home}}\" > {seen}.argv\necho '{ANSWER}'",
            seen = seen.display()
        ),
    );
    let request = request_json(PROVIDER_API_VERSION, "r.io/app");
    let response = exec_plugin(
        &path,
        &["get".into(), "--flag".into()],
        &[("EXTRA".into(), "from-config".into())],
        &request,
        PROVIDER_API_VERSION,
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    assert_eq!(response.auth[0].username, "u");
    let stdin = std::fs::read(dir.path().join("seen.stdin")).unwrap();
    assert_eq!(stdin, request);
    let argv = std::fs::read_to_string(dir.path().join("seen.argv")).unwrap();
    // The daemon's own environment (HOME here) is passed on too.
    let home = if std::env::var_os("HOME").is_some() {
        "home"
    } else {
        ""
    };
    assert_eq!(argv.trim(), format!("get --flag|from-config|{home}"));
}

#[tokio::test]
async fn a_failing_plugin_reports_its_exit_and_trimmed_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let path = script(
        dir.path(),
        "p",
        "echo '  no credentials for you  ' >&2\nexit 3",
    );
    let err = exec_plugin(
        &path,
        &[],
        &[],
        b"{}",
        PROVIDER_API_VERSION,
        Duration::from_secs(10),
    )
    .await
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "it exited with exit status: 3: no credentials for you"
    );
}

#[tokio::test]
async fn a_wrong_answer_is_a_bad_response() {
    let dir = tempfile::tempdir().unwrap();
    let path = script(dir.path(), "p", "echo 'warming up' >&2\necho hunter2");
    let err = exec_plugin(
        &path,
        &[],
        &[],
        b"{}",
        PROVIDER_API_VERSION,
        Duration::from_secs(10),
    )
    .await
    .unwrap_err();
    let message = err.to_string();
    assert!(message.starts_with("its output is not JSON"), "{message}");
    assert!(
        message.ends_with(": warming up") && !message.contains("hunter2"),
        "{message}"
    );
}

#[tokio::test]
async fn a_missing_plugin_is_a_spawn_error_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent");
    let err = exec_plugin(
        &path,
        &[],
        &[],
        b"{}",
        PROVIDER_API_VERSION,
        Duration::from_secs(10),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, ExecError::Spawn { path: p, .. } if *p == path),
        "{err:?}"
    );
    assert!(err.to_string().contains("No such file"), "{err}");
}

#[tokio::test]
async fn a_plugin_that_hangs_is_killed_at_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let path = script(
        dir.path(),
        "p",
        &format!("echo $$ > {}\nexec sleep 30", pid_file.display()),
    );
    let started = Instant::now();
    let err = exec_plugin(
        &path,
        &[],
        &[],
        b"{}",
        PROVIDER_API_VERSION,
        Duration::from_secs(1),
    )
    .await
    .unwrap_err();
    assert_eq!(
        err,
        ExecError::Timeout {
            timeout: Duration::from_secs(1)
        }
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    // The process (the script exec'd into sleep) is gone.
    let pid = std::fs::read_to_string(&pid_file).unwrap();
    let proc_dir = PathBuf::from(format!("/proc/{}", pid.trim()));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let state = std::fs::read_to_string(proc_dir.join("stat")).unwrap_or_default();
        // Gone, or a zombie waiting for the runtime to reap it.
        if state.is_empty() || state.split_whitespace().nth(2) == Some("Z") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "plugin {pid} still runs: {state}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Providers from `config` (fields of one provider) whose plugin `p` is `body`.
fn providers_with(dir: &Path, fields: &str, body: &str) -> CredentialProviders {
    script(dir, "p", body);
    let configs = parse_config(&provider(fields)).unwrap();
    CredentialProviders::new(configs, dir, Duration::from_secs(10))
}

fn calls(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join("calls"))
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

#[tokio::test]
async fn providers_give_keyring_credentials_and_cache_them() {
    let dir = tempfile::tempdir().unwrap();
    let body = format!(
        "echo call >> {}\ncat > /dev/null\necho '{ANSWER}'",
        dir.path().join("calls").display()
    );
    let providers = providers_with(
        dir.path(),
        &GOOD_FIELDS.replace("[registry.io]", "[r.io, other.io]"),
        &body,
    );
    let (keyring, problems) = providers.credentials(&image("r.io/app:1")).await;
    assert!(problems.is_empty(), "{problems:?}");
    let found = keyring.lookup(&image("r.io/app:1"));
    assert_eq!(found.len(), 1);
    assert_eq!(
        (found[0].username.as_str(), found[0].password.as_str()),
        ("u", "p")
    );
    assert_eq!(found[0].source, "credential provider p");
    assert_eq!(found[0].server_address, "r.io");
    // Cached (1m default, cacheKeyType Image): the same repository asks no more.
    providers.credentials(&image("r.io/app:2")).await;
    assert_eq!(calls(dir.path()), 1);
    // A matched image whose registry no auth key covers gets the answer but no credential.
    let (keyring, problems) = providers.credentials(&image("other.io/app:1")).await;
    assert!(problems.is_empty() && keyring.lookup(&image("other.io/app:1")).is_empty());
    assert_eq!(calls(dir.path()), 2);
    // An image the provider does not match never runs it.
    let (keyring, _) = providers.credentials(&image("third.io/app:1")).await;
    assert!(keyring.is_empty());
    assert_eq!(calls(dir.path()), 2);
}

#[tokio::test]
async fn concurrent_lookups_of_one_image_share_one_run() {
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("gate");
    // Each run waits for the gate file, so all lookups are in flight together.
    let body = format!(
        "echo call >> {calls}\nwhile [ ! -e {gate} ]; do sleep 0.01; done\necho '{ANSWER}'",
        calls = dir.path().join("calls").display(),
        gate = gate.display()
    );
    let providers = providers_with(
        dir.path(),
        &GOOD_FIELDS
            .replace("[registry.io]", "[r.io]")
            .replace("1m", "0s"),
        &body,
    );
    let lookups: Vec<_> = (0..4)
        .map(|_| {
            let providers = providers.clone();
            tokio::spawn(async move { providers.credentials(&image("r.io/app:1")).await.0.len() })
        })
        .collect();
    // Release the run only once all four lookups wait for it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while providers.waiting("p", "r.io/app") < 4 {
        assert!(
            Instant::now() < deadline,
            "{} lookups wait",
            providers.waiting("p", "r.io/app")
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    std::fs::write(&gate, "").unwrap();
    for lookup in lookups {
        assert_eq!(lookup.await.unwrap(), 1);
    }
    assert_eq!(calls(dir.path()), 1);
    // With no cache, the next lookup runs it again.
    providers.credentials(&image("r.io/app:1")).await;
    assert_eq!(calls(dir.path()), 2);
}

#[tokio::test]
async fn a_failing_provider_is_a_problem_and_nothing_is_cached() {
    let dir = tempfile::tempdir().unwrap();
    let body = format!(
        "echo call >> {}\necho 'token service unreachable' >&2\nexit 1",
        dir.path().join("calls").display()
    );
    let providers = providers_with(
        dir.path(),
        &GOOD_FIELDS.replace("[registry.io]", "[r.io]"),
        &body,
    );
    for round in 1..=2 {
        let (keyring, problems) = providers.credentials(&image("r.io/app:1")).await;
        assert!(keyring.is_empty());
        assert_eq!(
            problems,
            [
                "credential provider p failed: it exited with exit status: 1: token service unreachable"
            ]
        );
        assert_eq!(calls(dir.path()), round);
    }
}

#[test]
fn load_reads_the_default_only_if_it_exists_and_an_explicit_file_must() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("absent.yaml");
    let err = CredentialProviders::load(&CredentialProviderOptions {
        config_file: Some(missing.clone()),
        ..CredentialProviderOptions::default()
    })
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "the credential provider config {} (--plugin-config-file) does not exist",
            missing.display()
        )
    );
    let invalid = dir.path().join("bad.yaml");
    std::fs::write(&invalid, provider("name: p")).unwrap();
    let err = CredentialProviders::load(&CredentialProviderOptions {
        config_file: Some(invalid.clone()),
        ..CredentialProviderOptions::default()
    })
    .unwrap_err();
    let message = err.to_string();
    assert!(
        message.starts_with(&format!(
            "the credential provider config {} is invalid: providers[0].apiVersion: required",
            invalid.display()
        )),
        "{message}"
    );
    let good = dir.path().join("good.yaml");
    std::fs::write(&good, MINIMAL).unwrap();
    let loaded = CredentialProviders::load(&CredentialProviderOptions {
        config_file: Some(good),
        bin_dir: dir.path().to_owned(),
        exec_timeout: EXEC_TIMEOUT,
    })
    .unwrap();
    assert_eq!(format!("{loaded:?}"), "[\"ecr-credential-provider\"]");
    // The default file does not exist on a test machine: no plugins, no error.
    let none = CredentialProviders::load(&CredentialProviderOptions::default()).unwrap();
    assert!(none.is_empty());
}
