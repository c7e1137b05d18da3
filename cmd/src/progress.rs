//! Disk import progress while waiting for a VM: progress bars on a terminal, one plain line
//! per change otherwise (logs and CI keep a readable record). Also the "waiting for …" spinner
//! that export and upload show while the platform prepares.

use std::collections::BTreeMap;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use kubevm::wait::Snapshot;

/// "waiting for MESSAGE": a spinner on a terminal (made on first use in `spinner`), else a line.
pub fn waiting(terminal: bool, spinner: &mut Option<ProgressBar>, message: &str) {
    if terminal {
        let spinner = spinner.get_or_insert_with(|| {
            let s = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            s.enable_steady_tick(std::time::Duration::from_millis(120));
            s
        });
        spinner.set_message(format!("waiting for {message}"));
    } else {
        eprintln!("waiting for {message}");
    }
}

/// Renders [`Snapshot`]s on stderr.
pub struct DiskProgress {
    bars: Option<(MultiProgress, BTreeMap<String, ProgressBar>)>,
    last_lines: BTreeMap<String, String>,
}

impl DiskProgress {
    /// Bars when `terminal`, lines otherwise.
    pub fn new(terminal: bool) -> Self {
        let bars = terminal.then(|| {
            (
                MultiProgress::with_draw_target(ProgressDrawTarget::stderr()),
                BTreeMap::new(),
            )
        });
        DiskProgress {
            bars,
            last_lines: BTreeMap::new(),
        }
    }

    /// Show the state of VM `vm` and its disks.
    pub fn update(&mut self, vm: &str, snapshot: &Snapshot) {
        match &mut self.bars {
            Some((multi, bars)) => {
                for disk in &snapshot.disks {
                    let bar = bars.entry(disk.name.clone()).or_insert_with(|| {
                        let bar = multi.add(ProgressBar::new(1000));
                        bar.set_style(
                            ProgressStyle::with_template(
                                "{prefix:>20} [{bar:30}] {percent:>3}% {msg}",
                            )
                            .expect("valid template")
                            .progress_chars("=> "),
                        );
                        bar.set_prefix(disk.name.clone());
                        bar
                    });
                    bar.set_position((disk.percent.unwrap_or(0.0) * 10.0) as u64);
                    bar.set_message(disk.phase.clone());
                }
                let _ = multi.println(format!("virtualmachine {vm}: {}", snapshot.vm_status));
            }
            None => {
                let mut lines = vec![(
                    vm.to_owned(),
                    format!("virtualmachine {vm}: {}", snapshot.vm_status),
                )];
                for disk in &snapshot.disks {
                    let percent = disk
                        .percent
                        .map(|p| format!(" {p:.0}%"))
                        .unwrap_or_default();
                    lines.push((
                        disk.name.clone(),
                        format!("disk {}: {}{percent}", disk.name, disk.phase),
                    ));
                }
                for (key, line) in lines {
                    if self.last_lines.get(&key) != Some(&line) {
                        eprintln!("{line}");
                        self.last_lines.insert(key, line);
                    }
                }
            }
        }
    }

    /// Leave the bars in their final state.
    pub fn finish(&mut self) {
        if let Some((_, bars)) = &self.bars {
            for bar in bars.values() {
                bar.finish();
            }
        }
    }
}
