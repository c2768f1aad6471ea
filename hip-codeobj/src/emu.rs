//! The key that ties a code object to its host build for the emulated device (hip-emu).
//!
//! `hip-build` compiles each kernel source twice: with hipcc into an offload bundle, and with
//! clang++ for the host into a shared object that hip-emu runs. It names the shared object after
//! [`host_key`] of the bundle; hip-emu computes the same key from the image a program passes to
//! `hipModuleLoadData` and loads the shared object with that name. Both sides call this one
//! function, so they cannot disagree.
//!
//! The key is the FNV-1a 64-bit hash of the code object hip-emu would pick (the first one
//! compatible with [`EMULATED_ARCH`]), as 16 lowercase hex digits: the other code objects of a
//! bundle do not matter, and a bare code object and a bundle holding it have the same key.

use crate::bundle::{target_id_compatible, BundleError, CodeObjects};

/// The `gcnArchName` of hip-emu's emulated device (a gfx906 DCU).
pub const EMULATED_ARCH: &str = "gfx906:sramecc+:xnack-";

/// Why an image has no host key.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// Neither a bundle nor a code object.
    #[error(transparent)]
    Format(#[from] BundleError),
    /// No code object for the emulated arch.
    #[error("the image holds code objects for {targets:?}, none for {EMULATED_ARCH}: build the kernels for gfx906 too")]
    NoEmulatedArch {
        /// The target ids the image has.
        targets: Vec<String>,
    },
}

/// The host-build key of a bundle or bare code object (see the module docs).
pub fn host_key(image: &[u8]) -> Result<String, KeyError> {
    let objects = CodeObjects::parse(image)?;
    let (_, code) = objects
        .objects
        .iter()
        .find(|(t, _)| target_id_compatible(t, EMULATED_ARCH))
        .ok_or_else(|| KeyError::NoEmulatedArch {
            targets: objects.objects.iter().map(|(t, _)| t.clone()).collect(),
        })?;
    Ok(format!("{:016x}", fnv1a64(code)))
}

/// FNV-1a, 64 bits.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_matches_the_published_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn garbage_has_no_key() {
        assert!(matches!(
            host_key(b"not a code object at all, just text"),
            Err(KeyError::Format(_))
        ));
    }
}
