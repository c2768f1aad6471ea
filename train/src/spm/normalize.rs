//! SentencePiece's normalizer (`normalizer.cc`), byte for byte.
//!
//! In order: user-defined symbols pass unchanged; otherwise the longest rule of the precompiled
//! character map (if the model has one: `nmt_nfkc` and friends) replaces a prefix, else one
//! UTF-8 character is copied. With `remove_extra_whitespaces`, leading, trailing and repeated
//! spaces go; with `add_dummy_prefix`, a space is put first (last with
//! `treat_whitespace_as_suffix`); with `escape_whitespaces`, every space becomes `▁` (U+2581).

use super::model::UserSymbols;

/// `▁`, SentencePiece's visible space.
pub(crate) const SPACE_SYMBOL: &[u8] = "\u{2581}".as_bytes();

/// The most rules SentencePiece looks at for one prefix (`kMaxTrieResultsSize`).
const MAX_TRIE_RESULTS: usize = 32;

/// The normalizer spec of a model.
#[derive(Debug, Clone)]
pub(crate) struct Normalizer {
    pub(crate) name: String,
    pub(crate) add_dummy_prefix: bool,
    pub(crate) remove_extra_whitespaces: bool,
    pub(crate) escape_whitespaces: bool,
    pub(crate) treat_whitespace_as_suffix: bool,
    pub(crate) charsmap: Option<CharsMap>,
}

/// A precompiled character map: a darts-clone double-array trie over byte strings whose values
/// are offsets of NUL-terminated replacements in `normalized`.
#[derive(Debug, Clone)]
pub(crate) struct CharsMap {
    units: Vec<u32>,
    normalized: Vec<u8>,
}

impl CharsMap {
    /// Splits a `precompiled_charsmap` blob: a little-endian u32 trie size, the trie's units,
    /// then the replacement strings (`Normalizer::DecodePrecompiledCharsMap`).
    pub(crate) fn decode(blob: &[u8]) -> Result<Self, String> {
        let broken = || "the normalizer's precompiled_charsmap is broken".to_string();
        if blob.len() <= 4 {
            return Err(broken());
        }
        let trie_size = u32::from_le_bytes([blob[0], blob[1], blob[2], blob[3]]) as usize;
        if trie_size >= blob.len() {
            return Err(format!(
                "{} (its trie size {trie_size} exceeds the blob)",
                broken()
            ));
        }
        let trie = blob.get(4..4 + trie_size).ok_or_else(broken)?;
        // As darts-clone's set_array: whole 4-byte units only.
        let units = trie
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect::<Vec<_>>();
        if units.is_empty() {
            return Err(broken());
        }
        Ok(CharsMap {
            units,
            normalized: blob[4 + trie_size..].to_vec(),
        })
    }

    fn unit(&self, i: u32) -> Option<u32> {
        self.units.get(i as usize).copied()
    }

    /// darts-clone's `commonPrefixSearch`: `(value, length)` of each rule that is a prefix of
    /// `key`, shortest first, at most [`MAX_TRIE_RESULTS`]. A corrupt trie (an index outside the
    /// array) ends the search.
    fn longest_rule(&self, key: &[u8]) -> Option<(usize, usize)> {
        fn offset(u: u32) -> u32 {
            (u >> 10) << ((u & (1 << 9)) >> 6)
        }
        let has_leaf = |u: u32| (u >> 8) & 1 == 1;
        let label = |u: u32| u & ((1 << 31) | 0xff);
        let mut best: Option<(usize, usize)> = None;
        let mut found = 0usize;
        let mut id = offset(self.unit(0)?);
        for (i, &c) in key.iter().enumerate() {
            id ^= u32::from(c);
            let Some(u) = self.unit(id) else { break };
            if label(u) != u32::from(c) {
                break;
            }
            id ^= offset(u);
            if has_leaf(u) {
                if found < MAX_TRIE_RESULTS {
                    let Some(leaf) = self.unit(id) else { break };
                    let value = (leaf & ((1 << 31) - 1)) as usize;
                    // Results come shortest first; SentencePiece keeps the longest.
                    best = Some((value, i + 1));
                }
                found += 1;
            }
        }
        best
    }

    /// The NUL-terminated replacement at `value`.
    fn replacement(&self, value: usize) -> &[u8] {
        let tail = self.normalized.get(value..).unwrap_or(&[]);
        let end = tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
        &tail[..end]
    }
}

/// Length in bytes of the UTF-8 character `lead` starts (SentencePiece's `OneCharLen`).
pub(crate) fn one_char_len(lead: u8) -> usize {
    const LEN: [u8; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4];
    usize::from(LEN[usize::from(lead >> 4)])
}

