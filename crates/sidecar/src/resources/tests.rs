use super::*;
use kruise_rs_api::quantity::expr::validate;
use serde_json::{Value, json};

fn container(v: Value) -> Container {
    serde_json::from_value(v).expect("container")
}

/// A container with `limits` and `requests` given as `[cpu, memory]`, `""` meaning unset.
fn app(name: &str, limits: [&str; 2], requests: [&str; 2]) -> Value {
    let list = |values: [&str; 2]| {
        let mut m = serde_json::Map::new();
        for (k, v) in ["cpu", "memory"].into_iter().zip(values) {
            if !v.is_empty() {
                m.insert(k.into(), json!(v));
            }
        }
        Value::Object(m)
    };
    json!({"name": name, "image": "nginx", "resources": {"limits": list(limits), "requests": list(requests)}})
}

fn policy(mode: &str, regex: &str, limits: Value, requests: Value) -> ResourcesPolicy {
    serde_json::from_value(json!({
        "targetContainersMode": mode,
        "targetContainersNameRegex": regex,
        "resourcesExpr": {"limits": limits, "requests": requests}
    }))
    .expect("policy")
}

fn pod_spec(init: Value, containers: Value) -> PodSpec {
    serde_json::from_value(json!({"initContainers": init, "containers": containers})).expect("spec")
}

/// The sidecar's resources after the policy, as JSON.
fn apply(spec: &PodSpec, policy: &ResourcesPolicy, sidecars: &[&str]) -> Value {
    let mut sidecar = container(json!({"name": "sidecar1", "image": "sidecar"}));
    let names: HashSet<&str> = sidecars.iter().copied().collect();
    apply_resources_policy(&mut sidecar, policy, spec, &names).expect("policy applies");
    serde_json::to_value(sidecar.resources.expect("resources")).expect("JSON")
}

fn eval(expr: &str, resource: Resource, value: &str) -> Result<String, ExprError> {
    let variable = Qty::parse(value).expect("variable");
    Ok(ResourceExpr::parse(expr, resource)?
        .evaluate(&variable)?
        .to_text())
}

fn two_engines() -> PodSpec {
    pod_spec(
        json!([]),
        json!([
            app("large.engine.v4", ["200m", "200Mi"], ["50m", "100Mi"]),
            app("large.engine.v8", ["400m", "400Mi"], ["100m", "200Mi"])
        ]),
    )
}

// Upstream TestApplyResourcesPolicy, case by case.

#[test]
fn sum_mode_with_percentages() {
    let p = policy(
        "sum",
        ".*",
        json!({"cpu": "cpu*50%", "memory": "200Mi"}),
        json!({"cpu": "cpu*50%", "memory": "100Mi"}),
    );
    assert_eq!(
        apply(&two_engines(), &p, &[]),
        json!({"limits": {"cpu": "300m", "memory": "200Mi"}, "requests": {"cpu": "75m", "memory": "100Mi"}})
    );
}

#[test]
fn max_mode_with_a_floor() {
    let p = policy(
        "max",
        "^large.engine.v.*$",
        json!({"cpu": "max(cpu*50%, 50m)", "memory": "200Mi"}),
        json!({"cpu": "max(cpu*50%, 50m)", "memory": "100Mi"}),
    );
    assert_eq!(
        apply(&two_engines(), &p, &[]),
        json!({"limits": {"cpu": "200m", "memory": "200Mi"}, "requests": {"cpu": "50m", "memory": "100Mi"}})
    );
}

#[test]
fn the_regex_picks_one_container() {
    let p = policy(
        "sum",
        "^large.engine.v4$",
        json!({"cpu": "max(cpu*50%, 50m)", "memory": "200Mi"}),
        json!({"cpu": "max(cpu*50%, 50m)", "memory": "100Mi"}),
    );
    assert_eq!(
        apply(&two_engines(), &p, &[]),
        json!({"limits": {"cpu": "100m", "memory": "200Mi"}, "requests": {"cpu": "50m", "memory": "100Mi"}})
    );
}

