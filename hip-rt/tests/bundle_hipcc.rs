//! The bundle/ELF readers on a bundle built by the real hipcc (skipped, saying why, without it).

mod common;

use hip_rt::module::bundle::{Bundle, CodeObjects};
use hip_rt::module::elf;

#[test]
fn reads_a_bundle_built_by_hipcc() {
    let bytes = match common::build_bundle(&["gfx906"]) {
        Ok(b) => b,
        Err(why) if why.contains("not runnable") => return eprintln!("skipped: {why}"),
        Err(why) => panic!("{why}"),
    };
    let bundle = Bundle::parse(&bytes).unwrap();
    assert_eq!(bundle.target_ids(), vec!["gfx906"]);
    assert!(bundle.entries().iter().any(|e| e.kind() == "host"));
    let entry = bundle.entry_for_arch("gfx906:sramecc+:xnack-").unwrap();
    assert_eq!(
        entry.kernel_names().unwrap(),
        vec!["hipk_test_add", "hipk_test_scale"]
    );
    assert!(bundle.entry_for_arch("gfx928").is_none());

    let header = elf::Header::parse(entry.bytes).unwrap();
    assert!(header.is_amdgpu());
    assert_eq!(header.processor(), Some("gfx906"));

    let objects = CodeObjects::parse(&bytes).unwrap();
    assert!(objects.from_bundle);
    assert_eq!(objects.target_ids(), vec!["gfx906"]);
    // The code object alone parses as a bare ELF with the same arch.
    let bare = CodeObjects::parse(entry.bytes).unwrap();
    assert!(!bare.from_bundle);
    assert_eq!(bare.target_ids(), vec!["gfx906"]);

    // Every truncation of the real code object is an error or a shorter listing, never a panic.
    for cut in (0..entry.bytes.len()).step_by(7) {
        let _ = elf::kernel_names(&entry.bytes[..cut]);
        let _ = CodeObjects::parse(&entry.bytes[..cut]);
    }
    // Random byte corruption (fixed-seed LCG): typed errors or readings, never a panic.
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..2000 {
        let mut corrupt = entry.bytes.to_vec();
        for _ in 0..4 {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            // Half the hits land in the ELF header or the section-header table at the end.
            let len = corrupt.len();
            let at = match seed & 3 {
                0 => (seed >> 33) as usize % 64,
                1 => len - 1 - (seed >> 33) as usize % (len / 4),
                _ => (seed >> 33) as usize % len,
            };
            corrupt[at] = (seed >> 17) as u8;
        }
        let _ = elf::kernel_names(&corrupt);
        let _ = CodeObjects::parse(&corrupt);
    }
    for cut in (0..bytes.len()).step_by(13) {
        assert!(Bundle::parse(&bytes[..cut]).is_err() || cut >= 0x1000);
    }
}

#[test]
fn multi_arch_bundles_list_every_arch() {
    let bytes = match common::build_bundle(&["gfx906:xnack-", "gfx906:xnack+"]) {
        Ok(b) => b,
        Err(why) if why.contains("not runnable") => return eprintln!("skipped: {why}"),
        Err(why) => panic!("{why}"),
    };
    let bundle = Bundle::parse(&bytes).unwrap();
    let mut ids = bundle.target_ids();
    ids.sort();
    assert_eq!(ids, vec!["gfx906:xnack+", "gfx906:xnack-"]);
    // Each device setting picks the entry built for it.
    let pick = |arch| bundle.entry_for_arch(arch).and_then(|e| e.target_id());
    assert_eq!(pick("gfx906:sramecc+:xnack+"), Some("gfx906:xnack+"));
    assert_eq!(pick("gfx906:sramecc+:xnack-"), Some("gfx906:xnack-"));
    assert_eq!(pick("gfx908:xnack-"), None);
}
