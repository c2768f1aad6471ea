//! The static bandwidth figure of the LoRA skinny kernels (issue 35 §2): for rank 8 and 64 at
//! N = C = 4096, each kernel's bytes that must move ÷ the bytes its instructions move under its
//! launch plan, at least 80 %.
//!
//! "Moved" = the hot loop's global bytes per element from the ISA report's baseline
//! (`docs/isa-baseline.json`, `cargo xtask isa-report`: what the loop's load and store
//! instructions request, cache hits included, gfx906, hipcc 5.2) × the loop's elements, plus
//! what the plan moves outside the loop (`hip_kernels::ops::lora_gemm::plan`: W once per block,
//! the row groups' f32 partials, the outputs). "Must" = every operand once and every output once
//! (y and G read and written). Static figures, not measurements. No GPU needed.

use hip_kernels::ops::lora_gemm::plan::{
    down_traffic, gradw_traffic, rank_class, up_rows_per_block, up_traffic, GradwPlan, Traffic,
};

/// Compute units the plans are made for (a 64-CU DCU).
const CUS: u32 = 64;
const N: usize = 4096;
const C: usize = 4096;

fn baseline() -> serde_json::Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/isa-baseline.json");
    let text = std::fs::read_to_string(path).expect("docs/isa-baseline.json is committed");
    serde_json::from_str(&text).expect("the baseline is JSON")
}

/// Global bytes per element of hot loop `lp` of `kernel` in the baseline.
fn loop_bytes(b: &serde_json::Value, kernel: &str, lp: &str) -> f64 {
    let k = b["kernels"]
        .as_array()
        .and_then(|ks| ks.iter().find(|k| k["kernel"] == kernel))
        .unwrap_or_else(|| panic!("{kernel} is not in docs/isa-baseline.json: regenerate it"));
    k["loops"]
        .as_array()
        .and_then(|ls| ls.iter().find(|l| l["name"] == lp))
        .and_then(|l| l["bytes_per_elem"].as_f64())
        .unwrap_or_else(|| panic!("{kernel}: no hot loop `{lp}` with bytes per element"))
}

/// The three kernels' traffic at rank `r`, dtype `dt` of `elem` bytes.
fn figures(r: usize, dt: &str, elem: usize) -> [(String, Traffic); 3] {
    let b = baseline();
    let rc = rank_class(r).unwrap();
    let e = elem as f64;
    let down = down_traffic(
        N,
        C,
        r,
        e,
        loop_bytes(&b, &format!("lora_down_r{rc}_{dt}"), "down_k"),
    );
    let rpb = up_rows_per_block(N, C, rc, CUS);
    let up = up_traffic(
        N,
        C,
        r,
        rpb,
        e,
        loop_bytes(&b, &format!("lora_up_r{rc}_{dt}"), "up_rows"),
    );
    let plan = GradwPlan::new(N, C, r, elem, CUS);
    let gradw = gradw_traffic(
        N,
        C,
        r,
        plan,
        e,
        loop_bytes(&b, &format!("lora_gradw_r{rc}_{dt}"), "gradw_rows"),
    );
    [
        (format!("lora_down_r{rc}_{dt}"), down),
        (format!("lora_up_r{rc}_{dt}"), up),
        (
            format!("lora_gradw_r{rc}_{dt} ({} groups)", plan.groups),
            gradw,
        ),
    ]
}

#[test]
fn rank_8_and_64_move_at_least_80_percent_of_the_bound() {
    for (dt, elem) in [("f32", 4), ("f16", 2), ("bf16", 2)] {
        for r in [8, 64] {
            for (name, t) in figures(r, dt, elem) {
                let pct = 100.0 * t.ratio();
                eprintln!(
                    "r = {r:2} {name:32} must {:7.2} MiB, moved {:7.2} MiB: {pct:5.1} % (static)",
                    t.must / (1 << 20) as f64,
                    t.moved / (1 << 20) as f64,
                );
                assert!(pct >= 80.0, "{name} at r = {r}: {pct:.1} % < 80 %");
                assert!(
                    pct <= 100.0 + 1e-9,
                    "{name}: moves less than it must? {t:?}"
                );
            }
        }
    }
}
