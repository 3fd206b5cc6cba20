//! A hand-written SVG line chart (no dependency): one polyline per series,
//! both axes from zero with labelled ticks at round steps, a legend.

use std::fmt::Write as _;

use super::table::thousands_signed;

/// Whole picture size, px.
const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 420.0;
/// Plot area margins: axis labels left and below, legend right, title above.
const LEFT: f64 = 90.0;
const RIGHT: f64 = 170.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;
/// About this many ticks per axis.
const TICKS: f64 = 5.0;
/// Line colours, in series order.
const COLOURS: [&str; 4] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];

/// One line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Series {
    /// Legend text.
    pub name: String,
    /// (x, y) in data units, drawn in x order.
    pub points: Vec<(f64, f64)>,
}

/// A chart to draw.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Chart {
    /// Title above the plot.
    pub title: String,
    /// X axis title.
    pub x_label: String,
    /// Y axis title.
    pub y_label: String,
    /// The lines.
    pub series: Vec<Series>,
}

/// One axis: its range and tick step, in data units.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Axis {
    /// Lowest value shown (0, or below when data is negative).
    pub lo: f64,
    /// Highest value shown.
    pub hi: f64,
    /// Distance between ticks.
    pub step: f64,
}

impl Axis {
    /// An axis from min(0, `lo`) to at least `hi`, at a round step (1, 2,
    /// 2.5 or 5 times a power of ten) giving about [`TICKS`] ticks.
    pub(crate) fn covering(lo: f64, hi: f64) -> Axis {
        let lo = lo.min(0.0);
        let hi = if hi > lo { hi } else { lo + 1.0 };
        let step = round_step((hi - lo) / TICKS);
        Axis {
            lo: (lo / step).floor() * step,
            hi: (hi / step).ceil() * step,
            step,
        }
    }

    /// The tick values, lo..=hi.
    pub(crate) fn ticks(&self) -> Vec<f64> {
        let n = ((self.hi - self.lo) / self.step).round() as usize;
        (0..=n).map(|i| self.lo + i as f64 * self.step).collect()
    }

    /// Where `v` falls between lo (0.0) and hi (1.0).
    fn fraction(&self, v: f64) -> f64 {
        (v - self.lo) / (self.hi - self.lo)
    }
}

/// The round number (1, 2, 2.5, 5 × 10^k) at or above `raw`.
pub(crate) fn round_step(raw: f64) -> f64 {
    if !(raw.is_finite() && raw > 0.0) {
        return 1.0;
    }
    let power = 10f64.powf(raw.log10().floor());
    let f = raw / power;
    let nice = [1.0, 2.0, 2.5, 5.0, 10.0]
        .into_iter()
        .find(|&n| f <= n * (1.0 + 1e-9))
        .unwrap_or(10.0);
    nice * power
}

/// Pixel position of data point (x, y) on the given axes.
pub(crate) fn to_px(x_axis: &Axis, y_axis: &Axis, x: f64, y: f64) -> (f64, f64) {
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    (
        LEFT + x_axis.fraction(x) * plot_w,
        TOP + plot_h - y_axis.fraction(y) * plot_h,
    )
}

/// The axes that fit every point of `chart`.
pub(crate) fn axes(chart: &Chart) -> (Axis, Axis) {
    let all = chart.series.iter().flat_map(|s| s.points.iter());
    let (mut x_hi, mut y_lo, mut y_hi) = (0f64, 0f64, 0f64);
    for &(x, y) in all {
        x_hi = x_hi.max(x);
        y_lo = y_lo.min(y);
        y_hi = y_hi.max(y);
    }
    (Axis::covering(0.0, x_hi), Axis::covering(y_lo, y_hi))
}

/// The SVG document.
pub(crate) fn svg(chart: &Chart) -> String {
    let (xa, ya) = axes(chart);
    let (x0, y0) = to_px(&xa, &ya, xa.lo, ya.lo);
    let (x1, y1) = to_px(&xa, &ya, xa.hi, ya.hi);
    let mut s = String::new();
    // `write!` to a String cannot fail.
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="28" text-anchor="middle" font-size="15">{}</text>"#,
        (x0 + x1) / 2.0,
        escape(&chart.title)
    );
    // Grid and ticks.
    for t in xa.ticks() {
        let (x, _) = to_px(&xa, &ya, t, ya.lo);
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{y0:.1}" x2="{x:.1}" y2="{y1:.1}" stroke="#e5e5e5"/><line x1="{x:.1}" y1="{y0:.1}" x2="{x:.1}" y2="{:.1}" stroke="black"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            y0 + 5.0,
            y0 + 19.0,
            label(t)
        );
    }
    for t in ya.ticks() {
        let (_, y) = to_px(&xa, &ya, xa.lo, t);
        let _ = writeln!(
            s,
            r##"<line x1="{x0:.1}" y1="{y:.1}" x2="{x1:.1}" y2="{y:.1}" stroke="#e5e5e5"/><line x1="{:.1}" y1="{y:.1}" x2="{x0:.1}" y2="{y:.1}" stroke="black"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            x0 - 5.0,
            x0 - 8.0,
            y + 4.0,
            label(t)
        );
    }
    // Axes and their titles.
    let _ = writeln!(
        s,
        r#"<line x1="{x0:.1}" y1="{y0:.1}" x2="{x1:.1}" y2="{y0:.1}" stroke="black"/><line x1="{x0:.1}" y1="{y0:.1}" x2="{x0:.1}" y2="{y1:.1}" stroke="black"/>"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        (x0 + x1) / 2.0,
        HEIGHT - 18.0,
        escape(&chart.x_label)
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(22 {:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
        (y0 + y1) / 2.0,
        escape(&chart.y_label)
    );
    // Lines, their points with values, the legend.
    for (i, series) in chart.series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let mut pts = series.points.clone();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        let px: Vec<(f64, f64)> = pts.iter().map(|&(x, y)| to_px(&xa, &ya, x, y)).collect();
        let list: Vec<String> = px.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="2" points="{}"><title>{}</title></polyline>"#,
            list.join(" "),
            escape(&series.name)
        );
        for ((x, y), (_, v)) in px.iter().zip(&pts) {
            let _ = writeln!(
                s,
                r#"<circle cx="{x:.1}" cy="{y:.1}" r="3.5" fill="{colour}"/><text x="{:.1}" y="{:.1}" fill="{colour}">{}</text>"#,
                x + 6.0,
                y - 6.0,
                thousands_signed(v.round() as i64)
            );
        }
        let ly = TOP + 10.0 + i as f64 * 22.0;
        let lx = x1 + 20.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{colour}" stroke-width="2"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            lx + 24.0,
            lx + 30.0,
            ly + 4.0,
            escape(&series.name)
        );
    }
    s.push_str("</svg>\n");
    s
}

