//! The export server behaves like KubeVirt's virt-exportserver (Go `http.ServeContent` for
//! raw: Range, If-Range, ETag, HEAD, 416; gzip on the fly; token header or query, else 401)
//! and Deckhouse's exporter (kubeconfig credentials, `dataexports/download`, idle TTL), checked
//! with curl as an independent client.

use std::process::Command;
use std::time::{Duration, Instant};

use kubevm_emulator::kubevirt::export::fill;
use kubevm_emulator::{BlockingEmulator, Emulator, EmulatorOptions, ServeFlavor};
use serde_json::{Value, json};

struct Env {
    emu: BlockingEmulator,
    dir: tempfile::TempDir,
}

impl Env {
    fn new(flavor: ServeFlavor) -> Env {
        Env::started(EmulatorOptions {
            flavor,
            import_step: Duration::from_millis(50),
            ..Default::default()
        })
    }

    /// KubeVirt with a fixture's objects (and their running guests).
    fn with_fixture(yaml: String) -> Env {
        Env::started(EmulatorOptions {
            fixture_yaml: vec![yaml],
            import_step: Duration::from_millis(50),
            ..Default::default()
        })
    }

    fn started(options: EmulatorOptions) -> Env {
        let emu = Emulator::start_blocking(options).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("api.pem"), emu.ca_pem()).unwrap();
        std::fs::write(dir.path().join("export.pem"), emu.export_ca_pem()).unwrap();
        Env { emu, dir }
    }

    fn token(&self, user: &str) -> String {
        let yaml: Value = yaml_serde::from_str(&self.emu.kubeconfig_yaml()).unwrap();
        yaml["users"]
            .as_array()
            .unwrap()
            .iter()
            .find(|u| u["name"] == user)
            .unwrap()["user"]["token"]
            .as_str()
            .unwrap()
            .to_string()
    }

    /// POSTs an object through the API (so controllers reconcile it).
    fn create(&self, path: &str, obj: Value) {
        let out = Command::new("curl")
            .args(["-sSf", "--cacert"])
            .arg(self.dir.path().join("api.pem"))
            .args([
                "-H",
                &format!("Authorization: Bearer {}", self.token("admin")),
            ])
            .args([
                "-H",
                "Content-Type: application/json",
                "-d",
                &obj.to_string(),
            ])
            .arg(format!("{}{path}", self.emu.url()))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn wait_for(&self, group: &str, plural: &str, name: &str, phase: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let found = self
                .emu
                .objects(group, plural, Some("default"))
                .into_iter()
                .find(|o| o["metadata"]["name"] == name);
            if let Some(o) = found.filter(|o| o["status"]["phase"] == phase) {
                return o;
            }
            assert!(Instant::now() < deadline, "{name} never became {phase}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// curl against the export server: (status, headers lower-cased, body).
    fn get(&self, url: &str, extra: &[&str]) -> (u16, String, Vec<u8>) {
        let body = self.dir.path().join("body");
        let out = Command::new("curl")
            .args(["-sS", "-m", "10", "--cacert"])
            .arg(self.dir.path().join("export.pem"))
            .args(["-D", "-", "-o"])
            .arg(&body)
            .args(extra)
            .arg(url)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let headers = String::from_utf8(out.stdout).unwrap().to_ascii_lowercase();
        let status = headers.split_whitespace().nth(1).unwrap().parse().unwrap();
        (status, headers, std::fs::read(&body).unwrap_or_default())
    }
}

fn pvc(name: &str, size: u64) -> Value {
    json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size.to_string()}}},
        "status": {"phase": "Bound", "capacity": {"storage": size.to_string()}}})
}

fn expected(env: &Env, pvc: &str, from: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    fill(env.emu.export_content_key("default", pvc), from, &mut buf);
    buf
}

fn header<'a>(headers: &'a str, name: &str) -> Option<&'a str> {
    headers
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}: ")))
        .map(str::trim)
}

