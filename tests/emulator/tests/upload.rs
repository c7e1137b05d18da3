//! The upload proxy behaves like CDI's (`pkg/uploadproxy/uploadproxy.go`): UploadTokenRequest
//! tokens name their PVC, a bad token is 401, a PVC that is no upload target is refused, a
//! sync upload answers once the data is processed, and the DataVolume then succeeds. Checked
//! with curl as an independent client.

use std::process::Command;
use std::time::{Duration, Instant};

use kubevm_emulator::{BlockingEmulator, Emulator, EmulatorOptions, ServeFlavor};
use serde_json::{Value, json};

struct Env {
    emu: BlockingEmulator,
    dir: tempfile::TempDir,
    token: String,
}

impl Env {
    fn new() -> Env {
        let emu = Emulator::start_blocking(EmulatorOptions {
            flavor: ServeFlavor::KubeVirt,
            import_step: Duration::from_millis(50),
            ..Default::default()
        })
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("api.pem"), emu.ca_pem()).unwrap();
        std::fs::write(dir.path().join("proxy.pem"), emu.upload_proxy_ca_pem()).unwrap();
        let yaml: Value = yaml_serde::from_str(&emu.kubeconfig_yaml()).unwrap();
        let token = yaml["users"]
            .as_array()
            .unwrap()
            .iter()
            .find(|u| u["name"] == "admin")
            .unwrap()["user"]["token"]
            .as_str()
            .unwrap()
            .to_string();
        Env { emu, dir, token }
    }

    /// POSTs to the API server; returns the answer.
    fn post(&self, path: &str, obj: Value) -> Value {
        let out = Command::new("curl")
            .args(["-sSf", "--cacert"])
            .arg(self.dir.path().join("api.pem"))
            .args(["-H", &format!("Authorization: Bearer {}", self.token)])
            .args([
                "-H",
                "Content-Type: application/json",
                "-d",
                &obj.to_string(),
            ])
            .arg(format!("{}{path}", self.emu.url()))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    fn phase(&self, name: &str) -> String {
        self.emu
            .objects("cdi.kubevirt.io", "datavolumes", Some("default"))
            .into_iter()
            .find(|o| o["metadata"]["name"] == name)
            .and_then(|o| o["status"]["phase"].as_str().map(String::from))
            .unwrap_or_default()
    }

    fn wait_phase(&self, name: &str, phase: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.phase(name) != phase {
            assert!(Instant::now() < deadline, "{name} never became {phase}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn token_for(&self, pvc: &str) -> String {
        let answer = self.post(
            "/apis/upload.cdi.kubevirt.io/v1beta1/namespaces/default/uploadtokenrequests",
            json!({"apiVersion": "upload.cdi.kubevirt.io/v1beta1", "kind": "UploadTokenRequest",
                "metadata": {"name": pvc}, "spec": {"pvcName": pvc}}),
        );
        answer["status"]["token"].as_str().unwrap().to_string()
    }

    /// curl -T FILE to the proxy: (status, body).
    fn upload(&self, token: &str, file: &std::path::Path) -> (u16, String) {
        let out = Command::new("curl")
            .args(["-sS", "-m", "30", "-X", "POST", "--cacert"])
            .arg(self.dir.path().join("proxy.pem"))
            .args(["-H", &format!("Authorization: Bearer {token}")])
            .args(["-w", "\n%{http_code}", "-T"])
            .arg(file)
            .arg(format!("{}/v1beta1/upload", self.emu.upload_proxy_url()))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        let (body, code) = text.trim_end().rsplit_once('\n').unwrap_or(("", &text));
        (code.trim().parse().unwrap(), body.trim().to_string())
    }
}

fn data_volume(name: &str, size: &str) -> Value {
    json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"source": {"upload": {}}, "storage": {"resources": {"requests": {"storage": size}}}}})
}

#[test]
fn tokens_name_their_pvc_and_a_sync_upload_completes_the_data_volume() {
    let env = Env::new();
    let dvs = "/apis/cdi.kubevirt.io/v1beta1/namespaces/default/datavolumes";
    env.post(dvs, data_volume("up", "8Mi"));
    env.post(dvs, data_volume("small", "1Mi"));
    env.wait_phase("up", "UploadReady");
    env.wait_phase("small", "UploadReady");
    // CDIConfig publishes the proxy.
    let config = env
        .emu
        .objects("cdi.kubevirt.io", "cdiconfigs", None)
        .into_iter()
        .next()
        .unwrap();
    assert_eq!(
        format!(
            "https://{}",
            config["status"]["uploadProxyURL"].as_str().unwrap()
        ),
        env.emu.upload_proxy_url()
    );

    let image = env.dir.path().join("disk.qcow2");
    let out = Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2"])
        .arg(&image)
        .arg("4M")
        .output()
        .unwrap();
    assert!(out.status.success());

    assert_eq!(env.upload("not-a-token", &image).0, 401);
    // A token for a PVC that takes no upload: refused.
    let (code, body) = env.upload(&env.token_for("nothing-here"), &image);
    assert_eq!(code, 400, "{body}");
    // Too small a volume: CDI's message, and the DataVolume says so too.
    let (code, body) = env.upload(&env.token_for("small"), &image);
    assert_eq!(code, 400);
    assert!(
        body.contains(
            "Virtual image size 4194304 is larger than the reported available storage 1048576"
        ),
        "{body}"
    );
    // The right token: processed, then Succeeded.
    let (code, body) = env.upload(&env.token_for("up"), &image);
    assert_eq!(code, 200, "{body}");
    env.wait_phase("up", "Succeeded");
    assert_eq!(env.phase("small"), "UploadReady");
}
