//! Plots (SVG and PNG, drawn with `plotters` and an embedded font):
//! * `loss.{svg,png}`: train and validation loss vs step (left) and vs tokens (right);
//! * `stalls.{svg,png}`: stalled fraction of m and of v vs step per tensor group, the paper's
//!   estimator over all tensors (dashed), and the theory line for v;
//! * `theory.{svg,png}`: the predicted v stalled fraction vs b2 for each format, nearest and
//!   stochastic rounding (the paper's stalling-probability figure);
//! * `compare.{svg,png}` (several runs): validation loss and global v stalled fraction.
//!
//! Each panel's legend is drawn in a strip under its chart, never over the curves (stalled
//! fractions crowd the top of their panels near 1.0); PNG text goes through
//! [`crate::text_backend`] so its letters are evenly set.

use crate::text_backend::{register_font, Glyphs, FONT};
use anyhow::{Context, Result};
use lowbit_optim::{theory, StateFormat};
use lowbit_train::logs::metrics::{read_rows, MetricsRow};
use lowbit_train::logs::stalls::StallRow;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::{Path, PathBuf};

const SIZE: (u32, u32) = (1200, 520);
/// Solid series of at most this many points are sweeps: each point also gets a dot.
const MARKED_POINTS: usize = 12;
/// Height of one row of the legend strip under a chart (px).
const LEGEND_ROW: i32 = 20;
const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// A named polyline.
pub(crate) struct Series {
    pub(crate) name: String,
    pub(crate) points: Vec<(f64, f64)>,
    pub(crate) dashed: bool,
}

/// One panel: a titled chart of several series.
pub(crate) struct Panel {
    pub(crate) title: String,
    pub(crate) x_label: String,
    pub(crate) y_label: String,
    pub(crate) series: Vec<Series>,
}

fn bounds(panel: &Panel) -> (std::ops::Range<f64>, std::ops::Range<f64>) {
    let pts = panel.series.iter().flat_map(|s| s.points.iter()).filter(|p| p.0.is_finite() && p.1.is_finite());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in pts {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        return (0.0..1.0, 0.0..1.0);
    }
    let pad = ((y1 - y0) * 0.05).max(1e-3);
    (x0..x1.max(x0 + 1e-9), (y0 - pad)..(y1 + pad))
}

fn draw_panel<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, p: &Panel) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let (xr, yr) = bounds(p);
    let (w, h) = area.dim_in_pixel();
    // the legend's columns: as many as its longest label allows across the panel
    let longest = p.series.iter().map(|s| s.name.chars().count()).max().unwrap_or(0) as i32;
    let entry_w = 40 + 7 * longest;
    let columns = ((w as i32 - 70) / entry_w).clamp(1, p.series.len().max(1) as i32);
    let rows = (p.series.len() as i32 + columns - 1) / columns;
    let (chart_area, legend_area) = area.split_vertically(h as i32 - rows * LEGEND_ROW - 8);
    let mut chart = ChartBuilder::on(&chart_area)
        .caption(&p.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(xr, yr)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    chart
        .configure_mesh()
        .x_label_formatter(&|x| axis_label(*x))
        .x_desc(&p.x_label)
        .y_desc(&p.y_label)
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    for (i, s) in p.series.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let style = ShapeStyle::from(&color).stroke_width(2);
        let pts: Vec<(f64, f64)> = s.points.iter().copied().filter(|p| p.1.is_finite()).collect();
        if s.dashed {
            chart.draw_series(DashedLineSeries::new(pts, 8, 5, style)).map_err(|e| anyhow::anyhow!("{e}"))?;
        } else {
            // a sweep's few measured points (at most MARKED_POINTS) also get a dot each
            if pts.len() <= MARKED_POINTS {
                chart.draw_series(pts.iter().map(|&p| Circle::new(p, 4, style.filled()))).map_err(|e| anyhow::anyhow!("{e}"))?;
            }
            chart.draw_series(LineSeries::new(pts, style)).map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        let (col, row) = (i as i32 % columns, i as i32 / columns);
        let (x, y) = (70 + col * entry_w, row * LEGEND_ROW + 10);
        let mark: Vec<Vec<(i32, i32)>> = match s.dashed {
            true => vec![vec![(x, y), (x + 9, y)], vec![(x + 15, y), (x + 24, y)]],
            false => vec![vec![(x, y), (x + 24, y)]],
        };
        for seg in mark {
            legend_area.draw(&PathElement::new(seg, style)).map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        let label = ("sans-serif", 13).into_font().color(&BLACK).pos(plotters::style::text_anchor::Pos::new(
            plotters::style::text_anchor::HPos::Left,
            plotters::style::text_anchor::VPos::Center,
        ));
        legend_area.draw(&Text::new(s.name.clone(), (x + 30, y), label)).map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    Ok(())
}

/// Compact tick labels: 250k, 1.5M, 12, 0.5.
fn axis_label(x: f64) -> String {
    let a = x.abs();
    if a >= 1e6 {
        format!("{:.1}M", x / 1e6)
    } else if a >= 1e4 {
        format!("{:.0}k", x / 1e3)
    } else if x.fract() == 0.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.1}")
    }
}

