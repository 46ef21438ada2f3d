use super::*;
use ImageRefErrorKind as K;

const HEX64: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fn sha256() -> String {
    format!("sha256:{HEX64}")
}

/// One row per accepted reference; the expected values follow docker/distribution v2.8.2.
struct Case {
    input: String,
    registry: &'static str,
    repository: &'static str,
    familiar: &'static str,
    tag: Option<&'static str>,
    digest: Option<String>,
    pull: String,
}

impl Case {
    fn nodeimage_tag(&self) -> String {
        let tag = self.tag.unwrap_or("latest");
        self.digest.clone().unwrap_or_else(|| tag.to_owned())
    }
}

fn case(
    input: &str,
    registry: &'static str,
    repository: &'static str,
    familiar: &'static str,
    tag: Option<&'static str>,
    digest: Option<&str>,
    pull: &str,
) -> Case {
    Case {
        input: input.to_owned(),
        registry,
        repository,
        familiar,
        tag,
        digest: digest.map(str::to_owned),
        pull: pull.to_owned(),
    }
}

#[rustfmt::skip]
fn valid_cases() -> Vec<Case> {
    let d = &sha256();
    let sha512 = &format!("sha512:{}", "f".repeat(128));
    let sha384 = &format!("sha384:{}", "e".repeat(96));
    vec![
        //   input                                registry                   repository       familiar name                     tag            digest        pull reference
        case("nginx",                             "docker.io",               "library/nginx", "nginx",                          None,          None,         "docker.io/library/nginx:latest"),
        case("nginx:1.25",                        "docker.io",               "library/nginx", "nginx",                          Some("1.25"),  None,         "docker.io/library/nginx:1.25"),
        case("library/nginx",                     "docker.io",               "library/nginx", "nginx",                          None,          None,         "docker.io/library/nginx:latest"),
        case("docker.io/library/nginx:1.25",      "docker.io",               "library/nginx", "nginx",                          Some("1.25"),  None,         "docker.io/library/nginx:1.25"),
        case("docker.io/nginx",                   "docker.io",               "library/nginx", "nginx",                          None,          None,         "docker.io/library/nginx:latest"),
        case("docker.io/foo/bar",                 "docker.io",               "foo/bar",       "foo/bar",                        None,          None,         "docker.io/foo/bar:latest"),
        case("foo/bar:v2",                        "docker.io",               "foo/bar",       "foo/bar",                        Some("v2"),    None,         "docker.io/foo/bar:v2"),
        // docker rewrites the legacy Hub host.
        case("index.docker.io/library/nginx",     "docker.io",               "library/nginx", "nginx",                          None,          None,         "docker.io/library/nginx:latest"),
        case("index.docker.io/nginx:1",           "docker.io",               "library/nginx", "nginx",                          Some("1"),     None,         "docker.io/library/nginx:1"),
        // `library/` is only stripped when exactly one component follows it.
        case("docker.io/library/a/b",             "docker.io",               "library/a/b",   "library/a/b",                    None,          None,         "docker.io/library/a/b:latest"),
        case("library",                           "docker.io",               "library/library", "library",                      None,          None,         "docker.io/library/library:latest"),
        case("docker.io/library/foo.com",         "docker.io",               "library/foo.com", "foo.com",                      None,          None,         "docker.io/library/foo.com:latest"),
        case("ghcr.io/org/app:v1",                "ghcr.io",                 "org/app",       "ghcr.io/org/app",                Some("v1"),    None,         "ghcr.io/org/app:v1"),
        case("ghcr.io/app",                       "ghcr.io",                 "app",           "ghcr.io/app",                    None,          None,         "ghcr.io/app:latest"),
        case("127.0.0.1:5000/team/app:1",         "127.0.0.1:5000",          "team/app",      "127.0.0.1:5000/team/app",        Some("1"),     None,         "127.0.0.1:5000/team/app:1"),
        case("localhost:5000/app",                "localhost:5000",          "app",           "localhost:5000/app",             None,          None,         "localhost:5000/app:latest"),
        case("localhost/app",                     "localhost",               "app",           "localhost/app",                  None,          None,         "localhost/app:latest"),
        // Without a '/', `localhost:5000` is Hub image `localhost` with tag `5000`.
        case("localhost:5000",                    "docker.io",               "library/localhost", "localhost",                  Some("5000"),  None,         "docker.io/library/localhost:5000"),
        case("localhost",                         "docker.io",               "library/localhost", "localhost",                  None,          None,         "docker.io/library/localhost:latest"),
        // A first component without '.' or ':' is a Hub namespace, not a host.
        case("myregistry/app",                    "docker.io",               "myregistry/app", "myregistry/app",                None,          None,         "docker.io/myregistry/app:latest"),
        case("registry.example.com:443/a/b/c:tag", "registry.example.com:443", "a/b/c",        "registry.example.com:443/a/b/c", Some("tag"),   None,         "registry.example.com:443/a/b/c:tag"),
        // Hosts may be upper case and are kept as written, as docker does.
        case("Registry.Example.com/app",          "Registry.Example.com",    "app",           "Registry.Example.com/app",       None,          None,         "Registry.Example.com/app:latest"),
        case("test.com:tag",                      "docker.io",               "library/test.com", "test.com",                    Some("tag"),   None,         "docker.io/library/test.com:tag"),
        case("xn--n3h.com/myimage:xn--n3h.com",   "xn--n3h.com",             "myimage",       "xn--n3h.com/myimage",            Some("xn--n3h.com"), None,   "xn--n3h.com/myimage:xn--n3h.com"),
        case("a-b/c__d/e---f/g.h/i_j:T_a.g-1",    "docker.io",               "a-b/c__d/e---f/g.h/i_j", "a-b/c__d/e---f/g.h/i_j", Some("T_a.g-1"), None,   "docker.io/a-b/c__d/e---f/g.h/i_j:T_a.g-1"),
        case("nginx:_private",                    "docker.io",               "library/nginx", "nginx",                          Some("_private"), None,      "docker.io/library/nginx:_private"),
        case(&format!("repo@{d}"),                "docker.io",               "library/repo",  "repo",                           None,          Some(d),      &format!("docker.io/library/repo@{d}")),
        // Digest wins over tag for the NodeImage entry and the pull (ParseDockerRef semantics).
        case(&format!("repo:tag@{d}"),            "docker.io",               "library/repo",  "repo",                           Some("tag"),   Some(d),      &format!("docker.io/library/repo@{d}")),
        case(&format!("127.0.0.1:5000/a/b@{d}"),  "127.0.0.1:5000",          "a/b",           "127.0.0.1:5000/a/b",             None,          Some(d),      &format!("127.0.0.1:5000/a/b@{d}")),
        case(&format!("ghcr.io/org/app:v1@{d}"),  "ghcr.io",                 "org/app",       "ghcr.io/org/app",                Some("v1"),    Some(d),      &format!("ghcr.io/org/app@{d}")),
        case(&format!("repo@{sha512}"),           "docker.io",               "library/repo",  "repo",                           None,          Some(sha512), &format!("docker.io/library/repo@{sha512}")),
        case(&format!("repo@{sha384}"),           "docker.io",               "library/repo",  "repo",                           None,          Some(sha384), &format!("docker.io/library/repo@{sha384}")),
        // A 64-hex string is a valid name once it has a tag (docker only rejects it bare).
        case(&format!("{HEX64}:1"),               "docker.io",               "library/0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", Some("1"), None, &format!("docker.io/library/{HEX64}:1")),
    ]
}

