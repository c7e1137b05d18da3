//! `image create NAME --file PATH` on both platforms: the file goes through the upload path
//! into a DataVolume with source upload and the DataSource naming its PVC (KubeVirt), or into
//! a VirtualImage / ClusterVirtualImage with dataSource Upload (Deckhouse); the image becomes
//! Ready and a VM boots from it. The bytes the platform holds are compared with
//! `qemu-img convert -O raw` and `sha256sum` of the file, never with what the tool says. Bad
//! files are refused before any request. Also `--registry --schedule` (a CDI DataImportCron).

use serde_json::{Value, json};

use crate::common::{Env, fails, ok, stderr, stdout, table};
use crate::export::sha256_of;
use crate::lifecycle::eventually;
use crate::upload::{qcow2, reference};
use crate::upload_deckhouse::vm as vm_trusting;

const MIB: u64 = 1 << 20;

fn kubectl_json(env: &Env, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    serde_json::from_str(&ok(env.kubectl(&all))).unwrap()
}

fn row(list: &str, name: &str) -> Option<Vec<String>> {
    table(list)
        .into_iter()
        .find(|r| r.first().map(String::as_str) == Some(name))
}

#[test]
fn kubevirt_image_from_a_file_is_ready_holds_the_bytes_and_boots_a_vm() {
    let env = Env::kubevirt();
    let dir = env.dir.path();
    let image = qcow2(dir, 8 * MIB);
    let want = reference(&image, dir);
    let out = env.vm(&[
        "image",
        "create",
        "golden",
        "--file",
        image.to_str().unwrap(),
        "--timeout",
        "120s",
    ]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    // The size is the volume the upload asked for: the image's virtual size in bytes.
    assert_eq!(
        stdout(&out),
        format!("image ds/golden created; ready (raw, {})\n", 8 * MIB)
    );
    // The upload's own progress and digest: the sha256 of the file as sha256sum prints it.
    assert!(err.contains("image: qcow2"), "{err}");
    assert!(
        err.contains(&format!("sha256:{}", sha256_of(&image))),
        "{err}"
    );
    // What CDI holds: the DataVolume with source upload, the DataSource naming its PVC,
    // ready, both labelled as ours.
    let dv = kubectl_json(&env, &["get", "datavolume", "golden"]);
    assert_eq!(dv["spec"]["source"], json!({"upload": {}}));
    assert_eq!(dv["status"]["phase"], "Succeeded");
    assert_eq!(
        dv["spec"]["storage"]["resources"]["requests"]["storage"],
        (8 * MIB).to_string()
    );
    let ds = kubectl_json(&env, &["get", "datasource", "golden"]);
    assert_eq!(
        ds["spec"]["source"]["pvc"],
        json!({"name": "golden", "namespace": "default"})
    );
    for obj in [&dv, &ds] {
        assert_eq!(
            obj["metadata"]["labels"]["app.kubernetes.io/managed-by"],
            "kubectl-vm"
        );
    }
    let list = ok(env.vm(&["image", "list"]));
    assert_eq!(
        row(&list, "golden").unwrap()[1..6],
        ["ds", "upload", "raw", &(8 * MIB).to_string(), "Ready"]
    );
    // The bytes in the PVC, exported, are the qcow2 converted to raw by qemu-img.
    let exported = dir.join("golden.img");
    ok(env.vm(&["export", "pvc/golden", "-o", exported.to_str().unwrap()]));
    assert_eq!(sha256_of(&exported), want);
    // A VM boots from it.
    let out = env.vm(&[
        "create",
        "gold1",
        "--image",
        "ds/golden",
        "--timeout",
        "60s",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let vm = kubectl_json(&env, &["get", "vm", "gold1"]);
    assert_eq!(
        vm["spec"]["dataVolumeTemplates"][0]["spec"]["sourceRef"],
        json!({"kind": "DataSource", "name": "golden", "namespace": "default"})
    );
    eventually("gold1 runs", || {
        env.emulator
            .objects("kubevirt.io", "virtualmachineinstances", Some("default"))
            .iter()
            .any(|o| o["metadata"]["name"] == "gold1" && o["status"]["phase"] == "Running")
    });
}

#[test]
fn deckhouse_image_from_a_file_is_ready_holds_the_bytes_and_boots_a_vm() {
    let env = Env::deckhouse();
    let dir = env.dir.path();
    let image = qcow2(dir, 8 * MIB);
    let want = reference(&image, dir);
    let file_sum = sha256_of(&image);
    for (args, kind, name) in [
        (vec!["-n", "dev"], "virtualimage", "up-vi"),
        (vec!["--cluster-wide"], "clustervirtualimage", "up-cvi"),
        (
            vec!["-n", "dev", "--storage", "pvc", "--storage-class", "nfs"],
            "virtualimage",
            "up-vi-pvc",
        ),
    ] {
        let mut all = vec!["image", "create", name, "--file", image.to_str().unwrap()];
        all.extend(args.iter().copied());
        let out = vm_trusting(&env, &all);
        let err = stderr(&out);
        assert!(out.status.success(), "{err}");
        let short = if kind == "virtualimage" { "vi" } else { "cvi" };
        assert!(
            stdout(&out).starts_with(&format!("image {short}/{name} created; ready")),
            "{}",
            stdout(&out)
        );
        assert!(
            err.contains(&format!("sha256 (checked by the platform): {file_sum}")),
            "{err}"
        );
        let mut get = vec!["get", kind, name];
        if kind == "virtualimage" {
            get.extend(["-n", "dev"]);
        }
        let obj = kubectl_json(&env, &get);
        assert_eq!(obj["status"]["phase"], "Ready");
        assert_eq!(obj["spec"]["dataSource"]["type"], "Upload");
        assert_eq!(
            obj["spec"]["dataSource"]["upload"]["checksum"]["sha256"],
            file_sum.as_str()
        );
        assert_eq!(
            obj["metadata"]["labels"]["app.kubernetes.io/managed-by"],
            "kubectl-vm"
        );
        // What DVCR holds is the qcow2 converted to raw by qemu-img.
        let uid = obj["metadata"]["uid"].as_str().unwrap();
        assert_eq!(
            sha256_of(&env.emulator.uploaded_image(uid).expect("the image's data")),
            want
        );
    }
    // Kept on a PVC of the class asked for, as an image imported from a URL would be; the
    // default stays DVCR.
    let on_pvc = kubectl_json(&env, &["get", "virtualimage", "up-vi-pvc", "-n", "dev"]);
    assert_eq!(on_pvc["spec"]["storage"], "PersistentVolumeClaim");
    assert_eq!(
        on_pvc["spec"]["persistentVolumeClaim"]["storageClassName"],
        "nfs"
    );
    assert!(
        on_pvc["status"]["target"]["persistentVolumeClaimName"]
            .as_str()
            .is_some_and(|n| n.starts_with("vi-up-vi-pvc-")),
        "{on_pvc}"
    );
    let in_dvcr = kubectl_json(&env, &["get", "virtualimage", "up-vi", "-n", "dev"]);
    assert_eq!(in_dvcr["spec"]["storage"], "ContainerRegistry");
    // Storage that means nothing for the image is refused before anything is written (the
    // platform is known first: these flags are Deckhouse's).
    env.emulator.clear_requests();
    let path = image.to_str().unwrap();
    for (args, want) in [
        (
            vec!["--cluster-wide", "--storage", "pvc"],
            "Error: --storage and --storage-class are for a VirtualImage; a ClusterVirtualImage is always kept in DVCR",
        ),
        (
            vec!["--storage", "dvcr", "--storage-class", "nfs"],
            "Error: --storage-class is for --storage pvc; DVCR has no storage class",
        ),
    ] {
        let mut all = vec!["image", "create", "x", "--file", path];
        all.extend(args);
        assert_eq!(fails(&env, &all, 2), want);
    }
    let writes: Vec<_> = env
        .emulator
        .requests()
        .into_iter()
        .filter(|r| r.method != "GET")
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert!(writes.is_empty(), "{writes:?}");
    let list = ok(env.vm(&["-n", "dev", "image", "list"]));
    assert_eq!(row(&list, "up-vi").unwrap()[1..3], ["vi", "upload"]);
    // A VM boots from the namespaced one.
    let out = env.vm(&[
        "-n",
        "dev",
        "create",
        "up1",
        "--image",
        "vi/up-vi",
        "--timeout",
        "60s",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    eventually("up1 runs", || {
        kubectl_json(&env, &["-n", "dev", "get", "virtualmachine", "up1"])["status"]["phase"]
            == "Running"
    });
}

#[test]
fn bad_files_are_refused_before_any_request() {
    for env in [Env::kubevirt(), Env::deckhouse()] {
        let dir = env.dir.path();
        let text = dir.join("notes.txt");
        std::fs::write(&text, "not a disk image\n".repeat(64)).unwrap();
        let missing = dir.join("missing.qcow2");
        env.emulator.clear_requests();
        let err = fails(
            &env,
            &["image", "create", "x", "--file", text.to_str().unwrap()],
            2,
        );
        assert_eq!(
            err,
            format!(
                "Error: {}: unknown image format (not qcow2, raw with a partition table, ISO, VMDK, VHD, VHDX, gzip or xz); use --format raw to upload it as a raw disk",
                text.display()
            )
        );
        let err = fails(
            &env,
            &["image", "create", "x", "--file", missing.to_str().unwrap()],
            2,
        );
        assert!(
            err.starts_with(&format!("Error: cannot read {}: ", missing.display())),
            "{err}"
        );
        // A file and a URL at once: clap's usage error.
        let out = env.vm(&[
            "image",
            "create",
            "x",
            "--file",
            text.to_str().unwrap(),
            "--url",
            "https://h/x",
        ]);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(
            env.emulator.requests().is_empty(),
            "{:?}",
            env.emulator.requests()
        );
    }
}

#[test]
fn a_failed_kubevirt_upload_leaves_neither_the_data_volume_nor_the_data_source() {
    let env = Env::kubevirt();
    let dir = env.dir.path();
    // 8 MiB of raw data, gzip-compressed: its size is known only once unpacked, and CDI
    // refuses it in a 4 MiB volume.
    let raw = dir.join("disk.raw");
    crate::upload::noise(&raw, 8 * MIB);
    crate::upload::sh(
        std::process::Command::new("gzip")
            .args(["-1", "-k"])
            .arg(&raw),
    );
    let gz = dir.join("disk.raw.gz");
    let out = env.vm(&[
        "image",
        "create",
        "broken",
        "--file",
        gz.to_str().unwrap(),
        "--size",
        "4Mi",
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("is larger than the reported available storage"),
        "{err}"
    );
    assert!(err.contains("deleted DataVolume broken"), "{err}");
    let left = ok(env.kubectl(&["get", "datasources,datavolumes", "-o", "name"]));
    assert!(!left.contains("/broken\n"), "{left}");
}

/// `image create --registry --schedule` on KubeVirt: a DataImportCron; CDI (the emulator's
/// controller) imports at once and makes the DataSource, which the list shows Ready with the
/// cron's schedule. Bad schedules and non-registry sources are refused before any request;
/// Deckhouse has no scheduled imports.
#[test]
fn a_scheduled_image_is_a_data_import_cron_and_its_data_source_is_listed_ready() {
    let env = Env::kubevirt();
    let out = env.vm(&[
        "image",
        "create",
        "fedora",
        "--registry",
        "quay.io/containerdisks/fedora:41",
        "--schedule",
        "0 3 * * *",
        "--size",
        "1Gi",
        "--timeout",
        "60s",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).starts_with("image ds/fedora created; ready"),
        "{}",
        stdout(&out)
    );
    let cron = kubectl_json(&env, &["get", "dataimportcron", "fedora"]);
    assert_eq!(
        cron["spec"],
        json!({"schedule": "0 3 * * *", "managedDataSource": "fedora",
            "importsToKeep": 3, "garbageCollect": "Outdated",
            "template": {"spec": {
                "source": {"registry": {"url": "docker://quay.io/containerdisks/fedora:41"}},
                "storage": {"resources": {"requests": {"storage": "1Gi"}}}}}})
    );
    let pvc = cron["status"]["lastImportedPVC"]["name"].as_str().unwrap();
    let ds = kubectl_json(&env, &["get", "datasource", "fedora"]);
    assert_eq!(ds["spec"]["source"]["pvc"]["name"], pvc);
    let list = ok(env.vm(&["image", "list"]));
    let line = list
        .lines()
        .find(|l| l.starts_with("fedora "))
        .unwrap_or_else(|| panic!("{list}"));
    assert!(
        line.contains("cron(0 3 * * *) registry quay.io/containerdisks/fedora@sha256:"),
        "{line}"
    );
    assert!(line.contains(" Ready "), "{line}");

    env.emulator.clear_requests();
    for (args, want) in [
        (
            vec!["--registry", "quay.io/x:1", "--schedule", "0 3 * *"],
            "Error: --schedule \"0 3 * *\": a cron schedule has 5 fields (minute hour day-of-month month day-of-week); got 4",
        ),
        (
            vec!["--registry", "quay.io/x:1", "--schedule", "61 3 * * *"],
            "Error: --schedule \"61 3 * * *\": the minute field \"61\" is not valid (0-59, *, ranges A-B, lists A,B, steps /N)",
        ),
        (
            vec!["--url", "https://h/x.qcow2", "--schedule", "0 3 * * *"],
            "Error: --schedule imports from a registry (--registry IMAGE): CDI's DataImportCron takes no other source",
        ),
    ] {
        let mut all = vec!["image", "create", "x"];
        all.extend(args);
        assert_eq!(fails(&env, &all, 2), want);
    }
    assert!(
        env.emulator.requests().is_empty(),
        "{:?}",
        env.emulator.requests()
    );

    let env = Env::deckhouse();
    let err = fails(
        &env,
        &[
            "image",
            "create",
            "x",
            "--registry",
            "quay.io/x:1",
            "--schedule",
            "0 3 * * *",
        ],
        2,
    );
    assert!(
        err.contains("Deckhouse virtualization has no scheduled imports"),
        "{err}"
    );
    assert!(
        !env.emulator.requests().iter().any(|r| r.method != "GET"),
        "{:?}",
        env.emulator.requests()
    );
}
