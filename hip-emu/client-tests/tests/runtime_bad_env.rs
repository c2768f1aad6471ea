//! A bad `HIPK_EMU_MEMORY` is a clear error on the first call (own process).

#[path = "../../tests/common/mod.rs"]
mod common;

#[test]
fn bad_memory_size_names_the_variable_and_the_fix() {
    common::setup(&[("HIPK_EMU_MEMORY", "lots")]);
    let err = hip_rt::Device::count().unwrap_err();
    assert_eq!(
        err.hip_code(),
        Some(hip_sys::hipError_t::hipErrorInvalidValue),
        "{err}"
    );
    let text = err.to_string();
    for needle in ["HIPK_EMU_MEMORY", "\"lots\"", "4G"] {
        assert!(text.contains(needle), "{needle:?} missing: {text}");
    }
    // The version still answers: hip-sys can identify the library.
    assert_eq!(
        hip_sys::hip()
            .unwrap()
            .runtime_version()
            .unwrap()
            .to_string(),
        "5.2.0"
    );
}
