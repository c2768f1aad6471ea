//! Compiles `kernels/*.hip` with hipcc through `hip-build` and generates
//! `$OUT_DIR/kernels_gen.rs` for `src/embedded`. Without the `kernels` feature nothing is
//! compiled (no hipcc needed, no warning).

fn main() {
    let builder = hip_build::Builder::new("hip-kernels");
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
