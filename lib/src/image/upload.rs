//! `image create NAME --file PATH`: an image filled from a local file through the upload path
//! ([`crate::upload`]: its plan, its transfer, its events), made the catalog's way.
//!
//! - KubeVirt: the DataSource naming the PVC is made first (CDI's datasource controller keeps
//!   it `Ready` `False`, reason `NotFound`, until the PVC exists), then the upload makes the
//!   DataVolume with `source.upload`, sends the file and waits until it is `Succeeded`; then
//!   the wait for the DataSource's `Ready` is the one of every other source. A failed or
//!   interrupted upload deletes its DataVolume and this DataSource (uid preconditions).
//! - Deckhouse: the upload makes the VirtualImage (kept in DVCR, or on a PVC with `--storage
//!   pvc` or a `--storage-class`) or ClusterVirtualImage (DVCR only) with `dataSource.type: Upload` and the file's sha256 as `upload.checksum.sha256`, sends the
//!   file and waits for `Ready`; the image is then read back as the catalog shows it.

use std::time::Duration;

use futures::FutureExt;
use futures::future::LocalBoxFuture;
use serde_json::Value;

use super::{CreateRequest, DryRun, Event, OnEvent, Options, Outcome, Source, Storage};
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::upload::{self, Plan, Target, UploadOptions};

/// Attempts after network errors (each from the beginning), as `upload`'s default.
const RETRIES: u32 = 5;

/// The upload plan of a request whose source is a file, for `target`. Usage errors only
/// (the file, its format, its size against `--size`), before any request.
pub(crate) fn plan(request: &CreateRequest, target: Target, options: &Options) -> Result<Plan> {
    let Source::Upload { file, raw } = &request.source else {
        return Err(Error::Internal("not an upload".into()));
    };
    let size = request
        .size
        .as_deref()
        .map(|s| {
            crate::quantity::Quantity::parse(s)
                .map(|q| q.bytes())
                .map_err(|e| Error::Usage(format!("--size {s:?}: {e}")))
        })
        .transpose()?;
    upload::plan(UploadOptions {
        file: file.clone(),
        target,
        namespace: request.namespace.clone(),
        size,
        force_raw: *raw,
        storage_class: request.storage_class.clone(),
        // A VirtualImage on a PVC: `--storage pvc`, or a storage class without `--storage`
        // (as for images imported from a URL).
        image_on_pvc: request.storage == Some(Storage::Pvc)
            || (request.storage.is_none() && request.storage_class.is_some()),
        access_mode: None,
        volume_mode: None,
        no_create: false,
        keep: false,
        uploadproxy_url: None,
        insecure: false,
        wait_timeout: options.timeout,
        max_retries: RETRIES,
        retry_delay: Duration::from_secs(1),
    })
}

