//! A secondary network seen from inside a real guest: the guest has a second card, and every
//! MAC the platform reports for the VM's interfaces (KubeVirt's VMI `status.interfaces`,
//! Deckhouse's VM `status.networks`) is a card the guest's kernel lists.

use crate::common::*;
use crate::real_guest::ssh;

/// The MACs the platform reports for `vm`, read with kubectl.
fn reported_macs(env: &Env, vm: &str, kubevirt: bool) -> Vec<String> {
    let (resource, path) = if kubevirt {
        (
            "virtualmachineinstances.kubevirt.io",
            "{.status.interfaces[*].mac}",
        )
    } else {
        (
            "virtualmachines.virtualization.deckhouse.io",
            "{.status.networks[*].macAddress}",
        )
    };
    let out = env.kubectl(&["get", resource, vm, "-o", &format!("jsonpath={path}")]);
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out).split_whitespace().map(str::to_owned).collect()
}

/// The guest's ethernet cards as (name, MAC), from sysfs.
pub(crate) fn guest_cards(env: &Env, vm: &str) -> Vec<(String, String)> {
    let out = ssh(
        env,
        &[
            vm,
            "--",
            "for d in /sys/class/net/*; do [ \"$(cat $d/type)\" = 1 ] && echo \"${d##*/} $(cat $d/address)\"; done; true",
        ],
    );
    stdout(&out)
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(n, m)| (n.to_owned(), m.to_owned()))
        .collect()
}

/// The guest has two cards, and each MAC the platform reports is one of them. Returns the
/// cards.
pub(crate) fn second_card_is_seen(
    env: &Env,
    flavor: &str,
    vm: &str,
    kubevirt: bool,
) -> Vec<(String, String)> {
    let cards = guest_cards(env, vm);
    let reported = reported_macs(env, vm, kubevirt);
    assert_eq!(cards.len(), 2, "two cards in the guest: {cards:?}");
    assert!(!reported.is_empty(), "the platform reports MACs");
    for mac in &reported {
        assert!(
            cards.iter().any(|(_, m)| m == mac),
            "reported MAC {mac} is not in the guest: {cards:?}"
        );
    }
    eprintln!("[{flavor}] the guest's cards {cards:?}, reported MACs {reported:?}");
    cards
}
