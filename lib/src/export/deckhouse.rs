//! Deckhouse: a DataExport (`storage-foundation.deckhouse.io/v1alpha1`, FACTS deckhouse §13)
//! per disk, disk snapshot or PVC; the exporter serves Block volumes raw at
//! `<url>/api/v1/block` with Range and authorizes the kubeconfig's own credentials
//! (`dataexports/download`), as `d8 data export download` does. `spec.ttl` is an idle TTL.

use base64::Engine;
use serde_json::{Value, json};

use super::http::{Credentials, HttpClient, Route};
use super::object::{self, ObjKind};
use super::route;
use super::{Event, ExportOptions, Format, Output, Source, VolumeLink};
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::flavor::Platform;

/// Group of DataExport.
pub const GROUP: &str = "storage-foundation.deckhouse.io";

fn export_kind() -> ObjKind {
    ObjKind::new(GROUP, "v1alpha1", "DataExport", "dataexports")
}

/// The DataExport for a source. `publish` asks for the public URL, which a client outside
/// the cluster needs.
pub fn export_object(name: &str, source: &Source, ttl: std::time::Duration) -> Result<Value> {
    let (group, kind, target) = match source {
        Source::Vd(n) => ("virtualization.deckhouse.io", "VirtualDisk", n),
        Source::Vds(n) => ("virtualization.deckhouse.io", "VirtualDiskSnapshot", n),
        Source::Pvc(n) => ("", "PersistentVolumeClaim", n),
        other => {
            return Err(Error::InvalidTarget(format!(
                "{} is not a Deckhouse export source",
                other.display()
            )));
        }
    };
    let mut target_ref = json!({"kind": kind, "name": target});
    if !group.is_empty() {
        target_ref["group"] = json!(group);
    }
    Ok(json!({
        "apiVersion": format!("{GROUP}/v1alpha1"),
        "kind": "DataExport",
        "metadata": {"name": name, "labels": object::labels(name)},
        // The CRD's pattern takes h/m/s; whole seconds always match it.
        "spec": {"ttl": format!("{}s", ttl.as_secs().max(1)), "publish": true, "targetRef": target_ref},
    }))
}

fn target_name(source: &Source) -> &str {
    match source {
        Source::Vd(n) | Source::Vds(n) | Source::Pvc(n) | Source::Vm(n) | Source::VmSnapshot(n) => {
            n
        }
    }
}

/// Runs a Deckhouse export.
pub async fn run(
    cluster: &Cluster,
    _platform: &Platform,
    options: &ExportOptions,
    on_event: &mut (dyn FnMut(Event) + Send),
) -> Result<()> {
    if options.output == Output::Manifest {
        return Err(Error::InvalidTarget(
            "--manifest is a KubeVirt feature: Deckhouse exports disks, not VMs".into(),
        ));
    }
    if options.insecure {
        return Err(Error::Usage(super::http::INSECURE_WITH_CREDENTIALS.into()));
    }
    let ns = options.namespace.as_str();
    let kind = export_kind();
    let (name, export) = match &options.reuse {
        Some(name) => {
            let export = kind.get(cluster, ns, name).await?;
            on_event(Event::Reusing { name: name.clone() });
            (name.clone(), export)
        }
        None => {
            let name = super::export_name("de", &options.source);
            let body = export_object(&name, &options.source, options.ttl)?;
            let export = kind.create(cluster, ns, body).await?;
            on_event(Event::Created {
                kind: "DataExport",
                name: name.clone(),
            });
            (name, export)
        }
    };
    let export_uid = object::uid(&export);
    let kept_hint = |e: Error| -> Error {
        Error::Transfer(format!(
            "{e}{}",
            super::resume_hint("DataExport", &name, options)
        ))
    };
    let ready = kind
        .wait(
            cluster,
            ns,
            &name,
            options.wait_timeout,
            |o| {
                let phase = o.pointer("/status/phase").and_then(Value::as_str);
                if phase == Some("Expired") || phase == Some("Failed") {
                    return Err(Error::Transfer(format!(
                        "DataExport {name} is {}: {}",
                        phase.unwrap_or(""),
                        object::ready_message(o)
                    )));
                }
                Ok(phase == Some("Ready")
                    && (o.pointer("/status/publicURL").is_some()
                        || o.pointer("/status/url").is_some()))
            },
            |o| format!("DataExport {name}: {}", object::ready_message(o)),
            on_event,
        )
        .await
        .map_err(kept_hint)?;
    on_event(Event::Ready { name: name.clone() });

    let result = fetch(cluster, &ready, options, on_event).await;
    match result {
        Err(e) => Err(kept_hint(e)),
        Ok(()) => {
            if options.keep {
                on_event(Event::Kept {
                    kind: "DataExport",
                    name,
                    why: "--keep".into(),
                });
            } else if options.reuse.is_some() && !object::ours(&ready) {
                on_event(Event::Kept {
                    kind: "DataExport",
                    name,
                    why: "it was not created by kubectl vm".into(),
                });
            } else {
                kind.delete(cluster, ns, &name, &export_uid).await?;
                on_event(Event::Deleted {
                    kind: "DataExport",
                    name,
                });
            }
            Ok(())
        }
    }
}

