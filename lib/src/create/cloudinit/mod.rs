//! The cloud-init user data of a new VM: the platform part (see [`platform`]) merged with the
//! user's own `--cloud-init` data, never replacing it.

mod merge;
pub mod platform;

use thiserror::Error;
use yaml_serde::Value;

use crate::create::plan::{OsType, VmPlan};
use merge::UserFormat;

/// Longest user data both platforms accept inline; larger data must come from a Secret.
pub const INLINE_LIMIT: usize = 2048;

/// User data that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CloudInitError {
    /// `#cloud-config` that is not valid YAML.
    #[error("--cloud-init data is not valid YAML at line {line}, column {column}: {message}")]
    Yaml {
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The parser's message, one line.
        message: String,
    },
    /// `#cloud-config` whose top level is not a mapping.
    #[error("--cloud-init data must be a YAML mapping (key: value lines) after #cloud-config")]
    NotAMapping,
    /// Data that cloud-init would not recognise.
    #[error(
        "--cloud-init data starts with {first_line:?}: start it with #cloud-config, #!, #include or #cloud-boothook, or give a MIME multipart archive"
    )]
    UnknownFormat {
        /// The start of the first line.
        first_line: String,
    },
    /// A `#cloud-config` key the platform also sets, given a value of another shape (a string
    /// for `bootcmd`'s list): merged, it would replace the platform's part (the guest's
    /// trust in the CA, its host key) instead of adding to it.
    #[error(
        "--cloud-init data: {key:?} must be {expected}, as cloud-init's schema says (e.g. {example})"
    )]
    Shape {
        /// The top-level key.
        key: String,
        /// "a list" or "a mapping".
        expected: &'static str,
        /// A value of the right shape.
        example: &'static str,
    },
}

/// Finished user data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserData {
    /// The text handed to cloud-init.
    pub text: String,
    /// Whether it holds a password or a private key.
    pub contains_secrets: bool,
}

impl UserData {
    /// Whether it must be delivered through a Secret rather than inline: it is larger than
    /// [`INLINE_LIMIT`] bytes or holds secrets.
    pub fn needs_secret(&self) -> bool {
        self.contains_secrets || self.text.len() > INLINE_LIMIT
    }
}

fn render(doc: &Value) -> String {
    let yaml = yaml_serde::to_string(doc).expect("a YAML value always serialises");
    format!("#cloud-config\n{yaml}")
}

/// Build the user data for `plan`, or `None` when there is nothing to configure.
///
/// Linux guests get the platform cloud-config; a user `#cloud-config` is merged into it
/// (lists appended, the user's keys win on conflicts), any other user data is combined with it
/// in a MIME multipart archive. Windows guests get the user's data unchanged.
///
/// User data read from `--user-data-secret` is always delivered through a Secret.
pub fn build(plan: &VmPlan) -> Result<Option<UserData>, CloudInitError> {
    let mut data = build_text(plan)?;
    if let Some(data) = data.as_mut() {
        // `--env` values are often credentials, and a VM's spec is readable by many more
        // people than its Secrets: user data that carries them always goes through a Secret.
        data.contains_secrets |= plan.guest.user_data_from_secret || !plan.guest.env.is_empty();
    }
    Ok(data)
}

fn build_text(plan: &VmPlan) -> Result<Option<UserData>, CloudInitError> {
    let user = plan
        .guest
        .user_data
        .as_deref()
        .filter(|text| !text.trim().is_empty());
    if plan.os == OsType::Windows {
        return Ok(user.map(|text| UserData {
            text: text.to_string(),
            contains_secrets: merge::text_has_secrets(text),
        }));
    }
    let Some(text) = user else {
        let platform = Value::Mapping(platform::platform_config(plan, false));
        return Ok((!is_empty(&platform)).then(|| UserData {
            contains_secrets: merge::has_secrets(&platform),
            text: render(&platform),
        }));
    };
    let format = merge::classify(text)?;
    if format == UserFormat::CloudConfig {
        let config = merge::parse_cloud_config(text)?;
        let users_given = config.contains_key("users");
        let platform = platform::platform_config(plan, users_given);
        let config = merge::same_shapes(&platform, config)?;
        let mut merged = Value::Mapping(platform);
        merge::merge(&mut merged, Value::Mapping(config));
        return Ok(Some(UserData {
            contains_secrets: merge::has_secrets(&merged),
            text: render(&merged),
        }));
    }
    let platform = Value::Mapping(platform::platform_config(plan, false));
    if is_empty(&platform) {
        return Ok(Some(UserData {
            text: text.to_string(),
            contains_secrets: merge::text_has_secrets(text),
        }));
    }
    Ok(Some(UserData {
        contains_secrets: merge::text_has_secrets(text) || merge::has_secrets(&platform),
        text: merge::multipart(text, format, &render(&platform)),
    }))
}

fn is_empty(doc: &Value) -> bool {
    doc.as_mapping().is_some_and(|m| m.is_empty())
}

#[cfg(test)]
mod properties;
#[cfg(test)]
mod tests;