#[test]
fn no_matching_container_is_an_error() {
    let spec = pod_spec(json!([]), json!([app("app1", ["200m", ""], ["", ""])]));
    let p = policy("sum", "^nonexistent$", json!({"cpu": "cpu"}), json!(null));
    let mut sidecar = container(json!({"name": "s"}));
    let err = apply_resources_policy(&mut sidecar, &p, &spec, &HashSet::new()).unwrap_err();
    assert!(matches!(err, ResourcesPolicyError::NoTarget(ref r) if r == "^nonexistent$"));
    // A regex that does not compile (validation stops it first) is an error, not a panic.
    let p = policy("sum", "[", json!({"cpu": "cpu"}), json!(null));
    let err = apply_resources_policy(&mut sidecar, &p, &spec, &HashSet::new()).unwrap_err();
    assert!(matches!(err, ResourcesPolicyError::Regex { .. }), "{err}");
}

#[test]
fn sum_mode_one_target_without_a_cpu_limit_leaves_the_cpu_limit_unset() {
    let spec = pod_spec(
        json!([]),
        json!([
            app("app1", ["200m", "200Mi"], ["100m", "100Mi"]),
            app("app2", ["", "400Mi"], ["50m", "200Mi"])
        ]),
    );
    let p = policy(
        "sum",
        ".*",
        json!({"cpu": "cpu*50%", "memory": "memory*30%"}),
        json!({"cpu": "cpu*30%", "memory": "memory*20%"}),
    );
    assert_eq!(
        apply(&spec, &p, &[]),
        json!({"limits": {"memory": "180Mi"}, "requests": {"cpu": "45m", "memory": "60Mi"}})
    );
}

#[test]
fn max_mode_one_target_without_a_memory_limit_leaves_the_memory_limit_unset() {
    let spec = pod_spec(
        json!([]),
        json!([
            app("app1", ["200m", "200Mi"], ["100m", "100Mi"]),
            app("app2", ["400m", ""], ["200m", ""])
        ]),
    );
    let p = policy(
        "max",
        ".*",
        json!({"cpu": "cpu*40%", "memory": "memory*30%"}),
        json!({"cpu": "cpu*25%", "memory": "memory*20%"}),
    );
    assert_eq!(
        apply(&spec, &p, &[]),
        json!({"limits": {"cpu": "160m"}, "requests": {"cpu": "50m", "memory": "20Mi"}})
    );
}

#[test]
fn a_target_without_requests_counts_as_zero() {
    let spec = pod_spec(
        json!([]),
        json!([
            app("app1", ["200m", "200Mi"], ["100m", "100Mi"]),
            app("app2", ["400m", "400Mi"], ["", ""])
        ]),
    );
    let p = policy(
        "sum",
        ".*",
        json!({"cpu": "cpu*50%", "memory": "memory*30%"}),
        json!({"cpu": "cpu*30%", "memory": "memory*20%"}),
    );
    assert_eq!(
        apply(&spec, &p, &[]),
        json!({"limits": {"cpu": "300m", "memory": "180Mi"}, "requests": {"cpu": "30m", "memory": "20Mi"}})
    );
}

#[test]
fn native_sidecar_init_containers_are_targets_plain_ones_are_not() {
    let spec = pod_spec(
        json!([
            {"restartPolicy": "Always", "name": "app1", "image": "x",
             "resources": {"limits": {"cpu": "400m", "memory": "800Mi"}, "requests": {"cpu": "200m", "memory": "400Mi"}}},
            app("app2", ["4", "8Gi"], ["2", "4Gi"])
        ]),
        json!([app("app2", ["600m", "1200Mi"], ["300m", "600Mi"])]),
    );
    let p = policy(
        "sum",
        "^app.*$",
        json!({"cpu": "max(cpu*30%, 50m)", "memory": "max(memory*25%, 100Mi)"}),
        json!({"cpu": "cpu*20%", "memory": "memory*15%"}),
    );
    assert_eq!(
        apply(&spec, &p, &[]),
        json!({"limits": {"cpu": "300m", "memory": "500Mi"}, "requests": {"cpu": "100m", "memory": "150Mi"}})
    );
}

#[test]
fn no_requests_at_all_compute_from_zero() {
    let spec = pod_spec(json!([]), json!([app("app", ["1", ""], ["", ""])]));
    let p = policy(
        "max",
        ".*",
        json!(null),
        json!({"cpu": "max(cpu*50%, 50m)", "memory": "memory*50%"}),
    );
    assert_eq!(
        apply(&spec, &p, &[]),
        json!({"requests": {"cpu": "50m", "memory": "0"}})
    );
}

#[test]
fn empty_expressions_set_nothing() {
    let spec = pod_spec(json!([]), json!([app("app", ["1", "1Gi"], ["1", "1Gi"])]));
    let p = policy("sum", ".*", json!({"cpu": ""}), json!({"memory": "memory"}));
    assert_eq!(
        apply(&spec, &p, &[]),
        json!({"requests": {"memory": "1Gi"}})
    );
}

