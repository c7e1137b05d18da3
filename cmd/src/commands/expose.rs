//! `kubectl vm expose VM --port P[:TARGET][/PROTO]`: a Service in front of a VM's ports.

use std::io::Write;

use clap::{Args, ValueEnum};
use clap_complete::engine::ArgValueCompleter;
use kubevm::expose::{self, DryRun as LibDryRun, ExposeRequest, PortSpec, Protocol, ServiceType};
use kubevm::lifecycle::VmRef;
use kubevm::target::{Target, TargetKind};

use crate::complete;
use crate::error::{CommandError, CommandResult};
use crate::flags::DryRun;
use crate::flags::GlobalArgs;
use crate::render::OutputFormat;

/// Arguments of `expose`.
#[derive(Debug, Args)]
#[command(
    after_help = "The Service selects the VM's pod by the label its platform sets (KubeVirt vm.kubevirt.io/name,\nDeckhouse vm.kubevirt.internal.virtualization.deckhouse.io/name), is owned by the VM (deleted\nwith it) and is created with create semantics: an existing Service of that name is left alone.\n--port is PORT[:TARGET][/PROTOCOL]; TARGET is a guest port number or a container port name.\n\nExamples:\n  kubectl vm expose web --port 80:8080\n  kubectl vm expose web --port 22 --type NodePort --node-port 30022 --name web-ssh\n  kubectl vm expose dns --port 53/udp --port 53/tcp\n  kubectl vm expose web --port 443 --type LoadBalancer -o yaml"
)]
pub struct ExposeArgs {
    /// The VM: NAME, NAME.NAMESPACE or vm/NAME[/NAMESPACE]
    #[arg(value_name = "VM", add = ArgValueCompleter::new(complete::vm_names))]
    pub target: String,

    /// A port to expose: PORT[:TARGET][/PROTOCOL] (repeatable)
    #[arg(long = "port", value_name = "PORT[:TARGET][/PROTO]", required = true)]
    pub ports: Vec<String>,

    /// The Service's name (default: the VM's)
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,

    /// The Service's type
    #[arg(
        long = "type",
        value_enum,
        default_value = "ClusterIP",
        ignore_case = true
    )]
    pub service_type: TypeArg,

    /// The guest port of a single --port (same as PORT:TARGET)
    #[arg(long, value_name = "PORT|NAME")]
    pub target_port: Option<String>,

    /// The protocol of a single --port (same as PORT/PROTOCOL)
    #[arg(long, value_enum, ignore_case = true)]
    pub protocol: Option<ProtocolArg>,

    /// The name of a single --port
    #[arg(long, value_name = "NAME")]
    pub port_name: Option<String>,

    /// The node port of a single --port (NodePort, LoadBalancer; default: the server picks one)
    #[arg(long, value_name = "PORT")]
    pub node_port: Option<u16>,

    /// A fixed cluster IP, or None for a headless Service
    #[arg(long, value_name = "IP|None")]
    pub cluster_ip: Option<String>,

    /// An external IP the cluster routes to the Service (repeatable)
    #[arg(long = "external-ip", value_name = "IP")]
    pub external_ips: Vec<String>,

    /// Only show what would be done: client (send nothing) or server (checked, not stored)
    #[arg(long, value_enum, value_name = "STRATEGY", num_args = 0..=1, require_equals = true, default_missing_value = "client")]
    pub dry_run: Option<DryRun>,

    /// Output format of the result (default: a sentence)
    #[arg(short = 'o', long, value_enum, value_name = "FORMAT")]
    pub output: Option<ServiceFormat>,
}

/// `--type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TypeArg {
    /// A cluster-internal virtual IP
    #[value(name = "ClusterIP")]
    ClusterIp,
    /// The cluster IP plus a port on every node
    #[value(name = "NodePort")]
    NodePort,
    /// A node port plus the cluster's external load balancer
    #[value(name = "LoadBalancer")]
    LoadBalancer,
}

/// `--protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProtocolArg {
    /// TCP
    #[value(name = "TCP")]
    Tcp,
    /// UDP
    #[value(name = "UDP")]
    Udp,
    /// SCTP
    #[value(name = "SCTP")]
    Sctp,
}

/// `-o` of expose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ServiceFormat {
    /// service/NAME
    Name,
    /// The Service as JSON
    Json,
    /// The Service as YAML
    Yaml,
}

