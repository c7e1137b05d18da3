//! `kubectl vm get NAME`: one VM in detail, or its object with `-o yaml|json`.

use std::io::Write;

use clap::Args;
use clap_complete::engine::ArgValueCompleter;
use kubevm::api::Kind;
use kubevm::target::Target;
use kubevm::vm::{self, VmDetails};

use crate::complete;
use crate::error::{CommandError, CommandResult};
use crate::flags::GlobalArgs;
use crate::render::{self, NONE, OutputFormat, Table, cell};

/// Arguments of `get`.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  kubectl vm get web\n  kubectl vm get web.prod -o yaml\n  kubectl vm get vm/db.primary/prod"
)]
pub struct GetArgs {
    /// The VM: NAME, NAME.NAMESPACE, vm/NAME[/NAMESPACE] or vmi/NAME[/NAMESPACE]
    #[arg(value_name = "VM", add = ArgValueCompleter::new(complete::vm_names))]
    pub target: String,

    /// Output format (yaml, json or name; default: a description)
    #[arg(short, long, value_parser = output_parser())]
    pub output: Option<OutputFormat>,

    /// With -o yaml|json, keep metadata.managedFields (hidden by default, as kubectl does)
    #[arg(long)]
    pub show_managed_fields: bool,
}

/// The `-o` values of `get`: `wide` is accepted only to be refused with a pointer to
/// `list -o wide`, so it is not offered.
fn output_parser() -> impl clap::builder::TypedValueParser<Value = OutputFormat> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new([
        PossibleValue::new("yaml").help("YAML"),
        PossibleValue::new("json").help("JSON"),
        PossibleValue::new("name").help("kind.group/name only"),
        PossibleValue::new("wide").hide(true),
    ])
    .map(|value| {
        <OutputFormat as clap::ValueEnum>::from_str(&value, false)
            .expect("every value offered is an output format")
    })
}

pub async fn cmd_get(global: &GlobalArgs, args: GetArgs) -> CommandResult {
    if args.output == Some(OutputFormat::Wide) {
        return Err(CommandError::usage(
            "-o wide is a table format and get describes one VM; use `kubectl vm list -o wide` for the table, or -o yaml|json|name",
        ));
    }
    let target = Target::parse(&args.target, false)?;
    // Connecting reads only local files: the target is checked against -n before any request.
    let cluster = kubevm::cluster::Cluster::connect(&global.connect_options()).await?;
    let namespace = target.namespace_in(&cluster.namespace, cluster.namespace_from_flag)?;
    let platform = kubevm::flavor::discover(&cluster, global.flavor_choice()).await?;
    let details = vm::get(&cluster, &platform, &target, &namespace).await?;
    let mut out = std::io::stdout().lock();
    match args.output {
        Some(format @ (OutputFormat::Yaml | OutputFormat::Json)) => {
            let mut object = details.summary.object.clone();
            if !args.show_managed_fields {
                render::without_managed_fields(&mut object);
            }
            render::write_object(&mut out, &object, format)?;
        }
        Some(OutputFormat::Name) => {
            writeln!(
                out,
                "{}",
                Kind::vm(platform.flavor).object_ref(&details.summary.name)
            )?;
        }
        Some(OutputFormat::Wide) | None => describe(&mut out, &details, jiff::Timestamp::now())?,
    }
    Ok(())
}

fn describe(out: &mut dyn Write, d: &VmDetails, now: jiff::Timestamp) -> std::io::Result<()> {
    let s = &d.summary;
    let yes_no = |v: Option<bool>, yes: &str, no: &str| match v {
        Some(true) => yes.to_owned(),
        Some(false) => no.to_owned(),
        None => NONE.to_owned(),
    };
    let created = match s.created {
        Some(t) => format!(
            "{} ({} ago)",
            t.strftime("%Y-%m-%dT%H:%M:%SZ"),
            render::age(Some(t), now)
        ),
        None => NONE.to_owned(),
    };
    let mut fields = vec![
        ("Name", s.name.clone()),
        ("Namespace", s.namespace.clone()),
        ("Platform", d.flavor.display_name().to_owned()),
        ("Status", s.status.clone()),
        ("Node", cell(s.node.as_ref())),
        ("IP", cell(s.ip.as_ref())),
        ("Created", created),
        ("CPU", cell(s.cpu.as_ref())),
        ("Memory", cell(s.memory.as_ref())),
        ("Run strategy", cell(s.run_strategy.as_ref())),
        ("Guest agent", yes_no(s.agent, "connected", "not connected")),
        ("Migratable", yes_no(s.migratable, "yes", "no")),
        ("Guest OS", cell(d.guest_os.as_ref())),
        ("SSH trust", cell(d.ssh_trust.as_ref())),
    ];
    // Placement lines only where the VM has them; why it is not scheduled, when it is not.
    fields.extend(d.placement.iter().cloned());
    if let Some(why) = &d.unschedulable {
        fields.push(("Unschedulable", why.clone()));
    }
    let width = fields
        .iter()
        .map(|(label, _)| label.len() + 2)
        .max()
        .unwrap_or(0)
        .max(14);
    for (label, value) in fields {
        writeln!(out, "{:<width$}{value}", format!("{label}:"))?;
    }
    section(
        out,
        "Interfaces",
        &["NAME", "TYPE", "MAC", "IPS", "STATE"],
        d.interfaces.iter().map(|i| {
            let ips = (!i.ips.is_empty()).then(|| i.ips.join(","));
            vec![
                i.name.clone(),
                i.network.clone(),
                cell(i.mac.as_ref()),
                cell(ips.as_ref()),
                i.state.clone(),
            ]
        }),
    )?;
    section(
        out,
        "Disks",
        &["NAME", "SOURCE", "SIZE", "IMPORT"],
        d.disks.iter().map(|disk| {
            // The import as `create --wait` shows it: phase and percent.
            let import = disk.import.as_ref().map(|i| match i.percent {
                Some(p) => format!("{} {p:.0}%", i.phase),
                None => i.phase.clone(),
            });
            vec![
                disk.name.clone(),
                disk.source.clone(),
                cell(disk.size.as_ref()),
                cell(import.as_ref()),
            ]
        }),
    )?;
    section(
        out,
        "Conditions",
        &["TYPE", "STATUS", "REASON", "MESSAGE"],
        d.conditions.iter().map(|c| {
            vec![
                c.type_.clone(),
                c.status.clone(),
                cell(c.reason.as_ref()),
                c.message.clone().unwrap_or_default(),
            ]
        }),
    )?;
    section(
        out,
        "Events",
        &["TYPE", "REASON", "AGE", "MESSAGE"],
        d.events.iter().map(|e| {
            vec![
                e.type_.clone(),
                e.reason.clone(),
                render::age(e.last_seen, now),
                e.message.clone(),
            ]
        }),
    )
}

fn section(
    out: &mut dyn Write,
    title: &str,
    headers: &[&str],
    rows: impl Iterator<Item = Vec<String>>,
) -> std::io::Result<()> {
    let mut table = Table::new(headers);
    let mut empty = true;
    for row in rows {
        table.push(row);
        empty = false;
    }
    if empty {
        return writeln!(
            out,
            "{title}:{:<width$}{NONE}",
            "",
            width = 13 - title.len()
        );
    }
    writeln!(out, "{title}:")?;
    let mut body = Vec::new();
    table.write(&mut body, true)?;
    for line in String::from_utf8_lossy(&body).lines() {
        writeln!(out, "  {line}")?;
    }
    Ok(())
}
