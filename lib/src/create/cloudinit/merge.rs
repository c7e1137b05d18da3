//! Combining the user's own user data with the platform cloud-config: a user `#cloud-config`
//! is merged as YAML; any other kind is kept as is inside a MIME multipart archive.

use yaml_serde::{Mapping, Value};

use super::CloudInitError;

/// What kind of user data the user gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum UserFormat {
    /// `#cloud-config` YAML.
    CloudConfig,
    /// A single part of this MIME type (script, include, boothook, …).
    Part(&'static str),
    /// Already MIME (`Content-Type: …` headers first): embedded as it is.
    Mime,
}

/// Headers cloud-init recognises on the first line, and the MIME type of each.
const STARTS: [(&str, &str); 7] = [
    ("#!", "text/x-shellscript"),
    ("#include", "text/x-include-url"),
    ("#cloud-boothook", "text/cloud-boothook"),
    ("#part-handler", "text/part-handler"),
    ("#cloud-config-archive", "text/cloud-config-archive"),
    ("#cloud-config-jsonp", "text/cloud-config-jsonp"),
    ("## template: jinja", "text/jinja2"),
];

/// Tell the user data's kind from its first line.
pub(super) fn classify(text: &str) -> Result<UserFormat, CloudInitError> {
    let first = text
        .trim_start()
        .lines()
        .next()
        .unwrap_or_default()
        .trim_end();
    if let Some((_, mime)) = STARTS.iter().find(|(p, _)| first.starts_with(p)) {
        return Ok(UserFormat::Part(mime));
    }
    if first == "#cloud-config" {
        return Ok(UserFormat::CloudConfig);
    }
    let lower = first.to_ascii_lowercase();
    if lower.starts_with("content-type:") || lower.starts_with("mime-version:") {
        return Ok(UserFormat::Mime);
    }
    Err(CloudInitError::UnknownFormat {
        first_line: first.chars().take(40).collect(),
    })
}

/// Parse a `#cloud-config` document into a mapping.
pub(super) fn parse_cloud_config(text: &str) -> Result<Mapping, CloudInitError> {
    let value: Value = yaml_serde::from_str(text).map_err(|e| {
        let (line, column) = e.location().map_or((0, 0), |l| (l.line(), l.column()));
        let message = e.to_string();
        // yaml_serde (like serde_yaml) appends "at line L column C"; the error has its own position.
        let message = message
            .split(" at line ")
            .next()
            .unwrap_or_default()
            .replace('\n', " ");
        CloudInitError::Yaml {
            line,
            column,
            message,
        }
    })?;
    match value {
        Value::Mapping(m) => Ok(m),
        Value::Null => Ok(Mapping::new()),
        _ => Err(CloudInitError::NotAMapping),
    }
}

/// Merge `overlay` (the user's) into `base` (the platform's): mappings merge key by key,
/// recursively; lists are appended (items already present are not repeated); for anything
/// else the overlay wins.
pub(super) fn merge(base: &mut Value, overlay: Value) {
    match (base, overlay) {
        (Value::Mapping(base), Value::Mapping(overlay)) => {
            for (key, value) in overlay {
                match base.get_mut(&key) {
                    Some(existing) => merge(existing, value),
                    None => {
                        base.insert(key, value);
                    }
                }
            }
        }
        (Value::Sequence(base), Value::Sequence(overlay)) => {
            for item in overlay {
                if !base.contains(&item) {
                    base.push(item);
                }
            }
        }
        (base, overlay) => *base = overlay,
    }
}

