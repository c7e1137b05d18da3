use serde_json::json;

use super::*;
use crate::create::fixtures;
use crate::flavor::Flavor;

/// The `supercpu` class of the Deckhouse user guide.
fn supercpu() -> Value {
    json!({"metadata": {"name": "supercpu"}, "spec": {"sizingPolicies": [
        {"cores": {"min": 1, "max": 4}, "memory": {"min": "1Gi", "max": "8Gi"}, "coreFractions": [5, 10, 20, 50, 100]},
        {"cores": {"min": 5, "max": 8}, "memory": {"min": "5Gi", "max": "16Gi"}, "coreFractions": [20, 50, 100]},
    ]}})
}

fn q(s: &str) -> Quantity {
    Quantity::parse(s).unwrap()
}

fn reasons(class: &Value, cores: u32, memory: &str, fraction: Option<CoreFraction>) -> Vec<String> {
    match check(
        "supercpu",
        &policies(class).unwrap(),
        cores,
        q(memory),
        fraction,
    ) {
        Ok(()) => Vec::new(),
        Err(SizingError::Violations { reasons, .. }) => reasons,
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn fitting_vms_pass() {
    assert!(reasons(&supercpu(), 2, "4Gi", Some(CoreFraction::Percent(20))).is_empty());
    assert!(reasons(&supercpu(), 6, "8Gi", Some(CoreFraction::Auto)).is_empty());
    assert!(reasons(&supercpu(), 6, "8Gi", None).is_empty());
    assert!(check("x", &[], 1000, q("1Ti"), None).is_ok());
}

#[test]
fn guide_messages() {
    assert_eq!(
        reasons(&supercpu(), 10, "1Gi", None),
        [
            "does not match any sizing policy of VirtualMachineClass \"supercpu\": its 10 CPU core(s) fall outside the allowed ranges (1-4, 5-8); set the number of cores (spec.cpu.cores) accordingly"
        ]
    );
    assert_eq!(
        reasons(&supercpu(), 2, "2Gi", Some(CoreFraction::Percent(30))),
        [
            "the CPU core fraction \"30%\" is not allowed; set the core fraction (spec.cpu.coreFraction) to one of: 5%, 10%, 20%, 50%, 100%"
        ]
    );
    assert_eq!(
        reasons(&supercpu(), 2, "16Gi", None),
        [
            "the memory size (16Gi) is out of the range allowed by the sizing policy; set the memory size (spec.memory.size) between 1Gi and 8Gi"
        ]
    );
}

#[test]
fn step_messages() {
    let class = json!({"spec": {"sizingPolicies": [
        {"cores": {"min": 2, "max": 10, "step": 2}, "memory": {"min": "1Gi", "max": "8Gi", "step": "1Gi"}}]}});
    assert_eq!(
        reasons(&class, 7, "1536Mi", None),
        [
            "the number of CPU cores (7) does not match the sizing policy step; set the number of cores (spec.cpu.cores) to 6 or 8",
            "the memory size (1536Mi) does not match the sizing policy step; set the memory size (spec.memory.size) to 1Gi or 2Gi",
        ]
    );
    assert!(reasons(&class, 10, "8Gi", None).is_empty());
}

#[test]
fn per_core_messages() {
    let class = json!({"spec": {"sizingPolicies": [
        {"cores": {"min": 1, "max": 8}, "memory": {"perCore": {"min": "1Gi", "max": "2Gi"}}}]}});
    assert_eq!(
        reasons(&class, 6, "18Gi", None),
        [
            "the memory size (18Gi) is not allowed for 6 CPU core(s); set the memory size (spec.memory.size) between 6Gi and 12Gi, or change the number of cores (spec.cpu.cores) (the sizing policy allows between 1Gi and 2Gi of memory per core)"
        ]
    );
    let class = json!({"spec": {"sizingPolicies": [
        {"cores": {"min": 1, "max": 8}, "memory": {"step": "1Gi", "perCore": {"min": "1Gi", "max": "4Gi"}}}]}});
    assert_eq!(
        reasons(&class, 2, "2560Mi", None),
        [
            "the memory size (2560Mi) does not match the per-core sizing policy step for 2 CPU core(s); set the memory size (spec.memory.size) to 2Gi or 4Gi, or change the number of cores (spec.cpu.cores)"
        ]
    );
}

#[test]
fn all_violations_in_one_line() {
    let e = check(
        "supercpu",
        &policies(&supercpu()).unwrap(),
        2,
        q("16Gi"),
        Some(CoreFraction::Percent(30)),
    )
    .unwrap_err()
    .to_string();
    assert!(e.starts_with("does not match the sizing policy of VirtualMachineClass \"supercpu\" for several reasons: (1) the CPU core fraction \"30%\""), "{e}");
    assert!(e.contains("; (2) the memory size (16Gi)"), "{e}");
    assert!(e.ends_with("check the sizing policy of the VirtualMachineClass or contact the administrator for more information"));
    assert!(!e.contains('\n'));
    let one = check(
        "supercpu",
        &policies(&supercpu()).unwrap(),
        2,
        q("16Gi"),
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(
        one.starts_with("the memory size (16Gi) is out of")
            && one.ends_with("for more information"),
        "{one}"
    );
}

#[test]
fn v1alpha3_fractions_and_bad_policies() {
    let class = json!({"spec": {"sizingPolicies": [
        {"cores": {"min": 1, "max": 4}, "coreFractions": ["25%", "50%"], "memory": {"min": 1073741824}}]}});
    let p = policies(&class).unwrap();
    assert_eq!(p[0].core_fractions, [25, 50]);
    assert_eq!(p[0].memory.min, Some(q("1Gi")));
    let bad =
        json!({"metadata": {"name": "c"}, "spec": {"sizingPolicies": [{"cores": {"min": 1}}]}});
    let e = policies(&bad).unwrap_err().to_string();
    assert!(
        e.contains("\"c\"") && e.contains("cores.max is missing"),
        "{e}"
    );
    assert!(policies(&json!({"spec": {}})).unwrap().is_empty());
}

#[test]
fn plan_check_uses_plan_defaults() {
    let mut plan = fixtures::plan(Flavor::Deckhouse, fixtures::image());
    plan.cpu = Some(10);
    let e = check_plan(&plan, &supercpu()).unwrap_err().to_string();
    assert!(e.contains("\"generic\": its 10 CPU core(s)"), "{e}");
    plan.cpu = Some(2);
    check_plan(&plan, &supercpu()).unwrap();
}
