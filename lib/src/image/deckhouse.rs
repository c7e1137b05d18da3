//! Deckhouse: VirtualImage (namespaced) and ClusterVirtualImage
//! (`virtualization.deckhouse.io/v1alpha2`, FACTS §12; their CRDs in the reference).
//!
//! - `spec.dataSource.type` `HTTP` (`http.url`, `http.checksum.{md5,sha1,sha256,sha512}`),
//!   `ContainerImage` (`containerImage.image`), `ObjectRef` (`objectRef.{kind,name}`, a
//!   ClusterVirtualImage's also `namespace`) or `Upload`; a VirtualImage's `spec.storage` is
//!   `ContainerRegistry` (DVCR, the default) or `PersistentVolumeClaim`.
//! - `status.phase` `Pending|Provisioning|WaitForUserUpload|Ready|Failed|Terminating|ImageLost`
//!   (`PVCLost`), `status.progress` (`"45%"`), `status.format`, `status.size.{stored,unpacked}`,
//!   `status.target.{registryURL,persistentVolumeClaimName}`; condition `Ready` reasons
//!   `Provisioning`, `ProvisioningFailed` (with the importer's error), `Ready`
//!   (deckhouse/virtualization `api/core/v1alpha2/vicondition/condition.go`).

use futures::FutureExt;
use futures::future::{BoxFuture, LocalBoxFuture};
use serde_json::{Value, json};

use super::{
    Catalog, CreateRequest, Deleted, DryRun, Event, Image, ImageKind, ImageName, OnEvent, OnPage,
    Options, Outcome, Source, Storage, condition, create_obj, delete_obj, get_opt, is_ours, labels,
    namespace_of, pages, quantity_text, text,
};
use crate::api::{DECKHOUSE_VM, Kind, VIRTUAL_DISK};
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::lifecycle::watch::{self, Watched};

pub use crate::disk::deckhouse::{CLUSTER_VIRTUAL_IMAGE, VIRTUAL_IMAGE};

/// The Deckhouse catalog.
pub struct Deckhouse;

fn kind_of(image: ImageKind) -> Kind {
    if image == ImageKind::Cvi {
        CLUSTER_VIRTUAL_IMAGE
    } else {
        VIRTUAL_IMAGE
    }
}

/// A VirtualImage or ClusterVirtualImage as a catalog row.
pub(crate) fn summarize(obj: &Value) -> Image {
    let cluster = obj["kind"] == "ClusterVirtualImage";
    let ns = text(obj, "/metadata/namespace").to_owned();
    let ds = obj.pointer("/spec/dataSource").cloned().unwrap_or_default();
    let source = match text(&ds, "/type") {
        "HTTP" => text(&ds, "/http/url").to_owned(),
        "ContainerImage" => format!("registry {}", text(&ds, "/containerImage/image")),
        "ObjectRef" => {
            let r = &ds["objectRef"];
            let short = match text(r, "/kind") {
                "VirtualImage" => "vi",
                "ClusterVirtualImage" => "cvi",
                "VirtualDisk" => "vd",
                "VirtualDiskSnapshot" => "vds",
                other => other,
            };
            match r["namespace"].as_str() {
                Some(rns) if short != "cvi" => format!("{short}/{rns}/{}", text(r, "/name")),
                _ => format!("{short}/{}", text(r, "/name")),
            }
        }
        "Upload" => "upload".into(),
        other => other.to_owned(),
    };
    let phase = text(obj, "/status/phase").to_owned();
    let ready = phase == "Ready";
    let message = condition(obj, "Ready")
        .filter(|c| c["status"] != "True")
        .map(|c| text(c, "/message").to_owned())
        .unwrap_or_default();
    let target = match (
        text(obj, "/status/target/registryURL"),
        text(obj, "/status/target/persistentVolumeClaimName"),
    ) {
        (_, pvc) if !pvc.is_empty() => format!("pvc/{ns}/{pvc}"),
        (url, _) => url.to_owned(),
    };
    let size = [
        quantity_text(obj.pointer("/status/size/unpacked")),
        quantity_text(obj.pointer("/status/size/stored")),
    ]
    .into_iter()
    .find(|s| !s.is_empty())
    .unwrap_or_default();
    Image {
        kind: if cluster {
            ImageKind::Cvi
        } else {
            ImageKind::Vi
        },
        name: text(obj, "/metadata/name").to_owned(),
        namespace: ns,
        source,
        format: text(obj, "/status/format").to_owned(),
        size,
        progress: if phase == "Provisioning" {
            text(obj, "/status/progress").to_owned()
        } else {
            String::new()
        },
        phase: if phase.is_empty() {
            "Pending".into()
        } else {
            phase
        },
        ready,
        message,
        target,
        created: text(obj, "/metadata/creationTimestamp").to_owned(),
        ours: is_ours(obj),
        object: obj.clone(),
    }
}

