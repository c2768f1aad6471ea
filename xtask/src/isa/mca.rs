//! `llvm-mca-15 -mcpu=gfx906` on a hot loop: LLVM 15's gfx906 scheduling model (one
//! instruction dispatched per cycle per wave, register-dependency latencies: VMEM 80, LDS 5,
//! ...). It does not model `s_waitcnt`, other waves, or bandwidth; its cycles per iteration
//! are a single-wave, dependency-bound figure in issue cycles, reported as such.

use std::io::Write;
use std::process::{Command, Stdio};

const ITERATIONS: u32 = 100;

/// Cycles per iteration (`Total Cycles / Iterations`) and the block reciprocal throughput.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mca {
    pub cycles_per_iter: f64,
    pub block_rthroughput: f64,
}

/// Run llvm-mca on `instrs` (`mnemonic operands`); branches to labels are dropped (mca cannot
/// resolve them; the report counts them itself).
pub fn run(tool: &str, arch: &str, instrs: &[(&str, &str)]) -> Result<Mca, String> {
    let mut body = String::new();
    for (m, ops) in instrs {
        if m.starts_with("s_branch") || m.starts_with("s_cbranch") {
            continue;
        }
        body.push_str(m);
        body.push(' ');
        body.push_str(ops);
        body.push('\n');
    }
    let mut child = Command::new(tool)
        .args([
            "-mtriple=amdgcn-amd-amdhsa",
            &format!("-mcpu={arch}"),
            &format!("-iterations={ITERATIONS}"),
            "-instruction-info=0",
            "-resource-pressure=0",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {tool}: {e}"))?;
    child
        .stdin
        .take()
        .ok_or("no stdin")?
        .write_all(body.as_bytes())
        .map_err(|e| format!("writing to {tool}: {e}"))?;
    let out = child
        .wait_with_output()
        .map_err(|e| format!("{tool}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{tool} failed: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .next()
                .unwrap_or("")
        ));
    }
    parse(&String::from_utf8_lossy(&out.stdout))
}

fn parse(text: &str) -> Result<Mca, String> {
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(key))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .ok_or_else(|| format!("llvm-mca output has no `{key}`"))
    };
    let iters = field("Iterations:")?;
    let cycles = field("Total Cycles:")?;
    Ok(Mca {
        cycles_per_iter: cycles / iters.max(1.0),
        block_rthroughput: field("Block RThroughput:")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_summary() {
        let m = parse(
            "Iterations:        100\nInstructions:      7500\nTotal Cycles:      7501\n\
             Dispatch Width:    1\nBlock RThroughput: 75.0\n",
        )
        .unwrap();
        assert_eq!((m.cycles_per_iter, m.block_rthroughput), (75.01, 75.0));
        assert!(parse("nothing").is_err());
    }
}
