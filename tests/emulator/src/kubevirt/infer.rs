//! virt-api's VirtualMachine mutator infers an instancetype and a preference from a volume
//! (KubeVirt `pkg/instancetype/infer/infer.go` and `volume.go`, called by
//! `pkg/virt-api/webhooks/mutating-webhook/mutators/vm-mutator.go`): a matcher with
//! `inferFromVolume: VOLUME` is replaced by `{name, kind}` read from the labels
//! `instancetype.kubevirt.io/default-instancetype[-kind]` (`default-preference[-kind]`) of what
//! the volume comes from — a PVC; a DataVolume (its labels, then its source); a
//! `dataVolumeTemplates` entry cloning a PVC or a DataSource (the DataSource's labels, then its
//! PVC's). With `inferFromVolumeFailurePolicy: Ignore` a missing label or an unsupported source
//! clears the matcher instead (and a successful instancetype inference drops
//! `domain.memory`); any other failure denies the request.

use crate::core::app::App;
use crate::core::status::ApiError;
use crate::core::store::Key;
use serde_json::{Map, Value, json};

const INSTANCETYPE_LABEL: &str = "instancetype.kubevirt.io/default-instancetype";
const INSTANCETYPE_KIND_LABEL: &str = "instancetype.kubevirt.io/default-instancetype-kind";
const PREFERENCE_LABEL: &str = "instancetype.kubevirt.io/default-preference";
const PREFERENCE_KIND_LABEL: &str = "instancetype.kubevirt.io/default-preference-kind";
const WEBHOOK: &str = "virtualmachines-mutator.kubevirt.io";

/// Why inference failed; `ignorable` ones give way to `Ignore` (volume.go
/// `NewIgnoreableInferenceError`).
struct Failure {
    message: String,
    ignorable: bool,
}

fn ignorable(message: String) -> Failure {
    Failure {
        message,
        ignorable: true,
    }
}

fn fatal(message: String) -> Failure {
    Failure {
        message,
        ignorable: false,
    }
}

type Found = Result<(String, String), Failure>;

struct Lookup<'a> {
    app: &'a App,
    vm: &'a Value,
    ns: &'a str,
    name_label: &'a str,
    kind_label: &'a str,
}

