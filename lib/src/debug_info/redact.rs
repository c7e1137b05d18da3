//! Masking secrets in everything the archive holds: cloud-init user data in objects, the
//! `--env` values kubectl vm create writes into user data, and anything shaped like a password,
//! token or private key, in objects and logs alike.

use std::borrow::Cow;

use base64::Engine;
use regex::{Captures, Regex};
use serde_json::Value;

/// What replaces a masked value.
pub const MASK: &str = "[REDACTED]";

/// Masks secrets in text, line by line.
#[derive(Debug, Clone)]
pub struct Redactor {
    enabled: bool,
    /// Exact values known to be secret (env values, passwords found in user data), longest first.
    literals: Vec<String>,
    key_value: Regex,
    auth: Regex,
    jwt: Regex,
    url_password: Regex,
    inline_key: Regex,
    key_begin: Regex,
    key_end: Regex,
}

/// State of a multi-line private key while redacting a stream of lines.
#[derive(Debug, Default, Clone, Copy)]
pub struct LineState {
    in_private_key: bool,
}

impl Redactor {
    /// A redactor; `enabled: false` (`--include-secrets`) passes everything through.
    pub fn new(enabled: bool) -> Self {
        let re = |s: &str| Regex::new(s).expect("valid pattern");
        Redactor {
            enabled,
            literals: Vec::new(),
            key_value: re(
                r#"(?i)([A-Za-z0-9_.-]*(?:password|passwd|passphrase|pwd|secret|token|api[_-]?key|access[_-]?key|private[_-]?key|credentials?))(\\?["']?\s*[:=]\s*\\?["']?)([^\s"'\\,;{}\[\]]+)"#,
            ),
            auth: re(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{6,}"),
            jwt: re(r"eyJ[A-Za-z0-9_-]{6,}\.[A-Za-z0-9_-]{6,}\.[A-Za-z0-9_-]*"),
            url_password: re(r"(://[^/\s:@]+:)[^@\s/]+@"),
            inline_key: re(
                r"-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY-----.*?-----END ([A-Z0-9 ]*)PRIVATE KEY-----",
            ),
            key_begin: re(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----"),
            key_end: re(r"-----END [A-Z0-9 ]*PRIVATE KEY-----"),
        }
    }

    /// Whether masking is on.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Remember an exact secret value, masked wherever it appears.
    pub fn add_literal(&mut self, value: &str) {
        let value = value.trim();
        // Very short values would mask ordinary words; those are left to the patterns.
        // Settings like `lock_passwd: false` are not secrets; masking every "false" would
        // ruin the archive.
        let ordinary = [
            "true", "false", "null", "none", "True", "False", "yes", "no",
        ];
        if value.len() >= 4
            && value != MASK
            && !ordinary.contains(&value)
            && !value.chars().all(|c| c.is_ascii_digit())
            && !self.literals.iter().any(|l| l == value)
        {
            self.literals.push(value.to_owned());
            self.literals.sort_by_key(|l| std::cmp::Reverse(l.len()));
        }
    }

    /// Learn the secret values a cloud-init user data document carries: the values of the env
    /// files `kubectl vm create --env` writes, and password-like settings.
    pub fn learn_user_data(&mut self, user_data: &str) {
        let mut in_env_block = false;
        for line in user_data.lines() {
            let t = line.trim();
            if t == "# BEGIN kubevm" {
                in_env_block = true;
                continue;
            }
            if t == "# END kubevm" {
                in_env_block = false;
                continue;
            }
            if let Some(rest) = t.strip_prefix("export ")
                && let Some((name, value)) = rest.split_once('=')
                && is_env_name(name)
            {
                self.add_literal(&unquote(value).replace(r"'\''", "'"));
            } else if in_env_block
                && let Some((name, value)) = t.split_once('=')
                && is_env_name(name)
            {
                self.add_literal(&unquote(value));
            }
            for caps in self.key_value.clone().captures_iter(line) {
                if !is_reference_key(&caps[1]) {
                    self.add_literal(&caps[3]);
                }
            }
            // chpasswd's `user:password` list entries.
            if let Some((user, pass)) = t.trim_start_matches("- ").split_once(':')
                && user
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
                && !pass.trim().is_empty()
                && !pass.contains(' ')
                && user_data.contains("chpasswd")
                && !t.ends_with(':')
                && !pass.starts_with(' ')
            {
                self.add_literal(pass);
            }
        }
    }

    /// Mask one line (no newline inside); `state` carries a private key across lines.
    pub fn line<'a>(&self, line: &'a str, state: &mut LineState) -> Cow<'a, str> {
        if !self.enabled {
            return Cow::Borrowed(line);
        }
        if state.in_private_key {
            if self.key_end.is_match(line) {
                state.in_private_key = false;
                return Cow::Owned(format!("{MASK}-----END PRIVATE KEY-----"));
            }
            return Cow::Owned(MASK.to_owned());
        }
        let mut text = Cow::Borrowed(line);
        if self.inline_key.is_match(&text) {
            text = Cow::Owned(
                self.inline_key
                    .replace_all(
                        &text,
                        format!("-----BEGIN PRIVATE KEY-----{MASK}-----END PRIVATE KEY-----")
                            .as_str(),
                    )
                    .into_owned(),
            );
        } else if let Some(m) = self.key_begin.find(&text) {
            state.in_private_key = true;
            let kept = text[..m.end()].to_owned();
            text = Cow::Owned(kept);
        }
        for literal in &self.literals {
            if text.contains(literal.as_str()) {
                text = Cow::Owned(text.replace(literal.as_str(), MASK));
            }
        }
        let replace = |re: &Regex, text: Cow<'a, str>, f: &dyn Fn(&Captures) -> String| {
            if re.is_match(&text) {
                Cow::Owned(re.replace_all(&text, |c: &Captures| f(c)).into_owned())
            } else {
                text
            }
        };
        // Most log lines hold none of the words the patterns need: skip the regexes then.
        let lower = text.to_ascii_lowercase();
        let has = |words: &[&str]| words.iter().any(|w| lower.contains(w));
        if !has(&[
            "pass",
            "pwd",
            "secret",
            "token",
            "key",
            "credential",
            "bearer",
            "basic",
            "eyj",
            "://",
        ]) {
            return text;
        }
        text = replace(&self.key_value, text, &|c| {
            if is_reference_key(&c[1]) || &c[3] == MASK {
                c[0].to_owned()
            } else {
                format!("{}{}{MASK}", &c[1], &c[2])
            }
        });
        text = replace(&self.auth, text, &|c| format!("{} {MASK}", &c[1]));
        text = replace(&self.jwt, text, &|_| MASK.to_owned());
        text = replace(&self.url_password, text, &|c| format!("{}{MASK}@", &c[1]));
        text
    }

    /// Mask a whole text (line by line, newlines kept).
    pub fn text(&self, text: &str) -> String {
        if !self.enabled {
            return text.to_owned();
        }
        let mut state = LineState::default();
        let mut out = String::with_capacity(text.len());
        for piece in text.split_inclusive('\n') {
            let (line, newline) = match piece.strip_suffix('\n') {
                Some(line) => (line, "\n"),
                None => (piece, ""),
            };
            out.push_str(&self.line(line, &mut state));
            out.push_str(newline);
        }
        out
    }

    /// Mask an object in place before it is serialized: cloud-init user data (kept as a note
    /// of its size), password-like string fields, and the same inside the
    /// `last-applied-configuration` annotation.
    pub fn object(&self, object: &mut Value) {
        if !self.enabled {
            return;
        }
        mask_value(object, None);
        if let Some(Value::String(applied)) = object
            .pointer_mut("/metadata/annotations/kubectl.kubernetes.io~1last-applied-configuration")
            && let Ok(mut inner) = serde_json::from_str::<Value>(applied)
        {
            mask_value(&mut inner, None);
            *applied = inner.to_string();
        }
    }
}

