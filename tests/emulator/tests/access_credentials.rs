//! The sshd guests' stand-in for virt-launcher's access-credential propagation
//! (src/sshd_agent.rs): what it refuses, reported in the VMI condition
//! `AccessCredentialsSynchronized` as virt-handler words it, and that a user whose home is
//! outside the guest's own /home is never written (that would be the machine running us).

use std::time::{Duration, Instant};

use base64::Engine;
use kubevm_emulator::ServeFlavor;
use serde_json::{Value, json};

use crate::common;
use common::{dial, start};

const KV_PF: &str =
    "/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachineinstances/web/portforward";

fn vmi(emu: &kubevm_emulator::Emulator) -> Value {
    emu.objects("kubevirt.io", "virtualmachineinstances", Some("default"))
        .into_iter()
        .find(|o| o["metadata"]["name"] == "web")
        .unwrap()
}

fn with_credentials(emu: &kubevm_emulator::Emulator, credentials: Value) {
    let mut object = vmi(emu);
    object["spec"]["accessCredentials"] = credentials;
    emu.put_object(object);
}

async fn condition_message(emu: &kubevm_emulator::Emulator, wanted: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let c = vmi(emu)["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "AccessCredentialsSynchronized")
            .cloned();
        if let Some(c) = &c
            && c["message"].as_str().is_some_and(|m| m.contains(wanted))
        {
            return c.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no condition with {wanted:?}: {c:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn keys(user: &str, secret: &str) -> Value {
    json!([{"sshPublicKey": {"source": {"secret": {"secretName": secret}},
        "propagationMethod": {"qemuGuestAgent": {"users": [user]}}}}])
}

#[tokio::test]
async fn sshd_guest_agent_refuses_and_reports() {
    assert!(
        kubevm_emulator::core::sshd_guest::available(),
        "sshd guests need root, unshare and /usr/sbin/sshd (tests/tools/install-test-deps.sh)"
    );
    let (emu, client) = start(ServeFlavor::KubeVirt).await;
    let line =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHcP1uPBmPUxGj6S+v8Wgfc1ckRtXQ4dx2ri8DPz8GLy test";
    emu.put_object(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "keys", "namespace": "default"},
        "data": {"k": base64::engine::general_purpose::STANDARD.encode(line)}}));
    let host_root_keys = std::fs::read("/root/.ssh/authorized_keys").ok();
    with_credentials(&emu, keys("root", "keys"));
    // The first dial of port 22 starts the guest's sshd and the agent's first round.
    let (_ssh, _) = dial(&client, &format!("{KV_PF}/22/tcp"), "plain.kubevirt.io")
        .await
        .unwrap();
    let c = condition_message(&emu, "outside /home").await;
    assert_eq!(c["status"], "False");
    assert!(
        c["message"].as_str().unwrap().starts_with(
            "Error encountered writing ssh pub key access credentials for user [root]: "
        ),
        "{c}"
    );
    assert_eq!(
        std::fs::read("/root/.ssh/authorized_keys").ok(),
        host_root_keys,
        "the machine's own /root was written"
    );
    // The image's user is `fedora` (cloud-config `user:`), which this guest does not create.
    with_credentials(&emu, keys("nobody-here", "keys"));
    condition_message(&emu, "failed to get user 'nobody-here': no such user").await;
    with_credentials(&emu, keys("nobody-here", "zz"));
    let c = condition_message(&emu, "secret zz not found").await;
    assert_eq!(c["status"], "False");
}
