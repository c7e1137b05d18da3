//! `kubectl vm instancetype list`, `preference list` (KubeVirt) and `class list` (Deckhouse):
//! the sizes VMs are created with, as lists.

use std::io::Write;

use clap::{Args, Subcommand};
use kubevm::sizes::{self, Size};

use crate::error::{CommandError, CommandResult};
use crate::flags::GlobalArgs;
use crate::render::{self, OutputFormat, Table, age, cell};

/// Arguments of `instancetype`.
#[derive(Debug, Args)]
#[command(
    after_help = "KubeVirt: VirtualMachineClusterInstancetypes (cluster-wide) and VirtualMachineInstancetypes\n(the namespace's, or every namespace's with -A), with the guest CPUs and memory they give.\nUse one with `kubectl vm create --instancetype NAME`.\n\nExamples:\n  kubectl vm instancetype list\n  kubectl vm instancetype list -A -o yaml"
)]
pub struct InstancetypeArgs {
    #[command(subcommand)]
    pub command: ListOnly,
}

/// Arguments of `preference`.
#[derive(Debug, Args)]
#[command(
    after_help = "KubeVirt: VirtualMachineClusterPreferences and VirtualMachinePreferences, with what each sets\n(preferred disk bus, firmware, CPU topology, …). Use one with `kubectl vm create --preference NAME`.\n\nExamples:\n  kubectl vm preference list\n  kubectl vm preference list -A -o wide"
)]
pub struct PreferenceArgs {
    #[command(subcommand)]
    pub command: ListOnly,
}

/// Arguments of `class`.
#[derive(Debug, Args)]
#[command(
    after_help = "Deckhouse: VirtualMachineClasses with their CPU type, sizing policies (cores, memory, core\nfractions) and which is the default. Use one with `kubectl vm create --class NAME`.\n\nExamples:\n  kubectl vm class list\n  kubectl vm class list -o yaml"
)]
pub struct ClassArgs {
    #[command(subcommand)]
    pub command: ListOnly,
}

/// The one subcommand of these lists.
#[derive(Debug, Subcommand)]
pub enum ListOnly {
    /// List them
    List(ListArgs),
}

/// Arguments of `instancetype|preference|class list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Namespaced ones of all namespaces (cluster-wide ones are always listed)
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,

    /// Output format: wide, yaml, json or name instead of the table
    #[arg(short = 'o', long, value_enum, value_name = "FORMAT")]
    pub output: Option<OutputFormat>,

    /// Do not print the header row
    #[arg(long)]
    pub no_headers: bool,
}

#[derive(Clone, Copy, PartialEq)]
enum What {
    Instancetype,
    Preference,
    Class,
}

pub async fn cmd_instancetype(global: &GlobalArgs, args: InstancetypeArgs) -> CommandResult {
    let ListOnly::List(a) = args.command;
    list(global, a, What::Instancetype).await
}

pub async fn cmd_preference(global: &GlobalArgs, args: PreferenceArgs) -> CommandResult {
    let ListOnly::List(a) = args.command;
    list(global, a, What::Preference).await
}

pub async fn cmd_class(global: &GlobalArgs, args: ClassArgs) -> CommandResult {
    let ListOnly::List(a) = args.command;
    list(global, a, What::Class).await
}

fn scope_word(s: &Size) -> &'static str {
    if s.kind.namespaced {
        "namespaced"
    } else {
        "cluster"
    }
}

async fn list(global: &GlobalArgs, args: ListArgs, what: What) -> CommandResult {
    if args.all_namespaces && global.namespace.is_some() {
        return Err(CommandError::usage(
            "-A/--all-namespaces and -n/--namespace cannot be used together",
        ));
    }
    let (cluster, platform) = crate::connect::connect(global).await?;
    let ns = (!args.all_namespaces).then(|| cluster.namespace.clone());
    let rows = match what {
        What::Instancetype => {
            sizes::instancetypes(&cluster, platform.flavor, ns.as_deref()).await?
        }
        What::Preference => sizes::preferences(&cluster, platform.flavor, ns.as_deref()).await?,
        What::Class => sizes::classes(&cluster, platform.flavor).await?,
    };
    let mut out = std::io::stdout().lock();
    match args.output {
        Some(f @ (OutputFormat::Yaml | OutputFormat::Json)) => {
            let items = rows
                .into_iter()
                .map(|r| {
                    let mut o = r.object;
                    render::without_managed_fields(&mut o);
                    o
                })
                .collect();
            render::write_object(&mut out, &render::list_object(items), f)?;
            return Ok(());
        }
        Some(OutputFormat::Name) => {
            for r in &rows {
                writeln!(out, "{}", r.kind.object_ref(&r.name))?;
            }
            return Ok(());
        }
        _ => {}
    }
    if rows.is_empty() {
        eprintln!("No resources found.");
        return Ok(());
    }
    let wide = args.output == Some(OutputFormat::Wide);
    let now = jiff::Timestamp::now();
    let some = |s: &str| cell(Some(s).filter(|s| !s.is_empty()));
    let mut headers = vec![];
    if what != What::Class {
        headers.push("NAMESPACE");
    }
    headers.push("NAME");
    headers.extend(match what {
        What::Instancetype => vec!["SCOPE", "CPU", "MEMORY", "AGE"],
        What::Preference => vec!["SCOPE", "SETS", "AGE"],
        What::Class => vec!["DEFAULT", "CPU TYPE", "PHASE", "SIZING POLICIES", "AGE"],
    });
    let mut table = Table::new(&headers);
    for r in &rows {
        let mut row = vec![];
        if what != What::Class {
            row.push(some(&r.namespace));
        }
        row.push(r.name.clone());
        let joined = if wide || r.sets.len() <= 2 {
            r.sets.join("; ")
        } else {
            format!(
                "{}; … ({} more, -o wide)",
                r.sets[..2].join("; "),
                r.sets.len() - 2
            )
        };
        match what {
            What::Instancetype => row.extend([
                scope_word(r).into(),
                some(&r.cpu),
                some(&r.memory),
                age(r.created.parse().ok(), now),
            ]),
            What::Preference => row.extend([
                scope_word(r).into(),
                some(&joined),
                age(r.created.parse().ok(), now),
            ]),
            What::Class => row.extend([
                r.default.to_string(),
                some(&r.cpu),
                some(&r.phase),
                some(&joined),
                age(r.created.parse().ok(), now),
            ]),
        }
        table.push(row);
    }
    table.write(&mut out, !args.no_headers)?;
    Ok(())
}
