//! `kubectl-vm generate-docs DIR` (hidden): writes the man pages and completion scripts that
//! are committed under `man/` and `completions/`. A test checks that the committed copies
//! match what this produces.

use std::path::{Path, PathBuf};

use clap::Args;
use clap_complete::env::{Bash, Elvish, EnvCompleter, Fish, Powershell, Zsh};

use crate::error::{CommandError, CommandResult};

/// Arguments of `generate-docs`.
#[derive(Debug, Args)]
pub struct GenerateDocsArgs {
    /// Directory that receives `man/` and `completions/` (the repository root)
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
}

/// Write the generated files for the command line `command` builds.
pub fn cmd_generate_docs(args: GenerateDocsArgs, command: fn() -> clap::Command) -> CommandResult {
    write_all(&args.dir, command).map_err(|e| CommandError::Failed(format!("writing docs: {e}")))
}

/// Every generated file for the command line `command` builds: path relative to the root,
/// and content.
pub fn files(command: fn() -> clap::Command) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    let mut command = command();
    // Building propagates the version and global flags into every subcommand's page.
    command.build();
    man_pages(&command, "kubectl-vm", "kubectl vm", &mut files);
    let shells: [(&dyn EnvCompleter, &str); 5] = [
        (&Bash, "kubectl-vm.bash"),
        (&Zsh, "_kubectl-vm"),
        (&Fish, "kubectl-vm.fish"),
        (&Powershell, "kubectl-vm.ps1"),
        (&Elvish, "kubectl-vm.elv"),
    ];
    for (shell, file) in shells {
        files.push((
            Path::new("completions").join(file),
            super::completion::script(shell),
        ));
    }
    files
}

/// One page per visible command: file `name.1`, usage shown as `invocation` (`kubectl vm list`).
fn man_pages(
    command: &clap::Command,
    name: &str,
    invocation: &str,
    files: &mut Vec<(PathBuf, Vec<u8>)>,
) {
    let page = command
        .clone()
        .name(name.to_owned())
        .bin_name(invocation.to_owned());
    let mut buf = Vec::new();
    clap_mangen::Man::new(page)
        .render(&mut buf)
        .expect("rendering to memory cannot fail");
    files.push((Path::new("man").join(format!("{name}.1")), buf));
    for sub in command
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
    {
        let sub_name = sub.get_name();
        man_pages(
            sub,
            &format!("{name}-{sub_name}"),
            &format!("{invocation} {sub_name}"),
            files,
        );
    }
}

fn write_all(root: &Path, command: fn() -> clap::Command) -> std::io::Result<()> {
    for (path, content) in files(command) {
        let path = root.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, content)?;
    }
    Ok(())
}

