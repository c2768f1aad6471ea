//! SentencePiece's `tokenizer.model` (the protobuf `ModelProto`), read natively.
//!
//! Only the fields encoding needs are kept: the pieces (text, score, type), the trainer spec's
//! model type, `byte_fallback`, `treat_whitespace_as_suffix` and special pieces, and the
//! normalizer spec. Everything else (training options, self-test data, the denormalizer) is
//! skipped. The checks are the ones SentencePiece makes when it loads a model
//! (`ModelInterface::InitializePieces`), so a model it refuses is refused here too.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use super::normalize::{CharsMap, Normalizer};
use super::wire::{Field, Reader, Value, WireError};
use super::SpmError;

/// Largest `tokenizer.model` read (ChatGLM3-6B's is about 1 MiB; the largest public
/// SentencePiece models are a few MiB).
pub const MAX_MODEL_BYTES: u64 = 64 << 20;
/// Most pieces a model may have.
pub const MAX_PIECES: usize = 1 << 22;
/// SentencePiece's own limit on one piece's length in bytes (`kMaxPieceSize`).
const MAX_PIECE_BYTES: usize = 8000;

/// A piece's type (`ModelProto.SentencePiece.Type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PieceType {
    /// A normal piece, produced by merges.
    Normal,
    /// The unknown piece (`<unk>`), exactly one per model.
    Unknown,
    /// A control symbol (`<s>`, `</s>`): never produced from text.
    Control,
    /// A user-defined symbol: always one piece, never split or merged.
    UserDefined,
    /// A byte piece `<0xXX>` (byte fallback).
    Byte,
    /// A piece merges may pass through but the output never holds (it is re-split).
    Unused,
}

impl PieceType {
    fn from_proto(v: u64) -> Option<Self> {
        Some(match v {
            1 => PieceType::Normal,
            2 => PieceType::Unknown,
            3 => PieceType::Control,
            4 => PieceType::UserDefined,
            5 => PieceType::Unused,
            6 => PieceType::Byte,
            _ => return None,
        })
    }
}

/// One entry of the vocabulary; its id is its index.
#[derive(Debug, Clone, PartialEq)]
pub struct Piece {
    /// The piece's bytes (UTF-8 in every model SentencePiece writes; `▁` stands for a space).
    pub piece: Box<[u8]>,
    /// Its score: BPE merges the adjacent pair whose merged piece scores highest.
    pub score: f32,
    /// Its type.
    pub kind: PieceType,
}

/// A loaded SentencePiece BPE model: the vocabulary, the normalizer and the lookups encoding uses.
#[derive(Debug, Clone)]
pub struct SpmModel {
    pub(crate) path: PathBuf,
    pub(crate) pieces: Vec<Piece>,
    /// Normal, user-defined and unused pieces (the ones merges may produce).
    pub(crate) mergeable: HashMap<Box<[u8]>, u32>,
    /// Control, unknown and byte pieces.
    pub(crate) reserved: HashMap<Box<[u8]>, u32>,
    pub(crate) user_symbols: UserSymbols,
    pub(crate) unk_id: u32,
    /// `Some` when `byte_fallback` is on: the id of `<0xXX>` for each byte.
    pub(crate) byte_ids: Option<Box<[u32; 256]>>,
    pub(crate) normalizer: Normalizer,
    bos_id: Option<u32>,
    eos_id: Option<u32>,
    pad_id: Option<u32>,
}

/// User-defined symbols, matched longest first at every position (SentencePiece's
/// `PrefixMatcher`).
#[derive(Debug, Clone, Default)]
pub(crate) struct UserSymbols {
    set: HashSet<Box<[u8]>>,
    max_len: usize,
}

impl UserSymbols {
    /// The byte length of the longest user-defined symbol `w` starts with, if any.
    pub(crate) fn longest_prefix(&self, w: &[u8]) -> Option<usize> {
        if self.set.is_empty() {
            return None;
        }
        (1..=self.max_len.min(w.len()))
            .rev()
            .find(|&l| self.set.contains(&w[..l]))
    }
}

