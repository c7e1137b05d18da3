//! `kubectl vm export` against the emulator's export server, on both platforms. Expected
//! checksums are written out ([`DIGESTS`], from an independent implementation of the content
//! definition) and compared with `sha256sum` of the downloaded file, never with the tool's own
//! hasher or the emulator's generator.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kubevm_emulator::kubevirt::export::ExportFaults;
use serde_json::{Value, json};

use crate::common::{Env, stderr, stdout};
use crate::lifecycle::eventually;

pub(crate) const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
pub(crate) const KV_EXPORTS: (&str, &str) = ("export.kubevirt.io", "virtualmachineexports");
pub(crate) const DATA_EXPORTS: (&str, &str) = ("storage-foundation.deckhouse.io", "dataexports");

pub(crate) fn pvc(name: &str, size: u64) -> Value {
    json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size.to_string()}}},
        "status": {"phase": "Bound", "capacity": {"storage": size.to_string()}}})
}

/// KubeVirt: a stopped VM `exp` with a DataVolume disk `exp-root` and a PVC `exp-data`.
pub(crate) fn kubevirt(root: u64, data: u64) -> Env {
    let env = Env::kubevirt();
    env.emulator.put_object(pvc("exp-root", root));
    env.emulator.put_object(pvc("exp-data", data));
    env.emulator.put_object(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": "exp", "namespace": "default"},
        "spec": {"runStrategy": "Halted", "template": {"spec": {
            "domain": {"devices": {"disks": [{"name": "root", "disk": {"bus": "virtio"}}, {"name": "data", "disk": {"bus": "virtio"}}]}},
            "volumes": [{"name": "root", "dataVolume": {"name": "exp-root"}},
                        {"name": "data", "persistentVolumeClaim": {"claimName": "exp-data"}}]}}},
        "status": {"printableStatus": "Stopped"}
    }));
    env
}

/// Deckhouse: a ready VirtualDisk `big` on PVC `vd-big-0001`.
pub(crate) fn deckhouse(size: u64) -> Env {
    let env = Env::deckhouse();
    env.emulator.put_object(pvc("vd-big-0001", size));
    env.emulator.put_object(json!({
        "apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualDisk",
        "metadata": {"name": "big", "namespace": "default"},
        "spec": {"persistentVolumeClaim": {"size": size.to_string()}},
        "status": {"phase": "Ready", "capacity": size.to_string(),
            "target": {"persistentVolumeClaimName": "vd-big-0001"}}
    }));
    env
}

/// SHA-256 of the first SIZE bytes the emulator serves for PVC `default/PVC` at content
/// GENERATION (0, or 1 after `change_export_content`), written out. Computed once by
/// `tests/tools/export-content-sha256.py default/PVC GENERATION SIZE…`, an implementation of the
/// content definition (tests/emulator/src/kubevirt/export.rs `fill`) in standard-library Python that
/// shares no code with the emulator or the tool; add a row the same way for a new size.
#[rustfmt::skip]
const DIGESTS: &[(&str, u64, u64, &str)] = &[
    ("exp-root", 0, MIB, "02b7f73d7a4953dd8c1d02fb57d5a57db94173ba9fd7fc031298267c3fabff53"),
    ("exp-root", 0, 2 * MIB, "b99a584e3e3a00a677342aba18bc9dcef6256d30a454883928daec39fe41fec6"),
    ("exp-root", 0, 3 * MIB, "22c5582e503833e6ba9ec6ca6209d751d8acdaf196000f8e20f7023bf6ea4301"),
    ("exp-root", 0, 4 * MIB, "8a8ec2573c9068175885a869f2dc90541faae1fe1f9562ae4f8e6652642fe7c7"),
    ("exp-root", 0, 5 * MIB, "c38fb80b6ed1bf7e69fa09209011d9d9753724a4850b90a33bb7e0e9052ada94"),
    ("exp-root", 0, 6 * MIB, "8301f1bb0fef131f17bc5e97c1bc34feb4af6c40bf94581d998a171e57dbc71e"),
    ("exp-root", 0, 48 * MIB, "b249cb4c1bb0f68d538f23dd8138a83fa0f424c33a61ea07afd99c3c6f51e5ad"),
    ("exp-root", 0, 96 * MIB, "ed9ff20633d516313a3e274590ee1ad71852ea73d131d81b7677df67e73149b3"),
    ("exp-root", 0, 256 * MIB, "10b500434d717f5f2510af0382ded86431127f927b27f468281902d984697479"),
    ("exp-root", 0, GIB, "5fac2f131336f3c5d7f8f370750f60fa491a526a5b2e3c89e891e2092ae65561"),
    ("exp-root", 1, 8 * MIB, "36d36c96892db3bd069659cc060ebb874e8ae8a2e4ccd50de44086db339b10f4"),
    ("exp-data", 0, 2 * MIB, "2e5f94bb5049dca2ebfda6c57f3e908914b53fc15e08655181289284bb17205b"),
    ("exp-data", 0, 3 * MIB, "b79ecfb1808eb71bc51e11e90680658ddca398bcf61bd0848ea1178e7d8789ce"),
    ("vd-big-0001", 0, MIB, "dc58032d7962a1bc7bf6858681b04954410357fad3d62a5004e227a238b9dc16"),
    ("vd-big-0001", 0, 4 * MIB, "4783c06e655ce3c2446af1a4a72f7576c86f7e9abd8b919835e58dcfb5dcf2ce"),
    ("vd-big-0001", 0, 16 * MIB, "55b4a9af29b325c6b9a10dd6f89597e152387b6cf0f7fb5127697061a92a7124"),
    ("vd-big-0001", 0, 24 * MIB, "40368bd286dca38615337b7a135cf7065db13aa7057abf1901abbe532f617781"),
    ("vd-big-0001", 0, 96 * MIB, "56c9526e2a784e0e084a469bc98cab7d9948eb115c6bc9ed86b9da6dc042d960"),
    ("vd-big-0001", 0, 256 * MIB, "5000308ff59938e80b03a348b35c637c9ab89865709056985ddf14210053b4fa"),
    ("vd-big-0001", 0, GIB, "da6d5354a176a6785d6df8382ac17d8d07e0c513ec0b1e2e57b15c9a2a5d195f"),
];

