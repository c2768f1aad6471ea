//! `hip-doctor`: checks a DTK / ROCm install and says what works, what doesn't, and what to do.
//!
//! The binary (`src/bin/hip-doctor.rs`) is a thin shell around [`parse_args`], [`run`] and the
//! renderings of [`report::Report`]. Everything here is built to keep going: each probe runs
//! under [`guard::guarded`], so a failure in one becomes a FAIL row and the report still prints.
//!
//! Sections, in order: Environment (variables, `/dev/kfd`, groups, the HIP runtime and BLAS
//! libraries), Embedded kernels, Devices, Checks per device, CPU reference self-check,
//! Benchmarks (with `--bench`), Diagnosis.

pub mod alloc_check;
pub mod bench;
pub mod device_checks;
pub mod diagnose;
pub mod env;
pub mod guard;
pub mod hip;
pub mod json;
pub mod kernel_bench;
pub mod kernel_checks;
pub mod kernels;
pub mod report;
pub mod selfcheck;

use diagnose::{DeviceState, Facts, KernelState, LibraryState};
use guard::{guarded, with_progress};
use report::{Report, Section};

/// What the command line asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Options {
    /// Print the report as JSON instead of text.
    pub json: bool,
    /// Also run the short microbenchmarks.
    pub bench: bool,
}

/// A parsed command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Run the checks.
    Run(Options),
    /// Print [`USAGE`] and exit 0.
    Help,
}

/// A command line hip-doctor does not understand.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown argument {arg:?}; run `hip-doctor --help` for the options")]
pub struct UsageError {
    /// The argument as given.
    pub arg: String,
}

/// The `--help` text.
pub const USAGE: &str = "\
hip-doctor: check a DTK / ROCm install for hip-kernels

usage: hip-doctor [--json] [--bench]

  --json    print the whole report as JSON on stdout
  --bench   also run short microbenchmarks (needs a device)
  --help    print this text

Exit status: 0 when every check passed, 1 when a check failed or could not run,
2 for a usage error.

Variables: HIPK_HIP_LIBRARY (HIP runtime file to load), HIPK_GOLDEN_DIR (extra
golden-case directories, colon-separated), HIP_VISIBLE_DEVICES.";

/// Parses the arguments after the program name.
pub fn parse_args<I: IntoIterator<Item = String>>(args: I) -> Result<Command, UsageError> {
    let mut options = Options::default();
    for arg in args {
        match arg.as_str() {
            "--json" => options.json = true,
            "--bench" => options.bench = true,
            "--help" | "-h" => return Ok(Command::Help),
            _ => return Err(UsageError { arg }),
        }
    }
    Ok(Command::Run(options))
}

/// Runs every probe and check and returns the report.
pub fn run(options: &Options) -> Report {
    let mut report = Report::default();

    let Some(env) = guarded_value(&mut report, "Environment", env::EnvFacts::probe) else {
        return report;
    };
    let mut env_section = env.section();

    let mut loaded = None;
    env_section.items.extend(guarded("HIP runtime", || {
        let (hip, state, item) = with_progress("loading the HIP runtime", hip::library);
        loaded = Some((hip, state));
        vec![item]
    }));
    env_section.items.extend(guarded("hipBLAS / rocBLAS", || {
        with_progress("loading hipBLAS / rocBLAS", hip::blas_items)
    }));
    report.push(env_section);
    let (hip, library) = match loaded {
        Some((hip, state)) => (Some(hip), state),
        None => (None, LibraryState::NotInBuild),
    };

    let mut kernels = KernelState::NotInBuild;
    let kernel_rows = guarded("Embedded kernels", || {
        kernels = kernels::state();
        kernels::section().items
    });
    report.push(Section {
        title: "Embedded kernels".into(),
        items: kernel_rows,
    });

    let mut devices = DeviceState::NotChecked("the HIP runtime check did not finish".into());
    let device_rows = guarded("devices", || {
        if let Some(hip) = &hip {
            devices = with_progress("querying devices", || hip::devices(hip));
        }
        hip::device_section(&devices, &kernels).items
    });
    report.push(Section {
        title: "Devices".into(),
        items: device_rows,
    });
    push_device_checks(&mut report, &devices);

    let selfcheck = guarded("CPU reference self-check", || {
        with_progress("running the CPU reference on the golden cases", || {
            selfcheck::section().items
        })
    });
    report.push(Section {
        title: "CPU reference self-check".into(),
        items: selfcheck,
    });

    if options.bench {
        let items = guarded("Benchmarks", || bench::section(&devices).items);
        report.push(Section {
            title: "Benchmarks".into(),
            items,
        });
    }

    let diagnosis = guarded("Diagnosis", || {
        let facts = Facts {
            env: &env,
            library: &library,
            devices: &devices,
            kernels: &kernels,
        };
        diagnose::diagnose(facts).items
    });
    report.push(Section {
        title: "Diagnosis".into(),
        items: diagnosis,
    });
    report
}

/// One "Checks (device N)" section per device, or one skipped row saying why there are none.
fn push_device_checks(report: &mut Report, devices: &DeviceState) {
    let ordinals: Vec<usize> = match devices {
        DeviceState::Found(list) => list.iter().map(|d| d.ordinal).collect(),
        DeviceState::NoDevice(_) => {
            report.push(device_checks::no_device_section(
                "no HIP device is visible (see Devices)",
            ));
            return;
        }
        DeviceState::NotChecked(why) | DeviceState::Error(why) => {
            report.push(device_checks::no_device_section(why));
            return;
        }
    };
    for ordinal in ordinals {
        let title = format!("Checks (device {ordinal})");
        let items = guarded(&title, || device_checks::section(ordinal).items);
        report.push(Section { title, items });
    }
}

/// Runs a probe that returns a value; a panic becomes a FAIL row in a section named `title`.
fn guarded_value<T>(report: &mut Report, title: &str, probe: impl FnOnce() -> T) -> Option<T> {
    let mut value = None;
    let rows = guarded(title, || {
        value = Some(probe());
        Vec::new()
    });
    if !rows.is_empty() {
        report.push(Section {
            title: title.into(),
            items: rows,
        });
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Result<Command, UsageError> {
        parse_args(list.iter().map(|s| s.to_string()))
    }

    #[test]
    fn arguments_parse() {
        assert_eq!(args(&[]), Ok(Command::Run(Options::default())));
        assert_eq!(
            args(&["--json", "--bench"]),
            Ok(Command::Run(Options {
                json: true,
                bench: true
            }))
        );
        assert_eq!(args(&["--json", "--help"]), Ok(Command::Help));
        let err = args(&["--jsn"])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("\"--jsn\"") && err.contains("--help"), "{err}");
    }
}
