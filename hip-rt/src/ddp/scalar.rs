//! Small values agreed across ranks: the f16 skip flag and the logged loss.

use std::borrow::Borrow;

use super::error::DdpError;
use crate::comm::{group, Comm, ReduceOp};
use crate::memory::buffer::{DeviceBuffer, DeviceViewMut};
use crate::stream::Stream;

/// Queue on `stream`: every rank's `flags` (i32 on the device, e.g. "saw a non-finite
/// gradient" as 0/1) becomes the maximum over ranks, so a flag set on any rank is set on all.
/// No host wait.
pub fn any_in_place(
    comm: &Comm,
    flags: &mut impl DeviceViewMut<i32>,
    stream: &Stream,
) -> Result<(), DdpError> {
    Ok(comm.all_reduce_in_place(flags, ReduceOp::Max, stream)?)
}

/// Queue on `stream`: every rank's `values` (f32 on the device, e.g. the step's loss, which
/// never has to visit the host) becomes the mean over ranks, element by element (RCCL's
/// `ncclAvg`, NCCL 2.10 or newer: an older RCCL is a typed error, never a wrong mean). No host
/// wait.
pub fn mean_in_place(
    comm: &Comm,
    values: &mut impl DeviceViewMut<f32>,
    stream: &Stream,
) -> Result<(), DdpError> {
    Ok(comm.all_reduce_in_place(values, ReduceOp::Avg, stream)?)
}

/// True on every rank when `local` is true on any rank.
///
/// # Host wait
/// Copies the flag to the device, all-reduces it on `stream` and waits for it (bounded by the
/// communicator's timeout, [`Comm::wait`]). Every rank must call it at the same point.
pub fn any_across_ranks(comm: &Comm, local: bool, stream: &Stream) -> Result<bool, DdpError> {
    let mut flag = DeviceBuffer::from_slice(stream, &[i32::from(local)])?;
    any_in_place(comm, &mut flag, stream)?;
    comm.wait()?;
    Ok(flag.to_vec(stream)?[0] != 0)
}

/// The mean over ranks of `local` (e.g. each rank's loss), on every rank: an f32 sum divided
/// by the world size on the host.
///
/// # Host wait
/// As [`any_across_ranks`].
pub fn mean_across_ranks(comm: &Comm, local: f32, stream: &Stream) -> Result<f32, DdpError> {
    let mut v = DeviceBuffer::from_slice(stream, &[local])?;
    comm.all_reduce_in_place(&mut v, ReduceOp::Sum, stream)?;
    comm.wait()?;
    Ok(v.to_vec(stream)?[0] / comm.world() as f32)
}

/// [`any_across_ranks`] for one thread driving every rank of a communicator set
/// (`Comm::init_all`): `local[i]` is rank i's flag, run on `streams[i]`, in one group.
pub fn any_across_devices<C: Borrow<Comm>, S: Borrow<Stream>>(
    comms: &[C],
    local: &[bool],
    streams: &[S],
) -> Result<bool, DdpError> {
    let values: Vec<i32> = local.iter().map(|&b| i32::from(b)).collect();
    let out = across_devices(comms, &values, streams, ReduceOp::Max, "any_across_devices")?;
    Ok(out != 0)
}

/// [`mean_across_ranks`] for one thread driving every rank (see [`any_across_devices`]).
pub fn mean_across_devices<C: Borrow<Comm>, S: Borrow<Stream>>(
    comms: &[C],
    local: &[f32],
    streams: &[S],
) -> Result<f32, DdpError> {
    let sum = across_devices(comms, local, streams, ReduceOp::Sum, "mean_across_devices")?;
    Ok(sum / comms.len().max(1) as f32)
}

fn across_devices<C, S, T>(
    comms: &[C],
    local: &[T],
    streams: &[S],
    op: ReduceOp,
    what: &'static str,
) -> Result<T, DdpError>
where
    C: Borrow<Comm>,
    S: Borrow<Stream>,
    T: crate::comm::CommElement,
{
    let n = comms.len();
    for (found, rule) in [
        (local.len(), "one value per communicator"),
        (streams.len(), "one stream per communicator"),
    ] {
        if found != n {
            return Err(DdpError::Length {
                what,
                found,
                expected: n,
                rule: rule.into(),
            });
        }
    }
    if let Some(c) = comms.first() {
        if c.borrow().world() != n {
            return Err(DdpError::World {
                what,
                planned: n,
                world: c.borrow().world(),
            });
        }
    }
    let mut bufs = comms
        .iter()
        .zip(local)
        .zip(streams)
        .map(|((_, v), s)| DeviceBuffer::from_slice(s.borrow(), std::slice::from_ref(v)))
        .collect::<Result<Vec<_>, _>>()?;
    group(|| {
        for ((c, b), s) in comms.iter().zip(bufs.iter_mut()).zip(streams) {
            c.borrow().all_reduce_in_place(b, op, s.borrow())?;
        }
        Ok(())
    })?;
    for c in comms {
        c.borrow().wait()?;
    }
    match bufs.first() {
        Some(b) => Ok(b.to_vec(streams[0].borrow())?[0]),
        None => Err(DdpError::Length {
            what,
            found: 0,
            expected: 1,
            rule: "at least one communicator".into(),
        }),
    }
}
