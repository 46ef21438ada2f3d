//! Guarded writes of a NodeImage's `spec.images`, shared by everything that writes them (the
//! ImagePullJob controller adds its tags, the NodeImage controller collects old ones).
//!
//! A write is a JSON Patch that touches only the images that changed, each preceded by a `test`
//! of the exact value it replaces. If another writer changed that image meanwhile, the apiserver
//! refuses the whole patch (nothing is lost, unlike upstream's read-modify-write, kruise#1517) and
//! `update_images` re-reads the object and decides again. Status writes by the node daemon do
//! not conflict with it: unlike a resourceVersion precondition, the tests look only at the data
//! being replaced. A stale cache costs one refused patch and a GET, never a wait (kruise#1528).
//!
//! The tested values must be the stored JSON exactly. Our types re-serialize some values
//! differently from how other writers stored them (a `createdAt` with fractions of a second comes
//! back without them), so after a refusal the object is read raw and the tests quote it.

use jsonptr::PointerBuf;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::core::Request;
use serde::Serialize;
use serde_json::Value;

use super::lean_nodeimage::LeanNodeImage;
use crate::compact_nodeimage::{ImageSpec, Images};
use kruise_rs_api::nodeimage::NodeImage;

/// How often [`update_images`] re-reads and retries after a refused patch.
const ATTEMPTS: usize = 5;

/// Why `spec.images` could not be written.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ImagesWriteError {
    #[error("NodeImage {name} no longer exists")]
    NotFound { name: String },
    #[error("NodeImage {name} kept changing under us; gave up after {ATTEMPTS} attempts")]
    TooManyConflicts { name: String },
    #[error("NodeImage {name} does not match its schema")]
    Unreadable {
        name: String,
        #[source]
        source: serde_json::Error,
    },
    /// The apiserver refused the result itself (its schema: at most 256 images, a tag's
    /// bounds), not a guard: asking again gives the same answer.
    #[error("NodeImage {name} cannot take this entry: {message}")]
    Invalid { name: String, message: String },
    #[error("writing NodeImage {name}")]
    Kube {
        name: String,
        #[source]
        source: kube::Error,
    },
}

fn images_path(rest: &[&str]) -> PointerBuf {
    PointerBuf::from_tokens(["spec", "images"].into_iter().chain(rest.iter().copied()))
}

