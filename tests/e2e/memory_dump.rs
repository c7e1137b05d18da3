//! `memory-dump get|download|remove` on KubeVirt (the claim virtctl would make, the
//! subresource requests, progress to Completed, the dump downloaded through the export of its
//! claim and checked with `file`, `readelf`, `sha256sum` and curl as independent readers) and
//! its refusal on Deckhouse, which has no memory dump.

use serde_json::{Value, json};

use std::process::Command;

use crate::common::{Env, fails, ok, on_tty, stderr};
use crate::lifecycle::{apply, changes, eventually};

const SUB: &str = "/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachines";

fn kubectl_json(env: &Env, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    serde_json::from_str(&ok(env.kubectl(&all))).unwrap()
}

#[test]
fn get_creates_a_claim_sized_like_virtctl_waits_for_completion_and_remove_dissociates() {
    let env = Env::kubevirt();
    let out = env.vm(&[
        "memory-dump",
        "get",
        "web",
        "--claim-name",
        "web-dump",
        "--create-claim",
    ]);
    let line = ok(out);
    let vm = kubectl_json(&env, &["get", "vm", "web"]);
    let req = &vm["status"]["memoryDumpRequest"];
    assert_eq!(req["phase"], "Completed");
    assert_eq!(req["claimName"], "web-dump");
    assert_eq!(
        line,
        format!(
            "memory dump of web completed: {} in claim web-dump\n",
            req["fileName"].as_str().unwrap()
        )
    );
    // web's VMI requests no memory: (0 + 100 MiB) × 1.055 = 105.5 MiB, rounded up to 106 MiB
    // (virtctl: CalcExpectedMemoryDumpSize, default 5.5% filesystem overhead, 1 MiB alignment).
    let pvc = kubectl_json(&env, &["get", "pvc", "web-dump"]);
    assert_eq!(pvc["spec"]["resources"]["requests"]["storage"], "106Mi");
    assert_eq!(pvc["spec"]["accessModes"], json!(["ReadWriteOnce"]));
    assert_eq!(
        pvc["metadata"]["labels"]["cdi.kubevirt.io/applyStorageProfile"],
        "true"
    );
    let puts: Vec<(String, Option<Value>)> = changes(&env)
        .into_iter()
        .filter(|r| r.path.starts_with("/apis/subresources.kubevirt.io/"))
        .map(|r| (r.path.clone(), r.json()))
        .collect();
    assert_eq!(
        puts,
        [(
            format!("{SUB}/web/memorydump"),
            Some(json!({"claimName": "web-dump"}))
        )]
    );

    // A second --create-claim while a dump is associated is refused before anything is made.
    let err = fails(
        &env,
        &[
            "memory-dump",
            "get",
            "web",
            "--claim-name",
            "other",
            "--create-claim",
        ],
        1,
    );
    assert!(err.contains("still has a memory dump associated"), "{err}");

    env.emulator.clear_requests();
    assert_eq!(
        ok(env.vm(&["memory-dump", "remove", "web"])),
        "memory dump of web removed (claim web-dump kept)\n"
    );
    let vm = kubectl_json(&env, &["get", "vm", "web"]);
    assert!(vm["status"].get("memoryDumpRequest").is_none(), "{vm}");
    let wire: Vec<(String, String)> = changes(&env)
        .into_iter()
        .map(|r| (r.method.clone(), r.path.clone()))
        .collect();
    assert_eq!(
        wire,
        [("PUT".to_owned(), format!("{SUB}/web/removememorydump"))]
    );
    // Nothing left to remove: the server's conflict, exit 1.
    let err = fails(&env, &["memory-dump", "remove", "web"], 1);
    assert!(err.contains("no association found"), "{err}");
}

#[test]
fn the_claim_grows_with_the_memory_request_and_no_wait_returns_at_once() {
    let env = Env::kubevirt();
    apply(
        &env,
        &[
            json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": "big", "namespace": "default"},
        "spec": {"runStrategy": "Always", "template": {"spec": {"domain": {"devices": {},
            "resources": {"requests": {"memory": "2Gi"}}}}}}}),
        ],
    );
    eventually("big to run", || {
        env.emulator
            .objects("kubevirt.io", "virtualmachineinstances", Some("default"))
            .iter()
            .any(|v| v["metadata"]["name"] == "big" && v["status"]["phase"] == "Running")
    });
    let out = env.vm(&[
        "memory-dump",
        "get",
        "big",
        "--claim-name",
        "big-dump",
        "--create-claim",
        "--no-wait",
    ]);
    assert_eq!(
        ok(out),
        "memory dump of big requested into claim big-dump\n"
    );
    // (2048 + 100) MiB × 1.055 = 2266.14 MiB → 2267 MiB.
    let pvc = kubectl_json(&env, &["get", "pvc", "big-dump"]);
    assert_eq!(pvc["spec"]["resources"]["requests"]["storage"], "2267Mi");
}

