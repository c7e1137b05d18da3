//! Checking a Deckhouse VM's cores, memory and core fraction against the `sizingPolicies` of
//! its VirtualMachineClass before creating it, reporting every violation at once in the
//! wording Deckhouse uses.

use serde_json::Value;
use thiserror::Error;

use super::plan::{CoreFraction, VmPlan};
use crate::quantity::Quantity;

const HINT: &str = "check the sizing policy of the VirtualMachineClass or contact the administrator for more information";

/// The VM does not fit its class, or the class cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SizingError {
    /// The class's sizing policies are malformed.
    #[error("VirtualMachineClass {class:?} has an unreadable sizing policy: {reason}")]
    Malformed {
        /// Class name.
        class: String,
        /// What is wrong.
        reason: String,
    },
    /// The VM breaks the policy; `reasons` holds every violation.
    #[error("{}", render(class, reasons))]
    Violations {
        /// Class name.
        class: String,
        /// One entry per violation, in Deckhouse's wording.
        reasons: Vec<String>,
    },
}

fn render(class: &str, reasons: &[String]) -> String {
    match reasons {
        [one] => format!("{one}; {HINT}"),
        many => {
            let list: Vec<String> = many
                .iter()
                .enumerate()
                .map(|(i, r)| format!("({}) {r}", i + 1))
                .collect();
            format!(
                "does not match the sizing policy of VirtualMachineClass {class:?} for several reasons: {}; {HINT}",
                list.join("; ")
            )
        }
    }
}

/// Memory bounds of a policy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryPolicy {
    /// Least total memory.
    pub min: Option<Quantity>,
    /// Most total memory.
    pub max: Option<Quantity>,
    /// Grid step (per core when `per_core` is set).
    pub step: Option<Quantity>,
    /// Least memory per core.
    pub per_core_min: Option<Quantity>,
    /// Most memory per core.
    pub per_core_max: Option<Quantity>,
}

impl MemoryPolicy {
    fn has_per_core(&self) -> bool {
        self.per_core_min.is_some() || self.per_core_max.is_some()
    }
}

/// One entry of `spec.sizingPolicies`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizingPolicy {
    /// Least cores this policy applies to.
    pub cores_min: u32,
    /// Most cores this policy applies to.
    pub cores_max: u32,
    /// Core-count grid step from `cores_min`.
    pub cores_step: Option<u32>,
    /// Memory bounds.
    pub memory: MemoryPolicy,
    /// Allowed core fractions in percent; empty means any.
    pub core_fractions: Vec<u8>,
}

/// Read `spec.sizingPolicies` of a VirtualMachineClass object (v1alpha2 or v1alpha3).
pub fn policies(class: &Value) -> Result<Vec<SizingPolicy>, SizingError> {
    let name = class["metadata"]["name"].as_str().unwrap_or_default();
    let malformed = |reason: String| SizingError::Malformed {
        class: name.to_string(),
        reason,
    };
    let Some(items) = class["spec"]["sizingPolicies"].as_array() else {
        return Ok(Vec::new());
    };
    items
        .iter()
        .enumerate()
        .map(|(i, p)| parse_policy(p).map_err(|e| malformed(format!("policy {}: {e}", i + 1))))
        .collect()
}

