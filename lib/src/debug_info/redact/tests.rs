//! Unit tests of redaction: which values are masked and which are kept.

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

/// Found by `properties::secrets_never_reach_the_bundle` (issue 37): a value starting with
/// `&` was cut at it as if a query parameter followed, and a value starting with `-` after
/// `--password` was taken for a flag; both leaked whole.
#[test]
fn values_starting_with_query_or_flag_characters() {
    let r = Redactor::new(true);
    assert_eq!(r.text("DB_PASSWORD=&a_%0a00"), "DB_PASSWORD=[REDACTED]");
    assert_eq!(
        r.text("exec: mysql --password -Aa0000a -h db"),
        "exec: mysql --password [REDACTED] -h db"
    );
    assert_eq!(
        r.text("exec: mysql --password --AA00-+ -h db"),
        "exec: mysql --password [REDACTED] -h db"
    );
    // A query parameter after the value still ends it.
    assert_eq!(
        r.text("GET /login?password=x1y2&user=bob"),
        "GET /login?password=[REDACTED]&user=bob"
    );
}

/// Values with spaces, quotes and commas are masked whole (issue 19 item 4b).
#[test]
fn values_with_spaces_quotes_and_commas() {
    let r = Redactor::new(true);
    for (line, secret) in [
        (r#"password: "a b c""#, "a b c"),
        ("password: 'it''s x'", "s x"),
        (r#"{"password":"p \"q\" r","user":"bob"}"#, "q"),
        ("password=ab,cd user=bob", ",cd"),
        ("db_password: long phrase with spaces", "phrase with spaces"),
        ("token=abc;def", ";def"),
    ] {
        let out = r.text(line);
        assert!(!out.contains(secret), "{line:?} -> {out:?}");
        assert!(out.contains(MASK), "{line:?} -> {out:?}");
    }
    assert_eq!(
        r.text("password=ab,cd user=bob"),
        "password=[REDACTED] user=bob"
    );
    assert_eq!(
        r.text(r#"{"password":"a, b","user":"bob"}"#),
        r#"{"password":"[REDACTED]","user":"bob"}"#
    );
}

/// Command-line flags, openssl's `pass:`, YAML block values and env entries (item 4c).
#[test]
fn flags_pass_blocks_and_env_entries() {
    let r = Redactor::new(true);
    for (text, secret) in [
        ("mysql --password Flag-Pw-1 -h db", "Flag-Pw-1"),
        ("mysql -u root -p Short-Pw-2 appdb", "Short-Pw-2"),
        ("openssl enc -pass pass:Ossl-Pw-3 -in f", "Ossl-Pw-3"),
        ("run --token Tok-Val-4", "Tok-Val-4"),
        (
            "token: |\n  Block-Line-5\n  Block-Line-6\nnext: 1\n",
            "Block-Line",
        ),
        ("  private_key: >-\n    Folded-7\n  other: x\n", "Folded-7"),
        (
            "env:\n- name: DB_PASSWORD\n  value: Env-Entry-8\n- name: MODE\n  value: fast\n",
            "Env-Entry-8",
        ),
        (
            "- name: API_TOKEN\n  valueFrom: {}\n  value: \"Env Entry 9\"\n",
            "Env Entry 9",
        ),
        (
            r#"{"name":"DB_PASSWORD","value":"Env-Json-10"}"#,
            "Env-Json-10",
        ),
        ("{name: db_secret, value: Env-Flow-11}", "Env-Flow-11"),
    ] {
        let out = r.text(text);
        assert!(!out.contains(secret), "{text:?} -> {out:?}");
    }
    // What is not secret stays.
    let env = r.text("- name: MODE\n  value: fast\n");
    assert_eq!(env, "- name: MODE\n  value: fast\n");
    let block = r.text("token: |\n  Block-Line-5\nnext: 1\n");
    assert_eq!(block, "token: |\n  [REDACTED]\nnext: 1\n");
    assert_eq!(r.text("ssh -p 2222 host"), "ssh -p 2222 host");
    assert_eq!(r.text("docker run -p 8080:80 x"), "docker run -p 8080:80 x");
    assert_eq!(r.text("bypass the cache"), "bypass the cache");
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