impl Lookup<'_> {
    fn get(&self, group: &str, plural: &str, ns: &str, name: &str) -> Result<Value, Failure> {
        self.app
            .store
            .get(&Key::new(group, plural, ns, name))
            .ok_or_else(|| {
                // The client's NotFound error (apimachinery errors.NewNotFound).
                let resource = if group.is_empty() {
                    plural.to_string()
                } else {
                    format!("{plural}.{group}")
                };
                fatal(format!("{resource} \"{name}\" not found"))
            })
    }

    fn labels(&self, obj: &Value) -> Found {
        let labels = obj.pointer("/metadata/labels");
        let label = |l: &str| labels.and_then(|m| m.get(l)).and_then(Value::as_str);
        match label(self.name_label) {
            Some(name) => Ok((
                name.to_string(),
                label(self.kind_label).unwrap_or("").to_string(),
            )),
            None => Err(ignorable(format!(
                "unable to find required {} label on the volume",
                self.name_label
            ))),
        }
    }

    fn pvc(&self, name: &str, ns: &str) -> Found {
        self.labels(&self.get("", "persistentvolumeclaims", ns, name)?)
    }

    fn data_source(&self, name: &str, ns: &str) -> Found {
        let ds = self.get("cdi.kubevirt.io", "datasources", ns, name)?;
        if let Ok(found) = self.labels(&ds) {
            return Ok(found);
        }
        match ds.pointer("/spec/source/pvc") {
            Some(pvc) => self.pvc(
                pvc["name"].as_str().unwrap_or(""),
                pvc["namespace"].as_str().unwrap_or(""),
            ),
            None => Err(ignorable(
                "unable to infer defaults from DataSource that doesn't provide DataVolumeSourcePVC"
                    .into(),
            )),
        }
    }

    fn data_volume_spec(&self, spec: &Value) -> Found {
        if let Some(pvc) = spec.pointer("/source/pvc") {
            return self.pvc(
                pvc["name"].as_str().unwrap_or(""),
                pvc["namespace"].as_str().unwrap_or(""),
            );
        }
        if let Some(r) = spec.get("sourceRef") {
            let kind = r["kind"].as_str().unwrap_or("");
            if kind == "DataSource" {
                return self.data_source(
                    r["name"].as_str().unwrap_or(""),
                    r["namespace"].as_str().unwrap_or(self.ns),
                );
            }
            return Err(ignorable(format!(
                "unable to infer defaults from DataVolumeSourceRef as Kind {kind} is not supported"
            )));
        }
        Err(ignorable(
            "unable to infer defaults from DataVolumeSpec as DataVolumeSource is not supported"
                .into(),
        ))
    }

    fn data_volume(&self, name: &str) -> Found {
        let templates = self.vm.pointer("/spec/dataVolumeTemplates");
        if let Some(t) = templates
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|t| t.pointer("/metadata/name").and_then(Value::as_str) == Some(name))
        {
            return self.data_volume_spec(t.get("spec").unwrap_or(&Value::Null));
        }
        let Some(dv) =
            self.app
                .store
                .get(&Key::new("cdi.kubevirt.io", "datavolumes", self.ns, name))
        else {
            // A garbage-collected DataVolume: its PVC has the same name.
            return self.pvc(name, self.ns);
        };
        if let Ok(found) = self.labels(&dv) {
            return Ok(found);
        }
        self.data_volume_spec(dv.get("spec").unwrap_or(&Value::Null))
    }

    fn volume(&self, volume: &str) -> Found {
        let volumes = self.vm.pointer("/spec/template/spec/volumes");
        let Some(v) = volumes
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|v| v["name"] == volume)
        else {
            return Err(fatal(format!(
                "unable to find volume {volume} to infer defaults"
            )));
        };
        if let Some(claim) = v.pointer("/persistentVolumeClaim/claimName") {
            return self.pvc(claim.as_str().unwrap_or(""), self.ns);
        }
        if let Some(dv) = v.pointer("/dataVolume/name") {
            return self.data_volume(dv.as_str().unwrap_or(""));
        }
        Err(ignorable(format!(
            "unable to infer defaults from volume {volume} as type is not supported"
        )))
    }
}

/// Replaces `inferFromVolume` matchers of a VirtualMachine in `ns` as virt-api's mutator does.
pub fn mutate(app: &App, vm: &mut Value, ns: &str) -> Result<(), ApiError> {
    for (field, name_label, kind_label) in [
        ("instancetype", INSTANCETYPE_LABEL, INSTANCETYPE_KIND_LABEL),
        ("preference", PREFERENCE_LABEL, PREFERENCE_KIND_LABEL),
    ] {
        let Some(matcher) = vm.pointer(&format!("/spec/{field}")).cloned() else {
            continue;
        };
        let Some(volume) = matcher["inferFromVolume"]
            .as_str()
            .filter(|v| !v.is_empty())
        else {
            continue;
        };
        let ignore = matcher["inferFromVolumeFailurePolicy"] == "Ignore";
        let lookup = Lookup {
            app,
            vm,
            ns,
            name_label,
            kind_label,
        };
        match lookup.volume(volume) {
            Ok((name, kind)) => {
                let mut m = Map::new();
                m.insert("name".into(), json!(name));
                if !kind.is_empty() {
                    m.insert("kind".into(), json!(kind));
                }
                vm["spec"][field] = Value::Object(m);
                if ignore
                    && field == "instancetype"
                    && let Some(domain) = vm
                        .pointer_mut("/spec/template/spec/domain")
                        .and_then(Value::as_object_mut)
                {
                    domain.remove("memory");
                }
            }
            Err(f) if f.ignorable && ignore => {
                if let Some(spec) = vm.get_mut("spec").and_then(Value::as_object_mut) {
                    spec.remove(field);
                }
            }
            Err(f) => {
                // webhookutils.ToAdmissionResponseError: the error as the denial's message.
                let mut e = ApiError::new(
                    422,
                    "Invalid",
                    format!(
                        "admission webhook \"{WEBHOOK}\" denied the request: {}",
                        f.message
                    ),
                );
                e.details = Some(json!({"causes": []}));
                return Err(e);
            }
        }
    }
    Ok(())
}
