//! The demo's HTML report: the same figures as the table, as bar charts, where
//! each figure comes from on the store the run used, and a few intents drawn as
//! a timeline ([`super::timeline`]); one self-contained file (inline SVG, no
//! script, nothing fetched).

use std::fmt::Write as _;
use std::path::Path;

use super::samples;
use super::{DemoReport, Strategy, StrategyResult};
use crate::timeline::{self, escape};

/// Bar colours per strategy, in the order the demo runs them.
const COLOURS: [&str; 3] = ["#c0392b", "#d68910", "#1e8449"];

/// One chart: a title and one value per strategy.
struct Chart {
    title: &'static str,
    unit: &'static str,
    value: fn(&StrategyResult) -> f64,
}

const CHARTS: [Chart; 5] = [
    Chart {
        title: "Captures at the acquirer (intents are the grey line)",
        unit: "",
        value: |s| s.captures as f64,
    },
    Chart {
        title: "Intents charged more than once",
        unit: "",
        value: |s| s.double_charged as f64,
    },
    Chart {
        title: "Retry latency, p99",
        unit: " ms",
        value: |s| s.retry_p99_ms,
    },
    Chart {
        title: "Most connections busy at once",
        unit: "",
        value: |s| s.max_busy_connections as f64,
    },
    Chart {
        title: "Requests that waited on a row lock (over a quarter of an acquirer call)",
        unit: "",
        value: |s| s.lock_waits as f64,
    },
];

pub fn write_html(report: &DemoReport, path: &Path) -> std::io::Result<()> {
    std::fs::write(path, html(report))
}

fn html(report: &DemoReport) -> String {
    let mut out = String::from(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>idem-lab demo</title>\
         <style>body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;color:#222}\
         table{border-collapse:collapse}td,th{padding:.3rem .7rem;border-bottom:1px solid #ddd;text-align:right}\
         td:first-child,th:first-child{text-align:left}.charts{display:flex;flex-wrap:wrap;gap:1.5rem}\
         figure{margin:0 0 1rem}figcaption{font-size:.9rem;margin-bottom:.3rem}.note{font-size:.8rem;color:#555;margin:0}</style></head><body>\
         <h1>idem-lab demo: one retry, three strategies</h1>\
         <p>Each strategy got the same workload: intents whose client timed out while the first \
         attempt was still at the acquirer and retried on another instance, plus bursts of \
         simultaneous duplicates.</p>",
    );
    out.push_str(&sources(report.store));
    out.push_str(
        "<table><tr><th>strategy</th>\
         <th>intents</th><th>captures</th><th>double charged</th><th>retry p50</th><th>retry p99</th>\
         <th>busy connections</th><th>lock waits</th></tr>",
    );
    for s in &report.strategies {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.1} ms</td><td>{:.1} ms</td><td>{}</td><td>{}</td></tr>",
            escape(s.name), s.intents, s.captures, s.double_charged, s.retry_p50_ms, s.retry_p99_ms,
            s.max_busy_connections, s.lock_waits
        );
    }
    out.push_str("</table><ul>");
    for s in &report.strategies {
        let _ = write!(
            out,
            "<li><b>{}</b>: {}</li>",
            escape(s.name),
            escape(&s.verdict)
        );
    }
    out.push_str("</ul>");
    // The story first, then the same figures as the table, as bars.
    out.push_str(&timelines(report));
    out.push_str("<h2>The figures</h2><div class=\"charts\">");
    for chart in &CHARTS {
        out.push_str(&bar_chart(report, chart));
    }
    out.push_str("</div></body></html>\n");
    out
}

