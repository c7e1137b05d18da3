//! Container logs and the domain XML (an exec into the launcher pod): both streamed and
//! masked line by line into temporary files, so memory does not grow with their size.

use std::io::Write;

use futures::AsyncBufReadExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, AttachParams, LogParams};
use serde_json::Value;
use tokio::io::AsyncReadExt;

use super::archive::Content;
use super::{Collector, POD, redact};

impl Collector {
    /// One container log (current or previous) of `pod` in namespace `ns`, streamed and
    /// masked into a temporary file.
    pub async fn log(&self, ns: &str, pod: &str, container: &str, previous: bool) {
        let Ok(_permit) = self.limit.acquire().await else {
            return;
        };
        let api: Api<Pod> = Api::namespaced(self.cluster.client.clone(), ns);
        let params = LogParams {
            container: Some(container.to_owned()),
            previous,
            tail_lines: self.options.tail_lines,
            since_seconds: self.options.since.map(|d| d.as_secs().max(1) as i64),
            ..LogParams::default()
        };
        let which = if previous { "previous log" } else { "log" };
        let fail = |e: String| format!("{which} of pod/{pod} container {container}: {e}");
        let stream = match api.log_stream(pod, &params).await {
            Ok(s) => s,
            Err(e) => {
                let action = POD.action("get", Some(ns)).named(pod);
                self.error(fail(self.cluster.error(e, &action).to_string()));
                return;
            }
        };
        let spooled = async {
            let mut file = tempfile::tempfile()?;
            let mut stream = std::pin::pin!(stream);
            let mut state = redact::LineState::default();
            let mut out = std::io::BufWriter::new(&mut file);
            copy_lines(&mut stream, &mut out, |line| {
                self.redactor.line(line, &mut state).into_owned()
            })
            .await?;
            out.flush()?;
            drop(out);
            std::io::Result::Ok(file)
        }
        .await;
        drop(_permit);
        match spooled {
            Ok(file) => {
                let suffix = if previous { ".previous" } else { "" };
                self.put(
                    format!("log/{pod}/{container}{suffix}.log"),
                    format!("{which} of container {container} in pod {pod}"),
                    Content::File(file),
                )
                .await;
            }
            Err(e) => self.error(fail(format!("reading the log: {e}"))),
        }
    }

    /// Logs of every container of a pod: current, and previous where a container restarted.
    pub async fn pod_logs(&self, pod: &Value) {
        let name = pod["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let ns = pod["metadata"]["namespace"].as_str().unwrap_or(&self.ns);
        let mut jobs = Vec::new();
        for (spec_field, status_field) in [
            ("initContainers", "initContainerStatuses"),
            ("containers", "containerStatuses"),
        ] {
            for c in pod["spec"][spec_field].as_array().into_iter().flatten() {
                let Some(container) = c["name"].as_str() else {
                    continue;
                };
                jobs.push((container.to_owned(), false));
                let restarted = pod["status"][status_field]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|s| s["name"] == container && s["restartCount"].as_u64().unwrap_or(0) > 0);
                if restarted {
                    jobs.push((container.to_owned(), true));
                }
            }
        }
        futures::future::join_all(
            jobs.iter()
                .map(|(container, previous)| self.log(ns, &name, container, *previous)),
        )
        .await;
    }

