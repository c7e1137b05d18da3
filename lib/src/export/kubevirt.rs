//! KubeVirt: a VirtualMachineExport (`export.kubevirt.io`, version from discovery) with a token
//! Secret owned by it (FACTS kubevirt §3.7/§5: `spec.source` TypedLocalObjectReference,
//! `spec.tokenSecretRef`, `ttlDuration`; links with their CA; token in the
//! `x-kubevirt-export-token` header). Unlike virtctl (kubevirt#11080) the export is deleted
//! only after a successful download.

use base64::Engine;
use http::{HeaderName, HeaderValue, Method};
use serde_json::{Value, json};

use super::http::{Credentials, HttpClient, Route};
use super::object::{self, ObjKind};
use super::route;
use super::{Event, ExportOptions, Format, Output, Source, VolumeLink};
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::flavor::{KUBEVIRT_EXPORT_GROUP, Platform};

/// The token header of KubeVirt's export server.
pub const TOKEN_HEADER: &str = "x-kubevirt-export-token";
/// Port of the export server pod (service port 443 → pod 8443).
const POD_PORT: u16 = 8443;

fn export_kind(platform: &Platform) -> ObjKind {
    let version = platform.kubevirt_export_version().unwrap_or("v1");
    ObjKind::new(
        KUBEVIRT_EXPORT_GROUP,
        version,
        "VirtualMachineExport",
        "virtualmachineexports",
    )
}

fn secret_kind() -> ObjKind {
    ObjKind::new("", "v1", "Secret", "secrets")
}

/// The VirtualMachineExport for a source.
pub fn export_object(
    name: &str,
    api_version: &str,
    source: &Source,
    secret: &str,
    ttl: std::time::Duration,
) -> Result<Value> {
    let (group, kind, source_name) = match source {
        Source::Vm(n) => ("kubevirt.io", "VirtualMachine", n),
        Source::VmSnapshot(n) => ("snapshot.kubevirt.io", "VirtualMachineSnapshot", n),
        Source::Pvc(n) => ("", "PersistentVolumeClaim", n),
        other => {
            return Err(Error::InvalidTarget(format!(
                "{} is not a KubeVirt export source",
                other.display()
            )));
        }
    };
    Ok(json!({
        "apiVersion": api_version,
        "kind": "VirtualMachineExport",
        "metadata": {"name": name, "labels": object::labels(name)},
        "spec": {
            "source": {"apiGroup": group, "kind": kind, "name": source_name},
            "tokenSecretRef": secret,
            "ttlDuration": format!("{}s", ttl.as_secs()),
        }
    }))
}

