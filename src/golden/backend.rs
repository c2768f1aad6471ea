//! What a golden case can do (run on the CPU reference, run on a device), and the backends that
//! run cases: the CPU reference and a device stream. Open: each op implements [`GoldenCase`] for
//! its case type next to its definition (`src/ops/<family>/golden.rs`); nothing here lists ops.

use super::TensorData;
use crate::ops::OpError;
use crate::params::{DType, DeviceElement};
use crate::tolerance::Tolerance;
use hip_rt::{DeviceBuffer, Stream};
use std::any::Any;

/// The outputs of one run of a case, by schema name (without `expected_`).
pub type Outputs = Vec<(&'static str, TensorData)>;

/// The typed inputs of one golden case of one op, and how to run it.
pub trait GoldenCase: std::fmt::Debug + Send + Sync + 'static {
    /// The op name (the case's `op` metadata).
    fn op(&self) -> &'static str;

    /// Run the CPU reference ([`crate::cpu`]) on the case's inputs. Cases write one generic
    /// run over a [`super::GoldenSpace`] and get this and [`GoldenCase::run_device`] from
    /// [`crate::golden_runs!`].
    fn run_cpu(&self) -> Result<Outputs, OpError>;

    /// Upload the inputs, run the launcher on `stream`, download the outputs.
    ///
    /// # Host sync
    /// A test path: the uploads and downloads are synchronous copies.
    fn run_device(&self, stream: &Stream) -> Result<Outputs, OpError>;

    /// The tolerance for output `output` stored as `dtype` (a rule of [`crate::tolerance`]).
    fn tolerance(&self, output: &str, dtype: DType) -> Tolerance;

    /// The concrete case, for test models of particular ops (`downcast_ref`).
    fn as_any(&self) -> &dyn Any;
}

/// An implementation that golden cases can check.
pub trait GoldenBackend {
    /// The backend's error.
    type Error: std::error::Error + Send + Sync + 'static;

    /// A short name for reports ("cpu", "hip:0 gfx906", ...).
    fn name(&self) -> String;

    /// Run `case` and return its outputs (host values).
    fn run(&mut self, case: &dyn GoldenCase) -> Result<Outputs, Self::Error>;
}

/// The CPU reference ([`crate::cpu`]) as a [`GoldenBackend`].
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuBackend;

impl GoldenBackend for CpuBackend {
    type Error = OpError;

    fn name(&self) -> String {
        "cpu".into()
    }

    fn run(&mut self, case: &dyn GoldenCase) -> Result<Outputs, OpError> {
        case.run_cpu()
    }
}

/// A device stream as a [`GoldenBackend`]: every op's launcher through
/// [`GoldenCase::run_device`].
#[derive(Debug)]
pub struct DeviceBackend(pub Stream);

impl GoldenBackend for DeviceBackend {
    type Error = OpError;

    fn name(&self) -> String {
        let d = self.0.device();
        format!("hip:{} {}", d.ordinal(), d.arch())
    }

    fn run(&mut self, case: &dyn GoldenCase) -> Result<Outputs, OpError> {
        case.run_device(&self.0)
    }
}

/// Copy `data` to a new device buffer.
///
/// # Host sync
/// A synchronous copy (golden and test paths only).
pub fn upload<T: DeviceElement>(stream: &Stream, data: &[T]) -> Result<DeviceBuffer<T>, OpError> {
    Ok(DeviceBuffer::from_slice(stream, data)?)
}

/// Copy a device buffer back into a [`TensorData`].
///
/// # Host sync
/// Waits for the stream's work on `buffer`, then copies synchronously.
pub fn download<T: DeviceElement>(
    stream: &Stream,
    buffer: &DeviceBuffer<T>,
) -> Result<TensorData, OpError> {
    Ok(TensorData::from_slice(&buffer.to_vec(stream)?))
}

/// Copy a device buffer of f32 back to the host.
///
/// # Host sync
/// As [`download`].
pub fn download_f32(stream: &Stream, buffer: &DeviceBuffer<f32>) -> Result<Vec<f32>, OpError> {
    Ok(buffer.to_vec(stream)?)
}
