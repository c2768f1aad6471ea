//! Embeds the committed golden cases (`../tests/golden/*.safetensors`) in the binary, so that
//! the CPU reference self-check runs wherever the binary is copied. Writes
//! `$OUT_DIR/embedded_golden.rs`: a sorted table of `(case name, include_bytes!(file))`.
//!
//! The cases are stored uncompressed: about 2.2 MB in all, and they compress only to about
//! two thirds (gzip -9), which is not worth a decompressor in the binary.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn main() {
    let manifest = PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    );
    let dir = manifest.join("..").join("tests").join("golden");
    println!("cargo:rerun-if-changed={}", dir.display());
    println!("cargo:rerun-if-changed=build.rs");
    let files = case_files(&dir);
    if files.is_empty() {
        println!(
            "cargo:warning=hip-doctor: no golden cases in {}: the binary embeds none, and its \
             self-check needs HIPK_GOLDEN_DIR",
            dir.display()
        );
    }
    let mut table = String::from(
        "/// The committed golden cases, sorted by name: (case name, file bytes).\n\
         pub static EMBEDDED_CASES: &[(&str, &[u8])] = &[\n",
    );
    for file in &files {
        let name = file
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_else(|| panic!("golden case file name is not UTF-8: {}", file.display()));
        let path = file
            .to_str()
            .unwrap_or_else(|| panic!("golden case path is not UTF-8: {}", file.display()));
        let _ = writeln!(table, "    ({name:?}, include_bytes!({path:?})),");
    }
    table.push_str("];\n");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let target = out.join("embedded_golden.rs");
    if let Err(e) = std::fs::write(&target, table) {
        panic!("cannot write {}: {e}", target.display());
    }
}

/// The `*.safetensors` files of `dir`, sorted; none when it does not exist.
fn case_files(dir: &Path) -> Vec<PathBuf> {
    if !dir.exists() {
        return Vec::new();
    }
    let entries = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list the golden cases in {}: {e}", dir.display()));
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors") && p.is_file())
        .collect();
    files.sort();
    files
}
