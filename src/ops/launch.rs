//! Helpers shared by the launchers: element types, kernel lookup, device checks.

use super::OpError;
use crate::embedded::loader;
use crate::params::{DType, DeviceElement};
use hip_rt::memory::buffer::DeviceView;
use hip_rt::{DevicePtr, Function, Stream};

/// The kernel of `kernels/<source>.hip` for `T`, from a generated `[f32, f16, bf16]` triple
/// (`kernel_names::<source>::<OP>`).
pub(crate) fn kernel<T: DeviceElement>(
    stream: &Stream,
    source: &'static str,
    names: [&'static str; 3],
) -> Result<Function, OpError> {
    kernel_named(stream, source, dtype_kernel(names, T::DTYPE))
}

/// The entry of a generated `[f32, f16, bf16]` kernel triple for `dtype`.
pub(crate) const fn dtype_kernel(names: [&'static str; 3], dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => names[0],
        DType::F16 => names[1],
        DType::BF16 => names[2],
    }
}

/// The kernel `name` (a generated `kernel_names` constant) of `kernels/<source>.hip`.
pub(crate) fn kernel_named(
    stream: &Stream,
    source: &'static str,
    name: &'static str,
) -> Result<Function, OpError> {
    Ok(loader::function(stream.device(), source, name)?)
}

/// The device address of `view`, after checking it lives on the stream's device; tells the
/// allocator the buffer is used on `stream` (so it is not reused before the kernel is done).
pub(crate) fn ptr<T: hip_rt::Element>(
    stream: &Stream,
    what: &'static str,
    view: &(impl DeviceView<T> + ?Sized),
) -> Result<DevicePtr, OpError> {
    let found = view.buffer().device().ordinal();
    let expected = stream.device().ordinal();
    if found != expected {
        return Err(hip_rt::Error::WrongDevice {
            what,
            expected,
            found,
        }
        .into());
    }
    view.buffer().record_stream(stream)?;
    Ok(view.device_ptr())
}

/// Blocks to launch for `work_items` independent items of `per_block` each, at most
/// `blocks_per_cu` per compute unit (kernels walk the rest grid-stride); at least 1.
pub(crate) fn grid_for(
    work_items: u64,
    per_block: u64,
    compute_units: u32,
    blocks_per_cu: u32,
) -> u32 {
    let needed = work_items.div_ceil(per_block.max(1)).max(1);
    let cap = u64::from(compute_units.max(1)) * u64::from(blocks_per_cu.max(1));
    u32::try_from(needed.min(cap)).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::grid_for;

    #[test]
    fn grids_cover_the_work_up_to_the_cap() {
        assert_eq!(grid_for(0, 4, 60, 8), 1);
        assert_eq!(grid_for(1, 4, 60, 8), 1);
        assert_eq!(grid_for(4, 4, 60, 8), 1);
        assert_eq!(grid_for(5, 4, 60, 8), 2);
        assert_eq!(grid_for(1 << 40, 4, 60, 8), 480);
        assert_eq!(grid_for(100, 0, 0, 0), 1);
    }
}
