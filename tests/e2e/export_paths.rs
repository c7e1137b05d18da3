//! `kubectl vm export` on the paths the first export tests left out: the internal link through
//! `pods/portforward` when there is no external link (KubeVirt) or no public URL (Deckhouse),
//! TLS verified against the internal CA, the snapshot sources (`vmsnapshot/`, `vds/`), and the
//! Deckhouse half of "mismatch fails" and "removes what it created and nothing else".
//! Expected checksums come from the emulator's generator piped to `sha256sum`.

use kubevm_emulator::kubevirt::export::ExportFaults;
use serde_json::{Value, json};

use crate::common::{Env, stderr};
use crate::export::{
    DATA_EXPORTS, KV_EXPORTS, MIB, deckhouse, export, kubevirt, mode, names, objects,
    reference_sha256, sha256_of, succeeded,
};
use crate::lifecycle::eventually;

fn internal_only(env: &Env, wrong_ca: bool) {
    env.emulator.set_export_faults(ExportFaults {
        no_external: true,
        wrong_internal_ca: wrong_ca,
        ..Default::default()
    });
}

/// The pods/portforward upgrades the run made (path, status).
fn port_forwards(env: &Env) -> Vec<(String, u16)> {
    env.emulator
        .requests()
        .into_iter()
        .filter(|r| {
            r.path.starts_with("/api/v1/namespaces/default/pods/")
                && r.path.ends_with("/portforward")
        })
        .map(|r| (r.path, r.status))
        .collect()
}

fn exporter_pods(env: &Env) -> Vec<String> {
    names(&env.emulator.objects("", "pods", Some("default")))
        .into_iter()
        .filter(|n| n.starts_with("virt-export-"))
        .collect()
}

/// No external link: the run says it uses the internal link through a port-forward to the
/// exporter pod, fetches the volume through pods/portforward with the internal CA verified
/// for the service's DNS name, and the result matches the source; the exporter pod goes with
/// the export.
#[test]
fn kubevirt_without_external_link_uses_the_internal_link() {
    let size = 48 * MIB;
    let env = kubevirt(size, MIB);
    internal_only(&env, false);
    let file = env.dir.path().join("root.img");
    let want = reference_sha256("exp-root", size);
    let err = succeeded(&export(
        &env,
        &["pvc/exp-root", "-o", file.to_str().unwrap()],
    ));
    let route: Vec<&str> = err.lines().filter(|l| l.contains("reaching")).collect();
    assert_eq!(route.len(), 1, "{err}");
    assert!(
        route[0].contains(
            "no external link: reaching the export server's internal link through a port-forward to pod virt-export-export-pvc-exp-root-"
        ),
        "{err}"
    );
    assert_eq!(sha256_of(&file), want);
    assert!(err.contains(&format!("sha256:{want}")), "{err}");
    assert_eq!(mode(&file), 0o600);
    let forwards = port_forwards(&env);
    assert!(!forwards.is_empty(), "no pods/portforward request");
    assert!(
        forwards
            .iter()
            .all(|(p, s)| p.contains("/pods/virt-export-export-pvc-exp-root-") && *s == 101),
        "{forwards:?}"
    );
    assert_eq!(env.emulator.export_bytes_served(), size);
    assert!(objects(&env, KV_EXPORTS).is_empty());
    eventually("the exporter pod is collected", || {
        exporter_pods(&env).is_empty()
    });
}

