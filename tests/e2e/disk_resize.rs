//! `disk resize` end to end: KubeVirt grows the claim behind the disk (one merge PATCH of
//! `spec.resources.requests.storage`, FACTS: PVC expansion), Deckhouse the VirtualDisk (one
//! merge PATCH of `spec.persistentVolumeClaim.size`, FACTS §12 `Resizing`); sizes read back with
//! real kubectl; refusals (smaller size, a class without `allowVolumeExpansion`) send nothing.

use kubevm_emulator::ServeFlavor;
use serde_json::Value;

use crate::common::{Env, changes, fails, ok, stderr, stdout};

/// A StorageClass that binds at once and lets claims grow.
fn expandable_class(env: &Env) {
    let path = env.dir.path().join("class.yaml");
    std::fs::write(
        &path,
        "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {name: expandable}\nprovisioner: example.org/csi\nvolumeBindingMode: Immediate\nallowVolumeExpansion: true\n",
    )
    .unwrap();
    ok(env.kubectl(&["apply", "-f", path.to_str().unwrap()]));
}

fn jsonpath(env: &Env, args: &[&str], path: &str) -> String {
    let mut all = args.to_vec();
    let expr = format!("jsonpath={path}");
    all.extend(["-o", &expr]);
    ok(env.kubectl(&all))
}

#[test]
fn kubevirt_resize_grows_the_claim() {
    let env = Env::kubevirt();
    expandable_class(&env);
    ok(env.vm(&[
        "disk",
        "attach",
        "web",
        "data",
        "--size",
        "1Gi",
        "--storage-class",
        "expandable",
    ]));
    env.emulator.clear_requests();
    // A client dry run sends nothing and shows the patch.
    let out = env.vm(&[
        "disk",
        "resize",
        "web",
        "data",
        "--size",
        "2Gi",
        "--dry-run",
        "-o",
        "json",
    ]);
    let patch: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(
        patch["spec"]["resources"]["requests"]["storage"],
        "2Gi",
        "{}",
        stderr(&out)
    );
    assert!(changes(&env).is_empty());
    let out = env.vm(&["disk", "resize", "web", "data", "--size", "2Gi"]);
    assert_eq!(
        stdout(&out),
        "disk data of web.default grown from 1Gi to 2Gi; the running guest sees it after a restart (KubeVirt's ExpandDisks feature gate is off)\n",
        "{}",
        stderr(&out)
    );
    let wire = changes(&env);
    assert_eq!(wire.len(), 1, "{wire:#?}");
    assert_eq!(
        (wire[0].0.as_str(), wire[0].1.as_str()),
        (
            "PATCH",
            "/api/v1/namespaces/default/persistentvolumeclaims/data"
        )
    );
    let body = wire[0].2.clone().unwrap();
    assert_eq!(body["spec"]["resources"]["requests"]["storage"], "2Gi");
    assert_eq!(
        jsonpath(&env, &["get", "pvc", "data"], "{.status.capacity.storage}"),
        "2Gi"
    );
    // Not larger: refused before any request.
    env.emulator.clear_requests();
    let err = fails(&env, &["disk", "resize", "web", "data", "--size", "2Gi"], 2);
    assert_eq!(
        err,
        "Error: --size 2Gi is not larger than disk data's 2Gi: a disk only grows (nothing was changed)"
    );
    // local-path (the fixture's class) does not allow expansion.
    let err = fails(
        &env,
        &["disk", "resize", "fedora-dv", "rootdisk", "--size", "11Gi"],
        2,
    );
    assert_eq!(
        err,
        "Error: disk rootdisk cannot grow: StorageClass local-path does not allow volume expansion (allowVolumeExpansion is not true); nothing was changed"
    );
    let err = fails(&env, &["disk", "resize", "web", "nope", "--size", "3Gi"], 2);
    assert!(err.contains("has no disk \"nope\""), "{err}");
    assert!(changes(&env).is_empty(), "{:#?}", changes(&env));
    assert_eq!(
        jsonpath(
            &env,
            &["get", "pvc", "fedora-dv-root"],
            "{.spec.resources.requests.storage}"
        ),
        "10Gi"
    );
}

