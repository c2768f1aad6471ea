//! Errors of the caching allocator, and an out-of-memory report that says what to do.

use std::fmt;

use super::backend::BackendError;
use super::config::ConfigError;
use super::{KLARGE_BUFFER, MIB};

/// Any failure of the caching allocator.
#[derive(thiserror::Error)]
pub enum AllocError {
    /// The request did not fit even after releasing the cache and retrying.
    #[error(transparent)]
    OutOfMemory(Box<OutOfMemory>),
    /// The backend failed for another reason than running out of memory.
    #[error("device {device}: {op} failed: {source}")]
    Backend {
        /// The backend operation (`malloc`, `free`, `record_event`, ...).
        op: &'static str,
        /// The device ordinal.
        device: i32,
        /// The backend's error.
        #[source]
        source: BackendError,
    },
    /// A request so large it can only come from a size computation bug.
    #[error("allocation of {requested} B requested, more than 1 EiB; check the size computation")]
    TooLarge {
        /// Bytes asked for.
        requested: usize,
    },
    /// More distinct streams than the allocator can track.
    #[error("device {device}: more than {limit} distinct streams used with one allocator; reuse streams (e.g. from a pool) instead of creating new ones per step")]
    TooManyStreams {
        /// The device ordinal.
        device: i32,
        /// The limit.
        limit: usize,
    },
    /// The backend returned memory beyond the 512 TiB address range the allocator indexes.
    #[error("device {device}: backend returned {size} B at {addr:#x}, beyond the 2^49 address range the caching allocator supports; the memory was returned")]
    AddressOutOfRange {
        /// The device ordinal.
        device: i32,
        /// The address.
        addr: u64,
        /// The size.
        size: usize,
    },
    /// A raw allocation handed to the wrong allocator.
    #[error("device {device}: {addr:#x} was not handed out by this allocator or is already freed; free it with the allocator that made it")]
    ForeignAllocation {
        /// The device ordinal.
        device: i32,
        /// The address.
        addr: u64,
    },
    /// A bad configuration string or value.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A graph capture began while another one on the same device had not ended.
    #[error("device {device}: a graph capture is already active on this device's allocator; end it (Stream::end_capture) before beginning another")]
    CaptureActive {
        /// The device ordinal.
        device: i32,
    },
}

impl AllocError {
    /// The out-of-memory report, if this is one.
    pub fn as_out_of_memory(&self) -> Option<&OutOfMemory> {
        match self {
            AllocError::OutOfMemory(oom) => Some(oom),
            _ => None,
        }
    }
}

/// What the numbers of an [`OutOfMemory`] suggest doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OomHint {
    /// The per-process memory fraction is the limit; the device itself has room.
    FractionCap,
    /// Enough memory is reserved by this allocator but split into pieces too small:
    /// set `max_split_size_mb` (the suggested value, in MiB) so large blocks stay whole.
    Fragmentation {
        /// Suggested `max_split_size_mb`.
        suggested_mb: usize,
    },
    /// The device has room for the request but not for the segment the allocator reserves
    /// for it (requests of 1–10 MiB get a 20 MiB segment; larger ones are rounded up to 2 MiB).
    SegmentTooLarge {
        /// The segment size that did not fit.
        segment: usize,
    },
    /// A cached free block on another stream would fit the request, but cached blocks are
    /// reused only by the stream they were allocated on, and these sit in segments that also
    /// hold live blocks, so they cannot be released either.
    OtherStreams {
        /// Free cached bytes of other streams (in segments with live blocks).
        bytes: usize,
        /// The largest of those free blocks.
        largest: usize,
    },
    /// Enough is cached on the request's stream, but in pieces smaller than the request inside
    /// segments that also hold live blocks; `max_split_size_mb` is already at or below the
    /// value that would help, so no setting releases them.
    LiveBlocksHoldSegments {
        /// Free cached bytes of the request's stream (in segments with live blocks).
        bytes: usize,
        /// The largest of those free blocks.
        largest: usize,
    },
    /// Memory is held outside this allocator (another allocator's cache, another process).
    HeldElsewhere {
        /// Bytes in use on the device that this allocator did not reserve.
        bytes: usize,
    },
    /// The allocator's live allocations fill the device; free some or shrink the request.
    Exhausted,
}

