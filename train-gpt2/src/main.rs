//! `train_gpt2`: train a GPT-2 with hip-kernels' ops, matching PyTorch step for step
//! (docs/TRAIN-GPT2.md): `cargo run --release --bin train_gpt2 -- --model DIR --data FILE`.
//!
//! Exit status: 0 done, 1 failed at run time, 2 bad usage.

use clap::Parser;
use hipk_train_gpt2::{cli, train};
use std::process::ExitCode;

fn main() -> ExitCode {
    let args = match cli::Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let code = e.exit_code();
            let _ = e.print();
            return ExitCode::from(code.clamp(0, 255) as u8);
        }
    };
    match train::run(&args) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
