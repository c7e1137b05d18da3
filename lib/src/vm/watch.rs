//! `list -w`: watch VMs (and KubeVirt instances) and report every VM whose summary changed.
//! When the server says the resource version is gone (410 Expired, after an etcd compaction),
//! the VMs are listed again, the differences reported, and watching goes on from the new list,
//! as kubectl's reflector does.

use std::collections::BTreeMap;

use futures::{StreamExt, TryStreamExt};
use kube::api::{DynamicObject, ListParams, WatchEvent, WatchParams};
use serde_json::Value;

use super::{Detail, Scope, VmList, VmSummary, key, list_pages, to_value};
use crate::api::{KUBEVIRT_VMI, Kind};
use crate::cluster::Cluster;
use crate::error::Error;
use crate::flavor::{Flavor, Platform};

/// A change seen by [`watch`].
#[derive(Debug, Clone, PartialEq)]
pub enum VmChange {
    /// The VM was added or changed (or its instance was).
    Updated(VmSummary),
    /// The VM was deleted.
    Deleted(VmSummary),
}

enum Feed {
    Vm(WatchEvent<DynamicObject>),
    Instance(WatchEvent<DynamicObject>),
}

/// Why one round of watching ended.
enum End<E> {
    /// The resource version is gone: list again.
    Expired,
    /// A real failure (or the caller's).
    Failed(E),
}

fn is_expired(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 410)
}

/// Watch VMs (and KubeVirt instances) from where `initial` left off and call `on_change`
/// for every VM whose summary changed. A 410 Gone re-lists (with `detail`) and goes on. Runs
/// until the server or `on_change` fails; the caller's error type carries both.
pub async fn watch<E: From<Error>>(
    cluster: &Cluster,
    platform: &Platform,
    scope: &Scope,
    selector: Option<&str>,
    initial: VmList,
    detail: Detail,
    mut on_change: impl FnMut(VmChange) -> std::result::Result<(), E>,
) -> std::result::Result<(), E> {
    let mut version = initial.resource_version.unwrap_or_default();
    let mut vms: BTreeMap<(String, String), Value> = initial
        .items
        .iter()
        .map(|s| (key(&s.object), s.object.clone()))
        .collect();
    let mut last: BTreeMap<(String, String), VmSummary> = initial
        .items
        .into_iter()
        .map(|s| ((s.namespace.clone(), s.name.clone()), s))
        .collect();
    loop {
        let round = watch_round(
            cluster,
            platform,
            scope,
            selector,
            &version,
            &mut vms,
            &mut last,
            &mut on_change,
        )
        .await;
        match round {
            End::Failed(e) => return Err(e),
            End::Expired => {
                let mut fresh: BTreeMap<(String, String), VmSummary> = BTreeMap::new();
                let versions = list_pages(cluster, platform, scope, selector, detail, |page| {
                    for s in page {
                        fresh.insert((s.namespace.clone(), s.name.clone()), s);
                    }
                    Ok::<(), Error>(())
                })
                .await?;
                version = versions.vms.unwrap_or_default();
                for (id, old) in &last {
                    if !fresh.contains_key(id) {
                        on_change(VmChange::Deleted(old.clone()))?;
                    }
                }
                for (id, now) in &fresh {
                    if !last.get(id).is_some_and(|old| same(old, now, detail)) {
                        on_change(VmChange::Updated(now.clone()))?;
                    }
                }
                vms = fresh
                    .iter()
                    .map(|(id, s)| (id.clone(), s.object.clone()))
                    .collect();
                last = fresh;
            }
        }
    }
}

/// Whether a re-listed VM shows what was last reported (rows compare without the object,
/// which a re-list with [`Detail::Row`] holds only in part).
fn same(old: &VmSummary, new: &VmSummary, detail: Detail) -> bool {
    match detail {
        Detail::Object => old == new,
        Detail::Row => {
            let strip = |s: &VmSummary| VmSummary {
                object: Value::Null,
                ..s.clone()
            };
            strip(old) == strip(new)
        }
    }
}

