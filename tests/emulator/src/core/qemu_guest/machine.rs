//! The virtual hardware virt-launcher gives a KubeVirt guest, as qemu arguments: the CPU
//! topology (`domain.cpu.{sockets,cores,threads}`, each defaulting to 1; libvirt `<vcpu>` is
//! their product and `<topology>` the split — pkg/virt-launcher/virtwrap/converter, `Convert_v1_VirtualMachineInstance_To_api_Domain`
//! with `vcpu.GetCPUTopology`), and the SMBIOS system (type 1) table: `firmware.uuid` and
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

/// `-smp`, `-uuid` and `-smbios` for a VMI spec (`domain` …); `default_cpus` when the spec has
/// no CPU section (an instancetype VM before expansion).
pub(super) fn args(spec: &Value, default_cpus: u32) -> Vec<String> {
    let cpu = spec.pointer("/domain/cpu");
    let field = |name: &str| {
        cpu.and_then(|c| c.get(name))
            .and_then(Value::as_u64)
            .unwrap_or(1)
            .max(1)
    };
    let smp = match cpu {
        Some(_) => {
            let (sockets, cores, threads) = (field("sockets"), field("cores"), field("threads"));
            format!(
                "{},sockets={sockets},cores={cores},threads={threads}",
                sockets * cores * threads
            )
        }
        None => default_cpus.to_string(),
    };
    let mut args = vec!["-smp".to_owned(), smp];
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
    fn topology_uuid_and_serial_become_qemu_arguments() {
        let spec = json!({ "domain": {
            "cpu": { "sockets": 2, "cores": 3, "threads": 2 },
            "firmware": { "uuid": "0f8fad5b-d9cb-469f-a165-70867728950e", "serial": "SN,1" },
        }});
        assert_eq!(
            args(&spec, 1),
            [
                "-smp",
                "12,sockets=2,cores=3,threads=2",
                "-uuid",
                "0f8fad5b-d9cb-469f-a165-70867728950e",
                "-smbios",
                "type=1,manufacturer=KubeVirt,product=None,family=KubeVirt,serial=SN,,1,uuid=0f8fad5b-d9cb-469f-a165-70867728950e",
            ]
        );
    }

    #[test]
    fn missing_fields_default_like_kubevirt() {
        let spec = json!({ "domain": { "cpu": { "cores": 2 } } });
        assert_eq!(
            args(&spec, 1),
            [
                "-smp",
                "2,sockets=1,cores=2,threads=1",
                "-smbios",
                "type=1,manufacturer=KubeVirt,product=None,family=KubeVirt",
            ]
        );
        assert_eq!(args(&json!({ "domain": {} }), 3)[1], "3");
    }
}
