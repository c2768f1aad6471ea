//! The report model: sections of items, each with a status, and its two renderings
//! (an aligned plain-text table, and JSON through serde).

use serde::{Serialize, Serializer};

/// A machine-readable fact value (`--json` only).
pub type Json = serde_json::Value;

/// The outcome of one row of the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// A check ran and passed.
    Pass,
    /// A check ran and failed, or something required is missing.
    Fail,
    /// Works, but something looks off; does not fail the run.
    Warn,
    /// A fact about the system; not a check.
    Info,
    /// A check that could not run; the item's detail says why. Counts as not passed.
    Skipped,
}

impl Status {
    /// Lower-case name used in JSON (`pass`, `fail`, `warn`, `info`, `skipped`).
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Fail => "fail",
            Status::Warn => "warn",
            Status::Info => "info",
            Status::Skipped => "skipped",
        }
    }

    /// The fixed-width tag shown in the text table. With `symbols`, a ✓/✗-style mark leads.
    pub fn tag(self, symbols: bool) -> &'static str {
        match (self, symbols) {
            (Status::Pass, false) => "PASS",
            (Status::Fail, false) => "FAIL",
            (Status::Warn, false) => "WARN",
            (Status::Info, false) => "INFO",
            (Status::Skipped, false) => "SKIP",
            (Status::Pass, true) => "✓ PASS",
            (Status::Fail, true) => "✗ FAIL",
            (Status::Warn, true) => "! WARN",
            (Status::Info, true) => "· INFO",
            (Status::Skipped, true) => "- SKIP",
        }
    }

    /// Whether this status stops the run from exiting 0.
    pub fn blocks_success(self) -> bool {
        matches!(self, Status::Fail | Status::Skipped)
    }
}

/// One row: a short name, a status, a one-line detail, an optional fix, and optional
/// machine-readable facts (emitted only in JSON). In JSON the detail is `reason` for a skipped
/// row and `detail` otherwise; `hint` and `facts` appear only when present.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(into = "ItemJson")]
pub struct Item {
    /// Short label, e.g. `/dev/kfd` or `layernorm_fwd_f32`.
    pub name: String,
    /// The outcome.
    pub status: Status,
    /// What was found; for `Skipped`, the reason. May hold several lines.
    pub detail: String,
    /// What to do about it, shown on its own line under the row.
    pub hint: Option<String>,
    /// Key/value facts for `--json` (paths, versions, numbers).
    pub facts: Vec<(String, Json)>,
}

impl Item {
    /// A row with the given status and detail.
    pub fn new(name: impl Into<String>, status: Status, detail: impl Into<String>) -> Item {
        Item {
            name: name.into(),
            status,
            detail: detail.into(),
            hint: None,
            facts: Vec::new(),
        }
    }

    /// A passing check.
    pub fn pass(name: impl Into<String>, detail: impl Into<String>) -> Item {
        Item::new(name, Status::Pass, detail)
    }

    /// A failed check.
    pub fn fail(name: impl Into<String>, detail: impl Into<String>) -> Item {
        Item::new(name, Status::Fail, detail)
    }

    /// A warning.
    pub fn warn(name: impl Into<String>, detail: impl Into<String>) -> Item {
        Item::new(name, Status::Warn, detail)
    }

    /// A fact.
    pub fn info(name: impl Into<String>, detail: impl Into<String>) -> Item {
        Item::new(name, Status::Info, detail)
    }

    /// A check that could not run, and why.
    pub fn skipped(name: impl Into<String>, reason: impl Into<String>) -> Item {
        Item::new(name, Status::Skipped, reason)
    }

    /// A row for a piece this build does not contain yet (never a faked result).
    pub fn not_available(name: impl Into<String>, what: &str) -> Item {
        Item::info(name, format!("not available in this build ({what})"))
    }

    /// Adds a fix to show under the row.
    pub fn with_hint(mut self, hint: impl Into<String>) -> Item {
        self.hint = Some(hint.into());
        self
    }

    /// Adds a machine-readable fact.
    pub fn with_fact(mut self, key: impl Into<String>, value: impl Into<Json>) -> Item {
        self.facts.push((key.into(), value.into()));
        self
    }
}

/// The JSON form of an [`Item`].
#[derive(Serialize)]
struct ItemJson {
    name: String,
    status: Status,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    hint: Option<String>,
    /// In insertion order, as a JSON object.
    #[serde(skip_serializing_if = "Vec::is_empty", serialize_with = "as_object")]
    facts: Vec<(String, Json)>,
}