/// The internal link's CA did not sign the exporter pod's certificate: the run refuses the
/// server (exit 1), writes nothing under the final name and keeps the export.
#[test]
fn kubevirt_internal_link_with_a_wrong_ca_is_refused() {
    let env = kubevirt(2 * MIB, MIB);
    internal_only(&env, true);
    let file = env.dir.path().join("root.img");
    let out = export(&env, &["pvc/exp-root", "-o", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("certificate is not trusted"), "{err}");
    assert!(err.contains("was kept: resume with"), "{err}");
    assert!(!file.exists());
    assert_eq!(objects(&env, KV_EXPORTS).len(), 1);
    // Not retried: a certificate failure is final.
    assert!(!err.contains("retry"), "{err}");
}

/// A ready VirtualMachineSnapshot `name` of VM `vm` whose content holds `backups`
/// (`spec.volumeBackups`, each with a ready volume snapshot).
fn put_vm_snapshot(env: &Env, name: &str, vm: &str, backups: Value) {
    let content = format!("vmsnapshot-content-{name}");
    let statuses: Vec<Value> = backups
        .as_array()
        .unwrap()
        .iter()
        .map(|b| json!({"volumeSnapshotName": b["volumeSnapshotName"], "readyToUse": true}))
        .collect();
    env.emulator.put_object(json!({"apiVersion": "snapshot.kubevirt.io/v1beta1", "kind": "VirtualMachineSnapshot",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"source": {"apiGroup": "kubevirt.io", "kind": "VirtualMachine", "name": vm}},
        "status": {"phase": "Succeeded", "readyToUse": true, "virtualMachineSnapshotContentName": content}}));
    env.emulator.put_object(json!({"apiVersion": "snapshot.kubevirt.io/v1beta1", "kind": "VirtualMachineSnapshotContent",
        "metadata": {"name": content, "namespace": "default"},
        "spec": {"source": {"virtualMachine": {"metadata": {"name": vm}}}, "virtualMachineSnapshotName": name,
            "volumeBackups": backups},
        "status": {"readyToUse": true, "volumeSnapshotStatus": statuses}}));
}

/// `vmsnapshot/NAME`: an export of kind VirtualMachineSnapshot; each volume is named after the
/// snapshotted PVC and holds its data; both land in the directory; the restore PVCs the
/// controller made go with the export and the source PVCs stay.
#[test]
fn kubevirt_vmsnapshot_exports_every_volume() {
    let env = kubevirt(6 * MIB, 3 * MIB);
    let backup = |vol: &str, pvc: &str, size: u64| {
        json!({"volumeName": vol, "volumeSnapshotName": format!("vmsnapshot-snap-volume-{vol}"),
            "persistentVolumeClaim": {"metadata": {"name": pvc},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size.to_string()}}}}})
    };
    put_vm_snapshot(
        &env,
        "snap",
        "exp",
        json!([
            backup("root", "exp-root", 6 * MIB),
            backup("data", "exp-data", 3 * MIB)
        ]),
    );
    let pvcs_before = names(
        &env.emulator
            .objects("", "persistentvolumeclaims", Some("default")),
    );
    let dir = env.dir.path().join("snap");
    let err = succeeded(&export(
        &env,
        &["vmsnapshot/snap", "-o", dir.to_str().unwrap()],
    ));
    assert!(
        err.contains("created VirtualMachineExport export-vmsnapshot-snap-"),
        "{err}"
    );
    for (pvc, size) in [("exp-root", 6 * MIB), ("exp-data", 3 * MIB)] {
        let file = dir.join(format!("{pvc}.img"));
        assert_eq!(sha256_of(&file), reference_sha256(pvc, size), "{pvc}");
    }
    // The export asked for the snapshot (not the VM).
    let created = env
        .emulator
        .requests()
        .into_iter()
        .find(|r| r.method == "POST" && r.path.ends_with("/virtualmachineexports"))
        .unwrap();
    let body: Value = serde_json::from_str(&created.body).unwrap();
    assert_eq!(body["spec"]["source"]["kind"], "VirtualMachineSnapshot");
    assert_eq!(body["spec"]["source"]["apiGroup"], "snapshot.kubevirt.io");
    assert!(objects(&env, KV_EXPORTS).is_empty());
    eventually("the restore PVCs are collected", || {
        names(
            &env.emulator
                .objects("", "persistentvolumeclaims", Some("default")),
        ) == pvcs_before
    });
}

