//! Label selectors checked before they are sent.

use crate::error::{Error, Result};

/// The longest label selector sent. A selector travels in the request line
/// (`?labelSelector=…`); the smallest limit such a line commonly meets on its way to an API
/// server is 8 KiB (nginx's `large_client_header_buffers 4 8k`, the default of ingress and
/// proxy setups in front of clusters), and over 64 KiB even the URI parser of hyper-based servers
/// refuses it ("uri too long"). Legitimate selectors are a few hundred bytes.
pub const MAX_SELECTOR_BYTES: usize = 8 * 1024;

/// Refuse a selector too long to send, before any request.
pub fn check_length(selector: &str) -> Result<()> {
    if selector.len() > MAX_SELECTOR_BYTES {
        return Err(Error::InvalidTarget(format!(
            "label selector is {} bytes long; at most {MAX_SELECTOR_BYTES} fit in a request (select by fewer or shorter labels)",
            selector.len()
        )));
    }
    Ok(())
}

/// Refuse a selector the API server would refuse (and one too long to send), before any
/// request. The grammar is k8s.io/apimachinery `pkg/labels/selector.go` `Parse`: requirements
/// separated by commas, each `KEY`, `!KEY`, `KEY=V`, `KEY==V`, `KEY!=V`, `KEY in (V,...)`,
/// `KEY notin (V,...)`, `KEY>N` or `KEY<N` (an integer); a key is a qualified name (an optional
/// DNS-1123 subdomain prefix and `/`, then at most 63 of `[A-Za-z0-9_.-]` starting and ending
/// alphanumeric), a value empty or the same shape without the prefix.
pub fn check(selector: &str) -> Result<()> {
    check_length(selector)?;
    if selector.trim_matches(SPACE).is_empty() {
        return Err(Error::InvalidTarget(
            "-l needs a label selector, e.g. -l app=web".into(),
        ));
    }
    parse(selector).map_err(|why| {
        Error::InvalidTarget(format!(
            "label selector {selector:?} is not valid: {why} (e.g. app=web,tier!=db or env in (dev,qa))"
        ))
    })
}

/// The characters apimachinery's selector lexer skips between tokens (`isWhitespace` in
/// `pkg/labels/selector.go`); any other character, a non-breaking space too, belongs to a token.
const SPACE: [char; 4] = [' ', '\t', '\r', '\n'];

fn parse(text: &str) -> std::result::Result<(), String> {
    let mut rest = text;
    loop {
        rest = requirement(rest)?;
        let trimmed = rest.trim_start_matches(SPACE);
        if trimmed.is_empty() {
            return Ok(());
        }
        match trimmed.strip_prefix(',') {
            Some(after) => rest = after,
            None => return Err(format!("unexpected {:?}", first_token(trimmed))),
        }
    }
}

fn first_token(text: &str) -> &str {
    text.split([' ', ',']).next().unwrap_or(text)
}

fn is_key_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/')
}

/// One requirement; returns what follows it.
fn requirement(text: &str) -> std::result::Result<&str, String> {
    let text = text.trim_start_matches(SPACE);
    let (negated, text) = match text.strip_prefix('!') {
        Some(t) => (true, t.trim_start_matches(SPACE)),
        None => (false, text),
    };
    let end = text.find(|c: char| !is_key_char(c)).unwrap_or(text.len());
    let (key, rest) = text.split_at(end);
    if key.is_empty() {
        return Err(match rest.chars().next() {
            None => "a requirement has no key".into(),
            Some(c) => format!("a key was expected before {c:?}"),
        });
    }
    check_key(key)?;
    let after = rest.trim_start_matches(SPACE);
    if negated || after.is_empty() || after.starts_with(',') {
        return Ok(rest);
    }
    for op in ["==", "!=", "="] {
        if let Some(v) = after.strip_prefix(op) {
            return value_then(v);
        }
    }
    for op in [">", "<"] {
        if let Some(v) = after.strip_prefix(op) {
            let v = v.trim_start_matches(SPACE);
            let end = v.find(|c: char| !is_value_char(c)).unwrap_or(v.len());
            let (number, rest) = v.split_at(end);
            if number.parse::<i64>().is_err() {
                return Err(format!("{op} needs an integer, not {number:?}"));
            }
            return Ok(rest);
        }
    }
    for op in ["notin", "in"] {
        if let Some(v) = after.strip_prefix(op)
            && v.trim_start_matches(SPACE).starts_with('(')
        {
            return set(v.trim_start_matches(SPACE), op);
        }
    }
    Err(format!(
        "unexpected {:?} after key {key:?} (expected =, ==, !=, in, notin, > or <)",
        first_token(after)
    ))
}

