//! A GPT-2 trainer on hip-kernels' ops, matching PyTorch step for step (docs/TRAIN-GPT2.md).
//!
//! The model ([`model::Gpt2`]) is written once against [`backend::Backend`]: it builds each op's
//! argument struct (`hip_kernels::ops`, named fields) on the backend's space and runs it with
//! `.run(backend.queue())` (`hip_kernels::ops::Run`): the CPU reference on the host
//! ([`cpu_backend::Cpu`], `hip_kernels::cpu`) or the launchers on a HIP device's stream
//! ([`device_backend::DeviceBackend`]). The backends differ only in where tensors live and what
//! else is not an op: allocation, copies, the step's scalars and the communication between ranks. [`train::run`] is the whole command line; the `train_gpt2`
//! binary is a thin wrapper around it.
//!
//! The LLaMA family (Llama, Qwen2; docs/TRAIN-LLAMA.md) is [`llama::model::Llama`] over the same
//! backends, chosen by `model_type` in `config.json` ([`config::ModelConfig`]).
//!
//! Exit status of the binary ([`error::TrainError::exit_code`]): 0 done, 1 failed at run time,
//! 2 bad usage.
#![deny(unsafe_op_in_unsafe_fn)]

mod agree;
pub mod backend;
pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod cpu_backend;
pub mod data;
pub mod device_backend;
pub mod error;
pub mod feed;
pub mod glm;
pub mod graph_step;
pub mod llama;
pub mod lora;
pub mod memory;
pub mod model;
pub mod offload;
pub mod outputs;
pub mod parallel;
pub mod params;
pub mod plot;
pub mod sft;
pub mod spm;
pub mod subcommands;
pub mod train;
pub mod trainer_state;
pub mod weights;
pub mod zero2;

#[cfg(test)]
mod tests;
