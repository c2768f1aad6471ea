use super::*;
use crate::elf;

/// Lay out a bundle exactly as clang-offload-bundler does (header, then entry bodies).
fn make_bundle(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let header_len: usize =
        BUNDLE_MAGIC.len() + 8 + entries.iter().map(|(id, _)| 24 + id.len()).sum::<usize>();
    let mut out = BUNDLE_MAGIC.to_vec();
    out.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    let mut body_at = header_len;
    for (id, body) in entries {
        out.extend_from_slice(&(body_at as u64).to_le_bytes());
        out.extend_from_slice(&(body.len() as u64).to_le_bytes());
        out.extend_from_slice(&(id.len() as u64).to_le_bytes());
        out.extend_from_slice(id.as_bytes());
        body_at += body.len();
    }
    for (_, body) in entries {
        out.extend_from_slice(body);
    }
    out
}

#[test]
fn parses_both_id_spellings() {
    let bytes = make_bundle(&[
        ("host-x86_64-unknown-linux", b""),
        ("hipv4-amdgcn-amd-amdhsa--gfx906", b"AAAA"),
        ("hip-amdgcn-amd-amdhsa-gfx90a:sramecc+:xnack-", b"BB"),
    ]);
    let bundle = Bundle::parse(&bytes).unwrap();
    let e = bundle.entries();
    assert_eq!(e.len(), 3);
    assert_eq!(e[0].kind(), "host");
    assert_eq!(e[0].target_id(), None);
    assert!(!e[0].is_gpu());
    assert_eq!(e[1].kind(), "hipv4");
    assert_eq!(e[1].target_id(), Some("gfx906"));
    assert_eq!(e[1].bytes, b"AAAA");
    assert_eq!(e[2].kind(), "hip");
    assert_eq!(e[2].target_id(), Some("gfx90a:sramecc+:xnack-"));
    assert_eq!(e[2].processor(), Some("gfx90a"));
    assert_eq!(e[2].bytes, b"BB");
    assert_eq!(
        bundle.target_ids(),
        vec!["gfx906", "gfx90a:sramecc+:xnack-"]
    );
}

#[test]
fn arch_matching_follows_target_id_rules() {
    assert!(target_id_compatible("gfx906", "gfx906:sramecc+:xnack-"));
    assert!(target_id_compatible(
        "gfx906:xnack-",
        "gfx906:sramecc+:xnack-"
    ));
    assert!(!target_id_compatible(
        "gfx906:xnack+",
        "gfx906:sramecc+:xnack-"
    ));
    assert!(!target_id_compatible("gfx906", "gfx928"));
    assert!(!target_id_compatible("gfx90", "gfx906"));
    // A device that does not report a feature accepts either setting.
    assert!(target_id_compatible("gfx928:xnack-", "gfx928"));

    let bytes = make_bundle(&[
        ("hipv4-amdgcn-amd-amdhsa--gfx906", b"X"),
        ("hipv4-amdgcn-amd-amdhsa--gfx928", b"Y"),
    ]);
    let bundle = Bundle::parse(&bytes).unwrap();
    assert_eq!(
        bundle.entry_for_arch("gfx928:sramecc-").map(|e| e.bytes),
        Some(&b"Y"[..])
    );
    assert!(bundle.entry_for_arch("gfx936").is_none());
}

