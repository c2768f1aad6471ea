//! The diagnosis accounts for every problem in the report: a FAIL or WARN row that no rule
//! explains is listed in one generic row ("see the rows above"), so the Diagnosis never says
//! "no problems found" beside a failure.
//!
//! A rule row explains another row when it names it (the rule `/dev/kfd missing` names the row
//! `/dev/kfd`). The `devices` row of the Devices section is explained by any rule: each rule that
//! fires (runtime not found, `/dev/kfd`, hidden devices, no device, missing arch) is a reason
//! for it.

use super::report::{Item, Section, Status};

/// The name of the row that lists the problems no rule explains.
pub const UNEXPLAINED: &str = "other problems";

/// The name of the row of a report with no problem at all.
pub const NO_PROBLEMS: &str = "no problems found";

/// Completes the diagnosis `rules` (the rows of [`crate::diagnose::diagnose`]) against the
/// report's other sections: adds a row naming each FAIL or WARN row that no rule explains, one
/// saying that checks were skipped when nothing else does, and keeps "no problems found" only
/// when nothing in the report is a problem.
pub fn account_for(rules: Section, others: &[Section]) -> Section {
    let mut section = Section::new(rules.title.clone());
    section.items = rules
        .items
        .into_iter()
        .filter(|i| i.name != NO_PROBLEMS)
        .collect();
    let problems: Vec<(&str, &Item)> = others
        .iter()
        .filter(|s| s.title != section.title)
        .flat_map(|s| s.items.iter().map(move |i| (s.title.as_str(), i)))
        .filter(|(_, i)| matches!(i.status, Status::Fail | Status::Warn))
        .collect();
    let open: Vec<&(&str, &Item)> = problems
        .iter()
        .filter(|(title, item)| !explained(title, item, &section.items))
        .collect();
    if !open.is_empty() {
        let status = if open.iter().any(|(_, i)| i.status == Status::Fail) {
            Status::Fail
        } else {
            Status::Warn
        };
        let list: Vec<String> = open
            .iter()
            .map(|(title, item)| format!("{title}: {} ({})", item.name, item.status.as_str()))
            .collect();
        let what = if status == Status::Fail {
            "FAIL"
        } else {
            "WARN"
        };
        section.push(
            Item::new(
                UNEXPLAINED,
                status,
                format!(
                    "no rule here explains these; see the {what} rows above: {}",
                    list.join("; ")
                ),
            )
            .with_hint("each of those rows says what failed and, where known, how to fix it"),
        );
    }
    if section.items.is_empty() {
        let skipped: Vec<String> = others
            .iter()
            .flat_map(|s| s.items.iter().map(move |i| (s.title.as_str(), i)))
            .filter(|(_, i)| i.status == Status::Skipped)
            .map(|(title, i)| format!("{title}: {}", i.name))
            .collect();
        if skipped.is_empty() {
            section.push(Item::pass(NO_PROBLEMS, "every rule passed"));
        } else {
            section.push(Item::warn(
                "checks skipped",
                format!(
                    "nothing failed, but these did not run (see the SKIP rows above): {}",
                    skipped.join("; ")
                ),
            ));
        }
    }
    section
}

/// Whether a rule row explains the row `item` of section `title`.
fn explained(title: &str, item: &Item, rules: &[Item]) -> bool {
    if title == "Devices" && item.name == "devices" && !rules.is_empty() {
        return true;
    }
    let name = item.name.to_lowercase();
    rules
        .iter()
        .any(|r| r.name.to_lowercase().contains(&name) || r.detail.to_lowercase().contains(&name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(title: &str, items: Vec<Item>) -> Section {
        Section {
            title: title.into(),
            items,
        }
    }

    fn no_rules() -> Section {
        section(
            "Diagnosis",
            vec![Item::pass(NO_PROBLEMS, "every rule passed")],
        )
    }

    fn names(s: &Section) -> Vec<&str> {
        s.items.iter().map(|i| i.name.as_str()).collect()
    }

    #[test]
    fn a_clean_report_keeps_no_problems_found() {
        let others = [section("Devices", vec![Item::pass("devices", "1 device")])];
        let d = account_for(no_rules(), &others);
        assert_eq!(names(&d), vec![NO_PROBLEMS]);
        assert_eq!(d.items[0].status, Status::Pass);
    }

    #[test]
    fn a_failing_row_no_rule_explains_is_named() {
        let others = [
            section("Environment", vec![Item::pass("HIP runtime", "loaded")]),
            section(
                "CPU reference self-check",
                vec![
                    Item::fail("golden directory", "/x does not exist"),
                    Item::pass("matmul", "22 cases passed"),
                ],
            ),
        ];
        let d = account_for(no_rules(), &others);
        assert_eq!(names(&d), vec![UNEXPLAINED]);
        assert_eq!(d.items[0].status, Status::Fail);
        assert!(
            d.items[0]
                .detail
                .contains("CPU reference self-check: golden directory (fail)"),
            "{}",
            d.items[0].detail
        );
        assert!(!d.items[0].detail.contains("matmul"));
    }

    #[test]
    fn only_warnings_give_a_warning() {
        let others = [section(
            "Embedded kernels",
            vec![Item::warn("spills", "2 kernels spill")],
        )];
        let d = account_for(no_rules(), &others);
        assert_eq!(d.items[0].status, Status::Warn);
        assert!(d.items[0]
            .detail
            .contains("see the WARN rows above: Embedded kernels: spills"));
    }

    #[test]
    fn rows_a_rule_names_are_not_repeated() {
        let rules = section(
            "Diagnosis",
            vec![Item::fail(
                "/dev/kfd missing",
                "no GPU kernel driver is loaded",
            )],
        );
        let others = [
            section(
                "Environment",
                vec![Item::fail("/dev/kfd", "does not exist")],
            ),
            section("Devices", vec![Item::fail("devices", "no device")]),
        ];
        let d = account_for(rules, &others);
        assert_eq!(names(&d), vec!["/dev/kfd missing"]);
    }

    #[test]
    fn an_explained_row_and_an_unexplained_one() {
        let rules = section(
            "Diagnosis",
            vec![Item::fail(
                "/dev/kfd missing",
                "no GPU kernel driver is loaded",
            )],
        );
        let others = [
            section(
                "Environment",
                vec![Item::fail("/dev/kfd", "does not exist")],
            ),
            section(
                "Checks (device 0)",
                vec![Item::fail("matmul", "mismatch at 3")],
            ),
        ];
        let d = account_for(rules, &others);
        assert_eq!(names(&d), vec!["/dev/kfd missing", UNEXPLAINED]);
        assert!(d.items[1]
            .detail
            .contains("Checks (device 0): matmul (fail)"));
        assert!(!d.items[1].detail.contains("/dev/kfd"));
    }

    #[test]
    fn skipped_checks_are_not_called_no_problems() {
        let others = [section(
            "Checks",
            vec![Item::skipped("device checks", "no device")],
        )];
        let d = account_for(no_rules(), &others);
        assert_eq!(names(&d), vec!["checks skipped"]);
        assert_eq!(d.items[0].status, Status::Warn);
        assert!(d.items[0].detail.contains("Checks: device checks"));
    }
}