/// Every cloud-init user data text in an object (plain or base64), to learn secrets from.
pub fn user_data_texts(object: &Value) -> Vec<String> {
    let mut out = Vec::new();
    collect_user_data(object, None, &mut out);
    out
}

fn collect_user_data(value: &Value, key: Option<&str>, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                collect_user_data(v, Some(k), out);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| collect_user_data(v, key, out)),
        Value::String(s) => match key {
            Some("userData") => out.push(s.clone()),
            Some("userDataBase64") => {
                if let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(s.trim()) {
                    out.push(String::from_utf8_lossy(&bytes).into_owned());
                }
            }
            _ => {}
        },
        _ => {}
    }
}

fn mask_value(value: &mut Value, key: Option<&str>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                mask_value(v, Some(k));
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| mask_value(v, key)),
        Value::String(s) => {
            let Some(key) = key else { return };
            if matches!(
                key,
                "userData" | "userDataBase64" | "networkData" | "networkDataBase64"
            ) {
                *s = format!("{MASK} (cloud-init data, {} bytes)", s.len());
            } else if is_secret_key(key) && !s.is_empty() {
                *s = MASK.to_owned();
            }
        }
        _ => {}
    }
}

fn is_secret_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    !is_reference_key(key)
        && [
            "password",
            "passwd",
            "passphrase",
            "secret",
            "token",
            "apikey",
            "api_key",
            "privatekey",
            "private_key",
        ]
        .iter()
        .any(|w| k.contains(w))
}