/// README's command table and the docs/ pages it links to: what a newcomer reads first must
/// name every command, show it run, and lead to headings that exist.
#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::path::{Path, PathBuf};

    fn repo() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    fn read(path: &Path) -> String {
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// The lines of a Markdown text outside fenced code blocks.
    fn prose_lines(text: &str) -> Vec<&str> {
        let mut fenced = false;
        let mut lines = Vec::new();
        for line in text.lines() {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
            } else if !fenced {
                lines.push(line);
            }
        }
        lines
    }

    /// The anchors GitHub gives the headings of a Markdown text: the heading's text in lower
    /// case, letters, digits, `-` and `_` kept, spaces made `-`, everything else dropped; a
    /// repeated anchor gets `-1`, `-2`, ...
    fn anchors(text: &str) -> Vec<String> {
        let mut seen: HashMap<String, usize> = HashMap::new();
        let mut anchors = Vec::new();
        for line in prose_lines(text) {
            let title = line.trim_start_matches('#');
            let level = line.len() - title.len();
            if !(1..=6).contains(&level) || !title.starts_with(' ') {
                continue;
            }
            let slug: String = title
                .trim()
                .to_lowercase()
                .chars()
                .filter_map(|c| match c {
                    ' ' => Some('-'),
                    '-' | '_' => Some(c),
                    c if c.is_alphanumeric() => Some(c),
                    _ => None,
                })
                .collect();
            let times = seen.entry(slug.clone()).or_insert(0);
            anchors.push(if *times == 0 {
                slug
            } else {
                format!("{slug}-{times}")
            });
            *times += 1;
        }
        anchors
    }

    /// The targets of the Markdown links of a text, outside code blocks and code spans.
    fn link_targets(text: &str) -> Vec<String> {
        let prose = prose_lines(text).join("\n");
        // Code spans may wrap lines; drop them whole.
        let outside_code: String = prose
            .split('`')
            .enumerate()
            .filter(|(i, _)| i % 2 == 0)
            .map(|(_, part)| part)
            .collect::<Vec<_>>()
            .join(" ");
        outside_code
            .split("](")
            .skip(1)
            .filter_map(|rest| rest.split(')').next())
            .map(|target| target.trim().to_owned())
            .collect()
    }

    /// Cells of a table row, split at `|` that is not escaped, `\|` unescaped.
    fn cells(row: &str) -> Vec<String> {
        let inner = row.trim().trim_start_matches('|').trim_end_matches('|');
        let mut cells = vec![String::new()];
        let mut chars = inner.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\\' if chars.peek() == Some(&'|') => {
                    cells.last_mut().unwrap().push('|');
                    chars.next();
                }
                '|' => cells.push(String::new()),
                c => cells.last_mut().unwrap().push(c),
            }
        }
        cells.iter().map(|c| c.trim().to_owned()).collect()
    }

    /// Every visible command is one row of README's command table, with a short purpose and
    /// an example that runs it; the rows follow the root help's groups.
    #[test]
    fn readme_command_table_has_every_command_with_an_example() {
        let readme = read(&repo().join("README.md"));
        let section = readme
            .split("\n## Commands\n")
            .nth(1)
            .expect("README has a `## Commands` section");
        let section = section.split("\n## ").next().unwrap();
        let mut groups: Vec<(String, Vec<String>)> = Vec::new();
        let mut rows = 0;
        for line in section.lines().filter(|l| l.starts_with('|')) {
            if line.starts_with("|---") || line.starts_with("| command |") {
                continue;
            }
            rows += 1;
            let cells = cells(line);
            assert_eq!(
                cells.len(),
                3,
                "a row has command, purpose, example: {line}"
            );
            let first = &cells[0];
            if let Some(group) = first.strip_prefix("**").and_then(|g| g.strip_suffix("**")) {
                assert!(cells[1].is_empty() && cells[2].is_empty(), "{line}");
                groups.push((group.to_owned(), Vec::new()));
                continue;
            }
            let name = first
                .strip_prefix('[')
                .and_then(|r| r.split_once("](docs/"))
                .map(|(name, _)| name.trim_matches('`').to_owned())
                .unwrap_or_else(|| panic!("the command cell links to docs/: {line}"));
            let words = cells[1].split_whitespace().count();
            assert!(
                (1..=15).contains(&words),
                "purpose of {name} is one short line ({words} words): {line}"
            );
            let example = cells[2]
                .strip_prefix('`')
                .and_then(|e| e.strip_suffix('`'))
                .unwrap_or_else(|| panic!("example of {name} is one code span: {line}"));
            assert!(
                example.starts_with("kubectl vm ")
                    || example.starts_with("kubectl-vm ")
                    || example.contains("kubectl vm "),
                "example of {name} runs it: {example:?}"
            );
            let runs_it = example.match_indices(&format!("vm {name}")).any(|(at, m)| {
                matches!(
                    example[at + m.len()..].chars().next(),
                    None | Some(' ' | ')')
                )
            });
            assert!(runs_it, "example of {name} runs {name}: {example:?}");
            groups
                .last_mut()
                .unwrap_or_else(|| panic!("{name} is in a group row: {line}"))
                .1
                .push(name);
        }
        assert!(rows > 30, "the table was read: {rows} rows");

        let command = crate::cli::command();
        let visible: Vec<&str> = command
            .get_subcommands()
            .filter(|s| !s.is_hide_set() && s.get_name() != "help")
            .map(|s| s.get_name())
            .collect();
        let listed: Vec<&str> = groups
            .iter()
            .flat_map(|(_, names)| names.iter().map(String::as_str))
            .collect();
        for name in &visible {
            let times = listed.iter().filter(|l| *l == name).count();
            assert_eq!(
                times, 1,
                "{name} has {times} rows in README's command table"
            );
        }
        for name in &listed {
            assert!(
                visible.contains(name),
                "README lists {name}, which is no command"
            );
        }
        // The same groups, in the same order, as `kubectl vm --help`.
        let help_groups: Vec<(String, Vec<String>)> = crate::cli::COMMAND_GROUPS
            .iter()
            .map(|(group, names)| {
                let names = names.iter().filter(|n| **n != "help");
                (group.to_string(), names.map(|n| n.to_string()).collect())
            })
            .collect();
        assert_eq!(groups, help_groups, "README's groups follow the root help");
    }

    /// Every relative link of README and docs/*.md names a file that exists and, for a
    /// Markdown file, a heading it has.
    #[test]
    fn readme_and_docs_links_point_at_existing_headings() {
        let root = repo();
        let mut pages = vec![root.join("README.md")];
        let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
            .expect("docs/ exists")
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "md"))
            .collect();
        docs.sort();
        assert!(docs.len() >= 5, "the docs pages: {docs:?}");
        pages.extend(docs.iter().cloned());

        let mut broken = Vec::new();
        let mut docs_links = 0;
        for page in &pages {
            let text = read(page);
            let dir = page.parent().unwrap();
            let targets = link_targets(&text);
            if page.parent().unwrap().ends_with("docs") {
                assert!(
                    targets.iter().any(|t| t.starts_with("../README.md")),
                    "{} links back to README",
                    page.display()
                );
            }
            for target in targets {
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let (file, anchor) = match target.split_once('#') {
                    Some((file, anchor)) => (file, Some(anchor)),
                    None => (target.as_str(), None),
                };
                let file = if file.is_empty() {
                    page.clone()
                } else {
                    dir.join(file)
                };
                if target.starts_with("docs/") {
                    docs_links += 1;
                }
                if !file.exists() {
                    broken.push(format!("{}: {target}: no such file", page.display()));
                    continue;
                }
                if let Some(anchor) = anchor
                    && file.extension().is_some_and(|e| e == "md")
                    && !anchors(&read(&file)).iter().any(|a| a == anchor)
                {
                    broken.push(format!("{}: {target}: no such heading", page.display()));
                }
            }
        }
        assert!(
            docs_links > 30,
            "README's links into docs/ were read: {docs_links}"
        );
        assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    }

    /// The anchor rule against headings whose GitHub anchors are known.
    #[test]
    fn readme_anchor_rule_matches_github() {
        let text = "# kubectl-vm\n## SSH trust: the platform signs\n### `ca init`\n\
                    ```sh\n# not a heading\n```\n## Exit codes and errors\n## ca init\n";
        assert_eq!(
            anchors(text),
            [
                "kubectl-vm",
                "ssh-trust-the-platform-signs",
                "ca-init",
                "exit-codes-and-errors",
                "ca-init-1"
            ]
        );
    }
}
