//! Properties of the user-data merge (issue 37): whatever the user gives, the result is user
//! data cloud-init reads and it still carries the platform's trust (the boot script that
//! writes the CA keys and points sshd at them), or the user's data is refused in one line.
//! `PROPTEST_CASES=20000 cargo test -p kubevm --lib create::cloudinit::properties` for a long run.

use std::process::{Command, Stdio};

use proptest::prelude::*;
use yaml_serde::{Mapping, Value};

use super::platform::CA_KEYS_PATH;
use super::*;
use crate::create::fixtures;
use crate::flavor::Flavor;

fn plan_with(user_data: String) -> VmPlan {
    let mut plan = fixtures::plan(Flavor::KubeVirt, fixtures::image());
    plan.guest.user_data = Some(user_data);
    plan
}

/// The platform's trust as the boot script carries it.
fn carries_trust(boot_script: &str) -> bool {
    let ca = &fixtures::ca_keys()[0];
    boot_script.contains(&format!(
        "cat > {CA_KEYS_PATH} <<'KUBEVM_EOF'\n{ca}\nKUBEVM_EOF\n"
    )) && boot_script.contains(&format!("TrustedUserCAKeys {CA_KEYS_PATH}\n"))
}

/// Whether a merged cloud-config keeps the platform's boot script first in `bootcmd`.
fn cloud_config_keeps_trust(text: &str) -> Result<(), String> {
    let body = text
        .strip_prefix("#cloud-config\n")
        .ok_or("no #cloud-config header")?;
    let doc: Value = yaml_serde::from_str(body).map_err(|e| e.to_string())?;
    let first = doc
        .get("bootcmd")
        .and_then(Value::as_sequence)
        .and_then(|s| s.first())
        .and_then(Value::as_str)
        .ok_or("bootcmd lost its first item")?;
    carries_trust(first)
        .then_some(())
        .ok_or_else(|| "the boot script lost the CA".to_owned())
}

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i32>().prop_map(|n| Value::from(n as i64)),
        "[a-z0-9 #:'\"{}\\[\\]|>&*!%@-]{0,12}".prop_map(Value::from),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    scalar().prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Sequence),
            prop::collection::vec((key(), inner), 0..4)
                .prop_map(|kv| Value::Mapping(kv.into_iter().collect::<Mapping>())),
        ]
    })
}

/// Top-level keys, mostly those the platform sets too.
fn key() -> impl Strategy<Value = Value> {
    prop::sample::select(vec![
        "bootcmd",
        "runcmd",
        "ssh_keys",
        "ssh_authorized_keys",
        "users",
        "write_files",
        "hostname",
        "packages",
        "merge_how",
        "x",
    ])
    .prop_map(Value::from)
}

fn cloud_config() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::collection::vec((key(), value()), 0..5).prop_map(|kv| {
            let doc = Value::Mapping(kv.into_iter().collect::<Mapping>());
            format!("#cloud-config\n{}", yaml_serde::to_string(&doc).unwrap())
        }),
        // Text that is rarely YAML at all.
        1 => "[a-z: \\[\\]{}\\-\n\"']{0,40}".prop_map(|t| format!("#cloud-config\n{t}")),
    ]
}

/// The content of each leaf part of a MIME archive with its file name, read by Python's
/// `email` package (what cloud-init itself parses user data with).
fn mime_parts(text: &str) -> Vec<(String, String)> {
    let script = "import email,sys,json\n\
        m=email.message_from_string(sys.stdin.read())\n\
        print(json.dumps([[p.get_filename() or '', p.get_payload()] for p in m.walk() if not p.is_multipart()]))";
    let mut child = Command::new("python3")
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    serde_json::from_slice(&out.stdout).expect("python printed the parts")
}

fn cases(default: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    ProptestConfig::with_cases(cases)
}

proptest! {
    /// A user `#cloud-config`, whatever it holds, is merged so the platform's boot script
    /// stays first in `bootcmd`, or refused in one line.
    #[test]
    fn cloud_config_keeps_the_platform_trust(text in cloud_config()) {
        match build(&plan_with(text.clone())) {
            Ok(Some(data)) => {
                let kept = cloud_config_keeps_trust(&data.text);
                prop_assert!(kept.is_ok(), "{:?}: {:?}\n{}", text, kept, data.text);
            }
            Ok(None) => prop_assert!(false, "{:?} gave no user data", text),
            Err(e) => prop_assert!(!e.to_string().contains('\n'), "{}", e),
        }
    }
}

proptest! {
    #![proptest_config(cases(16))]

    /// A user script, even one that writes the archive's own boundary, ends up as one part of
    /// a MIME archive whose platform part carries the trust intact.
    #[test]
    fn scripts_keep_the_platform_part(body in "([a-z =#-]{0,8}\n?|--==KUBEVM_BOUNDARY==(--)?\n|Content-Type: text/cloud-config\n){0,6}") {
        let user = format!("#!/bin/sh\n{body}");
        let data = build(&plan_with(user.clone())).unwrap().unwrap();
        let parts = mime_parts(&data.text);
        prop_assert_eq!(parts.len(), 2, "{}", data.text);
        prop_assert!(parts[0].1.ends_with(&user) || parts[0].1 == user || parts[0].1.trim_end() == user.trim_end(), "{:?}", parts);
        prop_assert_eq!(parts[1].0.as_str(), "kubevm-platform.cfg");
        let kept = cloud_config_keeps_trust(&parts[1].1);
        prop_assert!(kept.is_ok(), "{:?}", kept);
    }
}
