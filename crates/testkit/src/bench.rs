//! What the benches' `main`s share: the `--bench` guard, numbers and manager arguments from the
//! environment, medians.

/// Whether this run is `cargo bench --bench <name>`. `cargo test --all-targets` runs bench
/// targets too, without `--bench`: a control plane and thousands of objects are not something to
/// start by accident, so otherwise this says how to run it and the bench returns.
pub fn requested(name: &str) -> bool {
    let requested = std::env::args().any(|a| a == "--bench");
    if !requested {
        println!("{name}: run it with `cargo bench --bench {name}`");
    }
    requested
}

/// Environment variable `name` as a number of at least `min` (0 or 1), `default` when unset or
/// blank.
pub fn env_number(name: &str, default: usize, min: usize) -> Result<usize, String> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => match v.trim().parse::<usize>() {
            Ok(n) if n >= min => Ok(n),
            _ if min > 0 => Err(format!("{name}={v:?} is not a positive integer")),
            _ => Err(format!("{name}={v:?} is not a non-negative integer")),
        },
        _ => Ok(default),
    }
}

/// `MANAGER_ARGS`: extra arguments for the benches' `kruise-rs manager` (e.g.
/// `--kube-api-qps 0`), split on whitespace; none when unset.
pub fn manager_args() -> Vec<String> {
    std::env::var("MANAGER_ARGS")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// The median of `values` (NaN when there are none).
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The benches' result: any error, printed by `main`.
pub type Result<T, E = Box<dyn std::error::Error + Send + Sync>> = std::result::Result<T, E>;
