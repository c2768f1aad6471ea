//! Text to ids, as `sentencepiece.SentencePieceProcessor.encode` does with a BPE model.
//!
//! After normalization the text is split into characters (a user-defined symbol is one frozen
//! symbol). Then, as `bpe_model.cc`: repeatedly the adjacent pair whose concatenation is a piece
//! with the highest score is merged (ties: the leftmost), until no pair is a piece. A result
//! that is an unused piece is split back into the two symbols it was merged from. Finally, as
//! `SentencePieceProcessor::PopulateSentencePieceText`: a symbol that is not a piece becomes its
//! UTF-8 bytes' `<0xXX>` pieces with byte fallback, else one unknown id for each run of
//! unknown symbols.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use super::model::{PieceType, SpmModel};
use super::normalize::one_char_len;

/// A symbol of the sentence being merged: `normalized[start..start + len]`, linked to its
/// neighbours (`usize::MAX` for none). An emptied symbol has `len == 0`.
#[derive(Clone, Copy)]
struct Symbol {
    prev: usize,
    next: usize,
    start: usize,
    len: usize,
    freeze: bool,
}

const NONE: usize = usize::MAX;

/// A candidate merge of `left` and `right` into a piece of `size` bytes with `score`.
#[derive(Clone, Copy)]
struct Pair {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl PartialEq for Pair {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Pair {}
impl PartialOrd for Pair {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Pair {
    /// The heap's top is the highest score, then the leftmost (`SymbolPairComparator`).
    /// Scores are never NaN (the loader refuses them).
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl SpmModel {
    /// The ids of `text`, exactly as SentencePiece's `encode(text)` with this model (no BOS/EOS).
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let normalized = self.normalizer.normalize(text, &self.user_symbols);
        let mut ids = Vec::with_capacity(normalized.len() / 2 + 1);
        let mut is_prev_unk = false;
        for (piece, id) in self.bpe(&normalized) {
            let kind = self.kind(id);
            let is_unk = kind == PieceType::Unknown;
            if kind == PieceType::Control {
                ids.push(id);
            } else if let (true, Some(bytes)) = (is_unk, self.byte_ids.as_deref()) {
                ids.extend(piece.iter().map(|&b| bytes[usize::from(b)]));
            } else if !(is_prev_unk && is_unk) {
                // A run of unknown symbols is one unknown id.
                ids.push(id);
            }
            is_prev_unk = is_unk;
        }
        ids
    }

