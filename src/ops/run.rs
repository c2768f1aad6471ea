//! One way to run any op: an op's argument struct runs itself on the space it was built for,
//! `args.run(queue)` ([`Run`]), where the queue is `()` for [`Host`] (the CPU reference) and the
//! stream for [`OnDevice`] (the launcher). Code written once over a space `S: Kernels<T>` runs
//! every op on the CPU and on a device alike:
//!
//! ```
//! use hip_kernels::ops::{Kernels, OpError, RmsNormForward, RmsNormParams, Run};
//! use hip_kernels::params::{DeviceElement, Host, Space};
//!
//! fn norm<'a, S: Kernels<T>, T: DeviceElement>(
//!     q: S::Queue<'_>,
//!     x: S::In<'a, T>,
//!     weight: S::In<'a, T>,
//!     y: S::Out<'a, T>,
//!     rstd: S::Out<'a, f32>,
//! ) -> Result<(), OpError> {
//!     let params = RmsNormParams { rows: 1, cols: 2, eps: 0.0 };
//!     RmsNormForward::<S, T> { params, x, weight, y, rstd }.run(q)
//! }
//!
//! let (mut y, mut rstd) = ([0.0f32; 2], [0.0f32; 1]);
//! norm::<Host, f32>((), &[3.0, 4.0], &[1.0, 1.0], &mut y, &mut rstd).unwrap();
//! assert!((y[0] - 3.0 / 12.5f32.sqrt()).abs() < 1e-6);
//! ```
//!
//! Each family implements [`Launch`] for its structs beside its CPU and device functions (the
//! `launch!` macro of this module, one line per struct); [`Kernels`] bundles them all.

use super::{
    AdamW, AttentionBackward, AttentionBackwardStrided, AttentionForward, AttentionForwardStrided,
    BiasBackward, ClipGradScale, EncoderBackward, EncoderForward, GeluBackward, GeluForward,
    LayerNormBackward, LayerNormForward, LinearCrossEntropy, Matmul, MatmulBias, OpError,
    ResidualAdd, ResidualLayerNormForward, ResidualRmsNormForward, RmsNormBackward,
    RmsNormForward, Rope, RopeBackward, SoftmaxCrossEntropy, SwigluBackward, SwigluForward,
};
use crate::params::{DeviceElement, Space};
#[cfg(doc)]
use crate::params::{Host, OnDevice};

