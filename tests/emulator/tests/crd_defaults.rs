//! Custom resources are pruned and defaulted from their CRDs the way kube-apiserver does it
//! (apiextensions-apiserver `schema/pruning`, `schema/defaulting`), driven by real kubectl.
//! Expected defaults are the `default:` values of the CRDs themselves
//! (schemas/deckhouse/virtualmachines.yaml, schemas/crds/kubevirt/virtualmachines.kubevirt.io.yaml);
//! expected managedFields follow what a real server lists for a custom resource created by an
//! Update (kubernetes.io docs, "custom-resource-definitions": `f:spec: {.: {}, …}`).

use crate::common;

use common::kubectl::KubectlEnv as Env;
use kubevm_emulator::{Emulator, EmulatorOptions, ServeFlavor};
use serde_json::{Value, json};

fn env(flavor: ServeFlavor, fixture: &str) -> Env {
    let emu = Emulator::start_blocking(EmulatorOptions {
        flavor,
        fixture_yaml: vec![fixture.to_string()],
        ..Default::default()
    })
    .expect("emulator");
    let dir = tempfile::tempdir().unwrap();
    emu.write_kubeconfig(&dir.path().join("kubeconfig"))
        .unwrap();
    Env { emu, dir }
}

const DVM: &str = "virtualmachines.virtualization.deckhouse.io";

/// A Deckhouse VM with only what its CRD requires.
const MINIMAL_DVM: &str = "apiVersion: virtualization.deckhouse.io/v1alpha2
kind: VirtualMachine
metadata:
  name: plain
  namespace: default
spec:
  virtualMachineClassName: generic
  cpu: {cores: 1}
  memory: {size: 1Gi}
  blockDeviceRefs:
  - {kind: VirtualDisk, name: plain-disk}
";

/// The CRD's defaults for `spec` (virtualmachines.yaml, `default:` of each property).
fn crd_defaults() -> Value {
    json!({
        "runPolicy": "AlwaysOnUnlessStoppedManually",
        "disruptions": {"restartApprovalMode": "Manual"},
        "terminationGracePeriodSeconds": 60,
        "enableParavirtualization": true,
        "osType": "Generic",
        "bootloader": "BIOS",
        "liveMigrationPolicy": "PreferSafe"
    })
}

fn entry<'a>(obj: &'a Value, manager: &str) -> &'a Value {
    obj["metadata"]["managedFields"]
        .as_array()
        .expect("managedFields")
        .iter()
        .find(|e| e["manager"] == manager)
        .unwrap_or_else(|| panic!("no entry of {manager}: {obj}"))
}

#[test]
fn create_defaults_and_the_creator_owns_the_defaults() {
    let env = env(ServeFlavor::Deckhouse, "");
    env.run(&["create", "namespace", "default"], "");
    let (ok, out, err) = env.run(&["create", "-f", "-"], MINIMAL_DVM);
    assert!(ok, "{out}\n{err}");
    let vm = env.json(&["get", DVM, "plain", "-o", "json", "--show-managed-fields"]);
    let spec = vm["spec"].as_object().unwrap();
    for (k, v) in crd_defaults().as_object().unwrap() {
        assert_eq!(spec.get(k), Some(v), "spec.{k}: {vm}");
    }
    // Defaulting is not invention: what the CRD does not default stays absent.
    assert!(spec.get("provisioning").is_none(), "{vm}");
    // The request carried the defaults when the field manager saw it: kubectl-create owns
    // them, and every object it added is a node of its own (".").
    let e = entry(&vm, "kubectl-create");
    assert_eq!(e["operation"], "Update");
    assert_eq!(
        e["fieldsV1"],
        json!({"f:spec": {".": {},
            "f:blockDeviceRefs": {},
            "f:bootloader": {},
            "f:cpu": {".": {}, "f:cores": {}},
            "f:disruptions": {".": {}, "f:restartApprovalMode": {}},
            "f:enableParavirtualization": {},
            "f:liveMigrationPolicy": {},
            "f:memory": {".": {}, "f:size": {}},
            "f:osType": {},
            "f:runPolicy": {},
            "f:terminationGracePeriodSeconds": {},
            "f:virtualMachineClassName": {}}})
    );
}