#[test]
fn parses_and_normalizes_like_docker() {
    for c in valid_cases() {
        let input = c.input.as_str();
        let r = ImageRef::parse(input).unwrap_or_else(|e| panic!("{input}: {e}"));
        assert_eq!(r.registry(), c.registry, "registry of {input}");
        assert_eq!(r.repository(), c.repository, "repository of {input}");
        let name = format!("{}/{}", c.registry, c.repository);
        assert_eq!(r.name(), name, "name of {input}");
        assert_eq!(r.familiar_name(), c.familiar, "familiar name of {input}");
        assert_eq!(r.tag(), c.tag, "tag of {input}");
        assert_eq!(r.digest(), c.digest.as_deref(), "digest of {input}");
        assert_eq!(
            r.nodeimage_tag(),
            c.nodeimage_tag(),
            "nodeimage tag of {input}"
        );
        assert_eq!(r.to_pull_ref(), c.pull, "pull ref of {input}");
        assert_eq!(r.to_string(), c.pull, "display of {input}");
        assert_eq!(input.parse::<ImageRef>().as_ref(), Ok(&r));
    }
}

#[test]
fn nodeimage_key_round_trips_to_an_equivalent_reference() {
    for c in valid_cases() {
        let input = c.input.as_str();
        let r = ImageRef::parse(input).unwrap_or_else(|e| panic!("{input}: {e}"));
        let pull = pull_ref_for(r.familiar_name(), r.nodeimage_tag())
            .unwrap_or_else(|e| panic!("{input}: {e}"));
        assert_eq!(pull, r.to_pull_ref(), "round trip of {input}");
        // The pull reference maps back to the same NodeImage key and is a fixed point.
        let back = ImageRef::parse(&pull).unwrap_or_else(|e| panic!("{pull}: {e}"));
        assert_eq!(
            (back.familiar_name(), back.nodeimage_tag()),
            (r.familiar_name(), r.nodeimage_tag()),
            "key of {pull}"
        );
        assert_eq!(back.to_pull_ref(), pull);
    }
}