/// A source without volumes: the export ends `Skipped` (upstream's final phase), so the run
/// fails at once with the controller's reason, writes nothing, and removes the export and
/// token Secret it made (there is nothing to resume).
#[test]
fn kubevirt_sources_without_volumes_fail_with_the_reason() {
    let env = kubevirt(MIB, MIB);
    env.emulator.put_object(
        json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": "diskless", "namespace": "default"},
        "spec": {"runStrategy": "Halted", "template": {"spec": {"domain": {"devices": {}}}}}}),
    );
    put_vm_snapshot(&env, "empty", "diskless", json!([]));
    let secrets_before = names(&env.emulator.objects("", "secrets", Some("default")));
    for (target, reason) in [
        (
            "vmsnapshot/empty",
            "VirtualMachineSnapshot default/empty does not contain any volume snapshots",
        ),
        (
            "vm/diskless",
            "the source has no volumes to export (VMNoVolumes)",
        ),
    ] {
        let out_dir = env.dir.path().join(target.replace('/', "-"));
        let start = std::time::Instant::now();
        let out = export(
            &env,
            &[target, "-o", out_dir.to_str().unwrap(), "--timeout", "60s"],
        );
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{target}: {err}");
        assert!(err.contains("was skipped: "), "{target}: {err}");
        assert!(err.contains(reason), "{target}: {err}");
        assert!(!err.contains("resume with"), "{target}: {err}");
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "{target} waited"
        );
        assert!(!out_dir.exists(), "{target}");
        assert!(objects(&env, KV_EXPORTS).is_empty(), "{target}");
        assert_eq!(
            names(&env.emulator.objects("", "secrets", Some("default"))),
            secrets_before,
            "{target}"
        );
    }
}

/// A VirtualDiskSnapshot on Deckhouse.
fn put_vds(env: &Env, name: &str, disk: &str) {
    env.emulator.put_object(json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualDiskSnapshot",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"virtualDiskName": disk, "requiredConsistency": true},
        "status": {"phase": "Ready", "volumeSnapshotName": format!("{name}-vs"), "consistent": true}}));
}

/// `vds/NAME`: a DataExport of the VirtualDiskSnapshot whose data is the disk's, even while a
/// pod uses the disk's PVC.
#[test]
fn deckhouse_vds_exports_the_snapshot() {
    let size = 16 * MIB;
    let env = deckhouse(size);
    put_vds(&env, "big-snap", "big");
    // The disk is in use by a running VM's pod: a vd/ export would wait, a snapshot does not.
    env.emulator
        .put_object(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "virt-launcher-web-abcde", "namespace": "default"},
        "spec": {"nodeName": "node-1", "containers": [{"name": "compute", "image": "x"}],
            "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "vd-big-0001"}}]},
        "status": {"phase": "Running"}}));
    let file = env.dir.path().join("snap.img");
    let err = succeeded(&export(
        &env,
        &["vds/big-snap", "-o", file.to_str().unwrap()],
    ));
    assert!(err.contains("created DataExport de-vds-big-snap-"), "{err}");
    assert_eq!(sha256_of(&file), reference_sha256("vd-big-0001", size));
    let created = env
        .emulator
        .requests()
        .into_iter()
        .find(|r| r.method == "POST" && r.path.ends_with("/dataexports"))
        .unwrap();
    let body: Value = serde_json::from_str(&created.body).unwrap();
    assert_eq!(body["spec"]["targetRef"]["kind"], "VirtualDiskSnapshot");
    assert_eq!(body["spec"]["targetRef"]["name"], "big-snap");
    assert!(objects(&env, DATA_EXPORTS).is_empty());
}