impl Catalog for Deckhouse {
    fn list<'a>(
        &'a self,
        cluster: &'a Cluster,
        namespace: Option<&'a str>,
        selector: Option<&'a str>,
        on_page: &'a mut OnPage<'a>,
    ) -> BoxFuture<'a, Result<()>> {
        async move {
            // The last page of VirtualImages is handed over with the first page of
            // ClusterVirtualImages (one table when both fit a page), never more than a page.
            let mut held: Vec<Image> = Vec::new();
            pages(cluster, &VIRTUAL_IMAGE, namespace, selector, |items| {
                let page: Vec<Image> = items.iter().map(summarize).collect();
                let previous = std::mem::replace(&mut held, page);
                if previous.is_empty() {
                    Ok(())
                } else {
                    on_page(previous)
                }
            })
            .await?;
            // Cluster-wide images serve every namespace: listed with each.
            pages(cluster, &CLUSTER_VIRTUAL_IMAGE, None, selector, |items| {
                let mut page = std::mem::take(&mut held);
                page.extend(items.iter().map(summarize));
                on_page(page)
            })
            .await?;
            if held.is_empty() {
                Ok(())
            } else {
                on_page(held)
            }
        }
        .boxed()
    }

    fn watch<'a>(
        &'a self,
        cluster: &'a Cluster,
        namespace: Option<&'a str>,
        selector: Option<&'a str>,
        on_page: &'a mut OnPage<'a>,
    ) -> BoxFuture<'a, Result<()>> {
        async move {
            use futures::StreamExt;
            loop {
                let vi_version = pages(cluster, &VIRTUAL_IMAGE, namespace, selector, |items| {
                    on_page(items.iter().map(summarize).collect())
                })
                .await?;
                let cvi_version = pages(cluster, &CLUSTER_VIRTUAL_IMAGE, None, selector, |items| {
                    on_page(items.iter().map(summarize).collect())
                })
                .await?;
                let mut changes = super::feeds(
                    cluster,
                    &[
                        (VIRTUAL_IMAGE, namespace, vi_version),
                        (CLUSTER_VIRTUAL_IMAGE, None, cvi_version),
                    ],
                    selector,
                );
                while let Some(change) = changes.next().await {
                    match change? {
                        super::Change::Changed(_, obj) => on_page(vec![summarize(&obj)])?,
                        super::Change::Deleted(_, obj) => {
                            let mut gone = summarize(&obj);
                            gone.phase = "Deleted".into();
                            gone.progress.clear();
                            on_page(vec![gone])?;
                        }
                        super::Change::Expired => break,
                    }
                }
            }
        }
        .boxed()
    }

    fn get<'a>(
        &'a self,
        cluster: &'a Cluster,
        namespace: &'a str,
        name: &'a ImageName,
    ) -> BoxFuture<'a, Result<Image>> {
        async move { find(cluster, namespace, name).await.map(|o| summarize(&o)) }.boxed()
    }

    fn create<'a>(
        &'a self,
        cluster: &'a Cluster,
        request: &'a CreateRequest,
        options: &'a Options,
        on_event: &'a OnEvent<'a>,
    ) -> LocalBoxFuture<'a, Result<Outcome>> {
        async move {
            if request.schedule.is_some() {
                // VirtualImage and ClusterVirtualImage have no schedule (their CRDs).
                return Err(Error::Usage(
                    "--schedule: Deckhouse virtualization has no scheduled imports (a VirtualImage or ClusterVirtualImage is imported once); create the image again to refresh it".into(),
                ));
            }
            if matches!(request.source, Source::Upload { .. }) {
                return super::upload::deckhouse(cluster, request, options, on_event).await;
            }
            let (kind, obj) = manifest(request)?;
            let ns = if request.cluster {
                ""
            } else {
                request.namespace.as_str()
            };
            let made = create_obj(cluster, &kind, ns, &obj, options.dry_run).await?;
            let short = if request.cluster { "cvi" } else { "vi" };
            on_event(Event::Created(format!("{short}/{}", request.name)));
            let object_ref = kind.object_ref(&request.name);
            if options.dry_run != DryRun::None || !options.wait {
                return Ok(Outcome {
                    image: summarize(&made),
                    object_ref,
                    waited: false,
                });
            }
            let mut last = (String::new(), String::new());
            let image = super::bounded(
                options.timeout,
                watch::until(cluster, &[Watched::new(kind, ns, &request.name)], |objs| {
                    let Some(obj) = &objs[0] else {
                        return Some(Err(Error::Platform(format!(
                            "{} {:?} was deleted while importing",
                            kind.kind, request.name
                        ))));
                    };
                    let image = summarize(obj);
                    let now = (image.phase.clone(), image.progress.clone());
                    if now != last {
                        on_event(Event::Progress {
                            phase: now.0.clone(),
                            progress: now.1.clone(),
                        });
                        last = now;
                    }
                    match image.phase.as_str() {
                        "Ready" => Some(Ok(image)),
                        "Failed" | "ImageLost" | "PVCLost" => Some(Err(Error::Stuck(format!(
                            "image {short}/{} {}: {} (`kubectl vm image delete {short}/{}` removes it)",
                            request.name,
                            image.phase,
                            if image.message.is_empty() {
                                "the platform gave no reason"
                            } else {
                                &image.message
                            },
                            request.name
                        )))),
                        _ => None,
                    }
                }),
                &format!("image {short}/{} to be imported", request.name),
            )
            .await?;
            Ok(Outcome {
                image,
                object_ref,
                waited: true,
            })
        }
        .boxed_local()
    }

    fn delete<'a>(
        &'a self,
        cluster: &'a Cluster,
        namespace: &'a str,
        name: &'a ImageName,
        options: &'a Options,
    ) -> BoxFuture<'a, Result<Deleted>> {
        async move {
            let obj = find(cluster, namespace, name).await?;
            let cluster_wide = obj["kind"] == "ClusterVirtualImage";
            let kind = if cluster_wide {
                CLUSTER_VIRTUAL_IMAGE
            } else {
                VIRTUAL_IMAGE
            };
            let ns = text(&obj, "/metadata/namespace").to_owned();
            let shown = if cluster_wide {
                format!("cvi/{}", name.name)
            } else {
                format!("vi/{ns}/{}", name.name)
            };
            if !is_ours(&obj) {
                return Err(Error::NotOurs(format!(
                    "image {shown} was not made by kubectl vm; it is left as it is (nothing was deleted)"
                )));
            }
            let (creating, referencing) = users(cluster, &obj).await?;
            if !creating.is_empty() {
                return Err(Error::Platform(format!(
                    "image {shown} is being used to create {}: it is not deleted (try again once they are ready)",
                    creating.join(", ")
                )));
            }
            delete_obj(cluster, &kind, &obj, options.dry_run).await?;
            Ok(Deleted {
                object_refs: vec![kind.object_ref(&name.name)],
                referenced_by: referencing,
            })
        }
        .boxed()
    }
}

