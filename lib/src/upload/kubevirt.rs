//! KubeVirt (CDI): DataVolume with `source.upload`, UploadTokenRequest, upload proxy.
//!
//! Facts (CDI `pkg/apis/upload/v1beta1/types.go`, `pkg/uploadproxy/uploadproxy.go`,
//! `pkg/controller/common/util.go`; virtctl `pkg/virtctl/imageupload/imageupload.go`):
//! - the DataVolume waits in `UploadScheduled`, then `UploadReady` once its upload server runs;
//!   `Succeeded` when the data is written; `cdi.kubevirt.io/storage.bind.immediate.requested`
//!   binds WaitForFirstConsumer storage without a consumer (otherwise an upload waits for a VM
//!   that does not exist yet: kubevirt#5473, CDI#2912);
//! - `POST .../namespaces/NS/uploadtokenrequests` (`upload.cdi.kubevirt.io/v1beta1`) with
//!   `spec.pvcName` answers `status.token`;
//! - the proxy's address is CDIConfig `config` `status.uploadProxyURL` (a host, virtctl adds
//!   `https://`); `POST /v1beta1/upload` with `Authorization: Bearer TOKEN` answers once the
//!   data is processed (so a conversion error reaches the client);
//! - the proxy runs in CDI's namespace as pods labelled `cdi.kubevirt.io=cdi-uploadproxy`
//!   (HTTPS on 8443), its CA in ConfigMap `cdi-uploadproxy-signer-bundle` key `ca-bundle.crt`,
//!   its certificate naming `cdi-uploadproxy.<ns>.svc`: when the published address cannot be
//!   reached, the upload goes through `pods/portforward` to that pod, TLS verified for that name.

use std::time::Duration;

use http::{HeaderValue, header};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams, Preconditions};
use serde_json::{Value, json};
use tokio::sync::watch;

use super::{Event, MANAGED_BY, Plan, proxy_base, transfer};
use crate::cluster::Cluster;
use crate::error::{Action, Error, Result};
use crate::export::http::{Credentials, HttpClient, HttpError, Route};
use crate::export::object::ObjKind;

/// CDI's immediate-binding annotation.
pub const IMMEDIATE_BIND: &str = "cdi.kubevirt.io/storage.bind.immediate.requested";
/// The upload proxy pods' label.
pub const PROXY_SELECTOR: &str = "cdi.kubevirt.io=cdi-uploadproxy";
/// The proxy's HTTPS port in its pod.
pub const PROXY_POD_PORT: u16 = 8443;
/// Namespaces CDI is usually installed in, tried when pods cannot be listed cluster-wide.
const CDI_NAMESPACES: &[&str] = &["cdi", "kubevirt-hyperconverged", "openshift-cnv"];
const POLL: Duration = Duration::from_millis(500);
/// Who answers uploads, in messages.
const PEER: &str = "the upload proxy";

fn data_volumes() -> ObjKind {
    ObjKind::new("cdi.kubevirt.io", "v1beta1", "DataVolume", "datavolumes")
}

/// The DataVolume this run creates.
pub fn data_volume(plan: &Plan) -> Value {
    let o = &plan.options;
    // plan() always sizes a KubeVirt volume.
    let size = plan.size.unwrap_or_default();
    let mut storage = json!({"resources": {"requests": {"storage": size.to_string()}}});
    if let Some(class) = &o.storage_class {
        storage["storageClassName"] = json!(class);
    }
    if let Some(mode) = &o.access_mode {
        storage["accessModes"] = json!([mode]);
    }
    if let Some(mode) = &o.volume_mode {
        storage["volumeMode"] = json!(mode);
    }
    json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "DataVolume",
        "metadata": {
            "name": o.target.name(),
            "namespace": o.namespace,
            "labels": {MANAGED_BY.0: MANAGED_BY.1},
            "annotations": {IMMEDIATE_BIND: "true"},
        },
        "spec": {"source": {"upload": {}}, "contentType": "kubevirt", "storage": storage},
    })
}

/// What a DataVolume upload needs of the cluster before anything is created: the token comes
/// from CDI's aggregated API, and without it a new DataVolume would wait for an upload that
/// cannot start (with `--no-create` the DataVolume is someone else's).
pub fn preflight(plan: &Plan, platform: &crate::flavor::Platform) -> Result<()> {
    if plan.options.no_create {
        return Ok(());
    }
    platform.require("upload.cdi.kubevirt.io", "v1beta1", "uploadtokenrequests")
}

/// The DataVolume as `kubectl get -o name` writes it (a `pvc/` target's too: a DataVolume of
/// that name owns the PVC).
pub fn resource_name(target: &super::Target) -> String {
    format!("datavolume.cdi.kubevirt.io/{}", target.name())
}

