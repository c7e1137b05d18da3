//! Protobuf request bodies of the built-in kinds kubectl creates through its typed client
//! (`kubectl create secret|configmap|namespace|role|rolebinding|clusterrole|clusterrolebinding`
//! send `application/vnd.kubernetes.protobuf`, as
//! every client-go clientset does, and a real API server accepts it).
//!
//! The wire format is k8s.io/apimachinery/pkg/runtime/serializer/protobuf: the magic
//! `k8s\0`, then a `runtime.Unknown` {1: typeMeta {1: apiVersion, 2: kind}, 2: raw, 3:
//! contentEncoding, 4: contentType} whose `raw` is the object's message from
//! k8s.io/api/core/v1/generated.proto (rbac/v1 for the RBAC kinds). Only the fields those commands can set are decoded;
//! anything else is refused (415) rather than silently dropped.

use serde_json::{Map, Value, json};

const MAGIC: &[u8] = b"k8s\0";

/// Kinds whose protobuf bodies are understood.
pub fn supported(group: &str, plural: &str) -> bool {
    (group.is_empty() && matches!(plural, "secrets" | "configmaps" | "namespaces"))
        || (group == RBAC
            && matches!(
                plural,
                "roles" | "rolebindings" | "clusterroles" | "clusterrolebindings"
            ))
}

const RBAC: &str = "rbac.authorization.k8s.io";

/// One protobuf field: number and value.
enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

fn varint(buf: &[u8], pos: &mut usize) -> Result<u64, String> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *buf.get(*pos).ok_or("truncated varint")?;
        *pos += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err("varint too long".into())
}

fn fields(buf: &[u8]) -> Result<Vec<(u64, Field<'_>)>, String> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < buf.len() {
        let tag = varint(buf, &mut pos)?;
        let (num, wire) = (tag >> 3, tag & 7);
        let field = match wire {
            0 => Field::Varint(varint(buf, &mut pos)?),
            2 => {
                let len = usize::try_from(varint(buf, &mut pos)?).map_err(|e| e.to_string())?;
                let end = pos.checked_add(len).filter(|e| *e <= buf.len());
                let end = end.ok_or("truncated field")?;
                let b = &buf[pos..end];
                pos = end;
                Field::Bytes(b)
            }
            1 => {
                pos += 8;
                Field::Varint(0)
            }
            5 => {
                pos += 4;
                Field::Varint(0)
            }
            w => return Err(format!("unsupported wire type {w}")),
        };
        out.push((num, field));
    }
    if pos > buf.len() {
        return Err("truncated message".into());
    }
    Ok(out)
}

fn string(f: &Field<'_>) -> Result<String, String> {
    match f {
        Field::Bytes(b) => String::from_utf8(b.to_vec()).map_err(|e| e.to_string()),
        Field::Varint(_) => Err("expected a string".into()),
    }
}

fn bytes<'a>(f: &Field<'a>) -> Result<&'a [u8], String> {
    match f {
        Field::Bytes(b) => Ok(b),
        Field::Varint(_) => Err("expected bytes".into()),
    }
}

/// A `map<string, X>` entry {1: key, 2: value}.
fn entry<'a>(f: &Field<'a>) -> Result<(String, &'a [u8]), String> {
    let mut key = String::new();
    let mut value: &[u8] = &[];
    for (n, f) in fields(bytes(f)?)? {
        match n {
            1 => key = string(&f)?,
            2 => value = bytes(&f)?,
            _ => {}
        }
    }
    Ok((key, value))
}

fn text(b: &[u8]) -> Result<Value, String> {
    Ok(json!(std::str::from_utf8(b).map_err(|e| e.to_string())?))
}

