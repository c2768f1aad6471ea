//! ChatGLM3's tokenizer (THUDM's `tokenization_chatglm.py` over a SentencePiece model) and
//! LLaMA-Factory 0.9.5's `chatglm3` template with its supervised processor.
//!
//! Special tokens follow the SentencePiece vocabulary of n pieces: `[MASK]` n, `[gMASK]` n+1,
//! `[sMASK]` n+2, `sop` n+3, `eop` n+4, `<|system|>` n+5, `<|user|>` n+6, `<|assistant|>` n+7,
//! `<|observation|>` n+8. Eos is the model's `</s>`, pad its unknown piece.
//!
//! One example ([`ChatGlm3Tokenizer::encode_example`]) is, turn by turn, a source (turn 0: the
//! prefix `[gMASK] sop`, the system slot if the system is non-empty, then the user slot) and a
//! target (the assistant slot); each slot element is encoded on its own:
//! - prefix `[gMASK]` `sop`; system `<|system|>` "\n" content; user `<|user|>` "\n" content
//!   `<|assistant|>`; assistant "\n" content (a role token by id, a string with
//!   [`ChatGlm3Tokenizer::encode_text`], an empty string skipped);
//! - labels: −100 over sources, the ids over targets, except that the first label of every
//!   source after the first is eos (efficient eos); finally eos is appended to ids and labels;
//! - `cutoff_len` truncates per turn with LLaMA-Factory's `infer_seqlen` on the budget left
//!   (which starts at 1, for the final eos); once the budget is spent, later turns are dropped.

use std::path::{Path, PathBuf};

use super::model::SpmModel;
use super::SpmError;

/// The label of a position that is not trained (PyTorch's `ignore_index`).
pub const IGNORE_INDEX: i32 = -100;

/// ChatGLM3's special tokens, in id order after the SentencePiece vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Special {
    /// `[MASK]` (n).
    Mask,
    /// `[gMASK]` (n+1), first of every prompt.
    GMask,
    /// `[sMASK]` (n+2).
    SMask,
    /// `sop` (n+3), second of every prompt.
    Sop,
    /// `eop` (n+4).
    Eop,
    /// `<|system|>` (n+5).
    System,
    /// `<|user|>` (n+6).
    User,
    /// `<|assistant|>` (n+7).
    Assistant,
    /// `<|observation|>` (n+8).
    Observation,
}

impl Special {
    /// All of them, in id order.
    pub const ALL: [Special; 9] = [
        Special::Mask,
        Special::GMask,
        Special::SMask,
        Special::Sop,
        Special::Eop,
        Special::System,
        Special::User,
        Special::Assistant,
        Special::Observation,
    ];

    /// The token's text.
    pub fn name(self) -> &'static str {
        match self {
            Special::Mask => "[MASK]",
            Special::GMask => "[gMASK]",
            Special::SMask => "[sMASK]",
            Special::Sop => "sop",
            Special::Eop => "eop",
            Special::System => "<|system|>",
            Special::User => "<|user|>",
            Special::Assistant => "<|assistant|>",
            Special::Observation => "<|observation|>",
        }
    }

    fn offset(self) -> u32 {
        self as u32
    }
}

/// LLaMA-Factory registers the `chatglm3` template's stop words as added special tokens, so
/// their literal text inside a message is that token, not its characters.
const STOP_WORDS: [Special; 2] = [Special::User, Special::Observation];

/// ChatGLM3's tokenizer: a SentencePiece BPE model and the 9 special tokens after it.
#[derive(Debug, Clone)]
pub struct ChatGlm3Tokenizer {
    spm: SpmModel,
    eos: u32,
    /// Vocabulary ids whose piece is spelled like a special token, and that token's id
    /// (`SPTokenizer.convert_token_to_id` looks the special names up first).
    shadowed: Vec<(u32, u32)>,
}

/// One conversation: an optional system prompt and (user, assistant) turns.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Conversation {
    /// The system prompt; empty means none (as LLaMA-Factory: `system or default_system`,
    /// and `chatglm3` has no default).
    pub system: String,
    /// (user, assistant) pairs in order.
    pub turns: Vec<(String, String)>,
}

/// Why a list of messages is not a conversation the template renders.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConversationError {
    /// A role other than system, user, assistant.
    #[error(
        "message {index} has role {role:?}; the roles are system (first only), user and assistant"
    )]
    UnknownRole {
        /// 0-based index of the message.
        index: usize,
        /// Its role.
        role: String,
    },
    /// The roles do not alternate user, assistant, ... ending with assistant.
    #[error(
        "message {index} ({role}) is out of order: after an optional system message, messages must \
         alternate user, assistant, ..., and end with an assistant message"
    )]
    Order {
        /// 0-based index of the message.
        index: usize,
        /// Its role.
        role: String,
    },
    /// No message at all (or only a system message).
    #[error("the conversation has no user and assistant messages")]
    Empty,
}

