//! `collect-debug-info` on both flavours: the files in the archive (listed by the system `tar`),
//! what summary.txt says about a broken VM, masking of secrets (grep of every extracted file),
//! best effort under a restricted user, and refusing a terminal.

use std::path::{Path, PathBuf};
use std::process::Command;

use kubevm_emulator::{Emulator, EmulatorOptions, ServeFlavor};

use crate::common::{BIN, Env, exit_code, ok, on_tty, stderr};

/// The secret values the fixtures plant in logs: an `--env` value (set in user data that is in
/// a Secret, as `create` makes it), `password=…`, a quoted password with spaces, a
/// `--password` flag. Masked unless `--include-secrets`.
const IN_LOGS: [&str; 4] = [
    "EnvVal-Quartz-3390",
    "LogLine-Secret-6604",
    "Spaced Pw 4410",
    "CliFlag-Pw-4411",
];

/// Values only Secrets hold (the user data's password, another Secret's value): never in the
/// archive.
const ONLY_IN_SECRETS: [&str; 2] = ["UserData-Pw-7781", "SecretObj-Value-5521"];

fn fixture(name: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures")
            .join(name),
    )
    .unwrap()
}

fn env(flavor: ServeFlavor) -> Env {
    let (base, debug) = match flavor {
        ServeFlavor::Deckhouse => ("deckhouse.yaml", "debug-deckhouse.yaml"),
        _ => ("kubevirt.yaml", "debug-kubevirt.yaml"),
    };
    let emulator = Emulator::start_blocking(EmulatorOptions {
        fixture_yaml: vec![fixture(base), fixture(debug)],
        flavor,
        ..Default::default()
    })
    .expect("emulator starts");
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    emulator.write_kubeconfig(&kubeconfig).unwrap();
    let bin_dir = dir.path().join("bin");
    std::fs::create_dir(&bin_dir).unwrap();
    std::os::unix::fs::symlink(BIN, bin_dir.join("kubectl-vm")).unwrap();
    Env {
        emulator,
        dir,
        kubeconfig,
        bin_dir,
    }
}

/// Run collect-debug-info into a file; return (archive path, stderr).
pub(crate) fn collect(env: &Env, args: &[&str]) -> (PathBuf, String) {
    let out = env.dir.path().join(format!(
        "bundle-{}.tar.gz",
        args.join("-").replace('/', "_")
    ));
    let mut all = vec!["collect-debug-info"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["-o", out.to_str().unwrap()]);
    let output = env.vm(&all);
    ok(output.clone());
    (out, stderr(&output))
}

/// File names in the archive, from the system tar (prefix dropped).
pub(crate) fn listing(archive: &Path) -> Vec<String> {
    let out = Command::new("tar")
        .arg("tzf")
        .arg(archive)
        .output()
        .unwrap();
    assert!(out.status.success(), "tar tzf failed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            l.split_once('/')
                .map(|(_, rest)| rest.to_owned())
                .unwrap_or_default()
        })
        .collect()
}

