//! `hip-doctor`: checks a DTK / ROCm install and says what works, what doesn't, and what to do.
//!
//! The binary (`src/main.rs`) is a thin shell around [`parse_args`], [`run`] and the
//! renderings of [`report::Report`]. Everything here is built to keep going: each probe runs
//! under [`guard::guarded`], so a failure in one becomes a FAIL row and the report still prints.
//!
//! Sections, in order: Environment (variables, `/dev/kfd`, groups, the HIP runtime and BLAS
//! libraries), Python stack (what pip installed: torch's build, pairings, libraries, archs),
//! Embedded kernels, Devices, Checks per device, Several devices (RCCL), CPU
//! reference self-check, Benchmarks (with `--bench`), Diagnosis.

pub mod account;
pub mod alloc_check;
pub mod bench;
pub mod device_checks;
pub mod device_report;
pub mod diagnose;
pub mod env;
pub mod guard;
pub mod hip;
pub mod kernel_bench;
pub mod kernel_checks;
pub mod kernels;
pub mod progress;
pub mod python;
pub mod rccl_checks;
pub mod report;
pub mod selfcheck;

use diagnose::{DeviceState, Facts, KernelState, LibraryState};
use guard::{guarded, with_progress};
use report::{Report, Section, Status};

/// What the command line asked for.
#[derive(Debug, Clone, PartialEq, Eq, Default, clap::Parser)]
#[command(
    name = "hip-doctor",
    version,
    about = "hip-doctor: check a DTK / ROCm install for hip-kernels",
    after_help = AFTER_HELP
)]
pub struct Options {
    /// Print the whole report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Also run short microbenchmarks (needs a device).
    #[arg(long)]
    pub bench: bool,
    /// Instead of the checks: the first-run device report. Every kernel at GPT-2 124M's
    /// training shapes beside hipBLAS, bandwidth against the device's peak, attention against
    /// its static estimate, and GEMM tuning; writes device-report.json, device-report.md and
    /// gemm-tuning.txt into DIR. Small shapes on an emulated device.
    #[arg(long, value_name = "DIR")]
    pub report: Option<std::path::PathBuf>,
    /// With --report: small shapes on a real device too (a smoke run).
    #[arg(long, requires = "report")]
    pub small: bool,
    /// The Python stack section's options.
    #[command(flatten)]
    pub python: python::PythonArgs,
}

/// What `--help` prints after the options.
const AFTER_HELP: &str = "\
Exit status: 0 when every check passed, 1 when a check failed or could not run,
2 for a usage error.

Variables: HIPK_HIP_LIBRARY (HIP runtime file to load), HIPK_GOLDEN_DIR (extra
golden-case directories, colon-separated), HIP_VISIBLE_DEVICES, HIPK_RCCL_LIBRARY
(RCCL file to load), HSA_FORCE_FINE_GRAIN_PCIE. Python stack: VIRTUAL_ENV,
CONDA_PREFIX (the interpreter when --python is not given), HSA_OVERRIDE_GFX_VERSION,
MIOPEN_USER_DB_PATH, MIOPEN_CUSTOM_CACHE_DIR, MIOPEN_DISABLE_CACHE, LD_LIBRARY_PATH.";

/// A parsed command line.
#[derive(Debug)]
pub enum Command {
    /// Run the checks.
    Run(Options),
    /// Print this text (`--help`, `--version`) on stdout and exit 0.
    Print(String),
}

/// A command line hip-doctor does not understand: clap's message (it names the argument and
/// points to `--help`). The binary exits 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(String);

