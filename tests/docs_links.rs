//! The docs point at things that exist: every relative link in the README, `docs/*.md` and the
//! crates' READMEs names a file that exists (and, with `#anchor`, a heading of that file), and
//! every repository path written in backticks (`tests/golden/`, `train/src/lora/`) exists.
//! Runs with no device and no network.

use std::collections::BTreeSet;
use std::fs;
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Markdown files a reader follows: the README, `docs/`, and each package's READMEs.
fn markdown_files() -> Vec<PathBuf> {
    let root = root();
    let mut files = vec![root.join("README.md")];
    let mut dirs = vec![root.join("docs")];
    for entry in fs::read_dir(&root)
        .expect("read the repository root")
        .flatten()
    {
        let path = entry.path();
        if path.join("Cargo.toml").is_file() {
            dirs.push(path.clone());
            dirs.push(path.join("client-tests"));
        }
    }
    for dir in dirs {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let is_md = path.extension().is_some_and(|e| e == "md");
            let in_docs = dir.ends_with("docs");
            let is_readme = path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("README"));
            if is_md && (in_docs || is_readme) {
                files.push(path);
            }
        }
    }
    files.sort();
    files.dedup();
    files
}

/// Lines outside fenced code blocks, with their 1-based numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push((i + 1, line));
        }
    }
    out
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        if let Some(heading) = line.strip_prefix('#') {
            let base = slug(heading.trim_start_matches('#'));
            // Repeated headings get -1, -2, ... as on GitHub.
            let mut name = base.clone();
            let mut n = 0;
            while !seen.insert(name.clone()) {
                n += 1;
                name = format!("{base}-{n}");
            }
        }
    }
    seen
}

/// `[text](target)` targets on one line.
fn link_targets(line: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find("](") {
        let after = &rest[i + 2..];
        let Some(end) = after.find(')') else { break };
        let target = after[..end].split_whitespace().next().unwrap_or("");
        out.push(target);
        rest = &after[end..];
    }
    out
}

#[test]
fn every_relative_link_and_anchor_exists() {
    let mut broken = Vec::new();
    for file in markdown_files() {
        let text = fs::read_to_string(&file).expect("read a Markdown file");
        let dir = file.parent().expect("a file has a parent");
        for (n, line) in prose_lines(&text) {
            for target in link_targets(line) {
                if target.contains("://") || target.starts_with("mailto:") || target.is_empty() {
                    continue;
                }
                let (path, anchor) = match target.split_once('#') {
                    Some((p, a)) => (p, Some(a)),
                    None => (target, None),
                };
                let resolved = if path.is_empty() {
                    file.clone()
                } else {
                    dir.join(path)
                };
                if !resolved.exists() {
                    broken.push(format!("{}:{n}: `{target}`: no such file", file.display()));
                    continue;
                }
                if let Some(anchor) = anchor {
                    let is_md = resolved.extension().is_some_and(|e| e == "md");
                    if is_md {
                        let heads = anchors(&fs::read_to_string(&resolved).unwrap_or_default());
                        if !heads.contains(anchor) {
                            broken.push(format!(
                                "{}:{n}: `{target}`: {} has no heading with anchor #{anchor}",
                                file.display(),
                                resolved.display()
                            ));
                        }
                    }
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The repository's top-level folders: a backticked path starting with one must exist.
fn top_level_dirs() -> Vec<String> {
    fs::read_dir(root())
        .expect("read the repository root")
        .flatten()
        .filter(|e| e.path().is_dir())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| !n.starts_with('.') && n != "target")
        .collect()
}

fn is_repo_path(token: &str, tops: &[String]) -> bool {
    let placeholder = |c: char| "<>*{}$…|=, ".contains(c) || c == '\\';
    let Some((first, _)) = token.split_once('/') else {
        return false;
    };
    tops.iter().any(|t| t == first) && !token.contains(placeholder) && !token.contains("..")
}

/// Guides that walk through a crate of the reader's own: their paths are that crate's.
const DESCRIBES_ANOTHER_CRATE: &[&str] =
    &["docs/YOUR-OWN-KERNEL.md", "docs/BRING-YOUR-OWN-KERNEL.md"];

#[test]
fn every_repository_path_in_backticks_exists() {
    let mut tops = top_level_dirs();
    tops.extend(["src", "tests", "kernels", "examples", "benches"].map(String::from));
    let mut missing = Vec::new();
    for file in markdown_files() {
        if DESCRIBES_ANOTHER_CRATE.iter().any(|d| file.ends_with(d)) {
            continue;
        }
        // A crate's README names paths in that crate; the README and docs/ in the repository.
        let base = if file.parent() == Some(root().join("docs").as_path()) {
            root()
        } else {
            file.parent().expect("a file has a parent").to_path_buf()
        };
        let text = fs::read_to_string(&file).expect("read a Markdown file");
        for (n, line) in prose_lines(&text) {
            for (i, token) in line.split('`').enumerate() {
                // Odd pieces are inside backticks.
                if i % 2 == 1 && is_repo_path(token, &tops) {
                    let path = token.split(['#', ':']).next().unwrap_or(token);
                    if !root().join(path).exists() && !base.join(path).exists() {
                        missing.push(format!("{}:{n}: `{token}`", file.display()));
                    }
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "paths that do not exist:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_readme_stays_short() {
    let lines = fs::read_to_string(root().join("README.md"))
        .expect("read README.md")
        .lines()
        .count();
    assert!(
        lines <= 400,
        "README.md has {lines} lines: move detail into docs/ (limit 400)"
    );
}

#[test]
fn slugs_follow_github() {
    assert_eq!(
        slug(" The device suite without a GPU (hip-emu)"),
        "the-device-suite-without-a-gpu-hip-emu"
    );
    assert_eq!(
        slug(" `hip-doctor --report DIR`"),
        "hip-doctor---report-dir"
    );
}