/// Draw panels side by side into `<base>.svg` and `<base>.png`.
/// Draw `panels` side by side into `base`.svg and `base`.png; returns both paths.
pub(crate) fn render(base: &Path, panels: &[Panel]) -> Result<Vec<PathBuf>> {
    register_font();
    let size = (SIZE.0 / 2 * panels.len().max(1) as u32, SIZE.1);
    let svg = base.with_extension("svg");
    let png = base.with_extension("png");
    {
        let root = SVGBackend::new(&svg, size).into_drawing_area();
        root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
        for (area, p) in root.split_evenly((1, panels.len())).iter().zip(panels) {
            draw_panel(area, p)?;
        }
        root.present().map_err(|e| anyhow::anyhow!("{}: {e}", svg.display()))?;
    }
    {
        let font = ab_glyph::FontRef::try_from_slice(FONT).map_err(|e| anyhow::anyhow!("the embedded font: {e}"))?;
        let root = Glyphs { inner: BitMapBackend::new(&png, size), font }.into_drawing_area();
        root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
        for (area, p) in root.split_evenly((1, panels.len())).iter().zip(panels) {
            draw_panel(area, p)?;
        }
        root.present().map_err(|e| anyhow::anyhow!("{}: {e}", png.display()))?;
    }
    Ok(vec![svg, png])
}

struct RunData {
    name: String,
    train: Vec<(f64, f64, f64)>, // step, tokens, loss
    eval: Vec<(f64, f64, f64)>,  // step, tokens, val loss
    stalls: Vec<StallRow>,
}

fn load(run: &Path) -> Result<RunData> {
    let metrics = run.join("metrics.jsonl");
    if !metrics.is_file() {
        anyhow::bail!("{} is not a run folder (no metrics.jsonl)", run.display());
    }
    // a file that is there but unreadable (not text) is named with the reason
    let rows: Vec<MetricsRow> = read_rows(&metrics)?;
    let stall_path = run.join("stalls.jsonl");
    let stalls = if stall_path.exists() { read_rows(&stall_path)? } else { vec![] };
    let mut d =
        RunData { name: run.file_name().map_or("run".into(), |n| n.to_string_lossy().into_owned()), train: vec![], eval: vec![], stalls };
    for r in rows {
        match r {
            MetricsRow::Train { step, tokens, loss, skipped: false, .. } => d.train.push((step as f64, tokens as f64, loss)),
            MetricsRow::Eval { step, tokens, val_loss, .. } => d.eval.push((step as f64, tokens as f64, val_loss)),
            _ => {}
        }
    }
    Ok(d)
}

fn loss_panels(d: &RunData) -> Vec<Panel> {
    let mk = |x: usize, label: &str| Panel {
        title: format!("{}: loss vs {label}", d.name),
        x_label: label.into(),
        y_label: "loss (nats/token)".into(),
        series: vec![
            Series { name: "train".into(), points: d.train.iter().map(|t| (if x == 0 { t.0 } else { t.1 }, t.2)).collect(), dashed: false },
            Series {
                name: "validation".into(),
                points: d.eval.iter().map(|t| (if x == 0 { t.0 } else { t.1 }, t.2)).collect(),
                dashed: false,
            },
        ],
    };
    vec![mk(0, "step"), mk(1, "tokens")]
}

