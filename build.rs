//! Compiles `kernels/*.hip` with hipcc through `hip-build` and generates
//! `$OUT_DIR/kernels_gen.rs` for `src/embedded` and `$OUT_DIR/kernel_names.rs` (a constant per
//! kernel name, for the launchers). Without the `kernels` feature nothing is
//! compiled (no hipcc needed, no warning) and the names come
//! from `kernels/kernel-names.txt`.

fn main() {
    // `links = "hip_kernels"`: a crate that depends on hip-kernels reads the path of `kernels/`
    // (common.h, tile_io.h, ...) in its build script as `DEP_HIP_KERNELS_INCLUDE`, to pass to
    // `hip_build::Builder::include_dir`.
    let manifest = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:include={manifest}/kernels");
    // The kernel-name constants (`$OUT_DIR/kernel_names.rs`) come from the compiled code objects,
    // or from this committed list when the kernels are not compiled.
    let builder = hip_build::Builder::new("hip-kernels")
        .names_file("kernels/kernel-names.txt")
        // The matrix-core matmul and attention also for CDNA's gfx90a (MFMA), which Debian's hipcc compiles:
        // its code object is embedded and checked statically (DTK's hipcc builds the MMAC archs
        // gfx928/936/938 with every other kernel).
        .source_archs("matmul_mc", &["gfx90a"])
        .source_archs("attention_mc", &["gfx90a"]);
    if std::env::var_os("CARGO_FEATURE_KERNELS").is_none() {
        builder.skip(
            "hip-kernels was built without its `kernels` feature (on by default; do not pass \
             --no-default-features, or add `features = [\"kernels\"]`)",
        );
        return;
    }
    if std::env::var_os("CARGO_FEATURE_DEVICE").is_some() {
        builder.require("the `device` feature").build();
    } else {
        builder.build();
    }
}
