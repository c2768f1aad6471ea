//! Compiles kernels/*.hip with hipcc (gfx906 code objects) and with clang++ for hip-emu, as a
//! downstream crate does (hip-build's crate docs).
fn main() {
    hip_build::Builder::new("hip-emu-corpus").build();
}
