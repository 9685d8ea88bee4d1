//! PNG pictures: the loss curve of a run and attention heatmaps with tokens on the axes.
//! Drawn with `plotters` into memory, encoded with `png`, written through a temporary file and a
//! rename. Text uses the embedded DejaVu Sans (see `assets/DejaVuSans.LICENSE`).

use std::path::Path;
use std::sync::Once;

use anyhow::{anyhow, Context, Result};

use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};
use xfmr::io::write_atomic;

const FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

fn fonts() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The font is compiled in, so a failure here is a build defect, not a user error.
        if register_font("sans-serif", FontStyle::Normal, FONT).is_err() {
            panic!("the embedded DejaVu Sans does not parse");
        }
    });
}

fn save_rgb(path: &Path, rgb: &[u8], (w, h): (u32, u32)) -> Result<()> {
    let mut bytes = Vec::new();
    {
        let mut encoder = png::Encoder::new(&mut bytes, w, h);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder
            .write_header()
            .with_context(|| path.display().to_string())?;
        writer
            .write_image_data(rgb)
            .with_context(|| path.display().to_string())?;
    }
    Ok(write_atomic(path, &bytes)?)
}

fn draw_err(path: &Path) -> impl Fn(String) -> anyhow::Error + '_ {
    move |e| anyhow!("{}: drawing failed: {e}", path.display())
}

/// Training loss per step (and validation loss where measured) against the step, log-scaled
/// loss axis not needed at these ranges: a plain linear plot.
pub fn loss_curve(
    path: &Path,
    title: &str,
    train: &[(f64, f64)],
    valid: &[(f64, f64)],
) -> Result<()> {
    fonts();
    let size = (900u32, 540u32);
    let mut rgb = vec![255u8; (size.0 * size.1 * 3) as usize];
    let err = draw_err(path);
    {
        let root = BitMapBackend::with_buffer(&mut rgb, size).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
        let all = train.iter().chain(valid);
        let x_max = all.clone().map(|p| p.0).fold(1.0, f64::max);
        let y_max = all.clone().map(|p| p.1).fold(0.0, f64::max).max(1e-3) * 1.05;
        let y_min = all.map(|p| p.1).fold(f64::INFINITY, f64::min).min(y_max) * 0.95;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..x_max, y_min..y_max)
            .map_err(|e| err(e.to_string()))?;
        chart
            .configure_mesh()
            .x_desc("optimizer step")
            .y_desc("loss (nats per predicted token)")
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(|e| err(e.to_string()))?;
        chart
            .draw_series(LineSeries::new(train.iter().copied(), BLUE.stroke_width(1)))
            .map_err(|e| err(e.to_string()))?
            .label("training")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], BLUE));
        if !valid.is_empty() {
            chart
                .draw_series(LineSeries::new(valid.iter().copied(), RED.stroke_width(2)))
                .map_err(|e| err(e.to_string()))?
                .label("validation")
                .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], RED));
            chart
                .draw_series(valid.iter().map(|&p| Circle::new(p, 3, RED.filled())))
                .map_err(|e| err(e.to_string()))?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 14))
            .draw()
            .map_err(|e| err(e.to_string()))?;
        root.present().map_err(|e| err(e.to_string()))?;
    }
    save_rgb(path, &rgb, size)
}

/// A heatmap of `weights[row][col]` in [0, 1] (white → dark blue), `rows` labelling the query
/// tokens (y axis, top to bottom) and `cols` the key tokens (x axis, left to right, written
/// vertically), with a colour scale from 0 to 1 on the right.
pub fn heatmap(
    path: &Path,
    title: &str,
    rows: &[String],
    cols: &[String],
    weights: &[Vec<f32>],
) -> Result<()> {
    fonts();
    let cell = 28u32;
    let label = 8 * rows
        .iter()
        .chain(cols)
        .map(|t| t.chars().count())
        .max()
        .unwrap_or(1) as u32
        + 16;
    // The colour scale: a bar `SCALE_BAR` wide, `SCALE_GAP` right of the grid, labels beside it.
    const SCALE_GAP: u32 = 16;
    const SCALE_BAR: u32 = 14;
    let size = (
        label + cell * cols.len() as u32 + SCALE_GAP + SCALE_BAR + 40,
        40 + label + cell * rows.len() as u32 + 10,
    );
    let shade = |w: f32| {
        let w = w.clamp(0.0, 1.0);
        let mix = |full: f32, dark: f32| (full + (dark - full) * w) as u8;
        RGBColor(mix(255.0, 8.0), mix(255.0, 48.0), mix(255.0, 107.0))
    };
    let mut rgb = vec![255u8; (size.0 * size.1 * 3) as usize];
    let err = draw_err(path);
    {
        let root = BitMapBackend::with_buffer(&mut rgb, size).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
        root.draw(&Text::new(title, (8, 8), ("sans-serif", 16)))
            .map_err(|e| err(e.to_string()))?;
        let (x0, y0) = (label as i32, 40 + label as i32);
        let c = cell as i32;
        for (j, token) in cols.iter().enumerate() {
            let style = ("sans-serif", 13)
                .into_font()
                .transform(FontTransform::Rotate270)
                .color(&BLACK);
            root.draw(&Text::new(
                token.as_str(),
                (x0 + j as i32 * c + c / 4, y0 - 6),
                style,
            ))
            .map_err(|e| err(e.to_string()))?;
        }
        for (i, token) in rows.iter().enumerate() {
            let y = y0 + i as i32 * c;
            root.draw(&Text::new(
                token.as_str(),
                (6, y + c / 4),
                ("sans-serif", 13),
            ))
            .map_err(|e| err(e.to_string()))?;
            for (j, &w) in weights[i].iter().enumerate() {
                let x = x0 + j as i32 * c;
                root.draw(&Rectangle::new(
                    [(x, y), (x + c - 1, y + c - 1)],
                    shade(w).filled(),
                ))
                .map_err(|e| err(e.to_string()))?;
            }
        }
        // The scale: 1 at the top of the grid, 0 at its bottom, one pixel row per shade.
        let bar_x = x0 + (cell * cols.len() as u32 + SCALE_GAP) as i32;
        let height = (cell * rows.len() as u32).max(2) as i32;
        for k in 0..height {
            let w = 1.0 - k as f32 / (height - 1) as f32;
            root.draw(&Rectangle::new(
                // plotters fills nothing of a zero-height rectangle: two pixel rows, the next
                // one overdraws the second.
                [(bar_x, y0 + k), (bar_x + SCALE_BAR as i32 - 1, y0 + k + 1)],
                shade(w).filled(),
            ))
            .map_err(|e| err(e.to_string()))?;
        }
        root.draw(&Rectangle::new(
            [(bar_x, y0), (bar_x + SCALE_BAR as i32 - 1, y0 + height - 1)],
            BLACK.stroke_width(1),
        ))
        .map_err(|e| err(e.to_string()))?;
        for (text, k) in [("1", 0), ("0.5", (height - 1) / 2), ("0", height - 1)] {
            root.draw(&Text::new(
                text,
                (bar_x + SCALE_BAR as i32 + 4, y0 + k - 6),
                ("sans-serif", 12),
            ))
            .map_err(|e| err(e.to_string()))?;
        }
        root.present().map_err(|e| err(e.to_string()))?;
    }
    save_rgb(path, &rgb, size)
}
