//! Bad input is refused before the first request: for every case exit 2, exactly one
//! `Error: …` line on stderr, nothing on stdout, and zero requests recorded by the emulator
//! (not even discovery).

use crate::common::{BIN, Env, ok, stderr, stdout};

const IMAGE: &str = "quay.io/containerdisks/ubuntu:24.04";
const SHA256: &str = "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
const URL: &str = "https://x.example/d.img";

/// One case: the full argument list, the expected text in the error line, and an optional
/// KUBECONFIG override.
struct Case {
    args: Vec<String>,
    expected: String,
    kubeconfig_env: Option<&'static str>,
}

fn case(args: &[&str], expected: &str) -> Case {
    Case {
        args: args.iter().map(|a| (*a).to_owned()).collect(),
        expected: expected.to_owned(),
        kubeconfig_env: None,
    }
}

/// `create app --image IMAGE EXTRA…`
fn image(extra: &[&str], expected: &str) -> Case {
    let mut args = vec!["create", "app", "--image", IMAGE];
    args.extend(extra);
    case(&args, expected)
}

#[test]
fn every_bad_input_is_one_line_exit_2_and_no_request() {
    let env = Env::kubevirt();
    let dir = env.dir.path();
    let user_key = dir.join("user.pub");
    std::fs::write(&user_key, "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJdD7y3aLq454yWBdwLWbieU1ebz9/cu7/QEXn9OIeZJ alice@laptop\n").unwrap();
    let bad_yaml = dir.join("bad.yaml");
    std::fs::write(&bad_yaml, "#cloud-config\nusers: [unclosed\n").unwrap();
    let private = dir.join("id_ed25519");
    std::fs::write(&private, "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n").unwrap();
    // Valid cloud-config one byte over what a Secret holds (1 MiB).
    let huge = dir.join("huge.yaml");
    let head = "#cloud-config\n# ";
    std::fs::write(
        &huge,
        format!("{head}{}\n", "x".repeat((1 << 20) - head.len())),
    )
    .unwrap();
    let (user_key, bad_yaml, private, huge) = (
        user_key.to_str().unwrap(),
        bad_yaml.to_str().unwrap(),
        private.to_str().unwrap(),
        huge.to_str().unwrap(),
    );
    let long_vm = "a".repeat(60);
    let mut nine_secrets = Vec::new();
    for i in 0..9 {
        nine_secrets.push("--ssh-key-secret".to_owned());
        nine_secrets.push(format!("keys-{i}"));
    }
    let nine_secrets: Vec<&str> = nine_secrets.iter().map(String::as_str).collect();
    let seventeen_users = format!(
        "team-keys:{}",
        (0..17)
            .map(|i| format!("u{i}"))
            .collect::<Vec<_>>()
            .join(",")
    );
    let long_get = "b".repeat(64);
    // Fine for one VM, but replica NAME-9's boot disk NAME-9-root is 64 characters.
    let long_pool = "p".repeat(57);
    let cases = vec![
        // Names and the boot source.
        case(
            &["create", "Bad_Name", "--image", IMAGE],
            "invalid VM name \"Bad_Name\"",
        ),
        case(&["create", "app"], "no boot source"),
        case(
            &["create", &long_vm, "--image", IMAGE],
            "too long for its boot disk name",
        ),
        image(
            &["--blank", "1Gi"],
            "--image and --blank cannot be used together",
        ),
        case(
            &["create", "app", "--blank", "0"],
            "--blank needs a size greater than zero",
        ),
        image(
            &["--disk-size", "0"],
            "--disk-size needs a size greater than zero",
        ),
        image(
            &["--ephemeral", "--disk-size", "5Gi"],
            "--disk-size applies to a boot disk",
        ),
        case(
            &["create", "app", "--image", "docker://x"],
            "without docker://",
        ),
        case(
            &["create", "app", "--image", "Quay.io/Team/Img"],
            "not a valid image reference",
        ),
        case(
            &["create", "app", "--image", "img:bad tag"],
            "not a valid image reference",
        ),
        case(
            &["create", "app", "--url", "ftp://x.example/d.img"],
            "must start with http:// or https://",
        ),
        case(
            &["create", "app", "--url", "x.example/d.img"],
            "must start with http:// or https://",
        ),
        case(
            &["create", "app", "--url", "https://"],
            "--url \"https://\"",
        ),
        case(
            &["create", "app", "--clone-pvc", "/x"],
            "--clone-pvc \"/x\": give NAME or NAMESPACE/NAME",
        ),
        case(
            &["create", "app", "--clone-pvc", "Bad_PVC"],
            "invalid PVC name",
        ),
        case(
            &["create", "app", "--disk", "Bad_Disk"],
            "invalid disk name",
        ),
        image(
            &["--storage-class", "Bad Class"],
            "invalid storage class name",
        ),
        case(
            &["create", "app", "--url", URL, "--checksum", "sha256:abc"],
            "--checksum: invalid checksum \"sha256:abc\"",
        ),
        case(
            &["create", "app", "--url", URL, "--checksum", "crc32:00"],
            "--checksum: invalid checksum \"crc32:00\"",
        ),
        image(&["--checksum", SHA256], "--checksum needs --url"),
        case(
            &["create", "app", "--url", URL, "--ephemeral"],
            "--ephemeral needs --image",
        ),
        image(
            &["--data-disk", "data"],
            "--data-disk: invalid data disk \"data\"",
        ),
        image(
            &["--data-disk", "data=1Gi", "--data-disk", "data=2Gi"],
            "--data-disk data is given twice",
        ),
        image(
            &["--boot-bus", "ide"],
            "--boot-bus: invalid disk bus \"ide\"",
        ),
        // Machine.
        image(&["--memory", "2XB"], "--memory: invalid size \"2XB\""),
        image(&["--memory", "0"], "--memory is too small"),
        image(&["--memory", "1"], "--memory is too small"),
        image(&["--memory", "1Ei"], "at most 64Ti"),
        image(&["--cpu", "1.5"], "--cpu: invalid CPU count \"1.5\""),
        image(&["--cpu", "0"], "--cpu: invalid CPU count \"0\""),
        image(&["--cpu", "100000"], "at most 1024 cores"),
        image(
            &["--core-fraction", "50%", "--flavor", "kubevirt"],
            "--core-fraction",
        ),
        image(
            &["--instancetype", "u1.medium", "--cpu", "2"],
            "--instancetype cannot be used with --cpu",
        ),
        image(&["--ephemeral", "--flavor", "deckhouse"], "--ephemeral"),
        // Pools.
        image(
            &["--replicas", "0"],
            "--replicas 0 is out of range: give 1 to 32",
        ),
        image(
            &["--replicas", "33"],
            "--replicas 33 is out of range: give 1 to 32",
        ),
        image(
            &["--replicas", "three"],
            "--replicas \"three\": give a whole number",
        ),
        case(
            &["create", "app", "--disk", "app-root", "--replicas", "2"],
            "--disk app-root cannot be used with --replicas",
        ),
        image(
            &["--replicas", "2", "--hostname", "h"],
            "--hostname cannot be used with --replicas",
        ),
        case(
            &[
                "create",
                "app",
                "--url",
                URL,
                "--checksum",
                SHA256,
                "--replicas",
                "2",
                "--flavor",
                "kubevirt",
            ],
            "--checksum cannot be used with --replicas on KubeVirt",
        ),
        case(
            &["create", &long_pool, "--image", IMAGE, "--replicas", "10"],
            &format!(
                "--replicas 10: the VM name is too long for its boot disk name {long_pool}-9-root"
            ),
        ),
        image(&["--run-strategy", "Sometimes"], "--run-strategy"),
        image(
            &["--stopped", "--run-strategy", "Always"],
            "--stopped cannot be used with --run-strategy Always",
        ),
        image(
            &["--hostname", "Bad_Host"],
            "--hostname \"Bad_Host\" is not a valid host name",
        ),
        image(
            &["--timezone", "Mars/Olympus"],
            "--timezone \"Mars/Olympus\" is not in the time zone database",
        ),
        image(&["-l", "bad key=v"], "--label: invalid label \"bad key=v\""),
        image(&["-l", "a=1", "-l", "a=2"], "--label a is given twice"),
        image(&["-l", "kubevm.io/role=db"], "kubevm.io/ prefix"),
        // Guest.
        image(
            &["--env", "1X=y"],
            "--env: invalid environment variable \"1X=y\"",
        ),
        image(&["--env", "A=1", "--env", "A=2"], "--env A is given twice"),
        image(
            &["--cloud-init", bad_yaml],
            "--cloud-init data is not valid YAML at line",
        ),
        image(
            &["--cloud-init", "/nonexistent/user-data"],
            "--cloud-init /nonexistent/user-data",
        ),
        image(&["--cloud-init", huge], "a Secret holds at most 1 MiB"),
        image(&["--ssh-key", private], "private key"),
        image(
            &["--ssh-key", "/nonexistent.pub"],
            "--ssh-key /nonexistent.pub",
        ),
        image(
            &["--ssh-key", user_key, "--timeout", "soon"],
            "--timeout: invalid duration",
        ),
        // The seed's limits (Settings reference).
        image(
            &nine_secrets,
            "--ssh-key-secret is given 9 times: at most 8 Secrets",
        ),
        image(
            &["--access-credential", &seventeen_users],
            "--access-credential team-keys: 17 users; give 1 to 16",
        ),
        image(
            &["--access-credential", "team-keys:ops:email"],
            "--access-credential: invalid delivery method \"email\"",
        ),
        image(
            &["--sockets", "33"],
            "--sockets 33 is out of range: give 1 to 32",
        ),
        image(
            &["--threads", "9"],
            "--threads 9 is out of range: give 1 to 8 threads per core",
        ),
        image(
            &["--cpu", "3", "--sockets", "2"],
            "--cpu 3 cannot be split into 2 sockets × 1 threads",
        ),
        image(
            // A version 1 UUID, as `uuidgen -t` prints them.
            &["--uuid", "c232ab00-9414-11ec-b3c8-9f6bdeced846"],
            "is not a version 4 UUID",
        ),
        image(
            &["--secure-boot"],
            "--secure-boot needs persistent EFI NVRAM (--persistent-efi): without it a Secure Boot guest loses its boot state on reboot",
        ),
        image(
            &["--flavor", "deckhouse", "--secure-boot"],
            "--secure-boot is refused on Deckhouse: it keeps no persistent EFI NVRAM",
        ),
        image(
            &["--flavor", "deckhouse", "--sockets", "2"],
            "--sockets and --threads are KubeVirt-only",
        ),
        image(
            &["--subdomain", "Web_Tier"],
            "--subdomain \"Web_Tier\" is not valid",
        ),
        image(
            &["--cloud-init", user_key, "--user-data-secret", "ud"],
            "--cloud-init and --user-data-secret cannot be used together",
        ),
        // Connection and targets.
        image(
            &["--kubeconfig", "/nonexistent/config"],
            "kubeconfig file /nonexistent/config does not exist",
        ),
        Case {
            kubeconfig_env: Some("/nonexistent/kubeconfig"),
            ..image(
                &[],
                "KUBECONFIG names /nonexistent/kubeconfig, which does not exist",
            )
        },
        case(&["get", "web.team", "-n", "dev"], "namespace \"team\""),
        case(&["get", &long_get], "a VM name is at most 63"),
    ];
    let mut failures = Vec::new();
    for case in cases {
        env.emulator.clear_requests();
        let mut command = env.command(BIN);
        command.args(&case.args);
        if let Some(path) = case.kubeconfig_env {
            command.env("KUBECONFIG", path);
        }
        let output = command.output().unwrap();
        let err = stderr(&output);
        let sent: Vec<String> = env
            .emulator
            .requests()
            .iter()
            .map(|r| format!("{} {}", r.method, r.path))
            .collect();
        let good = output.status.code() == Some(2)
            && err.lines().count() == 1
            && err.starts_with("Error: ")
            && err.contains(&case.expected)
            && stdout(&output).is_empty()
            && sent.is_empty();
        if !good {
            failures.push(format!(
                "{:?}: exit {:?}, expected {:?} in {err:?}, sent {sent:?}",
                case.args,
                output.status.code(),
                case.expected
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `--dry-run=client` with a fixed flavor never asks the cluster for the CA, so it has
/// nothing to warn about (it used to warn that there was no CA).
#[test]
fn offline_dry_run_does_not_warn_about_a_ca_it_never_looked_for() {
    let env = Env::kubevirt();
    env.emulator.clear_requests();
    let output = env.vm(&[
        "create",
        "app",
        "--image",
        IMAGE,
        "--dry-run=client",
        "--flavor",
        "kubevirt",
    ]);
    let text = ok(output.clone());
    assert_eq!(text, "virtualmachine.kubevirt.io/app created (dry run)\n");
    assert_eq!(stderr(&output), "");
    assert!(env.emulator.requests().is_empty());
}
