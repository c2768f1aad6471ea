//! `plot LOG… -o FILE.svg|FILE.png`: training logs (`--log` JSONL) drawn with plotters: loss
//! and eval_loss against step on top; lr, grad_norm and mem_peak in small panels beneath; one
//! colour per file, the legend by file name. The font comes from a crate (no system fonts), so
//! the picture is the same on every machine.

use crate::error::{Result, TrainError};
use crate::sft::jsonl::LineReader;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::{Path, PathBuf};

/// Draw training logs.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "plot", bin_name = "hipk-train plot", args_override_self = true)]
pub struct PlotArgs {
    /// The logs (`--log` files of training runs), overlaid.
    #[arg(required = true)]
    pub logs: Vec<PathBuf>,
    /// The picture: `.svg` or `.png`.
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,
    /// Width and height in pixels.
    #[arg(long, default_value = "1000x760", value_parser = parse_size)]
    pub size: (u32, u32),
    /// A title above the loss panel.
    #[arg(long)]
    pub title: Option<String>,
}

/// `WxH`.
fn parse_size(s: &str) -> std::result::Result<(u32, u32), String> {
    let (w, h) = s
        .split_once('x')
        .ok_or_else(|| format!("`{s}` is not WIDTHxHEIGHT (e.g. 1000x760)"))?;
    let n = |v: &str| -> std::result::Result<u32, String> {
        v.parse::<u32>()
            .ok()
            .filter(|x| (200..=8000).contains(x))
            .ok_or_else(|| format!("`{v}` is not a size in 200..=8000 pixels"))
    };
    Ok((n(w)?, n(h)?))
}

/// One log's series.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Run {
    /// The legend's name (the file name).
    pub name: String,
    /// (step, loss).
    pub loss: Vec<(f64, f64)>,
    /// (step, eval_loss).
    pub eval_loss: Vec<(f64, f64)>,
    /// (step, lr).
    pub lr: Vec<(f64, f64)>,
    /// (step, grad_norm).
    pub grad_norm: Vec<(f64, f64)>,
    /// (step, mem_peak in MiB).
    pub mem_peak: Vec<(f64, f64)>,
}

/// Read one log: step lines (`loss`, `lr`, `grad_norm`, `mem_peak`) and eval lines
/// (`eval_loss`); other keys and non-finite values are skipped.
pub fn read_log(path: &Path) -> Result<Run> {
    let mut r = LineReader::open(path)?;
    let mut run = Run {
        name: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.display().to_string()),
        ..Run::default()
    };
    while let Some(line) = r.next_line()? {
        if line.text.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(&line.text).map_err(|e| {
            TrainError::file(
                path,
                format!(
                    "line {}, column {}: not JSON ({e}); plot reads the trainer's --log files",
                    line.number,
                    e.column()
                ),
            )
        })?;
        let Some(step) = v.get("step").and_then(serde_json::Value::as_f64) else {
            return Err(TrainError::file(
                path,
                format!(
                    "line {}: no numeric `step`; plot reads the trainer's --log files",
                    line.number
                ),
            ));
        };
        let put = |key: &str, scale: f64, into: &mut Vec<(f64, f64)>| {
            if let Some(x) = v.get(key).and_then(serde_json::Value::as_f64) {
                if x.is_finite() {
                    into.push((step, x * scale));
                }
            }
        };
        put("loss", 1.0, &mut run.loss);
        put("eval_loss", 1.0, &mut run.eval_loss);
        put("lr", 1.0, &mut run.lr);
        put("grad_norm", 1.0, &mut run.grad_norm);
        put("mem_peak", 1.0 / (1024.0 * 1024.0), &mut run.mem_peak);
    }
    if run.loss.is_empty() && run.eval_loss.is_empty() {
        return Err(TrainError::file(
            path,
            "has no step line with a `loss` (nor an `eval_loss` line): is it a --log file?",
        ));
    }
    Ok(run)
}

/// The colours of the runs, in order.
const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