/// How the space `Self` runs the op struct `A`: the CPU reference for [`Host`], the launcher
/// on the queue's stream for [`OnDevice`]. Call it through [`Run::run`].
pub trait Launch<A>: Space {
    /// Run `args` on `queue` (validated first, as the function it calls does).
    fn launch(args: A, queue: Self::Queue<'_>) -> Result<(), OpError>;
}

/// An op's argument struct, run on the space `S` it was built for: `args.run(())` on the host,
/// `args.run(&stream)` on a device (queued, no host wait unless the launcher's docs say so).
///
/// The CPU reference's extra results (the f64 mean loss of the cross-entropies) are dropped:
/// they are in the struct's outputs (`loss`, `totals`) too; call [`crate::cpu`] for the f64.
pub trait Run<S: Space> {
    /// Validate and run the op; a bad shape is [`OpError::Shape`], as from the function it
    /// calls.
    fn run(self, queue: S::Queue<'_>) -> Result<(), OpError>;
}

/// [`Launch`] for [`Host`] (`crate::cpu::$cpu`) and [`OnDevice`] (`crate::ops::$device`), and
/// [`Run`] on any space that launches it, for op structs `$op<$lifetimes, S, $t>` (written
/// `$op[$lifetimes] $t`; `$t`, the storage type's name, where the struct has one).
macro_rules! launch {
    ($($op:ident [$($lt:lifetime),+] $($t:ident)? => $cpu:ident, $device:ident;)*) => {$(
        impl<$($lt,)+ $($t: $crate::params::DeviceElement)?>
            $crate::ops::Launch<$op<$($lt,)+ $crate::params::Host $(, $t)?>> for $crate::params::Host
        {
            fn launch(
                args: $op<$($lt,)+ $crate::params::Host $(, $t)?>,
                (): (),
            ) -> Result<(), $crate::ops::OpError> {
                $crate::cpu::$cpu(args).map(|_| ()).map_err(Into::into)
            }
        }

        impl<$($lt,)+ $($t: $crate::params::DeviceElement)?>
            $crate::ops::Launch<$op<$($lt,)+ $crate::params::OnDevice $(, $t)?>>
            for $crate::params::OnDevice
        {
            fn launch(
                args: $op<$($lt,)+ $crate::params::OnDevice $(, $t)?>,
                stream: &hip_rt::Stream,
            ) -> Result<(), $crate::ops::OpError> {
                $crate::ops::$device(stream, args)
            }
        }

        $crate::ops::run::run_by_launch!($op[$($lt),+] $($t)?);
    )*};
}

/// [`Run`] for the op struct `$op<$lifetimes, S, $t>` (written `$op[$lifetimes] $t`, `$t` the
/// storage type's name when it has one) on every space that launches it.
macro_rules! run_by_launch {
    ($op:ident [$($lt:lifetime),+] $($t:ident)?) => {
        impl<$($lt,)+ S: $crate::ops::Launch<$op<$($lt,)+ S $(, $t)?>> $(, $t: hip_rt::Element)?>
            $crate::ops::Run<S> for $op<$($lt,)+ S $(, $t)?>
        {
            fn run(
                self,
                queue: <S as $crate::params::Space>::Queue<'_>,
            ) -> Result<(), $crate::ops::OpError> {
                S::launch(self, queue)
            }
        }
    };
}

pub(crate) use {launch, run_by_launch};

/// Every op's [`Launch`] for storage type `T` on one space: generic code takes `S: Kernels<T>`
/// and runs any op struct of `S` ([`Run`]). Implemented for every space that launches them all
/// ([`Host`] and [`OnDevice`]). A new op struct goes in the list below.
macro_rules! kernels {
    ($($op:ident [$($lt:lifetime),+] $($t:ident)?;)*) => {
        /// Every op for storage type `T` on the space `Self` (the CPU reference on [`Host`],
        /// the launchers on [`OnDevice`]): with `S: Kernels<T>`, `args.run(queue)` runs any op
        /// struct built for `S`. Blanket-implemented for every space that launches them all.
        pub trait Kernels<T: DeviceElement>: Space $(+ for<$($lt),+> Launch<$op<$($lt,)+ Self $(, $t)?>>)* {}

        impl<T: DeviceElement, S: Space $(+ for<$($lt),+> Launch<$op<$($lt,)+ S $(, $t)?>>)*> Kernels<T>
            for S
        {
        }
    };
}

kernels! {
    Matmul['a] T;
    MatmulBias['a] T;
    BiasBackward['a] T;
    LayerNormForward['a] T;
    ResidualLayerNormForward['a] T;
    LayerNormBackward['a] T;
    RmsNormForward['a] T;
    ResidualRmsNormForward['a] T;
    RmsNormBackward['a] T;
    Rope['a] T;
    RopeBackward['a] T;
    SwigluForward['a] T;
    SwigluBackward['a] T;
    AttentionForward['a] T;
    AttentionBackward['a] T;
    AttentionForwardStrided['a] T;
    AttentionBackwardStrided['a] T;
    SoftmaxCrossEntropy['a] T;
    LinearCrossEntropy['a] T;
    EncoderForward['a] T;
    EncoderBackward['a] T;
    GeluForward['a] T;
    GeluBackward['a] T;
    ResidualAdd['a] T;
    AdamW['a, 'b] T;
    ClipGradScale['a];
}