/// An allocation that failed after the cache was released and the device allocation retried.
#[derive(Clone, Debug, PartialEq)]
pub struct OutOfMemory {
    /// Bytes asked for.
    pub requested: usize,
    /// The request rounded to the block size the allocator would use.
    pub rounded: usize,
    /// Size of the device segment the allocator tried to reserve.
    pub segment_size: usize,
    /// Device ordinal.
    pub device: i32,
    /// Total device memory.
    pub capacity: usize,
    /// Free device memory, as the backend reported it after the failure.
    pub free: usize,
    /// Bytes allocated to callers by this allocator.
    pub allocated: usize,
    /// Bytes reserved by this allocator.
    pub reserved: usize,
    /// The per-process memory fraction cap and the byte limit it implies, if set.
    pub fraction: Option<(f64, usize)>,
    /// The configured split limit, if any.
    pub max_split_size: Option<usize>,
    /// Free cached bytes of the request's pool and stream, after the cache was released (so
    /// all in segments that also hold live blocks), and the largest such block.
    pub stream_cached: (usize, usize),
    /// The same for every other stream: free, but reused only by the stream that owns it.
    pub other_streams_cached: (usize, usize),
    /// What to do about it.
    pub hint: OomHint,
}

impl OutOfMemory {
    /// Bytes reserved by this allocator but not allocated to anyone (its cache).
    pub fn reserved_unallocated(&self) -> usize {
        self.reserved.saturating_sub(self.allocated)
    }

    /// Chooses the hint that fits the numbers; the other fields must be filled in.
    pub(crate) fn diagnose(mut self) -> Self {
        let cached = self.reserved_unallocated();
        let outside = self
            .capacity
            .saturating_sub(self.free)
            .saturating_sub(self.reserved);
        let capped = self
            .fraction
            .is_some_and(|(_, allowed)| self.reserved.saturating_add(self.segment_size) > allowed);
        self.hint = if capped && self.free >= self.segment_size {
            OomHint::FractionCap
        } else if self.free >= self.rounded && self.free < self.segment_size {
            // The request fits the free memory; the segment rounding is what does not.
            OomHint::SegmentTooLarge {
                segment: self.segment_size,
            }
        } else if self.other_streams_cached.1 >= self.rounded
            || (self.other_streams_cached.0 >= self.rounded && self.stream_cached.0 < self.rounded)
        {
            let (bytes, largest) = self.other_streams_cached;
            OomHint::OtherStreams { bytes, largest }
        } else if cached >= self.rounded || cached.saturating_add(self.free) >= self.rounded {
            let floor = KLARGE_BUFFER / MIB + 1;
            let suggested_mb = (self.rounded / MIB).max(floor);
            // Suggest the split limit only where it is not already in force at that value
            // or below (blocks from that size on are then already never split).
            let in_force = self
                .max_split_size
                .is_some_and(|limit| limit <= suggested_mb.saturating_mul(MIB));
            if in_force {
                let (bytes, largest) = self.stream_cached;
                OomHint::LiveBlocksHoldSegments { bytes, largest }
            } else {
                OomHint::Fragmentation { suggested_mb }
            }
        } else if outside.saturating_add(self.free) >= self.rounded {
            OomHint::HeldElsewhere { bytes: outside }
        } else {
            OomHint::Exhausted
        };
        self
    }
}

/// `1.50 MiB`-style size, with the exact byte count for small values.
pub(crate) struct Bytes(pub usize);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0 as f64;
        const KIB: f64 = 1024.0;
        if self.0 == usize::MAX {
            write!(f, "unlimited")
        } else if b < KIB {
            write!(f, "{} B", self.0)
        } else if b < KIB * KIB {
            write!(f, "{:.2} KiB", b / KIB)
        } else if b < KIB * KIB * KIB {
            write!(f, "{:.2} MiB", b / (KIB * KIB))
        } else {
            write!(f, "{:.2} GiB", b / (KIB * KIB * KIB))
        }
    }
}

impl std::error::Error for OutOfMemory {}

impl fmt::Display for OutOfMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "out of memory on device {}: {}",
            self.device,
            self.detail()
        )
    }
}

/// The report after the "out of memory on device N:" header.
struct Detail<'a>(&'a OutOfMemory);

