//! Project tasks (`cargo xtask <task>`, an alias of `cargo run -q -p xtask --`):
//! - `bindings [--check] [--include DIR]`: regenerate `hip-sys/src/generated/*` from the HIP
//!   headers (default `/usr/include`), or with `--check` fail if regenerating would change the
//!   checked-in files by a single byte.
//! - `isa-report [--arch gfx906] [--json] [--check BASELINE] [--write-baseline]
//!   [--verify-markers]`: static ISA figures of every kernel (docs/ISA-REPORT.md).
//! - `isa-mc [--check] [--no-mca]`: static figures of the matrix-core matmul for gfx90a
//!   (matrix-unit busy fraction of its interior loop; docs/ISA-REPORT.md).
//! - `dist`: a release `hip-doctor` linked against glibc 2.17 (cargo-zigbuild), its symbol
//!   versions checked; prints the file's path last.

mod dist;
#[path = "../../hip-sys/generator.rs"]
mod generator;
mod isa;

use clap::{Parser, Subcommand};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(name = "xtask", about = "hip-kernels project tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand, Debug)]
enum Task {
    /// Regenerate (or --check) hip-sys/src/generated from the HIP headers.
    Bindings {
        #[arg(long)]
        check: bool,
        #[arg(long, default_value = "/usr/include")]
        include: PathBuf,
    },
    /// Static ISA report of kernels/*.hip (not measurements).
    IsaReport(isa::IsaArgs),
    /// Static figures of the matrix-core matmul for gfx90a (not measurements).
    IsaMc(isa::mc::McArgs),
    /// Build a portable release hip-doctor (glibc >= 2.17) and print its path last.
    Dist,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.task {
        Task::Bindings { check, include } => bindings(*check, include),
        Task::IsaReport(a) => isa::run(a),
        Task::IsaMc(a) => isa::mc::run(a),
        Task::Dist => dist::run().map_err(|e| e.to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("xtask: {msg}");
            ExitCode::FAILURE
        }
    }
}

fn bindings(check: bool, include: &Path) -> Result<(), String> {
    let out_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../hip-sys/src/generated");
    let generated = rustfmt(&generator::generate_hip_runtime(include)?)?;
    let path = out_dir.join(generator::HIP_RUNTIME_FILE);
    if check {
        let current = std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        if current != generated {
            return Err(format!(
                "{} is out of date with the generator/headers ({}):\n{}\nrun `cargo run -p xtask -- bindings` and commit the result",
                path.display(),
                include.display(),
                first_difference(&current, &generated)
            ));
        }
        println!("{} is up to date", path.display());
    } else {
        std::fs::write(&path, &generated)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        println!("wrote {} ({} bytes)", path.display(), generated.len());
    }
    Ok(())
}

/// `source` as rustfmt (edition 2021, the workspace's) formats it: the checked-in bindings pass
/// the same `rustfmt --check` as every other tracked file. `$RUSTFMT` overrides the binary.
fn rustfmt(source: &str) -> Result<String, String> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let program = std::env::var_os("RUSTFMT").unwrap_or_else(|| "rustfmt".into());
    let mut child = Command::new(&program)
        .args(["--edition", "2021", "--emit", "stdout"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            format!(
                "cannot run {}: {e} (install it with `rustup component add rustfmt`, or set RUSTFMT)",
                program.to_string_lossy()
            )
        })?;
    let mut stdin = child.stdin.take().ok_or("rustfmt: no stdin pipe")?;
    // Write from a thread: rustfmt may fill its stdout pipe before it has read all of stdin.
    let text = source.to_owned();
    let writer = std::thread::spawn(move || stdin.write_all(text.as_bytes()));
    let out = child
        .wait_with_output()
        .map_err(|e| format!("rustfmt did not finish: {e}"))?;
    writer
        .join()
        .map_err(|_| "rustfmt: the stdin writer panicked".to_string())?
        .map_err(|e| format!("cannot write to rustfmt: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "rustfmt failed on the generated bindings ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    String::from_utf8(out.stdout).map_err(|e| format!("rustfmt wrote non-UTF-8 output: {e}"))
}

/// A short, diff-like description of where two texts first differ.
fn first_difference(checked_in: &str, regenerated: &str) -> String {
    let (a, b): (Vec<&str>, Vec<&str>) =
        (checked_in.lines().collect(), regenerated.lines().collect());
    let n = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let at = |v: &[&str], i: usize| v.get(i).copied().unwrap_or("<end of file>").to_string();
    if n == a.len() && n == b.len() {
        return "the files differ only in line endings or a trailing newline".to_string();
    }
    format!(
        "first difference at line {} ({} lines checked in, {} regenerated):\n- {}\n+ {}",
        n + 1,
        a.len(),
        b.len(),
        at(&a, n),
        at(&b, n)
    )
}

#[cfg(test)]
mod tests {
    use super::first_difference;

    #[test]
    fn names_the_first_differing_line() {
        let msg = first_difference("a\nb\nc\n", "a\nB\nc\n");
        assert!(msg.contains("line 2"), "{msg}");
        assert!(msg.contains("- b") && msg.contains("+ B"), "{msg}");
        let msg = first_difference("a\n", "a\nextra\n");
        assert!(
            msg.contains("+ extra") && msg.contains("- <end of file>"),
            "{msg}"
        );
        let msg = first_difference("a\n", "a");
        assert!(msg.contains("trailing newline"), "{msg}");
    }
}
