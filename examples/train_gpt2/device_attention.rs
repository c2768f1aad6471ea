//! Causal attention of the device backend straight on the fused QKV projection, through the
//! strided launchers of `hip_kernels::ops` (the device twins of the CPU functions
//! `cpu_backend` calls, with the same layouts).

use crate::backend::Dims;
use crate::cpu_backend::op;
use crate::error::Result;
use hip_kernels::ops::{self, AttentionBackwardStrided, AttentionForwardStrided, Strided};
use hip_kernels::params::{DeviceElement, OnDevice};
use hip_rt::{DeviceBuffer, Stream};

/// Writes `out` `[B, T, H, D]` and `lse` `[B, H, T]` from `qkv` `[B, T, 3, H, D]`.
pub fn forward<T: DeviceElement>(
    stream: &Stream,
    d: &Dims,
    qkv: &DeviceBuffer<T>,
    out: &mut DeviceBuffer<T>,
    lse: &mut DeviceBuffer<f32>,
) -> Result<()> {
    let [q, k, v] = d
        .qkv_layouts()
        .map(|layout| Strided::<OnDevice, T> { data: qkv, layout });
    ops::attention_forward_strided(
        stream,
        AttentionForwardStrided::<OnDevice, T> {
            params: d.attention(),
            q,
            k,
            v,
            out,
            out_layout: d.bthd(),
            lse,
        },
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
    let [q, k, v] = d
        .qkv_layouts()
        .map(|layout| Strided::<OnDevice, T> { data: qkv, layout });
    let [dq, dk, dv] = d.qkv_layouts();
    ops::attention_backward_strided(
        stream,
        AttentionBackwardStrided::<OnDevice, T> {
            params: d.attention(),
            q,
            k,
            v,
            out: Strided {
                data: out,
                layout: d.bthd(),
            },
            dout: Strided {
                data: dout,
                layout: d.bthd(),
            },
            lse,
            dqkv,
            dq,
            dk,
            dv,
        },
    )
    .map_err(op)
}
