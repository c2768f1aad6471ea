//! `sft-preview`: look before you train. The first k examples as the model will see them, the
//! trained (assistant) tokens marked, each example's token and trained-token counts, then the
//! packing statistics of the whole file.

use super::example::{Example, IGNORE};
use super::index::{SftIndex, DEFAULT_CUTOFF_LEN};
use super::tokenizer::SftTokenizer;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;

/// How trained tokens are marked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mark {
    /// Colour on a terminal, brackets otherwise.
    Auto,
    /// `[[` and `]]` around the trained tokens.
    Brackets,
    /// Green (ANSI escape codes).
    Color,
}

/// Show how SFT data will be tokenised, masked and packed, without training.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "sft-preview",
    bin_name = "hipk-train sft-preview",
    args_override_self = true
)]
pub struct PreviewArgs {
    /// The examples (`.jsonl`: `messages` or alpaca records).
    #[arg(long)]
    pub data: PathBuf,
    /// The model's tokenizer directory (tokenizer.json, tokenizer_config.json).
    #[arg(long)]
    pub tokenizer: PathBuf,
    /// Tokens kept of each example.
    #[arg(long, default_value_t = DEFAULT_CUTOFF_LEN)]
    pub cutoff_len: usize,
    /// Positions per row (as the training run's --seq).
    #[arg(long, default_value_t = 1024)]
    pub seq: usize,
    /// Examples to show.
    #[arg(short = 'k', long = "examples", default_value_t = 3)]
    pub k: usize,
    /// How trained tokens are marked.
    #[arg(long, value_enum, default_value_t = Mark::Auto)]
    pub mark: Mark,
}

/// Run the preview, writing to `out`.
pub fn run(args: &PreviewArgs, out: &mut dyn Write) -> crate::error::Result<()> {
    let color = match args.mark {
        Mark::Auto => std::io::stdout().is_terminal(),
        Mark::Brackets => false,
        Mark::Color => true,
    };
    let tok = SftTokenizer::load(&args.tokenizer)?;
    let mut shown = Vec::new();
    let index = SftIndex::build_with(&args.data, &tok, args.cutoff_len, args.seq, |line, ex| {
        if shown.len() < args.k {
            shown.push((line, ex.cloned()));
        }
    })?;
    let w = |e: std::io::Error| crate::error::TrainError::Io {
        path: PathBuf::from("<stdout>"),
        source: e,
    };
    writeln!(
        out,
        "trained tokens are {}",
        if color {
            "\x1b[42;30mon green\x1b[0m"
        } else {
            "between [[ and ]]"
        }
    )
    .map_err(w)?;
    for (line, ex) in &shown {
        writeln!(out).map_err(w)?;
        match ex {
            None => writeln!(out, "── line {line}: no assistant turn (dropped) ──").map_err(w)?,
            Some(ex) => {
                writeln!(out, "── line {line}: {} ──", counts(ex, args.cutoff_len)).map_err(w)?;
                writeln!(out, "{}", marked(&tok, ex, color)).map_err(w)?;
            }
        }
    }
    writeln!(out).map_err(w)?;
    writeln!(out, "{}", index.summary()).map_err(w)?;
    let per_row = index.entries.len() as f64 / index.rows.len().max(1) as f64;
    writeln!(
        out,
        "packing: {:.2} examples per row, {} of {} positions trained ({:.1}%), pad id {}",
        per_row,
        index.stats.counted,
        index.stats.positions,
        100.0 * index.stats.counted as f64 / index.stats.positions.max(1) as f64,
        tok.pad_id
    )
    .map_err(w)?;
    Ok(())
}

/// `34 tokens, 12 trained` (and the cut, or that it is dropped).
fn counts(ex: &Example, cutoff: usize) -> String {
    let mut s = format!("{} tokens, {} trained", ex.ids.len(), ex.trained());
    if ex.full_len > ex.ids.len() {
        s.push_str(&format!(
            " (cut from {} by --cutoff-len {cutoff})",
            ex.full_len
        ));
    }
    if ex.is_dropped() {
        s.push_str(", dropped: no assistant token left");
    }
    s
}

/// The example's text, its trained spans marked.
pub fn marked(tok: &SftTokenizer, ex: &Example, color: bool) -> String {
    let (open, close) = if color {
        ("\x1b[42;30m", "\x1b[0m")
    } else {
        ("[[", "]]")
    };
    let mut s = String::new();
    let mut t = 0;
    while t < ex.ids.len() {
        let trained = ex.labels[t] != IGNORE;
        let end = (t..ex.ids.len())
            .find(|&u| (ex.labels[u] != IGNORE) != trained)
            .unwrap_or(ex.ids.len());
        let text = tok.decode(&ex.ids[t..end]);
        if trained {
            s.push_str(open);
            s.push_str(&text);
            s.push_str(close);
        } else {
            s.push_str(&text);
        }
        t = end;
    }
    if ex.full_len > ex.ids.len() {
        s.push_str(&format!("… [{} tokens cut]", ex.full_len - ex.ids.len()));
    }
    s
}

/// Parse `sft-preview`'s arguments (`argv` without the program and subcommand names) and run.
pub fn main_with(argv: Vec<std::ffi::OsString>) -> std::process::ExitCode {
    use clap::Parser;
    let args = match PreviewArgs::try_parse_from(
        std::iter::once(std::ffi::OsString::from("sft-preview")).chain(argv),
    ) {
        Ok(a) => a,
        Err(e) => {
            let code = e.exit_code();
            let _ = e.print();
            return std::process::ExitCode::from(code.clamp(0, 255) as u8);
        }
    };
    let stdout = std::io::stdout();
    match run(&args, &mut stdout.lock()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::from(e.exit_code())
        }
    }
}
