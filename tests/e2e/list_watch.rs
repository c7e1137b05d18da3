//! `list` at scale and `list -w` like kubectl: pages of 500, AGE at each event, rows aligned
//! with the header, a 410 Gone re-lists and goes on, `-o json` prints one object per event.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::{BIN, Env, ok};

/// A running `kubectl-vm list -w …` whose stdout lines arrive on a channel.
struct Watch {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Watch {
    fn start(env: &Env, args: &[&str]) -> Watch {
        let mut child = env.spawn(args);
        let (tx, lines) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Watch { child, lines }
    }

    #[track_caller]
    fn next(&mut self) -> String {
        match self.lines.recv_timeout(Duration::from_secs(20)) {
            Ok(line) => line,
            Err(_) => {
                let _ = self.child.kill();
                let mut err = String::new();
                if let Some(mut e) = self.child.stderr.take() {
                    let _ = e.read_to_string(&mut err);
                }
                panic!("no line from list -w within 20s; stderr: {err}");
            }
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn vm(ns: &str, name: &str, created: &str) -> Value {
    json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": name, "namespace": ns, "creationTimestamp": created},
        "spec": {"runStrategy": "Halted", "template": {"spec": {"domain": {"devices": {}}}}},
        "status": {"printableStatus": "Stopped"}})
}

fn set_status(env: &Env, ns: &str, name: &str, status: &str) {
    let mut vm = env
        .emulator
        .objects("kubevirt.io", "virtualmachines", Some(ns))
        .into_iter()
        .find(|vm| vm["metadata"]["name"] == name)
        .unwrap();
    vm["status"]["printableStatus"] = status.into();
    env.emulator.put_object(vm);
}

/// Character offsets where each header column starts.
fn column_starts(header: &str) -> Vec<usize> {
    let mut starts = vec![0];
    let bytes = header.as_bytes();
    for i in 1..bytes.len() {
        if bytes[i] != b' ' && bytes[i - 1] == b' ' {
            starts.push(i);
        }
    }
    starts
}

#[test]
fn watch_age_is_the_age_at_each_event() {
    let env = Env::kubevirt();
    let created = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(100);
    env.emulator.put_object(vm(
        "aged",
        "old",
        &created.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
    ));
    let mut watch = Watch::start(&env, &["list", "-n", "aged", "-w"]);
    assert!(watch.next().starts_with("NAME"));
    let first = watch.next();
    assert!(first.starts_with("old "), "{first}");
    // Not synchronisation: time has to pass for the age at the event to differ from the age
    // at the first row, which is what this test tells apart.
    std::thread::sleep(Duration::from_secs(4));
    let before = (jiff::Timestamp::now() - created).get_seconds();
    set_status(&env, "aged", "old", "Starting");
    let line = watch.next();
    let after = (jiff::Timestamp::now() - created).get_seconds();
    let cells: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(cells[..2], ["old", "Starting"], "{line}");
    // kubectl's HumanDuration prints seconds below two minutes as "Ns".
    let age: i64 = cells[cells.len() - 1]
        .trim_end_matches('s')
        .parse()
        .unwrap();
    assert!(
        (before..=after + 1).contains(&age),
        "AGE {age}s at the event, expected between {before}s and {after}s: {line}"
    );
}

#[test]
fn watch_rows_line_up_with_the_header() {
    let env = Env::kubevirt();
    let long = "a-virtual-machine-with-a-rather-long-name";
    env.emulator
        .put_object(vm("align", long, "2026-01-01T00:00:00Z"));
    env.emulator
        .put_object(vm("align", "db", "2026-01-01T00:00:00Z"));
    let mut watch = Watch::start(&env, &["list", "-n", "align", "-w"]);
    let header = watch.next();
    let starts = column_starts(&header);
    let first = watch.next();
    assert_eq!(column_starts(&first), starts, "\n{header}\n{first}");
    watch.next();
    // A status no wider than what was printed (a wider cell would widen its column).
    set_status(&env, "align", "db", "Running");
    let row = watch.next();
    assert!(row.starts_with("db "), "{row}");
    // NAME STATUS NODE IP AGE: each cell starts under its header.
    let cells: Vec<&str> = row.split_whitespace().collect();
    let mut at = Vec::new();
    let mut from = 0;
    for cell in &cells {
        let i = row[from..].find(cell).unwrap() + from;
        at.push(i);
        from = i + cell.len();
    }
    assert_eq!(at, starts, "\n{header}\n{row}");
}

#[test]
fn watch_relists_after_410_gone_and_goes_on() {
    let env = Env::kubevirt();
    let mut watch = Watch::start(&env, &["list", "-n", "dev", "-w"]);
    assert!(watch.next().starts_with("NAME"));
    assert!(watch.next().starts_with("api "));
    assert!(watch.next().starts_with("batch "));
    // A change the tool does not watch moves the resource version on; then everything up to
    // it is compacted, the open watches end and re-watching from the old version is Gone.
    env.emulator
        .put_object(vm("elsewhere", "x", "2026-01-01T00:00:00Z"));
    env.emulator.clear_requests();
    env.emulator.expire_resource_versions();
    // The re-list is seen; then a later change still arrives.
    let relisted = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        env.emulator.requests().iter().any(|r| {
            r.path == "/apis/kubevirt.io/v1/namespaces/dev/virtualmachines"
                && !r.query.contains("watch=")
                && r.status == 200
        })
    });
    assert!(
        relisted,
        "no re-list after 410: {:?}",
        env.emulator.requests()
    );
    // The change is made once the watch that follows the re-list is open.
    let rewatched = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        let requests = env.emulator.requests();
        let relist = requests.iter().position(|r| {
            r.path == "/apis/kubevirt.io/v1/namespaces/dev/virtualmachines"
                && !r.query.contains("watch=")
        });
        relist.is_some_and(|i| {
            requests[i..].iter().any(|r| {
                r.path == "/apis/kubevirt.io/v1/namespaces/dev/virtualmachines"
                    && r.query.contains("watch=")
                    && r.status == 200
            })
        })
    });
    assert!(
        rewatched,
        "no watch after the re-list: {:?}",
        env.emulator.requests()
    );
    set_status(&env, "dev", "batch", "Starting");
    let line = watch.next();
    let cells: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(cells[..2], ["batch", "Starting"], "{line}");
    assert!(watch.child.try_wait().unwrap().is_none(), "still watching");
}

