//! Causal attention of the device backend on the fused QKV projection, through the strided
//! launchers of `hip_kernels::ops` (the device twins of the CPU functions
//! `cpu_backend` calls).

use crate::backend::Dims;
use crate::error::{Result, TrainError};
use hip_kernels::params::DeviceElement;
use hip_rt::{DeviceBuffer, Stream};

fn missing() -> TrainError {
    TrainError::Op(
        "attention on the device needs hip_kernels::ops::attention_forward_strided / \
         attention_backward_strided, which this build does not have yet; use --device cpu"
            .into(),
    )
}

/// Writes `out` `[B, T, H, D]` and `lse` `[B, H, T]` from `qkv` `[B, T, 3, H, D]`.
pub fn forward<T: DeviceElement>(
    _stream: &Stream,
    _d: &Dims,
    _qkv: &DeviceBuffer<T>,
    _out: &mut DeviceBuffer<T>,
    _lse: &mut DeviceBuffer<f32>,
) -> Result<()> {
    Err(missing())
}

/// Writes `dqkv` `[B, T, 3, H, D]`.
pub fn backward<T: DeviceElement>(
    _stream: &Stream,
    _d: &Dims,
    _qkv: &DeviceBuffer<T>,
    _out: &DeviceBuffer<T>,
    _dout: &DeviceBuffer<T>,
    _lse: &DeviceBuffer<f32>,
    _dqkv: &mut DeviceBuffer<T>,
) -> Result<()> {
    Err(missing())
}