/// The font every label is drawn with, registered once from the crate that ships it.
fn register_font() -> Result<()> {
    static ONCE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = *ONCE.get_or_init(|| {
        plotters::style::register_font(
            "sans-serif",
            FontStyle::Normal,
            epaint_default_fonts::UBUNTU_LIGHT,
        )
        .is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(TrainError::Op(
            "plot: the built-in font did not load".into(),
        ))
    }
}

/// Read `args.logs` and draw them to `args.output`.
pub fn run(args: &PlotArgs) -> Result<()> {
    let runs = args
        .logs
        .iter()
        .map(|p| read_log(p))
        .collect::<Result<Vec<_>>>()?;
    register_font()?;
    let ext = args
        .output
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    let failed = |e: String| TrainError::file(&args.output, format!("could not draw: {e}"));
    let title = args.title.as_deref();
    match ext.as_deref() {
        Some("svg") => {
            let root = SVGBackend::new(&args.output, args.size).into_drawing_area();
            draw(&root, &runs, title).map_err(failed)?;
            root.present().map_err(|e| failed(e.to_string()))
        }
        Some("png") => {
            let root = BitMapBackend::new(&args.output, args.size).into_drawing_area();
            draw(&root, &runs, title).map_err(failed)?;
            root.present().map_err(|e| failed(e.to_string()))
        }
        _ => Err(TrainError::Usage(format!(
            "-o {}: the picture must end in .svg or .png",
            args.output.display()
        ))),
    }
}

/// The x and y ranges of `series` (some margin on y; a flat or empty series gets a unit range).
fn ranges<'a>(series: impl Iterator<Item = &'a [(f64, f64)]>) -> (f64, f64, f64, f64) {
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for s in series {
        for &(x, y) in s {
            x0 = x0.min(x);
            x1 = x1.max(x);
            y0 = y0.min(y);
            y1 = y1.max(y);
        }
    }
    if x0 > x1 {
        return (0.0, 1.0, 0.0, 1.0);
    }
    if x1 - x0 < 1.0 {
        x1 = x0 + 1.0;
    }
    let pad = if y1 > y0 {
        0.06 * (y1 - y0)
    } else {
        0.5 * y0.abs().max(1e-3)
    };
    (x0, x1, y0 - pad, y1 + pad)
}

/// Draw every panel of `runs` on `root`.
fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    runs: &[Run],
    title: Option<&str>,
) -> std::result::Result<(), String> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| format!("{e:?}");
    root.fill(&WHITE).map_err(e)?;
    let (_, h) = root.dim_in_pixel();
    let (top, bottom) = root.split_vertically(h * 62 / 100);
    let (x0, x1, y0, y1) = ranges(runs.iter().flat_map(|r| [&r.loss[..], &r.eval_loss[..]]));
    let mut chart = ChartBuilder::on(&top);
    chart.margin(12).x_label_area_size(34).y_label_area_size(56);
    if let Some(t) = title {
        chart.caption(t, ("sans-serif", 22));
    }
    let mut chart = chart.build_cartesian_2d(x0..x1, y0..y1).map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("loss")
        .x_label_formatter(&|v| step_label(*v))
        .light_line_style(RGBColor(235, 235, 235))
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(e)?;
    for (i, run) in runs.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(run.loss.iter().copied(), c.stroke_width(2)))
            .map_err(e)?
            .label(format!("{} loss", run.name))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 22, y)], c.stroke_width(2)));
        if !run.eval_loss.is_empty() {
            chart
                .draw_series(DashedLineSeries::new(
                    run.eval_loss.iter().copied(),
                    6,
                    4,
                    c.stroke_width(2),
                ))
                .map_err(e)?;
            chart
                .draw_series(
                    run.eval_loss
                        .iter()
                        .map(|&(x, y)| Circle::new((x, y), 4, c.filled())),
                )
                .map_err(e)?
                .label(format!("{} eval_loss", run.name))
                .legend(move |(x, y)| Circle::new((x + 11, y), 4, c.filled()));
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(160, 160, 160))
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(e)?;
    let panels = bottom.split_evenly((1, 3));
    type Pick = fn(&Run) -> &[(f64, f64)];
    let picks: [(&str, Pick); 3] = [
        ("lr", |r| &r.lr),
        ("grad_norm", |r| &r.grad_norm),
        ("mem_peak (MiB)", |r| &r.mem_peak),
    ];
    for (area, (name, pick)) in panels.iter().zip(picks) {
        small_panel(area, runs, name, pick)?;
    }
    Ok(())
}

/// One small panel: `pick(run)` against step for every run.
fn small_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    runs: &[Run],
    name: &str,
    pick: fn(&Run) -> &[(f64, f64)],
) -> std::result::Result<(), String> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| format!("{e:?}");
    let (x0, x1, y0, y1) = ranges(runs.iter().map(pick));
    let empty = runs.iter().all(|r| pick(r).is_empty());
    let mut chart = ChartBuilder::on(area)
        .margin(10)
        .caption(
            if empty {
                format!("{name}: not in these logs")
            } else {
                name.to_string()
            },
            ("sans-serif", 15),
        )
        .x_label_area_size(28)
        .y_label_area_size(62)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_labels(4)
        .y_labels(4)
        .light_line_style(RGBColor(240, 240, 240))
        .label_style(("sans-serif", 12))
        .x_label_formatter(&|v| step_label(*v))
        .y_label_formatter(&|v| short_number(*v))
        .draw()
        .map_err(e)?;
    for (i, run) in runs.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(
                pick(run).iter().copied(),
                c.stroke_width(2),
            ))
            .map_err(e)?;
    }
    Ok(())
}