#[test]
fn kubevirt_export_server_serves_ranges_gzip_and_checks_the_token() {
    let env = Env::new(ServeFlavor::KubeVirt);
    let size = 1_000_000u64;
    env.emu.put_object(pvc("d", size));
    env.emu
        .put_object(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "tok", "namespace": "default"}, "data": {"token": "czNjcjN0"}}));
    env.create(
        "/apis/export.kubevirt.io/v1/namespaces/default/virtualmachineexports",
        json!({"apiVersion": "export.kubevirt.io/v1", "kind": "VirtualMachineExport",
            "metadata": {"name": "e"}, "spec": {"source": {"apiGroup": "", "kind": "PersistentVolumeClaim", "name": "d"}, "tokenSecretRef": "tok"}}),
    );
    let vme = env.wait_for("export.kubevirt.io", "virtualmachineexports", "e", "Ready");
    let ext = &vme["status"]["links"]["external"];
    assert_eq!(ext["cert"], env.emu.export_ca_pem().as_str());
    assert_eq!(ext["volumes"][0]["name"], "d");
    let raw = ext["volumes"][0]["formats"][0]["url"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(raw.ends_with(
        "/api/export.kubevirt.io/v1/namespaces/default/virtualmachineexports/e/volumes/d/disk.img"
    ));
    assert_eq!(
        vme["status"]["links"]["internal"]["volumes"][0]["formats"][0]["url"],
        "https://virt-export-e.default.svc/volumes/d/disk.img"
    );
    let tok = ["-H", "x-kubevirt-export-token: s3cr3t"];

    // No or a wrong token: 401.
    assert_eq!(env.get(&raw, &[]).0, 401);
    assert_eq!(
        env.get(&raw, &["-H", "x-kubevirt-export-token: nope"]).0,
        401
    );
    // The query parameter works too.
    assert_eq!(
        env.get(&format!("{raw}?x-kubevirt-export-token=s3cr3t"), &["-I"])
            .0,
        200
    );

    // Whole content.
    let (status, headers, body) = env.get(&raw, &tok);
    assert_eq!(status, 200);
    assert_eq!(body, expected(&env, "d", 0, size as usize));
    assert_eq!(header(&headers, "accept-ranges"), Some("bytes"));
    let etag = header(&headers, "etag").unwrap().to_string();

    // Range, and If-Range with the current ETag: 206 with Content-Range.
    let (status, headers, body) = env.get(&raw, &[tok[0], tok[1], "-r", "1000-"]);
    assert_eq!(status, 206);
    assert_eq!(
        header(&headers, "content-range"),
        Some("bytes 1000-999999/1000000")
    );
    assert_eq!(body, expected(&env, "d", 1000, (size - 1000) as usize));
    let if_range = format!("If-Range: {etag}");
    let (status, _, body) = env.get(&raw, &[tok[0], tok[1], "-r", "10-19", "-H", &if_range]);
    assert_eq!((status, body.len()), (206, 10));
    // Beyond the end: 416.
    assert_eq!(env.get(&raw, &[tok[0], tok[1], "-r", "2000000-"]).0, 416);

    // HEAD gives the metadata only (with -I curl stores the headers as the "body").
    let (status, headers, body) = env.get(&raw, &[tok[0], tok[1], "-I"]);
    assert_eq!(status, 200);
    assert!(body.starts_with(b"HTTP/"));
    assert_eq!(header(&headers, "content-length"), Some("1000000"));

    // Changed content: new ETag, and If-Range with the old one gives the whole new content.
    env.emu.change_export_content("default", "d");
    let (status, headers, body) = env.get(&raw, &[tok[0], tok[1], "-r", "10-19", "-H", &if_range]);
    assert_eq!(status, 200);
    assert_ne!(header(&headers, "etag"), Some(etag.as_str()));
    assert_eq!(body, expected(&env, "d", 0, size as usize));

    // gzip: compressed on the fly, no ranges; gunzip gives the raw bytes.
    let gz = ext["volumes"][0]["formats"][1]["url"].as_str().unwrap();
    let (status, headers, body) = env.get(gz, &tok);
    assert_eq!(status, 200);
    assert!(header(&headers, "accept-ranges").is_none());
    let gz_file = env.dir.path().join("d.img.gz");
    std::fs::write(&gz_file, &body).unwrap();
    let out = Command::new("gzip")
        .arg("-dc")
        .arg(&gz_file)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(out.stdout, expected(&env, "d", 0, size as usize));

    // Fault switches: one 503, then a cut (curl sees a short body).
    env.emu
        .set_export_faults(kubevm_emulator::kubevirt::export::ExportFaults {
            fail_5xx: 1,
            cut_at: vec![300_000],
            ..Default::default()
        });
    assert_eq!(env.get(&raw, &tok).0, 503);
    let out = Command::new("curl")
        .args(["-sS", "-m", "10", "--cacert"])
        .arg(env.dir.path().join("export.pem"))
        .args([
            tok[0],
            tok[1],
            "-o",
            "/dev/null",
            "-w",
            "%{size_download}",
            &raw,
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let got: u64 = String::from_utf8_lossy(&out.stdout).parse().unwrap();
    assert!(got <= 300_000, "{got}");
}

/// Sources without volumes end `Skipped` (kubevirt vm-source.go / vmsnapshot-source.go): a VM
/// with a false Ready `VMNoVolumes`; a snapshot whose content has no volume backups with a
/// false `VolumesCreated` `VMSnapshotNoVolumes` while Ready stays `Initializing`.
#[test]
fn sources_without_volumes_end_skipped() {
    let env = Env::new(ServeFlavor::KubeVirt);
    env.emu.put_object(
        json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": "diskless", "namespace": "default"},
        "spec": {"runStrategy": "Halted", "template": {"spec": {"domain": {"devices": {}}}}}}),
    );
    env.emu.put_object(json!({"apiVersion": "snapshot.kubevirt.io/v1beta1", "kind": "VirtualMachineSnapshot",
        "metadata": {"name": "empty", "namespace": "default"},
        "spec": {"source": {"apiGroup": "kubevirt.io", "kind": "VirtualMachine", "name": "diskless"}},
        "status": {"phase": "Succeeded", "readyToUse": true, "virtualMachineSnapshotContentName": "content-empty"}}));
    env.emu.put_object(json!({"apiVersion": "snapshot.kubevirt.io/v1beta1", "kind": "VirtualMachineSnapshotContent",
        "metadata": {"name": "content-empty", "namespace": "default"},
        "spec": {"virtualMachineSnapshotName": "empty", "volumeBackups": []},
        "status": {"readyToUse": true}}));
    let exports = "/apis/export.kubevirt.io/v1/namespaces/default/virtualmachineexports";
    env.create(exports, json!({"apiVersion": "export.kubevirt.io/v1", "kind": "VirtualMachineExport",
        "metadata": {"name": "vm"}, "spec": {"source": {"apiGroup": "kubevirt.io", "kind": "VirtualMachine", "name": "diskless"}}}));
    env.create(exports, json!({"apiVersion": "export.kubevirt.io/v1", "kind": "VirtualMachineExport",
        "metadata": {"name": "snap"}, "spec": {"source": {"apiGroup": "snapshot.kubevirt.io", "kind": "VirtualMachineSnapshot", "name": "empty"}}}));

    let vm = env.wait_for(
        "export.kubevirt.io",
        "virtualmachineexports",
        "vm",
        "Skipped",
    );
    let conditions = vm["status"]["conditions"].as_array().unwrap();
    let ready = conditions.iter().find(|c| c["type"] == "Ready").unwrap();
    assert_eq!(
        (&ready["status"], &ready["reason"]),
        (&json!("False"), &json!("VMNoVolumes"))
    );
    assert!(vm["status"].get("links").is_none());

    let snap = env.wait_for(
        "export.kubevirt.io",
        "virtualmachineexports",
        "snap",
        "Skipped",
    );
    let conditions = snap["status"]["conditions"].as_array().unwrap();
    let ready = conditions.iter().find(|c| c["type"] == "Ready").unwrap();
    assert_eq!(
        (&ready["status"], &ready["reason"]),
        (&json!("False"), &json!("Initializing"))
    );
    let created = conditions
        .iter()
        .find(|c| c["type"] == "VolumesCreated")
        .unwrap();
    assert_eq!(created["status"], "False");
    assert_eq!(created["reason"], "VMSnapshotNoVolumes");
    assert_eq!(
        created["message"],
        "VirtualMachineSnapshot default/empty does not contain any volume snapshots"
    );
    // No exporter pod for a skipped export.
    assert!(env.emu.objects("", "pods", Some("default")).is_empty());
}

