use super::*;
use crate::create::fixtures;
use crate::names::{MANAGED_BY_LABEL, VM_LABEL};

fn pool(flavor: Flavor, n: u32) -> VmPlan {
    let mut plan = fixtures::plan(flavor, fixtures::image());
    plan.replicas = Some(n);
    plan
}

/// Replica plans with distinct host keys, as `checks::prepare` makes them.
fn replicas(plan: &VmPlan) -> Vec<VmPlan> {
    (0..plan.replicas.unwrap())
        .map(|i| {
            let mut r = replica_plan(plan, i);
            r.platform_ssh.host = Some(fixtures::host_keys());
            r
        })
        .collect()
}

#[test]
fn kubevirt_pool_template_is_the_vm_with_indexed_secret_refs() {
    let plan = pool(Flavor::KubeVirt, 3);
    let m = build(&plan, &replicas(&plan)).unwrap();
    let kinds: Vec<(&str, &str)> = m.objects.iter().map(|o| (o.kind(), o.name())).collect();
    assert_eq!(
        kinds,
        [
            ("VirtualMachinePool", "web"),
            ("Secret", "web-cloudinit-0"),
            ("Secret", "web-cloudinit-1"),
            ("Secret", "web-cloudinit-2"),
        ]
    );
    assert!(m.objects[1..].iter().all(|o| o.owner == Owner::Vm));
    let p = &m.objects[0].object;
    assert_eq!(p["apiVersion"], "pool.kubevirt.io/v1beta1");
    assert_eq!(p["spec"]["replicas"], 3);
    assert_eq!(p["spec"]["nameGeneration"]["appendIndexToSecretRefs"], true);
    assert_eq!(p["spec"]["selector"]["matchLabels"][POOL_LABEL], "web");
    let t = &p["spec"]["virtualMachineTemplate"];
    // Upstream only makes replicas when the selector matches the template's labels.
    assert_eq!(t["metadata"]["labels"][POOL_LABEL], "web");
    assert_eq!(t["metadata"]["labels"][MANAGED_BY_LABEL], "kubectl-vm");
    assert_eq!(
        t["metadata"]["annotations"][crate::names::TRUST_ANNOTATION],
        crate::names::TRUST_VM_SCOPED
    );
    let volumes = t["spec"]["template"]["spec"]["volumes"].as_array().unwrap();
    let ci = volumes
        .iter()
        .find(|v| v["name"] == "cloudinitdisk")
        .unwrap();
    assert_eq!(ci["cloudInitNoCloud"]["secretRef"]["name"], "web-cloudinit");
    assert_eq!(
        t["spec"]["dataVolumeTemplates"][0]["metadata"]["name"],
        "web-root"
    );
    // Each Secret holds its replica's VM-scoped trust: the platform user's principals file
    // names that replica (`LOGIN@NAME.NAMESPACE`, the principal the signer puts in
    // certificates; README "SSH trust: the platform signs"), never another one.
    for i in 0..3 {
        let text = m.objects[1 + i].object["stringData"]["userdata"]
            .as_str()
            .unwrap();
        let own = format!("kubevm@web-{i}.default");
        assert!(
            text.lines().any(|l| l.trim() == own),
            "replica {i}: {own}\n{text}"
        );
        let other = format!("kubevm@web-{}.default", (i + 1) % 3);
        assert!(!text.contains(&other), "replica {i} must not trust {other}");
        let labels = &m.objects[1 + i].object["metadata"]["labels"];
        assert_eq!(labels[VM_LABEL], format!("web-{i}").as_str());
        assert_eq!(labels[POOL_LABEL], "web");
    }
}

#[test]
fn deckhouse_pool_is_n_labelled_vms_with_their_own_disks() {
    let plan = pool(Flavor::Deckhouse, 2);
    let m = build(&plan, &replicas(&plan)).unwrap();
    let vms: Vec<&str> = m
        .objects
        .iter()
        .filter(|o| o.kind() == "VirtualMachine")
        .map(|o| o.name())
        .collect();
    assert_eq!(vms, ["web-0", "web-1"]);
    let disks: Vec<&str> = m
        .objects
        .iter()
        .filter(|o| o.kind() == "VirtualDisk")
        .map(|o| o.name())
        .collect();
    assert_eq!(disks, ["web-0-root", "web-1-root"]);
    for o in &m.objects {
        assert_eq!(
            o.object["metadata"]["labels"][POOL_LABEL],
            "web",
            "{}",
            o.name()
        );
    }
    // Each VM's owned objects follow it, so create_all gives them that VM as owner.
    let order: Vec<(&str, bool)> = m
        .objects
        .iter()
        .map(|o| (o.kind(), o.owner == Owner::Vm))
        .collect();
    let first_vm = order
        .iter()
        .position(|(k, _)| *k == "VirtualMachine")
        .unwrap();
    assert!(
        order[first_vm + 1..]
            .iter()
            .take_while(|(k, _)| *k != "VirtualDisk")
            .all(|(_, owned)| *owned)
    );
}

