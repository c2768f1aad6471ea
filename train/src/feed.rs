//! Feeding a device: the ring of pinned host slots the SFT producer thread stages micro-batches
//! into, and their copies to the device on a copy stream of their own.
//!
//! A [`PinnedSlot`] holds one micro-batch of this rank's rows (inputs, targets, positions,
//! sequence boundaries) in pinned host memory, allocated once when the run starts (sized for
//! the longest content: `B·T` positions, `B·T + 1` boundaries) and reused for the whole run:
//! never freed or reallocated while training (`hipHostFree` waits for every device, which
//! deadlocks when another rank's device waits in a collective for this one). The
//! [`crate::device_backend::DeviceBackend`] keeps every slot it made until it drops.
//!
//! The order of one slot's life:
//! 1. the producer thread writes it (each buffer's host access first waits for that buffer's
//!    last copy: a non-blocking event query, a wait only if the copy still runs, on the
//!    producer's thread);
//! 2. the trainer queues its copies on the copy stream into buffers allocated there (told to
//!    the allocator as used by the compute stream too), records the slot's event and makes the
//!    compute stream wait for it (`hipStreamWaitEvent`: no host wait), then hands the slot back;
//!    the copies of micro-batch k + 1 run while the compute stream still works on k.

use crate::backend::BatchIds;
use crate::data::Batch;
use crate::device_backend::DeviceIds;
use crate::error::{dev, Result, TrainError};
use crate::sft::pack::SftBatch;
use crate::sft::source::to_batch;
use crate::sft::Slot;
use hip_rt::{Device, DeviceBuffer, Event, EventOptions, PinnedHostBuffer, Stream};
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};

/// One micro-batch of this rank's rows in pinned host memory.
pub struct PinnedRows {
    inputs: PinnedHostBuffer<i32>,
    targets: PinnedHostBuffer<i32>,
    positions: PinnedHostBuffer<i32>,
    cu_seqlens: PinnedHostBuffer<i32>,
    /// Elements written of `cu_seqlens` (the other three hold `rows.len()`); `None` before the
    /// first write.
    cu_len: Option<usize>,
    /// This rank's positions of the global micro-batch.
    rows: Range<usize>,
    /// Recorded on the copy stream after the slot's copies; the compute stream waits on it.
    copied: Event,
}

/// A slot of the ring: shared by the backend (which keeps it allocated) and the producer.
#[derive(Clone)]
pub struct PinnedSlot(Arc<Mutex<PinnedRows>>);

impl PinnedSlot {
    /// A slot for the positions `rows` of each global micro-batch, on `device`.
    pub fn new(device: &Device, rows: Range<usize>) -> Result<Self> {
        let n = rows.len();
        let pinned = |len| PinnedHostBuffer::<i32>::new(device, len).map_err(dev);
        Ok(Self(Arc::new(Mutex::new(PinnedRows {
            inputs: pinned(n)?,
            targets: pinned(n)?,
            positions: pinned(n)?,
            cu_seqlens: pinned(n + 1)?,
            cu_len: None,
            rows,
            copied: Event::new(device, EventOptions::NO_TIMING).map_err(dev)?,
        }))))
    }

    fn lock(&self) -> MutexGuard<'_, PinnedRows> {
        // A panic while holding the lock leaves plain data behind: still usable.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queue the copies of the staged micro-batch `host` (the same rows, on the host: kept to
    /// name a bad id) on `copy`, into buffers allocated there and marked as used by `compute`,
    /// and make `compute` wait for them. No host wait.
    pub fn upload(
        &self,
        host: &Batch,
        copy: &Stream,
        compute: &Stream,
    ) -> Result<BatchIds<DeviceIds>> {
        let r = self.lock();
        let n = r.rows.len();
        let cu_len = r.cu_len.unwrap_or(0);
        let cu_host = host.cu_seqlens.as_deref().unwrap_or(&[]);
        if host.inputs.len() != n
            || host.targets.len() != n
            || host.positions.as_ref().map_or(0, Vec::len) != n
            || cu_host.len() != cu_len
        {
            return Err(TrainError::Op(format!(
                "the staged micro-batch ({n} positions, {cu_len} sequence bounds) is not the one \
                 handed to the step ({} positions, {} bounds)",
                host.inputs.len(),
                cu_host.len()
            )));
        }
        let up = |src: &PinnedHostBuffer<i32>, host: &[i32]| -> Result<DeviceIds> {
            let mut ids = DeviceBuffer::<i32>::alloc(copy, host.len()).map_err(dev)?;
            // Freed (when the step drops it) only after the compute stream's uses too.
            ids.record_stream(compute).map_err(dev)?;
            copy.copy_htod_async_prefix(src, &mut ids).map_err(dev)?;
            Ok(DeviceIds::new(ids, host.into()))
        };
        let ids = BatchIds {
            inputs: up(&r.inputs, &host.inputs)?,
            targets: up(&r.targets, &host.targets)?,
            positions: host
                .positions
                .as_deref()
                .map(|p| up(&r.positions, p))
                .transpose()?,
            cu_seqlens: host
                .cu_seqlens
                .as_deref()
                .map(|c| up(&r.cu_seqlens, c))
                .transpose()?,
        };
        r.copied.record(copy).map_err(dev)?;
        compute.wait(&r.copied).map_err(dev)?;
        Ok(ids)
    }
}

impl Slot for PinnedSlot {
    /// This rank's rows of the global micro-batch `batch`, into the pinned buffers (run on the
    /// producer thread; each buffer first waits for its previous copy, see the module docs).
    fn write(&mut self, batch: &SftBatch) -> std::result::Result<(), String> {
        let mut guard = self.lock();
        let r = &mut *guard;
        let mine = to_batch(batch.clone()).rows(r.rows.clone());
        let positions = mine.positions.unwrap_or_default();
        let cu = mine.cu_seqlens.unwrap_or_default();
        let put = |dst: &mut PinnedHostBuffer<i32>, src: &[i32], what: &str| {
            let d = dst.as_mut_slice().map_err(|e| e.to_string())?;
            match d.get_mut(..src.len()) {
                Some(d) => {
                    d.copy_from_slice(src);
                    Ok(())
                }
                None => Err(format!(
                    "{} {what} do not fit the pinned slot of {} (made for {} positions)",
                    src.len(),
                    d.len(),
                    r.rows.len()
                )),
            }
        };
        if mine.inputs.len() != r.rows.len() {
            return Err(format!(
                "a micro-batch of {} positions where this rank takes positions {:?}",
                batch.inputs.len(),
                r.rows
            ));
        }
        put(&mut r.inputs, &mine.inputs, "inputs")?;
        put(&mut r.targets, &mine.targets, "targets")?;
        put(&mut r.positions, &positions, "positions")?;
        put(&mut r.cu_seqlens, &cu, "sequence bounds")?;
        r.cu_len = Some(cu.len());
        Ok(())
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
