//! `guestosinfo`, `userlist`, `fslist` end to end: tables and `-o json|yaml` from KubeVirt's
//! guest-agent subresources (the emulator's answers from the VMI's status and the agent data
//! it holds) and Deckhouse's status.guestOSInfo; one line when the agent is not connected.

use crate::common::{Env, fails, ok, stderr};

#[test]
fn kubevirt_guest_facts() {
    let env = Env::kubevirt();
    // The fixture's VMI web: its status.guestOSInfo (tests/fixtures/kubevirt.yaml).
    let text = ok(env.vm(&["guestosinfo", "web"]));
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("HOSTNAME   OS "), "{text}");
    assert!(
        lines[1].contains("Fedora Linux 42 (Cloud Edition)")
            && lines[1].contains("6.14.0-63.fc42.x86_64"),
        "{text}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&ok(env.vm(&["guestosinfo", "web", "-o", "json"]))).unwrap();
    assert_eq!(json["os"]["versionId"], "42");
    // Users and filesystems as the agent reported them (the emulator keeps them on the VMI).
    ok(env.kubectl(&[
        "annotate", "vmi", "web", "--overwrite",
        r#"emulator.kubevm.io/guest-users=[{"userName":"fedora","loginTime":1767225600.5}]"#,
        r#"emulator.kubevm.io/guest-filesystems=[{"diskName":"vda1","mountPoint":"/","fileSystemType":"xfs","usedBytes":1073741824,"totalBytes":4294967296}]"#,
    ]));
    assert_eq!(
        ok(env.vm(&["userlist", "web"])),
        "USER     DOMAIN   LOGIN-TIME\nfedora   <none>   2026-01-01T00:00:00Z\n"
    );
    assert_eq!(
        ok(env.vm(&["fslist", "web.default"])),
        "MOUNTPOINT   TYPE   DISK   USED    TOTAL   USE%\n/            xfs    vda1   1.0Gi   4.0Gi   25%\n"
    );
    let yaml = ok(env.vm(&["fslist", "web", "-o", "yaml"]));
    assert!(yaml.contains("mountPoint: /"), "{yaml}");
    // No agent: the server's own words in one line.
    ok(env.kubectl(&[
        "patch",
        "vmi",
        "web",
        "--subresource=status",
        "--type=json",
        "-p",
        r#"[{"op":"replace","path":"/status/conditions","value":[]}]"#,
    ]));
    assert_eq!(
        fails(&env, &["userlist", "web"], 1),
        "Error: the guest agent of web.default is not connected (server: Operation cannot be fulfilled on virtualmachineinstance.kubevirt.io \"web\": VMI does not have guest agent connected)"
    );
    let out = env.vm(&["fslist", "web", "-o", "wide"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

#[test]
fn deckhouse_guest_os_from_status() {
    let env = Env::deckhouse();
    let text = ok(env.vm(&["guestosinfo", "linux-vm"]));
    assert!(
        text.lines()
            .nth(1)
            .is_some_and(|l| l.contains("Ubuntu 24.04.1 LTS") && l.contains("6.8.0-51-generic")),
        "{text}"
    );
    assert_eq!(
        fails(&env, &["userlist", "linux-vm"], 1),
        "Error: Deckhouse virtualization publishes only the guest OS (status.guestOSInfo, see `kubectl vm guestosinfo linux-vm`); logged-in users and filesystems need KubeVirt"
    );
}
