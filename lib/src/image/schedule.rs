//! `image create NAME --registry IMAGE --schedule CRON` on KubeVirt: a CDI DataImportCron
//! (`cdi.kubevirt.io/v1beta1`) instead of a DataVolume. CDI polls the registry on the
//! schedule, imports each new digest into a DataVolume of its own and points the managed
//! DataSource `NAME` at the newest, keeping `importsToKeep` imports (`garbageCollect:
//! Outdated`) (CDI `pkg/controller/dataimportcron-controller.go`). Its webhook takes a registry
//! source only ("Missing registry source", `pkg/apiserver/webhooks/dataimportcron-validate.go`),
//! and parses the schedule with `cronexpr`: the five fields are checked here first.
//!
//! Deckhouse has no scheduled imports: VirtualImage and ClusterVirtualImage have no schedule
//! field (their CRDs, `virtualimages.yaml` / `clustervirtualimages.yaml` in the reference).

use serde_json::{Value, json};

use super::{CreateRequest, DEFAULT_SIZE, Event, Image, OnEvent, Source, condition, labels, text};
use crate::api::Kind;
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::lifecycle::watch::{self, Watched};

/// CDI DataImportCron.
pub const DATA_IMPORT_CRON: Kind = Kind {
    group: "cdi.kubevirt.io",
    version: "v1beta1",
    kind: "DataImportCron",
    plural: "dataimportcrons",
    namespaced: true,
};

/// The label CDI puts on what a DataImportCron manages (`common.DataImportCronLabel`).
pub const CRON_LABEL: &str = "cdi.kubevirt.io/dataImportCron";

/// Imports kept when none is said (CDI `defaultImportsToKeepPerCron`).
pub const DEFAULT_IMPORTS_TO_KEEP: u32 = 3;

/// Check a cron expression locally: five fields (minute hour day-of-month month day-of-week),
/// each `*`, a number, a range `A-B`, a list `A,B` and an optional `/STEP`; months and days
/// also by name (`JAN`, `MON`).
pub fn check_schedule(schedule: &str) -> Result<()> {
    let usage = |why: String| Error::Usage(format!("--schedule {schedule:?}: {why}"));
    let fields: Vec<&str> = schedule.split_whitespace().collect();
    if fields.len() != 5 {
        return Err(usage(format!(
            "a cron schedule has 5 fields (minute hour day-of-month month day-of-week); got {}",
            fields.len()
        )));
    }
    const MONTHS: [&str; 12] = [
        "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
    ];
    const DAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];
    let specs: [(&str, u32, u32, &[&str], u32); 5] = [
        ("minute", 0, 59, &[], 0),
        ("hour", 0, 23, &[], 0),
        ("day of month", 1, 31, &[], 0),
        ("month", 1, 12, &MONTHS, 1),
        ("day of week", 0, 7, &DAYS, 0),
    ];
    for (field, (what, min, max, names, first)) in fields.iter().zip(specs) {
        let value = |v: &str| -> Option<u32> {
            if let Ok(n) = v.parse::<u32>() {
                return (min..=max).contains(&n).then_some(n);
            }
            names
                .iter()
                .position(|n| n.eq_ignore_ascii_case(v))
                .map(|i| i as u32 + first)
        };
        let bad = || {
            usage(format!(
                "the {what} field {field:?} is not valid ({min}-{max}, *, ranges A-B, lists A,B, steps /N)"
            ))
        };
        for item in field.split(',') {
            let (range, step) = match item.split_once('/') {
                Some((r, s)) => (r, Some(s)),
                None => (item, None),
            };
            if let Some(step) = step
                && !step.parse::<u32>().is_ok_and(|s| s >= 1 && s <= max.max(1))
            {
                return Err(bad());
            }
            if range == "*" {
                continue;
            }
            match range.split_once('-') {
                Some((a, b)) => match (value(a), value(b)) {
                    (Some(a), Some(b)) if a <= b => {}
                    _ => return Err(bad()),
                },
                None if value(range).is_some() => {}
                None => return Err(bad()),
            }
        }
    }
    Ok(())
}

