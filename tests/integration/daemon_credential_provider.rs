//! The daemon's kubelet credential provider plugins against real components: shell-script
//! plugins in a temporary bin dir, the htpasswd registry on loopback, a real containerd, and
//! NodeImage entries without pull secrets.
//!
//! Each plugin appends its request to a file, so a test counts the runs and sees what the
//! daemon asked.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Secret;
use kruise_rs_api::nodeimage::ImagePullPhase;
use kruise_rs_daemon::CredentialProviderOptions;
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::daemon::{create_nodeimage, docker_config_secret, finished_at, patch_spec, wait_tag};
use crate::support::cri_proxy::CriProxy;
use crate::support::daemon::Daemon;
use crate::support::node::{Variant, node_env};
use crate::support::{cluster, unique_name};

/// A bin dir with plugins, and the config naming them.
struct Plugins {
    dir: tempfile::TempDir,
    providers: Vec<serde_json::Value>,
}

impl Plugins {
    fn new() -> Plugins {
        Plugins {
            dir: tempfile::tempdir().expect("temp dir"),
            providers: Vec::new(),
        }
    }

    /// Adds plugin `name` for `match_images`, whose script body runs after it has logged the
    /// request (stdin) as one line of `<name>.requests`.
    fn add(&mut self, name: &str, match_images: &[&str], default_cache: &str, body: &str) {
        let path = self.dir.path().join(name);
        let log = self.requests_file(name);
        let script = format!(
            "#!/bin/sh\n{{ cat; echo; }} >> '{}'\n{body}\n",
            log.display()
        );
        crate::harness::process::write_executable(&path, &script).expect("write plugin");
        self.providers.push(json!({
            "name": name,
            "matchImages": match_images,
            "defaultCacheDuration": default_cache,
            "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
        }));
    }

    fn requests_file(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.requests"))
    }

    /// The requests plugin `name` got, in order.
    fn requests(&self, name: &str) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.requests_file(name))
            .unwrap_or_default()
            .lines()
            .map(|line| serde_json::from_str(line).expect("a JSON request per line"))
            .collect()
    }

    /// Writes the config (as YAML) and returns the daemon's options for it.
    fn options(&self) -> CredentialProviderOptions {
        let config = json!({
            "apiVersion": "kubelet.config.k8s.io/v1",
            "kind": "CredentialProviderConfig",
            "providers": self.providers,
        });
        let path = self.dir.path().join("config.yaml");
        std::fs::write(&path, serde_yaml::to_string(&config).expect("yaml")).expect("config");
        CredentialProviderOptions {
            config_file: Some(path),
            bin_dir: self.dir.path().to_owned(),
            ..CredentialProviderOptions::default()
        }
    }
}

/// A plugin body answering `user`/`password` for `registry`.
fn answer(
    registry: &str,
    user: &str,
    password: &str,
    key_type: &str,
    cache: Option<&str>,
) -> String {
    let mut response = json!({
        "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
        "kind": "CredentialProviderResponse",
        "cacheKeyType": key_type,
        "auth": {registry: {"username": user, "password": password}},
    });
    if let Some(cache) = cache {
        response["cacheDuration"] = json!(cache);
    }
    format!("echo '{response}'")
}

async fn start(node: &str, socket: &Path, plugins: &Plugins) -> Daemon {
    Daemon::start_with_credential_providers(
        node,
        socket,
        cluster().await.kubeconfig_path(),
        plugins.options(),
    )
    .await
}

fn entry() -> serde_json::Value {
    json!({"tags": [{"tag": "v1", "version": 1, "pullPolicy": {"backoffLimit": 0}}]})
}

/// Pulls `first`, then (added to the spec afterwards) `second`, both without pull secrets from
/// the auth registry, through a plugin answering with `cacheDuration` `response_cache` (and
/// `defaultCacheDuration` `default_cache`); returns how often the plugin ran.
async fn two_pulls_in_a_row(prefix: &str, default_cache: &str, response_cache: &str) -> usize {
    let env = node_env().await;
    let registry = env.auth_registry();
    let node = unique_name(prefix);
    let repo = unique_name(prefix);
    let (first, second) = (
        format!("{registry}/{repo}-a"),
        format!("{registry}/{repo}-b"),
    );
    env.push(Variant::V1, &format!("{first}:v1"));
    env.push(Variant::V1, &format!("{second}:v1"));
    let mut plugins = Plugins::new();
    plugins.add(
        "registry-plugin",
        &[registry],
        default_cache,
        &answer(
            registry,
            env.auth_user(),
            env.auth_password(),
            "Registry",
            Some(response_cache),
        ),
    );
    create_nodeimage(&node, json!({&first: entry()})).await;
    let proxy = CriProxy::start(env.containerd_socket());
    let daemon = start(&node, proxy.socket(), &plugins).await;
    wait_tag(
        &node,
        &first,
        "v1",
        "pulled with the plugin's credentials",
        finished_at(ImagePullPhase::Succeeded, 1),
    )
    .await;
    assert_eq!(plugins.requests("registry-plugin").len(), 1);
    // The credential went to the runtime as CRI auth.
    let auth = proxy
        .pull_requests()
        .into_iter()
        .find(|r| {
            r.image
                .as_ref()
                .is_some_and(|i| i.image == format!("{first}:v1"))
        })
        .and_then(|r| r.auth)
        .map(|a| (a.username, a.password));
    assert_eq!(
        auth,
        Some((env.auth_user().to_owned(), env.auth_password().to_owned()))
    );

    patch_spec(&node, json!({"images": {&second: entry()}})).await;
    wait_tag(
        &node,
        &second,
        "v1",
        "pulled with the plugin's credentials",
        finished_at(ImagePullPhase::Succeeded, 1),
    )
    .await;
    let requests = plugins.requests("registry-plugin");
    // The daemon asks for the fully qualified repository, without tag, as the kubelet does.
    assert_eq!(
        requests[0],
        json!({
            "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
            "kind": "CredentialProviderRequest",
            "image": first,
        })
    );
    daemon.stop().await;
    requests.len()
}