fn random_token() -> String {
    let mut bytes = [0u8; 32];
    // A token must be unguessable: no fallback here.
    getrandom::fill(&mut bytes).expect("the operating system's random source");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Runs a KubeVirt export.
pub async fn run(
    cluster: &Cluster,
    platform: &Platform,
    options: &ExportOptions,
    on_event: &mut (dyn FnMut(Event) + Send),
) -> Result<()> {
    let ns = options.namespace.as_str();
    let kind = export_kind(platform);
    let secrets = secret_kind();
    let (name, export, created_secret) = match &options.reuse {
        Some(name) => {
            let export = kind.get(cluster, ns, name).await?;
            on_event(Event::Reusing { name: name.clone() });
            (name.clone(), export, None)
        }
        None => create_export(cluster, &kind, &secrets, options, on_event).await?,
    };
    let export_uid = object::uid(&export);
    let kept_hint = |e: Error| -> Error {
        Error::Transfer(format!(
            "{e}{}",
            super::resume_hint("VirtualMachineExport", &name, options)
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
                Ok(matches!(phase, Some("Ready" | "Skipped")))
            },
            |o| format!("VirtualMachineExport {name}: {}", object::ready_message(o)),
            on_event,
        )
        .await
        .map_err(kept_hint)?;
    if ready.pointer("/status/phase").and_then(Value::as_str) == Some("Skipped") {
        // Final upstream (a VM or snapshot without volumes): nothing to download or resume.
        let why = object::skipped_message(&ready);
        remove_created(
            cluster,
            &kind,
            &name,
            &export_uid,
            &ready,
            created_secret.as_ref(),
            options,
            on_event,
        )
        .await?;
        return Err(Error::Transfer(format!(
            "VirtualMachineExport {name} was skipped: {why}"
        )));
    }
    on_event(Event::Ready { name: name.clone() });

    let (secret, token) = read_token(cluster, &secrets, ns, &ready)
        .await
        .map_err(kept_hint)?;

    let result = fetch(cluster, &ready, &name, token, options, on_event).await;
    match result {
        Err(e) => Err(if options.reuse.is_some() || created_secret.is_some() {
            kept_hint(e)
        } else {
            e
        }),
        Ok(()) => {
            remove_created(
                cluster,
                &kind,
                &name,
                &export_uid,
                &ready,
                Some(&secret),
                options,
                on_event,
            )
            .await?;
            Ok(())
        }
    }
}

/// Creates the VirtualMachineExport and its token Secret (owned by the export, as virtctl
/// does); returns its name, the export and the Secret. All or nothing: the export goes again
/// when the Secret cannot be made.
async fn create_export(
    cluster: &Cluster,
    kind: &ObjKind,
    secrets: &ObjKind,
    options: &ExportOptions,
    on_event: &mut (dyn FnMut(Event) + Send),
) -> Result<(String, Value, Option<Value>)> {
    let ns = options.namespace.as_str();
    let name = super::export_name("export", &options.source);
    let secret_name = format!("{name}-token");
    let body = export_object(
        &name,
        &kind.resource.api_version,
        &options.source,
        &secret_name,
        options.ttl,
    )?;
    let export = kind.create(cluster, ns, body).await?;
    on_event(Event::Created {
        kind: "VirtualMachineExport",
        name: name.clone(),
    });
    let token = random_token();
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {
            "name": secret_name,
            "labels": object::labels(&name),
            // Owned by the export, so it goes when the export goes (as virtctl does).
            "ownerReferences": [{
                "apiVersion": kind.resource.api_version, "kind": "VirtualMachineExport",
                "name": name, "uid": object::uid(&export), "blockOwnerDeletion": false,
            }],
        },
        "type": "Opaque",
        "data": {"token": base64::engine::general_purpose::STANDARD.encode(&token)},
    });
    match secrets.create(cluster, ns, secret).await {
        Ok(s) => Ok((name, export, Some(s))),
        Err(e) => {
            // Nothing usable was made: take the export back.
            let _ = kind.delete(cluster, ns, &name, &object::uid(&export)).await;
            Err(e)
        }
    }
}

/// The token Secret the ready export names, and its token as a header value.
async fn read_token(
    cluster: &Cluster,
    secrets: &ObjKind,
    ns: &str,
    ready: &Value,
) -> Result<(Value, HeaderValue)> {
    let secret_name = ready
        .pointer("/status/tokenSecretRef")
        .or_else(|| ready.pointer("/spec/tokenSecretRef"))
        .and_then(Value::as_str)
        .ok_or_else(|| Error::Transfer("the export names no token Secret".into()))?
        .to_string();
    let secret = secrets.get(cluster, ns, &secret_name).await?;
    let token = secret
        .pointer("/data/token")
        .and_then(Value::as_str)
        .and_then(|t| base64::engine::general_purpose::STANDARD.decode(t).ok())
        .ok_or_else(|| Error::Transfer(format!("Secret {secret_name:?} has no `token` key")))?;
    let token = HeaderValue::from_bytes(&token)
        .map_err(|_| Error::Transfer("the export token is not a valid header".into()))?;
    Ok((secret, token))
}

