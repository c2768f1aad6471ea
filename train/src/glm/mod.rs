//! The GLM family (`model_type` `glm`, transformers' `GlmForCausalLM`, and `chatglm`, THUDM's
//! layout of ChatGLM2/3-6B and GLM-4-9B-chat): the LLaMA model ([`crate::llama`]) with a fused
//! gate-up projection, 2 key/value groups and a partial, interleaved rotary embedding; this
//! module holds what differs: the `chatglm` config keys and both checkpoint layouts
//! (docs/TRAIN-GLM.md).

pub mod config;
pub mod convert;
pub mod lora;
pub mod params;
