//! Where an op's tensors live: the one argument struct of each op is generic over a [`Space`],
//! so the CPU reference ([`Host`]), the device launcher ([`OnDevice`]) and the f64 cores
//! ([`Exact`]) take the same named fields (see `docs/ADDING-AN-OP.md`).

use hip_rt::memory::buffer::{DeviceView, DeviceViewMut};

/// A storage type the kernels support (f32, f16, bf16) that device buffers can hold and
/// hipBLAS multiplies (the GEMM tuner's hipBLAS candidate, [`crate::ops::GemmTuner`]).
pub trait DeviceElement: super::Element + hip_rt::GemmElement {}
impl<T: super::Element + hip_rt::GemmElement> DeviceElement for T {}

/// The number of elements of a tensor argument, whatever its space.
pub trait TensorLen {
    /// Elements in the tensor.
    fn numel(&self) -> usize;
}

impl<T> TensorLen for &[T] {
    fn numel(&self) -> usize {
        self.len()
    }
}

impl<T> TensorLen for &mut [T] {
    fn numel(&self) -> usize {
        self.len()
    }
}

impl<T: hip_rt::Element> TensorLen for &dyn DeviceView<T> {
    fn numel(&self) -> usize {
        DeviceView::len(*self)
    }
}

impl<T: hip_rt::Element> TensorLen for &mut dyn DeviceViewMut<T> {
    fn numel(&self) -> usize {
        DeviceView::len(*self)
    }
}

/// The element count of an optional tensor.
pub fn opt_numel(t: &Option<impl TensorLen>) -> Option<usize> {
    t.as_ref().map(TensorLen::numel)
}

/// Where the tensors of an op's argument struct live: `In` for tensors the op reads, `Out` for
/// tensors it writes (or reads and writes), both for element type `T`; `Queue` is what an op
/// struct of this space runs on ([`crate::ops::Run`]).
pub trait Space: 'static {
    /// A tensor the op only reads.
    type In<'a, T: hip_rt::Element + 'a>: TensorLen;
    /// A tensor the op writes.
    type Out<'a, T: hip_rt::Element + 'a>: TensorLen;
    /// Where an op runs: `()` on the host, the stream its work is queued on for a device.
    type Queue<'q>: Copy;
}

/// Host slices: the CPU reference's arguments ([`crate::cpu`]).
#[derive(Debug, Clone, Copy)]
pub struct Host;

impl Space for Host {
    type In<'a, T: hip_rt::Element + 'a> = &'a [T];
    type Out<'a, T: hip_rt::Element + 'a> = &'a mut [T];
    type Queue<'q> = ();
}

/// Device buffers or views of them (`hip_rt::DeviceBuffer`, `DeviceSlice`, ...): the
/// launchers' arguments ([`crate::ops`]). `&buffer` coerces to these field types.
#[derive(Debug, Clone, Copy)]
pub struct OnDevice;

impl Space for OnDevice {
    type In<'a, T: hip_rt::Element + 'a> = &'a dyn DeviceView<T>;
    type Out<'a, T: hip_rt::Element + 'a> = &'a mut dyn DeviceViewMut<T>;
    type Queue<'q> = &'q hip_rt::Stream;
}

/// Host f64 slices whatever the storage type: the f64 cores of [`crate::cpu::exact`].
#[derive(Debug, Clone, Copy)]
pub struct Exact;

impl Space for Exact {
    type In<'a, T: hip_rt::Element + 'a> = &'a [f64];
    type Out<'a, T: hip_rt::Element + 'a> = &'a mut [f64];
    type Queue<'q> = ();
}