#[test]
fn replicas_are_checked_before_anything_is_built() {
    let check = |plan: &VmPlan| plan.validate().unwrap_err().to_string();
    for n in [0, MAX_REPLICAS + 1] {
        assert_eq!(
            check(&pool(Flavor::KubeVirt, n)),
            format!("--replicas {n} is out of range: give 1 to 32")
        );
    }
    assert!(pool(Flavor::KubeVirt, MAX_REPLICAS).validate().is_ok());
    let mut p = pool(Flavor::Deckhouse, 2);
    p.boot = BootSource::ExistingDisk { name: "d".into() };
    assert!(check(&p).starts_with("--disk d cannot be used with --replicas"));
    let mut p = pool(Flavor::KubeVirt, 2);
    p.hostname = Some("h".into());
    assert!(check(&p).starts_with("--hostname cannot be used with --replicas"));
    let mut p = pool(Flavor::KubeVirt, 2);
    p.extras.uuid = Some("6a1a24a1-4061-4607-8bf4-a3963d0c5895".into());
    assert!(check(&p).starts_with("--uuid cannot be used with --replicas"));
    let mut p = pool(Flavor::KubeVirt, 2);
    p.boot = BootSource::Url {
        url: "https://example.org/d.qcow2".into(),
        checksums: vec![format!("sha256:{}", "0".repeat(64)).parse().unwrap()],
    };
    assert!(check(&p).starts_with("--checksum cannot be used with --replicas on KubeVirt"));
    p.flavor = Flavor::Deckhouse;
    assert!(
        p.validate().is_ok(),
        "Deckhouse gives each replica its own verified disk"
    );
    // The last replica's name must still be a DNS label (63 characters).
    let mut p = pool(Flavor::KubeVirt, 10);
    p.name = "a".repeat(62);
    assert!(check(&p).contains(&"a".repeat(62)), "{}", check(&p));
    p.replicas = Some(1);
    p.name = "a".repeat(50);
    assert_eq!(p.validate(), Ok(()));
    // `delete` tells a Deckhouse pool's VMs by the pool label: only --replicas sets it.
    let mut p = fixtures::plan(Flavor::Deckhouse, fixtures::image());
    p.labels = vec!["kubevm.io/pool=web".parse().unwrap()];
    let err = check(&p);
    assert!(err.contains("kubectl vm's own labels"), "{err}");
}

/// `create --replicas` with placement flags: every replica (KubeVirt: the pool's template)
/// carries them at the platform's fields, valid against the real schemas (the Deckhouse CRD's
/// renamed anti-affinity fields), and `--spread-by` selects the pool's label.
#[test]
fn placement_reaches_every_replica_at_the_platform_fields() {
    let placement = crate::placement::Placement::parse_flags(
        &["disktype=ssd".into()],
        &["gpu=true:NoSchedule".into()],
        &["topology.kubernetes.io/zone=a".into()],
        Some("hostname"),
        Some("high".into()),
    )
    .unwrap();
    let node_affinity = json!({"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}]}]}});
    let term = json!({"labelSelector": {"matchLabels": {"kubevm.io/pool": "web"}},
        "topologyKey": "kubernetes.io/hostname"});
    let toleration =
        json!([{"key": "gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}]);
    for flavor in [Flavor::KubeVirt, Flavor::Deckhouse] {
        let mut plan = pool(flavor, 2);
        plan.placement = placement.clone();
        let manifests = build(&plan, &replicas(&plan)).unwrap();
        let specs: Vec<&Value> = manifests
            .objects
            .iter()
            .filter(|o| o.is_main())
            .map(|o| {
                let vm = match flavor {
                    // The pool's template is a VM spec (the swagger has no pool kind).
                    Flavor::KubeVirt => json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                        "metadata": {"name": "web"}, "spec": o.object["spec"]["virtualMachineTemplate"]["spec"]}),
                    Flavor::Deckhouse => o.object.clone(),
                };
                crate::create::schema_check::assert_valid(&vm);
                match flavor {
                    Flavor::KubeVirt => &o.object["spec"]["virtualMachineTemplate"]["spec"]["template"]["spec"],
                    Flavor::Deckhouse => &o.object["spec"],
                }
            })
            .collect();
        assert_eq!(specs.len(), if flavor == Flavor::KubeVirt { 1 } else { 2 });
        for spec in specs {
            assert_eq!(spec["nodeSelector"], json!({"disktype": "ssd"}), "{flavor}");
            assert_eq!(spec["tolerations"], toleration, "{flavor}");
            assert_eq!(spec["priorityClassName"], "high", "{flavor}");
            assert_eq!(spec["affinity"]["nodeAffinity"], node_affinity, "{flavor}");
            let (anti, term_field) = match flavor {
                Flavor::KubeVirt => ("podAntiAffinity", "podAffinityTerm"),
                Flavor::Deckhouse => (
                    "virtualMachineAndPodAntiAffinity",
                    "virtualMachineAndPodAffinityTerm",
                ),
            };
            assert_eq!(
                spec["affinity"][anti]["preferredDuringSchedulingIgnoredDuringExecution"],
                json!([{"weight": 100, term_field: term}]),
                "{flavor}"
            );
        }
    }
    // One VM has no pool to spread.
    let mut single = fixtures::plan(Flavor::KubeVirt, fixtures::image());
    single.placement = placement;
    let e = crate::create::build(&single).unwrap_err().to_string();
    assert_eq!(
        e,
        "--spread-by spreads the replicas of a pool: give --replicas N"
    );
}