/// One operation of a guarded images patch, serialized straight from the typed images it
/// names (building them as `serde_json::Value`s first cost about 30 allocations a node in a
/// fan-out: a B-tree node of 600-odd bytes per JSON object, garbage between the blocks the stores
/// keep).
#[derive(Debug, Serialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub(crate) enum ImagesOp<'a> {
    Test { path: PointerBuf, value: Json<'a> },
    Add { path: PointerBuf, value: Json<'a> },
    Replace { path: PointerBuf, value: Json<'a> },
    Remove { path: PointerBuf },
}

/// A value in an [`ImagesOp`]: typed where we hold it typed, quoted where it was read raw.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub(crate) enum Json<'a> {
    Int(i64),
    Image(&'a ImageSpec),
    Images(&'a Images),
    Spec { images: &'a Images },
    Raw(&'a Value),
    RawImages(&'a serde_json::Map<String, Value>),
}

/// The guarded JSON Patch that turns `old` (what the writer last saw, at `generation`, and as
/// stored: `old_raw`, when known) into `new`; `None` when equal.
///
/// A new image is guarded by `metadata.generation`, which only spec writes bump: any image
/// someone else added, changed or removed meanwhile refuses the patch, a daemon's status write
/// does not. (Testing the whole images map as we saw it did the same at about 12% more of the
/// apiserver's CPU per write; the resourceVersion would refuse after every status write.) A
/// changed or removed image is guarded by a test of its own stored value, so writers of other
/// images do not refuse it.
pub(crate) fn images_patch<'a>(
    old: &'a Images,
    old_raw: Option<&'a serde_json::Map<String, Value>>,
    generation: Option<i64>,
    new: &'a Images,
) -> Option<Vec<ImagesOp<'a>>> {
    let stored = |name: &str, typed: &'a ImageSpec| {
        old_raw
            .and_then(|raw| raw.get(name))
            .map_or(Json::Image(typed), Json::Raw)
    };
    if old == new {
        return None;
    }
    let mut ops = Vec::new();
    let adds_an_image = new.keys().any(|k| !old.contains_key(k));
    if adds_an_image {
        match generation {
            Some(generation) => ops.push(ImagesOp::Test {
                path: PointerBuf::from_tokens(["metadata", "generation"]),
                value: Json::Int(generation),
            }),
            // Not read from the apiserver (no generation): the map as we saw it.
            None if !old.is_empty() => ops.push(ImagesOp::Test {
                path: images_path(&[]),
                value: old_raw.map_or(Json::Images(old), Json::RawImages),
            }),
            None => {}
        }
    }
    if old.is_empty() {
        // `spec` holds nothing but `images`, and may not hold that yet: written whole.
        ops.push(ImagesOp::Add {
            path: PointerBuf::from_tokens(["spec"]),
            value: Json::Spec { images: new },
        });
        return Some(ops);
    }
    for (name, before) in old {
        match new.get(name) {
            Some(after) if after == before => {}
            after => {
                ops.push(ImagesOp::Test {
                    path: images_path(&[name]),
                    value: stored(name, before),
                });
                ops.push(match after {
                    Some(after) => ImagesOp::Replace {
                        path: images_path(&[name]),
                        value: Json::Image(after),
                    },
                    None => ImagesOp::Remove {
                        path: images_path(&[name]),
                    },
                });
            }
        }
    }
    for (name, after) in new.iter().filter(|(k, _)| !old.contains_key(*k)) {
        ops.push(ImagesOp::Add {
            path: images_path(&[name]),
            value: Json::Image(after),
        });
    }
    Some(ops)
}

/// PATCHes `name` with the JSON Patch `ops` (kube's `Patch::Json` takes `json_patch`'s types,
/// whose values are `serde_json::Value`s).
async fn send(
    api: &Api<LeanNodeImage>,
    name: &str,
    params: &PatchParams,
    ops: &[ImagesOp<'_>],
) -> Result<LeanNodeImage, kube::Error> {
    // kube builds the URL, the query and the body; only the content type is JSON Patch's.
    let mut request = Request::new(api.resource_url())
        .patch(name, params, &Patch::Merge(ops))
        .map_err(kube::Error::BuildRequest)?;
    request.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json-patch+json"),
    );
    request.extensions_mut().insert("patch");
    api.clone().into_client().request(request).await
}

/// A refused guarded patch: the object changed (409), or a `test` failed, which the apiserver
/// answers with a bare 422 (`Invalid`, no details). A 422 that names causes is the schema
/// refusing the patched object ([`invalid_message`]): not a conflict, and not worth a retry.
fn is_conflict(err: &kube::Error) -> bool {
    match err {
        kube::Error::Api(status) if status.code == 409 => true,
        kube::Error::Api(status) if status.code == 422 => invalid_message(status).is_none(),
        _ => false,
    }
}

/// What the schema refused, from a 422 that names its causes (`spec.images: Too many: 257:
/// must have at most 256 items`); `None` for a bare 422 (a failed `test`).
fn invalid_message(status: &kube::core::Status) -> Option<String> {
    let causes = &status.details.as_ref()?.causes;
    if causes.is_empty() {
        return None;
    }
    Some(
        causes
            .iter()
            .map(|c| {
                if c.field.is_empty() {
                    c.message.clone()
                } else {
                    format!("{}: {}", c.field, c.message)
                }
            })
            .collect::<Vec<_>>()
            .join("; "),
    )
}

fn is_not_found(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 404)
}

/// Writes `decide(current)` into `spec.images`, starting from `current` (usually from a cache)
/// and re-reading the object after each refused patch. `decide` returns `None` when nothing
/// needs to change. Returns the written object, or `None` when nothing was written.
pub(crate) async fn update_images<F>(
    api: &Api<LeanNodeImage>,
    field_manager: &str,
    current: LeanNodeImage,
    mut decide: F,
) -> Result<Option<LeanNodeImage>, ImagesWriteError>
where
    F: FnMut(&LeanNodeImage) -> Option<Images>,
{
    let name = current.metadata.name.clone().unwrap_or_default();
    let kube_err = |source| ImagesWriteError::Kube {
        name: name.clone(),
        source,
    };
    let raw_api: Api<DynamicObject> = Api::all_with(
        api.clone().into_client(),
        &ApiResource::erase::<NodeImage>(&()),
    );
    let mut current = current;
    let mut current_raw: Option<serde_json::Map<String, Value>> = None;
    for _ in 0..ATTEMPTS {
        let Some(new) = decide(&current) else {
            return Ok(None);
        };
        let Some(patch) = images_patch(
            &current.spec.images,
            current_raw.as_ref(),
            current.metadata.generation,
            &new,
        ) else {
            return Ok(None);
        };
        let params = PatchParams {
            field_manager: Some(field_manager.to_owned()),
            ..Default::default()
        };
        match send(api, &name, &params, &patch).await {
            Ok(written) => return Ok(Some(written)),
            Err(err) if is_not_found(&err) => return Err(ImagesWriteError::NotFound { name }),
            Err(kube::Error::Api(status))
                if status.code == 422 && invalid_message(&status).is_some() =>
            {
                let message = invalid_message(&status).unwrap_or_default();
                return Err(ImagesWriteError::Invalid { name, message });
            }
            Err(err) if is_conflict(&err) => {
                let raw = match raw_api.get(&name).await {
                    Ok(fresh) => fresh,
                    Err(err) if is_not_found(&err) => {
                        return Err(ImagesWriteError::NotFound { name });
                    }
                    Err(err) => return Err(kube_err(err)),
                };
                let value = serde_json::to_value(&raw).expect("an object always serializes");
                current_raw = value
                    .pointer("/spec/images")
                    .and_then(Value::as_object)
                    .cloned();
                current = serde_json::from_value::<LeanNodeImage>(value).map_err(|source| {
                    ImagesWriteError::Unreadable {
                        name: name.clone(),
                        source,
                    }
                })?;
            }
            Err(err) => return Err(kube_err(err)),
        }
    }
    Err(ImagesWriteError::TooManyConflicts { name })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compact_nodeimage::ImageTagSpec;
    use serde_json::json;

    fn image(tags: &[&str]) -> ImageSpec {
        ImageSpec {
            tags: tags
                .iter()
                .map(|t| ImageTagSpec {
                    tag: (*t).into(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    /// Applies `ops` as the apiserver would, read back as a JSON Patch (which also checks that
    /// they serialize as one).
    fn apply(doc: &Value, ops: &[ImagesOp<'_>]) -> Result<Value, json_patch::PatchError> {
        let patch: json_patch::Patch =
            serde_json::from_value(serde_json::to_value(ops).expect("serializes"))
                .expect("a JSON Patch");
        let mut doc = doc.clone();
        json_patch::patch(&mut doc, &patch)?;
        Ok(doc)
    }

    fn status(code: u16, details: Value) -> kube::Error {
        let status = json!({"status": "Failure", "reason": "Invalid", "code": code,
            "message": "m", "details": details});
        kube::Error::Api(serde_json::from_value(status).expect("a Status"))
    }

    #[test]
    fn a_failed_test_is_a_conflict_and_a_schema_refusal_is_not() {
        // As kube-apiserver 1.36 answers them (captured from a real one): a failed `test` op,
        // and a 257th image on a NodeImage.
        let failed_test = status(422, json!({}));
        assert!(is_conflict(&failed_test));
        assert!(is_conflict(&status(409, json!({"name": "n"}))));
        let too_many = status(
            422,
            json!({"name": "probe", "group": "apps.kruise.io", "kind": "NodeImage",
                "causes": [{"reason": "FieldValueTooMany", "field": "spec.images",
                    "message": "Too many: 257: must have at most 256 items"}]}),
        );
        assert!(!is_conflict(&too_many));
        let kube::Error::Api(too_many) = too_many else {
            unreachable!()
        };
        assert_eq!(
            invalid_message(&too_many).as_deref(),
            Some("spec.images: Too many: 257: must have at most 256 items")
        );
    }

    #[test]
    fn no_change_no_patch() {
        let images = Images::from([("nginx".into(), image(&["1"]))]);
        assert!(images_patch(&images, None, Some(5), &images).is_none());
    }

    #[test]
    fn the_first_image_is_guarded_by_the_generation_not_by_status_writes() {
        let new = Images::from([("nginx".into(), image(&["1"]))]);
        let none = Images::new();
        let patch = images_patch(&none, None, Some(7), &new).expect("a patch");
        let doc = json!({"metadata": {"generation": 7, "resourceVersion": "70"}, "spec": {}});
        let out = apply(&doc, &patch).expect("applies");
        assert_eq!(out["spec"]["images"]["nginx"]["tags"][0]["tag"], "1");
        // A daemon's status write moved the resourceVersion, not the generation.
        let mut reported = doc.clone();
        reported["metadata"]["resourceVersion"] = json!("71");
        reported["status"] = json!({"desired": 0});
        assert!(
            apply(&reported, &patch).is_ok(),
            "a status write does not refuse it"
        );
        // Someone else wrote an image meanwhile.
        let racing = json!({"metadata": {"generation": 8}, "spec": {"images": {"nginx": {"tags": [{"tag": "2"}]}}}});
        assert!(
            apply(&racing, &patch).is_err(),
            "a spec written meanwhile refuses the patch"
        );
    }

    #[test]
    fn changing_one_image_tests_only_that_image() {
        let old = Images::from([
            ("nginx".into(), image(&["1"])),
            ("ghcr.io/org/app".into(), image(&["v1"])),
        ]);
        let mut new = old.clone();
        new.insert("ghcr.io/org/app".into(), image(&["v1", "v2"]));
        let patch = images_patch(&old, None, Some(1), &new).expect("a patch");
        let doc = json!({"spec": {"images": serde_json::to_value(&old).unwrap()}});
        let out = apply(&doc, &patch).expect("applies");
        assert_eq!(out["spec"]["images"], serde_json::to_value(&new).unwrap());

        // Someone else changed nginx meanwhile: our patch does not care.
        let mut other = doc.clone();
        other["spec"]["images"]["nginx"]["tags"][0]["tag"] = json!("2");
        let out = apply(&other, &patch).expect("still applies");
        assert_eq!(
            out["spec"]["images"]["nginx"]["tags"][0]["tag"], "2",
            "their change survives"
        );

        // Someone else changed the app image meanwhile: refused, nothing lost.
        let mut racing = doc.clone();
        racing["spec"]["images"]["ghcr.io/org/app"]["tags"][0]["tag"] = json!("v9");
        assert!(apply(&racing, &patch).is_err());
    }

    #[test]
    fn adding_an_image_refuses_if_someone_else_added_it_first() {
        let old = Images::from([("nginx".into(), image(&["1"]))]);
        let mut new = old.clone();
        new.insert("redis".into(), image(&["7"]));
        let doc = json!({"metadata": {"generation": 3}, "spec": {"images": serde_json::to_value(&old).unwrap()}});
        let mut racing = doc.clone();
        racing["spec"]["images"]["redis"] = json!({"tags": [{"tag": "6"}]});
        racing["metadata"]["generation"] = json!(4);
        // Guarded by the generation, or (not read from the apiserver) by the map as seen.
        for generation in [Some(3), None] {
            let patch = images_patch(&old, None, generation, &new).expect("a patch");
            assert!(apply(&doc, &patch).is_ok(), "{generation:?}");
            assert!(apply(&racing, &patch).is_err(), "{generation:?}");
        }
        let patch = images_patch(&old, None, Some(3), &new).expect("a patch");
        let mut reported = doc.clone();
        reported["status"] =
            json!({"imageStatuses": {"nginx": {"tags": [{"tag": "1", "phase": "Pulling"}]}}});
        assert!(
            apply(&reported, &patch).is_ok(),
            "a status write does not refuse it"
        );
    }

    #[test]
    fn tests_quote_the_stored_json_when_known() {
        // Stored with fractions of a second, which our types would not write back.
        let stored =
            json!({"nginx": {"tags": [{"tag": "1", "createdAt": "2026-01-01T00:00:00.123456Z"}]}});
        let old: Images = serde_json::from_value(stored.clone()).unwrap();
        let new = Images::from([("nginx".into(), image(&["2"]))]);
        let doc = json!({"spec": {"images": stored}});
        let typed_only = images_patch(&old, None, None, &new).expect("a patch");
        assert!(
            apply(&doc, &typed_only).is_err(),
            "re-serialized values miss the fractions"
        );
        let raw = doc["spec"]["images"].as_object().unwrap();
        let quoted = images_patch(&old, Some(raw), None, &new).expect("a patch");
        let out = apply(&doc, &quoted).expect("applies");
        assert_eq!(out["spec"]["images"]["nginx"]["tags"][0]["tag"], "2");
    }

    #[test]
    fn removing_an_image_and_names_with_slashes() {
        let old = Images::from([
            ("127.0.0.1:5000/team/app".into(), image(&["1"])),
            ("nginx".into(), image(&["1"])),
        ]);
        let new = Images::from([("nginx".into(), image(&["1"]))]);
        let patch = images_patch(&old, None, None, &new).expect("a patch");
        let doc = json!({"spec": {"images": serde_json::to_value(&old).unwrap()}});
        let out = apply(&doc, &patch).expect("applies");
        assert_eq!(out["spec"]["images"], serde_json::to_value(&new).unwrap());
    }
}
