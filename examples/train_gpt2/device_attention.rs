//! Causal attention of the device backend straight on the fused QKV projection, through the
//! strided launchers of `hip_kernels::ops` (the device twins of the CPU functions
//! `cpu_backend` calls, with the same layouts).

use crate::backend::Dims;
use crate::cpu_backend::op;
use crate::error::Result;
use hip_kernels::ops;
use hip_kernels::params::{DeviceElement, OnDevice};
use hip_rt::{DeviceBuffer, DeviceView, Stream};

/// Writes `out` `[B, T, H, D]` and `lse` `[B, H, T]` from `qkv` `[B, T, 3, H, D]`.
pub fn forward<T: DeviceElement>(
    stream: &Stream,
    d: &Dims,
    qkv: &DeviceBuffer<T>,
    out: &mut DeviceBuffer<T>,
    lse: &mut DeviceBuffer<f32>,
) -> Result<()> {
    ops::attention_forward_strided(
        stream,
        d.attention_forward_args::<OnDevice, T>(qkv, out, lse),
    )
    .map_err(op)
}

/// Writes `dqkv` `[B, T, 3, H, D]` (every element: the three layouts tile it).
pub fn backward<T: DeviceElement>(
    stream: &Stream,
    d: &Dims,
    qkv: &DeviceBuffer<T>,
    out: &DeviceBuffer<T>,
    dout: &DeviceBuffer<T>,
    lse: &DeviceBuffer<f32>,
    dqkv: &mut DeviceBuffer<T>,
) -> Result<()> {
    let ins: [&dyn DeviceView<T>; 3] = [qkv, out, dout];
    ops::attention_backward_strided(
        stream,
        d.attention_backward_args::<OnDevice, T>(ins, lse, dqkv),
    )
    .map_err(op)
}
