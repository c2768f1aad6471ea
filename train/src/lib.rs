//! A GPT-2 trainer on hip-kernels' ops, matching PyTorch step for step (docs/TRAIN-GPT2.md).
//!
//! The model ([`model::Gpt2`]) is written once against [`backend::Backend`]; the backends differ
//! only in where tensors live and which function runs an op ([`op_runner::OpRunner`]): the CPU reference
//! ([`cpu_backend::Cpu`], `hip_kernels::cpu`) or a HIP device ([`device_backend::DeviceBackend`],
//! `hip_kernels::ops` on a stream). [`train::run`] is the whole command line; the `train_gpt2`
//! binary is a thin wrapper around it.
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
pub mod llama;
pub mod lora;
pub mod model;
pub mod op_runner;
pub mod outputs;
pub mod parallel;
pub mod params;
pub mod plot;
pub mod sft;
pub mod subcommands;
pub mod train;
pub mod trainer_state;
pub mod weights;

#[cfg(test)]
mod tests;
