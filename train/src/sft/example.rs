//! One example's ids and labels by the incremental rendering rule, then `--cutoff-len`.
//!
//! `ids = encode(render(m_1..m_n, add_generation_prompt=false))`; for each assistant message
//! m_j, `a = len(encode(render(m_1..m_{j−1}, true)))` (that encoding must be a prefix of
//! `ids`: the template renders incrementally) and `b = len(encode(render(m_1..m_j, false)))`;
//! tokens `a..b` are trained (label = id), every other label is −100. Then both are cut to
//! `cutoff` tokens.

use super::record::{Message, Role};
use super::tokenizer::SftTokenizer;

/// The label of a token that is not trained.
pub const IGNORE: i32 = -100;

/// One example, tokenised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Example {
    /// Token ids (cut to `--cutoff-len`).
    pub ids: Vec<u32>,
    /// Labels: the id where the token is the assistant's, [`IGNORE`] elsewhere.
    pub labels: Vec<i32>,
    /// Tokens before the cut.
    pub full_len: usize,
}

impl Example {
    /// Whether the example is dropped: no assistant token is left (or a single token, which
    /// gives no training position).
    pub fn is_dropped(&self) -> bool {
        self.labels.iter().all(|&l| l == IGNORE) || self.ids.len() < 2
    }

    /// Trained tokens.
    pub fn trained(&self) -> usize {
        self.labels.iter().filter(|&&l| l != IGNORE).count()
    }

    /// Training positions it takes in a row: one fewer than its tokens.
    pub fn positions(&self) -> usize {
        self.ids.len().saturating_sub(1)
    }

    /// Counted targets among its positions (labels 1..).
    pub fn counted(&self) -> usize {
        self.labels.iter().skip(1).filter(|&&l| l != IGNORE).count()
    }
}

/// Why an example could not be tokenised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExampleError {
    /// The template failed (its own `raise_exception` included).
    Template(String),
    /// The prompt before assistant message `j` does not encode to a prefix of the whole.
    NotIncremental {
        /// Index of the assistant message in the conversation.
        message: usize,
    },
    /// The tokenizer failed.
    Tokenizer(String),
    /// An id does not fit an `i32`.
    IdRange(u32),
}

impl std::fmt::Display for ExampleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExampleError::Template(m) => {
                write!(f, "the chat template failed on this conversation: {m}")
            }
            ExampleError::NotIncremental { message } => write!(
                f,
                "the chat template does not render incrementally: the conversation up to \
                 messages[{message}] with add_generation_prompt=true does not encode to a prefix \
                 of the whole conversation, so the assistant's tokens cannot be told apart; use \
                 a template whose generation prompt is how the assistant's turn starts"
            ),
            ExampleError::Tokenizer(m) => f.write_str(m),
            ExampleError::IdRange(id) => write!(f, "token id {id} does not fit a 32-bit signed id"),
        }
    }
}

/// Tokenise `messages` and cut to `cutoff` tokens (a ChatGLM3 tokenizer: LLaMA-Factory's
/// `chatglm3` template and its per-turn cut).
pub fn encode(
    tok: &SftTokenizer,
    messages: &[Message],
    cutoff: usize,
) -> Result<Example, ExampleError> {
    if let Some(t) = tok.chatglm3() {
        return chatglm3(t, messages, cutoff);
    }
    let enc = |ms: &[Message], gen: bool| -> Result<Vec<u32>, ExampleError> {
        let text = tok.render(ms, gen).map_err(ExampleError::Template)?;
        tok.encode(&text).map_err(ExampleError::Tokenizer)
    };
    let ids = enc(messages, false)?;
    if let Some(&id) = ids.iter().find(|&&id| i32::try_from(id).is_err()) {
        return Err(ExampleError::IdRange(id));
    }
    let mut labels = vec![IGNORE; ids.len()];
    for (j, m) in messages.iter().enumerate() {
        if m.role != Role::Assistant {
            continue;
        }
        let prompt = enc(&messages[..j], true)?;
        if !ids.starts_with(&prompt) {
            return Err(ExampleError::NotIncremental { message: j });
        }
        let b = enc(&messages[..=j], false)?.len().min(ids.len());
        let a = prompt.len().min(b);
        for (l, &id) in labels[a..b].iter_mut().zip(&ids[a..b]) {
            // Checked above: every id fits an i32.
            *l = id as i32;
        }
    }
    let full_len = ids.len();
    let mut ids = ids;
    ids.truncate(cutoff);
    labels.truncate(cutoff);
    Ok(Example {
        ids,
        labels,
        full_len,
    })
}

/// ChatGLM3's ids and labels of `messages`, exactly as LLaMA-Factory 0.9.5's supervised
/// processor with its `chatglm3` template (slots encoded one by one, efficient-eos labels, the
/// final eos, each turn cut by `infer_seqlen` under `cutoff`): the spec's "GLM family" rules.
fn chatglm3(
    t: &crate::spm::chatglm3::ChatGlm3Tokenizer,
    messages: &[Message],
    cutoff: usize,
) -> Result<Example, ExampleError> {
    use crate::spm::chatglm3::Conversation;
    let conv = Conversation::from_messages(messages.iter().map(|m| (m.role.as_str(), &*m.content)))
        .map_err(|e| ExampleError::Template(e.to_string()))?;
    let ex = t.encode_example(&conv, cutoff);
    if let Some(&id) = ex.ids.iter().find(|&&id| i32::try_from(id).is_err()) {
        return Err(ExampleError::IdRange(id));
    }
    // A cut example fills `cutoff` exactly; only then is the whole length worth counting.
    let full_len = match ex.ids.len() < cutoff {
        true => ex.ids.len(),
        false => {
            let turns = t.encode_turns(&conv);
            1 + turns.iter().map(|(s, a)| s.len() + a.len()).sum::<usize>()
        }
    };
    Ok(Example {
        ids: ex.ids,
        labels: ex.labels,
        full_len,
    })
}
