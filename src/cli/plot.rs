//! SVG plots of benchmark series with plotters (log-log: time against tokens).

use std::path::Path;

use moe_gemm::{Error, Result};
use plotters::prelude::*;

/// One labelled series of (tokens, µs).
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// Draws `series` as lines on log axes (x: tokens, y: µs) into an SVG file.
pub fn time_vs_tokens(path: &Path, title: &str, series: &[Series]) -> Result<()> {
    let err = |e: String| Error::InvalidProblem(format!("plot {}: {e}", path.display()));
    let all: Vec<(f64, f64)> = series.iter().flat_map(|s| s.points.iter().copied()).collect();
    if all.is_empty() {
        return Ok(());
    }
    let (x0, x1) = all.iter().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
    let (y0, y1) = all.iter().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.1), b.max(p.1)));
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d((x0 * 0.8..x1 * 1.25).log_scale(), (y0 * 0.8..y1 * 1.25).log_scale())
        .map_err(|e| err(e.to_string()))?;
    chart.configure_mesh().x_desc("tokens T").y_desc("time per layer (µs)").draw().map_err(|e| err(e.to_string()))?;
    for (i, s) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(s.points.iter().copied(), color.stroke_width(2)))
            .map_err(|e| err(e.to_string()))?
            .label(s.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        chart
            .draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled())))
            .map_err(|e| err(e.to_string()))?;
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(|e| err(e.to_string()))?;
    root.present().map_err(|e| err(e.to_string()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_an_svg_with_every_series() {
        let path = std::env::temp_dir().join(format!("moe-gemm-plot-{}.svg", std::process::id()));
        let s = |label: &str, f: f64| Series {
            label: label.into(),
            points: vec![(1.0, 10.0 * f), (64.0, 100.0 * f), (4096.0, 900.0 * f)],
        };
        time_vs_tokens(&path, "test model", &[s("ours", 1.0), s("torch", 1.5), s("floor", 0.8)]).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("ours") && svg.contains("torch") && svg.contains("test model"));
        let _ = std::fs::remove_file(path);
    }
}
