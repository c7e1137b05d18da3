//! Every command refuses a locally checkable bad input before its first request (issue 37
//! item 6): exit 2, one line on stderr, nothing in the emulator's request log.
//!
//! The commands come from the CLI itself (`kubectl-vm generate-docs DIR` writes one man page per
//! command from the clap definition): a command without an entry in `CASES` fails the test, so a
//! new command cannot be forgotten.
//!
//! Three kinds of refusal:
//! - `Local`: the command's own check; no request at all.
//! - `Discovery`: the check depends on the platform (a disk kind, a Deckhouse-only flag), so it
//!   follows the discovery round trip: the only requests allowed are that `GET /apis`.
//! - `Clap`: clap's own parser refuses the value (a duration, a number out of range, an
//!   unexpected argument); its message is clap's (an `error:` line, then a hint), exit 2, no
//!   request.

use std::collections::BTreeSet;

use crate::common::{BIN, Env, stderr};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Local,
    Discovery,
    Clap,
}
use Kind::{Clap, Discovery, Local};

/// Not a DNS-1123 name (upper case, `_`, `!`).
const BAD: &str = "Bad_Name!";
/// A label selector the API server would refuse (an unclosed set).
const BAD_SELECTOR: &str = "a in (b";

/// One bad input: how it is refused and the arguments after the command's name.
type Case = (Kind, &'static [&'static str]);

