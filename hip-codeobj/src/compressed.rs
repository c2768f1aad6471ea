//! Compressed clang offload bundles (`CCOB`, `clang --offload-compress`).
//!
//! The layout, as clang's `CompressedOffloadBundle` writes it (all fields little endian):
//!
//! ```text
//! "CCOB"                  4 bytes, magic
//! u16 version             1, 2 or 3
//! u16 method              0 = zlib, 1 = zstd (the order of llvm::compression::Format)
//! total file size         version 2: u32, version 3: u64; absent in version 1
//! uncompressed size       versions 1 and 2: u32, version 3: u64
//! u64 hash                the low half of the MD5 of the uncompressed bundle
//! compressed data         one zlib stream or one zstd frame: an uncompressed bundle
//! ```
//!
//! clang picks zstd when it was built with it and zlib otherwise. The total size (versions 2 and
//! 3) lets a reader skip to the next bundle in a `.hip_fatbin` section without decompressing.
//!
//! Everything is bounded: [`decompress_prefix`] stops after the bytes asked for (enough for a
//! bundle's header, see [`crate::bundle::entry_headers`]) and [`decompress`] refuses output larger
//! than its limit, so a 1 GB library or a zip bomb costs bounded memory.

use std::io::Read;

use crate::bundle::COMPRESSED_BUNDLE_MAGIC;

/// The compression inside a `CCOB`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// zlib (RFC 1950), method 0.
    Zlib,
    /// Zstandard, method 1.
    Zstd,
}

impl Method {
    /// `zlib` or `zstd`.
    pub fn name(self) -> &'static str {
        match self {
            Method::Zlib => "zlib",
            Method::Zstd => "zstd",
        }
    }
}

/// Why a `CCOB` could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompressedError {
    /// The bytes do not start with `CCOB`.
    #[error("not a compressed offload bundle (no `CCOB` magic)")]
    NotCompressed,
    /// The header is cut short.
    #[error("compressed offload bundle truncated: its version {version} header needs {needed} bytes, {len} present")]
    Truncated {
        /// The format version read (0 when even that is missing).
        version: u16,
        /// Header bytes needed.
        needed: usize,
        /// Bytes present.
        len: usize,
    },
    /// A version this reader does not know.
    #[error("compressed offload bundle version {0} is not known (1, 2 and 3 are); a newer clang wrote it")]
    UnknownVersion(u16),
    /// A compression method this reader does not know.
    #[error(
        "compressed offload bundle uses compression method {0} (0 = zlib and 1 = zstd are known)"
    )]
    UnknownMethod(u16),
    /// The compressed stream is damaged.
    #[error("compressed offload bundle: the {method} stream is damaged: {message}")]
    Corrupt {
        /// `zlib` or `zstd`.
        method: &'static str,
        /// The decoder's message.
        message: String,
    },
    /// The bundle would decompress to more than the limit.
    #[error("compressed offload bundle decompresses to {size} bytes, over the {limit}-byte limit")]
    TooLarge {
        /// The size its header states.
        size: u64,
        /// The limit.
        limit: usize,
    },
}

/// The fixed header of a `CCOB`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompressedHeader {
    /// Format version (1, 2 or 3).
    pub version: u16,
    /// The compression.
    pub method: Method,
    /// The whole compressed bundle's size, header included (versions 2 and 3).
    pub total_size: Option<u64>,
    /// The size of the bundle once decompressed.
    pub uncompressed_size: u64,
    /// The low 64 bits of the MD5 of the uncompressed bundle.
    pub hash: u64,
    /// Where the compressed data starts.
    pub header_len: usize,
}