fn parse_policy(p: &Value) -> Result<SizingPolicy, String> {
    let int = |v: &Value, what: &str| -> Result<Option<u32>, String> {
        match v {
            Value::Null => Ok(None),
            v => v
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| format!("{what} is not a whole number")),
        }
    };
    let quantity = |v: &Value, what: &str| -> Result<Option<Quantity>, String> {
        match v {
            Value::Null => Ok(None),
            Value::Number(n) => n
                .as_u64()
                .map(|b| Some(Quantity::from_bytes(b)))
                .ok_or_else(|| format!("{what} is negative")),
            Value::String(s) => Quantity::parse(s)
                .map(Some)
                .map_err(|e| format!("{what}: {e}")),
            _ => Err(format!("{what} is not a quantity")),
        }
    };
    let cores = &p["cores"];
    let memory = &p["memory"];
    let core_fractions = match &p["coreFractions"] {
        Value::Null => Vec::new(),
        Value::Array(items) => items
            .iter()
            .map(|f| {
                let parsed = match f {
                    Value::Number(n) => n.as_u64().and_then(|n| u8::try_from(n).ok()),
                    Value::String(s) => s.trim_end_matches('%').parse().ok(),
                    _ => None,
                };
                parsed.ok_or_else(|| format!("core fraction {f} is not a percentage"))
            })
            .collect::<Result<_, _>>()?,
        _ => return Err("coreFractions is not a list".into()),
    };
    Ok(SizingPolicy {
        cores_min: int(&cores["min"], "cores.min")?.ok_or("cores.min is missing")?,
        cores_max: int(&cores["max"], "cores.max")?.ok_or("cores.max is missing")?,
        cores_step: int(&cores["step"], "cores.step")?.filter(|s| *s > 0),
        memory: MemoryPolicy {
            min: quantity(&memory["min"], "memory.min")?,
            max: quantity(&memory["max"], "memory.max")?,
            step: quantity(&memory["step"], "memory.step")?.filter(|s| s.bytes() > 0),
            per_core_min: quantity(&memory["perCore"]["min"], "memory.perCore.min")?,
            per_core_max: quantity(&memory["perCore"]["max"], "memory.perCore.max")?,
        },
        core_fractions,
    })
}

/// The nearest grid points `base + k*step` below and above `value`, kept within `[lo, hi]`.
fn grid_neighbours(value: u64, base: u64, step: u64, lo: u64, hi: u64) -> Vec<u64> {
    let below = base + value.saturating_sub(base) / step * step;
    let above = below + step;
    [below, above]
        .into_iter()
        .filter(|v| *v >= lo.max(base) && *v <= hi)
        .collect()
}

fn or_list<T: ToString>(items: &[T]) -> String {
    items
        .iter()
        .map(T::to_string)
        .collect::<Vec<_>>()
        .join(" or ")
}

/// `between A and B` / `to at least A` / `to at most B`.
fn bounds(min: Option<Quantity>, max: Option<Quantity>) -> String {
    match (min, max) {
        (Some(a), Some(b)) => format!("between {a} and {b}"),
        (Some(a), None) => format!("to at least {a}"),
        (None, Some(b)) => format!("to at most {b}"),
        (None, None) => String::new(),
    }
}

fn out_of(value: Quantity, min: Option<Quantity>, max: Option<Quantity>) -> bool {
    min.is_some_and(|m| value < m) || max.is_some_and(|m| value > m)
}

/// Check cores, memory and an explicit core fraction against the class's policies.
pub fn check(
    class: &str,
    policies: &[SizingPolicy],
    cores: u32,
    memory: Quantity,
    core_fraction: Option<CoreFraction>,
) -> Result<(), SizingError> {
    if policies.is_empty() {
        return Ok(());
    }
    let violations = |reasons: Vec<String>| SizingError::Violations {
        class: class.to_string(),
        reasons,
    };
    let Some(policy) = policies
        .iter()
        .find(|p| (p.cores_min..=p.cores_max).contains(&cores))
    else {
        let ranges: Vec<String> = policies
            .iter()
            .map(|p| format!("{}-{}", p.cores_min, p.cores_max))
            .collect();
        return Err(violations(vec![format!(
            "does not match any sizing policy of VirtualMachineClass {class:?}: its {cores} CPU core(s) fall outside the allowed ranges ({}); set the number of cores (spec.cpu.cores) accordingly",
            ranges.join(", ")
        )]));
    };
    let mut reasons = Vec::new();
    if let Some(step) = policy.cores_step
        && !(cores - policy.cores_min).is_multiple_of(step)
    {
        let options = grid_neighbours(
            cores.into(),
            policy.cores_min.into(),
            step.into(),
            0,
            policy.cores_max.into(),
        );
        reasons.push(format!(
            "the number of CPU cores ({cores}) does not match the sizing policy step; set the number of cores (spec.cpu.cores) to {}",
            or_list(&options)
        ));
    }
    if let Some(CoreFraction::Percent(p)) = core_fraction
        && !policy.core_fractions.is_empty()
        && !policy.core_fractions.contains(&p)
    {
        let allowed: Vec<String> = policy
            .core_fractions
            .iter()
            .map(|f| format!("{f}%"))
            .collect();
        reasons.push(format!(
            "the CPU core fraction \"{p}%\" is not allowed; set the core fraction (spec.cpu.coreFraction) to one of: {}",
            allowed.join(", ")
        ));
    }
    reasons.extend(memory_reasons(&policy.memory, cores, memory));
    if reasons.is_empty() {
        Ok(())
    } else {
        Err(violations(reasons))
    }
}