impl Conversation {
    /// An alpaca record as LLaMA-Factory converts it: the user message is the non-empty ones of
    /// `instruction` and `input` joined by "\n", the reply `output`, the system `system`.
    pub fn from_alpaca(instruction: &str, input: &str, output: &str, system: &str) -> Self {
        let user = [instruction, input]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join("\n");
        Conversation {
            system: system.to_string(),
            turns: vec![(user, output.to_string())],
        }
    }

    /// Messages `(role, content)`: an optional leading system message, then user and assistant
    /// alternating, ending with assistant (LLaMA-Factory drops any other shape as invalid).
    pub fn from_messages<'a>(
        messages: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, ConversationError> {
        let mut conv = Conversation::default();
        let mut pending: Option<String> = None;
        let mut count = 0;
        for (index, (role, content)) in messages.into_iter().enumerate() {
            count = index + 1;
            match (role, pending.take()) {
                ("system", None) if index == 0 => conv.system = content.to_string(),
                ("user", None) => pending = Some(content.to_string()),
                ("assistant", Some(user)) => conv.turns.push((user, content.to_string())),
                ("system" | "user" | "assistant", _) => {
                    return Err(ConversationError::Order {
                        index,
                        role: role.to_string(),
                    })
                }
                _ => {
                    return Err(ConversationError::UnknownRole {
                        index,
                        role: role.to_string(),
                    })
                }
            }
        }
        if pending.is_some() {
            return Err(ConversationError::Order {
                index: count - 1,
                role: "user".into(),
            });
        }
        if conv.turns.is_empty() {
            return Err(ConversationError::Empty);
        }
        Ok(conv)
    }
}

/// One example's ids and labels ([`IGNORE_INDEX`] where nothing is trained); equal lengths.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Example {
    /// Token ids.
    pub ids: Vec<u32>,
    /// The label of each position: its id where trained, else [`IGNORE_INDEX`].
    pub labels: Vec<i32>,
}

/// LLaMA-Factory's `infer_seqlen`: how much of a source of `source_len` and a target of
/// `target_len` tokens fits in `cutoff_len`.
pub fn infer_seqlen(source_len: usize, target_len: usize, cutoff_len: usize) -> (usize, usize) {
    let max_target_len = if target_len * 2 < cutoff_len {
        cutoff_len
    } else if source_len * 2 < cutoff_len {
        cutoff_len - source_len
    } else {
        // Python: int(cutoff_len * (target_len / (source_len + target_len))), in doubles.
        (cutoff_len as f64 * (target_len as f64 / (source_len + target_len) as f64)) as usize
    };
    let new_target_len = max_target_len.min(target_len);
    let max_source_len = cutoff_len.saturating_sub(new_target_len);
    (max_source_len.min(source_len), new_target_len)
}

/// Whether `dir` is a tokenizer directory in ChatGLM3's form, for which `--template chatglm3`
/// is the default: a `tokenizer.model` and no `tokenizer.json`. (GLM-4-9B-chat's original
/// directory has the same shape with a tiktoken file; loading it is then an error pointing to
/// the `-hf` release.)
pub fn is_sentencepiece_dir(dir: &Path) -> bool {
    dir.join("tokenizer.model").is_file() && !dir.join("tokenizer.json").exists()
}

impl ChatGlm3Tokenizer {
    /// Loads `path`: a `tokenizer.model`, or a directory holding one.
    pub fn load(path: &Path) -> Result<Self, SpmError> {
        let file: PathBuf = if path.is_dir() {
            path.join("tokenizer.model")
        } else {
            path.to_path_buf()
        };
        Self::from_model(SpmModel::load(&file)?)
    }

    /// ChatGLM3's tokenizer over a loaded model, which must define `</s>` as a control piece.
    pub fn from_model(spm: SpmModel) -> Result<Self, SpmError> {
        let eos = spm.eos_id().ok_or_else(|| SpmError::Unsupported {
            path: spm.path().to_path_buf(),
            what: "no </s> control piece: ChatGLM3's eos is the model's </s>".into(),
        })?;
        let n = spm.vocab_size() as u32;
        let shadowed = Special::ALL
            .iter()
            .filter_map(|&s| {
                spm.mergeable
                    .get(s.name().as_bytes())
                    .map(|&id| (id, n + s.offset()))
            })
            .collect();
        Ok(ChatGlm3Tokenizer { spm, eos, shadowed })
    }

    /// The SentencePiece model.
    pub fn spm(&self) -> &SpmModel {
        &self.spm
    }

    /// The id of a special token.
    pub fn id(&self, s: Special) -> u32 {
        self.spm.vocab_size() as u32 + s.offset()
    }

    /// Ids in use: the SentencePiece vocabulary and the 9 special tokens (64798 for
    /// ChatGLM3-6B, whose embedding is padded to 65024).
    pub fn vocab_size(&self) -> usize {
        self.spm.vocab_size() + Special::ALL.len()
    }