/// KubeVirt: the DataSource, then the upload into its DataVolume, then the wait for Ready.
pub(crate) fn kubevirt<'a>(
    cluster: &'a Cluster,
    request: &'a CreateRequest,
    ds: Value,
    options: &'a Options,
    on_event: &'a OnEvent<'a>,
) -> LocalBoxFuture<'a, Result<Outcome>> {
    async move {
        use super::kubevirt::{DATA_SOURCE, summarize_made, wait_ready};
        use super::{create_obj, delete_obj};
        use crate::api::DATA_VOLUME;
        let plan = plan(request, Target::Dv(request.name.clone()), options)?;
        let ns = &request.namespace;
        let object_ref = DATA_SOURCE.object_ref(&request.name);
        if options.dry_run != DryRun::None {
            // Nothing is sent: the objects as the server would take them.
            let dv = upload::kubevirt::data_volume(&plan);
            let made_dv = create_obj(cluster, &DATA_VOLUME, ns, &dv, options.dry_run).await?;
            let made_ds = create_obj(cluster, &DATA_SOURCE, ns, &ds, options.dry_run).await?;
            return Ok(Outcome {
                image: summarize_made(&made_ds, &made_dv),
                object_ref,
                waited: false,
            });
        }
        let made_ds = create_obj(cluster, &DATA_SOURCE, ns, &ds, DryRun::None).await?;
        on_event(Event::Created(format!("datasource/{}", request.name)));
        on_event(Event::Upload(upload::Event::Inspected {
            format: plan.info.format,
            virtual_size: plan.info.virtual_size,
            size: plan.size,
        }));
        let sent = upload::kubevirt::run(cluster, &plan, options.interrupts.clone(), &mut |e| {
            on_event(Event::Upload(e))
        })
        .await;
        if let Err(e) = sent {
            // All or nothing: the upload removed its DataVolume; the DataSource goes too.
            delete_obj(cluster, &DATA_SOURCE, &made_ds, DryRun::None).await?;
            return Err(e);
        }
        if !options.wait {
            let dv = super::get_opt(cluster, &DATA_VOLUME, ns, &request.name).await?;
            return Ok(Outcome {
                image: summarize_made(&made_ds, &dv.unwrap_or_default()),
                object_ref,
                waited: false,
            });
        }
        let image = super::bounded(
            options.timeout,
            wait_ready(cluster, ns, &request.name, on_event),
            &format!("image {} to be ready", request.name),
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

/// Deckhouse: the upload makes the image, sends the file and waits until it is Ready.
pub(crate) fn deckhouse<'a>(
    cluster: &'a Cluster,
    request: &'a CreateRequest,
    options: &'a Options,
    on_event: &'a OnEvent<'a>,
) -> LocalBoxFuture<'a, Result<Outcome>> {
    async move {
        use super::deckhouse::{CLUSTER_VIRTUAL_IMAGE, VIRTUAL_IMAGE, summarize};
        super::deckhouse::check_storage(request)?;
        if request.size.is_some() {
            return Err(Error::Usage(
                "--size is KubeVirt's; a Deckhouse image takes the size of what it imports".into(),
            ));
        }
        let (target, kind, ns) = if request.cluster {
            (Target::Cvi(request.name.clone()), CLUSTER_VIRTUAL_IMAGE, "")
        } else {
            (
                Target::Vi(request.name.clone()),
                VIRTUAL_IMAGE,
                request.namespace.as_str(),
            )
        };
        let plan = plan(request, target, options)?;
        let object_ref = kind.object_ref(&request.name);
        if options.dry_run != DryRun::None {
            // The object carries the file's sha256: computed locally, nothing is sent.
            let sha256 = upload::deckhouse::sha256_file(&plan.options.file, &mut |e| {
                on_event(Event::Upload(e))
            })
            .await?;
            let obj = upload::deckhouse::object(&plan, &sha256);
            let made = super::create_obj(cluster, &kind, ns, &obj, options.dry_run).await?;
            return Ok(Outcome {
                image: summarize(&made),
                object_ref,
                waited: false,
            });
        }
        on_event(Event::Upload(upload::Event::Inspected {
            format: plan.info.format,
            virtual_size: plan.info.virtual_size,
            size: plan.size,
        }));
        upload::deckhouse::run(cluster, &plan, options.interrupts.clone(), &mut |e| {
            on_event(Event::Upload(e))
        })
        .await?;
        let made = super::get_opt(cluster, &kind, ns, &request.name)
            .await?
            .ok_or_else(|| {
                Error::Platform(format!(
                    "{} {:?} was deleted after its upload",
                    kind.kind, request.name
                ))
            })?;
        Ok(Outcome {
            image: summarize(&made),
            object_ref,
            waited: true,
        })
    }
    .boxed_local()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(file: &std::path::Path) -> CreateRequest {
        CreateRequest {
            name: "golden".into(),
            namespace: "dev".into(),
            cluster: false,
            source: Source::Upload {
                file: file.to_owned(),
                raw: false,
            },
            storage: None,
            size: None,
            storage_class: None,
            schedule: None,
            imports_to_keep: None,
        }
    }

    fn options() -> Options {
        Options {
            dry_run: DryRun::None,
            wait: true,
            timeout: Duration::from_secs(60),
            interrupts: None,
        }
    }

    #[test]
    fn a_file_of_no_disk_format_or_missing_is_refused_locally() {
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("notes.txt");
        std::fs::write(&text, "not a disk image\n".repeat(100)).unwrap();
        for file in [text, dir.path().join("missing.qcow2")] {
            assert!(
                matches!(super::super::check(&request(&file)), Err(Error::Usage(_))),
                "{}",
                file.display()
            );
        }
    }

    #[test]
    fn a_kubevirt_plan_sizes_the_volume_from_the_image_or_from_size() {
        // A qcow2 header of 3 GiB virtual size (qcow2 spec: magic, version, size at 24).
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("disk.qcow2");
        let mut head = vec![0u8; 512];
        head[..4].copy_from_slice(b"QFI\xfb");
        head[7] = 3;
        head[24..32].copy_from_slice(&(3u64 << 30).to_be_bytes());
        std::fs::write(&file, &head).unwrap();
        let mut r = request(&file);
        let plan_of = |r: &CreateRequest| plan(r, Target::Dv("golden".into()), &options());
        assert_eq!(plan_of(&r).unwrap().size, Some(3 << 30));
        r.size = Some("4Gi".into());
        assert_eq!(plan_of(&r).unwrap().size, Some(4 << 30));
        // Smaller than the virtual size: the disk would not fit.
        r.size = Some("1Gi".into());
        assert!(matches!(plan_of(&r), Err(Error::Usage(_))));
    }
}