fn is_value_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
}

fn value_then(text: &str) -> std::result::Result<&str, String> {
    let v = text.trim_start_matches(SPACE);
    let end = v.find(|c: char| !is_value_char(c)).unwrap_or(v.len());
    let (value, rest) = v.split_at(end);
    check_value(value)?;
    Ok(rest)
}

fn set<'a>(text: &'a str, op: &str) -> std::result::Result<&'a str, String> {
    let mut rest = &text[1..];
    let mut values = 0;
    loop {
        rest = rest.trim_start_matches(SPACE);
        if let Some(after) = rest.strip_prefix(')') {
            if values == 0 {
                return Err(format!("{op} needs at least one value"));
            }
            return Ok(after);
        }
        let end = rest.find(|c: char| !is_value_char(c)).unwrap_or(rest.len());
        let (value, after) = rest.split_at(end);
        check_value(value)?;
        values += 1;
        let after = after.trim_start_matches(SPACE);
        rest = match after.chars().next() {
            Some(',') => &after[1..],
            Some(')') => after,
            None => return Err(format!("{op} ( is not closed")),
            Some(c) => return Err(format!("unexpected {c:?} in the values of {op}")),
        };
    }
}

fn check_value(value: &str) -> std::result::Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    name_part(value).map_err(|why| format!("value {value:?}: {why}"))
}

fn name_part(name: &str) -> std::result::Result<(), String> {
    if name.len() > 63 {
        return Err("must be at most 63 characters".into());
    }
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !alnum(name.chars().next()) || !alnum(name.chars().last()) {
        return Err("must start and end with a letter or digit".into());
    }
    if !name.chars().all(is_value_char) {
        return Err("may hold only letters, digits, '-', '_' and '.'".into());
    }
    Ok(())
}

fn check_key(key: &str) -> std::result::Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix
        && crate::validate::dns_subdomain("label key prefix", p).is_err()
    {
        return Err(format!(
            "key {key:?}: the prefix must be a DNS-1123 subdomain"
        ));
    }
    if name.is_empty() {
        return Err(format!("key {key:?} has no name"));
    }
    name_part(name).map_err(|why| format!("key {key:?}: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_parse_as_the_api_server_parses_them() {
        // Accepted by k8s.io/apimachinery labels.Parse.
        for good in [
            "app=web",
            "app==web,tier!=db",
            "env in (dev, qa),!legacy",
            "env notin (prod)",
            "kubevm.io/managed-by=kubectl-vm",
            "x",
            "gen>3,gen<10",
            "app=",
            " app = web , tier ",
        ] {
            assert!(check(good).is_ok(), "{good}: {:?}", check(good));
        }
        // Refused by it.
        for bad in [
            "a in (b",
            "a in ()",
            "=web",
            "app=web,",
            "app=-web",
            "app web",
            "gen>x",
            "Bad_Prefix!/x=1",
            "app=w@b",
            "",
        ] {
            assert!(check(bad).is_err(), "{bad} accepted");
        }
    }

    /// Found by `properties::a_foreign_character_is_refused` (issue 37): Unicode spaces were
    /// skipped like apimachinery's four whitespace characters, so a selector the API server
    /// refuses passed the local check.
    #[test]
    fn only_apimachinery_whitespace_separates_tokens() {
        assert!(check("\u{a0}app=web").is_err());
        assert!(check("app=\u{2003}web").is_err());
        assert!(check("\tapp = web ,\n tier in ( a , b )\r").is_ok());
    }

    #[test]
    fn long_selectors_are_refused() {
        assert!(check_length("app=web,tier!=db").is_ok());
        assert!(check_length(&"a".repeat(MAX_SELECTOR_BYTES)).is_ok());
        let err = check_length(&"a".repeat(MAX_SELECTOR_BYTES + 1)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "label selector is 8193 bytes long; at most 8192 fit in a request (select by fewer or shorter labels)"
        );
    }
}

