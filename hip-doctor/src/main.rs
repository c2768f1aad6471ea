//! `hip-doctor`: validates a DTK / ROCm install for hip-kernels in one command.
//!
//! Prints a report (text, or JSON with `--json`) and exits 0 only when every check passed;
//! 1 when something failed or could not run; 2 for a usage error. See `--help`.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use hip_doctor::{self as doctor, guard, Command};

fn main() -> ExitCode {
    guard::install_quiet_panic_hook();
    let options = match doctor::parse_args(std::env::args_os().skip(1)) {
        Ok(Command::Run(options)) => options,
        Ok(Command::Print(text)) => {
            print_out(&text);
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            let _ = write!(std::io::stderr(), "{e}");
            return ExitCode::from(2);
        }
    };
    if let Some(dir) = &options.report {
        return report_command(dir, options.small);
    }
    // `run` guards each check itself; this is the net under the renderers.
    let outcome = std::panic::catch_unwind(|| {
        let report = doctor::run(&options);
        let text = if options.json {
            report.to_json()
        } else {
            report.render_text(std::io::stdout().is_terminal())
        };
        (text, report.exit_code())
    });
    match outcome {
        Ok((text, code)) => {
            print_out(&text);
            ExitCode::from(u8::try_from(code).unwrap_or(1))
        }
        Err(_) => {
            let _ = writeln!(
                std::io::stderr(),
                "hip-doctor: internal error while building the report; please report it"
            );
            ExitCode::from(1)
        }
    }
}

/// `--report DIR`: the device report; exits 0 when every row ran and every file was written,
/// 1 otherwise, 2 for a DIR whose name is not UTF-8 (checked before anything runs).
fn report_command(dir: &std::path::Path, small: bool) -> ExitCode {
    if let Err(e) = doctor::device_report::check_dir(dir) {
        let _ = writeln!(std::io::stderr(), "hip-doctor --report: {e}");
        return ExitCode::from(if dir.to_str().is_none() { 2 } else { 1 });
    }
    let outcome = std::panic::catch_unwind(|| doctor::device_report::run(dir, small));
    match outcome {
        Ok(Ok(doctor::device_report::Outcome {
            report,
            written,
            write_errors,
        })) => {
            let mut text = String::new();
            for path in &written {
                text.push_str(&format!("wrote {}\n", path.display()));
            }
            for e in &write_errors {
                let _ = writeln!(std::io::stderr(), "hip-doctor --report: {e}");
            }
            let failed = report.rows.iter().filter(|r| r.error.is_some()).count()
                + report
                    .tuning
                    .shapes
                    .iter()
                    .filter(|s| s.error.is_some())
                    .count();
            text.push_str(&format!(
                "{} rows, {} GEMM shapes tuned, {failed} failed [{}] in {:.1} s\n",
                report.rows.len(),
                report.tuning.shapes.len(),
                report.label,
                report.elapsed_s
            ));
            print_out(&text);
            if report.all_ran() && write_errors.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Ok(Err(e)) => {
            let _ = writeln!(std::io::stderr(), "hip-doctor --report: {e}");
            ExitCode::from(1)
        }
        Err(_) => {
            let _ = writeln!(
                std::io::stderr(),
                "hip-doctor --report: internal error; please report it"
            );
            ExitCode::from(1)
        }
    }
}

/// Writes to stdout, ignoring a closed pipe (`hip-doctor | head` must not crash).
fn print_out(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}
