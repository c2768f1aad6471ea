//! [`BucketPlan`]: gradient tensors grouped into all-reduce buckets (pure logic, no device).

use std::ops::Range;

use super::error::DdpError;

/// The default bucket cap: 25 MiB, as PyTorch's DDP.
pub const DEFAULT_BUCKET_BYTES: usize = 25 << 20;

/// One bucket: consecutive tensors (in the order backward produces them) and the element
/// ranges it reduces (the tensors' ranges, sorted and with adjacent ones merged).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    /// Indices of its tensors, in readiness order.
    pub tensors: Vec<usize>,
    /// The ranges of the flat buffer it all-reduces (one collective each, in one group).
    pub ranges: Vec<Range<usize>>,
    /// The number of elements.
    pub elements: usize,
}

/// Tensors assigned to buckets: consecutive tensors (in the order given) share a bucket until
/// the next one would take it past the cap; a tensor larger than the cap gets a bucket of its
/// own. Buckets are launched in this order on every rank, which keeps the ranks' collectives in
/// the same sequence whatever order each rank marks its tensors in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketPlan {
    tensors: Vec<Range<usize>>,
    bucket_of: Vec<usize>,
    buckets: Vec<Bucket>,
    len: usize,
}

impl BucketPlan {
    /// Plan buckets for `tensors` (element ranges of a flat buffer of `len` elements, in the
    /// order backward produces them) with at most `cap_bytes` per bucket for `elem_bytes`-byte
    /// elements. Ranges must be non-empty, inside `0..len` and disjoint.
    pub fn new(
        tensors: &[Range<usize>],
        len: usize,
        elem_bytes: usize,
        cap_bytes: usize,
    ) -> Result<BucketPlan, DdpError> {
        if tensors.is_empty() {
            return Err(DdpError::Ranges(
                "no tensors given; pass the element range of every gradient tensor".into(),
            ));
        }
        if cap_bytes == 0 {
            return Err(DdpError::Ranges(
                "a bucket cap of 0 bytes; use at least one element's size (25 MiB is the usual)"
                    .into(),
            ));
        }
        for (i, r) in tensors.iter().enumerate() {
            if r.start >= r.end {
                return Err(DdpError::Ranges(format!(
                    "tensor {i} has the empty range {r:?}; leave empty tensors out"
                )));
            }
            if r.end > len {
                return Err(DdpError::Ranges(format!(
                    "tensor {i} covers {r:?} but the gradient buffer holds {len} elements"
                )));
            }
        }
        let mut order: Vec<usize> = (0..tensors.len()).collect();
        order.sort_by_key(|&i| tensors[i].start);
        for w in order.windows(2) {
            let (a, b) = (&tensors[w[0]], &tensors[w[1]]);
            if b.start < a.end {
                return Err(DdpError::Ranges(format!(
                    "tensors {} ({a:?}) and {} ({b:?}) overlap; each element may belong to one tensor only",
                    w[0], w[1]
                )));
            }
        }
        let cap = (cap_bytes / elem_bytes.max(1)).max(1);
        let mut buckets: Vec<Bucket> = Vec::new();
        let mut bucket_of = vec![0; tensors.len()];
        let mut current: Vec<usize> = Vec::new();
        let mut elements = 0usize;
        for (i, r) in tensors.iter().enumerate() {
            let n = r.len();
            if !current.is_empty() && elements.saturating_add(n) > cap {
                buckets.push(make_bucket(std::mem::take(&mut current), tensors));
                elements = 0;
            }
            current.push(i);
            elements += n;
        }
        buckets.push(make_bucket(current, tensors));
        for (b, bucket) in buckets.iter().enumerate() {
            for &t in &bucket.tensors {
                bucket_of[t] = b;
            }
        }
        Ok(BucketPlan {
            tensors: tensors.to_vec(),
            bucket_of,
            buckets,
            len,
        })
    }

    /// The tensors' ranges, as given.
    pub fn tensors(&self) -> &[Range<usize>] {
        &self.tensors
    }

    /// The buckets, in launch order.
    pub fn buckets(&self) -> &[Bucket] {
        &self.buckets
    }

    /// The bucket tensor `i` belongs to.
    pub fn bucket_of(&self, i: usize) -> Option<usize> {
        self.bucket_of.get(i).copied()
    }

    /// The flat buffer's length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a plan has at least one tensor (kept for clippy's `len` convention).
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }
}

fn make_bucket(tensors: Vec<usize>, all: &[Range<usize>]) -> Bucket {
    let mut ranges: Vec<Range<usize>> = tensors.iter().map(|&t| all[t].clone()).collect();
    ranges.sort_by_key(|r| r.start);
    let mut merged: Vec<Range<usize>> = Vec::with_capacity(ranges.len());
    for r in ranges {
        match merged.last_mut() {
            Some(last) if last.end == r.start => last.end = r.end,
            _ => merged.push(r),
        }
    }
    let elements = merged.iter().map(|r| r.len()).sum();
    Bucket {
        tensors,
        ranges: merged,
        elements,
    }
}
