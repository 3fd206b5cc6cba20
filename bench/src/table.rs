//! Markdown tables, padded so they also read well on a terminal, and the
//! number formats the tables use.

/// A markdown table: a header row, then rows of cells.
#[derive(Debug, Clone, Default)]
pub(crate) struct Table {
    /// Column titles.
    head: Vec<String>,
    /// Right-align the column (numbers).
    right: Vec<bool>,
    /// Cells, one `Vec` per row, as many as there are columns.
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these columns; a title starting with `>` is a
    /// right-aligned (numeric) column, the `>` is not shown.
    pub(crate) fn new(columns: &[&str]) -> Self {
        Table {
            head: columns
                .iter()
                .map(|c| c.trim_start_matches('>').to_owned())
                .collect(),
            right: columns.iter().map(|c| c.starts_with('>')).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; missing cells are blank, extra cells dropped.
    pub(crate) fn row(&mut self, cells: Vec<String>) {
        let mut cells = cells;
        cells.resize(self.head.len(), String::new());
        self.rows.push(cells);
    }

    /// True with no rows.
    pub(crate) fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The markdown text, one line per row, ending in a newline.
    pub(crate) fn render(&self) -> String {
        let width = |i: usize| {
            self.rows
                .iter()
                .map(|r| cell_text(&r[i]).chars().count())
                .chain([self.head[i].chars().count(), 3])
                .max()
                .unwrap_or(3)
        };
        let widths: Vec<usize> = (0..self.head.len()).map(width).collect();
        let line = |cells: &[String]| {
            let padded: Vec<String> = cells
                .iter()
                .zip(&widths)
                .zip(&self.right)
                .map(|((c, &w), &right)| {
                    let c = cell_text(c);
                    if right {
                        format!("{c:>w$}")
                    } else {
                        format!("{c:<w$}")
                    }
                })
                .collect();
            format!("| {} |\n", padded.join(" | "))
        };
        let rule: Vec<String> = widths
            .iter()
            .zip(&self.right)
            .map(|(&w, &right)| {
                if right {
                    format!("{}:", "-".repeat(w - 1))
                } else {
                    "-".repeat(w)
                }
            })
            .collect();
        let mut out = line(&self.head);
        out += &format!("| {} |\n", rule.join(" | "));
        for r in &self.rows {
            out += &line(r);
        }
        out
    }
}

/// A cell as markdown: pipes escaped, no line breaks.
fn cell_text(c: &str) -> String {
    c.replace('|', "\\|").replace('\n', " ")
}

/// `19000` → `19,000`.
pub(crate) fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// A signed whole number with thousands separators (`-1,234`).
pub(crate) fn thousands_signed(n: i64) -> String {
    let s = thousands(n.unsigned_abs());
    if n < 0 { format!("-{s}") } else { s }
}

/// `x` rounded to a whole number with separators (`1536.4` → `1,536`).
pub(crate) fn whole(x: f64) -> String {
    if !x.is_finite() {
        return "n/a".into();
    }
    thousands_signed(x.round() as i64)
}

/// `x` with `decimals` digits after the point.
pub(crate) fn fixed(x: f64, decimals: usize) -> String {
    if x.is_finite() {
        format!("{x:.decimals$}")
    } else {
        "n/a".into()
    }
}

/// An optional number, `n/a` when absent.
pub(crate) fn opt(x: Option<f64>, f: impl Fn(f64) -> String) -> String {
    x.map_or_else(|| "n/a".into(), f)
}

/// `a ÷ b`, `None` when `b` is zero (or either is not a number).
pub(crate) fn ratio(a: f64, b: f64) -> Option<f64> {
    let r = a / b;
    (b != 0.0 && r.is_finite()).then_some(r)
}

/// A ratio as `1.23×`.
pub(crate) fn times(r: Option<f64>) -> String {
    opt(r, |r| format!("{r:.2}×"))
}

/// The cells of every table row in markdown text, trimmed (tests read
/// rendered tables with it without depending on padding).
/// The closing line of a two-server table, `{what}: switchboard ÷ Nchan =
/// N×.`, or nothing when either server lacks the figure.
pub(crate) fn vs_nchan(what: &str, figure: impl Fn(super::servers::ServerKind) -> Option<f64>) -> String {
    use super::servers::ServerKind::{Nchan, Switchboard};
    match (figure(Switchboard), figure(Nchan)) {
        (Some(s), Some(n)) => format!("\n{what}: switchboard ÷ Nchan = {}.\n", times(ratio(s, n))),
        _ => String::new(),
    }
}

#[cfg(test)]
pub(crate) fn cells(md: &str) -> Vec<Vec<String>> {
    md.lines()
        .filter(|l| l.starts_with("| "))
        .map(|l| {
            l.trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().to_owned())
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_aligned_markdown() {
        let mut t = Table::new(&["server", ">streams", ">B/stream"]);
        t.row(vec!["switchboard".into(), thousands(19_000), whole(1536.4)]);
        t.row(vec!["Nchan".into(), thousands(1_000)]);
        assert_eq!(
            t.render(),
            "| server      | streams | B/stream |\n\
             | ----------- | ------: | -------: |\n\
             | switchboard |  19,000 |    1,536 |\n\
             | Nchan       |   1,000 |          |\n"
        );
    }

    #[test]
    fn escapes_cells() {
        let mut t = Table::new(&["a"]);
        t.row(vec!["x|y\nz".into(), "dropped".into()]);
        assert_eq!(t.render(), "| a      |\n| ------ |\n| x\\|y z |\n");
        assert!(Table::new(&["a"]).is_empty());
        assert_eq!(cells(&t.render())[2], vec!["x\\|y z"]);
    }

    #[test]
    fn numbers() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(thousands_signed(-1234), "-1,234");
        assert_eq!(whole(-0.4), "0");
        assert_eq!(whole(f64::NAN), "n/a");
        assert_eq!(fixed(1.23456, 2), "1.23");
        assert_eq!(opt(None, |x| fixed(x, 1)), "n/a");
        assert_eq!(opt(Some(2.0), |x| fixed(x, 1)), "2.0");
    }

    #[test]
    fn ratios() {
        assert_eq!(ratio(3.0, 2.0), Some(1.5));
        assert_eq!(ratio(1.0, 0.0), None);
        assert_eq!(ratio(f64::NAN, 1.0), None);
        assert_eq!(times(ratio(1.0, 4.0)), "0.25×");
        assert_eq!(times(None), "n/a");
    }
}
