use super::*;

#[test]
fn tolerations_parse_like_kubectl_taint() {
    assert_eq!(
        TolerationEdit::parse("gpu=true:NoSchedule").unwrap(),
        TolerationEdit::Add {
            key: "gpu".into(),
            value: Some("true".into()),
            effect: "NoSchedule".into()
        }
    );
    assert_eq!(
        TolerationEdit::parse("example.com/dedicated:NoExecute").unwrap(),
        TolerationEdit::Add {
            key: "example.com/dedicated".into(),
            value: None,
            effect: "NoExecute".into()
        }
    );
    assert_eq!(
        TolerationEdit::parse("gpu-").unwrap(),
        TolerationEdit::Remove("gpu".into())
    );
    for bad in [
        "gpu",
        "gpu=true:NoRun",
        "gpu=true",
        "bad key:NoSchedule",
        "gpu=no way:NoSchedule",
        ":NoSchedule",
    ] {
        assert!(TolerationEdit::parse(bad).is_err(), "{bad}");
    }
}

const KUBEVIRT: Fields = Fields {
    spec: "/spec/template/spec",
    pod_labels: "/spec/template/metadata/labels",
    anti_affinity: "podAntiAffinity",
    affinity_term: "podAffinityTerm",
};
const DECKHOUSE: Fields = Fields {
    spec: "/spec",
    pod_labels: "/metadata/labels",
    anti_affinity: "virtualMachineAndPodAntiAffinity",
    affinity_term: "virtualMachineAndPodAffinityTerm",
};

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn edit_sets_replaces_and_removes() {
    let p = Placement::parse_flags(
        &strings(&["disk=ssd", "zone-"]),
        &strings(&["gpu=a:NoSchedule", "old-", "gpu=b:NoSchedule"]),
        &[],
        None,
        Some("high".into()),
    )
    .unwrap();
    let mut vm = json!({"spec": {"nodeSelector": {"zone": "a"}, "tolerations": [{"key": "old", "operator": "Exists"}]}});
    p.edit(&DECKHOUSE, &mut vm).unwrap();
    assert_eq!(
        vm["spec"],
        json!({"nodeSelector": {"disk": "ssd"}, "priorityClassName": "high",
            "tolerations": [{"key": "gpu", "operator": "Equal", "value": "b", "effect": "NoSchedule"}]})
    );
    assert!(
        Placement::parse_flags(&[], &[], &[], None, None)
            .unwrap()
            .is_empty()
    );
    assert!(Placement::parse_flags(&strings(&["a=b c"]), &[], &[], None, None).is_err());
    assert!(Placement::parse_flags(&[], &[], &[], None, Some("Not_Valid".into())).is_err());
    assert!(Placement::parse_flags(&[], &[], &strings(&["zone"]), None, None).is_err());
}

/// The shapes are the Pod API's (`NodeSelectorTerm`, `WeightedPodAffinityTerm`) and, on
/// Deckhouse, its CRD's renamed fields (`virtualMachineAndPodAntiAffinity`,
/// `virtualMachineAndPodAffinityTerm`: crds/virtualmachines.yaml).
#[test]
fn node_affinity_and_spread_write_the_platform_fields() {
    let p = Placement::parse_flags(
        &[],
        &[],
        &strings(&["zone=a", "zone=b", "rack=r1"]),
        Some("hostname"),
        None,
    )
    .unwrap();
    let mut vm = json!({"metadata": {"name": "web-0"}, "spec": {"template": {
        "metadata": {"labels": {"kubevm.io/pool": "web"}}, "spec": {}}}});
    p.edit(&KUBEVIRT, &mut vm).unwrap();
    let expected = json!({
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [
                {"key": "zone", "operator": "In", "values": ["a", "b"]},
                {"key": "rack", "operator": "In", "values": ["r1"]}]}]}},
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "podAffinityTerm": {
                "labelSelector": {"matchLabels": {"kubevm.io/pool": "web"}},
                "topologyKey": "kubernetes.io/hostname"}}]}});
    assert_eq!(vm["spec"]["template"]["spec"]["affinity"], expected);
    assert_eq!(
        summary(&KUBEVIRT, &vm),
        [
            ("Node affinity", "zone in (a b),rack in (r1)".to_string()),
            (
                "Anti-affinity",
                "preferred: apart from kubevm.io/pool=web by kubernetes.io/hostname".to_string()
            ),
        ]
    );
    // A second spread replaces the first; removing both leaves no affinity at all.
    let zone = Placement::parse_flags(&[], &[], &[], Some("zone"), None).unwrap();
    zone.edit(&KUBEVIRT, &mut vm).unwrap();
    let terms = &vm["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"];
    assert_eq!(terms.as_array().unwrap().len(), 1);
    assert_eq!(
        terms[0]["podAffinityTerm"]["topologyKey"],
        "topology.kubernetes.io/zone"
    );
    let none = Placement::parse_flags(&[], &[], &strings(&["zone-", "rack-"]), Some("none"), None)
        .unwrap();
    none.edit(&KUBEVIRT, &mut vm).unwrap();
    assert_eq!(vm["spec"]["template"]["spec"], json!({}));

    let mut dh =
        json!({"metadata": {"name": "web-1", "labels": {"kubevm.io/pool": "web"}}, "spec": {}});
    p.edit(&DECKHOUSE, &mut dh).unwrap();
    assert_eq!(
        dh["spec"]["affinity"]["virtualMachineAndPodAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
            [0],
        json!({"weight": 100, "virtualMachineAndPodAffinityTerm": {
            "labelSelector": {"matchLabels": {"kubevm.io/pool": "web"}},
            "topologyKey": "kubernetes.io/hostname"}})
    );
    // A VM in no pool has nothing to spread from.
    let mut alone = json!({"metadata": {"name": "db"}, "spec": {}});
    let e = p.edit(&DECKHOUSE, &mut alone).unwrap_err().to_string();
    assert!(e.contains("in none (no kubevm.io/pool label"), "{e}");
}

#[test]
fn spread_keys_are_aliases_or_label_keys() {
    assert_eq!(
        Spread::parse("hostname").unwrap(),
        Spread::By("kubernetes.io/hostname".into())
    );
    assert_eq!(
        Spread::parse("example.com/rack").unwrap(),
        Spread::By("example.com/rack".into())
    );
    assert_eq!(Spread::parse("none").unwrap(), Spread::Remove);
    for bad in ["", "bad key", "-x", "a/b/c", "Example..com/x"] {
        assert!(Spread::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn removals_are_refused_for_a_new_vm() {
    let p = Placement::parse_flags(&strings(&["disk-"]), &[], &[], None, None).unwrap();
    assert!(p.refuse_removals().is_err());
    let p = Placement::parse_flags(&[], &[], &[], Some("none"), None).unwrap();
    assert!(p.refuse_removals().is_err());
    let p = Placement::parse_flags(&strings(&["disk=ssd"]), &[], &[], Some("zone"), None).unwrap();
    assert!(p.refuse_removals().is_ok());
}