#[test]
fn malformed_buffers_give_typed_errors() {
    assert!(matches!(
        Bundle::parse(b""),
        Err(BundleError::UnknownFormat { .. })
    ));
    assert!(
        matches!(Bundle::parse(b"hello world"), Err(BundleError::UnknownFormat { head }) if head == b"hello wo")
    );
    assert_eq!(Bundle::parse(b"CCOB\x01\x00"), Err(BundleError::Compressed));

    // Magic only: the entry count is missing.
    let err = Bundle::parse(BUNDLE_MAGIC).unwrap_err();
    assert_eq!(
        err,
        BundleError::Truncated {
            field: "entry count",
            offset: 24,
            needed: 8,
            len: 24
        }
    );

    let good = make_bundle(&[("hipv4-amdgcn-amd-amdhsa--gfx906", b"CODE")]);
    // Every truncation of a valid bundle is an error, never a panic.
    for cut in 0..good.len() {
        assert!(Bundle::parse(&good[..cut]).is_err(), "cut at {cut} parsed");
    }

    let mut huge_count = good.clone();
    huge_count[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
    assert_eq!(
        Bundle::parse(&huge_count),
        Err(BundleError::TooManyEntries { count: u64::MAX })
    );

    // Entry offset + size overflowing u64, and pointing past the end.
    for (offset, size) in [(u64::MAX, 2), (4, u64::MAX), (1000, 4)] {
        let mut bad = good.clone();
        bad[32..40].copy_from_slice(&offset.to_le_bytes());
        bad[40..48].copy_from_slice(&size.to_le_bytes());
        assert!(
            matches!(
                Bundle::parse(&bad),
                Err(BundleError::EntryOutOfBounds { index: 0, .. })
            ),
            "{offset} {size}"
        );
    }

    // An id length beyond the buffer.
    let mut long_id = good.clone();
    long_id[48..56].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(
        Bundle::parse(&long_id),
        Err(BundleError::Truncated {
            field: "entry id",
            ..
        })
    ));

    let mut bad_utf8 = good;
    bad_utf8[56] = 0xff;
    assert_eq!(
        Bundle::parse(&bad_utf8),
        Err(BundleError::BadId { index: 0 })
    );
}

#[test]
fn errors_say_what_to_do() {
    let msg = Bundle::parse(b"\0\0\0\0").unwrap_err().to_string();
    assert!(msg.contains("hipcc --genco"), "{msg}");
    let msg = Bundle::parse(b"CCOB").unwrap_err().to_string();
    assert!(msg.contains("--offload-compress"), "{msg}");
}

#[test]
fn code_objects_rejects_bad_elf_without_panicking() {
    let mut elf = b"\x7fELF".to_vec();
    assert!(matches!(
        CodeObjects::parse(&elf),
        Err(BundleError::Elf(elf::ElfError::Truncated { .. }))
    ));
    elf.extend_from_slice(&[1, 1]); // 32-bit
    assert!(matches!(
        CodeObjects::parse(&elf),
        Err(BundleError::Elf(elf::ElfError::Unsupported {
            class: 1,
            data: 1
        }))
    ));
}

#[test]
fn entry_headers_need_only_the_header() {
    let bytes = make_bundle(&[
        ("host-x86_64-unknown-linux", b""),
        ("hipv4-amdgcn-amd-amdhsa--gfx906", &[7u8; 300]),
        ("hip-amdgcn-amd-amdhsa-gfx90a:xnack-", &[8u8; 100]),
    ]);
    // The first 200 bytes hold the header but not the bodies: parse refuses, entry_headers reads.
    let prefix = &bytes[..200];
    assert!(matches!(
        Bundle::parse(prefix),
        Err(BundleError::EntryOutOfBounds { .. })
    ));
    let headers = entry_headers(prefix).unwrap();
    let processors: Vec<Option<String>> = headers.iter().map(EntryHeader::processor).collect();
    assert_eq!(
        processors,
        vec![None, Some("gfx906".into()), Some("gfx90a".into())]
    );
    assert_eq!(headers[2].target_id().as_deref(), Some("gfx90a:xnack-"));
    assert_eq!(bundle_end(&headers, 0), Some(bytes.len() as u64));
    // A prefix cut inside the header is a typed error naming the field.
    assert!(matches!(
        entry_headers(&bytes[..40]),
        Err(BundleError::Truncated {
            field: "entry offset" | "entry size",
            ..
        })
    ));
}
