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

/// KubeVirt: the static address `--ip storage=ADDRESS/PREFIX` put into the network data is on
/// the guest's card with the storage interface's MAC (the VM spec's).
pub(crate) fn static_address_is_on_its_card(env: &Env, vm: &str, address: &str) {
    let out = env.kubectl(&[
        "get",
        "virtualmachines.kubevirt.io",
        vm,
        "-o",
        "jsonpath={.spec.template.spec.domain.devices.interfaces[?(@.name==\"storage\")].macAddress}",
    ]);
    let mac = stdout(&out).trim().to_owned();
    assert!(!mac.is_empty(), "{}", stderr(&out));
    let card = guest_cards(env, vm)
        .into_iter()
        .find(|(_, m)| *m == mac)
        .map(|(name, _)| name)
        .unwrap_or_else(|| panic!("no card with MAC {mac}"));
    let out = ssh(
        env,
        &[vm, "--", "ip", "-4", "-o", "addr", "show", "dev", &card],
    );
    let text = stdout(&out);
    assert!(
        text.split_whitespace().any(|w| w == address),
        "{address} not on {card}: {text} {}",
        stderr(&out)
    );
}

fn wait_cards(env: &Env, vm: &str, count: usize) -> Vec<(String, String)> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let cards = guest_cards(env, vm);
        if cards.len() == count {
            return cards;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{count} cards expected in the guest: {cards:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
}

/// `set network --add` puts a card into the running guest (KubeVirt through the interface's
/// migration, Deckhouse at once) with the MAC the platform then reports; `--remove` takes it
/// out again.
pub(crate) fn plug_and_unplug(env: &Env, flavor: &str, vm: &str, kubevirt: bool) {
    let (add, remove) = if kubevirt {
        crate::network::nad(env, "backup");
        ("backup", "backup")
    } else {
        ("clusternetwork/corp-net", "corp-net")
    };
    let t = std::time::Instant::now();
    ok(env.vm(&["set", "network", vm, "--add", add]));
    let cards = wait_cards(env, vm, 3);
    let reported = reported_macs(env, vm, kubevirt);
    for mac in &reported {
        assert!(
            cards.iter().any(|(_, m)| m == mac),
            "{mac} not in {cards:?}"
        );
    }
    eprintln!(
        "[{flavor}] set network --add {add}: a third card in the guest {:.1}s later",
        t.elapsed().as_secs_f64()
    );
    let t = std::time::Instant::now();
    ok(env.vm(&["set", "network", vm, "--remove", remove]));
    wait_cards(env, vm, 2);
    eprintln!(
        "[{flavor}] set network --remove {remove}: the card gone {:.1}s later",
        t.elapsed().as_secs_f64()
    );
}