fn request(args: &ExposeArgs, vm: VmRef) -> CommandResult<ExposeRequest> {
    let mut ports = args
        .ports
        .iter()
        .map(|p| PortSpec::parse(p))
        .collect::<Result<Vec<_>, _>>()?;
    let single = args.target_port.is_some()
        || args.protocol.is_some()
        || args.port_name.is_some()
        || args.node_port.is_some();
    if single {
        let [port] = ports.as_mut_slice() else {
            return Err(CommandError::usage(
                "--target-port, --protocol, --port-name and --node-port apply to a single --port; with several, write PORT:TARGET/PROTOCOL",
            ));
        };
        if let Some(t) = &args.target_port {
            port.target = Some(
                expose::parse_target(t)
                    .map_err(|e| CommandError::usage(format!("--target-port: {e}")))?,
            );
        }
        if let Some(p) = args.protocol {
            port.protocol = match p {
                ProtocolArg::Tcp => Protocol::Tcp,
                ProtocolArg::Udp => Protocol::Udp,
                ProtocolArg::Sctp => Protocol::Sctp,
            };
        }
        port.name = args.port_name.clone();
        if let Some(n) = args.node_port {
            if n == 0 {
                return Err(CommandError::usage("--node-port must be 1-65535"));
            }
            port.node_port = Some(n);
        }
    }
    let request = ExposeRequest {
        vm,
        service_name: args.name.clone(),
        ports,
        service_type: match args.service_type {
            TypeArg::ClusterIp => ServiceType::ClusterIP,
            TypeArg::NodePort => ServiceType::NodePort,
            TypeArg::LoadBalancer => ServiceType::LoadBalancer,
        },
        cluster_ip: args.cluster_ip.clone(),
        external_ips: args.external_ips.clone(),
    };
    request.validate()?;
    Ok(request)
}

/// Run `expose`.
pub async fn cmd_expose(global: &GlobalArgs, args: ExposeArgs) -> CommandResult {
    let target = Target::parse(&args.target, false)?;
    if target.kind == TargetKind::Vmi {
        return Err(CommandError::usage(format!(
            "target {target}: expose works on virtual machines; use vm/{}",
            target.name
        )));
    }
    if let Some(flag) = global.namespace.as_deref() {
        target.namespace_in(flag, true)?;
    }
    // Everything checkable before connecting: the namespace comes later, so a stand-in first.
    request(
        &args,
        VmRef {
            namespace: String::new(),
            name: target.name.clone(),
        },
    )?;
    let (cluster, platform) = crate::connect::connect(global).await?;
    let namespace = target.namespace_in(&cluster.namespace, cluster.namespace_from_flag)?;
    let request = request(
        &args,
        VmRef {
            namespace: namespace.clone(),
            name: target.name.clone(),
        },
    )?;
    let dry_run = match args.dry_run.unwrap_or(DryRun::None) {
        DryRun::None => LibDryRun::None,
        DryRun::Client => LibDryRun::Client,
        DryRun::Server => LibDryRun::Server,
    };
    let outcome = expose::expose(&cluster, platform.flavor, &request, dry_run).await?;
    let mut out = std::io::stdout().lock();
    match args.output {
        Some(ServiceFormat::Name) => writeln!(out, "{}", outcome.object_ref)?,
        Some(format) => crate::render::write_object(
            &mut out,
            &outcome.service,
            if format == ServiceFormat::Json {
                OutputFormat::Json
            } else {
                OutputFormat::Yaml
            },
        )?,
        None => writeln!(
            out,
            "{}",
            sentence(&outcome.service, &outcome.object_ref, dry_run)
        )?,
    }
    Ok(())
}

/// `service/web exposed: ClusterIP 10.96.3.4, 80→8080/TCP` (node ports after a colon).
fn sentence(svc: &serde_json::Value, object_ref: &str, dry_run: LibDryRun) -> String {
    let spec = &svc["spec"];
    let ports: Vec<String> = spec["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            let target = match &p["targetPort"] {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            let node = p["nodePort"]
                .as_u64()
                .map(|n| format!(" (node port {n})"))
                .unwrap_or_default();
            format!(
                "{}→{target}/{}{node}",
                p["port"],
                p["protocol"].as_str().unwrap_or("TCP")
            )
        })
        .collect();
    let ip = spec["clusterIP"].as_str().unwrap_or("");
    let dry = match dry_run {
        LibDryRun::Client => " (dry run)",
        LibDryRun::Server => " (server dry run)",
        LibDryRun::None => "",
    };
    format!(
        "{object_ref} exposed{dry}: {}{}, {}",
        spec["type"].as_str().unwrap_or("ClusterIP"),
        if ip.is_empty() {
            String::new()
        } else {
            format!(" {ip}")
        },
        ports.join(", ")
    )
}