/// The image a reference names: `vi/NAME`, `cvi/NAME`, or a bare NAME (the namespace's
/// VirtualImage, else the ClusterVirtualImage).
async fn find(cluster: &Cluster, namespace: &str, name: &ImageName) -> Result<Value> {
    let ns = namespace_of(name, namespace);
    let tries: &[ImageKind] = match name.kind {
        Some(ImageKind::Vi) => &[ImageKind::Vi],
        Some(ImageKind::Cvi) => &[ImageKind::Cvi],
        None => &[ImageKind::Vi, ImageKind::Cvi],
        Some(k) => {
            return Err(Error::Usage(format!(
                "image {}/{}: on Deckhouse images are vi/NAME or cvi/NAME",
                k.short(),
                name.name
            )));
        }
    };
    for k in tries {
        let kind = kind_of(*k);
        if let Some(obj) = get_opt(cluster, &kind, ns, &name.name).await? {
            return Ok(obj);
        }
    }
    Err(Error::NotFound {
        kind: match name.kind {
            Some(ImageKind::Cvi) => "clustervirtualimage".into(),
            Some(_) => "virtualimage".into(),
            None => "virtualimage or clustervirtualimage".into(),
        },
        name: name.name.clone(),
        namespace: (name.kind != Some(ImageKind::Cvi)).then(|| ns.to_owned()),
    })
}

