//! Deletes with `DeleteOptions.preconditions.uid`: the API server refuses to delete an object
//! whose uid differs (it was replaced) with 409 Conflict, worded as
//! k8s.io/apiserver/pkg/storage/interfaces.go `Preconditions.Check` wrapped by
//! `errors.NewConflict` ("Operation cannot be fulfilled on …: Precondition failed: UID in
//! precondition: X, UID in object meta: Y"), and deletes it when the uid matches.

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use kubevm_emulator::{Emulator, EmulatorOptions};

use crate::common;
use common::client;

fn with_uid(uid: &str) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_owned()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    }
}

#[tokio::test]
async fn delete_with_a_stale_uid_is_a_conflict_and_deletes_nothing() {
    let emu = Emulator::start(EmulatorOptions::default()).await.unwrap();
    let secrets: Api<Secret> = Api::namespaced(client(&emu).await, "default");
    let mut secret = Secret::default();
    secret.metadata.name = Some("s".into());
    let created = secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let uid = created.metadata.uid.clone().unwrap();

    let err = secrets
        .delete("s", &with_uid("not-the-uid"))
        .await
        .unwrap_err();
    let kube::Error::Api(status) = err else {
        panic!("expected a Status, got {err:?}");
    };
    assert_eq!((status.code, status.reason.as_str()), (409, "Conflict"));
    assert_eq!(
        status.message,
        format!(
            "Operation cannot be fulfilled on secrets \"s\": Precondition failed: UID in precondition: not-the-uid, UID in object meta: {uid}"
        )
    );
    assert!(secrets.get_opt("s").await.unwrap().is_some(), "kept");

    secrets.delete("s", &with_uid(&uid)).await.unwrap();
    assert!(secrets.get_opt("s").await.unwrap().is_none(), "deleted");
    emu.shutdown().await;
}
