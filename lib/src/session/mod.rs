//! Who else is connected to a VM's console or VNC, and the decision whether to take it over.
//!
//! Deckhouse tracks stream holders itself and answers a `?probe=true` GET with a
//! `VirtualMachineSession` ([`deckhouse`]). KubeVirt has nothing alike, so `kubectl vm` keeps a
//! coordination.k8s.io Lease per VM and stream kind while connected ([`kubevirt`]). The decision
//! table follows d8's `session.Check` (Deckhouse FACTS §2.1).

pub mod deckhouse;
pub mod kubevirt;

use jiff::Timestamp;

use crate::cluster::Cluster;
use crate::stream::StreamKind;

/// Someone holding a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// Kubernetes user name (`system:serviceaccount:ns:sa` for service accounts).
    pub user: String,
    /// When they connected, if known.
    pub since: Option<Timestamp>,
    /// Their client (`User-Agent` on Deckhouse, the client annotation of our Lease).
    pub client: String,
    /// An identifier of their session, to tell two sessions of one user apart.
    pub session: String,
}

/// What to do before connecting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Connect without a word.
    Connect,
    /// Connect and warn on stderr (nobody to ask): the message.
    ConnectWarning(String),
    /// Ask the user, showing the holder.
    Ask(Holder),
}

/// d8's decision table: `--force` connects; no holder or ourselves connects; off a terminal
/// connect with a warning; otherwise ask.
pub fn decide(
    force: bool,
    holder: Option<&Holder>,
    me: Option<&str>,
    interactive: bool,
    kind: &StreamKind,
    vm: &str,
    now: Timestamp,
) -> Decision {
    let Some(holder) = holder.filter(|h| !force && !h.user.is_empty()) else {
        return Decision::Connect;
    };
    if me == Some(holder.user.as_str()) {
        return Decision::Connect;
    }
    if !interactive {
        return Decision::ConnectWarning(format!(
            "Warning: disconnecting {} from the {} of {vm}, connected {}.",
            describe_user(&holder.user),
            describe_kind(kind),
            when(holder.since, now)
        ));
    }
    Decision::Ask(holder.clone())
}

/// An answer to the take-over question.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Connect, displacing the holder.
    Yes,
    /// Leave it alone (also Enter: the safe answer is the default).
    No,
    /// Wait until the holder leaves, then connect.
    Wait,
    /// Not understood: ask again.
    Again,
}

/// Reads an answer (`y|yes`, `` |n|no``, `w|wait`, any case).
pub fn parse_answer(text: &str) -> Answer {
    match text.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" => Answer::Yes,
        "" | "n" | "no" => Answer::No,
        "w" | "wait" => Answer::Wait,
        _ => Answer::Again,
    }
}

/// The question, as d8 words it (Deckhouse user guide, "Connecting to a virtual machine").
pub fn question(holder: &Holder, kind: &StreamKind, vm: &str, now: Timestamp) -> String {
    format!(
        "\nThe {} of {vm} is in use:\n  user       {}\n  connected  {}{}\n\nConnect and disconnect them? [y] yes  [N] no  [w] wait until free: ",
        describe_kind(kind),
        describe_user(&holder.user),
        when(holder.since, now),
        from(&holder.client)
    )
}

/// `serial console` or `VNC`.
pub fn describe_kind(kind: &StreamKind) -> &'static str {
    match kind {
        StreamKind::Vnc => "VNC",
        _ => "serial console",
    }
}

/// `system:serviceaccount:ns:sa` → `serviceaccount ns/sa`; other users as they are.
pub fn describe_user(user: &str) -> String {
    match user.strip_prefix("system:serviceaccount:") {
        Some(rest) => match rest.split_once(':') {
            Some((ns, sa)) => format!("serviceaccount {ns}/{sa}"),
            None => user.to_owned(),
        },
        None => user.to_owned(),
    }
}

/// `N seconds ago (HH:MM)`, `N minutes ago (HH:MM)`, `N.N hours ago (HH:MM)`, or
/// `at an unknown time`. The clock time is local.
pub fn when(since: Option<Timestamp>, now: Timestamp) -> String {
    let Some(since) = since else {
        return "at an unknown time".into();
    };
    let secs = (now.as_second() - since.as_second()).max(0);
    let ago = if secs < 60 {
        format!("{secs} seconds ago")
    } else if secs < 3600 {
        format!("{} minutes ago", secs / 60)
    } else {
        format!("{:.1} hours ago", secs as f64 / 3600.0)
    };
    let clock = since
        .to_zoned(jiff::tz::TimeZone::system())
        .strftime("%H:%M")
        .to_string();
    format!("{ago} ({clock})")
}

/// `, from the d8 v command line` and the like, from the holder's client.
pub fn from(client: &str) -> String {
    let product = client.split('/').next().unwrap_or("");
    match product {
        "d8" => ", from the d8 v command line".into(),
        "kubectl-vm" => ", from the kubectl vm command line".into(),
        "console" => ", from the web console".into(),
        "" => String::new(),
        _ => {
            let printable: String = client.chars().filter(|c| !c.is_control()).collect();
            let short: String = printable.chars().take(60).collect();
            let ellipsis = if printable.chars().count() > 60 {
                "…"
            } else {
                ""
            };
            format!(", from another client ({short}{ellipsis})")
        }
    }
}

/// The user the cluster sees us as (a SelfSubjectReview), `None` if it cannot tell.
pub async fn whoami(cluster: &Cluster) -> Option<String> {
    let body = serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "SelfSubjectReview",
    });
    let request = http::Request::post("/apis/authentication.k8s.io/v1/selfsubjectreviews")
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(serde_json::to_vec(&body).ok()?)
        .ok()?;
    let review: serde_json::Value = cluster.client.request(request).await.ok()?;
    review
        .pointer("/status/userInfo/username")
        .and_then(|u| u.as_str())
        .map(str::to_owned)
}

/// Who holds the stream now, per platform. Errors mean "unknown" (connect, as d8 does).
pub async fn holder(cluster: &Cluster, target: &crate::stream::StreamTarget) -> Option<Holder> {
    match target.flavor {
        crate::Flavor::Deckhouse => deckhouse::probe(cluster, target).await.ok().flatten(),
        crate::Flavor::KubeVirt => kubevirt::current(cluster, target).await.ok().flatten(),
    }
}

#[cfg(test)]
mod tests;
