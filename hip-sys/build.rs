//! Without the `bindgen` feature: nothing (the checked-in bindings are used). With it: run the
//! shared generator (`generator.rs`, also used by `cargo run -p xtask -- bindings`) against
//! `$HIPK_HIP_INCLUDE_DIR`, else `$ROCM_PATH/include`, else `/opt/rocm/include`.

#[cfg(feature = "bindgen")]
#[path = "generator.rs"]
mod generator;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "bindgen")]
    regenerate();
}

#[cfg(feature = "bindgen")]
fn regenerate() {
    use std::path::PathBuf;

    println!("cargo:rerun-if-changed=generator.rs");
    for var in ["HIPK_HIP_INCLUDE_DIR", "ROCM_PATH"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let include = std::env::var_os("HIPK_HIP_INCLUDE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("ROCM_PATH").map(|r| PathBuf::from(r).join("include")))
        .unwrap_or_else(|| PathBuf::from("/opt/rocm/include"));
    println!(
        "cargo:rerun-if-changed={}",
        include.join("hip/hip_runtime_api.h").display()
    );
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"))
        .join(generator::HIP_RUNTIME_FILE);
    match generator::generate_hip_runtime(&include) {
        Ok(text) => {
            if let Err(e) = std::fs::write(&out, text) {
                panic!("hip-sys: cannot write {}: {e}", out.display());
            }
        }
        Err(msg) => panic!(
            "hip-sys (feature `bindgen`): {msg}\nSet ROCM_PATH (or HIPK_HIP_INCLUDE_DIR) to the install whose include/ has hip/hip_runtime_api.h, or build without the `bindgen` feature to use the checked-in bindings."
        ),
    }
}
