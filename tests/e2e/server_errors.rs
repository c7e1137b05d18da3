//! API refusals shown with the server's own words: quota and admission-webhook 403s keep their
//! message, only the authorizer's plain RBAC denial is reworded, and a 404 names what is
//! really missing (the namespace, not the VM).

use kubevm_emulator::FailureRule;

use crate::common::{Env, fails, stderr};

const IMAGE: &str = "quay.io/containerdisks/ubuntu:24.04";

/// Fails every way the tool may write the VM `name` (create or server-side apply) with `code`.
fn refuse_vm(env: &Env, plural: &str, name: &str, code: u16, message: &str) {
    for verb in ["create", "patch"] {
        env.emulator.inject_failure(FailureRule {
            verb: verb.into(),
            plural: plural.into(),
            name: Some(name.into()),
            code,
            message: message.into(),
            times: None,
        });
    }
}

/// `create` of VM `name` in `dev` that the server refuses; returns the single stderr line.
fn create_refused(env: &Env, name: &str) -> String {
    let output = env.vm(&[
        "create",
        name,
        "-n",
        "dev",
        "--image",
        IMAGE,
        "--no-platform-ssh",
    ]);
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    err.trim_end().to_owned()
}

#[test]
fn quota_refusal_shows_the_servers_message() {
    let env = Env::kubevirt();
    // The ResourceQuota admission plugin's wording (k8s.io/apiserver/pkg/admission/plugin/
    // resourcequota/controller.go: "exceeded quota: %s, requested: %s, used: %s, limited: %s",
    // wrapped by admission.NewForbidden into `<resource> "<name>" is forbidden: …`).
    let message = "virtualmachines.kubevirt.io \"big\" is forbidden: exceeded quota: compute, requested: requests.memory=8Gi, used: requests.memory=28Gi, limited: requests.memory=32Gi";
    refuse_vm(&env, "virtualmachines", "big", 403, message);
    let line = create_refused(&env, "big");
    assert!(line.contains(&format!(": {message}")), "{line}");
    assert!(!line.contains("cannot patch"), "{line}");
}

#[test]
fn webhook_denial_shows_the_servers_message() {
    let env = Env::deckhouse();
    // k8s.io/apiserver/pkg/admission/plugin/webhook/errors/statuserror.go ToStatusErr:
    // "admission webhook %q denied the request: %s"; Deckhouse's controller-runtime webhooks
    // deny with 403 Forbidden.
    let message = "admission webhook \"vm.virtualization-controller.validate.d8-virtualization\" denied the request: virtual machine class \"generic\" does not exist";
    refuse_vm(&env, "virtualmachines", "web2", 403, message);
    let line = create_refused(&env, "web2");
    assert!(line.contains(&format!(": {message}")), "{line}");
    assert!(!line.contains("cannot patch"), "{line}");
}

#[test]
fn plain_rbac_denial_is_reworded() {
    let env = Env::kubevirt();
    // The authorizer's own wording (k8s.io/apiserver/pkg/endpoints/handlers/responsewriters/
    // errors.go forbiddenMessage).
    let message = "virtualmachines.kubevirt.io \"web\" is forbidden: User \"bob\" cannot delete resource \"virtualmachines\" in API group \"kubevirt.io\" in the namespace \"default\"";
    env.emulator.inject_failure(FailureRule {
        verb: "delete".into(),
        plural: "virtualmachines".into(),
        name: Some("web".into()),
        code: 403,
        message: message.into(),
        times: None,
    });
    assert_eq!(
        fails(&env, &["delete", "web", "-n", "default", "--yes"], 1),
        "Error: forbidden: user \"bob\" cannot delete virtualmachines.kubevirt.io \"web\" in namespace \"default\""
    );
}