#[test]
fn pull_ref_for_digest_uses_at_not_colon() {
    // Upstream's #2534 built `name:sha256:…`, which no runtime can pull.
    let d = sha256();
    let cases = [
        ("nginx", d.as_str(), format!("docker.io/library/nginx@{d}")),
        (
            "127.0.0.1:5000/team/app",
            &d,
            format!("127.0.0.1:5000/team/app@{d}"),
        ),
        ("nginx", "1.25", "docker.io/library/nginx:1.25".to_owned()),
        (
            "localhost:5000/app",
            "5000",
            "localhost:5000/app:5000".to_owned(),
        ),
        // Names that are not in familiar form are accepted too.
        (
            "docker.io/library/nginx",
            "latest",
            "docker.io/library/nginx:latest".to_owned(),
        ),
        // A bare 64-hex reference is an image ID, but as a NodeImage name with a tag it is fine.
        (HEX64, "1", format!("docker.io/library/{HEX64}:1")),
    ];
    for (name, tag, want) in cases {
        assert_eq!(pull_ref_for(name, tag), Ok(want), "({name}, {tag})");
    }
    let r = ImageRef::from_nodeimage("ghcr.io/org/app", &d).expect("valid");
    assert_eq!((r.tag(), r.digest()), (None, Some(d.as_str())));
    let r = ImageRef::from_nodeimage("ghcr.io/org/app", "v1").expect("valid");
    assert_eq!((r.tag(), r.digest()), (Some("v1"), None));
}

#[test]
fn joined_ref_names_a_digest_with_at_and_keeps_the_name_as_written() {
    let d = sha256();
    assert_eq!(joined_ref("nginx", "1.25"), "nginx:1.25");
    assert_eq!(joined_ref("nginx", &d), format!("nginx@{d}"));
    assert_eq!(
        joined_ref("127.0.0.1:5000/team/app", &d),
        format!("127.0.0.1:5000/team/app@{d}")
    );
    // A registry port is part of the name, not a tag.
    assert_eq!(
        joined_ref("localhost:5000/app", "5000"),
        "localhost:5000/app:5000"
    );
    // Not validated: what the user wrote reads back, even when it is no valid reference.
    assert_eq!(joined_ref("Bad Name", "v 1"), "Bad Name:v 1");
    assert_eq!(joined_ref("", ""), ":");
    // Any algorithm counts as a digest, as in `from_nodeimage`.
    assert_eq!(joined_ref("app", "sha512:ab"), "app@sha512:ab");
    // The parsed pair displays the same reference in its fully qualified form.
    let parsed = ImageRef::from_nodeimage("127.0.0.1:5000/team/app", &d).expect("valid");
    assert_eq!(
        parsed.to_string(),
        joined_ref("127.0.0.1:5000/team/app", &d)
    );
}