/// The written-out SHA-256 of what the server serves for `pvc` (generation 0) up to `size`.
#[track_caller]
pub(crate) fn reference_sha256(pvc: &str, size: u64) -> String {
    changed_reference_sha256(pvc, 0, size)
}

/// Like [`reference_sha256`] for content `generation`.
#[track_caller]
pub(crate) fn changed_reference_sha256(pvc: &str, generation: u64, size: u64) -> String {
    DIGESTS
        .iter()
        .find(|(p, g, s, _)| *p == pvc && *g == generation && *s == size)
        .map(|(.., digest)| digest.to_string())
        .unwrap_or_else(|| {
            panic!(
                "no written-out digest for default/{pvc} generation {generation} size {size}: \
                 run tests/tools/export-content-sha256.py default/{pvc} {generation} {size}"
            )
        })
}

pub(crate) fn sha256_of(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()[..64].to_string()
}

/// Bytes of `path` in the page cache, by util-linux's `fincore`.
fn cached_bytes(path: &Path) -> u64 {
    let out = Command::new("fincore")
        .args(["--bytes", "--noheadings", "--output", "RES"])
        .arg(path)
        .output()
        .expect("fincore (util-linux) is installed");
    assert!(out.status.success(), "{}", stderr(&out));
    String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Whether the file system under `dir` takes `O_DIRECT` writes (probed with `dd oflag=direct`).
fn direct_io_works(dir: &Path) -> bool {
    let probe = dir.join("direct-probe");
    let ok = Command::new("dd")
        .args([
            "if=/dev/zero",
            "bs=4096",
            "count=1",
            "oflag=direct",
            "status=none",
        ])
        .arg(format!("of={}", probe.display()))
        .status()
        .is_ok_and(|s| s.success());
    let _ = std::fs::remove_file(probe);
    ok
}

/// A downloaded image is written around the page cache: at most a few pages of it stay
/// cached (the unaligned tail), not the whole volume. The test directory must be on a file
/// system that takes `O_DIRECT` (any disk file system; tmpfs since Linux 6.6): elsewhere the
/// tool falls back to the page cache by design and there is nothing to check, so the test
/// fails and says where to run it instead of passing without checking.
#[track_caller]
fn assert_page_cache_spared(path: &Path) {
    let dir = path.parent().unwrap();
    assert!(
        direct_io_works(dir),
        "O_DIRECT is refused under {}: run the tests with TMPDIR on a disk file system",
        dir.display()
    );
    let cached = cached_bytes(path);
    assert!(
        cached < MIB,
        "{cached} bytes of {} are in the page cache",
        path.display()
    );
}

pub(crate) fn objects(env: &Env, (group, plural): (&str, &str)) -> Vec<Value> {
    env.emulator.objects(group, plural, Some("default"))
}

pub(crate) fn names(objs: &[Value]) -> Vec<String> {
    objs.iter()
        .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
        .collect()
}

pub(crate) fn export(env: &Env, args: &[&str]) -> std::process::Output {
    let mut all = vec!["export"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--retry-delay", "50ms"]);
    env.vm(&all)
}

#[track_caller]
pub(crate) fn succeeded(output: &std::process::Output) -> String {
    assert!(
        output.status.success(),
        "export failed ({:?}):\n{}",
        output.status.code(),
        stderr(output)
    );
    stderr(output)
}

pub(crate) fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// A 1 GiB volume on each platform: the file's sha256 (by sha256sum) equals the source's,
/// the printed digest and FILE.sha256 agree and `sha256sum -c` accepts it, the file is 0600,
/// it did not go through the page cache, and what the run created is gone while everything
/// else stays.
#[test]
fn one_gib_volume_matches_the_source_on_both_platforms() {
    // KubeVirt, pvc/ target; an unrelated export and Secret must survive.
    let env = kubevirt(GIB, MIB);
    env.emulator
        .put_object(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "unrelated", "namespace": "default"}, "data": {"token": "eA=="}}));
    env.emulator.put_object(json!({"apiVersion": "export.kubevirt.io/v1", "kind": "VirtualMachineExport",
        "metadata": {"name": "someone-elses", "namespace": "default"},
        "spec": {"source": {"apiGroup": "", "kind": "PersistentVolumeClaim", "name": "exp-data"}, "tokenSecretRef": "unrelated"}}));
    let secrets_before = names(&env.emulator.objects("", "secrets", Some("default")));
    let file = env.dir.path().join("root.img");
    let want = reference_sha256("exp-root", GIB);
    let start = Instant::now();
    let err = succeeded(&export(
        &env,
        &["pvc/exp-root", "-o", file.to_str().unwrap()],
    ));
    eprintln!("kubevirt 1 GiB: {:.1}s", start.elapsed().as_secs_f64());
    assert_page_cache_spared(&file);
    assert_eq!(sha256_of(&file), want);
    assert!(err.contains(&format!("sha256:{want}")), "{err}");
    assert!(err.contains("external link"), "{err}");
    let sum = std::fs::read_to_string(env.dir.path().join("root.img.sha256")).unwrap();
    assert_eq!(sum, format!("{want}  root.img\n"));
    let check = Command::new("sha256sum")
        .args(["-c", "root.img.sha256"])
        .current_dir(env.dir.path())
        .output()
        .unwrap();
    assert!(check.status.success(), "{}", stdout(&check));
    assert_eq!(mode(&file), 0o600);
    assert!(!env.dir.path().join("root.img.partial").exists());
    assert_eq!(names(&objects(&env, KV_EXPORTS)), ["someone-elses"]);
    assert_eq!(
        names(&env.emulator.objects("", "secrets", Some("default"))),
        secrets_before
    );
    // Nothing was fetched twice.
    assert_eq!(env.emulator.export_bytes_served(), GIB);

    // Deckhouse, bare name = vd/.
    let env = deckhouse(GIB);
    let file = env.dir.path().join("big.img");
    let want = reference_sha256("vd-big-0001", GIB);
    let start = Instant::now();
    let err = succeeded(&export(&env, &["big", "-o", file.to_str().unwrap()]));
    eprintln!("deckhouse 1 GiB: {:.1}s", start.elapsed().as_secs_f64());
    assert_page_cache_spared(&file);
    assert_eq!(sha256_of(&file), want);
    assert!(err.contains(&format!("sha256:{want}")), "{err}");
    assert!(err.contains("created DataExport de-vd-big-"), "{err}");
    assert!(objects(&env, DATA_EXPORTS).is_empty());
    assert_eq!(mode(&file), 0o600);
}