// Upstream TestGetTargetContainers.

#[test]
fn targets_leave_out_kruise_sidecars_and_plain_init_containers() {
    let spec = pod_spec(
        json!([
            {"name": "init-sidecar1"},
            {"name": "plain-init-container"},
            {"name": "sidecar-container", "restartPolicy": "Always"}
        ]),
        json!([{"name": "app1"}, {"name": "app2"}, {"name": "sidecar1"}]),
    );
    let p = policy("sum", "^.*$", json!({}), json!(null));
    let names: HashSet<&str> = ["init-sidecar1", "sidecar1"].into();
    let targets: Vec<&str> = target_containers(&spec, &p, &names)
        .unwrap()
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(targets, ["sidecar-container", "app1", "app2"]);
    // Unanchored, as Go's MatchString; no regex means every container.
    let p = policy("sum", "pp", json!({}), json!(null));
    assert_eq!(target_containers(&spec, &p, &names).unwrap().len(), 2);
    let mut p = p;
    p.target_containers_name_regex = None;
    assert_eq!(target_containers(&spec, &p, &names).unwrap().len(), 3);
}

// Upstream TestAggregateResourcesBySum / ByMax.

#[test]
fn aggregation_by_sum_and_by_max() {
    let a = container(app("a", ["200m", "200Mi"], ["50m", "100Mi"]));
    let b = container(app("b", ["400m", "400Mi"], ["100m", "200Mi"]));
    let c = container(app("c", ["", "150Mi"], ["", ""]));
    let text = |q: &Option<Qty>| q.as_ref().map(Qty::to_text);
    let sum = aggregate(&[&a, &b], TargetContainersMode::Sum).unwrap();
    assert_eq!(text(&sum.limits[&Resource::Cpu]).as_deref(), Some("600m"));
    assert_eq!(
        text(&sum.limits[&Resource::Memory]).as_deref(),
        Some("600Mi")
    );
    assert_eq!(text(&sum.requests[&Resource::Cpu]).as_deref(), Some("150m"));
    assert_eq!(
        text(&sum.requests[&Resource::Memory]).as_deref(),
        Some("300Mi")
    );
    let max = aggregate(&[&a, &b, &c], TargetContainersMode::Max).unwrap();
    assert_eq!(text(&max.limits[&Resource::Cpu]), None, "c is unlimited");
    assert_eq!(
        text(&max.limits[&Resource::Memory]).as_deref(),
        Some("400Mi")
    );
    assert_eq!(text(&max.requests[&Resource::Cpu]).as_deref(), Some("100m"));
    let sum = aggregate(&[&c], TargetContainersMode::Sum).unwrap();
    assert_eq!(text(&sum.limits[&Resource::Cpu]), None);
    assert_eq!(text(&sum.requests[&Resource::Cpu]).as_deref(), Some("0"));
    let max = aggregate(&[&c], TargetContainersMode::Max).unwrap();
    assert_eq!(text(&max.requests[&Resource::Cpu]), None);
    // Mixed units add exactly; the sum keeps the first value's format.
    let d = container(app("d", ["1", "1Gi"], ["0.5", "512Mi"]));
    let e = container(app("e", ["500m", "1G"], ["1500m", "0.5Gi"]));
    let sum = aggregate(&[&d, &e], TargetContainersMode::Sum).unwrap();
    assert_eq!(text(&sum.limits[&Resource::Cpu]).as_deref(), Some("1500m"));
    assert_eq!(
        text(&sum.limits[&Resource::Memory]).as_deref(),
        Some("2073741824")
    );
    assert_eq!(
        text(&sum.requests[&Resource::Memory]).as_deref(),
        Some("1Gi")
    );
    // Max keeps the winner's own text; the first of equals wins.
    let f = container(app("f", ["1000m", ""], ["", ""]));
    let max = aggregate(&[&d, &f], TargetContainersMode::Max).unwrap();
    assert_eq!(text(&max.limits[&Resource::Cpu]).as_deref(), Some("1"));
}

#[test]
fn a_target_quantity_go_rejects_is_an_error() {
    let bad = container(app("bad", ["lots", ""], ["", ""]));
    let err = aggregate(&[&bad], TargetContainersMode::Sum).unwrap_err();
    assert!(err.to_string().contains("limits.cpu"), "{err}");
}