/// The user's cloud-config, checked against the platform's before they merge: a key both
/// set must hold a list where the platform's holds a list and a mapping where it holds a
/// mapping, or merging would replace the platform's value (its boot script that trusts the CA,
/// the VM's host key) instead of adding to it. A key the user left empty (`bootcmd:`) adds
/// nothing and is dropped.
pub(super) fn same_shapes(
    platform: &Mapping,
    mut user: Mapping,
) -> Result<Mapping, CloudInitError> {
    let mut empty = Vec::new();
    for (key, value) in &user {
        let Some(theirs) = platform.get(key) else {
            continue;
        };
        let name = || {
            key.as_str()
                .map_or_else(|| format!("{key:?}"), str::to_owned)
        };
        match (theirs, value) {
            (_, Value::Null) => empty.push(key.clone()),
            (Value::Sequence(_), Value::Sequence(_)) | (Value::Mapping(_), Value::Mapping(_)) => {}
            (Value::Sequence(_), _) => {
                return Err(CloudInitError::Shape {
                    key: name(),
                    expected: "a list",
                    example: "bootcmd: [\"echo hello\"]",
                });
            }
            (Value::Mapping(_), _) => {
                return Err(CloudInitError::Shape {
                    key: name(),
                    expected: "a mapping",
                    example: "ssh_keys: {ed25519_public: \"ssh-ed25519 AAAA...\"}",
                });
            }
            _ => {}
        }
    }
    for key in empty {
        user.remove(&key);
    }
    Ok(user)
}

/// Keys whose values are passwords.
const PASSWORD_KEYS: [&str; 5] = [
    "passwd",
    "password",
    "chpasswd",
    "plain_text_passwd",
    "hashed_passwd",
];

/// Whether a cloud-config holds a password key or a private key anywhere.
pub(super) fn has_secrets(value: &Value) -> bool {
    match value {
        Value::Mapping(m) => m
            .iter()
            .any(|(k, v)| k.as_str().is_some_and(|k| PASSWORD_KEYS.contains(&k)) || has_secrets(v)),
        Value::Sequence(items) => items.iter().any(has_secrets),
        Value::String(s) => s.contains("PRIVATE KEY"),
        Value::Tagged(t) => has_secrets(&t.value),
        _ => false,
    }
}

/// Whether opaque user data (a script, MIME, …) might hold a secret: conservative, by words.
pub(super) fn text_has_secrets(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    lower.contains("passwd") || lower.contains("password") || lower.contains("private key")
}

/// A MIME multipart archive with the user's part first and the platform cloud-config last.
///
/// The platform part's `Merge-Type` makes cloud-init merge it into whatever cloud-config the
/// user's parts hold the same way as [`merge`]: the user's keys win, lists are appended.
pub(super) fn multipart(user: &str, format: UserFormat, platform_cloud_config: &str) -> String {
    let mut boundary = "==KUBEVM_BOUNDARY==".to_string();
    while user.contains(&boundary) || platform_cloud_config.contains(&boundary) {
        boundary.insert(2, 'X');
    }
    let mut out =
        format!("Content-Type: multipart/mixed; boundary=\"{boundary}\"\nMIME-Version: 1.0\n\n");
    out.push_str(&format!("--{boundary}\n"));
    let mime = match format {
        // A MIME document is a valid part as it stands; cloud-init walks nested multiparts.
        UserFormat::Mime => None,
        UserFormat::Part(mime) => Some(mime),
        UserFormat::CloudConfig => Some("text/cloud-config"),
    };
    match mime {
        Some(mime) => {
            out.push_str(&part_headers(mime, "user-data", None));
            out.push_str(user);
        }
        None => out.push_str(user.trim_start()),
    }
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(&format!("--{boundary}\n"));
    out.push_str(&part_headers(
        "text/cloud-config",
        "kubevm-platform.cfg",
        Some("list(append)+dict(no_replace,recurse_list)+str()"),
    ));
    out.push_str(platform_cloud_config);
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(&format!("--{boundary}--\n"));
    out
}