#[test]
fn watch_json_prints_one_object_per_event() {
    let env = Env::kubevirt();
    let mut child = env
        .command(BIN)
        .args(["list", "-n", "dev", "-w", "-o", "json"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for value in serde_json::Deserializer::from_reader(out).into_iter::<Value>() {
            let Ok(value) = value else { break };
            if tx.send(value).is_err() {
                break;
            }
        }
    });
    let next = || {
        rx.recv_timeout(Duration::from_secs(20))
            .expect("a JSON object")
    };
    let names: Vec<Value> = (0..2).map(|_| next()).collect();
    for (object, name) in names.iter().zip(["api", "batch"]) {
        assert_eq!(
            object["kind"], "VirtualMachine",
            "no List wrapper: {object}"
        );
        assert_eq!(object["metadata"]["name"], name);
    }
    set_status(&env, "dev", "batch", "Starting");
    let event = next();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(event["kind"], "VirtualMachine");
    assert_eq!(event["status"]["printableStatus"], "Starting");
}

#[test]
fn list_reads_pages_of_500_and_prints_them_aligned() {
    let env = Env::kubevirt();
    for i in 0..520 {
        env.emulator
            .put_object(vm("many", &format!("vm-{i:04}"), "2026-01-01T00:00:00Z"));
    }
    // One long name on the second page: the first page's columns are narrower.
    env.emulator.put_object(vm(
        "many",
        "vm-9999-with-a-much-longer-name-than-the-rest",
        "2026-01-01T00:00:00Z",
    ));
    env.emulator.clear_requests();
    let out = ok(env.vm(&["list", "-n", "many"]));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 1 + 521, "header and every VM");
    assert!(lines[1].starts_with("vm-0000 "));
    assert!(lines[521].starts_with("vm-9999-with"));
    let lists: Vec<String> = env
        .emulator
        .requests()
        .into_iter()
        .filter(|r| r.path == "/apis/kubevirt.io/v1/namespaces/many/virtualmachines")
        .map(|r| r.query)
        .collect();
    assert_eq!(lists.len(), 2, "{lists:?}");
    assert!(lists.iter().all(|q| q.contains("limit=500")), "{lists:?}");
    assert!(lists[1].contains("continue="), "{lists:?}");
    // Rows of the first page line up with the header (pages never shift earlier columns
    // left of the header's).
    let starts = column_starts(lines[0]);
    assert_eq!(
        column_starts(lines[1])[..2],
        starts[..2],
        "{}\n{}",
        lines[0],
        lines[1]
    );
}