#[test]
fn running_vm_keeps_the_export_pending() {
    let env = Env::new(ServeFlavor::KubeVirt);
    env.emu.put_object(pvc("d", 1000));
    env.emu.put_object(
        json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": "vm1", "namespace": "default"},
        "spec": {"runStrategy": "Always", "template": {"spec": {"domain": {"devices": {}},
            "volumes": [{"name": "r", "persistentVolumeClaim": {"claimName": "d"}}]}}}}),
    );
    env.emu.put_object(
        json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": "vm1", "namespace": "default"}, "spec": {"domain": {"devices": {}}}}),
    );
    env.create(
        "/apis/export.kubevirt.io/v1/namespaces/default/virtualmachineexports",
        json!({"apiVersion": "export.kubevirt.io/v1", "kind": "VirtualMachineExport",
            "metadata": {"name": "e"}, "spec": {"source": {"apiGroup": "kubevirt.io", "kind": "VirtualMachine", "name": "vm1"}}}),
    );
    let vme = env.wait_for(
        "export.kubevirt.io",
        "virtualmachineexports",
        "e",
        "Pending",
    );
    assert_eq!(vme["status"]["conditions"][0]["status"], "False");
    assert_eq!(
        vme["status"]["conditions"][0]["message"],
        "VirtualMachine vm1 is running"
    );
}