/// The raw fields read from the file, before the checks.
#[derive(Default)]
struct RawModel {
    pieces: Vec<Piece>,
    has_trainer_spec: bool,
    has_normalizer_spec: bool,
    model_type: Option<u64>,
    byte_fallback: bool,
    treat_whitespace_as_suffix: bool,
    bos_piece: Option<Vec<u8>>,
    eos_piece: Option<Vec<u8>>,
    pad_piece: Option<Vec<u8>>,
    normalizer_name: Option<Vec<u8>>,
    charsmap: Option<Vec<u8>>,
    add_dummy_prefix: Option<bool>,
    remove_extra_whitespaces: Option<bool>,
    escape_whitespaces: Option<bool>,
}

fn wire(path: &Path) -> impl Fn(WireError) -> SpmError + '_ {
    move |e| SpmError::Corrupt {
        path: path.to_path_buf(),
        msg: e.to_string(),
    }
}

fn corrupt(path: &Path, msg: impl Into<String>) -> SpmError {
    SpmError::Corrupt {
        path: path.to_path_buf(),
        msg: msg.into(),
    }
}

/// The value of `field` as a varint, or a corrupt-file error naming the field.
fn varint(path: &Path, field: &Field<'_>, name: &str) -> Result<u64, SpmError> {
    match field.value {
        Value::Varint(v) => Ok(v),
        _ => Err(corrupt(
            path,
            format!("field {name} at byte {} is not a varint", field.at),
        )),
    }
}

fn bytes<'a>(path: &Path, field: &Field<'a>, name: &str) -> Result<&'a [u8], SpmError> {
    match field.value {
        Value::Bytes(b) => Ok(b),
        _ => Err(corrupt(
            path,
            format!("field {name} at byte {} is not length-delimited", field.at),
        )),
    }
}

fn parse_piece(path: &Path, buf: &[u8], base: usize) -> Result<Piece, SpmError> {
    let mut r = Reader::new(buf, base);
    let (mut piece, mut score, mut kind) = (None, 0.0f32, PieceType::Normal);
    while let Some(f) = r.next_field().map_err(wire(path))? {
        match f.number {
            1 => piece = Some(bytes(path, &f, "SentencePiece.piece")?.to_vec()),
            2 => match f.value {
                Value::Fixed32(bits) => score = f32::from_bits(bits),
                _ => {
                    return Err(corrupt(
                        path,
                        format!("piece score at byte {} is not a float", f.at),
                    ))
                }
            },
            3 => {
                let v = varint(path, &f, "SentencePiece.type")?;
                kind = PieceType::from_proto(v).ok_or_else(|| {
                    corrupt(
                        path,
                        format!(
                            "piece type {v} at byte {} is not one SentencePiece defines",
                            f.at
                        ),
                    )
                })?;
            }
            _ => {}
        }
    }
    let piece = piece.unwrap_or_default();
    if score.is_nan() {
        return Err(corrupt(
            path,
            format!("the piece at byte {base} has a NaN score"),
        ));
    }
    Ok(Piece {
        piece: piece.into_boxed_slice(),
        score,
        kind,
    })
}

fn parse_trainer_spec(
    path: &Path,
    buf: &[u8],
    base: usize,
    m: &mut RawModel,
) -> Result<(), SpmError> {
    let mut r = Reader::new(buf, base);
    while let Some(f) = r.next_field().map_err(wire(path))? {
        match f.number {
            3 => m.model_type = Some(varint(path, &f, "TrainerSpec.model_type")?),
            24 => {
                m.treat_whitespace_as_suffix = varint(path, &f, "treat_whitespace_as_suffix")? != 0
            }
            35 => m.byte_fallback = varint(path, &f, "TrainerSpec.byte_fallback")? != 0,
            46 => m.bos_piece = Some(bytes(path, &f, "TrainerSpec.bos_piece")?.to_vec()),
            47 => m.eos_piece = Some(bytes(path, &f, "TrainerSpec.eos_piece")?.to_vec()),
            48 => m.pad_piece = Some(bytes(path, &f, "TrainerSpec.pad_piece")?.to_vec()),
            _ => {}
        }
    }
    Ok(())
}