/// Deletes the export and its token Secret when this run (or an earlier failed kubectl-vm
/// run) created them, with uid preconditions; keeps them with `--keep` or when they are not
/// ours.
#[allow(clippy::too_many_arguments)]
async fn remove_created(
    cluster: &Cluster,
    kind: &ObjKind,
    name: &str,
    export_uid: &str,
    export: &Value,
    secret: Option<&Value>,
    options: &ExportOptions,
    on_event: &mut (dyn FnMut(Event) + Send),
) -> Result<()> {
    let kept = |why: &str| Event::Kept {
        kind: "VirtualMachineExport",
        name: name.to_string(),
        why: why.into(),
    };
    if options.keep {
        on_event(kept("--keep"));
        return Ok(());
    }
    if options.reuse.is_some() && !object::ours(export) {
        on_event(kept("it was not created by kubectl vm"));
        return Ok(());
    }
    let ns = options.namespace.as_str();
    // The uid read when this run created (or picked) the export: a namesake made meanwhile
    // is not ours to delete.
    kind.delete(cluster, ns, name, export_uid).await?;
    on_event(Event::Deleted {
        kind: "VirtualMachineExport",
        name: name.to_string(),
    });
    // Garbage collection removes the owned Secret; make sure, with its uid.
    if let Some(secret) = secret.filter(|s| object::ours(s)) {
        let secret_name = object::name(secret);
        secret_kind()
            .delete(cluster, ns, &secret_name, &object::uid(secret))
            .await?;
        on_event(Event::Deleted {
            kind: "Secret",
            name: secret_name,
        });
    }
    Ok(())
}

/// Picks the link (external, else internal through a port-forward), then downloads the
/// volumes or fetches the manifest.
async fn fetch(
    cluster: &Cluster,
    export: &Value,
    name: &str,
    token: HeaderValue,
    options: &ExportOptions,
    on_event: &mut (dyn FnMut(Event) + Send),
) -> Result<()> {
    let links = export.pointer("/status/links");
    let external = links
        .and_then(|l| l.get("external"))
        .filter(|l| l.get("volumes").is_some() || l.get("manifests").is_some());
    let (link, route) = match external {
        Some(link) => {
            on_event(Event::Route {
                description: "reaching the export server through its external link".into(),
            });
            (link, Route::Direct)
        }
        None => {
            let link = links
                .and_then(|l| l.get("internal"))
                .ok_or_else(|| Error::Transfer("the export is ready but has no links".into()))?;
            let selector =
                route::PodSelector::Label(format!("{}={name}", route::KUBEVIRT_SERVICE_LABEL));
            let (route, pod) =
                route::port_forward(cluster, &options.namespace, &selector, POD_PORT).await?;
            on_event(Event::Route {
                description: format!(
                    "no external link: reaching the export server's internal link through a port-forward to pod {pod}"
                ),
            });
            (link, route)
        }
    };
    let ca = link.get("cert").and_then(Value::as_str).unwrap_or("");
    let client = HttpClient::new(
        &cluster.config,
        ca,
        options.insecure,
        Credentials::Header(HeaderName::from_static(TOKEN_HEADER), token),
        route,
    )?;
    if options.output == Output::Manifest {
        let url = link
            .pointer("/manifests")
            .and_then(Value::as_array)
            .and_then(|m| m.iter().find(|m| m["type"] == "all"))
            .and_then(|m| m["url"].as_str())
            .ok_or_else(|| {
                Error::Transfer("the export offers no manifest (only VM exports do)".into())
            })?;
        let text = fetch_text(&client, url).await?;
        on_event(Event::Manifest { text });
        return Ok(());
    }
    let volumes = volume_links(link, options)?;
    super::download_all(&client, &volumes, options, on_event).await
}

async fn fetch_text(client: &HttpClient, url: &str) -> Result<String> {
    use http_body_util::BodyExt;
    let response = client
        .send(
            Method::GET,
            url,
            &[(http::header::ACCEPT, "application/yaml".into())],
        )
        .await
        .map_err(|e| Error::Transfer(format!("fetching the manifest: {e}")))?;
    let body = http_body_util::Limited::new(response.into_body(), 16 << 20)
        .collect()
        .await
        .map_err(|e| Error::Transfer(format!("reading the manifest: {e}")))?
        .to_bytes();
    String::from_utf8(body.to_vec())
        .map_err(|_| Error::Transfer("the manifest is not UTF-8 text".into()))
}

