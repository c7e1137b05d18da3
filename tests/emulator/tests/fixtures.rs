//! The shipped fixtures load and every object in them is valid against its schema.

use kubevm_emulator::core::registry::{Registry, split_api_version};
use kubevm_emulator::core::schema::{FieldValidation, validate};
use kubevm_emulator::{Emulator, EmulatorOptions, ServeFlavor, core::fixtures};

fn fixture(name: &str) -> String {
    let path = format!("{}/../fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn fixtures_are_valid() {
    let reg = Registry::new(ServeFlavor::Both);
    for file in [
        "kubevirt.yaml",
        "deckhouse.yaml",
        "debug-kubevirt.yaml",
        "debug-deckhouse.yaml",
    ] {
        for doc in fixtures::documents(&fixture(file)).unwrap() {
            let av = doc["apiVersion"].as_str().unwrap();
            let kind = doc["kind"].as_str().unwrap();
            if av == fixtures::EMULATOR_API_VERSION {
                continue;
            }
            let def = reg
                .find_kind(av, kind)
                .unwrap_or_else(|| panic!("{file}: {kind} {av} not served"));
            let mut obj = doc.clone();
            let (_, version) = split_api_version(av);
            if let Err(e) = validate(&def, version, &mut obj, None, FieldValidation::Strict) {
                panic!("{file}: {kind} {}: {}", doc["metadata"]["name"], e.message);
            }
            kubevm_emulator::core::admission::admit(&def, &obj).unwrap();
        }
    }
}

#[tokio::test]
async fn fixtures_load_into_both_flavor() {
    let opts = EmulatorOptions {
        fixture_yaml: vec![fixture("kubevirt.yaml"), fixture("deckhouse.yaml")],
        flavor: ServeFlavor::Both,
        ..Default::default()
    };
    let emu = Emulator::start(opts).await.unwrap();
    assert_eq!(emu.objects("kubevirt.io", "virtualmachines", None).len(), 5);
    assert_eq!(
        emu.objects(
            "virtualization.deckhouse.io",
            "virtualmachines",
            Some("default")
        )
        .len(),
        1
    );
    emu.shutdown().await;
}

#[test]
fn kubevirt_fixture_needs_kubevirt_flavor() {
    let opts = EmulatorOptions {
        fixture_yaml: vec![fixture("kubevirt.yaml")],
        flavor: ServeFlavor::Deckhouse,
        ..Default::default()
    };
    let err = Emulator::start_blocking(opts).err().expect("must fail");
    assert!(err.to_string().contains("not served"), "{err}");
}
