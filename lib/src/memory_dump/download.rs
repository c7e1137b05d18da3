//! `memory-dump download` (and `get --output`): the dump file out of its claim.
//!
//! virtctl (`pkg/virtctl/memorydump/memorydump.go` `downloadMemoryDump`) waits for
//! `status.memoryDumpRequest` to be Completed, exports the claim with a VirtualMachineExport of
//! the PersistentVolumeClaim, and downloads what `pkg/virtctl/vmexport/vmexport.go`
//! `GetUrlFromVirtualMachineExport` picks: a memory dump claim is a filesystem claim, which
//! KubeVirt exports as `dir` and `tar.gz` (`ArchiveGz`) links, never `raw`/`gzip`
//! (`pkg/storage/export/export/export.go` `addVolumeEnvironmentVariables`), so virtctl saves the
//! claim's tar.gz (`--format raw`: gunzipped, still a tar) without unpacking it.
//!
//! Here the file saved is the dump itself: the claim's file named by
//! `status.memoryDumpRequest.fileName` (one normal path component, else refused), fetched
//! through the `dir` link (Go's `http.FileServer`: Range, Last-Modified) by the export path
//! ([`crate::export`]): resumed after errors, sha256 while streaming, `FILE.partial` until
//! complete, the export deleted after success and kept (with the resume command) after a
//! failure.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use super::{Event, check, get_json, wait_for};
use crate::api::KUBEVIRT_VM;
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::export::{self, Algo, ExportOptions, Format, Output, Source};
use crate::flavor::Platform;
use crate::lifecycle::VmRef;

/// `memory-dump download`.
#[derive(Debug, Clone)]
pub struct DownloadRequest {
    /// The VM.
    pub vm: VmRef,
    /// The file to write.
    pub output: PathBuf,
    /// Continue `FILE.partial` from an earlier run.
    pub resume: bool,
    /// Use this existing export (one a failed run kept).
    pub reuse: Option<String>,
    /// Keep the export after success.
    pub keep: bool,
    /// Do not verify the export server's certificate.
    pub insecure: bool,
    /// How long to wait for the dump to complete and the export to be ready.
    pub timeout: Duration,
    /// Retries after errors worth retrying.
    pub max_retries: u32,
    /// The first retry's delay.
    pub retry_delay: Duration,
}

/// Progress of a download: the dump's state, then the export's events.
#[derive(Debug, Clone, PartialEq)]
pub enum DownloadEvent {
    /// The dump request's progress (while waiting for it to complete).
    Dump(Event),
    /// The dump to fetch: its claim and file.
    Found {
        /// The claim.
        claim: String,
        /// The file in it.
        file: String,
    },
    /// The export's progress.
    Export(export::Event),
}

/// The claim and file of the VM's completed dump, waiting while it is in progress.
async fn completed_dump(
    cluster: &Cluster,
    vm: &VmRef,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<(String, String)> {
    let current = get_json(cluster, KUBEVIRT_VM, vm).await?;
    if current.pointer("/status/memoryDumpRequest").is_none() {
        return Err(Error::Platform(format!(
            "{} has no memory dump: take one with `kubectl vm memory-dump get {} --claim-name NAME --create-claim`",
            vm.name, vm.name
        )));
    }
    let req = wait_for(cluster, vm, on_event, |req| {
        let Some(req) = req else {
            return Some(Err(Error::Platform(format!(
                "the memory dump of {} was removed meanwhile",
                vm.name
            ))));
        };
        match req["phase"].as_str() {
            Some("Completed") => Some(Ok(Some(req.to_string()))),
            Some("Failed") => Some(Err(Error::Platform(format!(
                "the memory dump of {} failed: {}",
                vm.name,
                req["message"].as_str().unwrap_or("no reason given")
            )))),
            Some("Dissociating") => Some(Err(Error::Platform(format!(
                "the memory dump of {} is being removed",
                vm.name
            )))),
            _ => None,
        }
    })
    .await?
    .unwrap_or_default();
    let req: Value = serde_json::from_str(&req).unwrap_or_default();
    let claim = req["claimName"].as_str().unwrap_or("").to_owned();
    let file = req["fileName"].as_str().unwrap_or("").to_owned();
    crate::target::validate_name(&claim).map_err(|why| {
        Error::Platform(format!(
            "the memory dump names the claim {claim:?}, which is not a valid name: {why}"
        ))
    })?;
    if !crate::validate::is_single_file_name(&file) {
        return Err(Error::Platform(format!(
            "refusing the memory dump file name {file:?} from the server: not a single file name"
        )));
    }
    Ok((claim, file))
}

/// Downloads the VM's completed memory dump to `request.output`.
pub async fn download(
    cluster: &Cluster,
    platform: &Platform,
    request: &DownloadRequest,
    on_event: &mut (dyn FnMut(DownloadEvent) + Send),
) -> Result<()> {
    check(platform.flavor)?;
    let vm = &request.vm;
    let sink = std::sync::Mutex::new(&mut *on_event);
    let found = tokio::time::timeout(
        request.timeout,
        completed_dump(cluster, vm, &|e| {
            (sink.lock().unwrap_or_else(|p| p.into_inner()))(DownloadEvent::Dump(e));
        }),
    )
    .await;
    drop(sink);
    let (claim, file) = found.map_err(|_| {
        Error::Timeout(format!(
            "the memory dump of {vm} to complete (after {}s; raise --timeout)",
            request.timeout.as_secs()
        ))
    })??;
    on_event(DownloadEvent::Found {
        claim: claim.clone(),
        file: file.clone(),
    });
    let options = ExportOptions {
        source: Source::Pvc(claim),
        namespace: vm.namespace.clone(),
        output: Output::Path(request.output.clone()),
        volume: None,
        format: Format::Raw,
        decompress: false,
        algo: Algo::Sha256,
        expected: None,
        keep: request.keep,
        reuse: request.reuse.clone(),
        resume: request.resume,
        ttl: Duration::from_secs(2 * 3600),
        insecure: request.insecure,
        wait_timeout: request.timeout,
        max_retries: request.max_retries,
        retry_delay: request.retry_delay,
        dir_file: Some(file),
        resume_command: Some(format!("kubectl vm memory-dump download {}", vm.name)),
    };
    export::run(cluster, platform, &options, &mut |e| {
        on_event(DownloadEvent::Export(e))
    })
    .await
}
