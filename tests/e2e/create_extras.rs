//! `create` with the seed's further settings on the emulator: the created objects carry the
//! fields the API docs name (KubeVirt swagger `v1.CPU`, `v1.Firmware`, `v1.EFI`,
//! `v1.AccessCredential`, `subdomain`; Deckhouse `provisioning.userDataRef`), Secrets of user
//! data and keys are read and left as they were, and the merged user data keeps the platform
//! trust.

use std::path::PathBuf;

use serde_json::Value;

use crate::common::{Env, find_object, ok, stderr};

const IMAGE: &str = "quay.io/containerdisks/ubuntu:24.04";
const CA_KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKhuTx3UbMv7V3GfqnLbhy/2YQkbgRDybsdM05K+ALjI platform-ca";
const SECRET_KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJdD7y3aLq454yWBdwLWbieU1ebz9/cu7/QEXn9OIeZJ from-secret";
const OPS_KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFj7m0rJ7oXnPOjbW0gQ7bnFFuU2qNq7bpbmX0HkqjmH ops-key";
const USER_DATA: &str = "#cloud-config\nruncmd:\n  - touch /var/tmp/from-user-data-secret\n";

fn ca_file(env: &Env) -> PathBuf {
    let path = env.dir.path().join("ca.pub");
    std::fs::write(&path, format!("{CA_KEY}\n")).unwrap();
    path
}

/// Creates the user's Secrets with real kubectl: user data, a key Secret, a credential Secret.
fn user_secrets(env: &Env, ns: &str) {
    for (name, key, value) in [
        ("ud", "user-data", USER_DATA.to_owned()),
        ("keys", "admin", format!("{SECRET_KEY}\n")),
        ("ops-keys", "ops", format!("# team ops\n{OPS_KEY}\n")),
    ] {
        let secret = serde_json::json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": { "name": name, "namespace": ns },
            "stringData": { key: value },
        });
        let file = env.dir.path().join(format!("{name}.json"));
        std::fs::write(&file, secret.to_string()).unwrap();
        ok(env.kubectl(&["apply", "-f", file.to_str().unwrap()]));
    }
}

fn decoded(secret: &Value, key: &str) -> String {
    let encoded = secret["data"][key].as_str().unwrap_or_default();
    String::from_utf8(
        base64::Engine::decode(&base64::engine::general_purpose::STANDARD, encoded).unwrap(),
    )
    .unwrap()
}