/// Where each figure comes from, on the store the run used.
fn sources(store: &str) -> String {
    let (busy, locks) = if store == "postgres" {
        (
            "<code>pg_stat_activity</code>: the most of the strategy's connections seen \
             active or idle in a transaction at once",
            "<code>pg_stat_activity</code>: requests seen waiting on a lock \
             (<code>wait_event_type = 'Lock'</code>) for more than a quarter of an acquirer call",
        )
    } else {
        (
            "the servers' own pools (connections checked out, for the teaching strategies in \
             this process; <code>/metrics</code>' <code>idem_db_pool_connections</code> for idem's \
             instances): SQLite has no view of its clients",
            "a probe of SQLite's one write lock: it tries <code>begin immediate</code> every \
             5 ms; one transaction seen holding the lock for more than a quarter of an acquirer \
             call counts once (on SQLite that lock stalls every writer, of any key)",
        )
    };
    let name = if store == "postgres" {
        "PostgreSQL"
    } else {
        "SQLite"
    };
    format!(
        "<p>This run used <b>{name}</b>. Where the figures come from: <b>captures</b> and \
         <b>double charged</b>, the acquirer simulator's ledger; <b>retry</b> latencies, the \
         client's own clock; <b>busy connections</b>, {busy}; <b>lock waits</b>, {locks}.</p>"
    )
}

/// The timelines: a legend, then each strategy's samples.
fn timelines(report: &DemoReport) -> String {
    let mut out = String::from(
        "<h2>The race in time</h2><p>A few intents of each strategy, picked from this run: \
         one lane per attempt as the client saw it (sent, waited, answered or timed out), the \
         acquirer's captures below them and, under check-then-act, the server's checks and \
         inserts. A, B, C are the three instances; time is in ms since the strategy's workload \
         began.</p>",
    );
    out.push_str(&timeline::legend(true));
    for s in &report.strategies {
        let Some(strategy) = Strategy::from_name(s.name) else {
            continue;
        };
        let _ = write!(out, "<h3>{}</h3>", escape(s.name));
        for sample in &s.samples {
            out.push_str(&samples::sample_svg(strategy, sample));
        }
    }
    out
}

fn bar_chart(report: &DemoReport, chart: &Chart) -> String {
    const W: f64 = 280.0;
    const BAR: f64 = 26.0;
    const GAP: f64 = 12.0;
    let label_w = 120.0;
    let values: Vec<f64> = report.strategies.iter().map(chart.value).collect();
    let intents = report
        .strategies
        .iter()
        .map(|s| s.intents as f64)
        .fold(0.0, f64::max);
    let is_captures = chart.title.starts_with("Captures");
    let max = values
        .iter()
        .copied()
        .fold(if is_captures { intents } else { 0.0 }, f64::max)
        .max(1.0);
    let height = (BAR + GAP) * values.len() as f64 + GAP;
    let mut svg = format!(
        "<figure><figcaption>{}</figcaption><svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{height}\" role=\"img\">",
        escape(chart.title),
        label_w + W + 70.0
    );
    for (i, (s, v)) in report.strategies.iter().zip(&values).enumerate() {
        let y = GAP + i as f64 * (BAR + GAP);
        let w = (v / max * W).max(1.0);
        let _ = write!(
            svg,
            "<text x=\"0\" y=\"{:.0}\" font-size=\"12\">{}</text>\
             <rect x=\"{label_w}\" y=\"{y:.0}\" width=\"{w:.1}\" height=\"{BAR}\" fill=\"{}\"/>\
             <text x=\"{:.1}\" y=\"{:.0}\" font-size=\"12\">{}{}</text>",
            y + BAR * 0.65,
            escape(s.name),
            COLOURS[i % COLOURS.len()],
            label_w + w + 4.0,
            y + BAR * 0.65,
            trim(*v),
            chart.unit
        );
    }
    if is_captures {
        let x = label_w + intents / max * W;
        let _ = write!(svg, "<line x1=\"{x:.1}\" y1=\"0\" x2=\"{x:.1}\" y2=\"{height}\" stroke=\"#888\" stroke-dasharray=\"4\"/>");
    }
    svg.push_str("</svg></figure>");
    svg
}

fn trim(v: f64) -> String {
    if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}
