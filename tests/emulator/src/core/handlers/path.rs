//! Request URLs as the API server's RequestInfo reads them.

/// A parsed resource URL (`/apis/G/V[/namespaces/NS]/PLURAL[/NAME[/SUB…]]`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResourcePath {
    /// API group ("" for `/api`).
    pub group: String,
    /// Version.
    pub version: String,
    /// Namespace, if the URL has one.
    pub namespace: Option<String>,
    /// Plural resource ("" for the group/version discovery URL).
    pub plural: String,
    /// Object name, if any.
    pub name: Option<String>,
    /// Subresource path segments (`status`, `log`, `portforward/22/tcp`, …).
    pub sub: Vec<String>,
}

/// Parses a resource URL; None for non-resource URLs.
pub fn parse_path(path: &str) -> Option<ResourcePath> {
    let segs: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return None,
    };
    let mut rp = ResourcePath {
        group: group.into(),
        version: version.into(),
        ..Default::default()
    };
    let mut rest: Vec<&str> = rest.to_vec();
    // Same rule as k8s.io/apiserver's RequestInfoFactory: "namespaces/X/…" scopes the rest,
    // except the namespace's own subresources (status, finalize).
    if rest.first() == Some(&"namespaces") && rest.len() > 1 {
        rp.namespace = Some(rest[1].to_string());
        if rest.len() > 2 && !matches!(rest[2], "status" | "finalize") {
            rest.drain(0..2);
        } else {
            rp.namespace = None;
        }
    }
    if let Some(p) = rest.first() {
        rp.plural = p.to_string();
    }
    if let Some(n) = rest.get(1) {
        rp.name = Some(n.to_string());
    }
    rp.sub = rest.iter().skip(2).map(|s| s.to_string()).collect();
    Some(rp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_info() {
        let rp =
            parse_path("/apis/kubevirt.io/v1/namespaces/prod/virtualmachines/db.primary").unwrap();
        assert_eq!(
            (
                rp.group.as_str(),
                rp.namespace.as_deref(),
                rp.plural.as_str(),
                rp.name.as_deref()
            ),
            (
                "kubevirt.io",
                Some("prod"),
                "virtualmachines",
                Some("db.primary")
            )
        );
        let rp = parse_path("/api/v1/namespaces/dev").unwrap();
        assert_eq!(
            (rp.namespace, rp.plural.as_str(), rp.name.as_deref()),
            (None, "namespaces", Some("dev"))
        );
        let rp = parse_path("/api/v1/namespaces/dev/status").unwrap();
        assert_eq!(
            (rp.plural.as_str(), rp.name.as_deref(), rp.sub),
            ("namespaces", Some("dev"), vec!["status".to_string()])
        );
        let rp = parse_path("/api/v1/namespaces/dev/pods/p/log").unwrap();
        assert_eq!(
            (rp.namespace.as_deref(), rp.plural.as_str(), rp.sub),
            (Some("dev"), "pods", vec!["log".to_string()])
        );
        let rp = parse_path("/apis/kubevirt.io/v1/virtualmachines").unwrap();
        assert_eq!((rp.namespace, rp.name), (None, None));
        assert!(parse_path("/version").is_none());
    }
}
