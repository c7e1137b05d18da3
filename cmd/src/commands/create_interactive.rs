//! `kubectl vm create -i`: ask for what the flags did not say (image, disk size, CPU, memory,
//! SSH key), then show the objects and ask before creating them. Prompts go to stderr.

use std::path::PathBuf;

use dialoguer::{Input, Select};
use kubevm::create::Manifests;
use kubevm::quantity::Quantity;

use super::create::CreateArgs;
use crate::error::{CommandError, CommandResult};

/// Well-known container disk images offered first.
const IMAGES: [(&str, &str); 5] = [
    ("quay.io/containerdisks/ubuntu:24.04", "Ubuntu 24.04 LTS"),
    ("quay.io/containerdisks/debian:12", "Debian 12"),
    ("quay.io/containerdisks/fedora:42", "Fedora 42"),
    ("quay.io/containerdisks/centos-stream:9", "CentOS Stream 9"),
    (
        "quay.io/containerdisks/opensuse-leap:15.6",
        "openSUSE Leap 15.6",
    ),
];

fn prompt_error(err: dialoguer::Error) -> CommandError {
    match err {
        dialoguer::Error::IO(e) if e.kind() == std::io::ErrorKind::Interrupted => {
            CommandError::Interrupted
        }
        dialoguer::Error::IO(e) => CommandError::Failed(format!("reading the answer: {e}")),
    }
}

/// Ask for the missing inputs and store the answers in `args`.
pub fn ask(args: &mut CreateArgs) -> CommandResult {
    let no_boot_source = args.image.is_none()
        && args.url.is_none()
        && args.clone_pvc.is_none()
        && args.blank.is_none()
        && args.disk.is_none();
    if no_boot_source {
        let mut items: Vec<String> = IMAGES
            .iter()
            .map(|(image, name)| format!("{name:<20} {image}"))
            .collect();
        items.push("Other image (type a reference)".into());
        let choice = Select::new()
            .with_prompt("Boot image")
            .items(&items)
            .default(0)
            .interact()
            .map_err(prompt_error)?;
        args.image = Some(match IMAGES.get(choice) {
            Some((image, _)) => (*image).to_owned(),
            None => Input::<String>::new()
                .with_prompt("Container disk image")
                .validate_with(|v: &String| {
                    if v.trim().is_empty() {
                        Err("give an image reference")
                    } else {
                        Ok(())
                    }
                })
                .interact_text()
                .map_err(prompt_error)?,
        });
    }
    if args.disk_size.is_none() && (args.image.is_some() || args.url.is_some()) && !args.ephemeral {
        args.disk_size = Some(ask_size("Boot disk size", "10Gi")?);
    }
    if args.cpu.is_none() && args.instancetype.is_none() {
        let cores: String = Input::new()
            .with_prompt("CPU cores")
            .default("1".to_owned())
            .validate_with(|v: &String| {
                kubevm::validate::cpu_cores(v)
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            })
            .interact_text()
            .map_err(prompt_error)?;
        args.cpu = Some(cores);
    }
    if args.memory.is_none() && args.instancetype.is_none() {
        args.memory = Some(ask_size("Memory", "2Gi")?);
    }
    if args.ssh_key.is_empty() {
        let keys = local_public_keys();
        if !keys.is_empty() {
            let mut items: Vec<String> = keys.iter().map(|k| k.display().to_string()).collect();
            items.push("No SSH key".into());
            let choice = Select::new()
                .with_prompt("SSH public key for the image's default user")
                .items(&items)
                .default(0)
                .interact()
                .map_err(prompt_error)?;
            if let Some(key) = keys.get(choice) {
                args.ssh_key.push(key.clone());
            }
        }
    }
    Ok(())
}

fn ask_size(prompt: &str, default: &str) -> CommandResult<String> {
    Input::new()
        .with_prompt(prompt)
        .default(default.to_owned())
        .validate_with(|v: &String| v.parse::<Quantity>().map(|_| ()).map_err(|e| e.to_string()))
        .interact_text()
        .map_err(prompt_error)
}

/// `~/.ssh/*.pub`, sorted.
fn local_public_keys() -> Vec<PathBuf> {
    let Some(dir) = std::env::home_dir().map(|h| h.join(".ssh")) else {
        return Vec::new();
    };
    let mut keys: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "pub"))
                .collect()
        })
        .unwrap_or_default();
    keys.sort();
    keys
}

/// Show the objects and ask whether to create them (default: no).
pub async fn confirm(manifests: &Manifests) -> CommandResult<bool> {
    eprintln!("\n{}", super::create::preview(manifests));
    crate::prompt::confirm(&format!(
        "Create these {} objects?",
        manifests.objects.len()
    ))
    .await
}
