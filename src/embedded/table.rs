//! Text rendering of the resource table (static gate test, hip-doctor).

use super::KernelResources;
use std::fmt::Write as _;

/// One line per row: kernel, arch, VGPRs, SGPRs, scratch bytes, VGPR/SGPR spills, LDS bytes
/// and occupancy (waves per SIMD), under a header line.
pub fn format_resource_table(rows: &[KernelResources]) -> String {
    let width = rows
        .iter()
        .map(|r| r.kernel.len())
        .max()
        .unwrap_or(6)
        .max(6);
    let mut s = format!(
        "{:<width$}  {:<8} {:>5} {:>5} {:>7} {:>6} {:>6} {:>6} {:>5}\n",
        "kernel", "arch", "VGPRs", "SGPRs", "scratch", "vspill", "sspill", "LDS", "waves"
    );
    for r in rows {
        let u = &r.usage;
        let _ = writeln!(
            s,
            "{:<width$}  {:<8} {:>5} {:>5} {:>7} {:>6} {:>6} {:>6} {:>5}",
            r.kernel,
            r.arch,
            u.vgprs,
            u.sgprs,
            u.scratch_bytes,
            u.vgpr_spills,
            u.sgpr_spills,
            u.lds_bytes,
            u.occupancy
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embedded::ResourceUsage;

    #[test]
    fn rows_line_up_under_the_header() {
        let usage = ResourceUsage {
            vgprs: 42,
            sgprs: 65,
            scratch_bytes: 0,
            vgpr_spills: 0,
            sgpr_spills: 1,
            lds_bytes: 128,
            occupancy: 5,
        };
        let row = KernelResources {
            source: "adamw",
            kernel: "adamw_f32",
            arch: "gfx906",
            usage,
        };
        let text = format_resource_table(&[row]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].len(), lines[1].len(), "{text}");
        let fields: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            fields,
            ["adamw_f32", "gfx906", "42", "65", "0", "0", "1", "128", "5"]
        );
    }
}
