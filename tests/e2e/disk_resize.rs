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
        stderr(&out).starts_with(
            "virtualdisk/data asks for 2Gi accepted\n  Resizing: The virtual disk resizing has started.\n"
        ),
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