#[test]
fn server_side_apply_defaults_belong_to_nobody() {
    let env = env(ServeFlavor::Deckhouse, "");
    env.run(&["create", "namespace", "default"], "");
    let (ok, out, err) = env.run(
        &["apply", "--server-side", "--field-manager=ops", "-f", "-"],
        MINIMAL_DVM,
    );
    assert!(ok, "{out}\n{err}");
    let vm = env.json(&["get", DVM, "plain", "-o", "json", "--show-managed-fields"]);
    assert_eq!(vm["spec"]["bootloader"], "BIOS", "{vm}");
    assert_eq!(
        vm["spec"]["disruptions"],
        json!({"restartApprovalMode": "Manual"})
    );
    // Apply owns the applied configuration's leaves, no "." nodes, no defaults
    // (structuredmerge.go applies the defaulter after computing the applied set).
    let mf = vm["metadata"]["managedFields"].as_array().unwrap();
    assert_eq!(mf.len(), 1, "{vm}");
    assert_eq!(mf[0]["operation"], "Apply");
    assert_eq!(
        mf[0]["fieldsV1"],
        json!({"f:spec": {"f:blockDeviceRefs": {}, "f:cpu": {"f:cores": {}},
            "f:memory": {"f:size": {}}, "f:virtualMachineClassName": {}}})
    );
}

#[test]
fn stored_objects_are_defaulted_when_read() {
    // Fixture objects go into storage as written (no defaults), like objects written before
    // a CRD gained a default: get, list and watch show them defaulted.
    let env = env(
        ServeFlavor::Deckhouse,
        &format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: default\n---\n{MINIMAL_DVM}"),
    );
    let vm = env.json(&["get", DVM, "plain", "-o", "json"]);
    assert_eq!(vm["spec"]["bootloader"], "BIOS", "{vm}");
    assert_eq!(vm["spec"]["terminationGracePeriodSeconds"], 60, "{vm}");
    let list = env.json(&["get", DVM, "-o", "json"]);
    assert_eq!(
        list["items"][0]["spec"]["liveMigrationPolicy"],
        "PreferSafe"
    );
    let (_, out, _) = env.run(
        &[
            "get",
            DVM,
            "plain",
            "--watch",
            "--output-watch-events",
            "-o",
            "json",
            "--request-timeout=2s",
        ],
        "",
    );
    let first: Value = serde_json::Deserializer::from_str(&out)
        .into_iter::<Value>()
        .next()
        .expect("a watch event")
        .unwrap();
    assert_eq!(first["object"]["spec"]["osType"], "Generic", "{out}");
}

const KUBEVIRT_VM: &str = "apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: web
  namespace: default
spec:
  runStrategy: Halted
  template:
    spec:
      domain:
        devices: {}
        bogus: 1
      volumes:
      - name: ci
        cloudInitNoCloud:
          userData: \"#cloud-config\"
          networkDataSecretRef: {}
      - name: cfg
        configMap: {}
";

#[test]
fn unknown_fields_strict_warn_ignore_and_defaults_in_list_items() {
    let env = env(ServeFlavor::KubeVirt, "");
    env.run(&["create", "namespace", "default"], "");
    // kubectl's default is --validate=strict: refused, nothing stored.
    let (ok, _, err) = env.run(&["create", "-f", "-"], KUBEVIRT_VM);
    assert!(!ok);
    assert!(
        err.contains("spec.template.spec.domain.bogus") && err.contains("unknown field \"bogus\""),
        "{err}"
    );
    // --validate=warn (fieldValidation=Warn): pruned, with the server's warning.
    let (ok, out, err) = env.run(&["create", "--validate=warn", "-f", "-"], KUBEVIRT_VM);
    assert!(ok, "{out}\n{err}");
    assert!(
        err.contains("unknown field \"spec.template.spec.domain.bogus\""),
        "{err}"
    );
    let vm = env.json(&["get", "vm", "web", "-o", "json"]);
    let spec = &vm["spec"]["template"]["spec"];
    assert!(spec["domain"].get("bogus").is_none(), "{vm}");
    // Defaults inside list items: `name: ""` of the secret and config map references.
    assert_eq!(
        spec["volumes"][0]["cloudInitNoCloud"]["networkDataSecretRef"],
        json!({"name": ""})
    );
    assert_eq!(spec["volumes"][1]["configMap"], json!({"name": ""}));
    // --validate=false (fieldValidation=Ignore): pruned silently.
    env.ok(&["delete", "vm", "web"]);
    let (ok, out, err) = env.run(&["create", "--validate=false", "-f", "-"], KUBEVIRT_VM);
    assert!(ok, "{out}\n{err}");
    assert!(!err.contains("unknown field"), "{err}");
    let vm = env.json(&["get", "vm", "web", "-o", "json"]);
    assert!(
        vm["spec"]["template"]["spec"]["domain"]
            .get("bogus")
            .is_none()
    );
}