fn object_meta(buf: &[u8]) -> Result<Value, String> {
    let mut meta = Map::new();
    for (n, f) in fields(buf)? {
        let (key, value) = match n {
            1 => ("name", json!(string(&f)?)),
            2 => ("generateName", json!(string(&f)?)),
            3 => ("namespace", json!(string(&f)?)),
            11 | 12 => {
                let (k, v) = entry(&f)?;
                let map = if n == 11 { "labels" } else { "annotations" };
                meta.entry(map)
                    .or_insert_with(|| json!({}))
                    .as_object_mut()
                    .expect("map")
                    .insert(k, text(v)?);
                continue;
            }
            14 => {
                meta.entry("finalizers")
                    .or_insert_with(|| json!([]))
                    .as_array_mut()
                    .expect("list")
                    .push(json!(string(&f)?));
                continue;
            }
            // Server-owned fields kubectl leaves empty (uid, resourceVersion, timestamps…).
            4..=10 => continue,
            other => return Err(format!("ObjectMeta field {other} is not supported")),
        };
        // proto2 sends unset optional strings as empty ones.
        if value != json!("") {
            meta.insert(key.into(), value);
        }
    }
    Ok(Value::Object(meta))
}

fn secret_or_configmap(raw: &[u8], secret: bool) -> Result<Value, String> {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut obj = json!({"metadata": {}});
    // Secret {1 metadata, 2 data<bytes>, 3 type, 4 stringData<string>, 5 immutable};
    // ConfigMap {1 metadata, 2 data<string>, 3 binaryData<bytes>, 4 immutable}.
    for (n, f) in fields(raw)? {
        match (n, secret) {
            (1, _) => obj["metadata"] = object_meta(bytes(&f)?)?,
            (2, true) | (3, false) => {
                let (k, v) = entry(&f)?;
                let map = if secret { "data" } else { "binaryData" };
                obj[map][k] = json!(b64.encode(v));
            }
            (2, false) | (4, true) => {
                let (k, v) = entry(&f)?;
                let map = if secret { "stringData" } else { "data" };
                obj[map][k] = text(v)?;
            }
            (3, true) if !string(&f)?.is_empty() => obj["type"] = json!(string(&f)?),
            (3, true) => {}
            (5, true) | (4, false) => {
                if let Field::Varint(v) = f {
                    obj["immutable"] = json!(v != 0);
                }
            }
            (other, _) => return Err(format!("field {other} is not supported")),
        }
    }
    Ok(obj)
}

fn namespace(raw: &[u8]) -> Result<Value, String> {
    let mut obj = json!({"metadata": {}});
    for (n, f) in fields(raw)? {
        match n {
            1 => obj["metadata"] = object_meta(bytes(&f)?)?,
            // NamespaceSpec {1: repeated finalizers}.
            2 => {
                let mut finalizers = Vec::new();
                for (m, g) in fields(bytes(&f)?)? {
                    if m == 1 {
                        finalizers.push(json!(string(&g)?));
                    }
                }
                if !finalizers.is_empty() {
                    obj["spec"] = json!({"finalizers": finalizers});
                }
            }
            3 => {}
            other => return Err(format!("field {other} is not supported")),
        }
    }
    Ok(obj)
}

/// A TokenRequest (k8s.io/api/authentication/v1/generated.proto: {1: metadata, 2: spec
/// {1: audiences, 4: expirationSeconds, 3: boundObjectRef}}), what `kubectl create token`
/// sends; a bound object reference is refused (not emulated).
fn token_request(raw: &[u8]) -> Result<Value, String> {
    let mut spec = Map::new();
    for (n, f) in fields(raw)? {
        if n != 2 {
            continue;
        }
        for (m, g) in fields(bytes(&f)?)? {
            match (m, g) {
                (1, g) => spec
                    .entry("audiences")
                    .or_insert_with(|| json!([]))
                    .as_array_mut()
                    .expect("list")
                    .push(json!(string(&g)?)),
                (4, Field::Varint(v)) => {
                    spec.insert("expirationSeconds".into(), json!(v.cast_signed()));
                }
                (3, _) => return Err("boundObjectRef is not supported".into()),
                _ => {}
            }
        }
    }
    Ok(json!({"spec": spec}))
}