/// The VirtualImage or ClusterVirtualImage to make.
fn manifest(request: &CreateRequest) -> Result<(Kind, Value)> {
    let ns = &request.namespace;
    let data_source = match &request.source {
        Source::Url { url, checksum } => {
            let mut http = json!({"url": url});
            if let Some(c) = checksum {
                http["checksum"] = json!({c.algo.as_str(): c.hex});
            }
            json!({"type": "HTTP", "http": http})
        }
        Source::Registry(image) => {
            json!({"type": "ContainerImage", "containerImage": {"image": image}})
        }
        // The upload path makes the object with the file's checksum
        // (crate::upload::deckhouse::object).
        Source::Upload { .. } => json!({"type": "Upload"}),
        Source::From(from) => {
            let kind = match from.kind {
                Some(ImageKind::Vi) => "VirtualImage",
                Some(ImageKind::Cvi) => "ClusterVirtualImage",
                Some(ImageKind::Vd) => "VirtualDisk",
                // The snapshot's volume snapshot is restored into the image
                // (virtualization-artifact vi/internal/source/object_ref_vdsnapshot_*.go).
                Some(ImageKind::Vds) => "VirtualDiskSnapshot",
                _ => {
                    return Err(Error::Usage(format!(
                        "--from {}: on Deckhouse an image is made from vi/NAME, cvi/NAME, vd/NAME or vds/NAME",
                        from.name
                    )));
                }
            };
            let mut r = json!({"kind": kind, "name": from.name});
            if request.cluster {
                if kind != "ClusterVirtualImage" {
                    r["namespace"] = json!(namespace_of(from, ns));
                }
            } else if from.namespace.as_deref().is_some_and(|n| n != ns) {
                return Err(Error::Usage(format!(
                    "--from {}/{}/{}: a VirtualImage is made from objects in its own namespace ({ns}); use --cluster-wide for another namespace's",
                    from.kind.map(ImageKind::short).unwrap_or(""),
                    from.namespace.as_deref().unwrap_or(""),
                    from.name
                )));
            }
            json!({"type": "ObjectRef", "objectRef": r})
        }
    };
    if request.size.is_some() {
        return Err(Error::Usage(
            "--size is KubeVirt's; a Deckhouse image takes the size of what it imports".into(),
        ));
    }
    check_storage(request)?;
    if request.cluster {
        let obj = json!({
            "apiVersion": CLUSTER_VIRTUAL_IMAGE.api_version(), "kind": CLUSTER_VIRTUAL_IMAGE.kind,
            "metadata": {"name": request.name, "labels": labels()},
            "spec": {"dataSource": data_source},
        });
        return Ok((CLUSTER_VIRTUAL_IMAGE, obj));
    }
    let mut spec = json!({"dataSource": data_source});
    match request.storage {
        Some(Storage::Pvc) => spec["storage"] = json!("PersistentVolumeClaim"),
        Some(Storage::Dvcr) => spec["storage"] = json!("ContainerRegistry"),
        None if request.storage_class.is_some() => spec["storage"] = json!("PersistentVolumeClaim"),
        None => {}
    }
    if let Some(class) = &request.storage_class {
        spec["persistentVolumeClaim"] = json!({"storageClassName": class});
    }
    let obj = json!({
        "apiVersion": VIRTUAL_IMAGE.api_version(), "kind": VIRTUAL_IMAGE.kind,
        "metadata": {"name": request.name, "namespace": ns, "labels": labels()},
        "spec": spec,
    });
    Ok((VIRTUAL_IMAGE, obj))
}

/// Refuses `--storage`/`--storage-class` where they mean nothing: a ClusterVirtualImage is
/// always kept in DVCR, and DVCR has no storage class.
pub(crate) fn check_storage(request: &CreateRequest) -> Result<()> {
    if request.cluster && (request.storage.is_some() || request.storage_class.is_some()) {
        return Err(Error::Usage(
            "--storage and --storage-class are for a VirtualImage; a ClusterVirtualImage is always kept in DVCR".into(),
        ));
    }
    if request.storage_class.is_some() && request.storage == Some(Storage::Dvcr) {
        return Err(Error::Usage(
            "--storage-class is for --storage pvc; DVCR has no storage class".into(),
        ));
    }
    Ok(())
}