#[test]
fn deckhouse_exporter_authorizes_and_expires_when_idle() {
    let env = Env::new(ServeFlavor::Deckhouse);
    env.emu.put_object(pvc("p", 4096));
    env.create(
        "/apis/storage-foundation.deckhouse.io/v1alpha1/namespaces/default/dataexports",
        json!({"apiVersion": "storage-foundation.deckhouse.io/v1alpha1", "kind": "DataExport",
            "metadata": {"name": "de"}, "spec": {"ttl": "1s", "publish": true,
            "targetRef": {"kind": "PersistentVolumeClaim", "name": "p"}}}),
    );
    let de = env.wait_for(
        "storage-foundation.deckhouse.io",
        "dataexports",
        "de",
        "Ready",
    );
    let public = de["status"]["publicURL"].as_str().unwrap();
    assert!(public.ends_with("/default/pvc/p/"), "{public}");
    let url = format!("{public}api/v1/block");
    assert_eq!(env.get(&url, &[]).0, 401);
    let alice = format!("Authorization: Bearer {}", env.token("alice"));
    assert_eq!(env.get(&url, &["-H", &alice]).0, 403);
    let admin = format!("Authorization: Bearer {}", env.token("admin"));
    let (status, _, body) = env.get(&url, &["-H", &admin, "-r", "0-99"]);
    assert_eq!(status, 206);
    assert_eq!(body, expected(&env, "p", 0, 100));
    // Idle for longer than spec.ttl: Expired, and the exporter stops serving.
    let de = env.wait_for(
        "storage-foundation.deckhouse.io",
        "dataexports",
        "de",
        "Expired",
    );
    assert_eq!(de["status"]["serverState"], "IdleExpired");
    assert_eq!(de["status"]["conditions"][0]["reason"], "Expired");
    assert_eq!(env.get(&url, &["-H", &admin]).0, 404);
}