/// Repeated strings of a message, by field number, as JSON lists under `names`.
fn string_lists(raw: &[u8], names: &[(u64, &str)]) -> Result<Value, String> {
    let mut out = Map::new();
    for (n, f) in fields(raw)? {
        let Some((_, name)) = names.iter().find(|(m, _)| *m == n) else {
            return Err(format!("field {n} is not supported"));
        };
        out.entry(*name)
            .or_insert_with(|| json!([]))
            .as_array_mut()
            .expect("list")
            .push(json!(string(&f)?));
    }
    Ok(Value::Object(out))
}

/// Optional strings of a message, by field number (proto2 empty strings left out).
fn strings(raw: &[u8], names: &[(u64, &str)]) -> Result<Value, String> {
    let mut out = Map::new();
    for (n, f) in fields(raw)? {
        let Some((_, name)) = names.iter().find(|(m, _)| *m == n) else {
            return Err(format!("field {n} is not supported"));
        };
        let value = string(&f)?;
        if !value.is_empty() {
            out.insert((*name).into(), json!(value));
        }
    }
    Ok(Value::Object(out))
}

/// Role and ClusterRole (k8s.io/api/rbac/v1/generated.proto: {1: metadata, 2: rules
/// PolicyRule {1: verbs, 2: apiGroups, 3: resources, 4: resourceNames, 5: nonResourceURLs},
/// 3: aggregationRule (ClusterRole; refused)}), what `kubectl create role|clusterrole` sends.
fn role(raw: &[u8]) -> Result<Value, String> {
    let mut obj = json!({"metadata": {}, "rules": []});
    for (n, f) in fields(raw)? {
        match n {
            1 => obj["metadata"] = object_meta(bytes(&f)?)?,
            2 => obj["rules"]
                .as_array_mut()
                .expect("list")
                .push(string_lists(
                    bytes(&f)?,
                    &[
                        (1, "verbs"),
                        (2, "apiGroups"),
                        (3, "resources"),
                        (4, "resourceNames"),
                        (5, "nonResourceURLs"),
                    ],
                )?),
            other => return Err(format!("field {other} is not supported")),
        }
    }
    Ok(obj)
}

/// RoleBinding and ClusterRoleBinding ({1: metadata, 2: subjects Subject {1: kind, 2:
/// apiGroup, 3: name, 4: namespace}, 3: roleRef RoleRef {1: apiGroup, 2: kind, 3: name}}),
/// what `kubectl create rolebinding|clusterrolebinding` sends.
fn role_binding(raw: &[u8]) -> Result<Value, String> {
    let mut obj = json!({"metadata": {}});
    for (n, f) in fields(raw)? {
        match n {
            1 => obj["metadata"] = object_meta(bytes(&f)?)?,
            2 => obj
                .as_object_mut()
                .expect("object")
                .entry("subjects")
                .or_insert_with(|| json!([]))
                .as_array_mut()
                .expect("list")
                .push(strings(
                    bytes(&f)?,
                    &[(1, "kind"), (2, "apiGroup"), (3, "name"), (4, "namespace")],
                )?),
            3 => {
                obj["roleRef"] = strings(bytes(&f)?, &[(1, "apiGroup"), (2, "kind"), (3, "name")])?
            }
            other => return Err(format!("field {other} is not supported")),
        }
    }
    Ok(obj)
}