    /// The eos id (`</s>`): the label that ends every reply.
    pub fn eos_id(&self) -> u32 {
        self.eos
    }

    /// The pad id: the unknown piece's, as ChatGLM3's tokenizer.
    pub fn pad_id(&self) -> u32 {
        self.spm.unk_id()
    }

    /// A text's ids as LLaMA-Factory's `tokenizer.encode(text, add_special_tokens=False)` gives
    /// them: the literal stop words `<|user|>` and `<|observation|>` are their special ids
    /// (LLaMA-Factory registers them as added tokens) and the text between them is encoded
    /// piece by piece with SentencePiece, each part on its own.
    pub fn encode_text(&self, text: &str) -> Vec<u32> {
        let mut ids = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            // The earliest stop word (the longest at one position: they never share a start).
            let hit = STOP_WORDS
                .iter()
                .filter_map(|&s| rest.find(s.name()).map(|at| (at, s)))
                .min_by_key(|&(at, s)| (at, usize::MAX - s.name().len()));
            let (chunk, special) = match hit {
                Some((at, s)) => (&rest[..at], Some(s)),
                None => (rest, None),
            };
            if !chunk.is_empty() {
                ids.extend(
                    self.spm
                        .encode(chunk)
                        .into_iter()
                        .map(|id| self.unshadow(id)),
                );
            }
            match special {
                Some(s) => {
                    ids.push(self.id(s));
                    rest = &rest[chunk.len() + s.name().len()..];
                }
                None => rest = "",
            }
        }
        ids
    }

    fn unshadow(&self, id: u32) -> u32 {
        self.shadowed
            .iter()
            .find(|&&(v, _)| v == id)
            .map_or(id, |&(_, s)| s)
    }

    /// One string slot element: skipped when empty, else encoded.
    fn push_text(&self, out: &mut Vec<u32>, text: &str) {
        if !text.is_empty() {
            out.extend(self.encode_text(text));
        }
    }

    /// The source and target ids of each turn (`Template.encode_multiturn`).
    pub fn encode_turns(&self, conv: &Conversation) -> Vec<(Vec<u32>, Vec<u32>)> {
        conv.turns
            .iter()
            .enumerate()
            .map(|(turn, (user, assistant))| {
                let mut source = Vec::new();
                if turn == 0 {
                    source.extend([self.id(Special::GMask), self.id(Special::Sop)]);
                    if !conv.system.is_empty() {
                        source.push(self.id(Special::System));
                        self.push_text(&mut source, "\n");
                        self.push_text(&mut source, &conv.system);
                    }
                }
                // StringFormatter.apply replaces "{{content}}" and then the first "{{idx}}" (the
                // turn index) in the substituted text, so a user message's own "{{idx}}" changes.
                let user = user.replacen("{{idx}}", &turn.to_string(), 1);
                source.push(self.id(Special::User));
                self.push_text(&mut source, "\n");
                self.push_text(&mut source, &user);
                source.push(self.id(Special::Assistant));
                let mut target = Vec::new();
                self.push_text(&mut target, "\n");
                self.push_text(&mut target, assistant);
                (source, target)
            })
            .collect()
    }

    /// The example's ids and labels under `cutoff_len`, exactly as LLaMA-Factory 0.9.5's
    /// `SupervisedDatasetProcessor` with the `chatglm3` template (train_on_prompt and
    /// mask_history off).
    pub fn encode_example(&self, conv: &Conversation, cutoff_len: usize) -> Example {
        let eos = self.eos;
        let mut ex = Example::default();
        // Efficient eos: one position is kept for the final eos.
        let mut total = 1usize;
        for (turn, (source, target)) in self.encode_turns(conv).into_iter().enumerate() {
            if total >= cutoff_len {
                break;
            }
            let (source_len, target_len) =
                infer_seqlen(source.len(), target.len(), cutoff_len - total);
            total += source_len + target_len;
            let source = &source[..source_len];
            let target = &target[..target_len];
            ex.ids.extend_from_slice(source);
            if turn != 0 {
                // [eos] + [-100] * (source_len - 1): the previous reply learns to end here. (With
                // source_len 0 Python would still add the eos; infer_seqlen never gives 0 for a
                // non-empty source and a positive budget, and a source is never empty.)
                ex.labels.push(eos as i32);
                ex.labels
                    .extend(std::iter::repeat(IGNORE_INDEX).take(source_len.saturating_sub(1)));
            } else {
                ex.labels
                    .extend(std::iter::repeat(IGNORE_INDEX).take(source_len));
            }
            ex.ids.extend_from_slice(target);
            ex.labels.extend(target.iter().map(|&id| id as i32));
        }
        ex.ids.push(eos);
        ex.labels.push(eos as i32);
        ex
    }
}
