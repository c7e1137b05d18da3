//! Progress of lifecycle actions on stderr: on a terminal a spinner per VM showing its phase
//! (a bar for migrations), otherwise one plain line per change.

use std::collections::BTreeMap;
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use kubevm::lifecycle::{Action, Done, DryRun, Event, Options, VmRef};

/// Spinner frames (also what the pty test looks for).
pub const SPINNER: &str = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏ ";

/// Renders [`Event`]s.
pub struct Renderer {
    multi: Option<MultiProgress>,
    bars: BTreeMap<VmRef, ProgressBar>,
    last: BTreeMap<VmRef, String>,
    migration: bool,
    bulk: bool,
    verb: &'static str,
}

/// `1m 4s`, `14s`.
pub fn human(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 60 {
        format!("{}m {}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

impl Renderer {
    /// Spinners and bars when `terminal`, lines otherwise.
    pub fn new(terminal: bool, migration: bool, bulk: bool) -> Self {
        Renderer {
            multi: terminal.then(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr())),
            bars: BTreeMap::new(),
            last: BTreeMap::new(),
            migration,
            bulk,
            verb: "",
        }
    }

    fn label(&self, vm: &VmRef) -> String {
        if self.bulk {
            vm.to_string()
        } else {
            vm.name.clone()
        }
    }

    /// A VM's action is about to be requested.
    pub fn begin(&mut self, vm: &VmRef, action: &Action, options: &Options) {
        self.verb = action.verb();
        if options.dry_run != DryRun::None {
            return;
        }
        let label = self.label(vm);
        let Some(multi) = &self.multi else {
            return;
        };
        let bar = if self.migration && *action != Action::CancelMigration {
            let bar = multi.add(ProgressBar::new(100));
            bar.set_style(
                ProgressStyle::with_template("{spinner} {prefix} [{bar:30}] {percent:>3}% {msg}")
                    .expect("valid template")
                    .tick_chars(SPINNER)
                    .progress_chars("=> "),
            );
            bar
        } else {
            let bar = multi.add(ProgressBar::new_spinner());
            bar.set_style(
                ProgressStyle::with_template("{spinner} {prefix}: {msg}")
                    .expect("valid template")
                    .tick_chars(SPINNER),
            );
            bar
        };
        bar.set_prefix(label);
        bar.set_message(format!("requesting {}", action.verb()));
        bar.enable_steady_tick(Duration::from_millis(100));
        self.bars.insert(vm.clone(), bar);
    }

    fn line(&mut self, vm: &VmRef, text: String) {
        if self.last.get(vm) == Some(&text) {
            return;
        }
        self.last.insert(vm.clone(), text.clone());
        match (&self.multi, self.bars.get(vm)) {
            (Some(_), Some(bar)) => bar.set_message(text),
            _ => eprintln!("{}: {text}", self.label(vm)),
        }
    }

    /// Show one event.
    pub fn event(&mut self, event: Event) {
        match event {
            Event::Accepted { vm, detail } => {
                let text = match detail {
                    Some(d) => format!("{} accepted ({d})", self.verb),
                    None => format!("{} accepted", self.verb),
                };
                self.line(&vm, text);
            }
            Event::Notice { vm, message } => match &self.multi {
                Some(multi) => {
                    let _ = multi.println(format!("{}: {message}", self.label(&vm)));
                }
                None => eprintln!("{}: {message}", self.label(&vm)),
            },
            Event::Phase { vm, phase } => self.line(&vm, phase),
            Event::Migration {
                vm,
                phase,
                percent,
                detail,
            } => {
                if let Some(bar) = self.bars.get(&vm) {
                    bar.set_position(percent.clamp(0.0, 100.0) as u64);
                }
                let detail = if detail.is_empty() {
                    String::new()
                } else {
                    format!(" ({detail})")
                };
                let text = if self.multi.is_some() {
                    format!("{phase}{detail}")
                } else {
                    format!("migration {phase} {percent:.0}%{detail}")
                };
                self.line(&vm, text);
            }
        }
    }

    /// The action on `done.vm` ended well.
    pub fn finish(&mut self, done: &Done, _action: &Action) {
        if let Some(bar) = self.bars.remove(&done.vm) {
            bar.finish_and_clear();
        }
        if let Some((from, to, took)) = &done.migrated {
            let line = format!(
                "migrated {}: {from} → {to} in {}",
                done.vm.name,
                human(*took)
            );
            match &self.multi {
                Some(multi) => {
                    let _ = multi.println(line);
                }
                None => eprintln!("{line}"),
            }
        }
    }

    /// The action on `vm` failed (the error is reported by the caller).
    pub fn fail(&mut self, vm: &VmRef) {
        if let Some(bar) = self.bars.remove(vm) {
            bar.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::human;
    use std::time::Duration;

    #[test]
    fn durations_read_like_people_write_them() {
        assert_eq!(human(Duration::from_millis(14_400)), "14s");
        assert_eq!(human(Duration::from_secs(64)), "1m 4s");
    }
}