impl CompressedHeader {
    /// Reads the header at the start of `bytes`.
    pub fn parse(bytes: &[u8]) -> Result<CompressedHeader, CompressedError> {
        if !bytes.starts_with(COMPRESSED_BUNDLE_MAGIC) {
            return Err(CompressedError::NotCompressed);
        }
        let version = le(bytes, 4, 2).unwrap_or(0) as u16;
        let needed = match version {
            1 => 4 + 2 + 2 + 4 + 8,
            2 => 4 + 2 + 2 + 4 + 4 + 8,
            3 => 4 + 2 + 2 + 8 + 8 + 8,
            0 if bytes.len() < 6 => usize::MAX,
            other => return Err(CompressedError::UnknownVersion(other)),
        };
        if bytes.len() < needed {
            return Err(CompressedError::Truncated {
                version,
                needed: if needed == usize::MAX { 6 } else { needed },
                len: bytes.len(),
            });
        }
        let method = match le(bytes, 6, 2).unwrap_or(u64::MAX) {
            0 => Method::Zlib,
            1 => Method::Zstd,
            other => return Err(CompressedError::UnknownMethod(other as u16)),
        };
        // The remaining fields, at their offsets per version (checked present above).
        let (total_size, uncompressed_size, hash) = match version {
            1 => (None, le(bytes, 8, 4), le(bytes, 12, 8)),
            2 => (le(bytes, 8, 4), le(bytes, 12, 4), le(bytes, 16, 8)),
            _ => (le(bytes, 8, 8), le(bytes, 16, 8), le(bytes, 24, 8)),
        };
        Ok(CompressedHeader {
            version,
            method,
            total_size,
            uncompressed_size: uncompressed_size.unwrap_or(0),
            hash: hash.unwrap_or(0),
            header_len: needed,
        })
    }
}

/// The little-endian unsigned integer of `width` bytes at `at`, if present.
fn le(bytes: &[u8], at: usize, width: usize) -> Option<u64> {
    let raw = bytes.get(at..at.checked_add(width)?)?;
    Some(
        raw.iter()
            .rev()
            .fold(0u64, |acc, &b| (acc << 8) | u64::from(b)),
    )
}

/// The compressed data of a `CCOB`: after the header, up to the total size when it is known.
fn payload<'a>(bytes: &'a [u8], header: &CompressedHeader) -> &'a [u8] {
    let end = header
        .total_size
        .and_then(|t| usize::try_from(t).ok())
        .filter(|&t| t >= header.header_len && t <= bytes.len())
        .unwrap_or(bytes.len());
    &bytes[header.header_len..end]
}

/// Decompresses at most the first `max_out` bytes of the bundle inside a `CCOB` (fewer when it
/// is smaller). Enough of a prefix holds the inner bundle's header; the rest is never produced.
pub fn decompress_prefix(bytes: &[u8], max_out: usize) -> Result<Vec<u8>, CompressedError> {
    let header = CompressedHeader::parse(bytes)?;
    let data = payload(bytes, &header);
    let want = max_out.min(usize::try_from(header.uncompressed_size).unwrap_or(usize::MAX));
    inflate(header.method, data, want)
}

/// Decompresses the whole bundle inside a `CCOB`, refusing one over `limit` bytes.
pub fn decompress(bytes: &[u8], limit: usize) -> Result<Vec<u8>, CompressedError> {
    let header = CompressedHeader::parse(bytes)?;
    if header.uncompressed_size > limit as u64 {
        return Err(CompressedError::TooLarge {
            size: header.uncompressed_size,
            limit,
        });
    }
    let data = payload(bytes, &header);
    let out = inflate(header.method, data, header.uncompressed_size as usize)?;
    if (out.len() as u64) < header.uncompressed_size {
        return Err(CompressedError::Corrupt {
            method: header.method.name(),
            message: format!(
                "the stream ended after {} of the {} bytes its header states",
                out.len(),
                header.uncompressed_size
            ),
        });
    }
    Ok(out)
}

