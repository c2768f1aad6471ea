//! Reading a case file's bytes and its safetensors header strictly: only regular files of at
//! most [`MAX_CASE_BYTES`], and no key repeated in the header.

use super::{GoldenError, MAX_CASE_BYTES};
use serde::de::{Deserialize, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use std::collections::BTreeSet;
use std::io::Read;
use std::path::Path;

/// The bytes of a case file, bounded. The file type is checked before opening (for the typed
/// error naming what the path is) and again on the opened descriptor by
/// [`crate::files::open_regular`], whose open never blocks on a FIFO.
pub(super) fn read_case_file(path: &Path) -> Result<Vec<u8>, GoldenError> {
    let io = |source| GoldenError::Io {
        path: path.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(io)?;
    if !meta.is_file() {
        return Err(GoldenError::NotAFile {
            path: path.to_path_buf(),
            kind: crate::files::kind_name(meta.file_type()),
        });
    }
    let (file, len) = crate::files::open_regular(path).map_err(io)?;
    if len > MAX_CASE_BYTES {
        return Err(too_large(path, len));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(MAX_CASE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > MAX_CASE_BYTES {
        return Err(too_large(path, bytes.len() as u64));
    }
    Ok(bytes)
}

fn too_large(path: &Path, size: u64) -> GoldenError {
    GoldenError::TooLarge {
        path: path.to_path_buf(),
        size,
        limit: MAX_CASE_BYTES,
    }
}

/// Top-level keys (tensor names and `__metadata__`) and metadata keys of a safetensors header,
/// in file order with repeats kept (serde's maps keep only the last of a repeated key).
#[derive(Default)]
struct HeaderKeys {
    top: Vec<String>,
    metadata: Vec<String>,
}

impl<'de> Deserialize<'de> for HeaderKeys {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Keys<const TOP: bool>;
        impl<'de, const TOP: bool> Visitor<'de> for Keys<TOP> {
            type Value = HeaderKeys;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<HeaderKeys, A::Error> {
                let mut keys = HeaderKeys::default();
                while let Some(key) = map.next_key::<String>()? {
                    if TOP && key == "__metadata__" {
                        keys.metadata.extend(map.next_value_seed(KeysSeed)?.top);
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                    keys.top.push(key);
                }
                Ok(keys)
            }
        }
        struct KeysSeed;
        impl<'de> DeserializeSeed<'de> for KeysSeed {
            type Value = HeaderKeys;
            fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<HeaderKeys, D::Error> {
                d.deserialize_map(Keys::<false>)
            }
        }
        d.deserialize_map(Keys::<true>)
    }
}

/// A [`GoldenError::DuplicateKey`] for the first key that appears twice in the JSON header of
/// the safetensors file `bytes`. A header that is out of bounds or not a JSON object passes
/// here: safetensors reports it.
pub(super) fn reject_duplicate_keys(case: &str, bytes: &[u8]) -> Result<(), GoldenError> {
    let Some((len, rest)) = bytes.split_first_chunk::<8>() else {
        return Ok(());
    };
    let header = usize::try_from(u64::from_le_bytes(*len))
        .ok()
        .and_then(|n| rest.get(..n));
    let Some(Ok(keys)) = header.map(serde_json::from_slice::<HeaderKeys>) else {
        return Ok(());
    };
    for (list, place) in [(keys.top, "header"), (keys.metadata, "__metadata__")] {
        let mut seen = BTreeSet::new();
        if let Some(key) = list.into_iter().find(|k| !seen.insert(k.clone())) {
            return Err(GoldenError::DuplicateKey {
                case: case.to_string(),
                key,
                place,
            });
        }
    }
    Ok(())
}