// Upstream TestEvaluateResourceExpression, and the calculator's rules.

#[test]
fn expressions_evaluate_as_upstream() {
    use Resource::{Cpu, Memory};
    let cases: &[(&str, Resource, &str, &str)] = &[
        ("cpu*50%", Cpu, "200m", "100m"),
        ("memory*30%", Memory, "600Mi", "180Mi"),
        ("max(cpu*50%, 100m)", Cpu, "150m", "100m"),
        ("max(cpu*50%, 100m)", Cpu, "400m", "200m"),
        ("cpu + 50m", Cpu, "100m", "150m"),
        ("max(memory*20% + 100Mi, 200Mi)", Memory, "800Mi", "260Mi"),
        ("500m", Cpu, "100m", "500m"),
        ("1Gi", Memory, "500Mi", "1Gi"),
        ("cpu*50%", Cpu, "0", "0"),
        ("memory*25%", Memory, "400Mi", "100Mi"),
        ("1", Cpu, "2", "1"),
        ("1", Memory, "2Mi", "1"),
        // Story 5's expressions.
        ("cpu*50% + 100m", Cpu, "600m", "400m"),
        ("max(memory*20% + 100Mi, 200Mi)", Memory, "1000Mi", "300Mi"),
        ("cpu*30% + 50m", Cpu, "300m", "140m"),
        ("memory*15% + 50Mi", Memory, "500Mi", "125Mi"),
        // Precedence, associativity, unary minus, parentheses, case.
        ("cpu - 100m - 100m", Cpu, "1", "800m"),
        ("cpu / 2 / 2", Cpu, "1", "250m"),
        ("(cpu + 1) * 2", Cpu, "1", "4"),
        ("-cpu * -1", Cpu, "300m", "300m"),
        ("MAX(CPU, 2)", Cpu, "1", "2"),
        ("min(cpu, 2)", Cpu, "1", "1"),
        ("min(0.5, 2) + 0", Cpu, "1", "500m"),
        ("2 + 3 * 4", Cpu, "1", "14"),
        ("50% * 200", Cpu, "1", "100"),
        ("max(40m, 20)", Cpu, "1", "20"),
        ("1e3", Cpu, "1", "1k"),
        (".5", Cpu, "1", "500m"),
        (
            "0.5*cpu - 0.3*max(0, cpu-4) + 0.3*max(0, cpu-8)",
            Cpu,
            "10",
            "3800m",
        ),
        // Millis: MilliValue rounds up, the product truncates.
        ("cpu * 1", Cpu, "1n", "1m"),
        ("cpu / 3", Cpu, "1", "333m"),
        ("cpu * 33%", Cpu, "100m", "33m"),
        ("memory / 3", Memory, "1Gi", "357913941333m"),
        // A number becomes a quantity in thousandths, truncated.
        ("0.0005", Cpu, "1", "0"),
        ("0.0015 + 0", Memory, "1", "1m"),
        // Formats: the left operand's, unless it is zero.
        ("memory + 1", Memory, "1Ki", "1025"),
        ("memory - memory + 1Gi", Memory, "1Ki", "1Gi"),
        ("1Gi + memory", Memory, "1M", "1074741824"),
    ];
    for (expr, resource, value, expected) in cases {
        assert_eq!(
            eval(expr, *resource, value).as_deref(),
            Ok(*expected),
            "{expr} with {value}"
        );
    }
}