/// Runs the upload; deletes what it created on failure or interruption unless `keep`.
pub async fn run(
    cluster: &Cluster,
    plan: &Plan,
    interrupts: Option<watch::Receiver<usize>>,
    on_event: &mut (dyn FnMut(Event) + Send),
) -> Result<()> {
    let o = &plan.options;
    let ns = &o.namespace;
    let name = o.target.name().to_string();
    let created = if o.no_create {
        None
    } else {
        let uid = create(cluster, plan).await?;
        on_event(Event::Created {
            kind: "DataVolume",
            name: name.clone(),
        });
        Some(uid)
    };
    let work = upload(cluster, plan, on_event);
    let result = match interrupts {
        Some(mut rx) => {
            tokio::select! {
                r = work => r,
                _ = rx.changed() => Err(Error::Transfer("interrupted".into())),
            }
        }
        None => work.await,
    };
    if let Err(e) = result {
        if let Some(uid) = created {
            if o.keep {
                on_event(Event::Kept {
                    kind: "DataVolume",
                    name: name.clone(),
                });
            } else {
                delete(cluster, ns, &name, &uid).await?;
                on_event(Event::Deleted {
                    kind: "DataVolume",
                    name: name.clone(),
                });
            }
        }
        return Err(e);
    }
    on_event(Event::Ready {
        target: o.target.display(),
    });
    Ok(())
}

async fn create(cluster: &Cluster, plan: &Plan) -> Result<String> {
    let o = &plan.options;
    let kind = data_volumes();
    let api: Api<DynamicObject> =
        Api::namespaced_with(cluster.client.clone(), &o.namespace, &kind.resource);
    let obj: DynamicObject = serde_json::from_value(data_volume(plan))
        .map_err(|e| Error::Internal(format!("building the DataVolume: {e}")))?;
    let action = Action::new("create", "datavolumes.cdi.kubevirt.io", "datavolume")
        .named(o.target.name())
        .in_namespace(Some(&o.namespace));
    match api.create(&PostParams::default(), &obj).await {
        Ok(created) => Ok(created.metadata.uid.unwrap_or_default()),
        Err(kube::Error::Api(s)) if s.code == 409 => Err(Error::NotOurs(format!(
            "datavolume {:?} already exists in namespace {:?}: upload into it with --no-create if it waits for an upload, or pick another name",
            o.target.name(),
            o.namespace
        ))),
        Err(e) => Err(cluster.error(e, &action)),
    }
}

async fn delete(cluster: &Cluster, ns: &str, name: &str, uid: &str) -> Result<()> {
    let kind = data_volumes();
    let api: Api<DynamicObject> = Api::namespaced_with(cluster.client.clone(), ns, &kind.resource);
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(cluster.error(
            e,
            &Action::new("delete", "datavolumes.cdi.kubevirt.io", "datavolume")
                .named(name)
                .in_namespace(Some(ns)),
        )),
    }
}

/// What a DataVolume says about itself: the `Running` condition's message when it is an
/// error, else the `Ready`/`Bound` ones, else the phase.
fn explain(dv: &Value) -> String {
    let phase = dv
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("");
    let conditions = dv
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let text = |c: &Value, k: &str| c[k].as_str().filter(|t| !t.is_empty()).map(String::from);
    let from = |t: &str| {
        conditions
            .iter()
            .find(|c| c["type"] == t && c["status"] != "True")
            .and_then(|c| text(c, "message").or_else(|| text(c, "reason")))
    };
    let detail = from("Running").or_else(|| from("Bound"));
    match (phase, detail) {
        ("", _) => "the DataVolume to be picked up by CDI".into(),
        ("PendingPopulation" | "WaitForFirstConsumer", _) => format!(
            "phase {phase}: the storage class binds on first consumer and the immediate-binding annotation was not honoured"
        ),
        (p, Some(d)) => format!("phase {p}: {d}"),
        (p, None) => format!("phase {p}"),
    }
}

/// The error a DataVolume reports (phase Failed, or a `Running` condition with reason Error).
fn failure(dv: &Value) -> Option<String> {
    let phase = dv.pointer("/status/phase").and_then(Value::as_str);
    let running_error = dv
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|c| {
            c.iter()
                .find(|c| c["type"] == "Running" && c["reason"] == "Error")
        })
        .and_then(|c| c["message"].as_str())
        .map(String::from);
    match (phase, running_error) {
        (Some("Failed"), e) => Some(e.unwrap_or_else(|| "phase Failed".into())),
        (_, Some(e)) => Some(e),
        _ => None,
    }
}

