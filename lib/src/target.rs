//! The target syntax every command shares, checked before any request:
//! `NAME`, `NAME.NAMESPACE` (split at the last dot, so dotted VM names still work as
//! `db.primary.prod`), `vm/NAME`, `vmi/NAME`, virtctl's `vm/NAME/NAMESPACE`, and `USER@…` for
//! ssh-like commands.

use std::fmt;

use crate::error::{Error, Result};

/// Which object the target names. VMs and their instances share names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetKind {
    /// A VirtualMachine (the default).
    Vm,
    /// A VirtualMachineInstance (KubeVirt's running instance).
    Vmi,
}

/// A parsed target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// VM or VMI.
    pub kind: TargetKind,
    /// Object name.
    pub name: String,
    /// Namespace given in the target itself.
    pub namespace: Option<String>,
    /// Login user (`USER@…`), only where the command allows it.
    pub user: Option<String>,
}

impl Target {
    /// Parse a target. `allow_user` permits the `USER@` prefix (ssh-like commands).
    pub fn parse(text: &str, allow_user: bool) -> Result<Target> {
        let bad = |why: &str| Error::InvalidTarget(format!("invalid target {text:?}: {why}"));
        let (user, rest) = match text.split_once('@') {
            Some(_) if !allow_user => {
                return Err(bad("a USER@ prefix is only accepted by ssh-like commands"));
            }
            Some(("", _)) => return Err(bad("expected a user name before '@'")),
            Some((user, rest)) => {
                if user
                    .chars()
                    .any(|c| c.is_whitespace() || c == '/' || c == ':')
                {
                    return Err(bad("the user name may not contain spaces, '/' or ':'"));
                }
                (Some(user.to_owned()), rest)
            }
            None => (None, text),
        };
        if rest.is_empty() {
            return Err(bad("expected a VM name, e.g. web, web.prod or vm/web/prod"));
        }
        let (kind, name, namespace) = match rest.split_once('/') {
            Some((prefix, tail)) => {
                let kind = match prefix {
                    "vm" | "vms" | "virtualmachine" | "virtualmachines" => TargetKind::Vm,
                    "vmi" | "vmis" | "virtualmachineinstance" | "virtualmachineinstances" => {
                        TargetKind::Vmi
                    }
                    other => {
                        return Err(bad(&format!(
                            "unknown kind {other:?}; use vm/NAME or vmi/NAME"
                        )));
                    }
                };
                match tail.split('/').collect::<Vec<_>>()[..] {
                    [name] => (kind, name, None),
                    [name, namespace] => (kind, name, Some(namespace)),
                    _ => return Err(bad("too many '/'; use vm/NAME or vm/NAME/NAMESPACE")),
                }
            }
            None => match rest.rsplit_once('.') {
                Some((name, namespace)) => (TargetKind::Vm, name, Some(namespace)),
                None => (TargetKind::Vm, rest, None),
            },
        };
        validate_name(name).map_err(|why| bad(&why))?;
        // KubeVirt and Deckhouse VM names are DNS labels: a longer name names no VM.
        if name.len() > 63 {
            return Err(bad(&format!(
                "the name is {} characters long; a VM name is at most 63",
                name.len()
            )));
        }
        if let Some(namespace) = namespace {
            validate_namespace(namespace).map_err(|e| bad(&e.to_string()))?;
        }
        Ok(Target {
            kind,
            name: name.to_owned(),
            namespace: namespace.map(str::to_owned),
            user,
        })
    }

    /// The namespace to use: the target's own, else the cluster's (`-n` or the context's).
    /// A target namespace that disagrees with an explicit `-n` is an error.
    pub fn namespace_in(&self, cluster_namespace: &str, from_flag: bool) -> Result<String> {
        match &self.namespace {
            Some(ns) if from_flag && ns != cluster_namespace => Err(Error::InvalidTarget(format!(
                "target {self} names namespace {ns:?} but -n says {cluster_namespace:?}; drop one of them"
            ))),
            Some(ns) => Ok(ns.clone()),
            None => Ok(cluster_namespace.to_owned()),
        }
    }
}

