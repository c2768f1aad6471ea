//! `train_gpt2`: the trainer under its first name, kept so that existing commands work
//! unchanged (docs/TRAIN-GPT2.md): `cargo run --release --bin train_gpt2 -- --model DIR --data FILE`.
//! The same program as `hipk-train`.
//!
//! Exit status: 0 done, 1 failed at run time, 2 bad usage.

fn main() -> std::process::ExitCode {
    hipk_train::cli::main_as("train_gpt2")
}