#[test]
fn kubevirt_vm_gets_the_seed_settings() {
    let env = Env::kubevirt();
    user_secrets(&env, "dev");
    let before = find_object(&env, "", "secrets", Some("dev"), "ud").unwrap();
    let ca = ca_file(&env);
    let output = env.vm(&[
        "create",
        "app",
        "-n",
        "dev",
        "--image",
        IMAGE,
        "--cpu",
        "8",
        "--sockets",
        "2",
        "--threads",
        "2",
        "--uuid",
        "0f8fad5b-d9cb-469f-a165-70867728950e",
        "--serial",
        "SN-0042",
        "--secure-boot",
        "--persistent-efi",
        "--hostname",
        "db",
        "--subdomain",
        "tier",
        "--user-data-secret",
        "ud",
        "--ssh-key-secret",
        "keys",
        "--access-credential",
        "ops-keys:ubuntu,ops",
        "--access-credential",
        "ops-keys:backup:configDrive",
        "--ca-public-key",
        ca.to_str().unwrap(),
    ]);
    assert_eq!(
        ok(output.clone()),
        "virtualmachine.kubevirt.io/app created\nsecret/app-cloudinit created\n",
        "{}",
        stderr(&output)
    );
    let vm = find_object(&env, "kubevirt.io", "virtualmachines", Some("dev"), "app").unwrap();
    let spec = &vm["spec"]["template"]["spec"];
    let domain = &spec["domain"];
    assert_eq!(domain["cpu"]["sockets"], 2);
    assert_eq!(domain["cpu"]["cores"], 2);
    assert_eq!(domain["cpu"]["threads"], 2);
    assert_eq!(
        domain["firmware"]["uuid"],
        "0f8fad5b-d9cb-469f-a165-70867728950e"
    );
    assert_eq!(domain["firmware"]["serial"], "SN-0042");
    assert_eq!(domain["firmware"]["bootloader"]["efi"]["secureBoot"], true);
    assert_eq!(domain["firmware"]["bootloader"]["efi"]["persistent"], true);
    assert_eq!(domain["features"]["smm"]["enabled"], true);
    assert_eq!(spec["hostname"], "db");
    assert_eq!(spec["subdomain"], "tier");
    let credentials = spec["accessCredentials"].as_array().unwrap();
    assert_eq!(
        credentials.len(),
        1,
        "only the guest-agent one is a reference"
    );
    assert_eq!(
        credentials[0]["sshPublicKey"]["source"]["secret"]["secretName"],
        "ops-keys"
    );
    assert_eq!(
        credentials[0]["sshPublicKey"]["propagationMethod"]["qemuGuestAgent"]["users"],
        serde_json::json!(["ubuntu", "ops"])
    );
    let volume = spec["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "cloudinitdisk")
        .unwrap();
    assert_eq!(
        volume["cloudInitNoCloud"]["secretRef"]["name"],
        "app-cloudinit"
    );
    let merged = decoded(
        &find_object(&env, "", "secrets", Some("dev"), "app-cloudinit").unwrap(),
        "userdata",
    );
    for part in [
        "/var/tmp/from-user-data-secret",
        CA_KEY,
        SECRET_KEY,
        "name: backup",
        OPS_KEY,
    ] {
        assert!(merged.contains(part), "{part} missing in:\n{merged}");
    }
    // The user's Secret is read, never written.
    let after = find_object(&env, "", "secrets", Some("dev"), "ud").unwrap();
    assert_eq!(before, after);
}

#[test]
fn deckhouse_vm_gets_what_deckhouse_has() {
    let env = Env::deckhouse();
    let ns = env
        .emulator
        .objects("virtualization.deckhouse.io", "virtualmachines", None)[0]["metadata"]["namespace"]
        .as_str()
        .unwrap()
        .to_owned();
    user_secrets(&env, &ns);
    let ca = ca_file(&env);
    let output = env.vm(&[
        "create",
        "app",
        "-n",
        &ns,
        "--image",
        IMAGE,
        "--user-data-secret",
        "ud",
        "--ssh-key-secret",
        "keys",
        "--access-credential",
        "ops-keys:ops",
        "--ca-public-key",
        ca.to_str().unwrap(),
    ]);
    let text = ok(output.clone());
    assert!(text.ends_with("secret/app-cloudinit created\n"), "{text}");
    assert_eq!(
        stderr(&output),
        "Warning: Deckhouse has no accessCredentials: the keys of Secret ops-keys are written into the VM's cloud-init for ops now instead of by the guest agent; later changes to the Secret do not reach the guest\n"
    );
    let vm = find_object(
        &env,
        "virtualization.deckhouse.io",
        "virtualmachines",
        Some(&ns),
        "app",
    )
    .unwrap();
    assert_eq!(
        vm["spec"]["provisioning"],
        serde_json::json!({ "type": "UserDataRef", "userDataRef": { "kind": "Secret", "name": "app-cloudinit" } })
    );
    let secret = find_object(&env, "", "secrets", Some(&ns), "app-cloudinit").unwrap();
    assert_eq!(
        secret["type"],
        "provisioning.virtualization.deckhouse.io/cloud-init"
    );
    let merged = decoded(&secret, "userData");
    for part in [
        "/var/tmp/from-user-data-secret",
        CA_KEY,
        SECRET_KEY,
        OPS_KEY,
    ] {
        assert!(merged.contains(part), "{part} missing in:\n{merged}");
    }
}

#[test]
fn a_missing_secret_fails_before_anything_is_written() {
    let env = Env::kubevirt();
    for flag in ["--user-data-secret", "--ssh-key-secret"] {
        let output = env.vm(&[
            "create",
            "app",
            "-n",
            "dev",
            "--image",
            IMAGE,
            flag,
            "nope",
            "--no-platform-ssh",
        ]);
        assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
        assert_eq!(
            stderr(&output),
            format!("Error: {flag} nope: secret \"nope\" not found in namespace \"dev\"\n")
        );
        assert!(find_object(&env, "kubevirt.io", "virtualmachines", Some("dev"), "app").is_none());
    }
}

/// `--os windows`: KubeVirt gets what its Windows example VM carries (docs "Windows virtio
/// drivers": a SATA boot disk and an `e1000e` NIC for a stock image; Hyper-V enlightenments
/// `relaxed`, `vapic`, `spinlocks` with ACPI/APIC, and a clock in local time); Deckhouse gets
/// `spec.osType: Windows` (API reference: `osType` enum `Windows`, `Generic`). Linux-only
/// cloud-init flags are refused before any request.
#[test]
fn windows_guests_get_the_platforms_windows_settings() {
    let env = Env::kubevirt();
    let out = env.vm(&[
        "create",
        "win",
        "--image",
        IMAGE,
        "--os",
        "windows",
        "--timezone",
        "Europe/Berlin",
        "--no-platform-ssh",
    ]);
    ok(out);
    let vm = find_object(
        &env,
        "kubevirt.io",
        "virtualmachines",
        Some("default"),
        "win",
    )
    .unwrap();
    let domain = &vm["spec"]["template"]["spec"]["domain"];
    let boot = domain["devices"]["disks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "rootdisk")
        .unwrap();
    assert_eq!(boot["disk"]["bus"], "sata", "{domain}");
    assert_eq!(domain["devices"]["interfaces"][0]["model"], "e1000e");
    assert_eq!(
        domain["features"]["hyperv"],
        serde_json::json!({"relaxed": {}, "vapic": {}, "spinlocks": {"spinlocks": 8191}})
    );
    assert_eq!(domain["clock"]["timezone"], "Europe/Berlin", "{domain}");
    let linux = find_object(
        &env,
        "kubevirt.io",
        "virtualmachines",
        Some("default"),
        "web",
    );
    assert!(
        linux.is_some(),
        "the fixture's Linux VM is there to compare"
    );

    let env = Env::deckhouse();
    ok(env.vm(&[
        "create",
        "win",
        "--image",
        IMAGE,
        "--os",
        "windows",
        "--no-platform-ssh",
    ]));
    let vm = find_object(
        &env,
        "virtualization.deckhouse.io",
        "virtualmachines",
        Some("default"),
        "win",
    )
    .unwrap();
    assert_eq!(vm["spec"]["osType"], "Windows");
    ok(env.vm(&["create", "lin", "--image", IMAGE, "--no-platform-ssh"]));
    let vm = find_object(
        &env,
        "virtualization.deckhouse.io",
        "virtualmachines",
        Some("default"),
        "lin",
    )
    .unwrap();
    assert_eq!(vm["spec"]["osType"], "Generic");

    let before = env.emulator.requests().len();
    let refused = env.vm(&[
        "create", "w2", "--image", IMAGE, "--os", "windows", "--env", "A=1",
    ]);
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    assert_eq!(stderr(&refused).lines().count(), 1, "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("--os windows"),
        "{}",
        stderr(&refused)
    );
    assert_eq!(
        env.emulator.requests().len(),
        before,
        "refused before any request"
    );
}

/// `--no-guest-agent` leaves the agent alone: the guest's user data neither installs nor
/// starts qemu-guest-agent, which it does by default (both platforms).
#[test]
fn no_guest_agent_leaves_the_agent_out_of_the_user_data() {
    for (env, group) in [
        (Env::kubevirt(), "kubevirt.io"),
        (Env::deckhouse(), "virtualization.deckhouse.io"),
    ] {
        ok(env.vm(&["ca", "init"]));
        ok(env.vm(&["create", "with", "--image", IMAGE]));
        ok(env.vm(&["create", "without", "--image", IMAGE, "--no-guest-agent"]));
        for name in ["with", "without"] {
            assert!(find_object(&env, group, "virtualmachines", Some("default"), name).is_some());
        }
        let user_data = |name: &str| {
            let secret = find_object(
                &env,
                "",
                "secrets",
                Some("default"),
                &format!("{name}-cloudinit"),
            )
            .unwrap_or_else(|| panic!("{name}-cloudinit"));
            let key = secret["data"]
                .as_object()
                .unwrap()
                .keys()
                .find(|k| k.contains("userdata") || k.contains("userData"))
                .cloned()
                .unwrap();
            decoded(&secret, &key)
        };
        let with = user_data("with");
        assert!(with.contains("qemu-guest-agent"), "{with}");
        let without = user_data("without");
        assert!(!without.contains("qemu-guest-agent"), "{without}");
        assert!(!without.contains("qemu-ga"), "{without}");
        // The rest of the platform setup is the same.
        assert!(without.contains("kubevm_trusted_user_ca_keys"), "{without}");
    }
}
