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
//! failure. `--format gzip` still fetches raw (resumable; the server has no gzip of one file)
//! and compresses the complete file before it takes its final name ([`export::compress`]).

use std::path::{Path, PathBuf};
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
    /// Raw (the ELF core as served) or gzip (compressed once downloaded).
    pub format: Format,
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

impl DownloadRequest {
    /// A request with the usual transfer settings: no resume, no reuse, the export deleted
    /// after success, 8 retries from 1 s, 10 minutes to wait (`timeout` zero: no limit).
    pub fn new(vm: VmRef, output: PathBuf, format: Format) -> DownloadRequest {
        DownloadRequest {
            vm,
            output,
            format,
            resume: false,
            reuse: None,
            keep: false,
            insecure: false,
            timeout: Duration::from_secs(600),
            max_retries: 8,
            retry_delay: Duration::from_secs(1),
        }
    }
}

/// Checks where a dump goes and how, before any request: a file (not stdout, not a
/// directory), `--resume` only with the export a failed run kept (`--reuse NAME`).
pub fn check_transfer(output: &Path, resume: bool, reuse: Option<&str>) -> Result<()> {
    if output.as_os_str().is_empty() || output.as_os_str() == "-" {
        return Err(Error::Usage(
            "memory-dump download needs -o FILE (a memory dump is not written to stdout)".into(),
        ));
    }
    if output.is_dir() || output.as_os_str().to_string_lossy().ends_with('/') {
        return Err(Error::Usage(format!(
            "-o {} is a directory: name the file to write",
            output.display()
        )));
    }
    if let Some(reuse) = reuse {
        crate::target::validate_name(reuse)
            .map_err(|why| Error::Usage(format!("invalid --reuse {reuse:?}: {why}")))?;
    }
    if resume && reuse.is_none() {
        return Err(Error::Usage(
            "--resume continues a download whose export was kept: pass it with --reuse NAME".into(),
        ));
    }
    Ok(())
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
    check_transfer(&request.output, request.resume, request.reuse.as_deref())?;
    let vm = &request.vm;
    // Zero: no limit.
    let timeout = if request.timeout.is_zero() {
        Duration::from_secs(365 * 24 * 3600)
    } else {
        request.timeout
    };
    let sink = std::sync::Mutex::new(&mut *on_event);
    let found = tokio::time::timeout(
        timeout,
        completed_dump(cluster, vm, &|e| {
            (sink.lock().unwrap_or_else(|p| p.into_inner()))(DownloadEvent::Dump(e));
        }),
    )
    .await;
    let (claim, file) = found.map_err(|_| {
        Error::Timeout(format!(
            "the memory dump of {vm} to complete (after {}s; raise --download-timeout)",
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
        wait_timeout: timeout,
        max_retries: request.max_retries,
        retry_delay: request.retry_delay,
        dir_file: Some(file),
        resume_command: Some(format!(
            "kubectl vm memory-dump download {}{}",
            vm.name,
            if request.format == Format::Gzip {
                " --format gzip"
            } else {
                ""
            }
        )),
        compress: request.format == Format::Gzip,
    };
    export::run(cluster, platform, &options, &mut |e| {
        on_event(DownloadEvent::Export(e))
    })
    .await
}
