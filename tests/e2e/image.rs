//! `image list|get|create|delete` end to end on both platforms: an image imported from a URL
//! shows its progress in the list and boots a VM; a failing import reports the platform's
//! reason; delete is refused while a VM's disk is being made from the image and never touches
//! an image kubectl vm did not make; the same name in two namespaces stays two images; bad
//! URLs and checksums are refused before any request. What the platform holds is read back
//! with real kubectl.

use serde_json::{Value, json};

use crate::common::{Env, fails, ok, stderr, stdout, table};
use crate::lifecycle::eventually;

/// The digest of the empty file, as `sha256sum /dev/null` prints it.
const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

fn kubectl_json(env: &Env, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    serde_json::from_str(&ok(env.kubectl(&all))).unwrap()
}

/// The requests that change something.
fn changes(env: &Env) -> Vec<(String, String)> {
    env.emulator
        .requests()
        .into_iter()
        .filter(|r| r.method != "GET")
        .map(|r| (r.method.clone(), r.path.clone()))
        .collect()
}

/// The row of `name` in `image list` output (cells split on whitespace).
fn row(list: &str, name: &str) -> Option<Vec<String>> {
    table(list)
        .into_iter()
        .find(|r| r.first().map(String::as_str) == Some(name))
}

#[test]
fn kubevirt_image_from_a_url_shows_progress_then_boots_a_vm() {
    let env = Env::kubevirt();
    let out = env.vm(&[
        "image",
        "create",
        "fedora",
        "--url",
        "https://images.example/fedora.qcow2",
        "--checksum",
        &format!("sha256:{EMPTY_SHA256}"),
        "--size",
        "2Gi",
        "--no-wait",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "image ds/fedora created; not waited for: see `kubectl vm image list`\n"
    );
    // While it imports, the row shows CDI's phase with its progress.
    let mut seen_progress = String::new();
    eventually("progress in the list", || {
        let list = ok(env.vm(&["image", "list"]));
        let r = row(&list, "fedora").unwrap_or_default();
        if r.get(5).map(String::as_str) == Some("ImportInProgress")
            && r.get(6).is_some_and(|p| p.ends_with('%'))
        {
            seen_progress = r[6].clone();
            true
        } else {
            false
        }
    });
    assert!(seen_progress.ends_with('%'));
    eventually("ready", || {
        row(&ok(env.vm(&["image", "list"])), "fedora")
            .is_some_and(|r| r.get(5).map(String::as_str) == Some("Ready"))
    });
    let list = ok(env.vm(&["image", "list"]));
    assert_eq!(
        row(&list, "fedora").unwrap()[1..5],
        ["ds", "https://images.example/fedora.qcow2", "raw", "2Gi"]
    );
    // What CDI holds, seen with kubectl: the DataVolume with CDI's checksum form, the
    // DataSource naming its PVC and ready, both labelled as ours.
    let dv = kubectl_json(&env, &["get", "datavolume", "fedora"]);
    assert_eq!(
        dv["spec"]["source"]["http"]["checksum"],
        format!("sha256:{EMPTY_SHA256}")
    );
    let ds = kubectl_json(&env, &["get", "datasource", "fedora"]);
    assert_eq!(
        ds["spec"]["source"]["pvc"],
        json!({"name": "fedora", "namespace": "default"})
    );
    assert_eq!(
        ds["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "kubectl-vm"
    );
    let ready = ds["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap();
    assert_eq!(ready["status"], "True");
    // -o name as kubectl prints it.
    assert_eq!(
        ok(env.vm(&["image", "get", "ds/fedora", "-o", "name"])),
        ok(env.kubectl(&["get", "datasource", "fedora", "-o", "name"]))
    );
    // A VM boots from it: its boot DataVolume clones the DataSource.
    let out = env.vm(&["create", "web2", "--image", "ds/fedora", "--timeout", "60s"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let vm = kubectl_json(&env, &["get", "vm", "web2"]);
    assert_eq!(
        vm["spec"]["dataVolumeTemplates"][0]["spec"]["sourceRef"],
        json!({"kind": "DataSource", "name": "fedora", "namespace": "default"})
    );
    eventually("web2 runs", || {
        env.emulator
            .objects("kubevirt.io", "virtualmachineinstances", Some("default"))
            .iter()
            .any(|o| o["metadata"]["name"] == "web2" && o["status"]["phase"] == "Running")
    });
    // Now that the VM's disk is made, the image can go; the VM is named.
    let out = env.vm(&["image", "delete", "fedora"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "datasource.cdi.kubevirt.io/fedora deleted\ndatavolume.cdi.kubevirt.io/fedora deleted\n"
    );
    assert!(
        stderr(&out).contains("still named by VMs web2.default"),
        "{}",
        stderr(&out)
    );
    let left = ok(env.kubectl(&["get", "datasources,datavolumes", "-o", "name"]));
    assert!(!left.contains("/fedora\n"), "{left}");
}

#[test]
fn deckhouse_image_from_a_url_shows_progress_then_boots_a_vm() {
    let env = Env::deckhouse();
    let out = env.vm(&[
        "-n",
        "dev",
        "image",
        "create",
        "debian",
        "--url",
        "https://images.example/debian.qcow2",
        "--checksum",
        "md5:d41d8cd98f00b204e9800998ecf8427e",
        "--no-wait",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    eventually("progress in the list", || {
        let r = row(&ok(env.vm(&["-n", "dev", "image", "list"])), "debian").unwrap_or_default();
        r.get(5).map(String::as_str) == Some("Provisioning")
            && r.get(6).is_some_and(|p| p.ends_with('%') && p != "0%")
    });
    // --wait on what exists: `image get` until Ready, then the row.
    eventually("ready", || {
        row(
            &ok(env.vm(&["-n", "dev", "image", "get", "vi/debian"])),
            "debian",
        )
        .is_some_and(|r| r.get(5).map(String::as_str) == Some("Ready"))
    });
    let vi = kubectl_json(&env, &["-n", "dev", "get", "virtualimage", "debian"]);
    assert_eq!(
        vi["spec"]["dataSource"]["http"]["checksum"],
        json!({"md5": "d41d8cd98f00b204e9800998ecf8427e"})
    );
    let list = ok(env.vm(&["-n", "dev", "image", "list"]));
    let r = row(&list, "debian").unwrap();
    assert_eq!(
        r[1..5],
        [
            "vi",
            "https://images.example/debian.qcow2",
            vi["status"]["format"].as_str().unwrap(),
            vi["status"]["size"]["unpacked"].as_str().unwrap()
        ]
    );
    // The cluster-wide image of the fixture is listed with the namespace's.
    assert_eq!(row(&list, "ubuntu-24-04").unwrap()[1], "cvi");
    // A VM boots from it.
    let out = env.vm(&[
        "-n",
        "dev",
        "create",
        "deb1",
        "--image",
        "vi/debian",
        "--timeout",
        "60s",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    eventually("deb1 runs", || {
        kubectl_json(&env, &["-n", "dev", "get", "virtualmachine", "deb1"])["status"]["phase"]
            == "Running"
    });
}

#[test]
fn a_failing_import_reports_the_platforms_reason() {
    // RFC 2606: `.invalid` never resolves; the importers fail to connect.
    let env = Env::kubevirt();
    let out = env.vm(&[
        "image",
        "create",
        "bad",
        "--url",
        "https://mirror.invalid/x.img",
        "--timeout",
        "30s",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("the import of image bad fails: Unable to connect to http data source")
            && err.contains("no such host"),
        "{err}"
    );
    // CDI's own account: the Running condition of the DataVolume.
    let dv = kubectl_json(&env, &["get", "datavolume", "bad"]);
    let running = dv["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Running")
        .unwrap()
        .clone();
    assert_eq!(running["reason"], "Error");
    assert!(err.contains(running["message"].as_str().unwrap()), "{err}");
    let wide = ok(env.vm(&["image", "list", "-o", "wide"]));
    assert!(wide.contains("no such host"), "{wide}");

    let env = Env::deckhouse();
    let out = env.vm(&[
        "image",
        "create",
        "bad",
        "--cluster-wide",
        "--url",
        "https://mirror.invalid/x.img",
        "--timeout",
        "30s",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let cvi = kubectl_json(&env, &["get", "clustervirtualimage", "bad"]);
    assert_eq!(cvi["status"]["phase"], "Failed");
    let ready = cvi["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap()
        .clone();
    assert_eq!(ready["reason"], "ProvisioningFailed");
    assert!(
        stderr(&out).contains(&format!(
            "image cvi/bad Failed: {}",
            ready["message"].as_str().unwrap()
        )),
        "{}",
        stderr(&out)
    );
}

#[test]
fn delete_is_refused_while_a_vm_is_being_created_from_the_image() {
    let env = Env::with_step(
        kubevm_emulator::ServeFlavor::Deckhouse,
        "deckhouse.yaml",
        std::time::Duration::from_millis(20),
    );
    ok(env.vm(&[
        "-n",
        "dev",
        "image",
        "create",
        "base",
        "--registry",
        "registry.example/base:1",
        "--timeout",
        "30s",
    ]));
    // A VM whose disk is still being made from the image (WaitForFirstConsumer storage,
    // the VM stopped: the disk waits).
    let file = env.dir.path().join("vd.json");
    std::fs::write(
        &file,
        json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualDisk",
            "metadata": {"name": "from-base", "namespace": "dev"},
            "spec": {"dataSource": {"type": "ObjectRef", "objectRef": {"kind": "VirtualImage", "name": "base"}},
                     "persistentVolumeClaim": {"size": "5Gi", "storageClassName": "local-path"}}})
        .to_string(),
    )
    .unwrap();
    ok(env.kubectl(&["create", "-f", file.to_str().unwrap()]));
    eventually("the disk waits", || {
        kubectl_json(&env, &["-n", "dev", "get", "virtualdisk", "from-base"])["status"]["phase"]
            == "WaitForFirstConsumer"
    });
    env.emulator.clear_requests();
    let err = fails(&env, &["-n", "dev", "image", "delete", "vi/base"], 1);
    assert_eq!(
        err,
        "Error: image vi/dev/base is being used to create virtualdisk dev/from-base: it is not deleted (try again once they are ready)"
    );
    assert!(changes(&env).is_empty(), "{:?}", changes(&env));
    // Once the disk is gone the image can be deleted: with its uid as a precondition.
    ok(env.kubectl(&["-n", "dev", "delete", "virtualdisk", "from-base"]));
    let uid = kubectl_json(&env, &["-n", "dev", "get", "virtualimage", "base"])["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    env.emulator.clear_requests();
    ok(env.vm(&["-n", "dev", "image", "delete", "base"]));
    let deletes: Vec<_> = env
        .emulator
        .requests()
        .into_iter()
        .filter(|r| r.method == "DELETE")
        .collect();
    assert_eq!(deletes.len(), 1);
    assert!(
        deletes[0]
            .path
            .ends_with("/namespaces/dev/virtualimages/base")
    );
    assert!(deletes[0].body.contains(&uid), "{}", deletes[0].body);
}

#[test]
fn an_image_kubectl_vm_did_not_make_is_never_deleted() {
    let env = Env::deckhouse();
    env.emulator.clear_requests();
    let err = fails(&env, &["image", "delete", "cvi/ubuntu-24-04"], 1);
    assert_eq!(
        err,
        "Error: image cvi/ubuntu-24-04 was not made by kubectl vm; it is left as it is (nothing was deleted)"
    );
    assert!(changes(&env).is_empty());

    let env = Env::kubevirt();
    env.emulator.put_object(json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataSource",
        "metadata": {"name": "centos", "namespace": "default"},
        "spec": {"source": {"pvc": {"name": "centos", "namespace": "default"}}}}));
    env.emulator.clear_requests();
    let err = fails(&env, &["image", "delete", "centos"], 1);
    assert_eq!(
        err,
        "Error: datasource \"centos\" in namespace \"default\" was not made by kubectl vm; it is left as it is (nothing was deleted)"
    );
    assert!(changes(&env).is_empty());
    assert!(ok(env.kubectl(&["get", "datasource", "centos", "-o", "name"])).contains("centos"));
}

#[test]
fn the_same_name_in_two_namespaces_is_two_images() {
    let env = Env::with_step(
        kubevm_emulator::ServeFlavor::KubeVirt,
        "kubevirt.yaml",
        std::time::Duration::from_millis(20),
    );
    for ns in ["default", "dev"] {
        ok(env.vm(&[
            "-n",
            ns,
            "image",
            "create",
            "alpine",
            "--registry",
            "quay.io/containerdisks/alpine:3",
            "--timeout",
            "30s",
        ]));
    }
    let all = ok(env.vm(&["image", "list", "-A"]));
    let rows: Vec<Vec<String>> = table(&all)
        .into_iter()
        .filter(|r| r.get(1).map(String::as_str) == Some("alpine"))
        .collect();
    assert_eq!(rows.len(), 2, "{all}");
    assert_eq!(rows[0][0], "default");
    assert_eq!(rows[1][0], "dev");
    assert_eq!(rows[0][3], "registry");
    assert_eq!(rows[0][4], "quay.io/containerdisks/alpine:3");
    // As kubectl sees them.
    let kubectl = ok(env.kubectl(&["get", "datasources", "-A", "--no-headers"]));
    assert_eq!(kubectl.lines().filter(|l| l.contains("alpine")).count(), 2);
    // Deleting one in dev leaves default's.
    ok(env.vm(&["-n", "dev", "image", "delete", "alpine"]));
    let all = ok(env.vm(&["image", "list", "-A", "-o", "name"]));
    assert_eq!(all, "datasource.cdi.kubevirt.io/alpine\n");
    assert!(
        ok(env.kubectl(&["-n", "default", "get", "datasource", "alpine", "-o", "name"]))
            .contains("alpine")
    );
    // -l selects by label.
    let labelled = ok(env.vm(&[
        "image",
        "list",
        "-A",
        "-l",
        "app.kubernetes.io/managed-by=kubectl-vm",
        "-o",
        "name",
    ]));
    assert_eq!(labelled, "datasource.cdi.kubevirt.io/alpine\n");
}

#[test]
fn bad_urls_and_checksums_are_refused_before_any_request() {
    for env in [Env::kubevirt(), Env::deckhouse()] {
        env.emulator.clear_requests();
        for (args, want) in [
            (
                vec!["image", "create", "x", "--url", "ftp://host/x.img"],
                "Error: --url \"ftp://host/x.img\": the URL must start with http:// or https://",
            ),
            (
                vec!["image", "create", "x", "--url", "https:///x.img"],
                "Error: --url \"https:///x.img\": the URL has no host",
            ),
            (
                vec![
                    "image",
                    "create",
                    "x",
                    "--url",
                    "https://h/x",
                    "--checksum",
                    "sha256:abc",
                ],
                "Error: invalid checksum \"sha256:abc\": a sha256 digest is 64 hex digits (0-9, a-f); got 3 characters",
            ),
            (
                vec!["image", "create", "Bad_Name", "--url", "https://h/x"],
                "",
            ),
            (
                vec!["image", "get", "xx/name"],
                "Error: image \"xx/name\": unknown kind \"xx\" (one of vi, cvi, ds, pvc, vd, vds)",
            ),
            (
                vec!["image", "delete", "cvi/ns/x"],
                "Error: image \"cvi/ns/x\": a ClusterVirtualImage has no namespace",
            ),
        ] {
            let err = fails(&env, &args, 2);
            if !want.is_empty() {
                assert_eq!(err, want, "{args:?}");
            }
        }
        assert!(
            env.emulator.requests().is_empty(),
            "{:?}",
            env.emulator.requests()
        );
    }
}

/// `image list -w`: the listing, then a row per change (the import's progress, Ready, the
/// deletion), read as the lines arrive.
#[test]
fn watch_prints_each_change_of_an_image() {
    use std::io::{BufRead, BufReader};
    use std::sync::mpsc;
    let env = Env::deckhouse();
    let mut child = env.spawn(&["-n", "dev", "image", "list", "-w"]);
    let (tx, lines) = mpsc::channel();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let next = || {
        lines
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("a line from image list -w within 20s")
    };
    assert!(next().starts_with("NAME "));
    assert!(next().starts_with("ubuntu-24-04 "));
    ok(env.vm(&[
        "-n",
        "dev",
        "image",
        "create",
        "w",
        "--url",
        "https://images.example/w.qcow2",
        "--no-wait",
    ]));
    let mut phases = vec![];
    loop {
        let r = table(&next()).remove(0);
        assert_eq!(r[0], "w", "{r:?}");
        phases.push(r[5..r.len() - 1].join(" "));
        if r[5] == "Ready" {
            break;
        }
    }
    assert!(
        phases
            .iter()
            .any(|p| p.starts_with("Provisioning ") && p.ends_with('%')),
        "{phases:?}"
    );
    ok(env.kubectl(&["-n", "dev", "delete", "virtualimage", "w"]));
    let r = table(&next()).remove(0);
    assert_eq!((r[0].as_str(), r[5].as_str()), ("w", "Deleted"));
    let _ = child.kill();
    let _ = child.wait();
}
