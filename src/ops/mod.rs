//! Device launchers, with the CPU reference's names and arguments plus a [`hip_rt::Stream`].
//!
//! Every launcher validates shapes, lengths and devices into [`OpError`] before launching
//! anything; without HIP kernels in the build it returns [`OpError::KernelsNotBuilt`].
//! None of them has run on a GPU yet.

mod adamw;
mod attention;
mod error;
mod launch;
mod layernorm;
mod matmul;

pub use adamw::{
    adamw, adamw_master, adamw_multi, l2_norm, non_finite, AdamwTensor, DeviceStep, CHUNK,
};
pub use attention::{attention_backward, attention_forward, AttentionPlan, MAX_HEAD_DIM};
pub use error::OpError;
pub use launch::DeviceElement;
pub use layernorm::{layernorm_backward, layernorm_forward, RowPlan, MAX_COLS};
pub use matmul::{matmul, MatmulPlan, MatmulTile};