/// Decodes a protobuf body of `kind` into the JSON form of the object.
pub fn decode(kind: &str, body: &[u8]) -> Result<Value, String> {
    let rest = body
        .strip_prefix(MAGIC)
        .ok_or("missing the k8s protobuf magic prefix")?;
    let (mut api_version, mut body_kind, mut raw) = (String::new(), String::new(), &[][..]);
    for (n, f) in fields(rest)? {
        match n {
            1 => {
                for (m, g) in fields(bytes(&f)?)? {
                    match m {
                        1 => api_version = string(&g)?,
                        2 => body_kind = string(&g)?,
                        _ => {}
                    }
                }
            }
            2 => raw = bytes(&f)?,
            3 if !bytes(&f)?.is_empty() => return Err("content encoding is not supported".into()),
            _ => {}
        }
    }
    if !body_kind.is_empty() && body_kind != kind {
        return Err(format!("expected kind {kind}, got {body_kind}"));
    }
    let mut obj = match kind {
        "Secret" => secret_or_configmap(raw, true)?,
        "ConfigMap" => secret_or_configmap(raw, false)?,
        "Namespace" => namespace(raw)?,
        "TokenRequest" => token_request(raw)?,
        "Role" | "ClusterRole" => role(raw)?,
        "RoleBinding" | "ClusterRoleBinding" => role_binding(raw)?,
        other => return Err(format!("protobuf bodies of {other} are not supported")),
    };
    obj["apiVersion"] = json!(if api_version.is_empty() {
        if kind.starts_with("Role") || kind.starts_with("Cluster") {
            format!("{RBAC}/v1")
        } else {
            "v1".into()
        }
    } else {
        api_version
    });
    obj["kind"] = json!(kind);
    Ok(obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(num: u64, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![
            u8::try_from(num << 3 | 2).unwrap(),
            u8::try_from(payload.len()).unwrap(),
        ];
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn decodes_a_secret_envelope() {
        let meta = [field(1, b"s1"), field(3, b"dev")].concat();
        let data_entry = [field(1, b"a"), field(2, b"b")].concat();
        let secret = [field(1, &meta), field(2, &data_entry), field(3, b"Opaque")].concat();
        let type_meta = [field(1, b"v1"), field(2, b"Secret")].concat();
        let body = [MAGIC.to_vec(), field(1, &type_meta), field(2, &secret)].concat();
        let obj = decode("Secret", &body).unwrap();
        assert_eq!(
            obj,
            json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": "s1", "namespace": "dev"}, "data": {"a": "Yg=="}})
        );
        assert!(decode("Secret", b"{}").is_err());
    }

    /// The body `kubectl create role web-ssh -n dev --verb create --resource
    /// virtualmachines.ssh.kubevm.io/sshcertificate --resource-name web` sends, field numbers
    /// from k8s.io/api/rbac/v1/generated.proto.
    #[test]
    fn decodes_a_role_and_a_role_binding() {
        let meta = [field(1, b"web-ssh"), field(3, b"dev")].concat();
        let rule = [
            field(1, b"create"),
            field(2, b"ssh.kubevm.io"),
            field(3, b"virtualmachines/sshcertificate"),
            field(4, b"web"),
        ]
        .concat();
        let type_meta = [field(1, b"rbac.authorization.k8s.io/v1"), field(2, b"Role")].concat();
        let role = [field(1, &meta), field(2, &rule)].concat();
        let body = [MAGIC.to_vec(), field(1, &type_meta), field(2, &role)].concat();
        assert_eq!(
            decode("Role", &body).unwrap(),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": "web-ssh", "namespace": "dev"},
                "rules": [{"verbs": ["create"], "apiGroups": ["ssh.kubevm.io"],
                    "resources": ["virtualmachines/sshcertificate"], "resourceNames": ["web"]}]})
        );
        let subject = [
            field(1, b"User"),
            field(2, b"rbac.authorization.k8s.io"),
            field(3, b"alice"),
        ]
        .concat();
        let role_ref = [
            field(1, b"rbac.authorization.k8s.io"),
            field(2, b"Role"),
            field(3, b"web-ssh"),
        ]
        .concat();
        let binding = [
            field(1, &[field(1, b"alice-web"), field(3, b"dev")].concat()),
            field(2, &subject),
            field(3, &role_ref),
        ]
        .concat();
        let body = [MAGIC.to_vec(), field(2, &binding)].concat();
        assert_eq!(
            decode("RoleBinding", &body).unwrap(),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": "alice-web", "namespace": "dev"},
                "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "alice"}],
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "web-ssh"}})
        );
    }
}
