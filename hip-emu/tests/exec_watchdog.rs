//! hip-emu executor: a thread spinning on another one is stopped by the watchdog (its own test
//! binary: it sets HIPK_EMU_WATCHDOG_S before any launch).

mod common;

use common::{available, launch1, ptr_mut};
use hip_emu::exec::ExecError;

#[test]
fn a_spin_wait_on_another_thread_is_a_hang_error_not_a_hang() {
    if !available() {
        return;
    }
    // SAFETY: the only test of this binary sets it before any launch reads it.
    std::env::set_var("HIPK_EMU_WATCHDOG_S", "2");
    let t0 = std::time::Instant::now();
    let mut out = vec![0i32; 128];
    let err = launch1("hipemu_test_spin", 1, 128, &[ptr_mut(out.as_mut_ptr())]).unwrap_err();
    assert!(matches!(err, ExecError::Hang { seconds: 2, .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("hipemu_test_spin") && msg.contains("thread (0, 0, 0)"),
        "{msg}"
    );
    assert!(t0.elapsed().as_secs() < 30, "took {:?}", t0.elapsed());
    // The executor is usable afterwards.
    launch1("hipemu_test_no_params", 1, 64, &[]).unwrap();
}