impl Normalizer {
    /// The normalized form of `input`'s first character(s) and how many bytes it consumed
    /// (`Normalizer::NormalizePrefix`). `input` is non-empty valid UTF-8.
    fn normalize_prefix<'a>(&'a self, input: &'a [u8], user: &UserSymbols) -> (&'a [u8], usize) {
        if let Some(len) = user.longest_prefix(input) {
            return (&input[..len], len);
        }
        if let Some(map) = &self.charsmap {
            if let Some((value, len)) = map.longest_rule(input) {
                return (map.replacement(value), len);
            }
        }
        // `input` comes from a `&str`, so it is valid UTF-8 and the lead byte's length holds.
        let len = one_char_len(input[0]).min(input.len());
        (&input[..len], len)
    }

    /// Normalizes `input` (`Normalizer::Normalize`).
    pub(crate) fn normalize(&self, input: &str, user: &UserSymbols) -> Vec<u8> {
        let mut input = input.as_bytes();
        let mut out = Vec::with_capacity(input.len() * 3);
        if input.is_empty() {
            return out;
        }
        if self.remove_extra_whitespaces {
            while !input.is_empty() {
                let (sp, len) = self.normalize_prefix(input, user);
                if sp != b" " {
                    break;
                }
                input = &input[len..];
            }
        }
        if input.is_empty() {
            return out;
        }
        let space: &[u8] = if self.escape_whitespaces {
            SPACE_SYMBOL
        } else {
            b" "
        };
        if !self.treat_whitespace_as_suffix && self.add_dummy_prefix {
            out.extend_from_slice(space);
        }
        let mut is_prev_space = self.remove_extra_whitespaces;
        while !input.is_empty() {
            let (mut sp, len) = self.normalize_prefix(input, user);
            while is_prev_space && sp.first() == Some(&b' ') {
                sp = &sp[1..];
            }
            if !sp.is_empty() {
                for &b in sp {
                    if self.escape_whitespaces && b == b' ' {
                        out.extend_from_slice(SPACE_SYMBOL);
                    } else {
                        out.push(b);
                    }
                }
                is_prev_space = sp.last() == Some(&b' ');
            }
            input = &input[len..];
            if !self.remove_extra_whitespaces {
                is_prev_space = false;
            }
        }
        if self.remove_extra_whitespaces {
            while out.ends_with(space) {
                out.truncate(out.len() - space.len());
            }
        }
        if self.treat_whitespace_as_suffix && self.add_dummy_prefix {
            out.extend_from_slice(space);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(add_dummy_prefix: bool, remove_extra_whitespaces: bool) -> Normalizer {
        Normalizer {
            name: "identity".into(),
            add_dummy_prefix,
            remove_extra_whitespaces,
            escape_whitespaces: true,
            treat_whitespace_as_suffix: false,
            charsmap: None,
        }
    }

    fn norm(n: &Normalizer, s: &str) -> String {
        String::from_utf8(n.normalize(s, &UserSymbols::default())).unwrap()
    }

    #[test]
    fn whitespace_rules() {
        let keep = plain(true, false);
        assert_eq!(norm(&keep, "  a  b \n"), "▁▁▁a▁▁b▁\n");
        assert_eq!(norm(&keep, ""), "");
        let squeeze = plain(true, true);
        assert_eq!(norm(&squeeze, "  a  b  "), "▁a▁b");
        assert_eq!(norm(&squeeze, "   "), "");
        assert_eq!(norm(&plain(false, false), " x"), "▁x");
        let mut suffix = plain(true, false);
        suffix.treat_whitespace_as_suffix = true;
        assert_eq!(norm(&suffix, "a b"), "a▁b▁");
    }

    #[test]
    fn char_lengths() {
        assert_eq!(one_char_len(b'a'), 1);
        assert_eq!(one_char_len("é".as_bytes()[0]), 2);
        assert_eq!(one_char_len("中".as_bytes()[0]), 3);
        assert_eq!(one_char_len("😀".as_bytes()[0]), 4);
    }

    #[test]
    fn broken_charsmaps_are_refused() {
        assert!(CharsMap::decode(&[1, 0, 0]).is_err());
        assert!(CharsMap::decode(&[200, 0, 0, 0, 1, 2]).is_err());
        // A trie of one unit that matches nothing: lookups find no rule and do not panic.
        let map = CharsMap::decode(&[4, 0, 0, 0, 0, 0, 0, 0, b'x', 0]).unwrap();
        assert_eq!(map.longest_rule(b"abc"), None);
    }
}