/// `FILE` is replaced by a small raw image in the test's directory.
const CASES: &[(&str, &[Case])] = &[
    (
        "ansible-inventory",
        &[
            (Local, &["-l", BAD_SELECTOR]),
            (Local, &["--list", "--host", "web"]),
            (Local, &["--group-by-label", ""]),
            (Local, &["--ca-namespace", BAD]),
        ],
    ),
    ("ca", &[(Clap, &["nosuch"])]),
    ("ca init", &[(Clap, &["--signer", "--replicas", "0"])]),
    ("ca migrate", &[(Clap, &["extra"])]),
    (
        "ca revoke",
        &[
            (Clap, &["--key"]),
            (Local, &["--serial", "0"]),
            (Local, &["--key-id", ""]),
            (Clap, &["--serial", "1", "--key-id", "x"]),
        ],
    ),
    (
        "ca rotate",
        &[
            (Clap, &["extra"]),
            (Clap, &["--renew-before", "0"]),
            (Clap, &["--renew-before", "1d", "--finish"]),
        ],
    ),
    (
        "ca show",
        &[(Clap, &["-o", "xml"]), (Local, &["--ca-namespace", BAD])],
    ),
    ("clone", &[(Local, &["web", BAD]), (Local, &[BAD, "new"])]),
    (
        "collect-debug-info",
        &[(Local, &[BAD]), (Clap, &["web", "--since", "soon"])],
    ),
    ("completion", &[(Clap, &["nosuchshell"])]),
    ("completion bash", &[(Clap, &["extra"])]),
    ("completion elvish", &[(Clap, &["extra"])]),
    ("completion fish", &[(Clap, &["extra"])]),
    ("completion install", &[(Clap, &["extra"])]),
    ("completion powershell", &[(Clap, &["extra"])]),
    ("completion zsh", &[(Clap, &["extra"])]),
    (
        "console",
        &[(Local, &[BAD]), (Clap, &["web", "--timeout", "soon"])],
    ),
    (
        "create",
        &[
            (Local, &[BAD]),
            (Local, &["new1", "--memory", "0"]),
            (Local, &["new1", "--memory", "lots"]),
            (Local, &["new1", "--cpu", "0"]),
            (Local, &["new1", "--hostname", BAD]),
            (Local, &["new1", "--ca-namespace", BAD]),
            (Local, &["new1", "--node-selector", "bad key=v"]),
            (Local, &["new1", "--node-selector", "disktype-"]),
            (Local, &["new1", "--toleration", "gpu=true:NoRun"]),
            (Local, &["new1", "--node-affinity", "zone"]),
            (Local, &["new1", "--spread-by", "bad key"]),
            (Local, &["new1", "--priority-class", BAD]),
            (
                Local,
                &[
                    "new1",
                    "--image",
                    "quay.io/containerdisks/ubuntu:24.04",
                    "--spread-by",
                    "hostname",
                ],
            ),
            (
                Discovery,
                &[
                    "new1",
                    "--image",
                    "quay.io/containerdisks/fedora:42",
                    "--ip",
                    "10.0.0.5",
                ],
            ),
            (
                Discovery,
                &[
                    "new1",
                    "--image",
                    "quay.io/containerdisks/fedora:42",
                    "--network",
                    "Bad_Name",
                ],
            ),
            (
                Local,
                &[
                    "new1",
                    "--network",
                    "storage",
                    "--ip",
                    "storage=192.168.50.0/24",
                ],
            ),
            (
                Local,
                &["new1", "--network", "storage", "--ip", "storage=10.0.0.5"],
            ),
            (
                Local,
                &[
                    "new1",
                    "--network",
                    "storage",
                    "--ip",
                    "storage=10.0.0.5/40",
                ],
            ),
            (
                Local,
                &["new1", "--network", "storage", "--ip", "other=10.0.0.5/24"],
            ),
            (
                Local,
                &[
                    "new1",
                    "--network",
                    "storage",
                    "--ip",
                    "storage=10.0.0.5/24",
                    "--replicas",
                    "2",
                ],
            ),
        ],
    ),
    ("credentials", &[(Clap, &["nosuch"])]),
    (
        "credentials add-ssh-key",
        &[
            (
                Local,
                &[
                    BAD,
                    "-u",
                    "cloud",
                    "--value",
                    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl",
                ],
            ),
            (Local, &["web", "-u", "cloud", "--value", "not a key"]),
        ],
    ),
    (
        "credentials remove-ssh-key",
        &[(Local, &["web", "-u", "cloud", "--value", "not a key"])],
    ),
    (
        "credentials set-password",
        &[(Local, &[BAD, "-u", "cloud"])],
    ),
    (
        "delete",
        &[(Local, &[BAD, "-y"]), (Clap, &["web", "--timeout", "soon"])],
    ),
    ("disk", &[(Clap, &["nosuch"])]),
    (
        "disk attach",
        &[
            (Local, &[BAD, "data"]),
            (Local, &["web", BAD, "--size", "1Gi"]),
            (Local, &["web", "data", "--size", "0"]),
            (Local, &["web", "data", "--size", "lots"]),
            (
                Local,
                &["web", "data", "--size", "1Gi", "--serial", "bad serial!"],
            ),
            (Local, &["web", "data", "--size", "1Gi", "--name", BAD]),
            (Local, &["web", "nosuchkind/data"]),
            // vd/ is Deckhouse's: known only after discovery.
            (Discovery, &["web", "vd/data"]),
        ],
    ),
    (
        "disk detach",
        &[(Local, &[BAD, "data"]), (Local, &["web", BAD])],
    ),
    ("disk list", &[(Local, &[BAD])]),
    ("network", &[(Clap, &["nosuch"])]),
    (
        "network list",
        &[(Local, &[BAD]), (Clap, &["web", "-o", "bogus"])],
    ),
    (
        "disk resize",
        &[
            (Local, &[BAD, "rootdisk", "--size", "1Gi"]),
            (Local, &["web", "rootdisk", "--size", "0"]),
            (Local, &["web", BAD, "--size", "1Gi"]),
        ],
    ),
    (
        "enroll",
        &[
            (Local, &[BAD, "-u", "debian"]),
            (Local, &["web", "-u", "debian", "--ca-namespace", BAD]),
        ],
    ),
    (
        "evacuate-cancel",
        &[
            (Clap, &["pod", "web"]),
            (Local, &["vm", BAD]),
            (Local, &["vmi", "web", "-n", BAD]),
            (Local, &["node", BAD]),
        ],
    ),
    ("evict", &[(Local, &[BAD])]),
    (
        "export",
        &[
            (Local, &["vm/Bad_Name!"]),
            (Local, &["vm/web", "--checksum", "md5:zz"]),
            (Clap, &["vm/web", "--ttl", "soon"]),
        ],
    ),
    (
        "expose",
        &[
            (Local, &[BAD, "--port", "80"]),
            (Local, &["web", "--port", "0"]),
            (Local, &["web", "--port", "70000"]),
            (Local, &["web", "--port", "80", "--name", BAD]),
        ],
    ),
    ("fslist", &[(Local, &[BAD])]),
    ("instancetype", &[(Clap, &["nosuch"])]),
    (
        "instancetype list",
        &[(Local, &["-A", "-n", "default"]), (Clap, &["-o", "xml"])],
    ),
    ("get", &[(Local, &[BAD]), (Local, &["web", "-n", BAD])]),
    ("deps", &[(Local, &[BAD]), (Local, &["web", "-o", "wide"])]),
    ("guestosinfo", &[(Local, &[BAD])]),
    ("class", &[(Clap, &["nosuch"])]),
    ("class list", &[(Local, &["-A", "-n", "default"])]),
    ("image", &[(Clap, &["nosuch"])]),
    (
        "image create",
        &[
            (Local, &[BAD, "--url", "https://h/x.img"]),
            (Local, &["x", "--url", "ftp://h/x.img"]),
            (
                Local,
                &["x", "--url", "https://h/x", "--checksum", "sha256:0"],
            ),
            (Local, &["x", "--from", "xx/y"]),
            (Local, &["x", "--registry", "r/x", "--size", "lots"]),
            (Clap, &["x"]),
            (Clap, &["x", "--url", "https://h/x", "--registry", "r/x"]),
            (
                Local,
                &["x", "--registry", "r/x:1", "--schedule", "0 3 * *"],
            ),
            (
                Local,
                &["x", "--url", "https://h/x", "--schedule", "0 3 * * *"],
            ),
            (Local, &["x", "--file", "/nonexistent.img"]),
        ],
    ),
    ("image delete", &[(Local, &[BAD]), (Local, &["cvi/ns/x"])]),
    ("image get", &[(Local, &[BAD]), (Local, &["xx/y"])]),
    (
        "image list",
        &[
            (Local, &["-l", BAD_SELECTOR]),
            (Local, &["-A", "-n", "default"]),
        ],
    ),
    (
        "logs",
        &[
            (Local, &[BAD]),
            (Local, &["web", "--tail", "-5"]),
            (Local, &["web", "--since", "0s"]),
            (Clap, &["web", "--since", "soon"]),
        ],
    ),
    (
        "list",
        &[
            (Local, &["-l", BAD_SELECTOR]),
            (Local, &["-A", "-n", "default"]),
            (Local, &["-n", BAD]),
        ],
    ),
    ("memory-dump", &[(Clap, &["nosuch", "web"])]),
    (
        "memory-dump get",
        &[
            (Local, &[BAD, "--claim-name", "d"]),
            (Local, &["web", "--claim-name", BAD]),
            (Clap, &["web", "--create-claim"]),
            (Local, &["web", "--format", "gzip"]),
            (Local, &["web", "-o", "d.core", "--resume"]),
            (Clap, &["web", "-o", "d.core", "--format", "zip"]),
        ],
    ),
    (
        "memory-dump download",
        &[
            (Local, &[BAD, "-o", "d.core"]),
            (Local, &["web", "-o", "d.core", "--resume"]),
            (Local, &["web", "-o", "d.core", "--reuse", BAD]),
            (Clap, &["web", "-o", "d.core", "--download-timeout", "5x"]),
            (Clap, &["web", "-o", "d.core", "--format", "zip"]),
            (Clap, &["web"]),
        ],
    ),
    ("memory-dump remove", &[(Local, &[BAD])]),
    (
        "migrate",
        &[
            (Local, &[BAD]),
            (Local, &["web", "--node-selector", "=x"]),
            (Local, &["--cancel", "--all-on-node", BAD]),
            (Clap, &["--all-on-node", "node-1"]),
            (Clap, &["web", "--cancel", "--all-on-node", "node-1"]),
        ],
    ),
    (
        "migrate list",
        &[
            (Local, &["-l", BAD_SELECTOR]),
            (Local, &["-A", "-n", "default"]),
            (Clap, &["extra"]),
        ],
    ),
    (
        "pause",
        &[(Local, &[BAD]), (Local, &["-l", BAD_SELECTOR, "-y"])],
    ),
    (
        "port-forward",
        &[
            (Local, &[BAD, "8080:22"]),
            (Local, &["web", "70000"]),
            (Local, &["web", "http"]),
        ],
    ),
    ("preference", &[(Clap, &["nosuch"])]),
    ("preference list", &[(Local, &["-A", "-n", "default"])]),
    ("reset", &[(Local, &[BAD])]),
    (
        "restart",
        &[(Local, &[BAD]), (Local, &["-l", BAD_SELECTOR, "-y"])],
    ),
    (
        "scp",
        &[
            (Local, &["Bad_Name!:/etc/hosts", "/tmp/x"]),
            (Local, &["/tmp/a", "/tmp/b"]),
            (Local, &["web:/x", "/tmp/x", "--ca-namespace", BAD]),
        ],
    ),
    ("signer", &[(Clap, &["nosuch"])]),
    (
        "signer serve",
        &[(
            Clap,
            &[
                "--tls-cert-file",
                "c",
                "--tls-private-key-file",
                "k",
                "--listen",
                "nowhere",
            ],
        )],
    ),
    ("set", &[(Clap, &["nosuch"])]),
    (
        "set network",
        &[
            (Local, &[BAD, "--add", "storage"]),
            (Local, &["web"]),
            (Local, &["web", "--add", "=storage"]),
            (Discovery, &["web", "--add", "Bad_Name"]),
            (Discovery, &["web", "--add", "storage=infra/Bad_NAD"]),
            (Discovery, &["web", "--remove", BAD]),
        ],
    ),
    (
        "set policy",
        &[
            (Local, &[BAD, "--label", "a=b"]),
            (Local, &["web", "--label", "bad key=x"]),
            (Local, &["web", "--annotation", "nokey"]),
            (Local, &["web"]),
            (Discovery, &["web", "--run-strategy", "Sometimes"]),
        ],
    ),
    (
        "set placement",
        &[
            (Local, &[BAD, "--node-selector", "a=b"]),
            (Local, &["web", "--toleration", "k:Bogus"]),
            (Local, &["web", "--node-selector", "bad!key=v"]),
            (Local, &["web", "--priority-class", BAD]),
            (Local, &["web", "--node-affinity", "zone"]),
            (Local, &["web", "--spread-by", "bad key"]),
            (Local, &["web"]),
        ],
    ),
    (
        "set resources",
        &[
            (Local, &[BAD, "--cpu", "2"]),
            (Local, &["web", "--memory", "2Xi"]),
            (Local, &["web", "--cpu", "0"]),
            (Local, &["web", "--core-fraction", "250%"]),
            (Clap, &["web", "--cpu", "two"]),
            (Discovery, &["web", "--core-fraction", "50%"]),
        ],
    ),
    ("snapshot", &[(Clap, &["nosuch"])]),
    (
        "snapshot create",
        &[(Local, &[BAD]), (Local, &["web", BAD])],
    ),
    ("snapshot delete", &[(Local, &[BAD])]),
    ("snapshot list", &[(Local, &[BAD])]),
    (
        "snapshot restore",
        &[(Local, &[BAD]), (Local, &["snap", "--new-vm", BAD])],
    ),
    ("soft-reboot", &[(Local, &[BAD])]),
    (
        "ssh",
        &[
            (Local, &[BAD]),
            (Local, &["web", "-L", "bad"]),
            (Local, &["web", "--ca-namespace", BAD]),
        ],
    ),
    (
        "ssh-cert",
        &[
            (Local, &["Bad_Name!.default.vm"]),
            (Local, &["web.default.vm", "--ca-namespace", BAD]),
        ],
    ),
    (
        "ssh-config",
        &[
            (Local, &["-l", "bad user!"]),
            (Local, &["--ca-namespace", BAD]),
        ],
    ),
    ("ssh-known-hosts", &[(Local, &["--ca-namespace", BAD])]),
    (
        "start",
        &[(Local, &[BAD]), (Local, &["-l", BAD_SELECTOR, "-y"])],
    ),
    (
        "stop",
        &[
            (Local, &[BAD]),
            (Local, &["-l", BAD_SELECTOR, "-y"]),
            (Clap, &["web", "--timeout", "soon"]),
        ],
    ),
    ("unpause", &[(Local, &[BAD])]),
    (
        "upload",
        &[
            (Local, &["FILE", "dv/Bad_Name"]),
            (Local, &["FILE", "dv/up", "--size", "0"]),
            (Local, &["FILE", "dv/up", "--size", "lots"]),
        ],
    ),
    ("userlist", &[(Local, &[BAD])]),
    ("version", &[(Clap, &["-o", "xml"])]),
    ("vnc", &[(Local, &[BAD])]),
    ("vnc screenshot", &[(Local, &[BAD, "-o", "FILE.png"])]),
];