#[test]
fn expression_errors() {
    use Resource::{Cpu, Memory};
    let cases: &[(&str, Resource, ExprError)] = &[
        ("", Cpu, ExprError::Empty),
        ("   ", Cpu, ExprError::Empty),
        (
            "cpu * invalid",
            Cpu,
            ExprError::UndefinedVariable {
                name: "invalid".into(),
                allowed: "cpu",
            },
        ),
        (
            "memory",
            Cpu,
            ExprError::UndefinedVariable {
                name: "memory".into(),
                allowed: "cpu",
            },
        ),
        (
            "cpu",
            Memory,
            ExprError::UndefinedVariable {
                name: "cpu".into(),
                allowed: "memory",
            },
        ),
        ("max(cpu*50%)", Cpu, ExprError::Arity("max".into(), 1)),
        ("min(1, 2, 3)", Cpu, ExprError::Arity("min".into(), 3)),
        ("avg(1, 2)", Cpu, ExprError::UnknownFunction("avg".into())),
        ("cpu * 2m", Cpu, ExprError::QuantityTimesQuantity),
        ("cpu * cpu", Cpu, ExprError::QuantityTimesQuantity),
        ("1 / cpu", Cpu, ExprError::DivisionByQuantity),
        ("cpu / 0", Cpu, ExprError::DivisionByZero),
        ("1 / (2 - 2)", Cpu, ExprError::DivisionByZero),
        ("cpu - 2", Cpu, ExprError::Negative("-1".into())),
        ("0 - 1", Cpu, ExprError::Negative("-1".into())),
        ("2e", Cpu, ExprError::InvalidNumber("2e".into())),
        ("5K", Cpu, ExprError::InvalidNumber("5K".into())),
        (".", Cpu, ExprError::InvalidNumber(".".into())),
        ("50%m", Cpu, ExprError::InvalidNumber("50%m".into())),
        ("1e3m", Cpu, ExprError::InvalidQuantity("1e3m".into())),
        ("cpu @ 2", Cpu, ExprError::UnexpectedChar('@', 5)),
        ("cpu × 2", Cpu, ExprError::UnexpectedChar('×', 5)),
        (
            "cpu +*/ 50%",
            Cpu,
            ExprError::Syntax {
                column: 6,
                expected: "a value",
            },
        ),
        (
            "max(cpu*50%, 50m",
            Cpu,
            ExprError::Syntax {
                column: 17,
                expected: "\",\" or \")\"",
            },
        ),
        (
            "(cpu",
            Cpu,
            ExprError::Syntax {
                column: 5,
                expected: "\")\"",
            },
        ),
        (
            "cpu 2",
            Cpu,
            ExprError::Syntax {
                column: 5,
                expected: "an operator or the end",
            },
        ),
        ("1e400", Cpu, ExprError::InvalidNumber("1e400".into())),
        ("1e300 * 1e300 + 0", Cpu, ExprError::OutOfRange),
        ("cpu * 1e300", Cpu, ExprError::OutOfRange),
    ];
    for (expr, resource, expected) in cases {
        let got = ResourceExpr::parse(expr, *resource)
            .and_then(|e| e.evaluate(&Qty::parse("1").unwrap()));
        assert_eq!(got.as_ref().err(), Some(expected), "{expr}: {got:?}");
    }
}

// Upstream TestValidateResourceExpression.

#[test]
fn validation_of_expressions() {
    for (expr, resource) in [
        ("cpu*50%", Resource::Cpu),
        ("max(cpu*50%, 50m)", Resource::Cpu),
        ("min(cpu*50%, 100m)", Resource::Cpu),
        (
            "0.5*cpu - 0.3*max(0, cpu-4) + 0.3*max(0, cpu-8)",
            Resource::Cpu,
        ),
        ("max( cpu * 0.5 , 50m )", Resource::Cpu),
        ("memory*50%", Resource::Memory),
        ("max(min(cpu*50%, 100m), 50m)", Resource::Cpu),
        ("100Mi", Resource::Memory),
    ] {
        assert_eq!(validate(expr, resource), Ok(()), "{expr}");
    }
    for (expr, resource) in [
        ("invalidvar * 50%", Resource::Cpu),
        ("cpu +*/ 50%", Resource::Cpu),
        ("invalid expression @#$", Resource::Cpu),
        ("cpu - 2", Resource::Cpu),
        ("memory*2Mi", Resource::Memory),
    ] {
        assert!(validate(expr, resource).is_err(), "{expr}");
    }
}

#[test]
fn random_expressions_never_panic() {
    const PIECES: &[&str] = &[
        "cpu",
        "memory",
        "max",
        "min",
        "(",
        ")",
        ",",
        "+",
        "-",
        "*",
        "/",
        "1",
        "0",
        "50%",
        "2.5",
        "100m",
        "1Gi",
        "1e",
        "e",
        ".",
        "%",
        " ",
        "Ki",
        "1e308",
        "9223372036854775807",
        "x",
    ];
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let big = Qty::parse("8Ei").unwrap();
    for _ in 0..20_000 {
        let len = (next() % 10) as usize;
        let text: String = (0..len)
            .map(|_| PIECES[(next() % PIECES.len() as u64) as usize])
            .collect();
        for resource in [Resource::Cpu, Resource::Memory] {
            let _ = validate(&text, resource);
            if let Ok(e) = ResourceExpr::parse(&text, resource) {
                let _ = e.evaluate(&big);
            }
        }
    }
}
