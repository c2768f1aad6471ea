//! `--tokenizer DIR`: `tokenizer.json` through Hugging Face's `tokenizers` (the library
//! transformers' fast tokenizers are), and `tokenizer_config.json`'s chat template and special
//! tokens; or ChatGLM3's SentencePiece `tokenizer.model` (a directory with it and no
//! tokenizer.json) with LLaMA-Factory's `chatglm3` template ([`crate::spm::chatglm3`]).

use super::error::{Result, SftError};
use super::jsonl::sha256_files;
use super::record::Message;
use super::template::ChatTemplate;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The most a tokenizer file may weigh (a 256k-vocabulary tokenizer.json is about 20 MiB).
pub const MAX_TOKENIZER_BYTES: u64 = 256 << 20;

/// A model's tokenizer and chat template.
pub struct SftTokenizer {
    /// The directory.
    pub dir: PathBuf,
    kind: Kind,
    /// The id padding positions take: the config's `pad_token`, or 0 (ChatGLM3: its unk).
    pub pad_id: u32,
    /// SHA-256 of tokenizer.json and tokenizer_config.json, or of ChatGLM3's tokenizer.model
    /// (what resuming compares).
    pub fingerprint: String,
}

/// The two kinds of tokenizer directory.
enum Kind {
    /// tokenizer.json and the config's chat template.
    Hf {
        tok: Box<tokenizers::Tokenizer>,
        template: ChatTemplate,
    },
    /// ChatGLM3's tokenizer.model with the `chatglm3` template.
    ChatGlm3(crate::spm::chatglm3::ChatGlm3Tokenizer),
}

/// The `--template` that renders a ChatGLM3 tokenizer directory's examples.
pub const CHATGLM3_TEMPLATE: &str = "chatglm3";

/// Check `--template NAME` against the tokenizer directory `dir`: `chatglm3` (the default
/// for a directory with a SentencePiece tokenizer.model and no tokenizer.json) needs such a
/// directory; a tokenizer.json directory renders with its own chat template (no --template).
pub fn check_template(template: Option<&str>, dir: &Path) -> std::result::Result<(), String> {
    let spm = crate::spm::chatglm3::is_sentencepiece_dir(dir);
    match template {
        None => Ok(()),
        Some(CHATGLM3_TEMPLATE) if spm => Ok(()),
        Some(CHATGLM3_TEMPLATE) => Err(format!(
            "--template {CHATGLM3_TEMPLATE} needs a ChatGLM3 tokenizer directory (tokenizer.model, \
             no tokenizer.json), but --tokenizer {} is not one: drop --template to render with \
             its tokenizer_config.json chat_template",
            dir.display()
        )),
        Some(other) => Err(format!(
            "--template {other}: the templates are `{CHATGLM3_TEMPLATE}` (ChatGLM3's \
             tokenizer.model directories, their default) and, without --template, the \
             tokenizer_config.json chat_template of a tokenizer.json directory"
        )),
    }
}

impl std::fmt::Debug for SftTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SftTokenizer")
            .field("dir", &self.dir)
            .field(
                "template",
                &match self.kind {
                    Kind::Hf { .. } => "chat_template",
                    Kind::ChatGlm3(_) => CHATGLM3_TEMPLATE,
                },
            )
            .field("pad_id", &self.pad_id)
            .field("fingerprint", &self.fingerprint)
            .finish_non_exhaustive()
    }
}

/// The text of a special-token entry: a string, or an AddedToken object's `content`.
fn token_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