/// The DataImportCron a scheduled request makes (its managed DataSource is `request.name`).
pub(crate) fn manifest(request: &CreateRequest, schedule: &str) -> Result<Value> {
    let Source::Registry(image) = &request.source else {
        return Err(Error::Usage(
            "--schedule imports from a registry (--registry IMAGE): CDI's DataImportCron takes no other source".into(),
        ));
    };
    let url = if image.contains("://") {
        image.clone()
    } else {
        format!("docker://{image}")
    };
    let mut storage = json!({"resources": {"requests": {"storage": request.size.as_deref().unwrap_or(DEFAULT_SIZE)}}});
    if let Some(class) = &request.storage_class {
        storage["storageClassName"] = json!(class);
    }
    Ok(json!({
        "apiVersion": DATA_IMPORT_CRON.api_version(), "kind": DATA_IMPORT_CRON.kind,
        "metadata": {"name": request.name, "namespace": request.namespace, "labels": labels()},
        "spec": {
            "schedule": schedule,
            "managedDataSource": request.name,
            "importsToKeep": request.imports_to_keep.unwrap_or(DEFAULT_IMPORTS_TO_KEEP),
            "garbageCollect": "Outdated",
            "template": {"spec": {"source": {"registry": {"url": url}}, "storage": storage}},
        },
    }))
}

/// Wait until the DataSource the cron manages is ready, reporting the cron's `Progressing`
/// condition as it changes.
pub(crate) async fn wait_ready(
    cluster: &Cluster,
    ns: &str,
    name: &str,
    on_event: &OnEvent<'_>,
    summarize: impl Fn(&Value) -> Image,
) -> Result<Image> {
    let mut last = String::new();
    watch::until(
        cluster,
        &[
            Watched::new(DATA_IMPORT_CRON, ns, name),
            Watched::new(super::kubevirt::DATA_SOURCE, ns, name),
        ],
        |objs| {
            let Some(cron) = &objs[0] else {
                return Some(Err(Error::Platform(format!(
                    "DataImportCron {name:?} was deleted while importing"
                ))));
            };
            if let Some(c) = condition(cron, "Progressing") {
                let now = text(c, "/reason").to_owned();
                if now != last && !now.is_empty() {
                    on_event(Event::Progress {
                        phase: now.clone(),
                        progress: String::new(),
                    });
                    last = now;
                }
            }
            match &objs[1] {
                Some(ds) if condition(ds, "Ready").is_some_and(|c| c["status"] == "True") => {
                    Some(Ok(summarize(ds)))
                }
                _ => None,
            }
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn five_field_schedules_pass_and_others_are_usage_errors() {
        for good in [
            "0 3 * * *",
            "*/15 * * * *",
            "0 0 1,15 * MON-FRI",
            "30 2 * JAN-MAR 0",
            "0 */12 * * 7",
        ] {
            assert!(check_schedule(good).is_ok(), "{good}");
        }
        for bad in [
            "0 3 * *",
            "0 3 * * * *",
            "60 * * * *",
            "* 24 * * *",
            "* * 0 * *",
            "* * * 13 *",
            "* * * * 8",
            "*/0 * * * *",
            "5-1 * * * *",
            "@daily",
            "a b c d e",
        ] {
            assert!(matches!(check_schedule(bad), Err(Error::Usage(_))), "{bad}");
        }
    }

    #[test]
    fn a_scheduled_image_is_a_data_import_cron_of_a_registry_source() {
        let mut request = CreateRequest {
            name: "fedora".into(),
            namespace: "os-images".into(),
            cluster: false,
            source: Source::Registry("quay.io/containerdisks/fedora:41".into()),
            storage: None,
            size: Some("8Gi".into()),
            storage_class: None,
            schedule: Some("0 3 * * *".into()),
            imports_to_keep: None,
        };
        let cron = manifest(&request, "0 3 * * *").unwrap();
        assert_eq!(
            cron["spec"],
            json!({"schedule": "0 3 * * *", "managedDataSource": "fedora",
                "importsToKeep": 3, "garbageCollect": "Outdated",
                "template": {"spec": {
                    "source": {"registry": {"url": "docker://quay.io/containerdisks/fedora:41"}},
                    "storage": {"resources": {"requests": {"storage": "8Gi"}}}}}})
        );
        request.source = Source::Url {
            url: "https://h/x.qcow2".into(),
            checksum: None,
        };
        assert!(matches!(
            manifest(&request, "0 3 * * *"),
            Err(Error::Usage(_))
        ));
    }
}
