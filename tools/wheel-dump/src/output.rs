//! Output: aligned text tables for people, JSON for programs.
//!
//! JSON contract: every subcommand prints one document carrying
//! `"schema_version": 1`, except the listings that can be large (`slots`,
//! `slot`, `log`), which print JSON lines: a first line
//! `{"schema_version":1,"listing":NAME,...}` describing the listing, then one
//! object per slot or entry.

use std::io::Write;

use serde::Serialize;

/// The version of every JSON document this tool prints.
pub const SCHEMA_VERSION: u32 = 1;

/// A text table: columns padded to their widest cell; numbers right-aligned.
pub struct Table {
    header: Vec<String>,
    right: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// Columns named `header`; a name starting with `>` is right-aligned (the `>` is dropped).
    pub fn new(header: &[&str]) -> Self {
        Self {
            header: header.iter().map(|h| h.trim_start_matches('>').to_string()).collect(),
            right: header.iter().map(|h| h.starts_with('>')).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The table as lines, each indented by `indent` spaces, without trailing blanks.
    pub fn render(&self, indent: usize) -> String {
        let mut widths: Vec<usize> = self.header.iter().map(String::len).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let line = |cells: &[String]| {
            let padded: Vec<String> = cells
                .iter()
                .zip(&widths)
                .zip(&self.right)
                .map(|((cell, &w), &right)| if right { format!("{cell:>w$}") } else { format!("{cell:<w$}") })
                .collect();
            format!("{}{}\n", " ".repeat(indent), padded.join("  ").trim_end())
        };
        let mut out = line(&self.header);
        for row in &self.rows {
            out.push_str(&line(row));
        }
        out
    }
}

/// `12,345,678`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Writes one JSON value on its own line.
pub fn json_line(out: &mut impl Write, value: &impl Serialize) -> std::io::Result<()> {
    serde_json::to_writer(&mut *out, value).map_err(std::io::Error::from)?;
    out.write_all(b"\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_and_numbers_group() {
        let mut t = Table::new(&["name", ">count"]);
        t.row(vec!["a".into(), "1".into()]);
        t.row(vec!["longer".into(), "1,000".into()]);
        assert_eq!(t.render(2), "  name    count\n  a           1\n  longer  1,000\n");
        assert_eq!([0, 999, 1_000, 1_234_567].map(thousands), ["0", "999", "1,000", "1,234,567"]);
    }
}