/// Cut points spread over the transfer (seeded from the clock, printed for reproduction).
fn random_cuts(size: u64, n: usize) -> Vec<u64> {
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let mut cuts: Vec<u64> = (0..n)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            1 + seed % (size - 1)
        })
        .collect();
    cuts.sort_unstable();
    eprintln!("cut points: {cuts:?}");
    cuts
}

/// Connections cut at random points and a 503: the run retries by itself, resumes at the byte
/// offset, ends with the right checksum, and the server sent less than 1% twice.
#[test]
fn transfers_cut_at_random_points_resume_within_the_run() {
    let size = 256 * MIB;
    for flavor in ["kubevirt", "deckhouse"] {
        let (env, target, pvc) = if flavor == "kubevirt" {
            (kubevirt(size, MIB), "vm/exp", "exp-root")
        } else {
            (deckhouse(size), "vd/big", "vd-big-0001")
        };
        env.emulator.set_export_faults(ExportFaults {
            cut_at: random_cuts(size, 6),
            fail_5xx: 1,
            ..Default::default()
        });
        let file = env.dir.path().join("disk.img");
        let want = reference_sha256(pvc, size);
        let err = succeeded(&export(
            &env,
            &[target, "--volume", pvc, "-o", file.to_str().unwrap()],
        ));
        assert!(err.contains("retry 1/8"), "{flavor}: {err}");
        assert_eq!(sha256_of(&file), want, "{flavor}");
        let served = env.emulator.export_bytes_served();
        assert!(
            served >= size && served - size < size / 100,
            "{flavor}: served {served} for {size}"
        );
    }
}

