//! bindgen output. `hip_runtime.rs` is written by `cargo run -p xtask -- bindings` from the HIP
//! 5.2 headers (Debian's libamdhip64-dev) and checked in; with the `bindgen` feature the same
//! generator (`hip-sys/generator.rs`) runs at build time against `$ROCM_PATH/include` instead.
//! Never edit the generated file by hand.
//!
//! [`HipApi`] is bindgen's dynamic-loading table: each pub field is
//! `Result<unsafe extern "C" fn(..), libloading::Error>`. Read the fields (through
//! [`crate::sym!`] or [`crate::Hip::resolve`]); do not call bindgen's same-named methods, which
//! panic when the symbol is missing.
#![allow(
    non_upper_case_globals,
    non_camel_case_types,
    non_snake_case,
    dead_code,
    unsafe_op_in_unsafe_fn,
    clippy::all,
    clippy::pedantic,
    clippy::undocumented_unsafe_blocks,
    rustdoc::all,
    missing_docs
)]

#[cfg(not(feature = "bindgen"))]
include!("hip_runtime.rs");

#[cfg(feature = "bindgen")]
include!(concat!(env!("OUT_DIR"), "/hip_runtime.rs"));