/// The volumes to fetch from a link, in the chosen format.
pub fn volume_links(link: &Value, options: &ExportOptions) -> Result<Vec<VolumeLink>> {
    let all = link
        .get("volumes")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let names: Vec<&str> = all.iter().filter_map(|v| v["name"].as_str()).collect();
    let chosen: Vec<&Value> = match &options.volume {
        Some(want) => {
            let v = all
                .iter()
                .find(|v| v["name"] == want.as_str())
                .ok_or_else(|| {
                    Error::Transfer(format!(
                        "the export has no volume {want:?}; it has: {}",
                        names.join(", ")
                    ))
                })?;
            vec![v]
        }
        None => all.iter().collect(),
    };
    if chosen.is_empty() {
        return Err(Error::Transfer("the export has no volumes".into()));
    }
    if let Some(file) = &options.dir_file {
        return chosen.into_iter().map(|v| dir_file_link(v, file)).collect();
    }
    let want_gzip = options.format == Format::Gzip || options.decompress;
    chosen
        .into_iter()
        .map(|v| {
            let name = v["name"].as_str().unwrap_or("").to_string();
            let url_of = |format: &str| {
                v.get("formats")
                    .and_then(Value::as_array)
                    .and_then(|f| f.iter().find(|f| f["format"] == format))
                    .and_then(|f| f["url"].as_str())
                    .map(String::from)
            };
            let (url, gzip) = if want_gzip {
                (url_of("gzip"), true)
            } else {
                (url_of("raw"), false)
            };
            let url = url.ok_or_else(|| {
                Error::Transfer(if want_gzip {
                    format!("volume {name:?} is not offered as gzip")
                } else {
                    format!(
                        "volume {name:?} is not offered raw: use --decompress (or --format gzip)"
                    )
                })
            })?;
            Ok(VolumeLink { name, url, gzip })
        })
        .collect()
}

/// The link of `file` in a filesystem volume: its `dir` URL (Go's `http.FileServer` on the
/// claim, kubevirt `virt-exportserver/exportserver.go` `dirHandler`) and the name escaped as
/// one path segment.
fn dir_file_link(volume: &Value, file: &str) -> Result<VolumeLink> {
    let name = volume["name"].as_str().unwrap_or("").to_string();
    if !crate::validate::is_single_file_name(file) {
        return Err(Error::Transfer(format!(
            "refusing the file name {file:?}: not a single file name"
        )));
    }
    let formats = volume
        .get("formats")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let dir = formats
        .iter()
        .find(|f| f["format"] == "dir")
        .and_then(|f| f["url"].as_str())
        .ok_or_else(|| {
            let offered: Vec<&str> = formats
                .iter()
                .filter_map(|f| f["format"].as_str())
                .collect();
            Error::Transfer(format!(
                "volume {name:?} is not offered as a directory (it offers: {})",
                offered.join(", ")
            ))
        })?;
    let escaped: String = file
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            b => format!("%{b:02X}"),
        })
        .collect();
    let sep = if dir.ends_with('/') { "" } else { "/" };
    Ok(VolumeLink {
        name,
        url: format!("{dir}{sep}{escaped}"),
        gzip: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dir_file_is_one_escaped_segment_of_the_dir_link() {
        let v = json!({"name": "dump", "formats": [
            {"format": "dir", "url": "https://x/volumes/dump/dir/"},
            {"format": "tar.gz", "url": "https://x/volumes/dump/disk.tar.gz"}]});
        let link = dir_file_link(&v, "web dump#1.memory.dump").unwrap();
        assert_eq!(
            link.url,
            "https://x/volumes/dump/dir/web%20dump%231.memory.dump"
        );
        assert!(!link.gzip);
        for hostile in ["../x", "a/b", "..", "", "/etc/passwd"] {
            assert!(dir_file_link(&v, hostile).is_err(), "{hostile:?}");
        }
        let disk = json!({"name": "d", "formats": [{"format": "raw", "url": "https://x/d"}]});
        assert!(dir_file_link(&disk, "f").is_err());
    }

    #[test]
    fn export_object_references_the_source_kind() {
        let o = export_object(
            "e",
            "export.kubevirt.io/v1beta1",
            &Source::VmSnapshot("s".into()),
            "e-token",
            std::time::Duration::from_secs(7200),
        )
        .unwrap();
        assert_eq!(o["spec"]["source"]["apiGroup"], "snapshot.kubevirt.io");
        assert_eq!(o["spec"]["source"]["kind"], "VirtualMachineSnapshot");
        assert_eq!(o["spec"]["ttlDuration"], "7200s");
        assert_eq!(o["apiVersion"], "export.kubevirt.io/v1beta1");
        assert!(export_object("e", "v", &Source::Vd("d".into()), "t", Default::default()).is_err());
    }
}