/// Polls the DataVolume until `done` says so, with its own explanation while waiting.
async fn wait_dv(
    cluster: &Cluster,
    plan: &Plan,
    done: impl Fn(&Value) -> bool,
    what: &str,
    on_event: &mut (dyn FnMut(Event) + Send),
) -> Result<Value> {
    let o = &plan.options;
    let kind = data_volumes();
    let work = async {
        let mut last = None;
        loop {
            let dv = kind.get(cluster, &o.namespace, o.target.name()).await?;
            if done(&dv) {
                return Ok(dv);
            }
            if let Some(e) = failure(&dv) {
                return Err(Error::Platform(format!(
                    "datavolume {:?} failed: {e}",
                    o.target.name()
                )));
            }
            let message = explain(&dv);
            if last.as_ref() != Some(&message) {
                on_event(Event::Waiting {
                    message: format!("datavolume {} {what} ({message})", o.target.name()),
                });
                last = Some(message);
            }
            tokio::time::sleep(POLL).await;
        }
    };
    match tokio::time::timeout(o.wait_timeout, work).await {
        Ok(r) => r,
        Err(_) => Err(Error::Timeout(format!(
            "datavolume {:?} in namespace {:?} {what}",
            o.target.name(),
            o.namespace
        ))),
    }
}

fn phase_is(dv: &Value, phase: &str) -> bool {
    dv.pointer("/status/phase").and_then(Value::as_str) == Some(phase)
}

async fn upload(
    cluster: &Cluster,
    plan: &Plan,
    on_event: &mut (dyn FnMut(Event) + Send),
) -> Result<()> {
    let o = &plan.options;
    if o.no_create {
        let dv = data_volumes()
            .get(cluster, &o.namespace, o.target.name())
            .await?;
        if dv.pointer("/spec/source/upload").is_none() {
            return Err(Error::Platform(format!(
                "datavolume {:?} does not take uploads (its source is not upload)",
                o.target.name()
            )));
        }
    }
    wait_dv(
        cluster,
        plan,
        |dv| phase_is(dv, "UploadReady"),
        "to be ready for the upload",
        on_event,
    )
    .await?;
    let token = token(cluster, &o.namespace, o.target.name()).await?;
    let bearer = HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|_| Error::Transfer("CDI answered an unusable upload token".into()))?;
    let (client, base) = proxy_client(cluster, plan, bearer, on_event).await?;
    let url = format!("{base}/v1beta1/upload");
    let sending = transfer::Sending {
        peer: PEER,
        max_retries: o.max_retries,
        first_delay: o.retry_delay,
    };
    transfer::send_file(
        &client,
        &url,
        &o.file,
        &sending,
        |_| async { Ok(()) },
        on_event,
    )
    .await?;
    wait_dv(
        cluster,
        plan,
        |dv| phase_is(dv, "Succeeded"),
        "to finish",
        on_event,
    )
    .await?;
    Ok(())
}

/// Asks CDI's API for an upload token for PVC `pvc`.
pub async fn token(cluster: &Cluster, ns: &str, pvc: &str) -> Result<String> {
    let kind = ObjKind::new(
        "upload.cdi.kubevirt.io",
        "v1beta1",
        "UploadTokenRequest",
        "uploadtokenrequests",
    );
    let answer = kind
        .create(
            cluster,
            ns,
            json!({"apiVersion": "upload.cdi.kubevirt.io/v1beta1", "kind": "UploadTokenRequest",
                "metadata": {"name": pvc, "namespace": ns}, "spec": {"pvcName": pvc}}),
        )
        .await?;
    answer
        .pointer("/status/token")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
        .map(String::from)
        .ok_or_else(|| {
            Error::Platform("CDI answered the UploadTokenRequest without a token".into())
        })
}

/// CDIConfig's `status.uploadProxyURL`, if set and readable.
async fn published_url(cluster: &Cluster) -> Option<String> {
    let kind = crate::api::Kind {
        group: "cdi.kubevirt.io",
        version: "v1beta1",
        kind: "CDIConfig",
        plural: "cdiconfigs",
        namespaced: false,
    };
    let config = kind.api(&cluster.client, None).get("config").await.ok()?;
    let value = serde_json::to_value(config).ok()?;
    value
        .pointer("/status/uploadProxyURL")
        .and_then(Value::as_str)
        .filter(|u| !u.is_empty())
        .map(String::from)
}

