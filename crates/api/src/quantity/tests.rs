use super::go_quantity_text;

/// Produced by `json.Marshal` of a `resource.Quantity` decoded from each input
/// (k8s.io/apimachinery v0.36.3).
const GO: &[(&str, &str)] = &[
    ("0", "0"),
    ("00", "0"),
    ("0.0", "0"),
    ("0.1", "100m"),
    ("100m", "100m"),
    ("1000m", "1"),
    ("1", "1"),
    ("1000", "1k"),
    ("1k", "1k"),
    ("1.5", "1500m"),
    ("1.500", "1.500"),
    ("012", "012"),
    ("+1", "+1"),
    ("-1", "-1"),
    ("-0.5", "-500m"),
    ("1e3", "1e3"),
    ("1E3", "1E3"),
    ("1.5e3", "1500"),
    ("1e-3", "1e-3"),
    ("1e-12", "1e-9"),
    ("0.0000000001", "1n"),
    ("1.0000000001", "1000000001n"),
    ("1Ki", "1Ki"),
    ("1024", "1024"),
    ("1024Mi", "1Gi"),
    ("1000Mi", "1000Mi"),
    ("8Mi", "8Mi"),
    ("3Ki", "3Ki"),
    ("1.5Ki", "1536"),
    ("1.5Gi", "1536Mi"),
    ("0.5Ki", "512"),
    ("0.5Mi", "512Ki"),
    ("1025Ki", "1025Ki"),
    ("128974848", "128974848"),
    ("129e6", "129e6"),
    ("129M", "129M"),
    ("123Mi", "123Mi"),
    ("1G", "1G"),
    ("1Gi", "1Gi"),
    ("1.1Gi", "1181116006400m"),
    ("1000000000000000000000", "1"),
    ("1000E", "1"),
    ("12345678901234567890123", "12345678901234567890123"),
    ("1e100", "10e99"),
    ("8Ei", "9223372036854775807"),
    ("16Ei", "9223372036854775807"),
    ("100000Ei", "9223372036854775807"),
    ("1.5M", "1500k"),
    ("2.5", "2500m"),
    ("250m", "250m"),
    ("0.25", "250m"),
    (" 100m ", "100m"),
    ("1.", "1."),
    (".5", "500m"),
    ("1.G", "1.G"),
    ("5e0", "5e0"),
    ("5e+3", "5e+3"),
    ("5E-3", "5E-3"),
    ("999999999999999999", "999999999999999999"),
    ("9999999999999999999", "9999999999999999999"),
    ("-1Ki", "-1Ki"),
    ("-1023Ki", "-1023Ki"),
    ("1n", "1n"),
    ("0.5n", "1n"),
    ("1u", "1u"),
    ("1.23456789", "1234567890n"),
    ("1.234567891", "1.234567891"),
    ("123456789012345678", "123456789012345678"),
    ("1234567890123456789", "1234567890123456789"),
    ("10e2", "1e3"),
    ("2e1", "20"),
    ("0.001", "1m"),
    ("0.010", "10m"),
    ("50.0", "50"),
    ("1Mi", "1Mi"),
    ("1048576", "1048576"),
    ("1048577", "1048577"),
];

#[test]
fn renders_every_quantity_exactly_as_go_does() {
    for (input, expected) in GO {
        assert_eq!(
            go_quantity_text(input).as_deref(),
            Some(*expected),
            "input {input:?}"
        );
    }
}

#[test]
fn rejects_what_go_rejects_without_panicking() {
    for input in [
        "", "  ", "1e", "1Q", "abc", "1m1", "--1", "1.2.3", "é", "1é", "Pi", "-Ei", "e-11",
    ] {
        assert_eq!(go_quantity_text(input), None, "input {input:?}");
    }
}

#[test]
fn random_inputs_never_panic_and_rendering_is_stable() {
    // Go's canonical text decodes to itself, so rendering twice changes nothing.
    const ALPHABET: &[u8] = b"0123456789.+-eEinumkKMGTP ";
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..20_000 {
        let len = (next() % 14) as usize;
        let input: String = (0..len)
            .map(|_| char::from(ALPHABET[(next() % ALPHABET.len() as u64) as usize]))
            .collect();
        if let Some(out) = go_quantity_text(&input) {
            assert_eq!(
                go_quantity_text(&out).as_deref(),
                Some(out.as_str()),
                "input {input:?}"
            );
        }
    }
}

#[test]
fn parses_exact_nanos_and_renders_them_back() {
    use super::{Format, parse_nanos, render_nanos};
    let cases: &[(&str, i128, Format, &str)] = &[
        ("0", 0, Format::DecimalSi, "0"),
        ("100m", 100_000_000, Format::DecimalSi, "100m"),
        ("1.5", 1_500_000_000, Format::DecimalSi, "1500m"),
        ("1Ki", 1024 * 1_000_000_000, Format::BinarySi, "1Ki"),
        (
            "1.5Gi",
            1_610_612_736 * 1_000_000_000,
            Format::BinarySi,
            "1536Mi",
        ),
        ("1e3", 1000 * 1_000_000_000, Format::DecimalExponent, "1e3"),
        ("0.5n", 1, Format::DecimalSi, "1n"),
        ("-1", -1_000_000_000, Format::DecimalSi, "-1"),
        ("1e-12", 1, Format::DecimalExponent, "1e-9"),
        (
            "16Ei",
            i64::MAX as i128 * 1_000_000_000,
            Format::BinarySi,
            "9223372036854775807",
        ),
    ];
    for (input, nanos, format, text) in cases {
        assert_eq!(parse_nanos(input), Some((*nanos, *format)), "{input}");
        assert_eq!(render_nanos(*nanos, *format), *text, "{input}");
    }
    assert_eq!(parse_nanos("1Q"), None);
    assert_eq!(parse_nanos("1e2147483647"), None);
    // 500Mi × 0.5 computed in millis keeps the binary format.
    assert_eq!(
        render_nanos(268_435_456 * 1_000_000_000, Format::BinarySi),
        "256Mi"
    );
    assert_eq!(render_nanos(500_000_000, Format::BinarySi), "500m");
}

#[test]
fn absurd_exponents_do_not_blow_up() {
    assert!(go_quantity_text("1e2147483647").is_some());
    assert!(go_quantity_text("1.5e-2147483648").is_some());
    assert!(go_quantity_text("99999999999999999999999999999999Ei").is_some());
}
