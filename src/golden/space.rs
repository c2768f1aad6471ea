//! Where a golden case runs, as one generic function per case: a [`GoldenSpace`] makes the
//! case's buffers from host data, hands them to the op struct as inputs and outputs, and reads
//! them back. [`Host`] (the CPU reference, buffers are `Vec`s, queue `()`) and [`OnDevice`] (the
//! launcher on a stream, buffers are `DeviceBuffer`s) implement it, so a case writes
//! `fn run<S: GoldenSpace>(&self, q: S::Queue<'_>)` once and [`crate::golden_runs!`] turns it
//! into [`super::GoldenCase::run_cpu`] and [`super::GoldenCase::run_device`].

use super::TensorData;
use crate::ops::{Kernels, OpError};
use crate::params::{DeviceElement as ParamElement, Host, OnDevice};
use half::{bf16, f16};
use hip_rt::{DeviceBuffer, DeviceView, DeviceViewMut, Element};

/// A space golden cases run on: every op for every storage type, and the buffers to feed them.
pub trait GoldenSpace: Kernels<f32> + Kernels<f16> + Kernels<bf16> {
    /// A buffer of `T` in this space.
    type Buf<T: Element>;

    /// A buffer holding `data`.
    ///
    /// # Host sync
    /// A synchronous copy on a device (golden and test paths only).
    fn upload<T: Element>(q: Self::Queue<'_>, data: &[T]) -> Result<Self::Buf<T>, OpError>;

    /// A zero-filled buffer of `len` elements.
    fn zeros<T: Element>(q: Self::Queue<'_>, len: usize) -> Result<Self::Buf<T>, OpError>;

    /// `buf` as an op's input.
    fn input<T: Element>(buf: &Self::Buf<T>) -> Self::In<'_, T>;

    /// `buf` as an op's output.
    fn output<T: Element>(buf: &mut Self::Buf<T>) -> Self::Out<'_, T>;

    /// The contents of `buf` on the host.
    ///
    /// # Host sync
    /// Waits for the queue's work on `buf` on a device, then copies synchronously.
    fn download<T: Element>(q: Self::Queue<'_>, buf: &Self::Buf<T>) -> Result<Vec<T>, OpError>;

    /// A buffer holding the case tensor `t` as `T` (`name` in errors when its type is not `T`).
    fn typed<T: ParamElement>(
        q: Self::Queue<'_>,
        t: &TensorData,
        op: &'static str,
        name: &'static str,
    ) -> Result<Self::Buf<T>, OpError> {
        Self::upload(q, t.typed::<T>(op, name)?)
    }

    /// A buffer of `len` NaNs: an output an overwriting op must never read.
    fn nan<T: ParamElement>(q: Self::Queue<'_>, len: usize) -> Result<Self::Buf<T>, OpError> {
        Self::upload(q, &vec![T::from_f64(f64::NAN); len])
    }

    /// The contents of `buf` as an output of the case.
    ///
    /// # Host sync
    /// As [`GoldenSpace::download`].
    fn tensor<T: ParamElement>(
        q: Self::Queue<'_>,
        buf: &Self::Buf<T>,
    ) -> Result<TensorData, OpError> {
        Ok(TensorData::from_slice(&Self::download(q, buf)?))
    }
}

impl GoldenSpace for Host {
    type Buf<T: Element> = Vec<T>;

    fn upload<T: Element>((): (), data: &[T]) -> Result<Vec<T>, OpError> {
        Ok(data.to_vec())
    }

    fn zeros<T: Element>((): (), len: usize) -> Result<Vec<T>, OpError> {
        Ok(vec![T::zeroed(); len])
    }

    fn input<T: Element>(buf: &Vec<T>) -> &[T] {
        buf
    }

    fn output<T: Element>(buf: &mut Vec<T>) -> &mut [T] {
        buf
    }

    fn download<T: Element>((): (), buf: &Vec<T>) -> Result<Vec<T>, OpError> {
        Ok(buf.clone())
    }
}

impl GoldenSpace for OnDevice {
    type Buf<T: Element> = DeviceBuffer<T>;

    fn upload<T: Element>(q: &hip_rt::Stream, data: &[T]) -> Result<DeviceBuffer<T>, OpError> {
        Ok(DeviceBuffer::from_slice(q, data)?)
    }

    fn zeros<T: Element>(q: &hip_rt::Stream, len: usize) -> Result<DeviceBuffer<T>, OpError> {
        Ok(DeviceBuffer::zeroed(q, len)?)
    }

    fn input<T: Element>(buf: &DeviceBuffer<T>) -> &dyn DeviceView<T> {
        buf
    }

    fn output<T: Element>(buf: &mut DeviceBuffer<T>) -> &mut dyn DeviceViewMut<T> {
        buf
    }

    fn download<T: Element>(q: &hip_rt::Stream, buf: &DeviceBuffer<T>) -> Result<Vec<T>, OpError> {
        Ok(buf.to_vec(q)?)
    }
}

/// [`super::GoldenCase::run_cpu`] and [`super::GoldenCase::run_device`] of a case that has one
/// generic `fn run<S: GoldenSpace>(&self, q: S::Queue<'_>) -> Result<Outputs, OpError>`:
/// write `golden_runs!();` inside its `impl GoldenCase`.
#[macro_export]
#[doc(hidden)]
macro_rules! golden_runs {
    () => {
        fn run_cpu(&self) -> Result<$crate::golden::Outputs, $crate::ops::OpError> {
            self.run::<$crate::params::Host>(())
        }

        fn run_device(
            &self,
            stream: &hip_rt::Stream,
        ) -> Result<$crate::golden::Outputs, $crate::ops::OpError> {
            self.run::<$crate::params::OnDevice>(stream)
        }
    };
}
