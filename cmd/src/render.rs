//! Output in kubectl's style: aligned tables with upper-case headers and `<none>`, ages like
//! `5d21h`, and `-o yaml|json|name`.

use std::io::Write;

use serde_json::Value;

/// `-o/--output` formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// YAML
    Yaml,
    /// JSON
    Json,
    /// The table with more columns
    Wide,
    /// kind.group/name only
    Name,
}

/// Placeholder kubectl prints for an empty cell.
pub const NONE: &str = "<none>";

/// A cell's text, or `<none>`.
pub fn cell(value: Option<impl ToString>) -> String {
    value
        .map(|v| v.to_string())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| NONE.to_owned())
}

/// A yes/no condition cell (`true`, `false`, `<none>` when unknown).
pub fn flag(value: Option<bool>) -> String {
    cell(value)
}

/// A table printed like kubectl's: columns padded to the widest cell plus three spaces.
#[derive(Debug, Default)]
pub struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these headers (already upper-case).
    pub fn new(headers: &[&str]) -> Self {
        Table {
            rows: vec![headers.iter().map(|h| h.to_string()).collect()],
        }
    }

    /// Add a row.
    pub fn push(&mut self, row: Vec<String>) {
        self.rows.push(row);
    }

    /// Write the table. `with_headers: false` drops the header row.
    pub fn write(&self, out: &mut dyn Write, with_headers: bool) -> std::io::Result<()> {
        self.write_aligned(out, with_headers, &mut Vec::new())
    }

    /// Write the table with columns at least `widths` wide, and widen `widths` to what was
    /// printed, so tables printed one after another (pages, watch rows) stay aligned.
    pub fn write_aligned(
        &self,
        out: &mut dyn Write,
        with_headers: bool,
        widths: &mut Vec<usize>,
    ) -> std::io::Result<()> {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        widths.resize(columns.max(widths.len()), 0);
        for row in &self.rows {
            for (c, text) in row.iter().enumerate() {
                widths[c] = widths[c].max(text.chars().count());
            }
        }
        for row in self.rows.iter().skip(usize::from(!with_headers)) {
            let mut line = String::new();
            for (c, text) in row.iter().enumerate() {
                line.push_str(text);
                if c + 1 < row.len() {
                    line.extend(std::iter::repeat_n(
                        ' ',
                        widths[c] - text.chars().count() + 3,
                    ));
                }
            }
            writeln!(out, "{}", line.trim_end())?;
        }
        Ok(())
    }
}

/// An age as kubectl prints it (`45s`, `3m12s`, `2h5m`, `5d21h`, `400d`, `2y30d`).
pub fn age(since: Option<jiff::Timestamp>, now: jiff::Timestamp) -> String {
    let Some(since) = since else {
        return NONE.to_owned();
    };
    let seconds = (now.as_second() - since.as_second()).max(0);
    human_duration(seconds)
}

/// kubectl's `HumanDuration` for a number of seconds.
pub fn human_duration(seconds: i64) -> String {
    let minutes = seconds / 60;
    let hours = seconds / 3600;
    let days = hours / 24;
    let years = days / 365;
    if seconds < 60 * 2 {
        format!("{seconds}s")
    } else if minutes < 10 {
        match seconds % 60 {
            0 => format!("{minutes}m"),
            s => format!("{minutes}m{s}s"),
        }
    } else if minutes < 60 * 3 {
        format!("{minutes}m")
    } else if hours < 8 {
        match minutes % 60 {
            0 => format!("{hours}h"),
            m => format!("{hours}h{m}m"),
        }
    } else if hours < 48 {
        format!("{hours}h")
    } else if hours < 24 * 8 {
        match hours % 24 {
            0 => format!("{days}d"),
            h => format!("{days}d{h}h"),
        }
    } else if hours < 24 * 365 * 2 {
        format!("{days}d")
    } else if years < 8 {
        match days % 365 {
            0 => format!("{years}y"),
            d => format!("{years}y{d}d"),
        }
    } else {
        format!("{years}y")
    }
}

/// Print one object or list as YAML (a document) or JSON (pretty, like kubectl).
pub fn write_object(
    out: &mut dyn Write,
    value: &Value,
    format: OutputFormat,
) -> std::io::Result<()> {
    match format {
        OutputFormat::Json => {
            serde_json::to_writer_pretty(&mut *out, value)?;
            writeln!(out)
        }
        _ => {
            let text = yaml_serde::to_string(value).map_err(std::io::Error::other)?;
            out.write_all(text.as_bytes())
        }
    }
}

/// A list of objects the way kubectl prints `-o yaml|json` of a list.
pub fn list_object(items: Vec<Value>) -> Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "List",
        "items": items,
        "metadata": {"resourceVersion": ""},
    })
}

/// Drops `metadata.managedFields`, as kubectl's printers do unless --show-managed-fields
/// (k8s.io/cli-runtime/pkg/printers/managedfields.go).
pub fn without_managed_fields(object: &mut serde_json::Value) {
    if let Some(meta) = object
        .get_mut("metadata")
        .and_then(serde_json::Value::as_object_mut)
    {
        meta.remove("managedFields");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_match_kubectl() {
        for (seconds, text) in [
            (5, "5s"),
            (119, "119s"),
            (120, "2m"),
            (192, "3m12s"),
            (600, "10m"),
            (3 * 3600, "3h"),
            (2 * 3600 + 5 * 60, "125m"),
            (5 * 3600 + 5 * 60, "5h5m"),
            (20 * 3600, "20h"),
            (5 * 86400 + 21 * 3600, "5d21h"),
            (30 * 86400, "30d"),
            (800 * 86400, "2y70d"),
            (3000 * 86400, "8y"),
        ] {
            assert_eq!(human_duration(seconds), text, "{seconds}s");
        }
    }

    #[test]
    fn table_aligns_like_kubectl() {
        let mut table = Table::new(&["NAME", "STATUS", "AGE"]);
        table.push(vec!["web".into(), "Running".into(), "5d".into()]);
        table.push(vec!["database-01".into(), NONE.into(), "10m".into()]);
        let mut out = Vec::new();
        table.write(&mut out, true).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "NAME          STATUS    AGE\nweb           Running   5d\ndatabase-01   <none>    10m\n"
        );
    }

    #[test]
    fn empty_cells_print_none() {
        assert_eq!(cell(None::<String>), "<none>");
        assert_eq!(cell(Some("")), "<none>");
        assert_eq!(flag(Some(true)), "true");
    }
}