/// A process killed mid-way leaves FILE.partial and the export; a rerun with --reuse and
/// --resume continues from the partial file and completes with the right checksum.
#[test]
fn killed_run_resumes_with_reuse_and_resume() {
    let size = 96 * MIB;
    for flavor in ["kubevirt", "deckhouse"] {
        let (env, target, pvc, kind) = if flavor == "kubevirt" {
            (kubevirt(size, MIB), "pvc/exp-root", "exp-root", KV_EXPORTS)
        } else {
            (deckhouse(size), "vd/big", "vd-big-0001", DATA_EXPORTS)
        };
        env.emulator.set_export_faults(ExportFaults {
            bytes_per_sec: Some(24 * MIB),
            ..Default::default()
        });
        let file = env.dir.path().join("disk.img");
        let partial = env.dir.path().join("disk.img.partial");
        let mut child = env
            .command(crate::common::BIN)
            .args(["export", target, "-o", file.to_str().unwrap()])
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::fs::metadata(&partial).map(|m| m.len()).unwrap_or(0) < 16 * MIB {
            assert!(Instant::now() < deadline, "{flavor}: no progress");
            std::thread::sleep(Duration::from_millis(50));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        let kept = std::fs::metadata(&partial).unwrap().len();
        assert!(kept < size && !file.exists(), "{flavor}");
        let exports = names(&objects(&env, kind));
        assert_eq!(exports.len(), 1, "{flavor}: the export stays");
        env.emulator.set_export_faults(ExportFaults::default());
        let served_before = env.emulator.export_bytes_served();
        let err = succeeded(&export(
            &env,
            &[
                target,
                "-o",
                file.to_str().unwrap(),
                "--reuse",
                &exports[0],
                "--resume",
            ],
        ));
        assert!(
            err.contains(&format!("resuming {}", partial.display())),
            "{flavor}: {err}"
        );
        assert_eq!(sha256_of(&file), reference_sha256(pvc, size), "{flavor}");
        // The second run fetched only what was missing.
        assert_eq!(
            env.emulator.export_bytes_served() - served_before,
            size - kept,
            "{flavor}"
        );
        // It was created by kubectl vm, so the completed run removes it.
        assert!(objects(&env, kind).is_empty(), "{flavor}");
    }
}

/// The source changed between runs: the ETag no longer matches, so --resume starts over and
/// says so; the result is the new content.
#[test]
fn resume_after_the_source_changed_starts_over() {
    let size = 8 * MIB;
    let env = kubevirt(size, MIB);
    let file = env.dir.path().join("disk.img");
    let out = export(
        &env,
        &["pvc/exp-root", "-o", file.to_str().unwrap(), "--keep"],
    );
    succeeded(&out);
    let name = names(&objects(&env, KV_EXPORTS)).pop().unwrap();
    // Leave a partial file as an interrupted run would (first 3 MiB), then change the data.
    let partial = env.dir.path().join("disk.img.partial");
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&partial, &bytes[..3 * MIB as usize]).unwrap();
    std::fs::write(
        env.dir.path().join("disk.img.partial.meta"),
        serde_json::to_vec(&json!({"etag": format!("\"{:016x}-{size:x}\"", env.emulator.export_content_key("default", "exp-root")), "size": size, "format": "raw"})).unwrap(),
    )
    .unwrap();
    std::fs::remove_file(&file).unwrap();
    env.emulator.change_export_content("default", "exp-root");
    let err = succeeded(&export(
        &env,
        &[
            "pvc/exp-root",
            "-o",
            file.to_str().unwrap(),
            "--reuse",
            &name,
            "--resume",
        ],
    ));
    assert!(err.contains("the source changed"), "{err}");
    assert_eq!(
        sha256_of(&file),
        changed_reference_sha256("exp-root", 1, size)
    );
}