/// A tick or point label: whole numbers with separators, else one decimal.
fn label(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        thousands_signed(v.round() as i64)
    } else {
        format!("{v:.1}")
    }
}

fn escape(t: &str) -> String {
    t.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart() -> Chart {
        Chart {
            title: "Bytes per idle stream".into(),
            x_label: "streams".into(),
            y_label: "server RSS bytes / stream".into(),
            series: vec![
                Series {
                    name: "switchboard".into(),
                    points: vec![(1000.0, 1700.0), (10_000.0, 1548.0), (19_000.0, 1536.0)],
                },
                Series {
                    name: "Nchan <nginx>".into(),
                    points: vec![(19_000.0, 11_000.0), (1000.0, 12_000.0)],
                },
            ],
        }
    }

    #[test]
    fn round_steps() {
        assert_eq!(round_step(3800.0), 5000.0);
        assert_eq!(round_step(2400.0), 2500.0);
        assert_eq!(round_step(2000.0), 2000.0);
        assert_eq!(round_step(0.13), 0.2);
        assert_eq!(round_step(0.0), 1.0);
        let a = Axis::covering(0.0, 19_000.0);
        assert_eq!((a.lo, a.hi, a.step), (0.0, 20_000.0, 5000.0));
        assert_eq!(a.ticks(), vec![0.0, 5000.0, 10_000.0, 15_000.0, 20_000.0]);
        let neg = Axis::covering(-300.0, 1200.0);
        assert_eq!((neg.lo, neg.hi, neg.step), (-500.0, 1500.0, 500.0));
        let flat = Axis::covering(0.0, 0.0);
        assert!(flat.hi > flat.lo);
    }

    #[test]
    fn scales_points_into_the_plot_area() {
        let (xa, ya) = axes(&chart());
        assert_eq!((xa.hi, ya.hi), (20_000.0, 12_500.0));
        // Origin at the bottom left of the plot, the axes' maxima at the top right.
        assert_eq!(to_px(&xa, &ya, 0.0, 0.0), (LEFT, HEIGHT - BOTTOM));
        assert_eq!(to_px(&xa, &ya, xa.hi, ya.hi), (WIDTH - RIGHT, TOP));
        let (x, y) = to_px(&xa, &ya, 10_000.0, 6250.0);
        assert!((x - (LEFT + (WIDTH - LEFT - RIGHT) / 2.0)).abs() < 1e-9);
        assert!((y - (TOP + (HEIGHT - TOP - BOTTOM) / 2.0)).abs() < 1e-9);
    }

    #[test]
    fn one_polyline_per_series() {
        let c = chart();
        let doc = svg(&c);
        assert!(doc.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(doc.trim_end().ends_with("</svg>"));
        let polylines: Vec<&str> = doc.lines().filter(|l| l.starts_with("<polyline")).collect();
        assert_eq!(polylines.len(), 2);
        for (line, series) in polylines.iter().zip(&c.series) {
            let points = line.split("points=\"").nth(1).unwrap().split('"').next().unwrap();
            assert_eq!(points.split(' ').count(), series.points.len());
        }
        // Drawn in x order: Nchan's 1,000 point comes first.
        let (xa, ya) = axes(&c);
        let (x, y) = to_px(&xa, &ya, 1000.0, 12_000.0);
        assert!(polylines[1].contains(&format!("points=\"{x:.1},{y:.1} ")));
        assert_eq!(doc.matches("<circle").count(), 5);
        assert!(doc.contains("Nchan &lt;nginx&gt;"));
        assert!(doc.contains(">server RSS bytes / stream</text>"));
        assert!(doc.contains(">20,000</text>"));
        assert!(doc.contains(">1,536</text>"));
        // Point labels are whole numbers.
        let with_fraction = Chart {
            series: vec![Series {
                name: "s".into(),
                points: vec![(100.0, 1679.4)],
            }],
            ..chart()
        };
        assert!(svg(&with_fraction).contains(">1,679</text>"));
    }
}
