//! The subcommands beside training: `plot` (training logs to SVG/PNG) and `sft-preview` (how
//! SFT data will be tokenised, masked and packed). A first argument naming one of them selects
//! it; every other command line is the trainer's own, unchanged (`--model … --data …`).

use std::ffi::OsString;
use std::process::ExitCode;

/// The subcommands, by name.
pub const SUBCOMMANDS: [&str; 2] = ["plot", "sft-preview"];

/// Run the subcommand the process's first argument names; `None` when it names none.
pub fn dispatch() -> Option<ExitCode> {
    dispatch_args(std::env::args_os().skip(1).collect())
}

/// [`dispatch`] on `args` (the command line without the program name).
pub fn dispatch_args(args: Vec<OsString>) -> Option<ExitCode> {
    let mut it = args.into_iter();
    let first = it.next()?;
    match first.to_str()? {
        "plot" => Some(crate::plot::main_with(it.collect())),
        "sft-preview" => Some(crate::sft::preview::main_with(it.collect())),
        _ => None,
    }
}