fn parse_normalizer_spec(
    path: &Path,
    buf: &[u8],
    base: usize,
    m: &mut RawModel,
) -> Result<(), SpmError> {
    let mut r = Reader::new(buf, base);
    while let Some(f) = r.next_field().map_err(wire(path))? {
        match f.number {
            1 => m.normalizer_name = Some(bytes(path, &f, "NormalizerSpec.name")?.to_vec()),
            2 => {
                m.charsmap = Some(bytes(path, &f, "NormalizerSpec.precompiled_charsmap")?.to_vec())
            }
            3 => m.add_dummy_prefix = Some(varint(path, &f, "add_dummy_prefix")? != 0),
            4 => {
                m.remove_extra_whitespaces =
                    Some(varint(path, &f, "remove_extra_whitespaces")? != 0)
            }
            5 => m.escape_whitespaces = Some(varint(path, &f, "escape_whitespaces")? != 0),
            _ => {}
        }
    }
    Ok(())
}

fn parse(path: &Path, buf: &[u8]) -> Result<RawModel, SpmError> {
    let mut m = RawModel::default();
    let mut r = Reader::new(buf, 0);
    while let Some(f) = r.next_field().map_err(wire(path))? {
        match f.number {
            1 => {
                if m.pieces.len() == MAX_PIECES {
                    return Err(corrupt(path, format!("more than {MAX_PIECES} pieces")));
                }
                let b = bytes(path, &f, "ModelProto.pieces")?;
                let start = r.offset() - b.len();
                m.pieces.push(parse_piece(path, b, start)?);
            }
            2 => {
                let b = bytes(path, &f, "ModelProto.trainer_spec")?;
                m.has_trainer_spec = true;
                parse_trainer_spec(path, b, r.offset() - b.len(), &mut m)?;
            }
            3 => {
                let b = bytes(path, &f, "ModelProto.normalizer_spec")?;
                m.has_normalizer_spec = true;
                parse_normalizer_spec(path, b, r.offset() - b.len(), &mut m)?;
            }
            _ => {}
        }
    }
    Ok(m)
}

/// Whether `buf` starts like a tiktoken vocabulary: lines of `<base64 token> <rank>`.
fn looks_like_tiktoken(buf: &[u8]) -> bool {
    let mut lines = buf
        .split(|&b| b == b'\n')
        .take(4)
        .filter(|l| !l.is_empty())
        .peekable();
    lines.peek().is_some()
        && lines.all(|line| {
            let mut parts = line.splitn(2, |&b| b == b' ');
            let (Some(token), Some(rank)) = (parts.next(), parts.next()) else {
                return false;
            };
            !token.is_empty()
                && token
                    .iter()
                    .all(|c| c.is_ascii_alphanumeric() || b"+/=".contains(c))
                && !rank.is_empty()
                && rank.iter().all(u8::is_ascii_digit)
        })
}

/// The id of `<0xXX>` if `piece` is one (SentencePiece's `PieceToByte`).
fn piece_to_byte(piece: &[u8]) -> Option<u8> {
    let hex = piece.strip_prefix(b"<0x")?.strip_suffix(b">")?;
    if hex.len() != 2
        || !hex
            .iter()
            .all(|c| c.is_ascii_digit() || (b'A'..=b'F').contains(c))
    {
        return None;
    }
    let s = std::str::from_utf8(hex).ok()?;
    u8::from_str_radix(s, 16).ok()
}