#[rustfmt::skip]
fn bad_pairs() -> Vec<(String, String, ImageRefErrorKind)> {
    let d = sha256();
    let s = |x: &str| x.to_owned();
    vec![
        (s("nginx"),          s(""),           K::InvalidTag(s(""))),
        (s("nginx"),          s("a/b"),        K::InvalidTag(s("a/b"))),
        (s("nginx"),          s(".x"),         K::InvalidTag(s(".x"))),
        (s("nginx"),          s("sha256:abc"), K::DigestLength { algorithm: s("sha256"), expected: 64, actual: 3 }),
        (s("nginx"),          s("md5:abc"),    K::UnsupportedDigestAlgorithm(s("md5"))),
        (s("nginx:1"),        s("2"),          K::NameHasTagOrDigest(s("nginx:1"))),
        // Without a '/', the port reads as a tag: the name alone is ambiguous.
        (s("localhost:5000"), s("v1"),         K::NameHasTagOrDigest(s("localhost:5000"))),
        (format!("nginx@{d}"), s("latest"),    K::NameHasTagOrDigest(format!("nginx@{d}"))),
        (s(""),               s("latest"),     K::Empty),
        (s("Nginx"),          s("latest"),     K::UppercaseRepository(s("Nginx"))),
    ]
}

#[test]
fn pull_ref_for_rejects_bad_pairs() {
    for (name, tag, kind) in bad_pairs() {
        let err = pull_ref_for(&name, &tag).expect_err(&name);
        assert_eq!(err.kind(), &kind, "({name:?}, {tag:?})");
        assert!(
            err.to_string().starts_with("invalid image reference "),
            "{err}"
        );
    }
}

#[rustfmt::skip]
fn invalid_cases() -> Vec<(String, ImageRefErrorKind)> {
    let d = sha256();
    let upper = HEX64.to_uppercase();
    let s = |x: &str| x.to_owned();
    vec![
        (s(""),                                   K::Empty),
        (s(":tag"),                               K::MissingName),
        (format!("@{d}"),                         K::MissingName),
        (s(HEX64),                                K::HexIdentifier),
        (s("UPPER/case"),                         K::UppercaseRepository(s("UPPER"))),
        (s("Uppercase/lowercase:tag"),            K::UppercaseRepository(s("Uppercase"))),
        (s("docker.io/Foo/bar"),                  K::UppercaseRepository(s("Foo"))),
        (s("test:5000/Uppercase/lowercase:tag"),  K::UppercaseRepository(s("Uppercase"))),
        (s("a@sha256:short"),                     K::InvalidDigest(s("sha256:short"))),
        (s("a@sha256:abcdef"),                    K::DigestLength { algorithm: s("sha256"), expected: 64, actual: 6 }),
        (format!("a@sha512:{HEX64}"),             K::DigestLength { algorithm: s("sha512"), expected: 128, actual: 64 }),
        (format!("a@sha256:{upper}"),             K::InvalidDigest(format!("sha256:{upper}"))),
        (format!("a@sha1:{HEX64}"),               K::UnsupportedDigestAlgorithm(s("sha1"))),
        (format!("a@SHA256:{HEX64}"),             K::UnsupportedDigestAlgorithm(s("SHA256"))),
        (format!("a@:{HEX64}"),                   K::InvalidDigest(format!(":{HEX64}"))),
        (s("a@"),                                 K::InvalidDigest(s(""))),
        (format!("a@{d}@{d}"),                    K::InvalidDigest(format!("{d}@{d}"))),
        (s("a:b:c"),                              K::InvalidPathComponent(s("a:b"))),
        (s("nginx:"),                             K::InvalidTag(s(""))),
        (s("nginx:-x"),                           K::InvalidTag(s("-x"))),
        (s("nginx:tägé"),                         K::InvalidTag(s("tägé"))),
        (format!("nginx:{}", "t".repeat(129)),    K::InvalidTag("t".repeat(129))),
        (s("ñginx"),                              K::InvalidPathComponent(s("ñginx"))),
        (s(" nginx"),                             K::InvalidPathComponent(s(" nginx"))),
        (s("nginx "),                             K::InvalidPathComponent(s("nginx "))),
        (s("ng inx"),                             K::InvalidPathComponent(s("ng inx"))),
        (s("nginx/"),                             K::InvalidPathComponent(s(""))),
        (s("/nginx"),                             K::InvalidPathComponent(s(""))),
        (s("a//b"),                               K::InvalidPathComponent(s(""))),
        (s("localhost/"),                         K::InvalidPathComponent(s(""))),
        (s("a/./b"),                              K::InvalidPathComponent(s("."))),
        (s("-a"),                                 K::InvalidPathComponent(s("-a"))),
        (s("a-"),                                 K::InvalidPathComponent(s("a-"))),
        (s("a..b"),                               K::InvalidPathComponent(s("a..b"))),
        (s("a___b"),                              K::InvalidPathComponent(s("a___b"))),
        (s("a._b"),                               K::InvalidPathComponent(s("a._b"))),
        (s("a\nb"),                               K::InvalidPathComponent(s("a\nb"))),
        (s("aa/asdf$$^/aa"),                      K::InvalidPathComponent(s("asdf$$^"))),
        (s("localhost:/a"),                       K::InvalidRegistry(s("localhost:"))),
        (s("host:port/a"),                        K::InvalidRegistry(s("host:port"))),
        (s("-bad.com/a"),                         K::InvalidRegistry(s("-bad.com"))),
        (s("bad-.com/a"),                         K::InvalidRegistry(s("bad-.com"))),
        (s("a..com/a"),                           K::InvalidRegistry(s("a..com"))),
        // docker would read this as a registry-less path no runtime can pull.
        (s("a_b.c/d"),                            K::InvalidRegistry(s("a_b.c"))),
        // IPv6 literals are not in docker/distribution v2.8.2's grammar.
        (s("[::1]:5000/a"),                       K::InvalidRegistry(s("[::1]:5000"))),
        (s("host:5000:6000/a"),                   K::InvalidRegistry(s("host:5000:6000"))),
        // FamiliarName would turn these into `localhost/x`, `foo.com/x`, …: other registries.
        (s("docker.io/localhost/x"),              K::AmbiguousFamiliarName(s("localhost"))),
        (s("index.docker.io/foo.com/x:1"),        K::AmbiguousFamiliarName(s("foo.com"))),
        (s("docker.io/docker.io/x"),              K::AmbiguousFamiliarName(s("docker.io"))),
    ]
}

