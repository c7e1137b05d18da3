//! The signer's routes: discovery, health, and the two certificate subresources of a VM.

use bytes::Bytes;
use http::request::Parts;
use http::{Method, StatusCode};
use http_body_util::Full;
use k8s_openapi::api::authorization::v1::ResourceAttributes;
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::Api;
use kube::api::PostParams;
use russh::keys::PublicKey;
use russh::keys::ssh_key::certificate::CertType;
use serde_json::{Value, json};

use super::Signer;
use super::requestheader::Authenticated;
use crate::api::Kind;
use crate::ca::CaBundle;
use crate::signer::policy::{self, Caller, Refusal, VmFacts};
use crate::signer::sign::{Signed, check_key, sign};
use crate::signer::{CertificateRequest, GROUP, HOST_CERTIFICATE, KIND, USER_CERTIFICATE, VERSION};

/// The resource whose verb `use`, per login name, allows certificates for a login other than
/// the platform user (`kubectl auth can-i use logins.ssh.kubevm.io/root -n NS`).
pub const LOGINS_RESOURCE: &str = "logins";

/// Component name in Events and audit records.
pub const COMPONENT: &str = "kubevm-ssh-signer";

/// A `meta/v1` Status response.
pub fn status_response(code: u16, reason: &str, message: &str) -> http::Response<Full<Bytes>> {
    json_response(
        code,
        &json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": message, "reason": reason, "code": code,
        }),
    )
}

fn json_response(code: u16, body: &Value) -> http::Response<Full<Bytes>> {
    http::Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("a valid response")
}

/// A refusal as the API answer and the audit reason.
struct Failure {
    code: u16,
    reason: &'static str,
    message: String,
}

impl Failure {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Failure {
            code,
            reason,
            message: message.into(),
        }
    }

    fn internal(message: impl Into<String>) -> Self {
        Failure::new(500, "InternalError", message)
    }
}

impl From<Refusal> for Failure {
    fn from(r: Refusal) -> Self {
        match r {
            Refusal::Invalid(m) => Failure::new(422, "Invalid", m),
            Refusal::Forbidden(m) => Failure::new(403, "Forbidden", m),
            Refusal::Conflict(m) => Failure::new(409, "Conflict", m),
        }
    }
}

/// A request body as sent: the [`CertificateRequest`] and its public key, or 400 (not a
/// request) or 422 (no OpenSSH public key, or one too weak).
fn decode_request(
    body: &[u8],
    min_rsa_bits: u32,
) -> Result<(CertificateRequest, PublicKey), Failure> {
    let request: CertificateRequest = serde_json::from_slice(body)
        .map_err(|e| Failure::new(400, "BadRequest", format!("invalid {KIND}: {e}")))?;
    let public_key = PublicKey::from_openssh(request.spec.public_key.trim()).map_err(|e| {
        Failure::new(
            422,
            "Invalid",
            format!("spec.publicKey is not an OpenSSH public key: {e}"),
        )
    })?;
    check_key(&public_key, min_rsa_bits)
        .map_err(|why| Failure::new(422, "Invalid", format!("spec.publicKey: {why}")))?;
    Ok((request, public_key))
}

/// `/apis/ssh.kubevm.io/v1alpha1/namespaces/NS/virtualmachines/NAME/SUB`.
fn parse_path(path: &str) -> Option<(&str, &str, &str)> {
    let rest = path.strip_prefix(&format!("/apis/{GROUP}/{VERSION}/namespaces/"))?;
    let mut parts = rest.split('/');
    let (ns, plural, name, sub) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    (parts.next().is_none() && plural == "virtualmachines" && !ns.is_empty() && !name.is_empty())
        .then_some((ns, name, sub))
}

