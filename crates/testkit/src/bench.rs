//! What the benches' `main`s share: the `--bench` guard, numbers and manager arguments from the
//! environment, medians, and the slopes of a figure over cluster sizes.

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

/// How a figure grows with a cluster: `y ≈ base + per_node·nodes + per_pod·pods`, fitted by least
/// squares over `(nodes, pods, y)` points. A slope is `None` when its size does not vary among
/// the points (or they cannot tell the two apart); with one size varying, the other's points are
/// fitted alone.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Slopes {
    pub per_node: Option<f64>,
    pub per_pod: Option<f64>,
}

pub fn slopes(points: &[(f64, f64, f64)]) -> Slopes {
    let points: Vec<_> = points.iter().copied().filter(|p| p.2.is_finite()).collect();
    let varies = |f: fn(&(f64, f64, f64)) -> f64| points.iter().any(|p| f(p) != f(&points[0]));
    let (nodes_vary, pods_vary) = (varies(|p| p.0), varies(|p| p.1));
    // Least squares on centred values: the slopes solve [sxx sxz; sxz szz]·b = [sxy; szy].
    let n = points.len() as f64;
    let mean = |f: fn(&(f64, f64, f64)) -> f64| points.iter().map(f).sum::<f64>() / n;
    let (mx, mz, my) = (mean(|p| p.0), mean(|p| p.1), mean(|p| p.2));
    let sum = |f: &dyn Fn(f64, f64, f64) -> f64| {
        points
            .iter()
            .map(|p| f(p.0 - mx, p.1 - mz, p.2 - my))
            .sum::<f64>()
    };
    let (sxx, szz, sxz) = (
        sum(&|x, _, _| x * x),
        sum(&|_, z, _| z * z),
        sum(&|x, z, _| x * z),
    );
    let (sxy, szy) = (sum(&|x, _, y| x * y), sum(&|_, z, y| z * y));
    match (nodes_vary, pods_vary) {
        (true, true) => {
            let det = sxx * szz - sxz * sxz;
            if det.abs() <= f64::EPSILON * sxx * szz {
                return Slopes {
                    per_node: None,
                    per_pod: None,
                };
            }
            Slopes {
                per_node: Some((sxy * szz - szy * sxz) / det),
                per_pod: Some((szy * sxx - sxy * sxz) / det),
            }
        }
        (true, false) => Slopes {
            per_node: Some(sxy / sxx),
            per_pod: None,
        },
        (false, true) => Slopes {
            per_node: None,
            per_pod: Some(szy / szz),
        },
        (false, false) => Slopes {
            per_node: None,
            per_pod: None,
        },
    }
}

/// The benches' result: any error, printed by `main`.
pub type Result<T, E = Box<dyn std::error::Error + Send + Sync>> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: Option<f64>, b: f64) -> bool {
        a.is_some_and(|a| (a - b).abs() < 1e-9)
    }

    #[test]
    fn slopes_recover_a_plane_and_say_what_the_sizes_cannot_tell() {
        // y = 20 + 0.004·nodes + 0.002·pods, at the sizes the memory bench runs.
        let y = |n: f64, p: f64| 20.0 + 0.004 * n + 0.002 * p;
        let sizes = [(1e3, 1e4), (5e3, 1e4), (5e3, 3e4), (5e3, 6e4)];
        let points: Vec<_> = sizes.iter().map(|&(n, p)| (n, p, y(n, p))).collect();
        let s = slopes(&points);
        assert!(close(s.per_node, 0.004) && close(s.per_pod, 0.002), "{s:?}");
        // One size fixed: the other's slope alone.
        let s = slopes(&points[1..]);
        assert!(s.per_node.is_none() && close(s.per_pod, 0.002), "{s:?}");
        let s = slopes(&points[..2]);
        assert!(close(s.per_node, 0.004) && s.per_pod.is_none(), "{s:?}");
        // Sizes that grow together cannot be told apart; one point says nothing; a run that
        // stopped (NaN) is left out.
        let together = [(1e3, 1e4, 30.0), (2e3, 2e4, 40.0), (3e3, 3e4, 50.0)];
        assert_eq!(
            slopes(&together),
            Slopes {
                per_node: None,
                per_pod: None
            }
        );
        assert_eq!(slopes(&points[..1]).per_pod, None);
        let mut with_gap = points.clone();
        with_gap.push((5e3, 9e4, f64::NAN));
        assert!(close(slopes(&with_gap).per_pod, 0.002));
    }
}
