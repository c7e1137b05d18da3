//! The identity virt-launcher gives a KubeVirt guest's machine, as qemu arguments (its CPUs and
//! memory: `sizing.rs`; the topology follows pkg/virt-launcher/virtwrap/converter,
//! `Convert_v1_VirtualMachineInstance_To_api_Domain` with `vcpu.GetCPUTopology`): the SMBIOS
//! system (type 1) table: `firmware.uuid` and
//! `firmware.serial` from the VMI, manufacturer/product/family from the cluster's SMBIOS
//! configuration, whose defaults are `KubeVirt`/`None`/`KubeVirt`
//! (pkg/virt-config/virt-config.go `SmbiosConfigDefault*`).

use serde_json::Value;

/// SMBIOS manufacturer, product and family when the KubeVirt CR sets none.
pub(super) const SMBIOS_DEFAULTS: [(&str, &str); 3] = [
    ("manufacturer", "KubeVirt"),
    ("product", "None"),
    ("family", "KubeVirt"),
];

/// A value inside a qemu option list: a ',' is written twice.
fn escape(value: &str) -> String {
    value.replace(',', ",,")
}

/// `-uuid` and `-smbios` for a VMI spec (`domain` …).
pub(super) fn args(spec: &Value) -> Vec<String> {
    let mut args = Vec::new();
    let firmware = spec.pointer("/domain/firmware");
    let text = |name: &str| firmware.and_then(|f| f.get(name)).and_then(Value::as_str);
    let mut smbios = "type=1".to_owned();
    for (key, value) in SMBIOS_DEFAULTS {
        smbios.push_str(&format!(",{key}={}", escape(value)));
    }
    if let Some(serial) = text("serial") {
        smbios.push_str(&format!(",serial={}", escape(serial)));
    }
    if let Some(uuid) = text("uuid") {
        smbios.push_str(&format!(",uuid={uuid}"));
        args.extend(["-uuid".to_owned(), uuid.to_owned()]);
    }
    args.extend(["-smbios".to_owned(), smbios]);
    args
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn uuid_and_serial_become_qemu_arguments() {
        let spec = json!({ "domain": {
            "firmware": { "uuid": "0f8fad5b-d9cb-469f-a165-70867728950e", "serial": "SN,1" },
        }});
        assert_eq!(
            args(&spec),
            [
                "-uuid",
                "0f8fad5b-d9cb-469f-a165-70867728950e",
                "-smbios",
                "type=1,manufacturer=KubeVirt,product=None,family=KubeVirt,serial=SN,,1,uuid=0f8fad5b-d9cb-469f-a165-70867728950e",
            ]
        );
    }

    #[test]
    fn missing_fields_default_like_kubevirt() {
        assert_eq!(
            args(&json!({ "domain": {} })),
            [
                "-smbios",
                "type=1,manufacturer=KubeVirt,product=None,family=KubeVirt",
            ]
        );
    }
}
