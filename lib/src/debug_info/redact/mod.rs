//! Masking secrets in everything the archive holds: cloud-init user data in objects, the
//! `--env` values kubectl vm create writes into user data, and anything shaped like a password,
//! token or private key, in objects and logs alike.

use std::borrow::Cow;

use base64::Engine;
use regex::{Captures, Regex};
use serde_json::Value;

/// What replaces a masked value.
pub const MASK: &str = "[REDACTED]";

/// Words that make a key, flag or env name secret-like (a regex alternation).
const SECRET_WORDS: &str = "password|passwd|passphrase|pwd|secret|token|api[_-]?key|access[_-]?key|private[_-]?key|credentials?";

/// Masks secrets in text, line by line.
#[derive(Debug, Clone)]
pub struct Redactor {
    enabled: bool,
    /// Exact values known to be secret (env values, passwords found in user data), longest first.
    literals: Vec<String>,
    key_value: Regex,
    flag: Regex,
    env_flow: Regex,
    env_name: Regex,
    env_value: Regex,
    block_header: Regex,
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
    /// Inside a YAML block value (`token: |`) of a secret key: lines indented deeper than
    /// this column are masked.
    block_indent: Option<usize>,
    /// After `name: DB_PASSWORD` in a YAML list of env entries: the column of `name`, where
    /// the entry's `value:` is expected.
    env_column: Option<usize>,
}