impl fmt::Display for Detail<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let oom = self.0;
        write!(
            f,
            "tried to allocate {} (requested {} B, rounded to {} B, segment {}); device \
             capacity {}, {} free; this allocator has {} allocated and {} reserved but \
             unallocated",
            Bytes(oom.rounded),
            oom.requested,
            oom.rounded,
            Bytes(oom.segment_size),
            Bytes(oom.capacity),
            Bytes(oom.free),
            Bytes(oom.allocated),
            Bytes(oom.reserved_unallocated()),
        )?;
        if let Some((fraction, allowed)) = oom.fraction {
            write!(f, "; memory fraction cap {fraction} = {}", Bytes(allowed))?;
        }
        if let Some(limit) = oom.max_split_size {
            write!(f, "; max_split_size {}", Bytes(limit))?;
        }
        f.write_str(". Hint: ")?;
        oom.write_hint(f)?;
        f.write_str(".")
    }
}

impl OutOfMemory {
    /// The report without the "out of memory on device N:" header: sizes, memory figures
    /// and the hint (for errors that print their own header).
    pub fn detail(&self) -> String {
        Detail(self).to_string()
    }

    fn write_hint(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.hint {
            OomHint::FractionCap => write!(
                f,
                "the memory fraction cap is the limit (the device has {} free); raise it with \
                 set_memory_fraction or per_process_memory_fraction in HIPK_ALLOC_CONF",
                Bytes(self.free)
            ),
            OomHint::Fragmentation { suggested_mb } => write!(
                f,
                "{} is reserved but unallocated, split into pieces too small for this request \
                 (fragmentation); set HIPK_ALLOC_CONF=max_split_size_mb:{suggested_mb} so large \
                 blocks are not split, or free long-lived small buffers",
                Bytes(self.reserved_unallocated())
            ),
            OomHint::SegmentTooLarge { segment } => {
                write!(
                    f,
                    "the device has {} free, enough for the {} request, but the caching \
                     allocator reserves a {} segment for a request of this size (1-10 MiB \
                     requests get 20 MiB segments, larger ones are rounded up to 2 MiB)",
                    Bytes(self.free),
                    Bytes(self.rounded),
                    Bytes(segment)
                )?;
                if segment > self.capacity {
                    write!(
                        f,
                        ", more than the device's whole capacity ({})",
                        Bytes(self.capacity)
                    )?;
                }
                write!(
                    f,
                    "; free other device memory, or allocate this buffer with DirectAllocator, \
                     which reserves exactly the request"
                )
            }
            OomHint::HeldElsewhere { bytes } => write!(
                f,
                "{} of device memory is held outside this allocator (another allocator's cache \
                 or another process); call empty_cache() on other allocators of this device or \
                 stop the other process",
                Bytes(bytes)
            ),
            OomHint::OtherStreams { bytes, largest } => write!(
                f,
                "{} is free in cached blocks of other streams (largest {}), in segments that \
                 also hold live blocks: cached blocks are reused only on the stream they were \
                 allocated on, and such segments cannot be released. Allocate this buffer on \
                 the stream that freed that memory, or drop the buffers still live in those \
                 segments and call empty_cache()",
                Bytes(bytes),
                Bytes(largest)
            ),
            OomHint::LiveBlocksHoldSegments { bytes, largest } => {
                write!(
                    f,
                    "{} is free in cached blocks of this stream, but in pieces smaller than the \
                     request (largest {}) inside segments that also hold live blocks, so they \
                     cannot be merged or released",
                    Bytes(bytes),
                    Bytes(largest)
                )?;
                if let Some(limit) = self.max_split_size {
                    write!(
                        f,
                        " (max_split_size_mb:{} is already in force)",
                        limit / MIB
                    )?;
                }
                write!(
                    f,
                    "; drop the long-lived buffers that hold those segments, or allocate the \
                     large, long-lived buffers first"
                )
            }
            OomHint::Exhausted => write!(
                f,
                "live allocations fill the device; free buffers (drop them) or reduce the \
                 batch size / working set"
            ),
        }
    }
}

/// The Debug form is the Display text (what happened, the values, and the hint), so that
/// `fn main() -> Result<(), Box<dyn std::error::Error>>` and `.unwrap()` print the whole
/// message rather than the bare fields.
impl std::fmt::Debug for AllocError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self}")
    }
}
