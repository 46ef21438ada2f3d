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
    let json =
        r#"{"auths": {"a.io": {"username": "u", "password": "hunter2"}, "b.io": {"username": 7}}}"#;
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
    assert!(matches!(err, SecretError::AuthNotBase64 { ref registry, .. } if registry.is_empty()));
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

#[test]
fn added_credentials_match_like_secret_keys() {
    let credential = |user: &str| Credential {
        username: user.into(),
        password: "pw".into(),
        identity_token: String::new(),
        registry_token: String::new(),
        server_address: String::new(),
        source: "credential provider p".into(),
    };
    let mut keyring = Keyring::default();
    assert!(keyring.add_credential("https://r.io/team", credential("team")));
    assert!(keyring.add_credential("*.r.io", credential("wild")));
    assert!(keyring.add_credential("r.io", credential("host")));
    // No host an image could have, or nothing to authenticate with: left out.
    assert!(!keyring.add_credential("bad host", credential("x")));
    assert!(!keyring.add_credential(
        "r.io",
        Credential {
            username: String::new(),
            password: String::new(),
            ..credential("")
        }
    ));
    assert_eq!(keyring.len(), 3);
    assert_eq!(users(&keyring, "r.io/team/app"), ["team", "host"]);
    assert_eq!(users(&keyring, "eu.r.io/app"), ["wild"]);
}