async fn fetch(
    cluster: &Cluster,
    export: &Value,
    options: &ExportOptions,
    on_event: &mut (dyn FnMut(Event) + Send),
) -> Result<()> {
    if export.pointer("/status/volumeMode").and_then(Value::as_str) == Some("Filesystem") {
        return Err(Error::Transfer(
            "the export is a Filesystem volume: only Block volumes (disks) are downloaded by kubectl vm".into(),
        ));
    }
    if options.format == Format::Gzip || options.decompress {
        return Err(Error::InvalidTarget(
            "Deckhouse exporters serve raw data only: drop --format gzip / --decompress".into(),
        ));
    }
    let public = export.pointer("/status/publicURL").and_then(Value::as_str);
    // The exporter takes the kubeconfig's credentials. They go directly only to the API
    // server's host; a public URL elsewhere (e.g. `api.<public domain>` while the kubeconfig
    // names a master's address) is reached through the API server instead.
    let elsewhere = public.filter(|url| !super::http::on_api_server_host(&cluster.config, url));
    let (base, route) = match public {
        Some(url) if elsewhere.is_none() => {
            on_event(Event::Route {
                description: "reaching the exporter through its public URL".into(),
            });
            (url.to_string(), Route::Direct)
        }
        _ => {
            // Only the in-cluster URL (`https://IP:8085`): through the exporter pod with that IP.
            let url = export
                .pointer("/status/url")
                .and_then(Value::as_str)
                .ok_or_else(|| Error::Transfer("the DataExport is ready but has no URL".into()))?;
            let uri: http::Uri = url.parse().map_err(|e| {
                Error::Transfer(format!("the DataExport's URL {url:?} is unreadable: {e}"))
            })?;
            let ip = uri
                .host()
                .unwrap_or_default()
                .trim_matches(['[', ']'])
                .to_string();
            let port = uri.port_u16().unwrap_or(443);
            let selector = route::PodSelector::Ip(ip);
            let (route, pod) =
                route::port_forward(cluster, &options.namespace, &selector, port).await?;
            let why = match elsewhere {
                Some(public) => format!(
                    "the public URL {public} is not on the API server's host, and your cluster \
                     credentials go only there"
                ),
                None => "no public URL".into(),
            };
            on_event(Event::Route {
                description: format!(
                    "{why}: reaching the exporter at {url} through a port-forward to pod {pod}"
                ),
            });
            (url.to_string(), route)
        }
    };
    let ca = export
        .pointer("/status/ca")
        .and_then(Value::as_str)
        .and_then(|c| base64::engine::general_purpose::STANDARD.decode(c).ok())
        .map(|c| String::from_utf8_lossy(&c).into_owned())
        .unwrap_or_default();
    let client = HttpClient::new(
        &cluster.config,
        &ca,
        options.insecure,
        Credentials::Kube(Box::new(cluster.config.clone())),
        route,
    )?;
    let volume = VolumeLink {
        name: target_name(&options.source).to_string(),
        url: format!("{}/api/v1/block", base.trim_end_matches('/')),
        gzip: false,
    };
    super::download_all(&client, &[volume], options, on_event).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_export_matches_the_crd() {
        let o = export_object(
            "de-vd-x",
            &Source::Vd("x".into()),
            std::time::Duration::from_secs(7200),
        )
        .unwrap();
        assert_eq!(o["spec"]["targetRef"]["kind"], "VirtualDisk");
        assert_eq!(
            o["spec"]["targetRef"]["group"],
            "virtualization.deckhouse.io"
        );
        let pvc = export_object("p", &Source::Pvc("x".into()), Default::default()).unwrap();
        assert!(pvc["spec"]["targetRef"].get("group").is_none());
        // The CRD's ttl pattern.
        let re =
            regex::Regex::new(r"^([0-9]+(\.[0-9]+)?h)?([0-9]+(\.[0-9]+)?m)?([0-9]+s)?$").unwrap();
        assert!(re.is_match(o["spec"]["ttl"].as_str().unwrap()));
    }
}