impl Redactor {
    /// A redactor; `enabled: false` (`--include-secrets`) passes everything through.
    pub fn new(enabled: bool) -> Self {
        let re = |s: &str| Regex::new(s).expect("valid pattern");
        Redactor {
            enabled,
            literals: Vec::new(),
            // A secret-like key and its separator; the value is found by `value_span`.
            key_value: re(&format!(
                r#"(?i)((?:[A-Za-z0-9_.-]*(?:{SECRET_WORDS}))|\b(?:[A-Za-z0-9_.-]*[_.-])?pass)(\\?["']?)(\s*([:=])\s*)"#
            )),
            // `--password X`, `--token X`, `-p X` (the value is the next word).
            flag: re(&format!(
                r"(?i)(?:^|\s)(--?[A-Za-z0-9-]*(?:{SECRET_WORDS})|--pass|--pwd|-p)\s+"
            )),
            // `{"name": "DB_PASSWORD", "value": ...}` on one line (JSON, YAML flow).
            env_flow: re(
                r#"(?i)["']?\bname["']?\s*:\s*["']?([A-Za-z0-9_.-]+)["']?\s*,\s*["']?value["']?\s*:\s*"#,
            ),
            env_name: re(r#"^(\s*)(- )?name:\s*["']?([A-Za-z0-9_.-]+)["']?\s*$"#),
            env_value: re(r"^(\s*)value:\s*"),
            block_header: re(&format!(
                r#"(?i)^(\s*(?:- )?)["']?([A-Za-z0-9_.-]*(?:{SECRET_WORDS})[A-Za-z0-9_.-]*)["']?\s*:\s*[|>][-+0-9]*\s*(?:#.*)?$"#
            )),
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
            let found: Vec<String> = self
                .key_value
                .captures_iter(line)
                .filter(|c| !is_reference_key(&c[1]))
                .map(|c| {
                    let at = c.get(0).map_or(0, |m| m.end());
                    let sep = c[4].chars().next().unwrap_or(':');
                    let (start, end) = value_span(line, at, sep, line[..at].contains(['{', '[']));
                    line[start..end].to_owned()
                })
                .collect();
            for value in found {
                self.add_literal(&value);
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

    /// Mask one line (no newline inside); `state` carries a private key, a YAML block value
    /// and an env entry's name across lines.
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
        let indent = line.len() - line.trim_start().len();
        if let Some(block) = state.block_indent {
            if line.trim().is_empty() {
                return Cow::Borrowed(line);
            }
            if indent > block {
                return Cow::Owned(format!("{}{MASK}", &line[..indent]));
            }
            state.block_indent = None;
        }
        if let Some(column) = state.env_column {
            if let Some(c) = self.env_value.captures(line)
                && c[1].len() == column
            {
                state.env_column = None;
                let at = c.get(0).map_or(0, |m| m.end());
                let (start, end) = value_span(line, at, ':', false);
                if start < end {
                    return Cow::Owned(format!("{}{MASK}{}", &line[..start], &line[end..]));
                }
                return Cow::Borrowed(line);
            }
            let new_item = line[indent..].starts_with("- ");
            if !line.trim().is_empty() && (indent < column || (new_item && indent + 2 == column)) {
                state.env_column = None;
            }
        }
        if let Some(c) = self.env_name.captures(line) {
            if is_secret_name(&c[3]) {
                state.env_column = Some(c[1].len() + c.get(2).map_or(0, |m| m.len()));
            }
            return Cow::Borrowed(line);
        }
        if let Some(c) = self.block_header.captures(line) {
            if !is_reference_key(&c[2]) {
                state.block_indent = Some(c[1].len());
            }
            return Cow::Borrowed(line);
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
            "-p ",
        ]) {
            return text;
        }
        if let Some(masked) = self.mask_spans(&text) {
            text = Cow::Owned(masked);
        }
        text = replace(&self.auth, text, &|c| format!("{} {MASK}", &c[1]));
        text = replace(&self.jwt, text, &|_| MASK.to_owned());
        text = replace(&self.url_password, text, &|c| format!("{}{MASK}@", &c[1]));
        text
    }

    /// Masks the values of secret-like keys, flags and env entries; `None` when none.
    fn mask_spans(&self, line: &str) -> Option<String> {
        let mut spans: Vec<(usize, usize)> = Vec::new();
        let flow_before = |at: usize| line[..at].contains(['{', '[']);
        for c in self.key_value.captures_iter(line) {
            let key = &c[1];
            let at = c.get(0).map_or(0, |m| m.end());
            let sep = c[4].chars().next().unwrap_or(':');
            if is_reference_key(key) {
                continue;
            }
            spans.push(value_span(line, at, sep, flow_before(at)));
        }
        for c in self.flag.captures_iter(line) {
            let flag = &c[1];
            let at = c.get(0).map_or(0, |m| m.end());
            let end = line[at..]
                .find(char::is_whitespace)
                .map_or(line.len(), |e| at + e);
            let value = &line[at..end];
            let port_like = !value.is_empty()
                && value
                    .split(':')
                    .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
            // `-P` is a port (scp), `-p PORT` too (ssh, docker), and after a short flag a word
            // starting with `-` is another flag. After a long secret flag the next word is
            // masked whatever it looks like: it may be the secret (`--password --x1`), and
            // masking a flag loses less than leaking a password.
            let is_flag = value.starts_with('-') && !flag.starts_with("--");
            if is_flag || flag == "-P" || (flag == "-p" && port_like) {
                continue;
            }
            spans.push((at, end));
        }
        for c in self.env_flow.captures_iter(line) {
            if is_secret_name(&c[1]) {
                let at = c.get(0).map_or(0, |m| m.end());
                spans.push(value_span(line, at, ':', true));
            }
        }
        spans.retain(|(s, e)| s < e && &line[*s..*e] != MASK);
        if spans.is_empty() {
            return None;
        }
        spans.sort();
        let mut out = String::with_capacity(line.len());
        let mut last = 0;
        for (start, end) in spans {
            if start < last {
                // Overlaps a span already masked.
                last = last.max(end);
                continue;
            }
            out.push_str(&line[last..start]);
            out.push_str(MASK);
            last = end;
        }
        out.push_str(&line[last..]);
        Some(out)
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

/// The Secrets holding a VM's cloud-init user data: KubeVirt `cloudInitNoCloud`/
/// `cloudInitConfigDrive` `secretRef` (and `userDataSecretRef`), Deckhouse
/// `spec.provisioning.userDataRef` of kind Secret.
pub fn user_data_secret_names(vm: &Value) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let volumes = vm
        .pointer("/spec/template/spec/volumes")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for volume in &volumes {
        for source in ["cloudInitNoCloud", "cloudInitConfigDrive"] {
            for reference in ["secretRef", "userDataSecretRef"] {
                if let Some(name) = volume
                    .get(source)
                    .and_then(|s| s.get(reference))
                    .and_then(|r| r["name"].as_str())
                {
                    out.push(name.to_owned());
                }
            }
        }
    }
    if let Some(r) = vm.pointer("/spec/provisioning/userDataRef")
        && r["kind"].as_str().is_none_or(|k| k == "Secret")
        && let Some(name) = r["name"].as_str()
    {
        out.push(name.to_owned());
    }
    out.sort();
    out.dedup();
    out
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
            // An env entry `{name: DB_PASSWORD, value: …}`.
            let secret_entry = map
                .get("name")
                .and_then(Value::as_str)
                .is_some_and(is_secret_name);
            for (k, v) in map.iter_mut() {
                if secret_entry && k == "value" && v.as_str().is_some_and(|s| !s.is_empty()) {
                    *v = Value::String(MASK.to_owned());
                    continue;
                }
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

/// Where the value that starts at `at` ends: inside quotes for a quoted value (`"…"` with
/// backslash escapes, `\"…\"` inside a JSON string, `'…'` with YAML's `''`); unquoted after
/// `=` up to white space or `"`, `\`, `&`, `}`, `]` (commas and semicolons are part of it);
/// unquoted after `:` up to `,`, `}`, `]` in a flow (`{…}`, JSON), else to the end of the line
/// (a YAML scalar), stopping at `"` or `\` (a JSON string around the text).
fn value_span(line: &str, at: usize, sep: char, flow: bool) -> (usize, usize) {
    let rest = &line[at..];
    if let Some(inner) = rest.strip_prefix("\\\"") {
        let end = inner.find("\\\"").unwrap_or(inner.len());
        return (at + 2, at + 2 + end);
    }
    if let Some(inner) = rest.strip_prefix('"') {
        let mut escaped = false;
        for (i, ch) in inner.char_indices() {
            match ch {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => return (at + 1, at + 1 + i),
                _ => {}
            }
        }
        return (at + 1, line.len());
    }
    if let Some(inner) = rest.strip_prefix('\'') {
        let bytes = inner.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'\'' {
                if bytes.get(i + 1) == Some(&b'\'') {
                    i += 2;
                    continue;
                }
                return (at + 1, at + 1 + i);
            }
            i += 1;
        }
        return (at + 1, line.len());
    }
    let stop: &[char] = if sep == '=' {
        &['"', '\\', '&', '}', ']']
    } else if flow {
        &[',', '}', ']', '"', '\\']
    } else {
        &['"', '\\']
    };
    // A `&` ends a value only where another query parameter follows (`password=x&user=y`):
    // in `PASSWORD=&x1` it is part of the secret, and masking too much beats leaking.
    let next_parameter = |i: usize| {
        let after = &rest[i + 1..];
        let name_len = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || "_.-".contains(c)))
            .unwrap_or(after.len());
        name_len > 0 && after[name_len..].starts_with('=')
    };
    let end = rest
        .char_indices()
        .find(|&(i, ch)| {
            (stop.contains(&ch) && (ch != '&' || next_parameter(i)))
                || (sep == '=' && ch.is_whitespace())
        })
        .map_or(rest.len(), |(i, _)| i);
    let value = rest[..end].trim_end();
    (at, at + value.len())
}

/// Whether an env variable name (`DB_PASSWORD`, `api_token`, `ROOT_PASS`) names a secret.
fn is_secret_name(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    if is_reference_key(&n) {
        return false;
    }
    let words = [
        "password",
        "passwd",
        "passphrase",
        "secret",
        "token",
        "apikey",
        "api_key",
        "api-key",
        "access_key",
        "private_key",
        "credential",
    ];
    words.iter().any(|w| n.contains(w))
        || n == "pass"
        || n == "pwd"
        || n.ends_with("_pass")
        || n.ends_with("_pwd")
        || n.ends_with("-pass")
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
mod tests;

#[cfg(test)]
mod properties;