fn stall_panels(d: &RunData) -> Vec<Panel> {
    let groups: Vec<String> = d.stalls.last().map(|r| r.groups.keys().cloned().collect()).unwrap_or_default();
    let theory = d.stalls.last().and_then(|r| r.theory.v);
    ["m", "v"]
        .iter()
        .map(|&state| {
            let pick = |f: &lowbit_train::logs::stalls::Fractions| if state == "m" { f.m } else { f.v };
            let mut series: Vec<Series> = groups
                .iter()
                .map(|g| Series {
                    name: g.clone(),
                    points: d.stalls.iter().filter_map(|r| r.groups.get(g).and_then(pick).map(|f| (r.step as f64, f))).collect(),
                    dashed: false,
                })
                .collect();
            series.push(Series {
                name: "all".into(),
                points: d.stalls.iter().filter_map(|r| pick(&r.frac).map(|f| (r.step as f64, f))).collect(),
                dashed: false,
            });
            // the paper's estimator (unchanged / all entries) of all tensors, where counted
            let paper = |f: &lowbit_train::logs::stalls::Fractions| if state == "m" { f.m_unchanged } else { f.v_unchanged };
            let points: Vec<(f64, f64)> = d.stalls.iter().filter_map(|r| paper(&r.frac).map(|f| (r.step as f64, f))).collect();
            if !points.is_empty() {
                series.push(Series { name: "all, unchanged / all entries".into(), points, dashed: true });
            }
            if let (Some(t), "v", Some(last)) = (theory, state, d.stalls.last()) {
                series.push(Series { name: "theory".into(), points: vec![(1.0, t), (last.step as f64, t)], dashed: true });
            }
            Panel {
                title: format!("{}: stalled fraction of {state}", d.name),
                x_label: "step".into(),
                y_label: "stalled fraction".into(),
                series,
            }
        })
        .collect()
}

/// The theory figure: predicted v stalled fraction vs b2 per format and rounding.
fn theory_panel() -> Panel {
    let b2s: Vec<f64> = (0..=600).map(|i| 1.0 - 10f64.powf(-1.0 - 3.0 * i as f64 / 600.0)).collect();
    let mut series = vec![];
    for (name, format) in [("bf16", StateFormat::Bf16), ("fp8 e4m3", StateFormat::Fp8E4M3), ("fp4 ue2m2", StateFormat::Fp4UE2M2)] {
        let Some(bits) = format.fraction_bits() else { continue };
        for (r, dashed) in [("nearest", false), ("SR", true)] {
            series.push(Series {
                name: format!("{name} {r}"),
                points: b2s
                    .iter()
                    .map(|&b| {
                        let p = if dashed { theory::p_stall_stochastic(bits, b) } else { theory::p_stall_nearest(bits, b) };
                        (-(1.0 - b).log10(), p)
                    })
                    .collect(),
                dashed,
            });
        }
    }
    Panel {
        title: "predicted v stalled fraction".into(),
        x_label: "-log10(1 - b2)   (3 = b2 0.999)".into(),
        y_label: "P(stall)".into(),
        series,
    }
}

/// Write loss, stall and theory plots into the run folder.
pub fn plot_run(run: &Path) -> Result<Vec<PathBuf>> {
    plot_run_into(run, run)
}

fn plot_run_into(run: &Path, out: &Path) -> Result<Vec<PathBuf>> {
    let d = load(run)?;
    create_out(out)?;
    let mut files = render(&out.join("loss"), &loss_panels(&d))?;
    if !d.stalls.is_empty() {
        files.extend(render(&out.join("stalls"), &stall_panels(&d))?);
    }
    files.extend(render(&out.join("theory"), &[theory_panel()])?);
    Ok(files)
}

/// Comparison of several runs: validation loss vs step and global v stalled fraction.
pub fn plot_compare(runs: &[PathBuf], out: &Path) -> Result<Vec<PathBuf>> {
    let data: Vec<RunData> = runs.iter().map(|r| load(r)).collect::<Result<_>>()?;
    let val = Panel {
        title: "validation loss".into(),
        x_label: "step".into(),
        y_label: "loss (nats/token)".into(),
        series: data
            .iter()
            .map(|d| Series { name: d.name.clone(), points: d.eval.iter().map(|e| (e.0, e.2)).collect(), dashed: false })
            .collect(),
    };
    let stall = Panel {
        title: "v stalled fraction (all tensors)".into(),
        x_label: "step".into(),
        y_label: "stalled fraction".into(),
        series: data
            .iter()
            .map(|d| Series {
                name: d.name.clone(),
                points: d.stalls.iter().filter_map(|r| r.frac.v.map(|f| (r.step as f64, f))).collect(),
                dashed: false,
            })
            .collect(),
    };
    create_out(out)?;
    render(&out.join("compare"), &[val, stall])
}

/// Create the output folder of the plots, or fail naming it.
fn create_out(out: &Path) -> Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("cannot create the plot folder {} (--out names a folder)", out.display()))
}

/// `train plot RUN...`.
pub fn plot_command(runs: &[PathBuf], out: Option<&Path>) -> Result<()> {
    let files = match runs {
        [] => anyhow::bail!("train plot: give at least one run folder"),
        [one] => plot_run_into(one, out.unwrap_or(one))?,
        many => plot_compare(many, out.unwrap_or(Path::new("plots")))?,
    };
    for f in files {
        lowbit_train::outln!("{}", f.display());
    }
    Ok(())
}
