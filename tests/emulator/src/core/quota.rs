//! Object-count ResourceQuota, as the API server's quota admission enforces it
//! (k8s.io/apiserver/pkg/admission/plugin/resourcequota/controller.go `checkRequest`): a create
//! that would take `count/<resource>` (or a core kind's legacy name such as `secrets`) over
//! `spec.hard` in its namespace is refused with 403
//! `<resource> "<name>" is forbidden: exceeded quota: <quota>, requested: <r>=1, used: <r>=<n>,
//! limited: <r>=<hard>` (only the exceeded resources are listed). Usage is counted from the
//! store (the real quota controller keeps it in `status.used`). Compute and storage quotas are
//! charged to pods and PVCs, which the emulator's controllers create; they are not enforced.

use crate::core::registry::ResourceDef;
use crate::core::status::ApiError;
use crate::core::store::Store;
use crate::core::util::meta_str;
use serde_json::Value;

/// Core kinds whose object count also has a legacy quota name (pkg/quota/v1/evaluator/core).
fn legacy_name(def: &ResourceDef) -> Option<&str> {
    (def.group.is_empty()
        && matches!(
            def.plural.as_str(),
            "pods"
                | "services"
                | "secrets"
                | "configmaps"
                | "persistentvolumeclaims"
                | "replicationcontrollers"
                | "resourcequotas"
        ))
    .then_some(def.plural.as_str())
}

fn quantity(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// Checks a create of `name` in `namespace` against the namespace's quotas.
pub fn check(
    store: &Store,
    def: &ResourceDef,
    namespace: &str,
    name: &str,
) -> Result<(), ApiError> {
    if namespace.is_empty() {
        return Ok(());
    }
    let (quotas, _) = store.list("", "resourcequotas", Some(namespace));
    if quotas.is_empty() {
        return Ok(());
    }
    let resource = if def.group.is_empty() {
        def.plural.clone()
    } else {
        format!("{}.{}", def.plural, def.group)
    };
    let count_name = format!("count/{resource}");
    let names: Vec<&str> = [Some(count_name.as_str()), legacy_name(def)]
        .into_iter()
        .flatten()
        .collect();
    let used = store.list(&def.group, &def.plural, Some(namespace)).0.len() as i64;
    for quota in &quotas {
        let Some(hard) = quota.pointer("/spec/hard").and_then(Value::as_object) else {
            continue;
        };
        // quota.Mask: only the exceeded resources, sorted by name (prettyPrint).
        let mut exceeded: Vec<(&str, i64)> = names
            .iter()
            .filter_map(|n| Some((*n, quantity(hard.get(*n)?)?)))
            .filter(|(_, limit)| used + 1 > *limit)
            .collect();
        if exceeded.is_empty() {
            continue;
        }
        exceeded.sort();
        let list = |f: &dyn Fn(i64) -> i64| {
            exceeded
                .iter()
                .map(|(n, limit)| format!("{n}={}", f(*limit)))
                .collect::<Vec<_>>()
                .join(",")
        };
        let message = format!(
            "exceeded quota: {}, requested: {}, used: {}, limited: {}",
            meta_str(quota, "name"),
            list(&|_| 1),
            list(&|_| used),
            list(&|limit| limit),
        );
        return Err(ApiError::forbidden(&def.group, &def.plural, name, &message));
    }
    Ok(())
}