/// No public URL: the run reaches the exporter at `status.url` through a port-forward to the
/// pod with that IP, verified against the DataExport's CA; a CA that did not sign the pod's
/// certificate is refused.
#[test]
fn deckhouse_without_public_url_uses_the_exporter_pod() {
    let size = 24 * MIB;
    let env = deckhouse(size);
    internal_only(&env, false);
    let file = env.dir.path().join("big.img");
    let err = succeeded(&export(&env, &["vd/big", "-o", file.to_str().unwrap()]));
    let route: Vec<&str> = err.lines().filter(|l| l.contains("reaching")).collect();
    assert_eq!(route.len(), 1, "{err}");
    assert!(
        route[0].contains("no public URL: reaching the exporter at https://10.244.")
            && route[0].contains(":8085 through a port-forward to pod de-vd-big-"),
        "{err}"
    );
    assert_eq!(sha256_of(&file), reference_sha256("vd-big-0001", size));
    let forwards = port_forwards(&env);
    assert!(
        !forwards.is_empty() && forwards.iter().all(|(_, s)| *s == 101),
        "{forwards:?}"
    );
    assert!(objects(&env, DATA_EXPORTS).is_empty());

    let env = deckhouse(MIB);
    internal_only(&env, true);
    let file = env.dir.path().join("big.img");
    let out = export(&env, &["vd/big", "-o", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("certificate is not trusted"),
        "{}",
        stderr(&out)
    );
    assert!(!file.exists());
    assert_eq!(objects(&env, DATA_EXPORTS).len(), 1);
}

/// Deckhouse: a wrong --checksum exits 1, leaves nothing under the final name and keeps the
/// DataExport; a successful run removes its own DataExport and leaves someone else's.
#[test]
fn deckhouse_checksum_mismatch_and_cleanup() {
    let env = deckhouse(4 * MIB);
    env.emulator.put_object(json!({"apiVersion": "storage-foundation.deckhouse.io/v1alpha1", "kind": "DataExport",
        "metadata": {"name": "someone-elses", "namespace": "default"},
        "spec": {"ttl": "1h", "targetRef": {"kind": "PersistentVolumeClaim", "name": "vd-big-0001"}}}));
    let file = env.dir.path().join("disk.img");
    let wrong = format!("sha256:{}", "0".repeat(64));
    let out = export(
        &env,
        &["vd/big", "-o", file.to_str().unwrap(), "--checksum", &wrong],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("checksum mismatch"), "{err}");
    assert!(err.contains("--reuse de-vd-big-"), "{err}");
    assert!(!file.exists());
    assert!(!env.dir.path().join("disk.img.sha256").exists());
    assert_eq!(objects(&env, DATA_EXPORTS).len(), 2);

    let right = format!("sha256:{}", reference_sha256("vd-big-0001", 4 * MIB));
    let other = env.dir.path().join("other.img");
    succeeded(&export(
        &env,
        &[
            "vd/big",
            "-o",
            other.to_str().unwrap(),
            "--checksum",
            &right,
        ],
    ));
    assert!(other.exists());
    // Its own DataExport is gone; the failed run's (kept for --reuse) and someone else's stay.
    let left = names(&objects(&env, DATA_EXPORTS));
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(left.contains(&"someone-elses".to_string()), "{left:?}");
}

/// A server whose export names a volume `../x`, an absolute path or `a/b` cannot make the
/// download write outside `-o DIR`: such names are refused before anything is written.
#[test]
fn hostile_volume_names_are_refused() {
    let env = kubevirt(MIB, MIB);
    let dir = env.dir.path().join("disks");
    let outside = env.dir.path().join("abs");
    for hostile in [
        "../escaped".to_string(),
        outside.to_str().unwrap().to_string(),
        "a/b".to_string(),
        "..".to_string(),
    ] {
        env.emulator.set_export_faults(ExportFaults {
            volume_name: Some(hostile.clone()),
            ..Default::default()
        });
        let out = export(&env, &["vm/exp", "-o", dir.to_str().unwrap()]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{hostile}: {err}");
        assert!(
            err.contains(&format!("{hostile:?}")) && err.contains("not a single file name"),
            "{hostile}: {err}"
        );
        let written: Vec<_> = walk(env.dir.path())
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "img" || e == "partial"))
            .collect();
        assert!(written.is_empty(), "{hostile}: {written:?}");
    }
}

