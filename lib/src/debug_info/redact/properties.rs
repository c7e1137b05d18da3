//! Properties of redaction (issue 37): a secret value, wherever the shapes the bundle collects
//! put it, never reaches the archive. `PROPTEST_CASES=100000 cargo test -p kubevm --lib
//! debug_info::redact::properties` for a long run.

use super::*;
use proptest::prelude::*;

/// One redactor for all cases: building its patterns is what a case would spend its time on.
static REDACTOR: std::sync::LazyLock<Redactor> = std::sync::LazyLock::new(|| Redactor::new(true));

/// A secret: 8 to 24 characters with at least one digit (so no ordinary word matches it).
fn secret() -> impl Strategy<Value = String> {
    (
        "[A-Za-z0-9_+.~!#%&*-]{4,12}",
        0u32..10,
        "[A-Za-z0-9_+.~-]{3,11}",
    )
        .prop_map(|(a, d, b)| format!("{a}{d}{b}"))
}

/// A token-like secret (the alphabet of bearer tokens and URL passwords).
fn token() -> impl Strategy<Value = String> {
    ("[A-Za-z0-9._~+]{5,15}", 0u32..10).prop_map(|(a, d)| format!("{a}{d}"))
}

/// Lines around the secret that hold none of it.
fn noise() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(
        prop::sample::select(vec![
            "level=info msg=\"started\"",
            "  name: web",
            "spec:",
            "- name: LOG_LEVEL",
            "  value: debug",
            "{\"kind\":\"Pod\",\"status\":{}}",
            "",
        ])
        .prop_map(str::to_owned),
        0..4,
    )
}

/// The shapes a secret takes in what a debug bundle collects (objects, logs, env entries,
/// command lines, URLs, user data).
fn exposure(v: &str, t: &str, shape: u8) -> String {
    match shape {
        0 => format!("password: {v}"),
        1 => format!("DB_PASSWORD={v}"),
        2 => format!("{{\"api_key\":\"{v}\",\"user\":\"bob\"}}"),
        3 => format!("exec: mysql --password {v} -h db"),
        4 => format!("Authorization: Bearer {t}"),
        5 => format!("fetching https://deploy:{t}@git.example/x"),
        6 => format!("client_secret: |\n  {v}\n  {v}x\nnext: 1"),
        7 => format!("env:\n- name: API_TOKEN\n  value: {v}"),
        _ => format!("  accessKey: \"{v}\""),
    }
}

proptest! {
    /// A secret in any of the collected shapes, among ordinary lines, is masked.
    #[test]
    fn secrets_never_reach_the_bundle(v in secret(), t in token(), shape in 0u8..9, before in noise(), after in noise()) {
        let text = [before.join("\n"), exposure(&v, &t, shape), after.join("\n")].join("\n");
        let out = REDACTOR.text(&text);
        let leaked = if matches!(shape, 4 | 5) { &t } else { &v };
        prop_assert!(!out.contains(leaked.as_str()), "{:?} -> {:?}", text, out);
        prop_assert!(out.contains(MASK));
    }

    /// An env value `create --env` put in user data is masked wherever a log repeats it.
    #[test]
    fn learned_values_are_masked_anywhere(v in secret(), name in "[A-Z][A-Z_]{2,10}", prefix in "[a-z ]{0,12}", suffix in "[a-z ]{0,12}") {
        let mut r = REDACTOR.clone();
        r.learn_user_data(&format!("#cloud-config\nwrite_files:\n- content: |\n    # BEGIN kubevm\n    export {name}='{v}'\n    # END kubevm\n"));
        let line = format!("{prefix}{v}{suffix}");
        let out = r.text(&line);
        prop_assert!(!out.contains(v.as_str()), "{:?} -> {:?}", line, out);
    }
}