/// Watches from `version` until the server says it is gone or something fails.
#[allow(clippy::too_many_arguments)]
async fn watch_round<E: From<Error>>(
    cluster: &Cluster,
    platform: &Platform,
    scope: &Scope,
    selector: Option<&str>,
    version: &str,
    vms: &mut BTreeMap<(String, String), Value>,
    last: &mut BTreeMap<(String, String), VmSummary>,
    on_change: &mut impl FnMut(VmChange) -> std::result::Result<(), E>,
) -> End<E> {
    let ns = scope.namespace();
    let vm_kind = Kind::vm(platform.flavor);
    let mut instances: BTreeMap<(String, String), Value> = BTreeMap::new();
    let mut vm_params = WatchParams::default().timeout(290);
    if let Some(selector) = selector {
        vm_params = vm_params.labels(selector);
    }
    let vm_api = vm_kind.api(&cluster.client, ns);
    let vm_feed = restartable_watch(vm_api, vm_params, version.to_owned()).map_ok(Feed::Vm);
    let mut feeds: futures::stream::BoxStream<'_, kube::Result<Feed>> = Box::pin(vm_feed);
    if let Some(instance) = crate::platform::of(platform.flavor).instance {
        let vmi_api = instance.api(&cluster.client, ns);
        // Watching instances from "now" would miss ones created before; start by listing them.
        let current = match vmi_api.list(&ListParams::default()).await {
            Ok(list) => list,
            Err(e) => {
                return End::Failed(E::from(cluster.error(e, &KUBEVIRT_VMI.action("list", ns))));
            }
        };
        for vmi in current.items.into_iter().map(to_value) {
            instances.insert(key(&vmi), vmi);
        }
        let vmi_feed = restartable_watch(
            vmi_api,
            WatchParams::default().timeout(290),
            current.metadata.resource_version.unwrap_or_default(),
        )
        .map_ok(Feed::Instance);
        feeds = Box::pin(futures::stream::select(feeds, vmi_feed));
    }
    while let Some(feed) = feeds.next().await {
        let (event, is_vm) = match feed {
            Ok(Feed::Vm(event)) => (event, true),
            Ok(Feed::Instance(event)) => (event, false),
            Err(e) if is_expired(&e) => return End::Expired,
            Err(e) => {
                return End::Failed(E::from(cluster.error(e, &vm_kind.action("watch", ns))));
            }
        };
        let (object, deleted) = match event {
            WatchEvent::Added(o) | WatchEvent::Modified(o) => (to_value(o), false),
            WatchEvent::Deleted(o) => (to_value(o), true),
            WatchEvent::Bookmark(_) => continue,
            // k8s.io/apiserver answers a watch from a compacted resource version with an
            // ERROR event carrying a 410 Expired Status.
            WatchEvent::Error(status) if status.code == 410 => return End::Expired,
            WatchEvent::Error(status) => {
                return End::Failed(E::from(Error::from_status(
                    status.code,
                    &status.reason,
                    &status.message,
                    &vm_kind.action("watch", ns),
                    &cluster.server,
                )));
            }
        };
        let id = key(&object);
        let table = if is_vm { &mut *vms } else { &mut instances };
        if deleted {
            table.remove(&id);
        } else {
            table.insert(id.clone(), object.clone());
        }
        if is_vm && deleted {
            let summary = last
                .remove(&id)
                .unwrap_or_else(|| summarize(platform.flavor, &object, None));
            if let Err(e) = on_change(VmChange::Deleted(summary)) {
                return End::Failed(e);
            }
            continue;
        }
        let Some(vm) = vms.get(&id) else { continue };
        let summary = summarize(platform.flavor, vm, instances.get(&id));
        if last.get(&id) != Some(&summary) {
            last.insert(id, summary.clone());
            if let Err(e) = on_change(VmChange::Updated(summary)) {
                return End::Failed(e);
            }
        }
    }
    // The streams restart themselves; they end only with the connection.
    End::Failed(E::from(Error::from_status(
        500,
        "InternalError",
        "the watch ended",
        &vm_kind.action("watch", ns),
        &cluster.server,
    )))
}

fn summarize(flavor: Flavor, vm: &Value, vmi: Option<&Value>) -> VmSummary {
    match flavor {
        Flavor::KubeVirt => super::summarize_kubevirt(vm, vmi),
        Flavor::Deckhouse => super::summarize_deckhouse(vm),
    }
}

/// A watch that resumes where it stopped when the server ends it (watch timeouts), so the
/// caller sees one endless stream.
pub(crate) fn restartable_watch(
    api: kube::Api<DynamicObject>,
    params: WatchParams,
    resource_version: String,
) -> impl futures::Stream<Item = kube::Result<WatchEvent<DynamicObject>>> {
    futures::stream::unfold(
        (
            api,
            params,
            resource_version,
            None::<futures::stream::BoxStream<'static, kube::Result<WatchEvent<DynamicObject>>>>,
        ),
        |(api, params, mut version, mut current)| async move {
            loop {
                if current.is_none() {
                    match api.watch(&params, &version).await {
                        Ok(stream) => current = Some(stream.boxed()),
                        Err(e) => return Some((Err(e), (api, params, version, None))),
                    }
                }
                match current.as_mut().expect("stream set above").next().await {
                    Some(Ok(event)) => {
                        if let WatchEvent::Added(o)
                        | WatchEvent::Modified(o)
                        | WatchEvent::Deleted(o) = &event
                            && let Some(rv) = &o.metadata.resource_version
                        {
                            version.clone_from(rv);
                        }
                        if let WatchEvent::Bookmark(b) = &event {
                            version.clone_from(&b.metadata.resource_version);
                        }
                        return Some((Ok(event), (api, params, version, current)));
                    }
                    Some(Err(e)) => return Some((Err(e), (api, params, version, None))),
                    None => current = None,
                }
            }
        },
    )
}
