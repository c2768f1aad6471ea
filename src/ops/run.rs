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
//! `launch!` macro of this module, one line per struct, which also makes the family's
//! `Kernels<T>`); [`Kernels`] bundles every family's (the `registry!` list of `src/ops/mod.rs`).

#[cfg(doc)]
use super::Kernels;
use super::OpError;
use crate::params::Space;
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

/// For the op structs of one family, `$op<$lifetimes, S, $t>` (written `$op[$lifetimes] $t`;
/// `$t`, the storage type's name, where the struct has one): [`Launch`] for [`Host`]
/// (`crate::cpu::$cpu`) and [`OnDevice`] (`crate::ops::$device`), [`Run`] on any space that
/// launches it, and the family's `Kernels<T>` (every struct of the family on one space), which
/// [`crate::ops::Kernels`] bundles. The functions take the struct or what it converts `into`.
macro_rules! launch {
    ($($op:ident [$($lt:lifetime),+] $($t:ident)? => $cpu:ident, $device:ident;)*) => {
        $(
            impl<$($lt,)+ $($t: $crate::params::DeviceElement)?>
                $crate::ops::Launch<$op<$($lt,)+ $crate::params::Host $(, $t)?>>
                for $crate::params::Host
            {
                #[allow(clippy::useless_conversion)]
                fn launch(
                    args: $op<$($lt,)+ $crate::params::Host $(, $t)?>,
                    (): (),
                ) -> Result<(), $crate::ops::OpError> {
                    $crate::cpu::$cpu(args.into()).map(|_| ()).map_err(Into::into)
                }
            }

            impl<$($lt,)+ $($t: $crate::params::DeviceElement)?>
                $crate::ops::Launch<$op<$($lt,)+ $crate::params::OnDevice $(, $t)?>>
                for $crate::params::OnDevice
            {
                #[allow(clippy::useless_conversion)]
                fn launch(
                    args: $op<$($lt,)+ $crate::params::OnDevice $(, $t)?>,
                    stream: &hip_rt::Stream,
                ) -> Result<(), $crate::ops::OpError> {
                    $crate::ops::$device(stream, args.into())
                }
            }

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
        )*

        /// Every op struct of this family for storage type `T` on the space `Self` (part of
        /// [`crate::ops::Kernels`]); blanket-implemented for every space that launches them.
        pub trait Kernels<T: $crate::params::DeviceElement>:
            $crate::params::Space $(+ for<$($lt),+> $crate::ops::Launch<$op<$($lt,)+ Self $(, $t)?>>)*
        {
        }

        impl<T: $crate::params::DeviceElement, S> Kernels<T> for S where
            S: $crate::params::Space $(+ for<$($lt),+> $crate::ops::Launch<$op<$($lt,)+ S $(, $t)?>>)*
        {
        }
    };
}

pub(crate) use launch;