/// A memory dump claim is a filesystem claim: the export offers `dir` and `tar.gz`
/// (kubevirt `export.go` `addVolumeEnvironmentVariables`), served as virt-exportserver does
/// (`dirHandler`: Go's `http.FileServer`, its listing and `serveContent`; `archiveHandler`:
/// `tar Scv .` gzipped). The dump is an ELF core (`file`, `readelf` as independent readers)
/// holding the guest's console output.
#[test]
fn a_memory_dump_claim_is_served_as_dir_and_tar_gz() {
    let fixture = std::fs::read_to_string(format!(
        "{}/../fixtures/kubevirt.yaml",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let env = Env::with_fixture(fixture);
    env.emu.put_object(pvc("dump", 200 << 20));
    env.emu
        .put_object(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "tok", "namespace": "default"}, "data": {"token": "czNjcjN0"}}));
    // The guest (booted) and its console output: what the guest printed is in its memory.
    let banner = "Emulated Linux guest (kubevm-emulator) ttyS0";
    let guest = env.emu.guest("default", "web").unwrap().unwrap();
    let transcript = guest.serial().transcript;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !transcript
        .lines_from(0)
        .0
        .iter()
        .any(|l| l.contains(banner))
    {
        assert!(
            Instant::now() < deadline,
            "the guest never printed its banner"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let put = Command::new("curl")
        .args(["-sSf", "-X", "PUT", "--cacert"])
        .arg(env.dir.path().join("api.pem"))
        .args([
            "-H",
            &format!("Authorization: Bearer {}", env.token("admin")),
            "-H",
            "Content-Type: application/json",
            "-d",
            r#"{"claimName":"dump"}"#,
        ])
        .arg(format!(
            "{}/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachines/web/memorydump",
            env.emu.url()
        ))
        .output()
        .unwrap();
    assert!(
        put.status.success(),
        "{}",
        String::from_utf8_lossy(&put.stderr)
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let file_name = loop {
        let vm = env
            .emu
            .objects("kubevirt.io", "virtualmachines", Some("default"))
            .into_iter()
            .find(|o| o["metadata"]["name"] == "web")
            .unwrap();
        let req = &vm["status"]["memoryDumpRequest"];
        if req["phase"] == "Completed" {
            break req["fileName"].as_str().unwrap().to_string();
        }
        assert!(Instant::now() < deadline, "{req}");
        std::thread::sleep(Duration::from_millis(20));
    };
    env.create(
        "/apis/export.kubevirt.io/v1/namespaces/default/virtualmachineexports",
        json!({"apiVersion": "export.kubevirt.io/v1", "kind": "VirtualMachineExport",
            "metadata": {"name": "e"}, "spec": {"source": {"apiGroup": "", "kind": "PersistentVolumeClaim", "name": "dump"}, "tokenSecretRef": "tok"}}),
    );
    let vme = env.wait_for("export.kubevirt.io", "virtualmachineexports", "e", "Ready");
    let formats = &vme["status"]["links"]["internal"]["volumes"][0]["formats"];
    assert_eq!(
        formats,
        &json!([
            {"format": "dir", "url": "https://virt-export-e.default.svc/volumes/dump/dir/"},
            {"format": "tar.gz", "url": "https://virt-export-e.default.svc/volumes/dump/disk.tar.gz"},
        ])
    );
    let ext = &vme["status"]["links"]["external"]["volumes"][0]["formats"];
    let dir = ext[0]["url"].as_str().unwrap();
    let archive = ext[1]["url"].as_str().unwrap();
    let tok = ["-H", "x-kubevirt-export-token: s3cr3t"];
    assert_eq!(env.get(dir, &[]).0, 401);

    // The listing, as Go's dirList writes it; without the slash StripPrefix answers 404.
    let (status, headers, body) = env.get(dir, &tok);
    assert_eq!(status, 200);
    assert_eq!(
        header(&headers, "content-type"),
        Some("text/html; charset=utf-8")
    );
    assert_eq!(
        String::from_utf8(body).unwrap(),
        format!(
            "<!doctype html>\n<meta name=\"viewport\" content=\"width=device-width\">\n<pre>\n<a href=\"{file_name}\">{file_name}</a>\n</pre>\n"
        )
    );
    assert_eq!(env.get(dir.trim_end_matches('/'), &tok).0, 404);
    assert_eq!(env.get(&format!("{dir}nothing"), &tok).0, 404);

    // The file: serveContent (Range, Last-Modified, no ETag).
    let file_url = format!("{dir}{file_name}");
    let (status, headers, dump) = env.get(&file_url, &tok);
    assert_eq!(status, 200);
    assert_eq!(header(&headers, "accept-ranges"), Some("bytes"));
    assert!(header(&headers, "etag").is_none());
    assert!(header(&headers, "last-modified").unwrap().ends_with(" gmt"));
    // web's 2 GiB guest: the fake guest's dump carries 8 MiB of it, behind the headers and notes.
    assert!(
        dump.len() > 8 << 20 && dump.len() < (8 << 20) + 4096,
        "{}",
        dump.len()
    );
    let (status, _, tail) = env.get(&file_url, &[tok[0], tok[1], "-r", "1000-"]);
    assert_eq!((status, tail.as_slice()), (206, &dump[1000..]));
    let saved = env.dir.path().join("saved.dump");
    std::fs::write(&saved, &dump).unwrap();
    let tool = |cmd: &str, args: &[&str]| {
        let out = Command::new(cmd).args(args).arg(&saved).output().unwrap();
        assert!(out.status.success(), "{cmd}");
        String::from_utf8(out.stdout).unwrap()
    };
    assert!(
        tool("file", &["-b"]).starts_with("ELF 64-bit LSB core file, x86-64"),
        "{}",
        tool("file", &["-b"])
    );
    let header_text = tool("readelf", &["-h"]);
    assert!(header_text.contains("CORE (Core file)"), "{header_text}");
    let segments = tool("readelf", &["-lW"]);
    assert!(
        segments.contains("NOTE") && segments.contains("LOAD"),
        "{segments}"
    );
    assert!(segments.contains("0x800000 0x800000"), "{segments}");
    let notes = tool("readelf", &["-n"]);
    assert!(notes.contains("NT_PRSTATUS"), "{notes}");
    // The guest's console output is in its memory.
    let banner = banner.as_bytes();
    assert!(dump.windows(banner.len()).any(|w| w == banner));

    // The archive: gzipped tar with `./` and `./FILE`, no Range; GET only.
    let (status, headers, body) = env.get(archive, &tok);
    assert_eq!(status, 200);
    assert!(header(&headers, "accept-ranges").is_none());
    let tgz = env.dir.path().join("a.tar.gz");
    std::fs::write(&tgz, &body).unwrap();
    let list = Command::new("tar").arg("tzf").arg(&tgz).output().unwrap();
    assert!(list.status.success());
    assert_eq!(
        String::from_utf8(list.stdout).unwrap(),
        format!("./\n./{file_name}\n")
    );
    let out = env.dir.path().join("x");
    std::fs::create_dir(&out).unwrap();
    let unpack = Command::new("tar")
        .arg("xzf")
        .arg(&tgz)
        .arg("-C")
        .arg(&out)
        .output()
        .unwrap();
    assert!(unpack.status.success());
    assert_eq!(std::fs::read(out.join(&file_name)).unwrap(), dump);
    assert_eq!(env.get(archive, &[tok[0], tok[1], "-I"]).0, 400);
}