#[test]
fn rejects_invalid_references_with_the_reason() {
    for (input, kind) in invalid_cases() {
        let err = ImageRef::parse(&input).expect_err(&input);
        assert_eq!(err.kind(), &kind, "kind for {input:?}");
        assert_eq!(err.input(), input);
        let msg = err.to_string();
        assert!(msg.starts_with("invalid image reference "), "{msg}");
        let quoted = format!("{input:?}");
        assert!(msg.contains(&quoted), "message quotes the input: {msg}");
    }
}

#[test]
fn name_length_counts_the_normalized_name() {
    let too_long = |input: &str| match ImageRef::parse(input).map_err(|e| e.kind().clone()) {
        Err(K::NameTooLong { len, .. }) => Some(len),
        _ => None,
    };
    // `docker.io/library/` is 18 characters; docker limits the whole name to 255.
    let fits = "a".repeat(NAME_MAX_LEN - 18);
    assert_eq!(
        ImageRef::parse(&fits).map(|r| r.name().len()),
        Ok(NAME_MAX_LEN)
    );
    assert_eq!(too_long(&"a".repeat(NAME_MAX_LEN - 17)), Some(256));
    assert_eq!(too_long(&"a".repeat(300)), Some(318));
    // The registry counts too (oci-spec counts only the repository).
    assert_eq!(
        too_long(&format!("registry.example.com/{}", "a".repeat(240))),
        Some(261)
    );
    // A 128-character tag is the longest allowed.
    let tag = "t".repeat(128);
    let parsed = ImageRef::parse(&format!("nginx:{tag}"));
    assert_eq!(parsed.map(|r| r.nodeimage_tag().len()), Ok(128));
}