/// The upload proxy's pod and namespace.
async fn proxy_pod(cluster: &Cluster) -> Result<(String, String)> {
    let params = ListParams::default().labels(PROXY_SELECTOR);
    let running = |pods: Vec<Pod>| {
        pods.into_iter().find_map(|p| {
            (p.status.as_ref()?.phase.as_deref() == Some("Running"))
                .then(|| Some((p.metadata.namespace?, p.metadata.name?)))?
        })
    };
    let all: Api<Pod> = Api::all(cluster.client.clone());
    if let Ok(list) = all.list(&params).await {
        return running(list.items).ok_or_else(|| {
            Error::Transfer(format!(
                "no running CDI upload proxy pod ({PROXY_SELECTOR}) in the cluster"
            ))
        });
    }
    for ns in CDI_NAMESPACES {
        let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), ns);
        if let Ok(list) = pods.list(&params).await
            && let Some(found) = running(list.items)
        {
            return Ok(found);
        }
    }
    Err(Error::Transfer(format!(
        "cannot find CDI's upload proxy pod ({PROXY_SELECTOR}) in namespaces {}: give a reachable --uploadproxy-url",
        CDI_NAMESPACES.join(", ")
    )))
}

/// The proxy's CA from CDI's signer bundle, if readable (else only the usual roots).
async fn proxy_ca(cluster: &Cluster, ns: &str) -> String {
    let maps: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), ns);
    maps.get("cdi-uploadproxy-signer-bundle")
        .await
        .ok()
        .and_then(|m| m.data?.get("ca-bundle.crt").cloned())
        .unwrap_or_default()
}

/// A client for the upload proxy: its published (or given) address when it answers, else a
/// port-forward to its pod.
async fn proxy_client(
    cluster: &Cluster,
    plan: &Plan,
    bearer: HeaderValue,
    on_event: &mut (dyn FnMut(Event) + Send),
) -> Result<(HttpClient, String)> {
    let o = &plan.options;
    let credentials = || Credentials::Header(header::AUTHORIZATION, bearer.clone());
    let given = match &o.uploadproxy_url {
        Some(url) => Some(proxy_base(url)?),
        None => published_url(cluster)
            .await
            .map(|u| proxy_base(&u))
            .transpose()?,
    };
    let pod = proxy_pod(cluster).await;
    let ca_ns = pod
        .as_ref()
        .map(|(ns, _)| ns.clone())
        .unwrap_or_else(|_| CDI_NAMESPACES[0].to_string());
    let ca = proxy_ca(cluster, &ca_ns).await;
    if let Some(base) = given {
        let client = HttpClient::new(
            &cluster.config,
            &ca,
            o.insecure,
            credentials(),
            Route::Direct,
        )?;
        // Any answer means reachable; only a failure to connect sends us through the API server.
        match client
            .send(http::Method::GET, &format!("{base}/healthz"), &[])
            .await
        {
            Ok(_) | Err(HttpError::Status { .. }) => {
                on_event(Event::Route {
                    description: format!("uploading to the upload proxy at {base}"),
                });
                return Ok((client, base));
            }
            Err(
                e @ HttpError::Connect {
                    retryable: false, ..
                },
            ) => {
                return Err(Error::Transfer(format!(
                    "the upload proxy at {base}: {}",
                    transfer::describe(&e, PEER)
                )));
            }
            Err(e) => {
                on_event(Event::Route {
                    description: format!("the upload proxy at {base} is not reachable ({e})"),
                });
            }
        }
    }
    let (ns, pod) = pod?;
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &ns);
    let route = Route::PortForward {
        pods,
        pod: pod.clone(),
        port: PROXY_POD_PORT,
    };
    let client = HttpClient::new(&cluster.config, &ca, o.insecure, credentials(), route)?;
    on_event(Event::Route {
        description: format!(
            "uploading through the API server: port-forward to the upload proxy pod {ns}/{pod}"
        ),
    });
    Ok((client, format!("https://cdi-uploadproxy.{ns}.svc")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_and_explanations_come_from_the_data_volume() {
        let dv = json!({"status": {"phase": "UploadReady", "conditions": [
            {"type": "Running", "status": "False", "reason": "Error",
             "message": "Virtual image size 9 is larger than the reported available storage 8. A larger PVC is required."}]}});
        assert!(failure(&dv).unwrap().starts_with("Virtual image size 9"));
        let waiting = json!({"status": {"phase": "UploadScheduled", "conditions": [
            {"type": "Running", "status": "False", "reason": "Pending", "message": ""}]}});
        assert_eq!(failure(&waiting), None);
        assert_eq!(explain(&waiting), "phase UploadScheduled: Pending");
        assert_eq!(
            failure(&json!({"status": {"phase": "Failed"}})).as_deref(),
            Some("phase Failed")
        );
    }
}
