//! `image delete` of a scheduled image (KubeVirt, `image create --schedule`): the DataSource
//! is CDI's, made for our DataImportCron, so deleting the image deletes the cron, the
//! DataSource and the cron's DataVolumes (CDI would keep them: the cron has no
//! `retentionPolicy: None`); a cron not made by kubectl vm is never touched.

use serde_json::Value;

use crate::common::{Env, fails, ok, stderr};

fn names(env: &Env, kinds: &str) -> String {
    ok(env.kubectl(&["get", kinds, "-o", "name"]))
}

fn scheduled(env: &Env, name: &str) {
    let out = env.vm(&[
        "image",
        "create",
        name,
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
}

#[test]
fn deleting_a_scheduled_image_deletes_its_cron_data_source_and_imports() {
    let env = Env::kubevirt();
    let before = names(&env, "dataimportcrons,datasources,datavolumes");
    scheduled(&env, "fedora");
    let cron: Value = serde_json::from_str(&ok(env.kubectl(&[
        "get",
        "dataimportcron",
        "fedora",
        "-o",
        "json",
    ])))
    .unwrap();
    let pvc = cron["status"]["lastImportedPVC"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(names(&env, "datavolumes").contains(&format!("datavolume.cdi.kubevirt.io/{pvc}")));

    let out = ok(env.vm(&["image", "delete", "ds/fedora"]));
    for made in [
        "dataimportcron.cdi.kubevirt.io/fedora".to_owned(),
        "datasource.cdi.kubevirt.io/fedora".to_owned(),
        format!("datavolume.cdi.kubevirt.io/{pvc}"),
    ] {
        assert!(out.contains(&made), "{made}: {out}");
    }
    assert_eq!(
        names(&env, "dataimportcrons,datasources,datavolumes"),
        before,
        "only what the cron made is gone"
    );
    // The PVC goes with its DataVolume (its owner), as the garbage collector does.
    crate::lifecycle::eventually("the import's PVC deleted", || {
        !names(&env, "persistentvolumeclaims").contains(&pvc)
    });
}

#[test]
fn a_cron_not_made_by_kubectl_vm_is_never_deleted() {
    let env = Env::kubevirt();
    scheduled(&env, "fedora");
    // The same cron, as someone else made it: without our label.
    ok(env.kubectl(&[
        "label",
        "dataimportcron",
        "fedora",
        "app.kubernetes.io/managed-by-",
    ]));
    let before = names(&env, "dataimportcrons,datasources,datavolumes");
    let err = fails(&env, &["image", "delete", "ds/fedora"], 1);
    assert!(err.contains("was not made by kubectl vm"), "{err}");
    assert_eq!(
        names(&env, "dataimportcrons,datasources,datavolumes"),
        before
    );
}

/// The digest `sha256sum` gives for `text`.
fn sha256sum(text: &str) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8(out.stdout).unwrap()[..64].to_owned()
}

/// Once the schedule fires on a rebuilt registry image, CDI imports the new digest and moves
/// the DataSource to it: `image list` shows the new digest as the image's source, the first
/// import is kept (importsToKeep 3), and `image delete` removes both imports.
#[test]
fn the_schedule_firing_reimports_and_the_list_follows_the_new_digest() {
    let env = Env::kubevirt();
    scheduled(&env, "fedora");
    let row = |env: &Env| {
        ok(env.vm(&["image", "list"]))
            .lines()
            .find(|l| l.starts_with("fedora "))
            .unwrap_or_default()
            .to_owned()
    };
    let first = row(&env);
    assert!(first.contains(" Ready "), "{first}");
    // The cron's imports, by the label CDI puts on them.
    let imports = || {
        ok(env.kubectl(&[
            "get",
            "datavolumes",
            "-l",
            "cdi.kubevirt.io/dataImportCron=fedora",
            "-o",
            "name",
        ]))
        .lines()
        .map(str::to_owned)
        .collect::<Vec<_>>()
    };
    assert_eq!(imports().len(), 1, "{:?}", imports());

    let rebuilt = sha256sum("quay.io/containerdisks/fedora:41 rebuilt");
    env.emulator.set_registry_digest(
        "docker://quay.io/containerdisks/fedora:41",
        &format!("sha256:{rebuilt}"),
    );
    // A day later the 03:00 run has happened.
    env.emulator.advance_cron_clock(86_400);
    crate::lifecycle::eventually("the list shows the new digest", || {
        let now = row(&env);
        now.contains(&format!("fedora@sha256:{rebuilt}")) && now.contains(" Ready ")
    });
    assert!(!first.contains(&rebuilt), "{first}");
    let both = imports();
    assert_eq!(both.len(), 2, "{both:?}");

    let out = ok(env.vm(&["image", "delete", "ds/fedora"]));
    for made in &both {
        assert!(out.contains(made.as_str()), "{made}: {out}");
    }
    assert!(imports().is_empty());
}