#[test]
fn error_message_truncates_huge_inputs() {
    let input = format!("{}/", "a".repeat(10_000));
    let err = ImageRef::parse(&input).expect_err("trailing slash");
    let msg = err.to_string();
    assert!(msg.len() < 600, "message is {} bytes", msg.len());
    assert!(msg.contains('…'), "{msg}");
    assert_eq!(err.input(), input);
}

#[test]
fn never_panics_on_nasty_inputs() {
    let nasty = [
        "",
        " ",
        "\t",
        "\0",
        ":",
        "@",
        "/",
        "//",
        ":/",
        "@:",
        ":@",
        "a:",
        "a@",
        "@a",
        ":tag",
        "a:b:c",
        "a@b@c",
        "a/@b",
        "::::",
        "/:@",
        "🐳",
        "ñ",
        "naïve/app",
        "a\u{200b}b",
        "\u{feff}nginx",
        "nginx:🐳",
        "nginx@sha256:🐳",
        "UPPER/case",
        "localhost:",
        "localhost:/",
        "[",
        "[::1]/a",
        "a/b/",
        "a:1/",
        "sha256:",
        "x@sha256:short",
        "x:y@sha256:",
        ".",
        "..",
        "-",
        "_",
        "__",
        "a/-",
        "é.com/a",
        "a.é/b",
        "a:9999999999999999999999999/b",
    ];
    let long = [
        "a".repeat(300),
        format!("{}:tag", "a/".repeat(150)),
        format!("{}/a", "x.".repeat(200)),
        format!("a:{}", "1".repeat(300)),
        format!("a@sha256:{}", "f".repeat(300)),
        "é".repeat(300),
        "@".repeat(300),
        ":".repeat(300),
    ];
    for input in nasty.iter().copied().chain(long.iter().map(String::as_str)) {
        // Getting through each call is the test; an accepted input must also be stable.
        if let Ok(r) = ImageRef::parse(input) {
            let again = ImageRef::parse(&r.to_pull_ref()).map(|p| p.to_pull_ref());
            assert_eq!(again, Ok(r.to_pull_ref()), "{input:?}");
        }
        let _ = pull_ref_for(input, input);
        let _ = pull_ref_for("nginx", input);
        let _ = pull_ref_for(input, "latest");
    }
}

/// Random strings over the grammar's alphabet (and a few characters outside it): nothing
/// panics, and whatever parses keeps its NodeImage key through `to_pull_ref` and `pull_ref_for`.
#[test]
fn random_inputs_are_stable() {
    const ALPHABET: &[&str] = &[
        "a",
        "b",
        "z",
        "0",
        "9",
        "A",
        "Z",
        ".",
        "_",
        "-",
        "/",
        ":",
        "@",
        "sha256:",
        HEX64,
        "localhost",
        "docker.io",
        "index.docker.io",
        "library",
        "ghcr.io",
        "5000",
        "é",
        " ",
    ];
    // xorshift64: deterministic and dependency-free.
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut accepted = 0;
    for _ in 0..20_000 {
        let len = next() % 8;
        let input: String = (0..len)
            .map(|_| ALPHABET[(next() % ALPHABET.len() as u64) as usize])
            .collect();
        let Ok(r) = ImageRef::parse(&input) else {
            continue;
        };
        accepted += 1;
        let pull = r.to_pull_ref();
        let again = ImageRef::parse(&pull).unwrap_or_else(|e| panic!("{input:?} -> {pull}: {e}"));
        assert_eq!(again.to_pull_ref(), pull, "{input:?}");
        assert_eq!(
            (again.familiar_name(), again.nodeimage_tag()),
            (r.familiar_name(), r.nodeimage_tag()),
            "{input:?}"
        );
        let key = (r.familiar_name(), r.nodeimage_tag());
        assert_eq!(pull_ref_for(key.0, key.1), Ok(pull), "{input:?}");
        // The familiar name is itself a name that normalizes back to the same one.
        let familiar = ImageRef::from_nodeimage(r.familiar_name(), "latest");
        let familiar = familiar.map(|f| f.name().to_owned());
        assert_eq!(familiar, Ok(r.name().to_owned()), "{input:?}");
    }
    assert!(accepted > 500, "only {accepted} random inputs parsed");
}