#[test]
fn deckhouse_resize_grows_the_virtual_disk() {
    // Slow controllers, so the watch sees the disk in Resizing.
    let env = Env::with_step(
        ServeFlavor::Deckhouse,
        "deckhouse.yaml",
        std::time::Duration::from_millis(300),
    );
    expandable_class(&env);
    ok(env.vm(&[
        "disk",
        "attach",
        "linux-vm",
        "data",
        "--size",
        "1Gi",
        "--storage-class",
        "expandable",
    ]));
    env.emulator.clear_requests();
    let out = env.vm(&[
        "disk", "resize", "linux-vm", "data", "--size", "2Gi", "-o", "name",
    ]);
    assert_eq!(
        stdout(&out),
        "virtualdisk.virtualization.deckhouse.io/data\n",
        "{}",
        stderr(&out)
    );
    assert!(
        // Resizing's message is the controller's first ("The virtual disk resizing has
        // started.") or the claim's (none), whichever state the watch sees first.
        stderr(&out).starts_with("virtualdisk/data asks for 2Gi accepted\n  Resizing"),
        "{}",
        stderr(&out)
    );
    let wire = changes(&env);
    assert_eq!(wire.len(), 1, "{wire:#?}");
    assert_eq!(
        (wire[0].0.as_str(), wire[0].1.as_str()),
        (
            "PATCH",
            "/apis/virtualization.deckhouse.io/v1alpha2/namespaces/default/virtualdisks/data"
        )
    );
    let body = wire[0].2.clone().unwrap();
    assert_eq!(body["spec"]["persistentVolumeClaim"]["size"], "2Gi");
    assert_eq!(
        jsonpath(
            &env,
            &["get", "vd", "data"],
            "{.status.phase} {.status.capacity}"
        ),
        "Ready 2Gi"
    );
    let out = env.vm(&["disk", "resize", "linux-vm", "data", "--size", "3Gi"]);
    assert_eq!(
        stdout(&out),
        "disk data of linux-vm.default grown from 2Gi to 3Gi; the running guest sees it now (grow its partition and filesystem there)\n",
        "{}",
        stderr(&out)
    );
    env.emulator.clear_requests();
    let err = fails(
        &env,
        &["disk", "resize", "linux-vm", "linux-disk", "--size", "11Gi"],
        2,
    );
    assert_eq!(
        err,
        "Error: disk linux-disk cannot grow: StorageClass local-path does not allow volume expansion (allowVolumeExpansion is not true); nothing was changed"
    );
    let err = fails(
        &env,
        &["disk", "resize", "linux-vm", "data", "--size", "1Gi"],
        2,
    );
    assert!(err.contains("a disk only grows"), "{err}");
    assert!(changes(&env).is_empty(), "{:#?}", changes(&env));
}

/// Kubernetes' words on a filesystem claim that waits for a pod to mount it (external-resizer
/// `markForPendingNodeExpansion`).
const FS_PENDING: &str = "FileSystemResizePending: Waiting for user to (re-)start a pod to finish file system resize of volume on node.";

#[test]
fn kubevirt_resize_of_a_stopped_vm_is_applied_at_next_start() {
    let env = Env::kubevirt();
    expandable_class(&env);
    ok(env.vm(&[
        "disk",
        "attach",
        "batch.dev",
        "data",
        "--size",
        "1Gi",
        "--storage-class",
        "expandable",
    ]));
    ok(env.kubectl(&[
        "wait",
        "-n",
        "dev",
        "--for=jsonpath={.status.phase}=Bound",
        "pvc/data",
        "--timeout=5s",
    ]));
    let out = env.vm(&["disk", "resize", "batch.dev", "data", "--size", "2Gi"]);
    assert_eq!(
        stdout(&out),
        format!(
            "disk data of batch.dev grows from 1Gi to 2Gi, applied at next start: the VM is not running (persistentvolumeclaim/data: {FS_PENDING})\n"
        ),
        "{}",
        stderr(&out)
    );
    // What the cluster says, read with kubectl: the storage grew, the claim's capacity waits.
    assert_eq!(
        jsonpath(
            &env,
            &["get", "pvc", "data", "-n", "dev"],
            "{.status.capacity.storage} {.status.allocatedResources.storage} {.status.allocatedResourceStatuses.storage} {.status.conditions[?(@.type==\"FileSystemResizePending\")].status}"
        ),
        "1Gi 2Gi NodeResizePending True"
    );
    // Started, the VM's pod mounts the claim and it gets its new capacity.
    ok(env.vm(&["start", "batch.dev"]));
    ok(env.kubectl(&[
        "wait",
        "-n",
        "dev",
        "--for=jsonpath={.status.capacity.storage}=2Gi",
        "pvc/data",
        "--timeout=5s",
    ]));
}

#[test]
fn deckhouse_resize_of_a_stopped_vm_is_applied_at_next_start() {
    let env = Env::deckhouse();
    expandable_class(&env);
    let path = env.dir.path().join("vd.yaml");
    std::fs::write(
        &path,
        "apiVersion: virtualization.deckhouse.io/v1alpha2\nkind: VirtualDisk\nmetadata: {name: data, namespace: dev}\nspec:\n  persistentVolumeClaim: {size: 1Gi, storageClassName: expandable}\n",
    )
    .unwrap();
    ok(env.kubectl(&["apply", "-f", path.to_str().unwrap()]));
    ok(env.kubectl(&[
        "wait",
        "-n",
        "dev",
        "--for=jsonpath={.status.phase}=Ready",
        "vd/data",
        "--timeout=5s",
    ]));
    ok(env.kubectl(&[
        "patch",
        "-n",
        "dev",
        "virtualmachine.virtualization.deckhouse.io/builder",
        "--type=json",
        "-p",
        r#"[{"op": "add", "path": "/spec/blockDeviceRefs/-", "value": {"kind": "VirtualDisk", "name": "data"}}]"#,
    ]));
    let claim = jsonpath(
        &env,
        &["get", "vd", "data", "-n", "dev"],
        "{.status.target.persistentVolumeClaimName}",
    );
    let out = env.vm(&["disk", "resize", "builder.dev", "data", "--size", "2Gi"]);
    assert_eq!(
        stdout(&out),
        format!(
            "disk data of builder.dev grows from 1Gi to 2Gi, applied at next start: the VM is not running (persistentvolumeclaim/{claim}: {FS_PENDING})\n"
        ),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        jsonpath(
            &env,
            &["get", "vd", "data", "-n", "dev"],
            "{.status.phase} {.status.capacity}"
        ),
        "Ready 1Gi"
    );
    ok(env.vm(&["start", "builder.dev"]));
    ok(env.kubectl(&[
        "wait",
        "-n",
        "dev",
        "--for=jsonpath={.status.capacity}=2Gi",
        "vd/data",
        "--timeout=5s",
    ]));
}
