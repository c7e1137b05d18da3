use super::*;

fn alice(since: &str) -> Holder {
    Holder {
        user: "system:serviceaccount:default:alice".into(),
        since: Some(since.parse().unwrap()),
        client: "d8".into(),
        session: "x".into(),
    }
}

fn now() -> Timestamp {
    "2026-11-30T14:44:00Z".parse().unwrap()
}

// The decision table of d8's `session.Check` (Deckhouse FACTS §2.1).
#[test]
fn decision_table() {
    let h = alice("2026-11-30T14:32:00Z");
    let c = StreamKind::Console;
    assert_eq!(
        decide(true, Some(&h), Some("bob"), true, &c, "linux-vm", now()),
        Decision::Connect
    );
    assert_eq!(
        decide(false, None, Some("bob"), true, &c, "linux-vm", now()),
        Decision::Connect
    );
    assert_eq!(
        decide(
            false,
            Some(&h),
            Some("system:serviceaccount:default:alice"),
            true,
            &c,
            "linux-vm",
            now()
        ),
        Decision::Connect
    );
    assert_eq!(
        decide(false, Some(&h), Some("bob"), false, &c, "linux-vm", now()),
        Decision::ConnectWarning(format!(
            "Warning: disconnecting serviceaccount default/alice from the serial console of linux-vm, connected 12 minutes ago ({}).",
            clock("2026-11-30T14:32:00Z")
        ))
    );
    assert_eq!(
        decide(false, Some(&h), Some("bob"), true, &c, "linux-vm", now()),
        Decision::Ask(h)
    );
}

fn clock(t: &str) -> String {
    t.parse::<Timestamp>()
        .unwrap()
        .to_zoned(jiff::tz::TimeZone::system())
        .strftime("%H:%M")
        .to_string()
}

#[test]
fn answers() {
    assert_eq!(parse_answer("y\n"), Answer::Yes);
    assert_eq!(parse_answer("YES"), Answer::Yes);
    assert_eq!(parse_answer("\n"), Answer::No);
    assert_eq!(parse_answer("n"), Answer::No);
    assert_eq!(parse_answer("no"), Answer::No);
    assert_eq!(parse_answer("w"), Answer::Wait);
    assert_eq!(parse_answer("wait"), Answer::Wait);
    assert_eq!(parse_answer("maybe"), Answer::Again);
}

// The prompt as the Deckhouse user guide shows it.
#[test]
fn question_matches_the_user_guide() {
    let q = question(
        &alice("2026-11-30T14:32:00Z"),
        &StreamKind::Console,
        "linux-vm",
        now(),
    );
    assert_eq!(
        q,
        format!(
            "\nThe serial console of linux-vm is in use:\n  user       serviceaccount default/alice\n  connected  12 minutes ago ({}), from the d8 v command line\n\nConnect and disconnect them? [y] yes  [N] no  [w] wait until free: ",
            clock("2026-11-30T14:32:00Z")
        )
    );
    let q = question(
        &alice("2026-11-30T14:43:30Z"),
        &StreamKind::Vnc,
        "web",
        now(),
    );
    assert!(q.starts_with("\nThe VNC of web is in use:\n"), "{q}");
    assert!(q.contains("30 seconds ago"), "{q}");
}

#[test]
fn durations_users_and_clients() {
    assert_eq!(when(None, now()), "at an unknown time");
    let t = "2026-11-30T12:14:00Z";
    assert_eq!(
        when(Some(t.parse().unwrap()), now()),
        format!("2.5 hours ago ({})", clock(t))
    );
    assert_eq!(describe_user("alice"), "alice");
    assert_eq!(from("console"), ", from the web console");
    assert_eq!(
        from("kubectl-vm/0.1.0"),
        ", from the kubectl vm command line"
    );
    assert_eq!(from("curl/8.5"), ", from another client (curl/8.5)");
    let long = "x".repeat(70);
    assert_eq!(
        from(&long),
        format!(", from another client ({}…)", "x".repeat(60))
    );
}