/// A wrong --checksum fails with exit 1, leaves nothing under the final name, keeps the
/// export, and says how to resume.
#[test]
fn checksum_mismatch_fails_and_keeps_the_export() {
    let env = kubevirt(4 * MIB, MIB);
    let file = env.dir.path().join("disk.img");
    let wrong = format!("sha256:{}", "0".repeat(64));
    let out = export(
        &env,
        &[
            "pvc/exp-root",
            "-o",
            file.to_str().unwrap(),
            "--checksum",
            &wrong,
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("checksum mismatch"), "{err}");
    assert!(err.contains("--reuse export-pvc-exp-root-"), "{err}");
    assert!(!file.exists());
    assert!(!env.dir.path().join("disk.img.sha256").exists());
    assert_eq!(objects(&env, KV_EXPORTS).len(), 1);
    // With the right checksum the kept export completes the job and is removed.
    let right = format!("sha256:{}", reference_sha256("exp-root", 4 * MIB));
    let name = names(&objects(&env, KV_EXPORTS)).pop().unwrap();
    succeeded(&export(
        &env,
        &[
            "pvc/exp-root",
            "-o",
            file.to_str().unwrap(),
            "--checksum",
            &right,
            "--reuse",
            &name,
            "--resume",
        ],
    ));
    assert!(file.exists());
    assert!(objects(&env, KV_EXPORTS).is_empty());
}

/// A download that keeps failing (server errors beyond the retry bound) exits 1 and keeps the
/// export object, on both platforms.
#[test]
fn failed_download_keeps_the_export_object() {
    for flavor in ["kubevirt", "deckhouse"] {
        let (env, target, kind) = if flavor == "kubevirt" {
            (kubevirt(MIB, MIB), "pvc/exp-root", KV_EXPORTS)
        } else {
            (deckhouse(MIB), "vd/big", DATA_EXPORTS)
        };
        env.emulator.set_export_faults(ExportFaults {
            fail_5xx: 100,
            ..Default::default()
        });
        let file = env.dir.path().join("disk.img");
        let out = export(
            &env,
            &[target, "-o", file.to_str().unwrap(), "--retries", "2"],
        );
        assert_eq!(out.status.code(), Some(1), "{flavor}");
        let err = stderr(&out);
        assert!(err.contains("503"), "{flavor}: {err}");
        assert!(err.contains("was kept: resume with"), "{flavor}: {err}");
        assert_eq!(objects(&env, kind).len(), 1, "{flavor}");
        if flavor == "kubevirt" {
            // Its token Secret too (the export is useless without it).
            let tokens = env.emulator.objects("", "secrets", Some("default"));
            assert!(tokens.iter().any(|s| {
                s["metadata"]["name"]
                    .as_str()
                    .unwrap()
                    .starts_with("export-pvc-exp-root-")
            }));
        }
        assert!(!file.exists());
    }
}

/// Every volume of a VM into a directory named by -o, each with its checksum.
#[test]
fn all_volumes_of_a_vm_into_a_directory() {
    let env = kubevirt(6 * MIB, 2 * MIB);
    let dir = env.dir.path().join("exp-disks");
    succeeded(&export(&env, &["vm/exp", "-o", dir.to_str().unwrap()]));
    for (pvc, size) in [("exp-root", 6 * MIB), ("exp-data", 2 * MIB)] {
        let file = dir.join(format!("{pvc}.img"));
        assert_eq!(sha256_of(&file), reference_sha256(pvc, size), "{pvc}");
        assert!(dir.join(format!("{pvc}.img.sha256")).exists());
    }
    assert!(objects(&env, KV_EXPORTS).is_empty());
}

/// -o - streams one volume to a pipe; a VM with two volumes needs --volume.
#[test]
fn stdout_to_a_pipe() {
    let env = kubevirt(3 * MIB, MIB);
    let out = export(&env, &["vm/exp", "--volume", "exp-root", "-o", "-"]);
    succeeded(&out);
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(&out.stdout).unwrap();
    let sum = String::from_utf8(child.wait_with_output().unwrap().stdout).unwrap();
    assert_eq!(&sum[..64], reference_sha256("exp-root", 3 * MIB));
    let out = export(&env, &["vm/exp", "-o", "-"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("pick it with --volume"),
        "{}",
        stderr(&out)
    );
}

/// --format gzip writes the server's gzip stream; gunzip gives the raw bytes. --decompress
/// unpacks it on the fly.
#[test]
fn gzip_and_decompress() {
    let env = kubevirt(5 * MIB, MIB);
    let want = reference_sha256("exp-root", 5 * MIB);
    let gz = env.dir.path().join("disk.img.gz");
    succeeded(&export(
        &env,
        &[
            "pvc/exp-root",
            "--format",
            "gzip",
            "-o",
            gz.to_str().unwrap(),
        ],
    ));
    let gunzip = Command::new("sh")
        .arg("-c")
        .arg(format!("gzip -dc '{}' | sha256sum", gz.display()))
        .output()
        .unwrap();
    assert_eq!(&String::from_utf8(gunzip.stdout).unwrap()[..64], want);
    let raw = env.dir.path().join("disk.img");
    let err = succeeded(&export(
        &env,
        &["pvc/exp-root", "--decompress", "-o", raw.to_str().unwrap()],
    ));
    assert!(err.contains(&want), "{err}");
    assert_eq!(sha256_of(&raw), want);
}

/// --manifest prints the VM's manifest from the export's manifests link.
#[test]
fn manifest_of_a_vm() {
    let env = kubevirt(MIB, MIB);
    let out = export(&env, &["vm/exp", "--manifest"]);
    succeeded(&out);
    let docs: Vec<Value> = yaml_serde::Deserializer::from_str(&stdout(&out))
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect();
    let vm = docs.iter().find(|d| d["kind"] == "VirtualMachine").unwrap();
    assert_eq!(vm["metadata"]["name"], "exp");
    assert_eq!(
        vm["spec"]["template"]["spec"]["volumes"][0]["dataVolume"]["name"],
        "exp-root"
    );
    assert!(objects(&env, KV_EXPORTS).is_empty());
}

/// A running VM with a disk keeps the export waiting; the wait says why and the timeout fails
/// the run, keeping the export. (A VM without PVC-backed disks, running or not, ends the
/// export `Skipped` instead: `export_paths::kubevirt_sources_without_volumes_fail_with_the_reason`.)
#[test]
fn running_vm_waits_with_the_reason() {
    let env = kubevirt(MIB, MIB);
    env.emulator.put_object(pvc("web-root", MIB));
    env.emulator.put_object(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"runStrategy": "Always", "template": {"spec": {
            "domain": {"devices": {"disks": [{"name": "root", "disk": {"bus": "virtio"}}]}},
            "volumes": [{"name": "root", "persistentVolumeClaim": {"claimName": "web-root"}}]}}}
    }));
    eventually("the VM runs", || {
        env.emulator
            .objects("kubevirt.io", "virtualmachineinstances", Some("default"))
            .iter()
            .any(|o| o["metadata"]["name"] == "web")
    });
    let out = export(
        &env,
        &[
            "vm/web",
            "-o",
            env.dir.path().join("w").to_str().unwrap(),
            "--timeout",
            "2s",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("waiting for VirtualMachineExport export-vm-web-"),
        "{err}"
    );
    assert!(err.contains("VirtualMachine web is running"), "{err}");
    assert!(err.contains("--reuse export-vm-web-"), "{err}");
}

/// Bad input is refused before any request, with exit 2.
#[test]
fn bad_input_exits_2() {
    let env = Env::kubevirt();
    for (args, want) in [
        (vec!["export", "disk/x", "-o", "f"], "unknown kind"),
        (vec!["export", "vm/exp"], "needs -o FILE"),
        (
            vec!["export", "vm/exp", "-o", "f", "--checksum", "sha256:12"],
            "64 hex digits",
        ),
        (
            vec!["export", "vm/exp", "-o", "-", "--resume"],
            "--resume needs -o FILE",
        ),
        (
            vec!["export", "vd/x", "-o", "f", "--flavor", "kubevirt"],
            "not exported on KubeVirt",
        ),
    ] {
        let err = crate::common::fails(&env, &args, 2);
        assert!(err.contains(want), "{args:?}: {err}");
    }
    assert!(env.emulator.requests().is_empty());
}
