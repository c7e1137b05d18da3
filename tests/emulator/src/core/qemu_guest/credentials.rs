//! KubeVirt's access-credential propagation through the guest agent: the public keys of every
//! `accessCredentials[].sshPublicKey` with `propagationMethod.qemuGuestAgent` are gathered per
//! user (every line of every Secret key is a key, passed verbatim) and each user's whole
//! `authorized_keys` is replaced with `guest-ssh-add-authorized-keys` (`reset: true`); the
//! VMI's `AccessCredentialsSynchronized` condition tells how it went. Secrets are read again on
//! every round, so a changed Secret reaches the running guest.
//! (pkg/virt-launcher/virtwrap/access-credentials/access_credentials.go,
//! pkg/virt-handler/vm.go `updateAccessCredentialConditions`.)

use std::collections::BTreeMap;

use base64::Engine;
use serde_json::{Value, json};

/// Keys per guest user, from a VMI spec; `secret` looks a Secret up by name. A missing Secret
/// is an error naming it (KubeVirt reports the failure in the condition).
pub(crate) fn desired(
    spec: &Value,
    secret: impl Fn(&str) -> Option<Value>,
) -> Result<BTreeMap<String, Vec<String>>, String> {
    let mut users: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let credentials = spec["accessCredentials"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for credential in credentials {
        let ssh = &credential["sshPublicKey"];
        let Some(list) = ssh
            .pointer("/propagationMethod/qemuGuestAgent/users")
            .and_then(Value::as_array)
        else {
            continue;
        };
        let name = ssh
            .pointer("/source/secret/secretName")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let object = secret(name).ok_or_else(|| format!("secret {name} not found"))?;
        let keys = secret_keys(&object);
        for user in list.iter().filter_map(Value::as_str) {
            let entry = users.entry(user.to_owned()).or_default();
            for key in &keys {
                if !entry.contains(key) {
                    entry.push(key.clone());
                }
            }
        }
    }
    Ok(users)
}

/// Passwords per guest user from the VMI's `accessCredentials[].userPassword` entries with
/// `propagationMethod.qemuGuestAgent`: each Secret key is a user, its value (trimmed, empty
/// ones skipped) the password (`readAndAddPasswordsFromDirectory` upstream).
pub(crate) fn passwords(
    spec: &Value,
    secret: impl Fn(&str) -> Option<Value>,
) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for credential in spec["accessCredentials"].as_array().into_iter().flatten() {
        let password = &credential["userPassword"];
        if password
            .pointer("/propagationMethod/qemuGuestAgent")
            .is_none()
        {
            continue;
        }
        let name = password
            .pointer("/source/secret/secretName")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let object = secret(name).ok_or_else(|| format!("secret {name} not found"))?;
        for (user, value) in object["data"].as_object().into_iter().flatten() {
            let Some(bytes) = value
                .as_str()
                .and_then(|v| base64::engine::general_purpose::STANDARD.decode(v).ok())
            else {
                continue;
            };
            let text = String::from_utf8_lossy(&bytes).trim().to_owned();
            if !text.is_empty() {
                out.insert(user.clone(), text);
            }
        }
    }
    Ok(out)
}

/// The agent command that sets `user`'s password in clear text (qemu
/// `guest-set-user-password`, the password base64-encoded, `crypted: false`, as libvirt's
/// `virDomainSetUserPassword` without flags sends it).
pub(crate) fn password_command(user: &str, password: &str) -> Value {
    json!({
        "execute": "guest-set-user-password",
        "arguments": {
            "username": user,
            "password": base64::engine::general_purpose::STANDARD.encode(password),
            "crypted": false,
        },
    })
}

/// Every non-empty line of every `data` value (in key order), verbatim.
fn secret_keys(secret: &Value) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(data) = secret["data"].as_object() {
        for value in data.values().filter_map(Value::as_str) {
            let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(value) else {
                continue;
            };
            for line in String::from_utf8_lossy(&bytes).lines() {
                if !line.trim().is_empty() {
                    out.push(line.to_owned());
                }
            }
        }
    }
    out
}

/// The agent command that replaces `user`'s authorized keys (qemu `qga/qapi-schema.json`
/// `guest-ssh-add-authorized-keys`, since qemu 5.2).
pub(crate) fn command(user: &str, keys: &[String]) -> Value {
    json!({
        "execute": "guest-ssh-add-authorized-keys",
        "arguments": { "username": user, "keys": keys, "reset": true },
    })
}

/// Keys and passwords per user as last written, or the error of the last try.
pub type Synced = Option<Result<(BTreeMap<String, Vec<String>>, BTreeMap<String, String>), String>>;

/// One write into the guest.
pub enum GuestWrite<'a> {
    /// Replace `user`'s authorized_keys with these lines.
    Keys(&'a str, &'a [String]),
    /// Set `user`'s password.
    Password(&'a str, &'a str),
}

