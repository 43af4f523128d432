//! Line charts as inline SVG, for the bench's self-contained HTML pages
//! (`--sweep`, `--arrival`): one panel per figure, a line per series.

use std::fmt::Write as _;

/// Each panel's size and margins, in SVG units.
const WIDTH: f64 = 520.0;
const HEIGHT: f64 = 300.0;
const MARGIN: f64 = 56.0;
/// Room on the right for the series' names.
const RIGHT: f64 = 135.0;

/// One line: its name, its colour, its points (x, y) in the data's units.
pub(crate) struct Series<'a> {
    pub(crate) name: &'a str,
    pub(crate) colour: &'a str,
    pub(crate) points: Vec<(f64, f64)>,
}

/// What a panel shows besides its lines.
pub(crate) struct Axes<'a> {
    pub(crate) title: &'a str,
    pub(crate) x_label: &'a str,
    /// The x positions to label, with their labels (the points' x values
    /// are placed on the same scale).
    pub(crate) x_ticks: Vec<(f64, String)>,
    /// Draw y on a log scale (for latencies that span decades).
    pub(crate) log_y: bool,
    /// A dashed horizontal line at this y, with its label (a threshold).
    pub(crate) rule: Option<(f64, &'a str)>,
}

/// The least room between two x labels' centres.
const MIN_TICK_GAP: f64 = 34.0;

/// The smallest y a log scale shows: anything lower is drawn there.
const LOG_FLOOR: f64 = 0.1;

/// One panel as an `<svg>` element.
pub(crate) fn panel(axes: &Axes, series: &[Series]) -> String {
    let xs = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .chain(axes.x_ticks.iter().map(|t| t.0));
    let (x_min, x_max) = xs.fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(x), hi.max(x)));
    let y_top = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .chain(axes.rule.map(|r| r.0))
        .fold(0.0_f64, f64::max)
        .max(f64::MIN_POSITIVE);
    let scale = |y: f64| {
        if axes.log_y {
            y.max(LOG_FLOOR).log10()
        } else {
            y
        }
    };
    let (y_lo, y_hi) = if axes.log_y {
        (LOG_FLOOR.log10(), scale(y_top).ceil().max(0.0))
    } else {
        (0.0, y_top * 1.1)
    };
    let x_at = |x: f64| {
        let span = (x_max - x_min).max(f64::MIN_POSITIVE);
        let x = if x_max > x_min {
            (x - x_min) / span
        } else {
            0.5
        };
        MARGIN + x * (WIDTH - MARGIN - RIGHT)
    };
    let y_at = |y: f64| {
        let span = (y_hi - y_lo).max(f64::MIN_POSITIVE);
        HEIGHT - MARGIN - (scale(y) - y_lo) / span * (HEIGHT - 2.0 * MARGIN)
    };
    let title = axes.title;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" \
         viewBox=\"0 0 {WIDTH} {HEIGHT}\" role=\"img\" aria-label=\"{title}\">\
         <text x=\"{MARGIN}\" y=\"20\" font-weight=\"bold\">{title}</text>\
         <line x1=\"{MARGIN}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"#888\"/>\
         <line x1=\"{MARGIN}\" y1=\"{MARGIN}\" x2=\"{MARGIN}\" y2=\"{b}\" stroke=\"#888\"/>\
         <text x=\"{cx}\" y=\"{lx}\" text-anchor=\"middle\">{x_label}</text>",
        b = HEIGHT - MARGIN,
        r = WIDTH - RIGHT,
        cx = (WIDTH - RIGHT + MARGIN) / 2.0,
        lx = HEIGHT - 14.0,
        x_label = axes.x_label,
    );
    // A label too close to the last one drawn is left out (its point stays).
    let mut last_label = f64::MIN;
    for (x, label) in &axes.x_ticks {
        let at = x_at(*x);
        if at - last_label < MIN_TICK_GAP {
            continue;
        }
        last_label = at;
        let _ = write!(
            svg,
            "<text x=\"{at:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{label}</text>",
            HEIGHT - MARGIN + 18.0,
        );
    }
    let y_ticks: Vec<f64> = if axes.log_y {
        let decades = (y_hi - y_lo).round() as i32;
        (0..=decades)
            .map(|d| 10f64.powf(y_lo + f64::from(d)))
            .collect()
    } else {
        (0..=4).map(|step| y_top * f64::from(step) / 4.0).collect()
    };
    for y in y_ticks {
        let label = if y >= 100.0 || y == 0.0 {
            format!("{y:.0}")
        } else {
            format!("{y:.1}")
        };
        let _ = write!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{label}</text>",
            MARGIN - 6.0,
            y_at(y) + 4.0,
        );
    }
    if let Some((y, label)) = axes.rule {
        let _ = write!(
            svg,
            "<line x1=\"{MARGIN}\" y1=\"{y:.1}\" x2=\"{r}\" y2=\"{y:.1}\" stroke=\"#999\" \
             stroke-dasharray=\"4 3\"/><text x=\"{lx:.1}\" y=\"{ly:.1}\" fill=\"#666\">{label}</text>",
            y = y_at(y),
            r = WIDTH - RIGHT,
            lx = WIDTH - RIGHT + 6.0,
            ly = y_at(y) + 4.0,
        );
    }
    for s in series.iter().filter(|s| !s.points.is_empty()) {
        let points: Vec<(f64, f64)> = s.points.iter().map(|(x, y)| (x_at(*x), y_at(*y))).collect();
        let path: Vec<String> = points
            .iter()
            .map(|(x, y)| format!("{x:.1},{y:.1}"))
            .collect();
        let _ = write!(
            svg,
            "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\" points=\"{}\"/>",
            s.colour,
            path.join(" ")
        );
        for (x, y) in &points {
            let _ = write!(
                svg,
                "<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"3\" fill=\"{}\"/>",
                s.colour
            );
        }
        let (lx, ly) = points[points.len() - 1];
        let _ = write!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"{}\">{}</text>",
            lx + 6.0,
            ly + 4.0,
            s.colour,
            s.name
        );
    }
    svg.push_str("</svg>");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    fn axes(log_y: bool) -> Axes<'static> {
        Axes {
            title: "t",
            x_label: "x",
            x_ticks: vec![(1.0, "1".into()), (2.0, "2".into())],
            log_y,
            rule: Some((25.0, "25 ms")),
        }
    }

    #[test]
    fn each_series_with_points_is_a_line_with_a_dot_per_point() {
        let svg = panel(
            &axes(false),
            &[
                Series {
                    name: "a",
                    colour: "#111",
                    points: vec![(1.0, 1.0), (2.0, 3.0)],
                },
                Series {
                    name: "b",
                    colour: "#222",
                    points: vec![],
                },
            ],
        );
        assert_eq!(svg.matches("<polyline").count(), 1, "{svg}");
        assert_eq!(svg.matches("<circle").count(), 2, "{svg}");
        assert!(svg.contains("stroke-dasharray"), "the rule: {svg}");
    }

    #[test]
    fn a_log_scale_puts_each_decade_the_same_height_apart() {
        let svg = panel(
            &axes(true),
            &[Series {
                name: "a",
                colour: "#111",
                points: vec![(1.0, 1.0), (2.0, 1000.0)],
            }],
        );
        for tick in [">0.1<", ">1.0<", ">10.0<", ">100<", ">1000<"] {
            assert!(svg.contains(tick), "{tick}: {svg}");
        }
    }
}