/// The commands the CLI defines: one man page each (`kubectl-vm-disk-attach.1` is
/// `disk attach`); `kubectl-vm.1` itself is left out.
fn commands(env: &Env) -> BTreeSet<String> {
    let dir = env.dir.path().join("docs");
    let out = env
        .command(BIN)
        .arg("generate-docs")
        .arg(&dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let mut found = BTreeSet::new();
    for entry in std::fs::read_dir(dir.join("man")).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if let Some(cmd) = name
            .strip_suffix(".1")
            .and_then(|n| n.strip_prefix("kubectl-vm-"))
        {
            found.insert(cmd.to_owned());
        }
    }
    assert!(found.len() > 40, "{found:?}");
    found
}

#[test]
fn every_command_refuses_bad_input_before_any_request() {
    let env = Env::kubevirt();
    let known = commands(&env);
    // Multi-word commands are pages `a-b`, and some commands have dashes of their own: match
    // each table entry's page name.
    let listed: BTreeSet<String> = CASES.iter().map(|(c, _)| c.replace(' ', "-")).collect();
    let missing: Vec<_> = known.difference(&listed).collect();
    assert!(
        missing.is_empty(),
        "commands without bad inputs in CASES: {missing:?}"
    );
    let stale: Vec<_> = listed.difference(&known).collect();
    assert!(
        stale.is_empty(),
        "CASES names commands the CLI lacks: {stale:?}"
    );

    let file = env.dir.path().join("disk.raw");
    std::fs::write(&file, vec![0u8; 1 << 20]).unwrap();
    let png = env.dir.path().join("shot.png");
    let mut failures = vec![];
    let mut count = 0;
    for (command, cases) in CASES {
        for (kind, bad) in *cases {
            count += 1;
            let mut args: Vec<String> = command.split(' ').map(str::to_owned).collect();
            args.extend(bad.iter().map(|a| match *a {
                "FILE" => file.to_str().unwrap().to_owned(),
                "FILE.png" => png.to_str().unwrap().to_owned(),
                other => other.to_owned(),
            }));
            env.emulator.clear_requests();
            let out = env.command(BIN).args(&args).output().unwrap();
            let err = stderr(&out);
            let requests: Vec<String> = env
                .emulator
                .requests()
                .iter()
                .map(|r| format!("{} {}", r.method, r.path))
                .collect();
            let allowed: &[&str] = if *kind == Discovery {
                &["GET /apis"]
            } else {
                &[]
            };
            let mut wrong = vec![];
            if out.status.code() != Some(2) {
                wrong.push(format!("exit {:?}", out.status.code()));
            }
            if *kind == Clap {
                if !err.starts_with("error: ") {
                    wrong.push("not clap's error".into());
                }
            } else if err.lines().count() != 1 {
                wrong.push(format!("{} lines on stderr", err.lines().count()));
            }
            if requests.iter().any(|r| !allowed.contains(&r.as_str())) {
                wrong.push(format!("requests {requests:?}"));
            }
            if !wrong.is_empty() {
                failures.push(format!(
                    "{args:?} ({kind:?}): {}\n    {}",
                    wrong.join(", "),
                    err.trim_end().replace('\n', "\n    ")
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {count} bad inputs were not refused before any request:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