/// virt-launcher's credential reload (`reloadCredentialFiles`), whatever writes into the guest
/// (`write`): when the VMI's guest-agent credentials differ from what was last written, keys
/// then passwords are written and `AccessCredentialsSynchronized` says how it went.
pub fn sync(
    app: &crate::core::app::App,
    spec: &crate::core::guest::GuestSpec,
    synced: &mut Synced,
    mut write: impl FnMut(GuestWrite<'_>) -> Result<(), String>,
) {
    use crate::core::controllers::set_condition;
    use crate::core::store::Key;
    let vmi_key = Key::new(
        "kubevirt.io",
        "virtualmachineinstances",
        &spec.namespace,
        &spec.name,
    );
    let Some(vmi) = app.store.get(&vmi_key) else {
        return;
    };
    if crate::core::util::meta_str(&vmi, "uid") != spec.boot_id
        || vmi["spec"]["accessCredentials"].is_null()
    {
        return;
    }
    let lookup = |name: &str| {
        app.store
            .get(&Key::new("", "secrets", &spec.namespace, name))
    };
    let wanted =
        desired(&vmi["spec"], lookup).and_then(|keys| Ok((keys, passwords(&vmi["spec"], lookup)?)));
    if synced.as_ref() == Some(&wanted) {
        return;
    }
    let outcome = match &wanted {
        Ok((users, passwords)) => users
            .iter()
            .try_for_each(|(user, keys)| {
                write(GuestWrite::Keys(user, keys)).map_err(|e| {
                    format!("Error encountered writing ssh pub key access credentials for user [{user}]: {e}")
                })
            })
            .and_then(|()| {
                passwords.iter().try_for_each(|(user, password)| {
                    write(GuestWrite::Password(user, password)).map_err(|e| {
                        format!("Error encountered setting password for user [{user}]: {e}")
                    })
                })
            }),
        Err(e) => Err(e.clone()),
    };
    app.store.modify(&vmi_key, |o| {
        let mut st = o["status"].clone();
        match &outcome {
            Ok(()) => set_condition(&mut st, "AccessCredentialsSynchronized", true, "", ""),
            Err(e) => set_condition(&mut st, "AccessCredentialsSynchronized", false, "", e),
        }
        o["status"] = st;
    });
    *synced = outcome.is_ok().then_some(wanted);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(data: &[(&str, &str)]) -> Value {
        let data: serde_json::Map<String, Value> = data
            .iter()
            .map(|(k, v)| {
                (
                    (*k).to_owned(),
                    json!(base64::engine::general_purpose::STANDARD.encode(v)),
                )
            })
            .collect();
        json!({ "data": data })
    }

    #[test]
    fn keys_are_gathered_per_user() {
        let spec = json!({ "accessCredentials": [
            { "sshPublicKey": { "source": { "secret": { "secretName": "a" } },
              "propagationMethod": { "qemuGuestAgent": { "users": ["root", "ops"] } } } },
            { "sshPublicKey": { "source": { "secret": { "secretName": "b" } },
              "propagationMethod": { "qemuGuestAgent": { "users": ["ops"] } } } },
            { "sshPublicKey": { "source": { "secret": { "secretName": "c" } },
              "propagationMethod": { "noCloud": {} } } },
        ]});
        let lookup = |name: &str| match name {
            "a" => Some(secret(&[(
                "k1",
                "ssh-ed25519 AAAA a1\n\nssh-rsa BBBB a2\n",
            )])),
            "b" => Some(secret(&[("k", "ssh-ed25519 CCCC b1")])),
            _ => None,
        };
        let users = desired(&spec, lookup).unwrap();
        assert_eq!(users["root"], ["ssh-ed25519 AAAA a1", "ssh-rsa BBBB a2"]);
        assert_eq!(
            users["ops"],
            [
                "ssh-ed25519 AAAA a1",
                "ssh-rsa BBBB a2",
                "ssh-ed25519 CCCC b1"
            ]
        );
        assert_eq!(users.len(), 2);
        let missing = json!({ "accessCredentials": [
            { "sshPublicKey": { "source": { "secret": { "secretName": "zz" } },
              "propagationMethod": { "qemuGuestAgent": { "users": ["root"] } } } }]});
        assert_eq!(
            desired(&missing, lookup).unwrap_err(),
            "secret zz not found"
        );
        assert!(desired(&json!({}), lookup).unwrap().is_empty());
    }

    #[test]
    fn passwords_come_from_user_password_entries() {
        let spec = json!({ "accessCredentials": [
            { "userPassword": { "source": { "secret": { "secretName": "p" } },
              "propagationMethod": { "qemuGuestAgent": {} } } },
            { "sshPublicKey": { "source": { "secret": { "secretName": "a" } },
              "propagationMethod": { "qemuGuestAgent": { "users": ["root"] } } } },
        ]});
        let lookup = |name: &str| match name {
            "p" => Some(secret(&[("debian", "s3cret\n"), ("root", "  ")])),
            "a" => Some(secret(&[("k", "ssh-ed25519 AAAA")])),
            _ => None,
        };
        let p = passwords(&spec, lookup).unwrap();
        assert_eq!(p.len(), 1);
        assert_eq!(p["debian"], "s3cret");
        let cmd = password_command("debian", "s3cret");
        assert_eq!(cmd["arguments"]["password"], "czNjcmV0");
        assert_eq!(cmd["arguments"]["crypted"], false);
    }
}