/// `secretName`, `userDataSecretRef`, `tokenRefs`: names of things, not secrets.
fn is_reference_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    k.ends_with("name") || k.ends_with("ref") || k.ends_with("refs") || k.ends_with("names")
}

fn is_env_name(name: &str) -> bool {
    !name.is_empty()
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit())
}

fn unquote(value: &str) -> String {
    let v = value.trim();
    for q in ['\'', '"'] {
        if v.len() >= 2 && v.starts_with(q) && v.ends_with(q) {
            return v[1..v.len() - 1].to_owned();
        }
    }
    v.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn patterns_mask_values_not_keys() {
        let r = Redactor::new(true);
        let mut s = LineState::default();
        assert_eq!(r.line("password: hunter2", &mut s), "password: [REDACTED]");
        assert_eq!(
            r.line(r#"{"db_password":"p4ss","user":"x"}"#, &mut s),
            r#"{"db_password":"[REDACTED]","user":"x"}"#
        );
        assert_eq!(
            r.line("ACCESS_KEY=AKIA1234", &mut s),
            "ACCESS_KEY=[REDACTED]"
        );
        assert_eq!(
            r.line("Authorization: Bearer abcdef123456", &mut s),
            "Authorization: Bearer [REDACTED]"
        );
        assert_eq!(
            r.line("https://user:pw1234@host/x", &mut s),
            "https://user:[REDACTED]@host/x"
        );
        assert_eq!(
            r.line("secretName: app-credentials", &mut s),
            "secretName: app-credentials"
        );
        assert_eq!(
            r.line("tokens issued: 4 of 5", &mut s),
            "tokens issued: 4 of 5"
        );
    }

    #[test]
    fn private_keys_across_lines_and_inline() {
        let r = Redactor::new(true);
        let text = "a\n-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk\nAAAA\n-----END OPENSSH PRIVATE KEY-----\nz\n";
        let out = r.text(text);
        assert!(
            !out.contains("b3BlbnNzaC1rZXk") && !out.contains("AAAA"),
            "{out}"
        );
        assert!(out.starts_with("a\n") && out.ends_with("z\n"), "{out}");
        let inline = r.text(
            r#"key: "-----BEGIN RSA PRIVATE KEY-----\nMIIEsecret\n-----END RSA PRIVATE KEY-----""#,
        );
        assert!(!inline.contains("MIIEsecret"), "{inline}");
    }

    #[test]
    fn env_values_from_user_data_become_literals() {
        let mut r = Redactor::new(true);
        r.learn_user_data("#cloud-config\nruncmd:\n- |\n  export ROLE='db-primary-9'\n  # BEGIN kubevm\n  MODE=\"fast lane\"\n  # END kubevm\nchpasswd:\n  list: |\n    root:Sup3rS3cret\n");
        r.learn_user_data("lock_passwd: false\npassword_expiry: 3600\n");
        let out = r.text("role db-primary-9 in fast lane as root with Sup3rS3cret\n");
        assert_eq!(r.text("ready: false 3600\n"), "ready: false 3600\n");
        assert_eq!(
            out,
            "role [REDACTED] in [REDACTED] as root with [REDACTED]\n"
        );
    }

    #[test]
    fn objects_lose_user_data_and_password_fields() {
        let r = Redactor::new(true);
        let mut vm = json!({
            "metadata": {"annotations": {"kubectl.kubernetes.io/last-applied-configuration":
                "{\"spec\":{\"volumes\":[{\"cloudInitNoCloud\":{\"userData\":\"password: x\"}}]}}"}},
            "spec": {"volumes": [{"cloudInitNoCloud": {"userData": "#cloud-config\npassword: x\n", "userDataSecretRef": {"name": "s"}}}],
                     "provisioning": {"userDataRef": {"kind": "Secret", "name": "s"}},
                     "apiToken": "abc"}
        });
        r.object(&mut vm);
        let text = vm.to_string();
        assert!(!text.contains("password: x"), "{text}");
        assert_eq!(vm["spec"]["apiToken"], MASK);
        assert_eq!(vm["spec"]["provisioning"]["userDataRef"]["name"], "s");
        let off = Redactor::new(false);
        assert_eq!(off.text("password: x"), "password: x");
    }
}