/// Parses the arguments after the program name. They are `OsString`s (or anything that becomes
/// one), so an argument that is not UTF-8 is clap's usage error, never a panic.
pub fn parse_args<I, T>(args: I) -> Result<Command, UsageError>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString>,
{
    use clap::error::ErrorKind;
    use clap::Parser;
    let argv = std::iter::once(std::ffi::OsString::from("hip-doctor"))
        .chain(args.into_iter().map(Into::into));
    match Options::try_parse_from(argv) {
        Ok(options) => Ok(Command::Run(options)),
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            Ok(Command::Print(e.render().to_string()))
        }
        Err(e) => Err(UsageError(e.render().to_string())),
    }
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
    let env_index = report.sections.len() - 1;
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
    if devices.all_emulated() {
        mark_emulated_runtime(&mut report.sections[env_index]);
    }
    let python_rows = guarded(python::TITLE, || {
        let (targets, targets_from) = python::targets(&options.python, &devices);
        let ctx = python::Context {
            targets,
            targets_from,
            installed: python::probe_installed(&env, &library, &devices),
            loader: python::probe_loader(&env),
        };
        let env_input = python::envrows::probe(&env);
        with_progress("reading the Python stack", || {
            python::section(&options.python, &ctx, &env_input).items
        })
    });
    let python_section = Section {
        title: python::TITLE.into(),
        items: python_rows,
    };
    let python_diagnosis = python::diagnosis(&python_section);
    report.sections.insert(env_index + 1, python_section);
    push_device_checks(&mut report, &devices);
    let rccl_rows = guarded(rccl_checks::TITLE, || {
        rccl_checks::section(&devices, options.bench).items
    });
    report.push(Section {
        title: rccl_checks::TITLE.into(),
        items: rccl_rows,
    });

    // Shows its own progress (cases done of all).
    let selfcheck = guarded("CPU reference self-check", || selfcheck::section().items);
    report.push(Section {
        title: "CPU reference self-check".into(),
        items: selfcheck,
    });

    if options.bench {
        let mut items = guarded("Benchmarks", || bench::section(&devices).items);
        if devices.all_emulated() {
            for item in items.iter_mut().filter(|i| i.status == Status::Info) {
                item.detail = format!("{} [{}]", item.detail, hip_rt::EMULATED_FIGURE_LABEL);
            }
        }
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
        let mut rules = diagnose::diagnose(facts);
        rules.items.extend(python_diagnosis);
        account::account_for(rules, &report.sections).items
    });
    report.push(Section {
        title: "Diagnosis".into(),
        items: diagnosis,
    });
    report
}

/// On hip-emu (every device emulated) a missing or closed `/dev/kfd` is expected: its row
/// becomes INFO saying so instead of FAIL.
fn mark_emulated_runtime(env_section: &mut Section) {
    for item in env_section
        .items
        .iter_mut()
        .filter(|i| i.name == env::KFD && i.status != Status::Pass)
    {
        item.status = Status::Info;
        item.detail = format!(
            "{} — not needed: the HIP runtime is hip-emu (EMULATED, runs on the CPU)",
            item.detail
        );
        item.hint = None;
    }
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
        assert!(matches!(args(&[]), Ok(Command::Run(o)) if o == Options::default()));
        assert!(matches!(
            args(&["--json", "--bench"]),
            Ok(Command::Run(Options {
                json: true,
                bench: true,
                report: None,
                small: false,
                ..
            }))
        ));
        let Ok(Command::Run(o)) = args(&["--report", "out", "--small"]) else {
            panic!("--report DIR --small parses")
        };
        assert_eq!(
            (o.report.as_deref(), o.small),
            (Some(std::path::Path::new("out")), true)
        );
        assert!(args(&["--small"]).is_err(), "--small needs --report");
        let Ok(Command::Run(o)) = args(&[
            "--python",
            "/venv/bin/python",
            "--site-packages",
            "a",
            "--site-packages",
            "b",
            "--arch",
            "gfx928,gfx936",
            "--python-import",
        ]) else {
            panic!("the Python stack options parse")
        };
        assert_eq!(
            o.python,
            python::PythonArgs {
                python: Some("/venv/bin/python".into()),
                site_packages: vec!["a".into(), "b".into()],
                arch: vec!["gfx928".into(), "gfx936".into()],
                python_import: true,
            }
        );
        let Ok(Command::Print(help)) = args(&["--json", "--help"]) else {
            panic!("--help prints the usage")
        };
        assert!(
            help.contains("--json") && help.contains("--bench") && help.contains("Exit status"),
            "{help}"
        );
        let err = args(&["--jsn"])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("--jsn") && err.contains("--help"), "{err}");
    }
}