/// A pool target, `pool/NAME[/NAMESPACE]` (also `vmpool/…`, `virtualmachinepool/…`), for the
/// commands that act on a pool made by `create --replicas`: the target with the pool's name,
/// or `None` when `text` names no pool.
pub fn parse_pool(text: &str) -> Result<Option<Target>> {
    let Some((prefix, rest)) = text.split_once('/') else {
        return Ok(None);
    };
    if !matches!(
        prefix,
        "pool" | "pools" | "vmpool" | "vmpools" | "virtualmachinepool" | "virtualmachinepools"
    ) {
        return Ok(None);
    }
    Target::parse(&format!("vm/{rest}"), false)
        .map(Some)
        .map_err(|e| match e {
            Error::InvalidTarget(m) => Error::InvalidTarget(m.replace(&format!("vm/{rest}"), text)),
            other => other,
        })
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(user) = &self.user {
            write!(f, "{user}@")?;
        }
        let kind = match self.kind {
            TargetKind::Vm => "vm",
            TargetKind::Vmi => "vmi",
        };
        write!(f, "{kind}/{}", self.name)?;
        if let Some(ns) = &self.namespace {
            write!(f, "/{ns}")?;
        }
        Ok(())
    }
}

/// Check an object name: a DNS-1123 subdomain (lower-case letters, digits, '-' and '.',
/// starting and ending alphanumeric, at most 253 characters).
pub fn validate_name(name: &str) -> std::result::Result<(), String> {
    if name.is_empty() {
        return Err("the name is empty".into());
    }
    if name.len() > 253 {
        return Err(format!(
            "the name is {} characters long; the limit is 253",
            name.len()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-' || *c == '.'))
    {
        return Err(format!(
            "{c:?} is not allowed in a name; use lower-case letters, digits, '-' and '.'"
        ));
    }
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !alnum(name.chars().next()) || !alnum(name.chars().last()) {
        return Err("a name must start and end with a letter or digit".into());
    }
    Ok(())
}

/// Check a namespace name: a DNS-1123 label (at most 63 characters, no dots).
pub fn validate_namespace(namespace: &str) -> Result<()> {
    let bad = |why: String| Error::InvalidTarget(format!("invalid namespace {namespace:?}: {why}"));
    if namespace.contains('.') {
        return Err(bad("a namespace may not contain '.'".into()));
    }
    if namespace.len() > 63 {
        return Err(bad(format!(
            "{} characters long; the limit is 63",
            namespace.len()
        )));
    }
    validate_name(namespace).map_err(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Target {
        Target::parse(text, true).unwrap()
    }

    #[test]
    fn pool_targets() {
        let t = parse_pool("pool/web").unwrap().unwrap();
        assert_eq!((t.name.as_str(), t.namespace), ("web", None));
        let t = parse_pool("vmpool/web/prod").unwrap().unwrap();
        assert_eq!(
            (t.name.as_str(), t.namespace.as_deref()),
            ("web", Some("prod"))
        );
        assert_eq!(parse_pool("web").unwrap(), None);
        assert_eq!(parse_pool("vm/web").unwrap(), None);
        let err = parse_pool("pool/Web").unwrap_err().to_string();
        assert!(err.starts_with("invalid target \"pool/Web\""), "{err}");
    }

    #[test]
    fn plain_name() {
        let t = parse("web");
        assert_eq!(
            (t.kind, t.name.as_str(), t.namespace),
            (TargetKind::Vm, "web", None)
        );
    }

    #[test]
    fn dotted_splits_at_the_last_dot() {
        let t = parse("db.primary.prod");
        assert_eq!(
            (t.name.as_str(), t.namespace.as_deref()),
            ("db.primary", Some("prod"))
        );
        let t = parse("web.prod");
        assert_eq!(
            (t.name.as_str(), t.namespace.as_deref()),
            ("web", Some("prod"))
        );
    }

    #[test]
    fn kind_prefixes_and_virtctl_namespace() {
        let t = parse("vmi/web");
        assert_eq!((t.kind, t.name.as_str()), (TargetKind::Vmi, "web"));
        let t = parse("vm/db.primary/prod");
        assert_eq!(
            (t.name.as_str(), t.namespace.as_deref()),
            ("db.primary", Some("prod"))
        );
        let t = parse("vm/db.primary");
        assert_eq!((t.name.as_str(), t.namespace), ("db.primary", None));
    }

    #[test]
    fn user_prefix() {
        let t = parse("alice@vm/web/prod");
        assert_eq!(t.user.as_deref(), Some("alice"));
        assert_eq!(t.to_string(), "alice@vm/web/prod");
        let err = Target::parse("alice@web", false).unwrap_err();
        assert!(
            err.to_string()
                .contains("only accepted by ssh-like commands")
        );
    }

    #[test]
    fn bad_targets_say_why() {
        for (text, why) in [
            ("", "expected a VM name"),
            ("@web", "expected a user name"),
            ("Web", "'W' is not allowed"),
            ("web.", "the name is empty"),
            (".prod", "the name is empty"),
            ("pod/web", "unknown kind \"pod\""),
            ("vm/a/b/c", "too many '/'"),
            ("web_1", "'_' is not allowed"),
            ("-web", "start and end"),
        ] {
            let err = Target::parse(text, true).unwrap_err().to_string();
            assert!(err.contains(why), "{text:?}: {err}");
        }
    }

    #[test]
    fn namespace_flag_must_agree() {
        let t = parse("web.prod");
        assert_eq!(t.namespace_in("prod", true).unwrap(), "prod");
        assert_eq!(t.namespace_in("default", false).unwrap(), "prod");
        let err = t.namespace_in("dev", true).unwrap_err().to_string();
        assert!(
            err.contains("names namespace \"prod\" but -n says \"dev\""),
            "{err}"
        );
        assert_eq!(parse("web").namespace_in("dev", true).unwrap(), "dev");
    }

    #[test]
    fn namespace_rules() {
        assert!(validate_namespace("prod").is_ok());
        assert!(validate_namespace("a.b").is_err());
        assert!(validate_namespace(&"x".repeat(64)).is_err());
    }
}

/// Properties of the target syntax (issue 37): run with `PROPTEST_CASES=100000 cargo test -p
/// kubevm --lib target::properties` for a long run.
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    /// DNS-1123 as the Kubernetes docs state it ("Object Names and IDs"), written here
    /// independently of `validate_name`: a subdomain is dot-separated labels of `[a-z0-9-]`
    /// that start and end alphanumeric, at most 253 characters.
    fn is_dns_subdomain(s: &str) -> bool {
        !s.is_empty()
            && s.len() <= 253
            && s.split('.').all(|label| {
                !label.is_empty()
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !label.starts_with('-')
                    && !label.ends_with('-')
            })
    }

    fn label() -> impl Strategy<Value = String> {
        "[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?"
    }

    fn name() -> impl Strategy<Value = String> {
        prop::collection::vec(label(), 1..4).prop_map(|l| l.join("."))
    }

    /// Text made of the target syntax's own characters, so that most cases hit a rule.
    fn target_like() -> impl Strategy<Value = String> {
        "[a-zA-Z0-9./@:_ -]{0,40}"
    }

    proptest! {
        /// Whatever the input, parsing never panics, and an accepted target names a DNS name
        /// of at most 63 characters in a DNS-label namespace.
        #[test]
        fn accepted_targets_name_kubernetes_objects(text in target_like(), user in any::<bool>()) {
            if let Ok(t) = Target::parse(&text, user) {
                prop_assert!(is_dns_subdomain(&t.name) && t.name.len() <= 63, "{t:?}");
                if let Some(ns) = &t.namespace {
                    prop_assert!(is_dns_subdomain(ns) && !ns.contains('.') && ns.len() <= 63, "{t:?}");
                }
                prop_assert!(user || t.user.is_none());
            }
        }

        /// Printing a target and parsing it back gives the same target.
        #[test]
        fn display_round_trips(name in name(), ns in proptest::option::of(label()), vmi in any::<bool>(), user in proptest::option::of("[a-z][a-z0-9_]{0,8}")) {
            prop_assume!(name.len() <= 63);
            let t = Target {
                kind: if vmi { TargetKind::Vmi } else { TargetKind::Vm },
                name,
                namespace: ns,
                user,
            };
            prop_assert_eq!(Target::parse(&t.to_string(), true).unwrap(), t);
        }

        /// `NAME.NAMESPACE` splits at the last dot: the namespace is the last label and the
        /// name is all before it, so dotted names in another namespace stay reachable.
        #[test]
        fn dotted_form_splits_at_the_last_dot(name in name(), ns in label()) {
            prop_assume!(name.len() <= 63);
            let t = Target::parse(&format!("{name}.{ns}"), false).unwrap();
            prop_assert_eq!((t.name, t.namespace), (name, Some(ns)));
        }
    }
}
