//! The node harness itself: real registries, a real containerd pulling from them through CRI,
//! the recording CRI proxy, and a containerd that can be stopped and started again.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use k8s_cri::v1::{
    AuthConfig, ImageSpec, ImageStatusRequest, PodSandboxConfig, PodSandboxMetadata,
    PullImageRequest,
};

use crate::support::cri_proxy::{CriProxy, image_client};
use crate::support::node::{Variant, node_env};
use crate::support::{unique_name, wait_for};

/// A CRI call that hangs is a failure, not a reason to wait forever.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

fn pull_request(image: &str, auth: Option<AuthConfig>) -> PullImageRequest {
    PullImageRequest {
        image: Some(ImageSpec {
            image: image.to_owned(),
            ..Default::default()
        }),
        auth,
        sandbox_config: None,
    }
}

#[tokio::test]
async fn variants_push_as_distinct_images() {
    let env = node_env().await;
    let repo = unique_name("infra-variants");
    let mut digests = HashSet::new();
    for variant in Variant::ALL {
        let digest = env.push(
            variant,
            &format!("{}/{repo}:{}", env.registry(), variant.tag()),
        );
        // skopeo copies the OCI manifest as it is: the registry serves the layout's digest.
        assert_eq!(digest, env.manifest_digest(variant), "{variant:?}");
        digests.insert(digest);
    }
    assert_eq!(digests.len(), Variant::ALL.len(), "{digests:?}");
    let ids: HashSet<String> = Variant::ALL.iter().map(|v| env.image_id(*v)).collect();
    assert_eq!(ids.len(), Variant::ALL.len(), "{ids:?}");
}

#[tokio::test]
async fn pull_through_the_proxy_reaches_containerd_and_is_recorded() {
    let env = node_env().await;
    let repo = unique_name("infra-pull");
    let image = format!("{}/{repo}:v1", env.registry());
    let digest = env.push(Variant::V1, &image);

    let proxy = CriProxy::start(env.containerd_socket());
    let mut client = image_client(proxy.socket());
    let labels = HashMap::from([
        ("app".to_owned(), "node-infra".to_owned()),
        ("kruise-rs-test".to_owned(), repo.clone()),
    ]);
    let mut request = pull_request(&image, None);
    request.sandbox_config = Some(PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: "puller".into(),
            uid: "uid-1".into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        labels: labels.clone(),
        ..Default::default()
    });
    let response = tokio::time::timeout(CALL_TIMEOUT, client.pull_image(request))
        .await
        .expect("PullImage answers in time")
        .unwrap_or_else(|e| panic!("PullImage {image} through the proxy: {e}"))
        .into_inner();
    // containerd answers with the image ID, the config digest.
    assert_eq!(response.image_ref, env.image_id(Variant::V1));

    let pulls = proxy.pull_requests();
    assert_eq!(pulls.len(), 1, "{pulls:?}");
    assert_eq!(
        pulls[0].image.as_ref().map(|i| i.image.as_str()),
        Some(&*image)
    );
    let sandbox = pulls[0]
        .sandbox_config
        .as_ref()
        .expect("sandbox_config is recorded");
    assert_eq!(sandbox.labels, labels);
    assert_eq!(
        sandbox.metadata.as_ref().map(|m| m.name.as_str()),
        Some("puller")
    );
    assert_eq!(proxy.calls("PullImage"), 1);

    let status = client
        .image_status(ImageStatusRequest {
            image: Some(ImageSpec {
                image: image.clone(),
                ..Default::default()
            }),
            verbose: false,
        })
        .await
        .expect("ImageStatus")
        .into_inner()
        .image
        .expect("the pulled image is known");
    assert_eq!(status.id, response.image_ref);
    assert!(status.repo_tags.contains(&image), "{:?}", status.repo_tags);
    let by_digest = format!("{}/{repo}@{digest}", env.registry());
    assert!(
        status.repo_digests.contains(&by_digest),
        "{:?}",
        status.repo_digests
    );
    assert_eq!(proxy.calls("ImageStatus"), 1);
    assert_eq!(proxy.calls("ListImages"), 0);

    // The registry's access log shows containerd resolving the tag (HEAD). It fetches the
    // manifest by digest (GET) only when that content is not in its store yet, and the store is
    // shared with every other test: do not count on the GET.
    let head = format!("\"HEAD /v2/{repo}/manifests/v1 HTTP/1.1\" 200 ");
    let needle = format!("/v2/{repo}/manifests/");
    wait_for(
        "the manifest fetch in the access log",
        Duration::from_secs(10),
        || {
            let lines = env.registry_log_lines(env.registry(), &needle);
            let seen = lines.iter().any(|l| l.contains(&head));
            async move { seen.then_some(()) }
        },
    )
    .await;

    // Every pull resolves the tag again, even with the image present: one more HEAD.
    let again = tokio::time::timeout(CALL_TIMEOUT, client.pull_image(pull_request(&image, None)))
        .await
        .expect("PullImage answers in time")
        .expect("pulling again")
        .into_inner();
    assert_eq!(again.image_ref, response.image_ref);
    let lines = wait_for(
        "a second HEAD in the access log",
        Duration::from_secs(10),
        || {
            let lines = env.registry_log_lines(env.registry(), &needle);
            let heads = lines.iter().filter(|l| l.contains(&head)).count();
            async move { (heads == 2).then_some(lines) }
        },
    )
    .await;
    assert_eq!(proxy.calls("PullImage"), 2);
    eprintln!("registry access log for {repo}:\n{}", lines.join("\n"));
}