#[test]
fn create_in_a_missing_namespace_names_the_namespace() {
    let env = Env::kubevirt();
    let output = env.vm(&[
        "create",
        "w",
        "-n",
        "nosuch",
        "--image",
        IMAGE,
        "--no-platform-ssh",
    ]);
    assert_eq!(output.status.code(), Some(1));
    let err = stderr(&output);
    assert!(err.contains("namespace \"nosuch\" not found"), "{err}");
    assert!(!err.contains("virtualmachine \"w\" not found"), "{err}");
}

#[test]
fn get_in_a_missing_namespace_names_the_namespace() {
    let env = Env::kubevirt();
    assert_eq!(
        fails(&env, &["get", "w", "-n", "nosuch"], 1),
        "Error: namespace \"nosuch\" not found"
    );
    // In a namespace that exists, the VM is what is missing.
    assert_eq!(
        fails(&env, &["get", "w", "-n", "prod"], 1),
        "Error: virtualmachine \"w\" not found in namespace \"prod\""
    );
}

#[test]
fn delete_in_a_missing_namespace_names_the_namespace() {
    let env = Env::kubevirt();
    assert_eq!(
        fails(&env, &["delete", "w", "-n", "nosuch", "--yes"], 1),
        "Error: namespace \"nosuch\" not found"
    );
    assert_eq!(
        fails(&env, &["delete", "w", "-n", "prod", "--yes"], 1),
        "Error: virtualmachine \"w\" not found in namespace \"prod\""
    );
}

/// KubeVirt's aggregated API registered but its Service without endpoints (virt-api down):
/// the API server answers 503 at once. The tool shows it at -v 6 and ends in one line after
/// that one request, naming the API (before: kube's retries ran `version` for 5 minutes, silently).
#[test]
fn an_unavailable_aggregated_api_fails_fast_in_one_line() {
    let env = Env::kubevirt();
    env.emulator.put_object(serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "virt-api", "namespace": "kubevirt"},
        "spec": {"ports": [{"name": "https", "port": 443, "targetPort": 8443}]}}));
    env.emulator.put_object(serde_json::json!({
        "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
        "metadata": {"name": "v1.subresources.kubevirt.io"},
        "spec": {"group": "subresources.kubevirt.io", "version": "v1", "groupPriorityMinimum": 1000,
            "versionPriority": 15, "service": {"namespace": "kubevirt", "name": "virt-api", "port": 443},
            "insecureSkipTLSVerify": true}}));
    env.emulator.clear_requests();
    let err = fails(&env, &["stop", "web"], 1);
    // Fast because it does not retry: one PUT, answered 503, and no other request to it.
    let stops: Vec<_> = env
        .emulator
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with("/virtualmachines/web/stop"))
        .map(|r| (r.method, r.status))
        .collect();
    assert_eq!(stops, [("PUT".to_string(), 503)]);
    assert_eq!(
        err,
        "Error: virtualmachines.subresources.kubevirt.io is unavailable: the API server answered 503 (service unavailable); KubeVirt's API component (virt-api, APIService v1.subresources.kubevirt.io) is not installed or not ready"
    );
    // -v 6 shows the 503 of the request, once.
    let out = env.vm(&["stop", "web", "-v", "6"]);
    let log = stderr(&out);
    let puts: Vec<&str> = log.lines().filter(|l| l.starts_with("PUT ")).collect();
    assert_eq!(puts.len(), 1, "{log}");
    assert!(
        puts[0].contains(
            "/subresources.kubevirt.io/v1/namespaces/default/virtualmachines/web/stop 503"
        ),
        "{log}"
    );
}

/// A VirtualMachineClass that does not exist is cluster state, not bad input: exit 1 (was 2).
#[test]
fn a_missing_class_exits_1() {
    let env = Env::deckhouse();
    let err = fails(
        &env,
        &[
            "create",
            "web2",
            "--image",
            "cvi/ubuntu-24-04",
            "--class",
            "nope",
        ],
        1,
    );
    assert_eq!(
        err,
        "Error: virtualmachineclass \"nope\" not found; pass an existing --class"
    );
}