#[tokio::test]
async fn a_plugin_answer_is_cached_for_its_cache_duration() {
    // No default cache; the answer's 10m covers the whole registry: the second pull asks no
    // more.
    assert_eq!(two_pulls_in_a_row("credprov-cache", "0s", "10m").await, 1);
}

#[tokio::test]
async fn a_plugin_answer_with_a_zero_cache_duration_is_not_kept() {
    // A default of an hour, but the answer says 0s: each pull runs the plugin.
    assert_eq!(two_pulls_in_a_row("credprov-nocache", "1h", "0s").await, 2);
}

#[tokio::test]
async fn pull_secrets_come_first_then_the_plugin_and_failures_say_which_plugin() {
    let env = node_env().await;
    let registry = env.auth_registry();
    let cluster = cluster().await;
    let namespace = cluster.namespace("credprov").await;
    let ns = namespace.name();
    Api::<Secret>::namespaced(cluster.client().await, ns)
        .create(
            &PostParams::default(),
            &docker_config_secret(ns, "wrong", registry, env.auth_user(), "not-the-password"),
        )
        .await
        .expect("secret");
    let node = unique_name("credprov-order");
    let id = unique_name("credprov");
    let secret_then_plugin = format!("{registry}/good/{id}");
    let failing = format!("{registry}/failing/{id}");
    let wrong = format!("{registry}/wrong/{id}");
    for image in [&secret_then_plugin, &failing, &wrong] {
        env.push(Variant::V1, &format!("{image}:v1"));
    }
    let mut plugins = Plugins::new();
    plugins.add(
        "good-plugin",
        &[&format!("{registry}/good")],
        "0s",
        &answer(
            registry,
            env.auth_user(),
            env.auth_password(),
            "Image",
            None,
        ),
    );
    plugins.add(
        "failing-plugin",
        &[&format!("{registry}/failing")],
        "0s",
        "echo '  no token: metadata service unreachable  ' >&2\nexit 1",
    );
    plugins.add(
        "wrong-plugin",
        &[&format!("{registry}/wrong")],
        "0s",
        &answer(registry, env.auth_user(), "stale-password", "Image", None),
    );
    let mut with_secret = entry();
    with_secret["pullSecrets"] = json!([{"namespace": ns, "name": "wrong"}]);
    create_nodeimage(
        &node,
        json!({&secret_then_plugin: with_secret, &failing: entry(), &wrong: entry()}),
    )
    .await;
    let proxy = CriProxy::start(env.containerd_socket());
    let daemon = start(&node, proxy.socket(), &plugins).await;

    wait_tag(
        &node,
        &secret_then_plugin,
        "v1",
        "pulled with the plugin's credentials after the secret's were refused",
        finished_at(ImagePullPhase::Succeeded, 1),
    )
    .await;
    // The secret's credential was tried first, then the plugin's.
    let passwords: Vec<String> = proxy
        .pull_requests()
        .into_iter()
        .filter(|r| {
            r.image
                .as_ref()
                .is_some_and(|i| i.image == format!("{secret_then_plugin}:v1"))
        })
        .filter_map(|r| r.auth.map(|a| a.password))
        .collect();
    assert_eq!(
        passwords,
        ["not-the-password", env.auth_password()],
        "the pull secret's credential comes before the plugin's"
    );

    let failed = wait_tag(
        &node,
        &failing,
        "v1",
        "refused",
        finished_at(ImagePullPhase::Failed, 1),
    )
    .await;
    let message = failed.message.unwrap_or_default();
    assert!(
        message.contains(
            "credential provider failing-plugin failed: it exited with exit status: 1: \
             no token: metadata service unreachable"
        ) && message.contains("401 Unauthorized"),
        "{message}"
    );
    let refused = wait_tag(
        &node,
        &wrong,
        "v1",
        "refused",
        finished_at(ImagePullPhase::Failed, 1),
    )
    .await;
    let message = refused.message.unwrap_or_default();
    assert!(
        message.contains(&format!(
            "with the credentials of credential provider wrong-plugin for {registry}"
        )) && message.contains("401 Unauthorized"),
        "{message}"
    );
    assert!(!message.contains("stale-password"), "{message}");
    // Each plugin ran only for the images it matches.
    for name in ["good-plugin", "failing-plugin", "wrong-plugin"] {
        assert_eq!(plugins.requests(name).len(), 1, "{name}");
    }
    daemon.stop().await;
}