fn part_headers(mime: &str, filename: &str, merge_type: Option<&str>) -> String {
    let mut headers = format!("Content-Type: {mime}; charset=\"utf-8\"\nMIME-Version: 1.0\n");
    if let Some(merge_type) = merge_type {
        headers.push_str(&format!("Merge-Type: {merge_type}\n"));
    }
    headers.push_str(&format!(
        "Content-Disposition: attachment; filename=\"{filename}\"\n\n"
    ));
    headers
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yaml(text: &str) -> Value {
        yaml_serde::from_str(text).unwrap()
    }

    #[test]
    fn classifies_first_line() {
        assert_eq!(
            classify("#cloud-config\na: 1").unwrap(),
            UserFormat::CloudConfig
        );
        assert_eq!(
            classify("#!/bin/bash\necho").unwrap(),
            UserFormat::Part("text/x-shellscript")
        );
        assert_eq!(
            classify("#include\nhttp://x").unwrap(),
            UserFormat::Part("text/x-include-url")
        );
        assert_eq!(
            classify("#cloud-boothook\n").unwrap(),
            UserFormat::Part("text/cloud-boothook")
        );
        assert_eq!(
            classify("Content-Type: multipart/mixed; boundary=x\n").unwrap(),
            UserFormat::Mime
        );
        let e = classify("hello: world").unwrap_err().to_string();
        assert!(e.contains("\"hello: world\"") && !e.contains('\n'), "{e}");
    }

    #[test]
    fn merge_appends_lists_and_user_wins() {
        let mut base = yaml(
            "packages: [a]\nusers: [default, {name: kubevm}]\nssh_pwauth: false\nnested: {x: 1, l: [1]}",
        );
        merge(
            &mut base,
            yaml("packages: [b, a]\nssh_pwauth: true\nnested: {y: 2, l: [2]}\nextra: 1"),
        );
        assert_eq!(
            base,
            yaml(
                "packages: [a, b]\nusers: [default, {name: kubevm}]\nssh_pwauth: true\nnested: {x: 1, l: [1, 2], y: 2}\nextra: 1"
            )
        );
    }

    #[test]
    fn yaml_errors_have_a_position() {
        let e = parse_cloud_config("#cloud-config\na: [1\nb: 2\n").unwrap_err();
        let CloudInitError::Yaml { line, column, .. } = &e else {
            panic!("{e:?}")
        };
        assert!(*line >= 2 && *column > 0, "{e:?}");
        let text = e.to_string();
        assert!(
            text.contains(&format!("line {line}, column {column}")) && !text.contains('\n'),
            "{text}"
        );
        assert!(matches!(
            parse_cloud_config("- a\n- b\n"),
            Err(CloudInitError::NotAMapping)
        ));
        assert!(parse_cloud_config("#cloud-config\n").unwrap().is_empty());
    }

    #[test]
    fn secrets_are_found() {
        assert!(has_secrets(&yaml("chpasswd: {expire: false}")));
        assert!(has_secrets(&yaml("users: [{name: a, hashed_passwd: x}]")));
        assert!(has_secrets(&yaml(
            "write_files: [{content: '-----BEGIN OPENSSH PRIVATE KEY-----'}]"
        )));
        assert!(!has_secrets(&yaml("users: [{name: a, lock_passwd: true}]")));
        assert!(text_has_secrets("#!/bin/sh\necho root:x | chpasswd"));
        assert!(!text_has_secrets("#!/bin/sh\necho hi"));
    }

    #[test]
    fn multipart_keeps_the_user_part() {
        let out = multipart(
            "#!/bin/sh\necho hi\n",
            UserFormat::Part("text/x-shellscript"),
            "#cloud-config\na: 1\n",
        );
        assert!(out.starts_with("Content-Type: multipart/mixed; boundary=\"==KUBEVM_BOUNDARY==\""));
        assert!(out.contains("Content-Type: text/x-shellscript; charset=\"utf-8\"\nMIME-Version: 1.0\nContent-Disposition: attachment; filename=\"user-data\"\n\n#!/bin/sh\necho hi\n--==KUBEVM_BOUNDARY==\n"));
        assert!(out.contains("Merge-Type: list(append)+dict(no_replace,recurse_list)+str()"));
        assert!(out.ends_with("#cloud-config\na: 1\n--==KUBEVM_BOUNDARY==--\n"));
        let nasty = "#!/bin/sh\n# ==KUBEVM_BOUNDARY==\n";
        let out = multipart(
            nasty,
            UserFormat::Part("text/x-shellscript"),
            "#cloud-config\n",
        );
        assert!(out.contains("boundary=\"==XKUBEVM_BOUNDARY==\""), "{out}");
    }
}
