//! `hipk-train`: train GPT-2 or a LLaMA-family model with hip-kernels' ops, matching PyTorch
//! step for step: `cargo run --release --bin hipk-train -- --model DIR --data FILE`. The family
//! is the model directory's `config.json` `model_type`.
//!
//! Exit status: 0 done, 1 failed at run time, 2 bad usage.

fn main() -> std::process::ExitCode {
    hipk_train::cli::main_as("hipk-train")
}