impl SftTokenizer {
    /// Load `dir`/tokenizer.json and `dir`/tokenizer_config.json, or ChatGLM3's
    /// `dir`/tokenizer.model when the directory has it and no tokenizer.json.
    pub fn load(dir: &Path) -> Result<Self> {
        if crate::spm::chatglm3::is_sentencepiece_dir(dir) {
            return Self::load_chatglm3(dir);
        }
        let tj = dir.join("tokenizer.json");
        let cj = dir.join("tokenizer_config.json");
        for p in [&tj, &cj] {
            if !p.is_file() {
                return Err(SftError::file(
                    p,
                    "not found: --tokenizer DIR must hold the model's tokenizer.json and \
                     tokenizer_config.json (as saved by transformers' save_pretrained)",
                ));
            }
        }
        let fingerprint = sha256_files(&[&tj, &cj], MAX_TOKENIZER_BYTES)?;
        let bytes = read(&tj)?;
        let tok = tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| {
            SftError::file(
                &tj,
                format!(
                    "is not a tokenizer the `tokenizers` library can load ({e}); \
                     save it again with transformers' save_pretrained"
                ),
            )
        })?;
        let cfg: Value = serde_json::from_slice(&read(&cj)?).map_err(|e| SftError::Line {
            path: cj.clone(),
            line: e.line() as u64,
            col: Some(e.column() as u64),
            msg: format!("malformed JSON ({e})"),
        })?;
        let source = match cfg.get("chat_template") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(list)) => named_default(list).ok_or_else(|| {
                SftError::file(
                    &cj,
                    "`chat_template` is a list without an entry named `default`",
                )
            })?,
            _ => {
                let jinja = dir.join("chat_template.jinja");
                if jinja.is_file() {
                    String::from_utf8(read(&jinja)?)
                        .map_err(|_| SftError::file(&jinja, "is not UTF-8"))?
                } else {
                    return Err(SftError::file(
                        &cj,
                        "has no `chat_template` string (and there is no chat_template.jinja \
                         beside it): SFT data is rendered with the model's chat template; use \
                         the tokenizer of an instruction-tuned model or add one",
                    ));
                }
            }
        };
        let mut tokens = BTreeMap::new();
        for name in ["bos_token", "eos_token", "pad_token", "unk_token"] {
            if let Some(t) = cfg.get(name).and_then(token_text) {
                tokens.insert(name, t);
            }
        }
        let pad_id = tokens
            .get("pad_token")
            .and_then(|t| tok.token_to_id(t))
            .unwrap_or(0);
        let template = ChatTemplate::new(&source, tokens)
            .map_err(|m| SftError::file(&cj, format!("its chat_template does not compile: {m}")))?;
        Ok(Self {
            dir: dir.to_path_buf(),
            kind: Kind::Hf {
                tok: Box::new(tok),
                template,
            },
            pad_id,
            fingerprint,
        })
    }

    /// ChatGLM3's `dir`/tokenizer.model (a corrupt or truncated file is an error naming it).
    fn load_chatglm3(dir: &Path) -> Result<Self> {
        let file = dir.join("tokenizer.model");
        let fingerprint = sha256_files(&[&file], MAX_TOKENIZER_BYTES)?;
        let tok = crate::spm::chatglm3::ChatGlm3Tokenizer::load(&file).map_err(|e| {
            let text = e.to_string();
            let prefix = format!("{}: ", e.path().display());
            SftError::file(e.path(), text.strip_prefix(&prefix).unwrap_or(&text))
        })?;
        Ok(Self {
            dir: dir.to_path_buf(),
            pad_id: tok.pad_id(),
            kind: Kind::ChatGlm3(tok),
            fingerprint,
        })
    }

    /// ChatGLM3's tokenizer, when this directory is one (examples then go through
    /// [`crate::spm::chatglm3::ChatGlm3Tokenizer::encode_example`]).
    pub fn chatglm3(&self) -> Option<&crate::spm::chatglm3::ChatGlm3Tokenizer> {
        match &self.kind {
            Kind::ChatGlm3(t) => Some(t),
            Kind::Hf { .. } => None,
        }
    }

    /// The ids of `text`, without added special tokens (as apply_chat_template encodes; special
    /// tokens written in the text are still recognised).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        match &self.kind {
            Kind::Hf { tok, .. } => tok
                .encode_fast(text, false)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| format!("the tokenizer failed: {e}")),
            Kind::ChatGlm3(t) => Ok(t.encode_text(text)),
        }
    }

    /// The chat template's text of `messages`.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, String> {
        match &self.kind {
            Kind::Hf { template, .. } => template.render(messages, add_generation_prompt),
            Kind::ChatGlm3(_) => Err(format!(
                "the {CHATGLM3_TEMPLATE} template encodes slot by slot; it renders no text"
            )),
        }
    }

    /// The text of one id (for previews), `None` if the id is unknown.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        match &self.kind {
            Kind::Hf { tok, .. } => tok.id_to_token(id),
            Kind::ChatGlm3(t) => chatglm3_piece(t, id).map(|p| String::from_utf8_lossy(&p).into()),
        }
    }

    /// Decode `ids` to text, special tokens included (for previews).
    pub fn decode(&self, ids: &[u32]) -> String {
        match &self.kind {
            Kind::Hf { tok, .. } => tok.decode(ids, false).unwrap_or_default(),
            Kind::ChatGlm3(t) => {
                let mut bytes = Vec::new();
                for &id in ids {
                    let Some(p) = chatglm3_piece(t, id) else {
                        continue;
                    };
                    match byte_piece(&p) {
                        Some(b) => bytes.push(b),
                        None => bytes.extend_from_slice(&p),
                    }
                }
                String::from_utf8_lossy(&bytes).replace('\u{2581}', " ")
            }
        }
    }

    /// The tokenizer's vocabulary size, added tokens included.
    pub fn vocab_size(&self) -> usize {
        match &self.kind {
            Kind::Hf { tok, .. } => tok.get_vocab_size(true),
            Kind::ChatGlm3(t) => t.vocab_size(),
        }
    }
}

/// The bytes of ChatGLM3's id `id`: its piece, or a special token's name.
fn chatglm3_piece(t: &crate::spm::chatglm3::ChatGlm3Tokenizer, id: u32) -> Option<Vec<u8>> {
    use crate::spm::chatglm3::Special;
    let pieces = t.spm().pieces();
    match pieces.get(id as usize) {
        Some(p) => Some(p.piece.to_vec()),
        None => Special::ALL
            .into_iter()
            .find(|&s| t.id(s) == id)
            .map(|s| s.name().as_bytes().to_vec()),
    }
}

/// The byte of a byte-fallback piece `<0xXX>`.
fn byte_piece(p: &[u8]) -> Option<u8> {
    let hex = p.strip_prefix(b"<0x")?.strip_suffix(b">")?;
    u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()
}

/// The `default` entry of a list of named templates (`[{"name", "template"}, …]`).
fn named_default(list: &[Value]) -> Option<String> {
    list.iter().find_map(|e| {
        (e.get("name")?.as_str()? == "default")
            .then(|| e.get("template")?.as_str().map(str::to_string))
            .flatten()
    })
}

/// A tokenizer file, whole and bounded.
fn read(p: &Path) -> Result<Vec<u8>> {
    crate::error::read_regular(p, MAX_TOKENIZER_BYTES).map_err(|e| match e {
        crate::error::TrainError::Io { source, .. } => SftError::io(p)(source),
        other => SftError::file(p, other.to_string()),
    })
}