/// A step tick: whole steps without decimals.
fn step_label(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// A tick label: `1.0e-3` for small or large magnitudes, `12.5` otherwise.
fn short_number(v: f64) -> String {
    let a = v.abs();
    if a != 0.0 && !(1e-2..1e4).contains(&a) {
        format!("{v:.1e}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// Parse `plot`'s arguments (`argv` without the program and subcommand names) and run.
pub fn main_with(argv: Vec<std::ffi::OsString>) -> std::process::ExitCode {
    use clap::Parser;
    let args = match PlotArgs::try_parse_from(
        std::iter::once(std::ffi::OsString::from("plot")).chain(argv),
    ) {
        Ok(a) => a,
        Err(e) => {
            let code = e.exit_code();
            let _ = e.print();
            return std::process::ExitCode::from(code.clamp(0, 255) as u8);
        }
    };
    match run(&args) {
        Ok(()) => {
            println!("wrote {}", args.output.display());
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::from(e.exit_code())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A log of `n` steps whose loss falls from `start`, with eval lines every 5 steps.
    fn log(dir: &Path, name: &str, start: f64, n: u64, mem: bool) -> PathBuf {
        let mut s = String::new();
        for step in 1..=n {
            let loss = start / (1.0 + 0.1 * step as f64);
            let mut line = serde_json::json!({"step": step, "loss": loss, "lr": 1e-3 * step as f64 / n as f64,
                "grad_norm": 2.0 / step as f64, "tokens_per_s": 100.0, "tokens": 40 + step});
            if mem {
                line["mem_peak"] = serde_json::json!(1_048_576 * (100 + step));
            }
            s.push_str(&format!("{line}\n"));
            if step % 5 == 0 || step == n {
                s.push_str(&format!(
                    "{}\n",
                    serde_json::json!({"step": step, "eval_loss": loss * 1.1, "eval_tokens": 48})
                ));
            }
        }
        let p = dir.join(name);
        std::fs::write(&p, s).unwrap();
        p
    }

    #[test]
    fn reads_step_and_eval_lines() {
        let d = tempfile::tempdir().unwrap();
        let run = read_log(&log(d.path(), "a.jsonl", 4.0, 12, true)).unwrap();
        assert_eq!(run.name, "a.jsonl");
        assert_eq!(run.loss.len(), 12);
        assert_eq!(
            run.eval_loss.iter().map(|p| p.0).collect::<Vec<_>>(),
            [5.0, 10.0, 12.0]
        );
        assert_eq!(run.mem_peak[0], (1.0, 101.0));
        assert!((run.eval_loss[0].1 - 1.1 * 4.0 / 1.5).abs() < 1e-12);
    }

    #[test]
    fn draws_svg_and_png_of_several_runs() {
        let d = tempfile::tempdir().unwrap();
        let a = log(d.path(), "run_a.jsonl", 4.0, 20, true);
        let b = log(d.path(), "run_b.jsonl", 3.0, 15, false);
        for ext in ["svg", "png"] {
            let out = d.path().join(format!("runs.{ext}"));
            let args = PlotArgs {
                logs: vec![a.clone(), b.clone()],
                output: out.clone(),
                size: (800, 600),
                title: Some("two runs".into()),
            };
            run(&args).unwrap();
            let bytes = std::fs::read(&out).unwrap();
            if ext == "svg" {
                let s = String::from_utf8(bytes).unwrap();
                for text in [
                    "run_a.jsonl loss",
                    "run_b.jsonl eval_loss",
                    "grad_norm",
                    "mem_peak (MiB)",
                    "two runs",
                ] {
                    assert!(s.contains(text), "{text} missing from the SVG");
                }
            } else {
                assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
                // IHDR: width and height, big-endian.
                assert_eq!(u32::from_be_bytes(bytes[16..20].try_into().unwrap()), 800);
                assert_eq!(u32::from_be_bytes(bytes[20..24].try_into().unwrap()), 600);
            }
        }
    }

    #[test]
    fn bad_logs_and_outputs_are_errors() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("bad.jsonl");
        std::fs::write(
            &p,
            "{\"step\": 1, \"loss\": 2.0}\n{\"step\": 2, \"loss\" 1}\n",
        )
        .unwrap();
        let e = read_log(&p).unwrap_err().to_string();
        assert!(e.contains("bad.jsonl: line 2, column 20: not JSON"), "{e}");
        std::fs::write(&p, "{\"loss\": 2.0}\n").unwrap();
        let e = read_log(&p).unwrap_err().to_string();
        assert!(e.contains("line 1: no numeric `step`"), "{e}");
        std::fs::write(&p, "{\"step\": 1, \"eval_tokens\": 3}\n").unwrap();
        assert!(read_log(&p)
            .unwrap_err()
            .to_string()
            .contains("is it a --log file?"));
        let good = log(d.path(), "g.jsonl", 2.0, 3, false);
        let args = PlotArgs {
            logs: vec![good],
            output: d.path().join("x.jpg"),
            size: (800, 600),
            title: None,
        };
        let e = run(&args).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(parse_size("10x10").is_err() && parse_size("800x600") == Ok((800, 600)));
    }
}