/// The APIResourceList of `ssh.kubevm.io/v1alpha1`. Besides the two subresources it lists
/// their parent `virtualmachines` and `logins`, with no verbs (nothing is served on them):
/// kubectl resolves `--resource virtualmachines.ssh.kubevm.io/sshcertificate` (`create role`)
/// and `logins.ssh.kubevm.io` (`auth can-i`) through discovery, whose RESTMapper
/// (client-go restmapper.NewDiscoveryRESTMapper) skips names with a slash, so without a parent
/// entry kubectl says the server has no resource type "virtualmachines" (issue 32 item 10).
fn resource_list() -> Value {
    let sub = |sub: &str| {
        json!({"name": format!("virtualmachines/{sub}"), "singularName": "", "namespaced": true,
               "group": GROUP, "version": VERSION, "kind": KIND, "verbs": ["create"]})
    };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": format!("{GROUP}/{VERSION}"),
           "resources": [
               {"name": "virtualmachines", "singularName": "virtualmachine", "namespaced": true,
                "kind": "VirtualMachine", "verbs": []},
               sub(USER_CERTIFICATE), sub(HOST_CERTIFICATE),
               {"name": LOGINS_RESOURCE, "singularName": "login", "namespaced": true,
                "kind": "Login", "verbs": []}]})
}

fn group() -> Value {
    let version = json!({"groupVersion": format!("{GROUP}/{VERSION}"), "version": VERSION});
    json!({"kind": "APIGroup", "apiVersion": "v1", "name": GROUP,
           "versions": [version.clone()], "preferredVersion": version})
}