impl From<Item> for ItemJson {
    fn from(item: Item) -> ItemJson {
        let skipped = item.status == Status::Skipped;
        ItemJson {
            name: item.name,
            status: item.status,
            detail: (!skipped).then(|| item.detail.clone()),
            reason: skipped.then_some(item.detail),
            hint: item.hint,
            facts: item.facts,
        }
    }
}

fn as_object<S: Serializer>(pairs: &[(String, Json)], s: S) -> Result<S::Ok, S::Error> {
    s.collect_map(pairs.iter().map(|(k, v)| (k, v)))
}

/// A titled group of items.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Section {
    /// Heading, e.g. `Environment`.
    pub title: String,
    /// Rows in display order.
    pub items: Vec<Item>,
}

impl Section {
    /// An empty section.
    pub fn new(title: impl Into<String>) -> Section {
        Section {
            title: title.into(),
            items: Vec::new(),
        }
    }

    /// Appends a row.
    pub fn push(&mut self, item: Item) {
        self.items.push(item);
    }
}

/// Counts of items per status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// Passed checks.
    pub pass: usize,
    /// Failed checks.
    pub fail: usize,
    /// Warnings.
    pub warn: usize,
    /// Facts.
    pub info: usize,
    /// Checks that could not run.
    pub skipped: usize,
}

/// The whole report.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Report {
    /// Sections in display order.
    pub sections: Vec<Section>,
}

impl Report {
    /// Appends a section.
    pub fn push(&mut self, section: Section) {
        self.sections.push(section);
    }

    /// All items of all sections.
    pub fn items(&self) -> impl Iterator<Item = &Item> {
        self.sections.iter().flat_map(|s| s.items.iter())
    }

    /// Counts per status.
    pub fn summary(&self) -> Summary {
        let mut s = Summary::default();
        for item in self.items() {
            match item.status {
                Status::Pass => s.pass += 1,
                Status::Fail => s.fail += 1,
                Status::Warn => s.warn += 1,
                Status::Info => s.info += 1,
                Status::Skipped => s.skipped += 1,
            }
        }
        s
    }

    /// True when at least one check passed and none failed or was skipped.
    pub fn ok(&self) -> bool {
        let s = self.summary();
        s.pass > 0 && s.fail == 0 && s.skipped == 0
    }

    /// Process exit code: 0 when [`Report::ok`], else 1 (2 is reserved for usage errors).
    pub fn exit_code(&self) -> i32 {
        if self.ok() {
            0
        } else {
            1
        }
    }

    /// The plain-text rendering. `symbols` adds ✓/✗ marks (use it only on a terminal).
    pub fn render_text(&self, symbols: bool) -> String {
        let mut out = String::new();
        let tag_width = [
            Status::Pass,
            Status::Fail,
            Status::Warn,
            Status::Info,
            Status::Skipped,
        ]
        .iter()
        .map(|s| s.tag(symbols).chars().count())
        .max()
        .unwrap_or(4);
        for section in &self.sections {
            out.push_str(&section.title);
            out.push('\n');
            let name_width = section
                .items
                .iter()
                .map(|i| i.name.chars().count())
                .max()
                .unwrap_or(0);
            // Continuation lines (multi-line details, hints) start under the detail column.
            let indent = " ".repeat(2 + tag_width + 2 + name_width + 2);
            for item in &section.items {
                out.push_str("  ");
                pad(&mut out, item.status.tag(symbols), tag_width);
                out.push_str("  ");
                pad(&mut out, &item.name, name_width);
                let mut lines = item.detail.lines();
                if let Some(first) = lines.next() {
                    out.push_str("  ");
                    out.push_str(first);
                }
                trim_trailing_spaces(&mut out);
                out.push('\n');
                for line in lines {
                    out.push_str(&indent);
                    out.push_str(line);
                    out.push('\n');
                }
                if let Some(hint) = &item.hint {
                    for (i, line) in hint.lines().enumerate() {
                        out.push_str(&indent);
                        out.push_str(if i == 0 { "fix: " } else { "     " });
                        out.push_str(line);
                        out.push('\n');
                    }
                }
            }
            out.push('\n');
        }
        let s = self.summary();
        out.push_str(&format!(
            "Result: {} ({} passed, {} failed, {} skipped, {} warnings)\n",
            if self.ok() { "OK" } else { "NOT OK" },
            s.pass,
            s.fail,
            s.skipped,
            s.warn
        ));
        out
    }