fn memory_reasons(policy: &MemoryPolicy, cores: u32, memory: Quantity) -> Vec<String> {
    let mut reasons = Vec::new();
    let per_core =
        |q: Option<Quantity>| q.map(|q| Quantity::from_bytes(q.bytes() * u64::from(cores)));
    let (pc_min, pc_max) = (per_core(policy.per_core_min), per_core(policy.per_core_max));
    let mut in_range = true;
    if out_of(memory, policy.min, policy.max) {
        in_range = false;
        reasons.push(format!(
            "the memory size ({memory}) is out of the range allowed by the sizing policy; set the memory size (spec.memory.size) {}",
            bounds(policy.min, policy.max)
        ));
    }
    if out_of(memory, pc_min, pc_max) {
        in_range = false;
        let per = bounds(policy.per_core_min, policy.per_core_max);
        let per = per.strip_prefix("to ").unwrap_or(&per);
        reasons.push(format!(
            "the memory size ({memory}) is not allowed for {cores} CPU core(s); set the memory size (spec.memory.size) {}, or change the number of cores (spec.cpu.cores) (the sizing policy allows {per} of memory per core)",
            bounds(pc_min, pc_max)
        ));
    }
    let Some(step) = policy.step.filter(|_| in_range) else {
        return reasons;
    };
    if policy.has_per_core() {
        let base = pc_min.map_or(0, Quantity::bytes);
        let step = step.bytes() * u64::from(cores);
        if !(memory.bytes() - base.min(memory.bytes())).is_multiple_of(step) {
            let hi = pc_max.map_or(u64::MAX, Quantity::bytes);
            let options = grid_neighbours(memory.bytes(), base, step, 0, hi);
            reasons.push(format!(
                "the memory size ({memory}) does not match the per-core sizing policy step for {cores} CPU core(s); set the memory size (spec.memory.size) to {}, or change the number of cores (spec.cpu.cores)",
                or_list(&options.into_iter().map(Quantity::from_bytes).collect::<Vec<_>>())
            ));
        }
    } else {
        let base = policy.min.map_or(0, Quantity::bytes);
        if !(memory.bytes() - base.min(memory.bytes())).is_multiple_of(step.bytes()) {
            let hi = policy.max.map_or(u64::MAX, Quantity::bytes);
            let options = grid_neighbours(memory.bytes(), base, step.bytes(), 0, hi);
            reasons.push(format!(
                "the memory size ({memory}) does not match the sizing policy step; set the memory size (spec.memory.size) to {}",
                or_list(&options.into_iter().map(Quantity::from_bytes).collect::<Vec<_>>())
            ));
        }
    }
    reasons
}

/// Check a Deckhouse plan against the VirtualMachineClass object it names.
pub fn check_plan(plan: &VmPlan, class: &Value) -> Result<(), SizingError> {
    let policies = policies(class)?;
    check(
        plan.class_name(),
        &policies,
        plan.cores(),
        plan.memory_size(),
        plan.core_fraction,
    )
}

#[cfg(test)]
mod tests;