impl Signer {
    /// Answer one request from `who`, authenticated by the front proxy.
    pub async fn handle(
        &self,
        who: &Authenticated,
        parts: &Parts,
        body: &[u8],
    ) -> http::Response<Full<Bytes>> {
        let caller = &who.caller;
        let path = parts.uri.path();
        let trimmed = path.trim_end_matches('/');
        if parts.method == Method::GET {
            match trimmed {
                "/apis" => {
                    return json_response(
                        200,
                        &json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [group()]}),
                    );
                }
                p if p == format!("/apis/{GROUP}") => return json_response(200, &group()),
                p if p == format!("/apis/{GROUP}/{VERSION}") => {
                    return json_response(200, &resource_list());
                }
                _ => {}
            }
        }
        let Some((namespace, name, sub)) = parse_path(trimmed) else {
            return status_response(
                404,
                "NotFound",
                "the server could not find the requested resource",
            );
        };
        if sub != USER_CERTIFICATE && sub != HOST_CERTIFICATE {
            return status_response(
                404,
                "NotFound",
                "the server could not find the requested resource",
            );
        }
        if parts.method != Method::POST {
            return status_response(
                405,
                "MethodNotAllowed",
                &format!(
                    "the server does not allow this method on the requested resource ({})",
                    parts.method
                ),
            );
        }
        // Names end up in principals and key IDs: only names Kubernetes could have.
        if let Err(why) = crate::target::validate_name(name)
            .and_then(|_| crate::target::validate_namespace(namespace).map_err(|e| e.to_string()))
        {
            return status_response(
                422,
                "Invalid",
                &format!("invalid virtual machine {name:?} in {namespace:?}: {why}"),
            );
        }
        let outcome = self.issue(who, namespace, name, sub, body).await;
        let mut record = json!({
            "time": crate::signer::rfc3339(jiff::Timestamp::now().as_second().max(0) as u64),
            "user": caller.user, "groups": caller.groups,
            "namespace": namespace, "vm": name,
            "kind": if sub == USER_CERTIFICATE { "user" } else { "host" },
        });
        match outcome {
            Ok((request, signed)) => {
                let status = request.status.clone().unwrap_or_default();
                record["event"] = json!("issued");
                record["login"] = json!(request.spec.login);
                record["principals"] = json!(status.principals);
                record["keyId"] = json!(status.key_id);
                record["serial"] = json!(status.serial);
                record["fingerprint"] = json!(signed.fingerprint);
                record["validAfter"] = json!(status.valid_after);
                record["validBefore"] = json!(status.valid_before);
                (self.audit)(record);
                json_response(201, &serde_json::to_value(&request).unwrap_or_default())
            }
            Err(failure) => {
                record["event"] = json!("refused");
                record["code"] = json!(failure.code);
                record["reason"] = json!(failure.message);
                (self.audit)(record);
                status_response(failure.code, failure.reason, &failure.message)
            }
        }
    }

    async fn issue(
        &self,
        who: &Authenticated,
        namespace: &str,
        name: &str,
        sub: &str,
        body: &[u8],
    ) -> Result<(CertificateRequest, Signed), Failure> {
        let caller = &who.caller;
        // The signer's own authorization of what the API server authorized before proxying
        // (issue 32 item 8): a proxy that lets too much through widens nothing.
        let subresource = ResourceAttributes {
            verb: Some("create".into()),
            group: Some(GROUP.into()),
            resource: Some("virtualmachines".into()),
            subresource: Some(sub.into()),
            namespace: Some(namespace.into()),
            name: Some(name.into()),
            ..Default::default()
        };
        if !self.allowed(who, subresource).await? {
            return Err(Failure::new(
                403,
                "Forbidden",
                format!(
                    "User {:?} cannot create resource \"virtualmachines/{sub}\" in API group \"{GROUP}\" in the namespace \"{namespace}\" (the signer's own access review)",
                    caller.user
                ),
            ));
        }
        let (mut request, public_key) = decode_request(body, self.min_rsa_bits)?;
        let vm_kind = Kind::vm(self.flavor);
        let vm = vm_kind
            .api(&self.cluster.client, Some(namespace))
            .get_opt(name)
            .await
            .map_err(|e| Failure::internal(format!("reading {}: {e}", vm_kind.object_ref(name))))?
            .map(|o| serde_json::to_value(o).unwrap_or_default());
        let (decision, cert_type) = if sub == USER_CERTIFICATE {
            let Some(vm) = &vm else {
                return Err(Failure::new(
                    404,
                    "NotFound",
                    format!("{} \"{name}\" not found", vm_kind.resource_name()),
                ));
            };
            let facts = VmFacts::from_object(vm);
            let decision = policy::user_certificate(&self.limits, caller, &facts, &request.spec)?;
            if let Some(login) = &decision.login {
                self.review_login(who, namespace, login).await?;
            }
            (decision, CertType::User)
        } else {
            if vm
                .as_ref()
                .is_some_and(|vm| !vm["metadata"]["deletionTimestamp"].is_null())
            {
                return Err(Refusal::Conflict(format!(
                    "virtual machine {name}.{namespace} is being deleted"
                ))
                .into());
            }
            // A host certificate asserts "this is NAME.NAMESPACE": only for those who may
            // create that VM (or change it, when it exists).
            let verb = if vm.is_some() { "update" } else { "create" };
            self.review(who, verb, &vm_kind, namespace, name).await?;
            (
                policy::host_certificate(&self.limits, name, namespace),
                CertType::Host,
            )
        };
        let ca = self.read_ca().await?;
        let key = match cert_type {
            CertType::User => ca.user_signing_key(),
            CertType::Host => ca.signing_key(),
        };
        let signed = sign(key, &public_key, cert_type, &decision)
            .map_err(|e| Failure::internal(format!("signing: {e}")))?;
        request.spec.login = decision.login.clone();
        request.status = Some(
            signed
                .status()
                .map_err(|e| Failure::internal(e.to_string()))?,
        );
        if let Some(vm) = &vm {
            self.record_event(vm, caller, &decision, &signed, sub).await;
        }
        Ok((request, signed))
    }

    async fn read_ca(&self) -> Result<CaBundle, Failure> {
        let api: Api<k8s_openapi::api::core::v1::Secret> =
            Api::namespaced(self.cluster.client.clone(), &self.ca_namespace);
        let secret = api
            .get_opt(crate::ca::SECRET_NAME)
            .await
            .map_err(|e| Failure::internal(format!("reading the CA Secret: {e}")))?
            .ok_or_else(|| {
                Failure::internal(format!(
                    "the CA Secret {}/{} does not exist: run `kubectl vm ca init`",
                    self.ca_namespace,
                    crate::ca::SECRET_NAME
                ))
            })?;
        CaBundle::from_secret(&secret).map_err(|e| Failure::internal(e.to_string()))
    }

    async fn allowed(
        &self,
        who: &Authenticated,
        attributes: ResourceAttributes,
    ) -> Result<bool, Failure> {
        self.access_review(who, attributes)
            .await
            .map_err(Failure::internal)
    }

    /// A login other than the platform user needs verb `use` on `logins/LOGIN` in the VM's
    /// namespace, an RBAC decision (the VM's logins annotation, which any VM editor writes,
    /// only says which users the guest has).
    async fn review_login(
        &self,
        who: &Authenticated,
        namespace: &str,
        login: &str,
    ) -> Result<(), Failure> {
        if login == self.limits.platform_user {
            return Ok(());
        }
        let attributes = ResourceAttributes {
            verb: Some("use".into()),
            group: Some(GROUP.into()),
            resource: Some(LOGINS_RESOURCE.into()),
            namespace: Some(namespace.into()),
            name: Some(login.into()),
            ..Default::default()
        };
        if self.allowed(who, attributes).await? {
            return Ok(());
        }
        Err(Failure::new(
            403,
            "Forbidden",
            format!(
                "login {login:?} needs permission to use resource \"{LOGINS_RESOURCE}\" named {login:?} in API group \"{GROUP}\" in the namespace \"{namespace}\", which user {:?} lacks",
                who.caller.user
            ),
        ))
    }

    /// Ask the API server whether `who` may `verb` the VM (SubjectAccessReview).
    async fn review(
        &self,
        who: &Authenticated,
        verb: &str,
        kind: &Kind,
        namespace: &str,
        name: &str,
    ) -> Result<(), Failure> {
        let attributes = ResourceAttributes {
            verb: Some(verb.into()),
            group: Some(kind.group.into()),
            resource: Some(kind.plural.into()),
            namespace: Some(namespace.into()),
            name: (verb != "create").then(|| name.to_owned()),
            ..Default::default()
        };
        if self.allowed(who, attributes).await? {
            Ok(())
        } else {
            Err(Failure::new(
                403,
                "Forbidden",
                format!(
                    "a host certificate for {name}.{namespace} needs permission to {verb} {} in namespace {namespace:?}, which user {:?} lacks",
                    kind.resource_name(),
                    who.caller.user
                ),
            ))
        }
    }

    /// An Event on the VM naming who got which certificate. Failing to write it is audited
    /// but does not take the certificate back: the audit line is the record of last resort.
    async fn record_event(
        &self,
        vm: &Value,
        caller: &Caller,
        decision: &policy::Decision,
        signed: &Signed,
        sub: &str,
    ) {
        let meta = &vm["metadata"];
        let namespace = meta["namespace"].as_str().unwrap_or_default();
        let name = meta["name"].as_str().unwrap_or_default();
        let now = jiff::Timestamp::now();
        let message = match &decision.login {
            Some(login) => format!(
                "issued an SSH certificate to {:?} for login {login:?}: key {}, serial {}, valid until {}",
                caller.user,
                signed.fingerprint,
                signed.serial,
                crate::signer::rfc3339(signed.certificate.valid_before())
            ),
            None => format!(
                "issued a host certificate requested by {:?}: key {}, serial {}",
                caller.user, signed.fingerprint, signed.serial
            ),
        };
        let event = Event {
            metadata: ObjectMeta {
                generate_name: Some(format!("{name}.")),
                namespace: Some(namespace.to_owned()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                api_version: vm["apiVersion"].as_str().map(str::to_owned),
                kind: Some("VirtualMachine".into()),
                name: Some(name.to_owned()),
                namespace: Some(namespace.to_owned()),
                uid: meta["uid"].as_str().map(str::to_owned),
                resource_version: meta["resourceVersion"].as_str().map(str::to_owned),
                ..Default::default()
            },
            reason: Some(if sub == USER_CERTIFICATE {
                "SSHCertificateIssued".into()
            } else {
                "HostCertificateIssued".into()
            }),
            message: Some(message),
            type_: Some("Normal".into()),
            count: Some(1),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            event_time: Some(MicroTime(now)),
            action: Some("Issue".into()),
            reporting_component: Some(COMPONENT.into()),
            reporting_instance: Some(
                std::env::var("HOSTNAME").unwrap_or_else(|_| COMPONENT.into()),
            ),
            source: Some(EventSource {
                component: Some(COMPONENT.into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let api: Api<Event> = Api::namespaced(self.cluster.client.clone(), namespace);
        if let Err(e) = api.create(&PostParams::default(), &event).await {
            (self.audit)(
                json!({"event": "event-error", "namespace": namespace, "vm": name, "error": e.to_string()}),
            );
        }
    }
}

#[cfg(test)]
#[path = "issue_properties.rs"]
mod properties;
