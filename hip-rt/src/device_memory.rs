//! What `torch.cuda` gives about memory, on [`Device`]: the statistics of the device's caching
//! allocator (the cache shared by every [`Device::get`] of that ordinal), peak reset, cache
//! release, the per-process memory fraction and a text summary.

use std::sync::Arc;

use crate::caching::{self, CachingAllocator, HipBackend, Stats};
use crate::device::Device;
use crate::error::{Error, Result};

impl Device {
    /// The caching allocator this device allocates through, or [`Error::NotCaching`] naming
    /// `what` (a device from [`Device::get_direct`] or a custom allocator has none).
    fn cache(&self, what: &'static str) -> Result<&CachingAllocator<HipBackend>> {
        self.allocator().caching().ok_or(Error::NotCaching {
            ordinal: self.ordinal(),
            what,
        })
    }

    /// The caching allocator's statistics (PyTorch's `torch.cuda.memory_stats()`): allocated,
    /// reserved, active, requested and inactive-split bytes and counts, each with
    /// current/peak/allocated/freed and per pool, plus `num_alloc_retries`, `num_ooms` and the
    /// segment counts. [`Stats::to_flat`] gives PyTorch's flat keys
    /// (`"allocated_bytes.all.current"`), [`Stats::get`] one of them.
    pub fn memory_stats(&self) -> Result<Stats> {
        Ok(self.cache("memory_stats")?.stats())
    }

    /// Sets every peak statistic to its current value (`torch.cuda.reset_peak_memory_stats`).
    pub fn reset_peak_memory_stats(&self) -> Result<()> {
        self.cache("reset_peak_memory_stats")?.reset_peak_stats();
        Ok(())
    }

    /// Returns every cached segment that holds no live block to the device
    /// (`torch.cuda.empty_cache`); live buffers are untouched.
    ///
    /// # Host sync
    /// Waits for the events of blocks freed while other streams still used them, and each
    /// released segment's `hipFree` waits for the device.
    pub fn empty_cache(&self) -> Result<()> {
        let cache = self.cache("empty_cache")?;
        cache
            .empty_cache()
            .map_err(|e| caching::hip::to_rt_error(e, self.ordinal()))
    }

    /// Caps the memory this process's cache may reserve on the device at `fraction` of its
    /// total memory (`torch.cuda.set_per_process_memory_fraction`). `fraction` must be in
    /// `(0, 1]` (otherwise [`Error::Caching`] with `ConfigError::InvalidFraction`); an
    /// allocation that would reserve more fails as out-of-memory, naming the fraction.
    pub fn set_memory_fraction(&self, fraction: f64) -> Result<()> {
        let cache = self.cache("set_memory_fraction")?;
        cache
            .set_memory_fraction(fraction)
            .map_err(|e| Error::Caching(Arc::new(e)))
    }

    /// The statistics as a text table in the spirit of `torch.cuda.memory_summary()`: one
    /// row per statistic with its pools, columns current / peak / total allocated / total freed.
    pub fn memory_summary(&self) -> Result<String> {
        Ok(self.cache("memory_summary")?.memory_summary())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DirectAllocator;

    #[test]
    fn a_device_without_the_cache_says_which_call_needs_it() {
        let d = Device::fake(2, Arc::new(DirectAllocator::new(2)));
        let err = d.memory_stats().unwrap_err();
        assert!(
            matches!(
                err,
                Error::NotCaching {
                    ordinal: 2,
                    what: "memory_stats"
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("use Device::get"), "{err}");
        assert!(matches!(d.empty_cache(), Err(Error::NotCaching { .. })));
        assert!(matches!(
            d.set_memory_fraction(0.5),
            Err(Error::NotCaching { .. })
        ));
    }

    #[test]
    fn invalid_fractions_are_refused_before_any_device_call() {
        // Validation comes first: no HIP call is made for a bad value.
        let cache = Arc::new(CachingAllocator::new(HipBackend::new(0)).unwrap());
        let d = Device::fake(0, cache);
        for bad in [0.0, -0.5, 1.5, f64::NAN, f64::INFINITY] {
            let err = d.set_memory_fraction(bad).unwrap_err();
            assert!(
                matches!(&err, Error::Caching(e) if matches!(**e, caching::AllocError::Config(caching::ConfigError::InvalidFraction(_)))),
                "{bad}: {err}"
            );
            assert!(
                err.to_string().contains("greater than 0.0 and at most 1.0"),
                "{err}"
            );
        }
        let stats = d.memory_stats().unwrap();
        assert_eq!(stats.get("allocated_bytes.all.current"), Ok(0));
        let typo = stats.get("allocated_byte.all.current").unwrap_err();
        assert_eq!(typo.closest, "allocated_bytes.all.current");
        assert!(
            typo.to_string()
                .contains("`allocated_byte.all.current` is not a memory_stats key"),
            "{typo}"
        );
        assert!(d.memory_summary().unwrap().contains("Allocated memory"));
    }
}