    /// The JSON rendering of the whole report (pretty-printed): `tool`, `version`, `ok`,
    /// `exit_code`, `summary`, `sections[].items[]`.
    pub fn to_json(&self) -> String {
        let view = ReportJson {
            tool: "hip-doctor",
            version: env!("CARGO_PKG_VERSION"),
            ok: self.ok(),
            exit_code: self.exit_code(),
            summary: self.summary(),
            sections: &self.sections,
        };
        // Serializing strings, numbers and maps into a String cannot fail; the fallback keeps
        // the output valid JSON all the same.
        serde_json::to_string_pretty(&view)
            .unwrap_or_else(|e| format!("{{\"error\": {:?}}}", e.to_string()))
    }
}

/// The JSON form of a [`Report`].
#[derive(Serialize)]
struct ReportJson<'a> {
    tool: &'static str,
    version: &'static str,
    ok: bool,
    exit_code: i32,
    summary: Summary,
    sections: &'a [Section],
}

fn pad(out: &mut String, text: &str, width: usize) {
    out.push_str(text);
    for _ in text.chars().count()..width {
        out.push(' ');
    }
}

fn trim_trailing_spaces(out: &mut String) {
    while out.ends_with(' ') {
        out.pop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Report {
        let mut env = Section::new("Environment");
        env.push(Item::info("ROCM_PATH", "not set"));
        env.push(Item::fail("/dev/kfd", "missing").with_hint("load the driver\nthen retry"));
        let mut checks = Section::new("Checks");
        checks.push(Item::pass("copy", "ok").with_fact("bytes", 4096));
        checks.push(Item::skipped("gemm", "no hipBLAS"));
        let mut report = Report::default();
        report.push(env);
        report.push(checks);
        report
    }

    #[test]
    fn text_is_aligned_and_ascii_without_symbols() {
        let text = sample().render_text(false);
        assert!(text.is_ascii(), "{text}");
        assert!(text.contains("  INFO  ROCM_PATH  not set\n"), "{text}");
        assert!(text.contains("  FAIL  /dev/kfd   missing\n"), "{text}");
        // Continuation lines start under the detail column: 2 + 4 + 2 + 9 + 2 = 19.
        let indent = " ".repeat(19);
        assert!(
            text.contains(&format!(
                "\n{indent}fix: load the driver\n{indent}     then retry\n"
            )),
            "{text}"
        );
        assert!(text.contains("  SKIP  gemm  no hipBLAS\n"), "{text}");
        assert!(text.ends_with("Result: NOT OK (1 passed, 1 failed, 1 skipped, 0 warnings)\n"));
    }

    #[test]
    fn symbols_mark_pass_and_fail() {
        let text = sample().render_text(true);
        assert!(text.contains("✓ PASS  copy"), "{text}");
        assert!(text.contains("✗ FAIL  /dev/kfd"), "{text}");
    }

    #[test]
    fn exit_code_requires_all_checks_passed() {
        let mut report = sample();
        assert_eq!(report.exit_code(), 1);
        report.sections.truncate(0);
        // Nothing checked at all is not success either.
        assert_eq!(report.exit_code(), 1);
        let mut ok = Section::new("Checks");
        ok.push(Item::pass("copy", "ok"));
        ok.push(Item::warn("clock", "low"));
        ok.push(Item::info("name", "x"));
        report.push(ok.clone());
        assert_eq!(report.exit_code(), 0);
        ok.push(Item::skipped("gemm", "no hipBLAS"));
        report.sections = vec![ok];
        assert_eq!(report.exit_code(), 1);
    }

    #[test]
    fn json_holds_every_item() {
        let text = sample().to_json();
        let parsed: Json = serde_json::from_str(&text).expect("report JSON parses");
        assert_eq!(parsed.get("ok"), Some(&Json::Bool(false)));
        assert_eq!(parsed.get("exit_code").and_then(Json::as_f64), Some(1.0));
        let sections = parsed
            .get("sections")
            .and_then(Json::as_array)
            .expect("sections");
        assert_eq!(sections.len(), 2);
        let items = sections[1]
            .get("items")
            .and_then(Json::as_array)
            .expect("items");
        assert_eq!(
            items[0].get("facts").and_then(|f| f.get("bytes")),
            Some(&Json::from(4096))
        );
        assert_eq!(
            items[1].get("status").and_then(Json::as_str),
            Some("skipped")
        );
        assert_eq!(
            items[1].get("reason").and_then(Json::as_str),
            Some("no hipBLAS")
        );
        assert!(items[1].get("detail").is_none() && items[1].get("hint").is_none());
        assert_eq!(
            parsed.get("summary").and_then(|s| s.get("skipped")),
            Some(&Json::from(1))
        );
        let kfd = &sections[0]
            .get("items")
            .and_then(Json::as_array)
            .expect("items")[1];
        assert_eq!(
            kfd.get("hint").and_then(Json::as_str),
            Some("load the driver\nthen retry")
        );
    }
}