/// Every file under `root`.
fn walk(root: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![];
    for entry in std::fs::read_dir(root).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// Deckhouse exporters take the kubeconfig's own credentials: kubectl vm sends them only to
/// the API server's host, never to another host a DataExport names, and never with
/// `--insecure` (an unverified peer).
#[test]
fn cluster_credentials_go_only_to_the_api_server_host() {
    let env = deckhouse(MIB);
    let file = env.dir.path().join("disk.img");
    let out = export(
        &env,
        &["vd/big", "-o", file.to_str().unwrap(), "--insecure"],
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--insecure") && err.contains("credentials"),
        "{err}"
    );
    assert!(
        objects(&env, DATA_EXPORTS).is_empty(),
        "refused before creating"
    );

    // The same export server published under another host name than the API server's: the
    // download goes through the API server to the exporter pod instead, and the credentials
    // never name `localhost`.
    env.emulator.set_export_faults(ExportFaults {
        public_host: Some("localhost".into()),
        ..Default::default()
    });
    let out = export(&env, &["vd/big", "-o", file.to_str().unwrap()]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("localhost") && err.contains("port-forward"),
        "the route is explained: {err}"
    );
    let hosts = env.emulator.export_authorized_hosts();
    assert!(!hosts.is_empty(), "the exporter pod took the credentials");
    assert!(
        hosts.iter().all(|h| h != "localhost"),
        "credentials went to the public host: {hosts:?}"
    );
    assert_eq!(sha256_of(&file), reference_sha256("vd-big-0001", MIB));
    std::fs::remove_file(&file).unwrap();

    // Under the API server's host name the public URL is used, with the credentials.
    env.emulator.set_export_faults(ExportFaults::default());
    let before = env.emulator.export_authorized_hosts().len();
    succeeded(&export(&env, &["vd/big", "-o", file.to_str().unwrap()]));
    let hosts = env.emulator.export_authorized_hosts();
    assert!(hosts.len() > before);
    assert!(
        hosts[before..].iter().all(|h| h == "127.0.0.1"),
        "{hosts:?}"
    );
    assert_eq!(sha256_of(&file), reference_sha256("vd-big-0001", MIB));
}

/// A server that answers every download with 416 or 204 (nothing to start over from) makes
/// the export fail after a bounded number of requests instead of asking again in a loop.
#[test]
fn unusable_answers_end_the_export_instead_of_looping() {
    for code in [416u16, 204] {
        let env = kubevirt(MIB, MIB);
        env.emulator.set_export_faults(ExportFaults {
            answer_status: Some(code),
            ..Default::default()
        });
        let file = env.dir.path().join("disk.img");
        let out = export(
            &env,
            &[
                "pvc/exp-root",
                "-o",
                file.to_str().unwrap(),
                "--retries",
                "3",
            ],
        );
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{code}: {err}");
        assert!(err.contains(&code.to_string()), "{code}: {err}");
        assert!(
            env.emulator.export_requests() <= 4,
            "{code}: {} requests",
            env.emulator.export_requests()
        );
    }
}

/// `-o DIR` for a single volume puts `DIR/<volume>.img` inside the directory.
#[test]
fn one_volume_into_an_existing_directory() {
    let env = kubevirt(2 * MIB, MIB);
    let dir = env.dir.path().join("out");
    std::fs::create_dir(&dir).unwrap();
    succeeded(&export(
        &env,
        &["pvc/exp-root", "-o", dir.to_str().unwrap()],
    ));
    assert_eq!(
        sha256_of(&dir.join("exp-root.img")),
        reference_sha256("exp-root", 2 * MIB)
    );
    assert!(!dir.join(".partial").exists());
}