/// Properties of the selector check (issue 37), against the grammar of k8s.io/apimachinery
/// `pkg/labels/selector.go` written out as generators: `PROPTEST_CASES=100000 cargo test -p
/// kubevm --lib selector::properties` for a long run.
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    fn name_part() -> impl Strategy<Value = String> {
        "[A-Za-z0-9]([A-Za-z0-9_.-]{0,20}[A-Za-z0-9])?"
    }

    fn key() -> impl Strategy<Value = String> {
        (
            proptest::option::of("[a-z0-9]([a-z0-9-]{0,6}[a-z0-9])?(\\.[a-z0-9]{1,5}){0,2}"),
            name_part(),
        )
            .prop_map(|(prefix, name)| match prefix {
                Some(p) => format!("{p}/{name}"),
                None => name,
            })
    }

    fn value() -> impl Strategy<Value = String> {
        prop_oneof![Just(String::new()), name_part()]
    }

    fn sp() -> impl Strategy<Value = &'static str> {
        prop::sample::select(vec!["", " ", "  "])
    }

    fn requirement() -> impl Strategy<Value = String> {
        (
            key(),
            0u8..8,
            value(),
            prop::collection::vec(name_part(), 1..4),
            any::<i32>(),
            sp(),
        )
            .prop_map(|(k, op, v, values, n, s)| match op {
                0 => k,
                1 => format!("!{s}{k}"),
                2 => format!("{k}{s}={s}{v}"),
                3 => format!("{k}{s}=={s}{v}"),
                4 => format!("{k}{s}!={s}{v}"),
                5 => format!("{k} in{s}({})", values.join(&format!(",{s}"))),
                6 => format!("{k} notin ({s}{}{s})", values.join(",")),
                _ => format!("{k}{s}{}{s}{n}", if n % 2 == 0 { ">" } else { "<" }),
            })
    }

    fn selector() -> impl Strategy<Value = String> {
        (prop::collection::vec(requirement(), 1..5), sp())
            .prop_map(|(reqs, s)| reqs.join(&format!("{s},{s}")))
    }

    proptest! {
        /// Every selector the apimachinery grammar generates is accepted.
        #[test]
        fn grammatical_selectors_are_accepted(sel in selector()) {
            prop_assert!(check(&sel).is_ok(), "{:?}: {:?}", sel, check(&sel));
        }

        /// A character no selector may hold (outside a value's or key's alphabet and the
        /// operators), put into a grammatical selector, makes it refused; refusals are one line.
        #[test]
        fn a_foreign_character_is_refused(sel in selector(), at in any::<prop::sample::Index>(), bad in prop::sample::select(vec!['@', '#', '$', '%', '&', '*', ';', '"', '\'', '\\', '\u{a0}', '\u{2003}', 'é', '{', '}', '[', ']', '?', '~', '+', ':', '`'])) {
            let at = at.index(sel.len() + 1);
            let broken = format!("{}{bad}{}", &sel[..at], &sel[at..]);
            let refusal = check(&broken);
            prop_assert!(refusal.is_err(), "{:?} accepted", broken);
            prop_assert!(!refusal.unwrap_err().to_string().contains('\n'));
        }

        /// Whatever the input, the check never panics.
        #[test]
        fn never_panics(text in "[a-z0-9!=<>(), ./_-]{0,30}|\\PC{0,20}") {
            let _ = check(&text);
        }
    }
}