/// Who uses an image: disks still being filled from it or VMs starting from it (being
/// created), and VMs that name it.
async fn users(cluster: &Cluster, image: &Value) -> Result<(Vec<String>, Vec<String>)> {
    let kind = text(image, "/kind").to_owned();
    let name = text(image, "/metadata/name").to_owned();
    let ns = text(image, "/metadata/namespace").to_owned();
    // A cluster-wide image is used from every namespace.
    let scope = (kind == "VirtualImage").then_some(ns.as_str());
    let mut creating = vec![];
    pages(cluster, &VIRTUAL_DISK, scope, None, |items| {
        for vd in &items {
            let r = vd.pointer("/spec/dataSource/objectRef");
            let from_it =
                r.is_some_and(|r| r["kind"] == kind.as_str() && r["name"] == name.as_str());
            if from_it && text(vd, "/status/phase") != "Ready" {
                creating.push(format!(
                    "virtualdisk {}/{}",
                    text(vd, "/metadata/namespace"),
                    text(vd, "/metadata/name")
                ));
            }
        }
        Ok(())
    })
    .await?;
    let mut referencing = vec![];
    pages(cluster, &DECKHOUSE_VM, scope, None, |items| {
        for vm in &items {
            let names_it = vm
                .pointer("/spec/blockDeviceRefs")
                .and_then(Value::as_array)
                .is_some_and(|refs| {
                    refs.iter()
                        .any(|r| r["kind"] == kind.as_str() && r["name"] == name.as_str())
                });
            if !names_it {
                continue;
            }
            let shown = format!(
                "{}.{}",
                text(vm, "/metadata/name"),
                text(vm, "/metadata/namespace")
            );
            if matches!(text(vm, "/status/phase"), "" | "Pending" | "Starting") {
                creating.push(format!("VM {shown}"));
            } else {
                referencing.push(shown);
            }
        }
        Ok(())
    })
    .await?;
    Ok((creating, referencing))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(source: Source) -> CreateRequest {
        CreateRequest {
            name: "debian".into(),
            namespace: "dev".into(),
            cluster: false,
            source,
            storage: None,
            size: None,
            storage_class: None,
            schedule: None,
            imports_to_keep: None,
        }
    }

    #[test]
    fn images_are_made_as_the_crds_take_them() {
        let md5 = "d41d8cd98f00b204e9800998ecf8427e";
        let (kind, vi) = manifest(&request(Source::Url {
            url: "https://example.org/d.qcow2".into(),
            checksum: Some(crate::image::parse_checksum(&format!("md5:{md5}")).unwrap()),
        }))
        .unwrap();
        assert_eq!(kind.kind, "VirtualImage");
        assert_eq!(
            vi["spec"]["dataSource"],
            json!({"type": "HTTP", "http": {"url": "https://example.org/d.qcow2", "checksum": {"md5": md5}}})
        );
        assert!(vi["spec"].get("storage").is_none());
        let mut r = request(Source::Registry("registry.example/d:12".into()));
        r.storage = Some(Storage::Pvc);
        r.storage_class = Some("fast".into());
        let (_, vi) = manifest(&r).unwrap();
        assert_eq!(vi["spec"]["storage"], "PersistentVolumeClaim");
        assert_eq!(
            vi["spec"]["persistentVolumeClaim"]["storageClassName"],
            "fast"
        );
        assert_eq!(
            vi["spec"]["dataSource"]["containerImage"]["image"],
            "registry.example/d:12"
        );
        let mut r = request(Source::From(ImageName::parse("vd/dev/root").unwrap()));
        r.cluster = true;
        let (kind, cvi) = manifest(&r).unwrap();
        assert_eq!(kind.kind, "ClusterVirtualImage");
        assert_eq!(
            cvi["spec"]["dataSource"]["objectRef"],
            json!({"kind": "VirtualDisk", "name": "root", "namespace": "dev"})
        );
        assert!(cvi["metadata"].get("namespace").is_none());
        let r = request(Source::From(ImageName::parse("vd/other/root").unwrap()));
        assert!(matches!(manifest(&r), Err(Error::Usage(_))));
        let mut r = request(Source::Registry("x".into()));
        r.size = Some("1Gi".into());
        assert!(matches!(manifest(&r), Err(Error::Usage(_))));
    }

    #[test]
    fn rows_carry_phase_progress_format_size_and_the_failure() {
        let vi = json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualImage",
            "metadata": {"name": "debian", "namespace": "dev"},
            "spec": {"dataSource": {"type": "HTTP", "http": {"url": "https://x/d.qcow2"}}},
            "status": {"phase": "Provisioning", "progress": "45%"}});
        let row = summarize(&vi);
        assert_eq!(row.phase_cell(), "Provisioning 45%");
        assert_eq!(row.kind, ImageKind::Vi);
        let mut ready = vi.clone();
        ready["status"] = json!({"phase": "Ready", "progress": "100%", "format": "qcow2",
            "size": {"stored": "256Mi", "unpacked": "2Gi"},
            "target": {"registryURL": "dvcr.d8-virtualization.svc/vi/dev/debian:latest"}});
        let row = summarize(&ready);
        assert_eq!(
            (
                row.phase_cell().as_str(),
                row.format.as_str(),
                row.size.as_str()
            ),
            ("Ready", "qcow2", "2Gi")
        );
        let mut failed = vi.clone();
        failed["status"] = json!({"phase": "Failed", "conditions": [{"type": "Ready", "status": "False",
            "reason": "ProvisioningFailed", "message": "no such host"}]});
        assert_eq!(summarize(&failed).message, "no such host");
    }
}