impl SpmModel {
    /// Reads and checks `path` (at most [`MAX_MODEL_BYTES`]).
    pub fn load(path: &Path) -> Result<Self, SpmError> {
        let meta = std::fs::metadata(path).map_err(|source| SpmError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        if meta.len() > MAX_MODEL_BYTES {
            return Err(SpmError::TooLarge {
                path: path.to_path_buf(),
                size: meta.len(),
                limit: MAX_MODEL_BYTES,
            });
        }
        let buf = std::fs::read(path).map_err(|source| SpmError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_bytes(&buf, path)
    }

    /// Reads a model from the bytes of a `tokenizer.model`; `path` names it in errors.
    pub fn from_bytes(buf: &[u8], path: &Path) -> Result<Self, SpmError> {
        if buf.len() as u64 > MAX_MODEL_BYTES {
            return Err(SpmError::TooLarge {
                path: path.to_path_buf(),
                size: buf.len() as u64,
                limit: MAX_MODEL_BYTES,
            });
        }
        if looks_like_tiktoken(buf) {
            return Err(SpmError::Unsupported {
                path: path.to_path_buf(),
                what: "this is a tiktoken BPE file (\"<base64> <rank>\" lines, as the original \
                       GLM-4-9B-chat's tokenizer.model), not SentencePiece: use the -hf release's \
                       tokenizer.json (THUDM/glm-4-9b-chat-hf) with the SFT tokenizer path"
                    .into(),
            });
        }
        let raw = parse(path, buf)?;
        Self::build(path, raw)
    }

    fn build(path: &Path, raw: RawModel) -> Result<Self, SpmError> {
        let unsupported = |what: String| SpmError::Unsupported {
            path: path.to_path_buf(),
            what,
        };
        // SentencePiece writes the pieces, then trainer_spec, then normalizer_spec: a file cut
        // between fields lacks the specs.
        if raw.pieces.is_empty() {
            return Err(corrupt(
                path,
                "the model has no pieces (an empty or truncated file?)",
            ));
        }
        if !raw.has_trainer_spec || !raw.has_normalizer_spec {
            return Err(corrupt(
                path,
                "trainer_spec or normalizer_spec is missing (a truncated file?)",
            ));
        }
        match raw.model_type.unwrap_or(1) {
            2 => {}
            t => {
                let name = match t {
                    1 => "unigram".to_string(),
                    3 => "word".to_string(),
                    4 => "char".to_string(),
                    t => format!("{t} (unknown)"),
                };
                return Err(unsupported(format!(
                    "model_type {name}: only BPE models (ChatGLM3's type) are encoded"
                )));
            }
        }
        let mut mergeable = HashMap::new();
        let mut reserved = HashMap::new();
        let mut user = UserSymbols::default();
        let mut unk_id = None;
        let mut byte_ids = [u32::MAX; 256];
        for (i, p) in raw.pieces.iter().enumerate() {
            let id = i as u32;
            let shown = String::from_utf8_lossy(&p.piece);
            if p.piece.is_empty() {
                return Err(corrupt(path, format!("piece {id} is empty")));
            }
            if p.piece.len() >= MAX_PIECE_BYTES {
                return Err(corrupt(
                    path,
                    format!("piece {id} is {} bytes long", p.piece.len()),
                ));
            }
            if p.piece.contains(&0) {
                return Err(corrupt(path, format!("piece {id} contains a NUL byte")));
            }
            let map = match p.kind {
                PieceType::Normal | PieceType::UserDefined | PieceType::Unused => &mut mergeable,
                _ => &mut reserved,
            };
            if map.insert(p.piece.clone(), id).is_some() {
                return Err(corrupt(path, format!("piece {shown:?} is defined twice")));
            }
            match p.kind {
                PieceType::UserDefined => {
                    user.max_len = user.max_len.max(p.piece.len());
                    user.set.insert(p.piece.clone());
                }
                PieceType::Unknown => {
                    let previous = unk_id.replace(id);
                    if previous.is_some() {
                        return Err(corrupt(path, "more than one unknown piece"));
                    }
                }
                PieceType::Byte => {
                    if !raw.byte_fallback {
                        return Err(corrupt(
                            path,
                            format!("byte piece {shown} although byte_fallback is off"),
                        ));
                    }
                    let b = piece_to_byte(&p.piece)
                        .ok_or_else(|| corrupt(path, format!("byte piece {shown} is invalid")))?;
                    byte_ids[usize::from(b)] = id;
                }
                _ => {}
            }
        }
        let unk_id = unk_id.ok_or_else(|| corrupt(path, "no unknown piece (<unk>) is defined"))?;
        let byte_ids = if raw.byte_fallback {
            if let Some(b) = byte_ids.iter().position(|&id| id == u32::MAX) {
                return Err(corrupt(
                    path,
                    format!("byte_fallback is on but byte piece <0x{b:02X}> is missing"),
                ));
            }
            Some(Box::new(byte_ids))
        } else {
            None
        };
        let charsmap = match raw.charsmap.as_deref() {
            Some(blob) if !blob.is_empty() => {
                Some(CharsMap::decode(blob).map_err(|msg| corrupt(path, msg))?)
            }
            _ => None,
        };
        let normalizer = Normalizer {
            name: String::from_utf8_lossy(raw.normalizer_name.as_deref().unwrap_or(b""))
                .into_owned(),
            add_dummy_prefix: raw.add_dummy_prefix.unwrap_or(true),
            remove_extra_whitespaces: raw.remove_extra_whitespaces.unwrap_or(true),
            escape_whitespaces: raw.escape_whitespaces.unwrap_or(true),
            treat_whitespace_as_suffix: raw.treat_whitespace_as_suffix,
            charsmap,
        };
        let mut model = SpmModel {
            path: path.to_path_buf(),
            pieces: raw.pieces,
            mergeable,
            reserved,
            user_symbols: user,
            unk_id,
            byte_ids,
            normalizer,
            bos_id: None,
            eos_id: None,
            pad_id: None,
        };
        // As SentencePieceProcessor::{bos,eos,pad}_id: the trainer spec's piece if it is a
        // control symbol (an empty piece name means the default).
        let control = |m: &SpmModel, name: Option<Vec<u8>>, default: &[u8]| {
            let name = name
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| default.to_vec());
            let id = m.piece_to_id(&name);
            (m.pieces[id as usize].kind == PieceType::Control).then_some(id)
        };
        model.bos_id = control(&model, raw.bos_piece, b"<s>");
        model.eos_id = control(&model, raw.eos_piece, b"</s>");
        model.pad_id = control(&model, raw.pad_piece, b"<pad>");
        Ok(model)
    }

    /// The file the model was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Number of pieces (SentencePiece's `vocab_size()`); ids are `0..vocab_size()`.
    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    /// The pieces in id order.
    pub fn pieces(&self) -> &[Piece] {
        &self.pieces
    }

    /// The unknown piece's id (ChatGLM3 pads with it).
    pub fn unk_id(&self) -> u32 {
        self.unk_id
    }

    /// `<s>`'s id, if the model has it as a control symbol.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    /// `</s>`'s id, if the model has it as a control symbol.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos_id
    }