#[tokio::test]
async fn auth_registry_needs_the_credentials() {
    let env = node_env().await;
    let repo = unique_name("infra-auth");
    let image = format!("{}/{repo}:v2", env.auth_registry());
    env.push(Variant::V2, &image);
    let mut client = image_client(env.containerd_socket());

    let denied = tokio::time::timeout(CALL_TIMEOUT, client.pull_image(pull_request(&image, None)))
        .await
        .expect("PullImage answers in time")
        .expect_err("a pull without credentials fails");
    eprintln!("pull without credentials: {denied:?}");
    assert!(
        denied.message().contains("401") || denied.message().contains("nauthorized"),
        "{denied:?}"
    );

    let wrong = AuthConfig {
        username: env.auth_user().to_owned(),
        password: "not-the-password".to_owned(),
        ..Default::default()
    };
    let denied = tokio::time::timeout(
        CALL_TIMEOUT,
        client.pull_image(pull_request(&image, Some(wrong))),
    )
    .await
    .expect("PullImage answers in time")
    .expect_err("a pull with a wrong password fails");
    eprintln!("pull with a wrong password: {denied:?}");

    let auth = AuthConfig {
        username: env.auth_user().to_owned(),
        password: env.auth_password().to_owned(),
        ..Default::default()
    };
    let pulled = tokio::time::timeout(
        CALL_TIMEOUT,
        client.pull_image(pull_request(&image, Some(auth))),
    )
    .await
    .expect("PullImage answers in time")
    .unwrap_or_else(|e| panic!("PullImage {image} with credentials: {e}"))
    .into_inner();
    assert_eq!(pulled.image_ref, env.image_id(Variant::V2));

    let needle = format!("/v2/{repo}/manifests/");
    let lines = wait_for(
        "401 and 200 manifest lines",
        Duration::from_secs(10),
        || {
            let lines = env.registry_log_lines(env.auth_registry(), &needle);
            let seen = |code: &str| {
                lines
                    .iter()
                    .any(|l| l.contains(&format!("HTTP/1.1\" {code} ")))
            };
            let done = seen("401") && seen("200");
            async move { done.then_some(lines) }
        },
    )
    .await;
    eprintln!("auth registry access log for {repo}:\n{}", lines.join("\n"));
}

#[tokio::test]
async fn extra_containerd_stops_and_starts_again() {
    let env = node_env().await;
    let dir = tempfile::Builder::new()
        .prefix("kruise-rs-ctrd-")
        .tempdir()
        .expect("temp dir");
    let containerd = env.start_containerd(dir.path());
    assert!(containerd.is_running());
    let repo = unique_name("infra-restart");
    let image = format!("{}/{repo}:v3", env.registry());
    env.push(Variant::V3, &image);

    // Through the proxy: it must survive containerd going away and coming back.
    let proxy = CriProxy::start(containerd.socket());
    let mut client = image_client(proxy.socket());
    let pulled = tokio::time::timeout(CALL_TIMEOUT, client.pull_image(pull_request(&image, None)))
        .await
        .expect("PullImage answers in time")
        .unwrap_or_else(|e| panic!("PullImage {image} on the extra containerd: {e}"))
        .into_inner();
    assert_eq!(pulled.image_ref, env.image_id(Variant::V3));
    let status_request = ImageStatusRequest {
        image: Some(ImageSpec {
            image: image.clone(),
            ..Default::default()
        }),
        verbose: false,
    };

    containerd.stop();
    assert!(!containerd.is_running());
    let down = tokio::time::timeout(CALL_TIMEOUT, client.image_status(status_request.clone()))
        .await
        .expect("ImageStatus answers in time")
        .expect_err("a call while containerd is stopped fails");
    eprintln!("ImageStatus while containerd is stopped: {down:?}");
    // Directly too, on a fresh connection.
    let direct = tokio::time::timeout(
        CALL_TIMEOUT,
        image_client(containerd.socket()).image_status(status_request.clone()),
    )
    .await
    .expect("ImageStatus answers in time");
    assert!(direct.is_err(), "{direct:?}");

    containerd.start();
    assert!(containerd.is_running());
    // Same root and state: the image pulled before the restart is still there.
    let image_id = wait_for("ImageStatus after the restart", CALL_TIMEOUT, || {
        let mut client = client.clone();
        let request = status_request.clone();
        async move {
            client
                .image_status(request)
                .await
                .ok()
                .and_then(|r| r.into_inner().image)
                .map(|i| i.id)
        }
    })
    .await;
    assert_eq!(image_id, pulled.image_ref);
    assert!(proxy.calls("ImageStatus") >= 2);

    // A crash (SIGKILL) and a start again work as well.
    containerd.kill();
    assert!(!containerd.is_running());
    containerd.start();
    let mut direct = image_client(containerd.socket());
    let status = tokio::time::timeout(CALL_TIMEOUT, direct.image_status(status_request))
        .await
        .expect("ImageStatus answers in time")
        .expect("ImageStatus after a kill and a start")
        .into_inner();
    assert_eq!(status.image.map(|i| i.id), Some(pulled.image_ref));
}