/// Extract with the system tar; return the folder.
fn extract(env: &Env, archive: &Path) -> PathBuf {
    let dir = env.dir.path().join(format!(
        "x-{}",
        archive.file_name().unwrap().to_string_lossy()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let st = Command::new("tar")
        .arg("xzf")
        .arg(archive)
        .arg("-C")
        .arg(&dir)
        .status()
        .unwrap();
    assert!(st.success());
    std::fs::read_dir(&dir)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path()
}

fn read(top: &Path, file: &str) -> String {
    std::fs::read_to_string(top.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// `grep -rl VALUE DIR`: files holding the value.
fn grep(dir: &Path, value: &str) -> Vec<String> {
    let out = Command::new("grep")
        .args(["-rlF", value])
        .arg(dir)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

fn assert_has(files: &[String], expected: &[&str]) {
    for want in expected {
        assert!(
            files.iter().any(|f| f == want),
            "{want} missing from the archive:\n{}",
            files.join("\n")
        );
    }
}

#[test]
fn kubevirt_archive_lists_everything() {
    let env = env(ServeFlavor::KubeVirt);
    let (archive, _) = collect(&env, &["app", "-n", "dev"]);
    let mode = std::fs::metadata(&archive).unwrap().permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o600
    );
    assert!(!archive.with_extension("gz.partial").exists());
    let files = listing(&archive);
    assert_has(
        &files,
        &[
            "virtualmachine/app.yaml",
            "virtualmachineinstance/app.yaml",
            "virtualmachineinstancemigration/app-migration-q7w2e.yaml",
            "datavolume/app-root.yaml",
            "datavolume/app-data.yaml",
            "persistentvolumeclaim/app-root.yaml",
            "persistentvolumeclaim/app-data.yaml",
            "persistentvolumeclaim/app-hot.yaml",
            "persistentvolume/pvc-app-root.yaml",
            "persistentvolume/pvc-app-hot.yaml",
            "storageclass/local-path.yaml",
            "pod/virt-launcher-app-old11.yaml",
            "pod/virt-launcher-app-new22.yaml",
            "pod/hp-volume-app-k2x9d.yaml",
            "log/virt-launcher-app-new22/compute.log",
            "log/virt-launcher-app-new22/guest-console-log.log",
            "log/virt-launcher-app-old11/compute.log",
            "log/hp-volume-app-k2x9d/hotplug-disk.log",
            "event/virtualmachineinstance-app.yaml",
            "event/datavolume-app-root.yaml",
            "domain/virt-launcher-app-new22.xml",
            "guest/guestosinfo.json",
            "guest/userlist.json",
            "guest/filesystemlist.json",
            "node/node-1.yaml",
            "node/node-2.yaml",
            "platform/version.yaml",
            "summary.txt",
            "errors.txt",
            "manifest.json",
        ],
    );
    // No Secret objects, ever; no other VM's objects.
    assert!(!files.iter().any(|f| f.starts_with("secret/")), "{files:?}");
    assert!(!files.iter().any(|f| f.contains("broken")), "{files:?}");
    let top = extract(&env, &archive);
    // The manifest lists every other file.
    let manifest: serde_json::Value = serde_json::from_str(&read(&top, "manifest.json")).unwrap();
    let listed: Vec<&str> = manifest["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    for f in files
        .iter()
        .filter(|f| !f.is_empty() && *f != "manifest.json")
    {
        assert!(listed.contains(&f.as_str()), "{f} not in manifest");
    }
    // Domain XML from virsh in compute, guest agent data, events by kind and name.
    let xml = read(&top, "domain/virt-launcher-app-new22.xml");
    assert!(
        xml.contains("<name>dev_app</name>") && xml.contains("<vcpu placement='static'>2</vcpu>"),
        "{xml}"
    );
    assert!(read(&top, "guest/userlist.json").contains("\"userName\": \"fedora\""));
    assert!(
        !files.contains(&"event/virtualmachine-app.yaml".to_string())
            || !read(&top, "event/virtualmachine-app.yaml").contains("unrelated service event")
    );
    assert!(
        !grep(&top, "unrelated service event").iter().any(|_| true),
        "a Service event of the same name was taken"
    );
    assert_eq!(read(&top, "errors.txt"), "", "admin may read everything");
    let summary = read(&top, "summary.txt");
    assert!(summary.contains("Phase:           Running"), "{summary}");
    assert!(summary.contains("nothing obvious"), "{summary}");
}

#[test]
fn kubevirt_summary_names_what_is_broken() {
    let env = env(ServeFlavor::KubeVirt);
    let (archive, _) = collect(&env, &["broken.dev"]);
    let top = extract(&env, &archive);
    let summary = read(&top, "summary.txt");
    for want in [
        "Phase:           CrashLoopBackOff",
        "condition Failure is True (FailedCreate): Failed to start the domain",
        "pod virt-launcher-broken-c4sh1: container compute is in CrashLoopBackOff (restarted 5 times)",
        "datavolume broken-root: import keeps retrying (restarted 4 times",
        "persistentvolumeclaim broken-root is Pending",
        "virtualmachineinstancemigration broken-migration-z1 failed: target pod did not become ready",
        "BackOff (x12): Back-off restarting failed container compute",
    ] {
        assert!(summary.contains(want), "{want:?} missing from:\n{summary}");
    }
    // The crashed container's previous log is there.
    assert!(
        read(&top, "log/virt-launcher-broken-c4sh1/compute.previous.log")
            .contains("unsupported configuration")
    );
}

#[test]
fn deckhouse_archive_and_summary() {
    let env = env(ServeFlavor::Deckhouse);
    let (archive, _) = collect(&env, &["app", "-n", "dev"]);
    let files = listing(&archive);
    assert_has(
        &files,
        &[
            "virtualmachine/app.yaml",
            "virtualdisk/app-root.yaml",
            "virtualdisk/app-data.yaml",
            "virtualdisk/app-hot.yaml",
            "virtualmachineblockdeviceattachment/app-hot.yaml",
            "virtualmachineoperation/migrate-app-x1c2v.yaml",
            "internalvirtualizationvirtualmachine/app.yaml",
            "internalvirtualizationvirtualmachineinstance/app.yaml",
            "internalvirtualizationvirtualmachineinstancemigration/migrate-app-x1c2v-internal.yaml",
            "persistentvolumeclaim/vd-app-root-8b000000.yaml",
            "persistentvolumeclaim/vd-app-hot-8b000000.yaml",
            "persistentvolume/pvc-vd-app-data.yaml",
            "storageclass/local-path.yaml",
            "pod/virt-launcher-app-old11.yaml",
            "pod/virt-launcher-app-new22.yaml",
            "pod/hp-volume-app-k2x9d.yaml",
            "log/virt-launcher-app-new22/compute.log",
            "log/hp-volume-app-k2x9d/hotplug-disk.log",
            "event/virtualdisk-app-root.yaml",
            "domain/virt-launcher-app-new22.xml",
            "guest/guestosinfo.json",
            "node/node-2.yaml",
            "summary.txt",
            "errors.txt",
            "manifest.json",
        ],
    );
    let top = extract(&env, &archive);
    assert!(
        read(&top, "domain/virt-launcher-app-new22.xml").contains("<alias name='ua-vd-app-root'/>")
    );

    let (archive, _) = collect(&env, &["broken", "-n", "dev"]);
    let top = extract(&env, &archive);
    let summary = read(&top, "summary.txt");
    for want in [
        "Phase:           Degraded",
        "condition Running is False (InternalVirtualMachineError): Failed to start the domain",
        "pod virt-launcher-broken-c4sh1: container compute is in CrashLoopBackOff (restarted 5 times)",
        "persistentvolumeclaim vd-broken-root-8b000000 is Pending",
        "virtualmachineoperation migrate-broken-a9 failed: target pod did not become ready",
    ] {
        assert!(summary.contains(want), "{want:?} missing from:\n{summary}");
    }
}

fn secrets_masked_then_included(flavor: ServeFlavor) {
    let env = env(flavor);
    let (archive, err) = collect(&env, &["app", "-n", "dev"]);
    assert!(!err.contains("include-secrets"), "{err}");
    let top = extract(&env, &archive);
    for secret in IN_LOGS.iter().chain(&ONLY_IN_SECRETS) {
        assert_eq!(grep(&top, secret), Vec::<String>::new(), "{secret} leaked");
    }
    // Masked, not dropped: the log lines are still there.
    let log = read(&top, "log/virt-launcher-app-new22/compute.log");
    for masked in [
        "password=[REDACTED]",
        "guest env APP_MODE is [REDACTED]",
        r#"password: \"[REDACTED]\""#,
        "mysql --password [REDACTED] -h db",
    ] {
        assert!(log.contains(masked), "{masked:?} not in {log}");
    }
    // The user data Secret was read (to learn what to mask) without failing.
    assert!(!err.contains("app-cloudinit"), "{err}");

    let (archive, err) = collect(&env, &["app", "-n", "dev", "--include-secrets"]);
    assert!(err.contains("Warning: --include-secrets"), "{err}");
    let top = extract(&env, &archive);
    for secret in IN_LOGS {
        assert!(
            !grep(&top, secret).is_empty(),
            "{secret} should be in the archive"
        );
    }
    // Secret objects never go in the archive, even then.
    for secret in ONLY_IN_SECRETS {
        assert!(grep(&top, secret).is_empty(), "{secret} leaked");
    }
}

#[test]
fn kubevirt_secrets_masked_unless_included() {
    secrets_masked_then_included(ServeFlavor::KubeVirt);
}

#[test]
fn deckhouse_secrets_masked_unless_included() {
    secrets_masked_then_included(ServeFlavor::Deckhouse);
}

fn restricted(flavor: ServeFlavor, denied: &[&str]) {
    let env = env(flavor);
    let (archive, err) = collect(
        &env,
        &["app", "-n", "dev", "--context", "emulator-restricted"],
    );
    let top = extract(&env, &archive);
    let errors = read(&top, "errors.txt");
    for want in denied {
        assert!(
            errors.contains(want),
            "{want:?} missing from errors.txt:\n{errors}"
        );
        assert!(
            err.contains(want),
            "{want:?} missing from the warnings:\n{err}"
        );
    }
    assert!(
        errors.lines().all(|l| l.contains("forbidden")
            || l.contains("not found")
            || l.contains("does not serve")),
        "{errors}"
    );
    // One warning line per error.
    assert_eq!(
        err.lines().filter(|l| l.starts_with("Warning: ")).count(),
        errors.lines().count(),
        "{err}"
    );
    assert!(listing(&archive).contains(&"virtualmachine/app.yaml".to_string()));
}

#[test]
fn kubevirt_restricted_user_gets_errors_txt() {
    restricted(
        ServeFlavor::KubeVirt,
        &[
            "persistentvolume/pvc-app-root: forbidden: user \"alice\" cannot get persistentvolumes",
            "storageclass/local-path: forbidden",
            "node/node-2: forbidden",
            "domain XML",
        ],
    );
}

#[test]
fn deckhouse_restricted_user_gets_errors_txt() {
    restricted(
        ServeFlavor::Deckhouse,
        &[
            "persistentvolume/pvc-vd-app-root: forbidden",
            "node/node-2: forbidden",
            "domain XML",
        ],
    );
}

/// Issue 38: a user who may read the VM but not its user-data Secret (alice's Role in `dev`
/// names no Secrets, as Kubernetes' `view` does not) still gets the whole bundle, exit 0;
/// errors.txt and one warning say the Secret could not be read and what that means.
fn user_data_secret_unreadable(flavor: ServeFlavor) {
    let env = env(flavor);
    let (archive, err) = collect(
        &env,
        &["app", "-n", "dev", "--context", "emulator-restricted"],
    );
    let top = extract(&env, &archive);
    let errors = read(&top, "errors.txt");
    let want = "secret \"app-cloudinit\" (the VM's user data, read only to learn the values to mask): forbidden: user \"alice\" cannot get secrets";
    let line = errors
        .lines()
        .find(|l| l.contains(want))
        .unwrap_or_else(|| panic!("{want:?} missing from errors.txt:\n{errors}"));
    assert!(
        line.ends_with("values it sets (--env) may appear unmasked in logs"),
        "{line}"
    );
    assert_eq!(
        err.lines()
            .filter(|l| l.starts_with("Warning: ") && l.contains(want))
            .count(),
        1,
        "{err}"
    );
    let files = listing(&archive);
    assert!(
        files.contains(&"virtualmachine/app.yaml".to_string()),
        "{files:?}"
    );
    assert!(!files.iter().any(|f| f.starts_with("secret")), "{files:?}");
}

#[test]
fn kubevirt_unreadable_user_data_secret_is_reported_not_fatal() {
    user_data_secret_unreadable(ServeFlavor::KubeVirt);
}

#[test]
fn deckhouse_unreadable_user_data_secret_is_reported_not_fatal() {
    user_data_secret_unreadable(ServeFlavor::Deckhouse);
}

#[test]
fn missing_vm_fails_and_terminal_is_refused() {
    let env = env(ServeFlavor::KubeVirt);
    let out = env.vm(&[
        "collect-debug-info",
        "nope",
        "-n",
        "dev",
        "-o",
        env.dir.path().join("x.tgz").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out).trim(),
        "Error: virtualmachine \"nope\" not found in namespace \"dev\""
    );
    assert!(
        !env.dir.path().join("x.tgz.partial").exists() && !env.dir.path().join("x.tgz").exists()
    );

    // Bad input is refused before any request.
    assert_eq!(
        crate::common::fails(
            &env,
            &[
                "collect-debug-info",
                "app",
                "--tail",
                "-5",
                "-o",
                "/dev/null"
            ],
            2
        ),
        "Error: --tail must be -1 (all lines) or more, not -5"
    );
    assert_eq!(
        crate::common::fails(
            &env,
            &["collect-debug-info", "vmi/app", "-o", "/dev/null"],
            2
        ),
        "Error: collect-debug-info takes a VM (NAME or vm/NAME), not vmi/app"
    );

    let mut session = on_tty(&env, &["collect-debug-info", "app", "-n", "dev"]);
    session
        .exp_string("refusing to write a binary archive to the terminal")
        .unwrap();
    session.exp_eof().unwrap();
    assert_eq!(exit_code(&session), 2);
}

#[test]
fn progress_on_a_terminal_with_output_file() {
    let env = env(ServeFlavor::KubeVirt);
    let out = env.dir.path().join("tty.tar.gz");
    let mut session = on_tty(
        &env,
        &[
            "collect-debug-info",
            "app",
            "-n",
            "dev",
            "-o",
            out.to_str().unwrap(),
        ],
    );
    session.exp_string("collecting app.dev").unwrap();
    session.exp_string("Wrote ").unwrap();
    session.exp_eof().unwrap();
    assert_eq!(exit_code(&session), 0);
    assert!(listing(&out).contains(&"summary.txt".to_string()));
}

#[test]
fn tail_and_since_limit_logs() {
    let env = env(ServeFlavor::KubeVirt);
    let (archive, _) = collect(&env, &["app", "-n", "dev", "--tail", "1"]);
    let top = extract(&env, &archive);
    let log = read(&top, "log/virt-launcher-app-new22/compute.log");
    assert_eq!(log.lines().count(), 1, "{log}");
    assert!(
        log.contains("EnvVal") || log.contains("guest env APP_MODE"),
        "{log}"
    );
    assert_eq!(
        read(&top, "log/hp-volume-app-k2x9d/hotplug-disk.log"),
        "hotplug volume app-hot still attached\n"
    );

    // --since 1h: only the line stamped within the last hour (the other is from 2026-01-10).
    let (archive, _) = collect(&env, &["app", "-n", "dev", "--since", "1h"]);
    let top = extract(&env, &archive);
    assert_eq!(
        read(&top, "log/hp-volume-app-k2x9d/hotplug-disk.log"),
        "hotplug volume app-hot still attached\n"
    );
    let (archive, _) = collect(&env, &["app", "-n", "dev", "--tail", "-1"]);
    let top = extract(&env, &archive);
    assert_eq!(
        read(&top, "log/hp-volume-app-k2x9d/hotplug-disk.log")
            .lines()
            .count(),
        2
    );
}

/// A launcher whose exec never answers (the emulator's hang switch): the bundle still
/// completes, errors.txt says the domain XML timed out, everything else is there.
#[test]
fn a_hung_domain_xml_exec_times_out_and_the_rest_is_collected() {
    let env = env(ServeFlavor::KubeVirt);
    env.emulator.set_exec_hangs(true);
    let archive = env.dir.path().join("hung.tar.gz");
    let started = std::time::Instant::now();
    let output = env
        .command(BIN)
        .args(["collect-debug-info", "app", "-n", "dev", "-o"])
        .arg(&archive)
        .env("KUBECTL_VM_EXEC_TIMEOUT", "1s")
        .output()
        .unwrap();
    let took = started.elapsed();
    ok(output.clone());
    assert!(
        took < std::time::Duration::from_secs(20),
        "the 1s exec timeout applied, not the 30s default: {took:?}"
    );
    let err = stderr(&output);
    assert!(
        err.contains("domain XML") && err.contains("no answer within 1s"),
        "{err}"
    );
    let files = listing(&archive);
    assert!(!files.iter().any(|f| f.starts_with("domain/")), "{files:?}");
    assert_has(
        &files,
        &[
            "virtualmachine/app.yaml",
            "virtualmachineinstance/app.yaml",
            "pod/virt-launcher-app-new22.yaml",
            "log/virt-launcher-app-new22/compute.log",
            "event/virtualmachineinstance-app.yaml",
            "guest/userlist.json",
            "summary.txt",
            "errors.txt",
            "manifest.json",
        ],
    );
    let top = extract(&env, &archive);
    let errors = read(&top, "errors.txt");
    assert_eq!(errors.lines().count(), 1, "{errors}");
    assert!(
        errors.contains("domain XML (virsh")
            && errors.contains("pod/virt-launcher-app-new22: no answer within 1s"),
        "{errors}"
    );
    // The exec was asked for, and held open by the emulator until kubectl-vm gave up.
    assert!(
        env.emulator
            .requests()
            .iter()
            .any(|r| r.path.ends_with("/pods/virt-launcher-app-new22/exec")),
        "no exec request"
    );
}

/// The importer pods of a Deckhouse VM's disks (`d8v-vd-importer-<disk uid>`), with their logs
/// and events, go in the bundle; another VM's importer in the same namespace does not.
#[test]
fn deckhouse_bundle_holds_the_importer_pods_of_the_vms_disks() {
    let env = Env::deckhouse();
    // Hosts under .invalid never resolve: both imports fail, and their importers keep
    // restarting, as a real stuck import does.
    for (vm, url) in [
        ("imp", "https://disks.invalid/imp.qcow2"),
        ("other", "https://disks.invalid/other.qcow2"),
    ] {
        ok(env.vm(&["create", vm, "-n", "default", "--url", url]));
    }
    let disk_uid = |name: &str| {
        env.emulator
            .objects(
                "virtualization.deckhouse.io",
                "virtualdisks",
                Some("default"),
            )
            .into_iter()
            .find(|d| d["metadata"]["name"] == name)
            .unwrap()["metadata"]["uid"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let (mine, theirs) = (
        format!("d8v-vd-importer-{}", disk_uid("imp-root")),
        format!("d8v-vd-importer-{}", disk_uid("other-root")),
    );
    importers_in_bundle(
        &env,
        &mine,
        &theirs,
        "d8v-dvcr-importer",
        "dvcr-data-importer",
    );
}

/// The CDI importer pods of a KubeVirt VM's disks (`importer-<PVC>`), with their logs and
/// events, go in the bundle; another VM's importer in the same namespace does not.
#[test]
fn kubevirt_bundle_holds_the_importer_pods_of_the_vms_disks() {
    let env = Env::kubevirt();
    for (vm, url) in [
        ("imp", "https://disks.invalid/imp.qcow2"),
        ("other", "https://disks.invalid/other.qcow2"),
    ] {
        ok(env.vm(&["create", vm, "-n", "default", "--url", url]));
    }
    // The claim of the VM's root disk: its DataVolume template's name.
    let claim_of = |vm: &str| {
        env.emulator
            .objects("kubevirt.io", "virtualmachines", Some("default"))
            .into_iter()
            .find(|v| v["metadata"]["name"] == vm)
            .unwrap()["spec"]["dataVolumeTemplates"][0]["metadata"]["name"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let (mine, theirs) = (
        format!("importer-{}", claim_of("imp")),
        format!("importer-{}", claim_of("other")),
    );
    importers_in_bundle(
        &env,
        &mine,
        &theirs,
        "importer",
        "containerized-data-importer",
    );
}

/// Once both importers (of VM `imp`'s disk, `mine`, and of another VM's, `theirs`) fail, the
/// bundle of `imp` holds its importer pod (label `app: APP`), the log of `container` with the
/// import's error, and its BackOff events; nothing of the other one.
fn importers_in_bundle(env: &Env, mine: &str, theirs: &str, container: &str, app: &str) {
    let failing = |pod: &str| {
        env.emulator
            .objects("", "pods", Some("default"))
            .iter()
            .any(|p| {
                p["metadata"]["name"] == pod
                    && p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"]
                        == "CrashLoopBackOff"
            })
    };
    crate::lifecycle::eventually("both importers fail", || failing(mine) && failing(theirs));
    let (archive, _) = collect(env, &["imp", "-n", "default"]);
    let files = listing(&archive);
    assert_has(
        &files,
        &[
            &format!("pod/{mine}.yaml"),
            &format!("log/{mine}/{container}.log"),
            &format!("event/pod-{mine}.yaml"),
        ],
    );
    assert!(!files.iter().any(|f| f.contains(theirs)), "{files:?}");
    let top = extract(env, &archive);
    let log = read(&top, &format!("log/{mine}/{container}.log"));
    assert!(
        log.contains("https://disks.invalid/imp.qcow2") && log.contains("no such host"),
        "{log}"
    );
    let events = read(&top, &format!("event/pod-{mine}.yaml"));
    assert!(events.contains("BackOff"), "{events}");
    let pod = read(&top, &format!("pod/{mine}.yaml"));
    assert!(pod.contains(&format!("app: {app}")), "{pod}");
}

#[test]
fn kubevirt_bundle_holds_the_data_source_a_vm_boots_from() {
    let env = Env::kubevirt();
    env.emulator
        .put_object(serde_json::json!({"apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "DataSource", "metadata": {"name": "golden", "namespace": "default"},
        "spec": {"source": {"pvc": {"name": "golden-pvc", "namespace": "default"}}}}));
    ok(env.vm(&["create", "fromds", "--image", "ds/golden", "--stopped"]));
    let (archive, _) = collect(&env, &["fromds", "-n", "default"]);
    let files = listing(&archive);
    assert_has(&files, &["datasource/golden.yaml"]);
    let top = extract(&env, &archive);
    let ds = read(&top, "datasource/golden.yaml");
    assert!(ds.contains("name: golden-pvc"), "{ds}");
}

/// A Deckhouse VM being created from an image that is still importing: the bundle holds the
/// image (VirtualImage) and its importer pod (`d8v-vi-importer-<image uid>`) with its log.
#[test]
fn deckhouse_bundle_holds_the_importer_of_the_image_a_vm_is_created_from() {
    let env = Env::deckhouse();
    ok(env.vm(&[
        "image",
        "create",
        "stuck",
        "--url",
        "https://images.invalid/stuck.qcow2",
        "--no-wait",
    ]));
    ok(env.vm(&["create", "fromimg", "-n", "default", "--image", "vi/stuck"]));
    let image_uid = env
        .emulator
        .objects(
            "virtualization.deckhouse.io",
            "virtualimages",
            Some("default"),
        )
        .into_iter()
        .find(|d| d["metadata"]["name"] == "stuck")
        .unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    let importer = format!("d8v-vi-importer-{image_uid}");
    crate::lifecycle::eventually("the image's importer fails", || {
        env.emulator
            .objects("", "pods", Some("default"))
            .iter()
            .any(|p| {
                p["metadata"]["name"] == importer.as_str()
                    && p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"]
                        == "CrashLoopBackOff"
            })
    });
    let (archive, _) = collect(&env, &["fromimg", "-n", "default"]);
    let files = listing(&archive);
    assert_has(
        &files,
        &[
            "virtualimage/stuck.yaml",
            &format!("pod/{importer}.yaml"),
            &format!("log/{importer}/d8v-dvcr-importer.log"),
        ],
    );
    let top = extract(&env, &archive);
    let log = read(&top, &format!("log/{importer}/d8v-dvcr-importer.log"));
    assert!(
        log.contains("https://images.invalid/stuck.qcow2") && log.contains("no such host"),
        "{log}"
    );
}

/// A VM created from a cluster image that is still importing: the image's importer runs in the
/// module's namespace (`d8-virtualization/d8v-cvi-importer-<uid>`); the bundle holds it, its
/// log and its events.
#[test]
fn deckhouse_bundle_holds_the_importer_of_a_cluster_image_in_the_modules_namespace() {
    let env = Env::deckhouse();
    ok(env.vm(&[
        "image",
        "create",
        "stuck-golden",
        "--cluster-wide",
        "--url",
        "https://images.invalid/golden.qcow2",
        "--no-wait",
    ]));
    ok(env.vm(&[
        "create",
        "fromcvi",
        "-n",
        "default",
        "--image",
        "cvi/stuck-golden",
    ]));
    let image_uid = env
        .emulator
        .objects("virtualization.deckhouse.io", "clustervirtualimages", None)
        .into_iter()
        .find(|d| d["metadata"]["name"] == "stuck-golden")
        .unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    let importer = format!("d8v-cvi-importer-{image_uid}");
    crate::lifecycle::eventually("the cluster image's importer fails", || {
        env.emulator
            .objects("", "pods", Some("d8-virtualization"))
            .iter()
            .any(|p| {
                p["metadata"]["name"] == importer.as_str()
                    && p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"]
                        == "CrashLoopBackOff"
            })
    });
    let (archive, _) = collect(&env, &["fromcvi", "-n", "default"]);
    let files = listing(&archive);
    assert_has(
        &files,
        &[
            "clustervirtualimage/stuck-golden.yaml",
            &format!("pod/{importer}.yaml"),
            &format!("log/{importer}/d8v-dvcr-importer.log"),
            &format!("event/pod-{importer}.yaml"),
        ],
    );
    let top = extract(&env, &archive);
    let log = read(&top, &format!("log/{importer}/d8v-dvcr-importer.log"));
    assert!(
        log.contains("https://images.invalid/golden.qcow2") && log.contains("no such host"),
        "{log}"
    );
    let pod = read(&top, &format!("pod/{importer}.yaml"));
    assert!(pod.contains("namespace: d8-virtualization"), "{pod}");
}