    /// Run a command in container `compute` of a launcher pod; its output into `domain/<pod>.xml`.
    pub async fn domain_xml(&self, pod: &str, command: Vec<String>) {
        let Ok(_permit) = self.limit.acquire().await else {
            return;
        };
        let api: Api<Pod> = Api::namespaced(self.cluster.client.clone(), &self.ns);
        let params = AttachParams::default()
            .container("compute")
            .stdin(false)
            .stdout(true)
            .stderr(true);
        let shown = command.join(" ");
        let fail = |e: String| format!("domain XML ({shown}) in pod/{pod}: {e}");
        let run = async {
            let mut process = api.exec(pod, command.clone(), &params).await?;
            let mut stdout = String::new();
            let mut stderr = String::new();
            let status = process.take_status();
            if let Some(out) = process.stdout() {
                let _ = out.take(MAX_EXEC_OUTPUT).read_to_string(&mut stdout).await;
            }
            if let Some(err) = process.stderr() {
                let _ = err.take(MAX_EXEC_OUTPUT).read_to_string(&mut stderr).await;
            }
            let status = match status {
                Some(s) => s.await,
                None => None,
            };
            let _ = process.join().await;
            Ok::<_, kube::Error>((stdout, stderr, status))
        };
        // A launcher that never answers must not hold the bundle (and a concurrency slot).
        let outcome = tokio::time::timeout(self.options.exec_timeout, run).await;
        drop(_permit);
        let (stdout, stderr, status) = match outcome {
            Ok(Ok(done)) => done,
            Ok(Err(e)) => {
                let action = crate::error::Action::new("create", "pods/exec", "pod")
                    .named(pod)
                    .in_namespace(Some(&self.ns));
                self.error(fail(self.cluster.error(e, &action).to_string()));
                return;
            }
            Err(_) => {
                self.error(fail(format!(
                    "no answer within {:?}; the rest of the bundle was collected",
                    self.options.exec_timeout
                )));
                return;
            }
        };
        if let Some(status) = status
            && status.status.as_deref() == Some("Failure")
        {
            let message = status.message.unwrap_or_default();
            self.error(fail(format!("{message}: {}", stderr.trim())));
            return;
        }
        let text = self.redactor.text(&stdout);
        self.put(
            format!("domain/{pod}.xml"),
            format!("libvirt domain XML from pod {pod} ({shown})"),
            Content::Bytes(text.into_bytes()),
        )
        .await;
    }
}

/// How long the domain-XML command may take by default.
pub const EXEC_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// The most of its output kept (a domain XML is a few KiB).
const MAX_EXEC_OUTPUT: u64 = 16 * 1024 * 1024;
/// The longest log line held at once; longer ones are split there.
const MAX_LINE: usize = 64 * 1024;

/// Copy `reader` to `out` line by line through `each` (redaction), holding at most
/// [`MAX_LINE`] bytes: a longer line is written in pieces of that size, each ending a line.
/// Bytes, not `lines()`: a log with invalid UTF-8 must not be lost.
async fn copy_lines<R: futures::AsyncBufRead + Unpin>(
    reader: &mut R,
    out: &mut impl Write,
    mut each: impl FnMut(&str) -> String,
) -> std::io::Result<()> {
    use futures::AsyncReadExt as _;
    let mut buf = Vec::with_capacity(8192);
    loop {
        buf.clear();
        if (&mut *reader)
            .take(MAX_LINE as u64)
            .read_until(b'\n', &mut buf)
            .await?
            == 0
        {
            return Ok(());
        }
        let text = String::from_utf8_lossy(&buf);
        let line = text.strip_suffix('\n').unwrap_or(&text);
        out.write_all(each(line).as_bytes())?;
        out.write_all(b"\n")?;
    }
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn a_log_line_is_never_held_whole() {
        // 200 KiB without a newline, then a short line.
        let mut log = vec![b'x'; 200 * 1024];
        log.extend_from_slice(b"\npassword=hunter2\n");
        let mut reader = futures::io::Cursor::new(log);
        let mut out = Vec::new();
        let mut longest = 0;
        super::copy_lines(&mut reader, &mut out, |line| {
            longest = longest.max(line.len());
            line.replace("hunter2", "***")
        })
        .await
        .unwrap();
        assert_eq!(longest, super::MAX_LINE);
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.matches('x').count(), 200 * 1024, "nothing lost");
        assert!(text.ends_with("\npassword=***\n"), "the next line is whole");
    }
}