#[test]
fn deckhouse_refuses_in_one_line() {
    let env = Env::deckhouse();
    for args in [
        &[
            "memory-dump",
            "get",
            "linux-vm",
            "--claim-name",
            "d",
            "--create-claim",
        ][..],
        &["memory-dump", "remove", "linux-vm"][..],
        &["memory-dump", "download", "linux-vm", "-o", "d.core"][..],
    ] {
        let err = fails(&env, args, 2);
        assert!(
            err.starts_with(
                "Error: memory-dump needs KubeVirt: Deckhouse virtualization offers no memory dump"
            ),
            "{err}"
        );
    }
    assert!(changes(&env).is_empty());
}

#[test]
fn bad_input_is_refused_before_any_request() {
    let env = Env::kubevirt();
    for args in [
        &["memory-dump", "get", "Bad_Name!", "--claim-name", "d"][..],
        &["memory-dump", "get", "web", "--claim-name", "Bad_Claim"][..],
        &[
            "memory-dump",
            "get",
            "web",
            "--claim-name",
            "d",
            "--create-claim",
            "--access-mode",
            "ReadOnlyMany",
        ][..],
        &[
            "memory-dump",
            "get",
            "web",
            "--claim-name",
            "d",
            "--create-claim",
            "--storage-class",
            "Bad_SC",
        ][..],
        &["memory-dump", "remove", "web.Bad_NS"][..],
        &["memory-dump", "download", "Bad_Name!", "-o", "d.core"][..],
        &["memory-dump", "download", "web", "-o", "-"][..],
        &["memory-dump", "download", "web", "-o", "/tmp/"][..],
        &["memory-dump", "download", "web", "-o", "d.core", "--resume"][..],
        &[
            "memory-dump",
            "download",
            "web",
            "-o",
            "d.core",
            "--reuse",
            "Bad_Export",
        ][..],
        &["memory-dump", "get", "web", "--claim-name", "d", "-o", "-"][..],
    ] {
        fails(&env, args, 2);
    }
    for args in [
        &["memory-dump", "get", "web", "--create-claim"][..],
        &[
            "memory-dump",
            "get",
            "web",
            "--access-mode",
            "ReadWriteOnce",
        ][..],
        &["memory-dump", "nosuch", "web"][..],
        &["memory-dump", "download", "web"][..],
        &["memory-dump", "get", "web", "-o", "d.core", "--no-wait"][..],
    ] {
        let out = env.vm(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
    }
    assert!(
        env.emulator.requests().is_empty(),
        "{:?}",
        env.emulator.requests()
    );
}

/// Types into the console (flushed: the pty buffers otherwise).
fn send(console: &mut rexpect::session::PtySession, text: &str) {
    console.send(text).unwrap();
    console.flush().unwrap();
}

/// Runs `program args… FILE` and returns its stdout.
fn tool(program: &str, args: &[&str], file: &std::path::Path) -> String {
    let out = Command::new(program).args(args).arg(file).output().unwrap();
    assert!(out.status.success(), "{program}: {}", stderr(&out));
    String::from_utf8(out.stdout).unwrap()
}

/// A string typed into the guest's console is in the dump `get -o` downloads; the dump is an
/// ELF core (`file`, `readelf`); its sha256 is `sha256sum`'s and that of the same file fetched
/// with curl from the export's `dir` link; `download` fetches it again, byte for byte.
#[test]
fn the_dump_is_downloaded_as_an_elf_core_holding_what_the_guest_printed() {
    let env = Env::kubevirt();
    let mut console = on_tty(&env, &["console", "web"]);
    console
        .exp_string("Successfully connected to web's serial console")
        .unwrap();
    send(&mut console, "\r");
    console.exp_string("web login: ").unwrap();
    send(&mut console, "cloud\r");
    console.exp_string("Password: ").unwrap();
    send(&mut console, "cloud\r");
    console.exp_string("cloud@web:~$ ").unwrap();
    // The marker exists only as the shell's output (the typed line says `$((6*7))`).
    send(&mut console, "echo kubevm-marker-$((6*7))\r");
    console.exp_string("kubevm-marker-42").unwrap();
    send(&mut console, "\x1d");
    console.exp_eof().unwrap();

    let core = env.dir.path().join("web.core");
    let out = env.vm(&[
        "memory-dump",
        "get",
        "web",
        "--claim-name",
        "web-dump",
        "--create-claim",
        "-o",
        core.to_str().unwrap(),
    ]);
    let err = stderr(&out);
    let text = ok(out);
    let vm = kubectl_json(&env, &["get", "vm", "web"]);
    let file_name = vm["status"]["memoryDumpRequest"]["fileName"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        text,
        format!(
            "memory dump of web completed: {file_name} in claim web-dump\nmemory dump of web downloaded to {}\n",
            core.display()
        )
    );
    assert!(
        err.contains(&format!("web: memory dump {file_name} in claim web-dump")),
        "{err}"
    );

    // Independent readers.
    let kind = tool("file", &["-b"], &core);
    assert!(
        kind.starts_with("ELF 64-bit LSB core file, x86-64"),
        "{kind}"
    );
    assert!(tool("readelf", &["-h"], &core).contains("CORE (Core file)"));
    let segments = tool("readelf", &["-lW"], &core);
    assert!(
        segments.contains("NOTE") && segments.contains("LOAD"),
        "{segments}"
    );
    let grep = Command::new("grep")
        .args(["-a", "-c", "kubevm-marker-42"])
        .arg(&core)
        .output()
        .unwrap();
    assert!(grep.status.success(), "the marker is not in the dump");
    let sum = tool("sha256sum", &[], &core);
    let hex = sum.split_whitespace().next().unwrap();
    assert!(err.contains(&format!("sha256:{hex}")), "{err}");
    let sidecar = std::fs::read_to_string(env.dir.path().join("web.core.sha256")).unwrap();
    assert!(sidecar.starts_with(hex), "{sidecar}");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&core).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert!(!env.dir.path().join("web.core.partial").exists());
    // The export it made is gone.
    let left = ok(env.kubectl(&["get", "virtualmachineexports", "-o", "name"]));
    assert_eq!(left, "");

    // download again, keeping the export, and fetch the same file with curl from its link.
    let again = env.dir.path().join("again.core");
    let out = env.vm(&[
        "memory-dump",
        "download",
        "web",
        "-o",
        again.to_str().unwrap(),
        "--keep",
    ]);
    ok(out);
    assert_eq!(
        std::fs::read(&again).unwrap(),
        std::fs::read(&core).unwrap()
    );
    let vme = kubectl_json(&env, &["get", "virtualmachineexports"]);
    let vme = &vme["items"][0];
    let link = &vme["status"]["links"]["external"];
    let dir = link["volumes"][0]["formats"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["format"] == "dir")
        .unwrap()["url"]
        .as_str()
        .unwrap()
        .to_owned();
    let ca = env.dir.path().join("export-ca.pem");
    std::fs::write(&ca, link["cert"].as_str().unwrap()).unwrap();
    let secret = kubectl_json(
        &env,
        &[
            "get",
            "secret",
            vme["spec"]["tokenSecretRef"].as_str().unwrap(),
        ],
    );
    use base64::Engine;
    let token = base64::engine::general_purpose::STANDARD
        .decode(secret["data"]["token"].as_str().unwrap())
        .unwrap();
    let fetched = env.dir.path().join("curl.core");
    let curl = Command::new("curl")
        .args(["-sSf", "--cacert"])
        .arg(&ca)
        .args([
            "-H",
            &format!(
                "x-kubevirt-export-token: {}",
                String::from_utf8(token).unwrap()
            ),
            "-o",
        ])
        .arg(&fetched)
        .arg(format!("{dir}{file_name}"))
        .output()
        .unwrap();
    assert!(curl.status.success(), "{}", stderr(&curl));
    assert_eq!(
        tool("sha256sum", &[], &fetched).split_whitespace().next(),
        Some(hex)
    );
}