    /// `bpe::Model::Encode`: the pieces of `normalized` and their ids.
    fn bpe<'a>(&self, normalized: &'a [u8]) -> Vec<(&'a [u8], u32)> {
        if normalized.is_empty() {
            return Vec::new();
        }
        let mut symbols: Vec<Symbol> = Vec::with_capacity(normalized.len());
        let mut pos = 0;
        while pos < normalized.len() {
            let rest = &normalized[pos..];
            let (len, freeze) = match self.user_symbols.longest_prefix(rest) {
                Some(len) => (len, true),
                None => (one_char_len(rest[0]).min(rest.len()), false),
            };
            let index = symbols.len();
            symbols.push(Symbol {
                prev: if index == 0 { NONE } else { index - 1 },
                next: if pos + len == normalized.len() {
                    NONE
                } else {
                    index + 1
                },
                start: pos,
                len,
                freeze,
            });
            pos += len;
        }

        let mut agenda = BinaryHeap::new();
        // Merged piece -> the two symbols it came from, for unused pieces (`rev_merge`).
        let mut rev_merge: HashMap<&'a [u8], (&'a [u8], &'a [u8])> = HashMap::new();
        let text = move |s: &Symbol| -> &'a [u8] { &normalized[s.start..s.start + s.len] };
        let mut maybe_add =
            |symbols: &[Symbol], agenda: &mut BinaryHeap<Pair>, left: usize, right: usize| {
                if left == NONE || right == NONE || symbols[left].freeze || symbols[right].freeze {
                    return;
                }
                let (l, r) = (&symbols[left], &symbols[right]);
                let merged = &normalized[l.start..l.start + l.len + r.len];
                let Some(&id) = self.mergeable.get(merged) else {
                    return;
                };
                let piece = &self.pieces[id as usize];
                agenda.push(Pair {
                    score: piece.score,
                    left,
                    right,
                    size: merged.len(),
                });
                if piece.kind == PieceType::Unused {
                    rev_merge.insert(merged, (text(l), text(r)));
                }
            };
        for i in 1..symbols.len() {
            maybe_add(&symbols, &mut agenda, i - 1, i);
        }
        while let Some(top) = agenda.pop() {
            let (l, r) = (symbols[top.left], symbols[top.right]);
            if l.len == 0 || r.len == 0 || l.len + r.len != top.size {
                continue; // stale: one side was merged since
            }
            symbols[top.left].len += r.len;
            symbols[top.left].next = r.next;
            if r.next != NONE {
                symbols[r.next].prev = top.left;
            }
            symbols[top.right].len = 0;
            let prev = symbols[top.left].prev;
            let next = symbols[top.left].next;
            maybe_add(&symbols, &mut agenda, prev, top.left);
            maybe_add(&symbols, &mut agenda, top.left, next);
        }

        let mut out = Vec::with_capacity(symbols.len());
        let mut index = 0;
        let mut stack = Vec::new();
        while index != NONE {
            let s = symbols[index];
            stack.push(text(&s));
            // `resegment`, depth first, left before right.
            while let Some(w) = stack.pop() {
                let id = self.piece_to_id(w);
                match (self.kind(id), rev_merge.get(w)) {
                    (PieceType::Unused, Some(&(a, b))) => {
                        stack.push(b);
                        stack.push(a);
                    }
                    _ => out.push((w, id)),
                }
            }
            index = s.next;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::model::tests::model_bytes;
    use super::*;

    const NORMAL: u64 = 1;
    const UNK: u64 = 2;
    const CONTROL: u64 = 3;
    const USER: u64 = 4;
    const UNUSED: u64 = 5;

    fn model(pieces: &[(&str, f32, u64)], byte_fallback: bool) -> SpmModel {
        let mut all = pieces.to_vec();
        let bytes: Vec<String> = (0..=255u8).map(|b| format!("<0x{b:02X}>")).collect();
        if byte_fallback {
            all.extend(bytes.iter().map(|b| (b.as_str(), 0.0, 6)));
        }
        // add_dummy_prefix on, remove_extra_whitespaces off (ChatGLM3's spec).
        SpmModel::from_bytes(
            &model_bytes(&all, byte_fallback, &[(4, 0)]),
            Path::new("t.model"),
        )
        .unwrap()
    }

    #[test]
    fn merges_by_score_then_leftmost() {
        let m = model(
            &[
                ("<unk>", 0.0, UNK),
                ("</s>", 0.0, CONTROL),
                ("▁", -1.0, NORMAL),
                ("a", -1.0, NORMAL),
                ("b", -1.0, NORMAL),
                ("ab", -2.0, NORMAL),
                ("ba", -3.0, NORMAL),
                ("▁a", -5.0, NORMAL),
                ("aba", -4.0, NORMAL),
            ],
            false,
        );
        // "▁abab": ab (-2) wins over ▁a (-5) and ba (-3); leftmost "ab" first, then the second.
        assert_eq!(m.encode("abab"), vec![2, 5, 5]);
        // "▁aba": ab merges first, then "aba" (-4) beats "▁a"... which no longer exists.
        assert_eq!(m.encode("aba"), vec![2, 8]);
        // Unknown characters: one unk id per run.
        assert_eq!(m.encode("a中文b"), vec![7, 0, 4]);
        assert_eq!(m.encode(""), Vec::<u32>::new());
    }

    #[test]
    fn byte_fallback_and_user_symbols() {
        let m = model(
            &[
                ("<unk>", 0.0, UNK),
                ("▁", -1.0, NORMAL),
                ("a", -1.0, NORMAL),
                ("<x>", 0.0, USER),
                ("▁a", -0.5, NORMAL),
            ],
            true,
        );
        let byte = |b: u8| 5 + u32::from(b);
        // "中" is E4 B8 AD; the user symbol stays whole and blocks the "▁a" merge after it.
        assert_eq!(
            m.encode("a中<x>a"),
            vec![4, byte(0xe4), byte(0xb8), byte(0xad), 3, 2]
        );
    }

    #[test]
    fn unused_pieces_are_split_back() {
        let m = model(
            &[
                ("<unk>", 0.0, UNK),
                ("▁", -1.0, NORMAL),
                ("a", -1.0, NORMAL),
                ("b", -1.0, NORMAL),
                ("c", -1.0, NORMAL),
                ("ab", -1.0, UNUSED),
                ("abc", -1.5, NORMAL),
                ("▁x", -9.0, NORMAL),
            ],
            false,
        );
        // ab (unused) then abc (normal): kept whole.
        assert_eq!(m.encode("abc"), vec![1, 6]);
        // ab alone stays unused and is split back into a, b.
        assert_eq!(m.encode("ab"), vec![1, 2, 3]);
    }
}
