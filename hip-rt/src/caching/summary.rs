//! [`memory_summary`]: the statistics as a text table, in the spirit of PyTorch's
//! `torch.cuda.memory_summary()` (same rows and columns, our own layout).

use std::fmt::Write;

use super::stats::{Stat, StatArray, StatType, Stats};

/// Width of the first column and of each value column.
const NAME_WIDTH: usize = 34;
const VALUE_WIDTH: usize = 12;

/// `1.50 MiB`-style size (PyTorch's `_format_size`: B below 1 KiB, then KiB, MiB, GiB).
fn size(bytes: u64) -> String {
    const KIB: f64 = 1024.0;
    let b = bytes as f64;
    if bytes < 1024 {
        format!("{bytes} B")
    } else if b < KIB * KIB {
        format!("{:.2} KiB", b / KIB)
    } else if b < KIB * KIB * KIB {
        format!("{:.2} MiB", b / (KIB * KIB))
    } else {
        format!("{:.2} GiB", b / (KIB * KIB * KIB))
    }
}

fn count(n: u64) -> String {
    n.to_string()
}

fn rule(out: &mut String, c: char) {
    let width = NAME_WIDTH + 4 * (VALUE_WIDTH + 3) + 1;
    out.push_str(&c.to_string().repeat(width));
    out.push('\n');
}

fn row(out: &mut String, name: &str, s: &Stat, fmt: fn(u64) -> String) {
    let _ = write!(out, "{name:<NAME_WIDTH$}");
    for v in [s.current, s.peak, s.allocated, s.freed] {
        let _ = write!(out, " | {:>VALUE_WIDTH$}", fmt(v));
    }
    out.push_str(" |\n");
}

fn group(out: &mut String, title: &str, array: &StatArray, fmt: fn(u64) -> String) {
    row(out, title, array.get(StatType::All), fmt);
    row(
        out,
        "      from large pool",
        array.get(StatType::LargePool),
        fmt,
    );
    row(
        out,
        "      from small pool",
        array.get(StatType::SmallPool),
        fmt,
    );
    rule(out, '-');
}

/// The statistics of device `device` as a table: one row per PyTorch statistic (with its
/// large- and small-pool parts), columns current / peak / total allocated / total freed, and
/// the event counters (`num_alloc_retries`, `num_ooms`, ...) in the header.
pub fn memory_summary(device: i32, stats: &Stats) -> String {
    let mut out = String::new();
    rule(&mut out, '=');
    let _ = writeln!(
        out,
        " hip-rt caching allocator memory summary, device {device}"
    );
    rule(&mut out, '-');
    let _ = writeln!(
        out,
        " alloc retries: {:<8} OOMs: {:<8} syncs of all streams: {:<8} device mallocs/frees: {}/{}",
        stats.num_alloc_retries,
        stats.num_ooms,
        stats.num_sync_all_streams,
        stats.num_device_alloc,
        stats.num_device_free
    );
    if stats.max_split_size != usize::MAX {
        let _ = writeln!(
            out,
            " max_split_size: {}",
            size(stats.max_split_size as u64)
        );
    }
    rule(&mut out, '=');
    let _ = write!(out, "{:<NAME_WIDTH$}", "Metric");
    for head in ["Cur Usage", "Peak Usage", "Tot Alloc", "Tot Freed"] {
        let _ = write!(out, " | {head:>VALUE_WIDTH$}");
    }
    out.push_str(" |\n");
    rule(&mut out, '-');
    group(&mut out, "Allocated memory", &stats.allocated_bytes, size);
    group(&mut out, "Active memory", &stats.active_bytes, size);
    group(&mut out, "Requested memory", &stats.requested_bytes, size);
    group(
        &mut out,
        "Device reserved memory",
        &stats.reserved_bytes,
        size,
    );
    group(
        &mut out,
        "Non-releasable memory",
        &stats.inactive_split_bytes,
        size,
    );
    group(&mut out, "Allocations", &stats.allocation, count);
    group(&mut out, "Active allocs", &stats.active, count);
    group(&mut out, "Device reserved segments", &stats.segment, count);
    group(
        &mut out,
        "Non-releasable allocs",
        &stats.inactive_split,
        count,
    );
    row(
        &mut out,
        "Oversize allocations",
        &stats.oversize_allocations,
        count,
    );
    row(
        &mut out,
        "Oversize segments",
        &stats.oversize_segments,
        count,
    );
    rule(&mut out, '=');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_rows_read_like_pytorch() {
        assert_eq!(size(1000), "1000 B");
        assert_eq!(size(1024), "1.00 KiB");
        assert_eq!(size(3 << 20), "3.00 MiB");
        assert_eq!(size(5 << 30), "5.00 GiB");
        let mut stats = Stats::default();
        stats.allocated_bytes.increase(StatType::LargePool, 3 << 20);
        stats.allocated_bytes.decrease(StatType::LargePool, 1 << 20);
        stats.num_ooms = 2;
        stats.max_split_size = usize::MAX;
        let text = memory_summary(3, &stats);
        assert!(text.contains("device 3"), "{text}");
        assert!(text.contains("OOMs: 2 "), "{text}");
        let line = |name: &str| {
            text.lines()
                .find(|l| l.starts_with(name))
                .unwrap_or_else(|| panic!("no row {name}:\n{text}"))
                .to_string()
        };
        let allocated = line("Allocated memory");
        let cells: Vec<&str> = allocated.split('|').map(str::trim).collect();
        assert_eq!(
            cells,
            [
                "Allocated memory",
                "2.00 MiB",
                "3.00 MiB",
                "3.00 MiB",
                "1.00 MiB",
                ""
            ]
        );
        assert!(line("      from small pool").contains(" 0 B "), "{text}");
        assert!(!text.contains("max_split_size"), "{text}");
    }
}