/// A completed dump of `web` in claim `web-dump`.
fn dumped(env: &Env) {
    ok(env.vm(&[
        "memory-dump",
        "get",
        "web",
        "--claim-name",
        "web-dump",
        "--create-claim",
    ]));
}

fn sha256sum(path: &std::path::Path) -> String {
    tool("sha256sum", &[], path)
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned()
}

/// A run killed mid-transfer leaves only FILE.partial and its export; `--reuse NAME --resume`
/// fetches just the rest, and the result is byte for byte what an uninterrupted run gets.
#[test]
fn a_killed_download_resumes_where_it_stopped() {
    use kubevm_emulator::kubevirt::export::ExportFaults;
    use std::time::{Duration, Instant};
    let env = Env::kubevirt();
    dumped(&env);
    let whole = env.dir.path().join("whole.core");
    ok(env.vm(&[
        "memory-dump",
        "download",
        "web",
        "-o",
        whole.to_str().unwrap(),
    ]));
    let size = std::fs::metadata(&whole).unwrap().len();
    assert!(size > 2 << 20, "{size}");

    env.emulator.set_export_faults(ExportFaults {
        bytes_per_sec: Some(1 << 20),
        ..Default::default()
    });
    let file = env.dir.path().join("web.core");
    let partial = env.dir.path().join("web.core.partial");
    let mut child = env
        .command(crate::common::BIN)
        .args([
            "memory-dump",
            "download",
            "web",
            "-o",
            file.to_str().unwrap(),
        ])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::fs::metadata(&partial).map(|m| m.len()).unwrap_or(0) < 1 << 20 {
        assert!(Instant::now() < deadline, "no progress");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let kept = std::fs::metadata(&partial).unwrap().len();
    assert!(kept < size && !file.exists(), "{kept} of {size}");
    let exports = env.emulator.objects(
        "export.kubevirt.io",
        "virtualmachineexports",
        Some("default"),
    );
    assert_eq!(exports.len(), 1, "the export stays");
    let name = exports[0]["metadata"]["name"].as_str().unwrap().to_owned();

    env.emulator.set_export_faults(ExportFaults::default());
    let served_before = env.emulator.export_bytes_served();
    let out = env.vm(&[
        "memory-dump",
        "download",
        "web",
        "-o",
        file.to_str().unwrap(),
        "--reuse",
        &name,
        "--resume",
    ]);
    let err = stderr(&out);
    ok(out);
    assert!(
        err.contains(&format!("resuming {}", partial.display())),
        "{err}"
    );
    assert_eq!(
        env.emulator.export_bytes_served() - served_before,
        size - kept
    );
    assert_eq!(sha256sum(&file), sha256sum(&whole));
    assert!(!partial.exists());
    assert_eq!(
        tool("file", &["-b"], &file).split(',').next(),
        Some("ELF 64-bit LSB core file")
    );
}

/// `--format gzip`: the file is gzip (`file`), `gzip -dc | sha256sum` is the sha256 of the raw
/// dump (and the one printed), FILE.sha256 checks with `sha256sum -c`; connections cut during
/// the raw transfer are resumed within the run.
#[test]
fn gzip_format_unpacks_to_the_dump() {
    use kubevm_emulator::kubevirt::export::ExportFaults;
    let env = Env::kubevirt();
    dumped(&env);
    let raw = env.dir.path().join("raw.core");
    ok(env.vm(&[
        "memory-dump",
        "download",
        "web",
        "-o",
        raw.to_str().unwrap(),
    ]));
    let raw_sum = sha256sum(&raw);

    env.emulator.set_export_faults(ExportFaults {
        cut_at: vec![1 << 20, 3 << 20],
        ..Default::default()
    });
    let gz = env.dir.path().join("web.core.gz");
    let out = env.vm(&[
        "memory-dump",
        "download",
        "web",
        "-o",
        gz.to_str().unwrap(),
        "--format",
        "gzip",
    ]);
    let err = stderr(&out);
    ok(out);
    assert!(err.contains(&format!("sha256:{raw_sum}")), "{err}");
    assert!(tool("file", &["-b"], &gz).starts_with("gzip compressed data"));
    let unpacked = Command::new("sh")
        .arg("-c")
        .arg("gzip -dc \"$1\" | sha256sum")
        .arg("sh")
        .arg(&gz)
        .output()
        .unwrap();
    assert!(unpacked.status.success());
    let unpacked = String::from_utf8(unpacked.stdout).unwrap();
    assert_eq!(unpacked.split_whitespace().next(), Some(raw_sum.as_str()));
    let check = Command::new("sha256sum")
        .args(["-c", "web.core.gz.sha256"])
        .current_dir(env.dir.path())
        .output()
        .unwrap();
    assert!(check.status.success(), "{}", stderr(&check));
    for leftover in ["web.core.gz.partial", "web.core.gz.partial.gz"] {
        assert!(!env.dir.path().join(leftover).exists(), "{leftover}");
    }
}

/// A server that keeps failing: the run fails, nothing has the final name (raw or gzip), the
/// export is kept and the message says how to resume.
#[test]
fn a_failed_download_leaves_no_file_under_the_final_name() {
    use kubevm_emulator::kubevirt::export::ExportFaults;
    let env = Env::kubevirt();
    dumped(&env);
    env.emulator.set_export_faults(ExportFaults {
        fail_5xx: 1000,
        ..Default::default()
    });
    for (file, format) in [("f.core", "raw"), ("f.core.gz", "gzip")] {
        let path = env.dir.path().join(file);
        let out = env.vm(&[
            "memory-dump",
            "download",
            "web",
            "-o",
            path.to_str().unwrap(),
            "--format",
            format,
            "--retries",
            "1",
        ]);
        assert_eq!(out.status.code(), Some(1), "{format}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains("was kept: resume with `kubectl vm memory-dump download web"),
            "{format}: {err}"
        );
        if format == "gzip" {
            assert!(err.contains("--format gzip -n default"), "{err}");
        }
        assert!(!path.exists(), "{format}");
    }
}
