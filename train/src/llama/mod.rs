//! The LLaMA family (`model_type` `llama` and `qwen2`): config, parameter layout, weights,
//! checkpoints and LoRA names (docs/TRAIN-LLAMA.md).

pub mod checkpoint;
pub mod config;
pub mod lora;
pub mod merge;
pub mod model;
pub mod params;
pub mod train;
pub mod weights;

pub use config::{Family, LlamaConfig};
pub use params::{Layout, Linear};