/// Inflates at most `want` bytes of `data`.
fn inflate(method: Method, data: &[u8], want: usize) -> Result<Vec<u8>, CompressedError> {
    let corrupt = |message: String| CompressedError::Corrupt {
        method: method.name(),
        message,
    };
    match method {
        Method::Zlib => {
            use miniz_oxide::inflate::{decompress_to_vec_zlib_with_limit, TINFLStatus};
            match decompress_to_vec_zlib_with_limit(data, want) {
                Ok(out) => Ok(out),
                // The limit reached: the prefix asked for is what came out.
                Err(e) if e.status == TINFLStatus::HasMoreOutput => {
                    let mut out = e.output;
                    out.truncate(want);
                    Ok(out)
                }
                Err(e) => Err(corrupt(format!("{:?}", e.status))),
            }
        }
        Method::Zstd => {
            let decoder = ruzstd::decoding::StreamingDecoder::new(data)
                .map_err(|e| corrupt(e.to_string()))?;
            let mut out = Vec::new();
            decoder
                .take(want as u64)
                .read_to_end(&mut out)
                .map_err(|e| corrupt(e.to_string()))?;
            Ok(out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A version 2 `CCOB` around `compressed` (as clang writes it).
    fn ccob_v2(method: u16, uncompressed: u32, compressed: &[u8]) -> Vec<u8> {
        let mut out = b"CCOB".to_vec();
        out.extend_from_slice(&2u16.to_le_bytes());
        out.extend_from_slice(&method.to_le_bytes());
        out.extend_from_slice(&(24 + compressed.len() as u32).to_le_bytes());
        out.extend_from_slice(&uncompressed.to_le_bytes());
        out.extend_from_slice(&0x1234_5678_9abc_def0u64.to_le_bytes());
        out.extend_from_slice(compressed);
        out
    }

    #[test]
    fn zlib_round_trip_whole_and_prefix() {
        let plain: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        let packed = miniz_oxide::deflate::compress_to_vec_zlib(&plain, 6);
        let ccob = ccob_v2(0, plain.len() as u32, &packed);
        let header = CompressedHeader::parse(&ccob).unwrap();
        assert_eq!(
            (
                header.version,
                header.method,
                header.total_size,
                header.uncompressed_size
            ),
            (2, Method::Zlib, Some(ccob.len() as u64), 5000)
        );
        assert_eq!(header.hash, 0x1234_5678_9abc_def0);
        assert_eq!(decompress(&ccob, 1 << 20).unwrap(), plain);
        assert_eq!(decompress_prefix(&ccob, 100).unwrap(), plain[..100]);
        assert_eq!(
            decompress(&ccob, 100),
            Err(CompressedError::TooLarge {
                size: 5000,
                limit: 100
            })
        );
    }

    #[test]
    fn zstd_round_trip_whole_and_prefix() {
        let plain: Vec<u8> = (0..20_000u32).map(|i| (i * 7 % 253) as u8).collect();
        let packed = ruzstd::encoding::compress_to_vec(
            plain.as_slice(),
            ruzstd::encoding::CompressionLevel::Fastest,
        );
        let ccob = ccob_v2(1, plain.len() as u32, &packed);
        assert_eq!(CompressedHeader::parse(&ccob).unwrap().method, Method::Zstd);
        assert_eq!(decompress(&ccob, 1 << 20).unwrap(), plain);
        assert_eq!(decompress_prefix(&ccob, 64).unwrap(), plain[..64]);
        // A stream cut short is an error, not a short result.
        let cut = &ccob[..ccob.len() - packed.len() / 2];
        assert!(decompress(cut, 1 << 20).is_err());
    }

    #[test]
    fn bad_headers_are_errors() {
        assert_eq!(
            CompressedHeader::parse(b"CCOB\x02\x00\x01"),
            Err(CompressedError::Truncated {
                version: 2,
                needed: 24,
                len: 7
            })
        );
        assert_eq!(
            CompressedHeader::parse(b"CCOB\x09\x00\x01\x00"),
            Err(CompressedError::UnknownVersion(9))
        );
        let bad_method = ccob_v2(7, 10, b"xx");
        assert_eq!(
            CompressedHeader::parse(&bad_method),
            Err(CompressedError::UnknownMethod(7))
        );
        let garbage = ccob_v2(1, 10, b"not a zstd frame");
        assert!(matches!(
            decompress_prefix(&garbage, 10),
            Err(CompressedError::Corrupt { method: "zstd", .. })
        ));
        assert_eq!(
            CompressedHeader::parse(b"XXXX"),
            Err(CompressedError::NotCompressed)
        );
    }
}