    /// `<pad>`'s id, if the model has it as a control symbol.
    pub fn pad_id(&self) -> Option<u32> {
        self.pad_id
    }

    /// Whether unknown characters become byte pieces.
    pub fn byte_fallback(&self) -> bool {
        self.byte_ids.is_some()
    }

    /// The normalizer spec's name (`identity`, `nmt_nfkc`, ...), for messages.
    pub fn normalizer_name(&self) -> &str {
        &self.normalizer.name
    }

    /// The id of `piece` as SentencePiece's `PieceToId`: control, unknown and byte pieces first,
    /// then the others, else the unknown id.
    pub fn piece_to_id(&self, piece: &[u8]) -> u32 {
        self.reserved
            .get(piece)
            .or_else(|| self.mergeable.get(piece))
            .copied()
            .unwrap_or(self.unk_id)
    }

    pub(crate) fn kind(&self, id: u32) -> PieceType {
        self.pieces
            .get(id as usize)
            .map_or(PieceType::Unknown, |p| p.kind)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Encodes a protobuf varint.
    pub(crate) fn varint(mut v: u64, out: &mut Vec<u8>) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    pub(crate) fn field_bytes(number: u64, b: &[u8], out: &mut Vec<u8>) {
        varint(number << 3 | 2, out);
        varint(b.len() as u64, out);
        out.extend_from_slice(b);
    }

    pub(crate) fn field_varint(number: u64, v: u64, out: &mut Vec<u8>) {
        varint(number << 3, out);
        varint(v, out);
    }

    /// A `ModelProto` with `pieces` (text, score, type) and the given trainer/normalizer flags.
    pub(crate) fn model_bytes(
        pieces: &[(&str, f32, u64)],
        byte_fallback: bool,
        normalizer: &[(u64, u64)],
    ) -> Vec<u8> {
        let mut out = Vec::new();
        for &(p, s, t) in pieces {
            let mut piece = Vec::new();
            field_bytes(1, p.as_bytes(), &mut piece);
            piece.push(0x15);
            piece.extend_from_slice(&s.to_bits().to_le_bytes());
            field_varint(3, t, &mut piece);
            field_bytes(1, &piece, &mut out);
        }
        let mut trainer = Vec::new();
        field_varint(3, 2, &mut trainer);
        field_varint(35, u64::from(byte_fallback), &mut trainer);
        field_bytes(2, &trainer, &mut out);
        let mut norm = Vec::new();
        field_bytes(1, b"identity", &mut norm);
        for &(n, v) in normalizer {
            field_varint(n, v, &mut norm);
        }
        field_bytes(3, &norm, &mut out);
        out
    }

    fn err(buf: &[u8]) -> String {
        SpmModel::from_bytes(buf, Path::new("/x/tokenizer.model"))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn reads_pieces_and_specials() {
        let buf = model_bytes(
            &[
                ("<unk>", 0.0, 2),
                ("<s>", 0.0, 3),
                ("</s>", 0.0, 3),
                ("▁a", -1.0, 1),
                ("b", -2.0, 1),
            ],
            false,
            &[(4, 0)],
        );
        let m = SpmModel::from_bytes(&buf, Path::new("t.model")).unwrap();
        assert_eq!(m.vocab_size(), 5);
        assert_eq!(
            (m.unk_id(), m.bos_id(), m.eos_id(), m.pad_id()),
            (0, Some(1), Some(2), None)
        );
        assert_eq!(m.piece_to_id("▁a".as_bytes()), 3);
        assert_eq!(m.piece_to_id(b"zz"), 0);
        assert!(!m.normalizer.remove_extra_whitespaces);
        assert!(m.normalizer.add_dummy_prefix);
        assert_eq!(m.pieces()[4].score, -2.0);
    }

    #[test]
    fn bad_models_are_named_errors() {
        let ok = model_bytes(&[("<unk>", 0.0, 2), ("a", 0.0, 1)], false, &[]);
        assert!(SpmModel::from_bytes(&ok, Path::new("t.model")).is_ok());
        // Every truncation of a valid file is an error naming the file, never a panic.
        for cut in 0..ok.len() {
            let e = SpmModel::from_bytes(&ok[..cut], Path::new("/x/tokenizer.model")).unwrap_err();
            assert!(e.to_string().contains("/x/tokenizer.model"), "{e}");
        }
        assert!(err(&ok[..ok.len() - 3]).contains("truncated"));
        assert!(err(&[]).contains("no pieces"));
        assert!(err(&model_bytes(&[("a", 0.0, 1)], false, &[])).contains("no unknown piece"));
        assert!(err(&model_bytes(
            &[("<unk>", 0.0, 2), ("a", 0.0, 1), ("a", 0.0, 1)],
            false,
            &[]
        ))
        .contains("defined twice"));
        assert!(err(&model_bytes(
            &[("<unk>", 0.0, 2), ("<0x41>", 0.0, 6)],
            false,
            &[]
        ))
        .contains("byte_fallback is off"));
        assert!(err(&model_bytes(
            &[("<unk>", 0.0, 2), ("<0x41>", 0.0, 6)],
            true,
            &[]
        ))
        .contains("<0x00> is missing"));
        assert!(err(&model_bytes(
            &[("<unk>", 0.0, 2), ("a", 0.0, 9)],
            false,
            &[]
        ))
        .contains("piece type 9"));
        assert!(err(&model_bytes(
            &[("<unk>", 0.0, 2), ("a", f32::NAN, 1)],
            false,
            &[]
        ))
        .contains("NaN"));
        let mut unigram = model_bytes(&[("<unk>", 0.0, 2), ("a", 0.0, 1)], false, &[]);
        // A second trainer_spec field merges into the first: model_type 1 (unigram).
        let mut spec = Vec::new();
        field_varint(3, 1, &mut spec);
        field_bytes(2, &spec, &mut unigram);
        assert!(err(&unigram).contains("model_type unigram"));
        let only_pieces = model_bytes(&[("<unk>", 0.0, 2)], false, &[]);
        let e = err(&only_pieces[..16]);
        assert!(e.contains("missing"), "{e}");
        assert!(err(b"not a protobuf at all").contains("/x/tokenizer.model"));
        let tiktoken = err(b"IQ== 0\nIg== 1\nIw== 2\nJA== 3\n");
        assert!(
            tiktoken.contains("tiktoken") && tiktoken.contains("glm-4-9b-chat-hf"),
            "{tiktoken}"
        );
    }

    #[test]
    fn byte_piece_names() {
        assert_eq!(piece_to_byte(b"<0x0A>"), Some(10));
        assert_eq!(piece_to_byte(b"<0xFF>"), Some(255));
        assert_eq!(piece_to_byte(b"<0xff>"), None);
        assert_eq!(piece_to_byte(b"<0x0A"), None);
        assert_eq!(piece_to_byte(b"<0x100>"), None);
    }
}
