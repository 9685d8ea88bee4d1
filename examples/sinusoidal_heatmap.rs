//! Renders the paper's sinusoidal positional encoding as a heatmap, position down, dimension
//! across: the picture familiar from explanations of the paper (fast-oscillating low dimensions
//! on the left, slow wavelengths on the right). Blue is −1, white 0, red +1.
//!
//! ```text
//! cargo run -p xfmr --example sinusoidal_heatmap -- [out.png] [max_len] [d_model]
//! ```
//! Defaults: `docs/images/sinusoidal.png`, 128 positions, 128 dimensions, each cell 4×4 pixels.
//! The file is written to a temporary name, then renamed: never left half-written.

use std::fs::File;
use std::io::BufWriter;
use std::path::PathBuf;

use burn::backend::NdArray;
use xfmr::position::SinusoidalConfig;

const CELL: usize = 4;

/// Diverging blue–white–red for a value in [-1, 1].
fn color(v: f32) -> [u8; 3] {
    let t = v.clamp(-1.0, 1.0);
    let fade = |x: f32| (255.0 * (1.0 - x)).round() as u8;
    if t >= 0.0 {
        [255, fade(t), fade(t)]
    } else {
        [fade(-t), fade(-t), 255]
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let out = PathBuf::from(
        args.first()
            .map_or("docs/images/sinusoidal.png", String::as_str),
    );
    let max_len: usize = args.get(1).map_or(Ok(128), |a| a.parse())?;
    let d_model: usize = args.get(2).map_or(Ok(128), |a| a.parse())?;

    let device = Default::default();
    let pe = SinusoidalConfig::new(d_model)
        .with_max_len(max_len)
        .init::<NdArray>(&device)?;
    let table: Vec<f32> = pe
        .encoding(max_len, 0)
        .into_data()
        .convert::<f32>()
        .to_vec()?;

    let (width, height) = (d_model * CELL, max_len * CELL);
    let mut pixels = Vec::with_capacity(width * height * 3);
    for y in 0..height {
        for x in 0..width {
            pixels.extend(color(table[(y / CELL) * d_model + x / CELL]));
        }
    }

    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = out.with_extension("png.tmp");
    {
        let mut encoder = png::Encoder::new(
            BufWriter::new(File::create(&tmp)?),
            width as u32,
            height as u32,
        );
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder.write_header()?;
        writer.write_image_data(&pixels)?;
        writer.finish()?;
    }
    std::fs::rename(&tmp, &out)?;
    println!(
        "wrote {} ({width}×{height}: {max_len} positions × {d_model} dimensions)",
        out.display()
    );
    Ok(())
}
