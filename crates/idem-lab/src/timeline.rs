//! One intent in time, drawn as swimlanes in hand-written SVG: its attempts
//! as the client saw them (sent, waited, answered or timed out), the
//! acquirer's captures and, where a teaching server kept them, its checks and
//! inserts. The demo draws a few telling intents per strategy
//! (`demo::samples`); `idem-lab verify` draws each intent that broke an
//! invariant. All text in the SVG is escaped; it needs no script, font or
//! file from anywhere.

use std::fmt::Write as _;

/// Which part of the workload an intent belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntentKind {
    /// One client that times out and retries on the next instance.
    Retried,
    /// Simultaneous duplicates from several clients, one key.
    Burst,
}

/// How an attempt ended, as the client saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptEnd {
    Status(u16),
    Timeout,
    /// The connection failed.
    Failed,
}

/// One attempt on the strategy's clock (milliseconds since its workload began).
#[derive(Debug, Clone)]
pub struct AttemptSpan {
    /// Which of the burst's clients sent it (0 for a retried intent).
    pub copy: usize,
    /// Its place among that client's attempts, from 0.
    pub number: usize,
    /// Which instance it went to (0, 1, 2: shown as A, B, C).
    pub instance: usize,
    pub sent_ms: f64,
    pub ended_ms: f64,
    pub end: AttemptEnd,
}

/// What a teaching server did for a key, when it did it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerStep {
    /// check-then-act's select found no row for the key.
    CheckedEmpty,
    /// Its insert of the key returned.
    Inserted,
}

/// One intent's story.
#[derive(Debug, Clone)]
pub struct IntentTrace {
    pub kind: IntentKind,
    pub order_id: i64,
    pub attempts: Vec<AttemptSpan>,
    /// When the acquirer moved the money, once per capture.
    pub captures_ms: Vec<f64>,
    /// The teaching server's steps (empty for idem, which keeps no such log).
    pub server: Vec<(ServerStep, f64)>,
}

impl IntentTrace {
    pub fn checks_before_first_insert(&self) -> usize {
        let first_insert = self
            .server
            .iter()
            .filter(|(s, _)| *s == ServerStep::Inserted)
            .map(|(_, at)| *at)
            .fold(f64::INFINITY, f64::min);
        self.server
            .iter()
            .filter(|(s, at)| *s == ServerStep::CheckedEmpty && *at <= first_insert)
            .count()
    }

    /// A retry (not a first attempt) that the client gave up on.
    pub fn has_retry_timed_out(&self) -> bool {
        self.attempts
            .iter()
            .any(|a| a.number > 0 && a.end == AttemptEnd::Timeout)
    }

    pub fn has_status(&self, status: u16) -> bool {
        self.attempts
            .iter()
            .any(|a| a.end == AttemptEnd::Status(status))
    }
}

/// The most lanes a sample shows: more would not fit a screen.
const MAX_LANES: usize = 12;

/// Roughly how wide a character of the 12 px labels is, to leave a label out
/// rather than draw it over the next attempt.
const CHAR_W: f64 = 7.0;

/// Width of a timeline, in px: fits a 1280 px window beside the page margins.
const WIDTH: f64 = 940.0;
/// Where the time axis starts (the lane labels are to its left).
const PLOT_X: f64 = 150.0;
/// Where it ends (room after it for the last answer's label).
const PLOT_END: f64 = WIDTH - 70.0;
const LANE_H: f64 = 22.0;
const TOP: f64 = 8.0;
const AXIS_H: f64 = 28.0;

const TIMEOUT_COLOUR: &str = "#7f8c8d";
const CONFLICT_COLOUR: &str = "#d68910";
const OK_COLOUR: &str = "#1e8449";
const OTHER_COLOUR: &str = "#8e44ad";
const CAPTURE_COLOUR: &str = "#c0392b";
const CHECK_COLOUR: &str = "#2471a3";

/// The legend, once above all the timelines; with the teaching server's
/// marks when `server_steps` (the demo), without them for verify.
pub fn legend(server_steps: bool) -> String {
    let mut items: Vec<(&str, String)> = vec![
        ("attempt answered", bar(0.0, 8.0, 30.0, OK_COLOUR, "")),
        (
            "409: in flight, try later",
            bar(0.0, 8.0, 30.0, CONFLICT_COLOUR, ""),
        ),
        (
            "timed out at the client",
            bar(0.0, 8.0, 30.0, TIMEOUT_COLOUR, "4 3"),
        ),
        ("capture at the acquirer", diamond(15.0, 14.0)),
        ("check found no row", circle(15.0, 14.0)),
        ("insert", square(15.0, 14.0)),
        (
            "window: checked before any insert",
            window_rect(0.0, 30.0, 6.0, 16.0),
        ),
    ];
    if !server_steps {
        items.truncate(4);
    }
    let height = if items.len() > 4 { 44 } else { 22 };
    let mut svg = format!(
        "<svg class=\"legend\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" role=\"img\" font-size=\"12\">"
    );
    for (i, (label, mark)) in items.iter().enumerate() {
        let (x, y) = (
            f64::from((i % 4) as u8) * 232.0,
            if i < 4 { 0.0 } else { 22.0 },
        );
        let _ = write!(
            svg,
            "<g transform=\"translate({x},{y})\">{mark}<text x=\"36\" y=\"18\">{}</text></g>",
            escape(label)
        );
    }
    svg.push_str("</svg>");
    svg
}

fn bar(x: f64, y: f64, w: f64, colour: &str, dash: &str) -> String {
    let dash = if dash.is_empty() {
        String::new()
    } else {
        format!(" stroke-dasharray=\"{dash}\" fill-opacity=\"0.25\" stroke=\"{colour}\"")
    };
    format!(
        "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{w:.1}\" height=\"10\" fill=\"{colour}\"{dash}/>"
    )
}

fn diamond(x: f64, y: f64) -> String {
    format!(
        "<path class=\"capture\" d=\"M{:.1},{:.1} l6,6 l-6,6 l-6,-6 z\" fill=\"{CAPTURE_COLOUR}\"/>",
        x,
        y - 6.0
    )
}

fn circle(x: f64, y: f64) -> String {
    format!(
        "<circle class=\"check\" cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"4.5\" fill=\"#fff\" stroke=\"{CHECK_COLOUR}\" stroke-width=\"2\"/>"
    )
}

fn square(x: f64, y: f64) -> String {
    format!(
        "<rect class=\"insert\" x=\"{:.1}\" y=\"{:.1}\" width=\"9\" height=\"9\" fill=\"{CHECK_COLOUR}\"/>",
        x - 4.5,
        y - 4.5
    )
}

fn window_rect(x: f64, w: f64, y: f64, h: f64) -> String {
    format!(
        "<rect class=\"window\" x=\"{x:.1}\" y=\"{y:.1}\" width=\"{w:.1}\" height=\"{h:.1}\" fill=\"{CAPTURE_COLOUR}\" fill-opacity=\"0.12\"/>"
    )
}

/// A tick step giving at most about ten ticks over `span` ms.
fn tick_step(span: f64) -> f64 {
    [
        10.0, 20.0, 50.0, 100.0, 200.0, 250.0, 500.0, 1000.0, 2000.0, 5000.0,
    ]
    .into_iter()
    .find(|s| span / s <= 10.0)
    .unwrap_or(10_000.0)
}

/// One sample as a figure, on one time axis: for a retried intent a lane per
/// attempt; for a burst a lane per client, its attempts in a row; then one
/// lane for the database's steps (check-then-act only) and one for the
/// acquirer's captures.
pub fn sample_svg(caption: &str, group: &str, t: &IntentTrace) -> String {
    let mut attempts: Vec<&AttemptSpan> = t.attempts.iter().collect();
    attempts.sort_by(|a, b| a.sent_ms.total_cmp(&b.sent_ms));
    let mut lanes: Vec<(String, Vec<&AttemptSpan>)> = match t.kind {
        IntentKind::Retried => attempts
            .iter()
            .map(|a| {
                let label = format!("attempt {} → {}", a.number + 1, instance_name(a.instance));
                (label, vec![*a])
            })
            .collect(),
        IntentKind::Burst => {
            let clients = attempts.iter().map(|a| a.copy + 1).max().unwrap_or(0);
            (0..clients)
                .map(|copy| {
                    let mine: Vec<&AttemptSpan> = attempts
                        .iter()
                        .copied()
                        .filter(|a| a.copy == copy)
                        .collect();
                    let first = mine.first().map_or(0, |a| a.instance);
                    let label = format!("client {}, from {}", copy + 1, instance_name(first));
                    (label, mine)
                })
                .collect()
        }
    };
    // Too many lanes: the first ones and the last, which holds the final answer.
    let hidden = lanes.len().saturating_sub(MAX_LANES);
    if hidden > 0 {
        let last = lanes.split_off(MAX_LANES - 1).pop();
        lanes.extend(last);
    }
    let shown = lanes.iter().flat_map(|(_, l)| l.iter());
    let start = shown
        .clone()
        .map(|a| a.sent_ms)
        .chain(t.server.iter().map(|(_, at)| *at))
        .fold(f64::INFINITY, f64::min);
    let end = shown
        .map(|a| a.ended_ms)
        .chain(t.captures_ms.iter().copied())
        .chain(t.server.iter().map(|(_, at)| *at))
        .fold(start, f64::max);
    let step = tick_step(end - start);
    let origin = (start / step).floor() * step;
    let span = (((end - origin) / step).ceil() * step).max(step);
    let x = |ms: f64| PLOT_X + (ms - origin) / span * (PLOT_END - PLOT_X);
    let db_lane = !t.server.is_empty();
    let rows = lanes.len() + usize::from(db_lane) + 1;
    let height = TOP + rows as f64 * LANE_H + AXIS_H;

    let mut svg = format!(
        "<figure class=\"sample\"><figcaption>{}</figcaption>\
         <svg class=\"timeline\" data-strategy=\"{}\" data-order=\"{}\" data-captures=\"{}\" \
         xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height:.0}\" role=\"img\" font-size=\"12\">",
        escape(caption),
        escape(group),
        t.order_id,
        t.captures_ms.len(),
    );
    // Grid and axis first, so the marks sit on top.
    let axis_y = TOP + rows as f64 * LANE_H;
    let mut tick = origin;
    while tick <= origin + span + 0.5 {
        let tx = x(tick);
        let _ = write!(
            svg,
            "<line x1=\"{tx:.1}\" y1=\"{TOP}\" x2=\"{tx:.1}\" y2=\"{axis_y:.1}\" stroke=\"#eee\"/>\
             <text x=\"{tx:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#555\">{} ms</text>",
            axis_y + 16.0,
            tick.round()
        );
        tick += step;
    }
    let _ = write!(
        svg,
        "<line x1=\"{PLOT_X}\" y1=\"{axis_y:.1}\" x2=\"{PLOT_END}\" y2=\"{axis_y:.1}\" stroke=\"#555\"/>"
    );

    // The race's window: from the first check that found nothing to the first insert.
    let first = |step: ServerStep| {
        t.server
            .iter()
            .filter(|(s, _)| *s == step)
            .map(|(_, at)| *at)
            .fold(f64::INFINITY, f64::min)
    };
    let (check, insert) = (first(ServerStep::CheckedEmpty), first(ServerStep::Inserted));
    if t.checks_before_first_insert() > 1 && insert.is_finite() {
        let (x0, x1) = (x(check), x(insert));
        svg.push_str(&window_rect(
            x0,
            (x1 - x0).max(2.0),
            TOP,
            rows as f64 * LANE_H,
        ));
    }

    for (i, (label, spans)) in lanes.iter().enumerate() {
        let y = TOP + i as f64 * LANE_H;
        let _ = write!(
            svg,
            "<g class=\"lane attempt\"><text x=\"0\" y=\"{:.1}\">{}</text>",
            y + 15.0,
            escape(label)
        );
        for (j, a) in spans.iter().enumerate() {
            let (colour, dash, text) = match a.end {
                AttemptEnd::Status(201) => (OK_COLOUR, "", "201".to_owned()),
                AttemptEnd::Status(409) => (CONFLICT_COLOUR, "", "409".to_owned()),
                AttemptEnd::Status(s) => (OTHER_COLOUR, "", s.to_string()),
                AttemptEnd::Timeout => (TIMEOUT_COLOUR, "4 3", "timed out".to_owned()),
                AttemptEnd::Failed => (OTHER_COLOUR, "4 3", "failed".to_owned()),
            };
            let (x0, x1) = (x(a.sent_ms), x(a.ended_ms));
            svg.push_str(&bar(x0, y + 6.0, (x1 - x0).max(2.0), colour, dash));
            // A label only where it does not run into the lane's next attempt.
            let room = spans
                .get(j + 1)
                .map_or(f64::INFINITY, |next| x(next.sent_ms) - x1);
            if room >= text.len() as f64 * CHAR_W + 6.0 {
                let _ = write!(
                    svg,
                    "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"{colour}\">{}</text>",
                    x1 + 4.0,
                    y + 15.0,
                    escape(&text)
                );
            }
        }
        svg.push_str("</g>");
    }
    let mut y = TOP + lanes.len() as f64 * LANE_H;
    if db_lane {
        let _ = write!(
            svg,
            "<g class=\"lane database\"><text x=\"0\" y=\"{:.1}\">database</text>",
            y + 15.0
        );
        for (step, at) in &t.server {
            svg.push_str(&match step {
                ServerStep::CheckedEmpty => circle(x(*at), y + 11.0),
                ServerStep::Inserted => square(x(*at), y + 11.0),
            });
        }
        svg.push_str("</g>");
        y += LANE_H;
    }
    let _ = write!(
        svg,
        "<g class=\"lane acquirer\"><text x=\"0\" y=\"{:.1}\">acquirer</text>",
        y + 15.0
    );
    for at in &t.captures_ms {
        svg.push_str(&diamond(x(*at), y + 11.0));
    }
    svg.push_str("</g></svg>");
    if hidden > 0 {
        let _ = write!(
            svg,
            "<p class=\"note\">{hidden} lanes before the last are left out</p>"
        );
    }
    svg.push_str("</figure>");
    svg
}

/// An instance by its place: A, B, C, then numbers.
pub fn instance_name(i: usize) -> String {
    const NAMES: [&str; 3] = ["A", "B", "C"];
    NAMES
        .get(i)
        .map_or_else(|| (i + 1).to_string(), |n| (*n).to_owned())
}

/// Text made safe inside HTML and SVG, in an element or a quoted attribute.
pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn span(
        copy: usize,
        number: usize,
        sent: f64,
        ended: f64,
        end: AttemptEnd,
    ) -> AttemptSpan {
        AttemptSpan {
            copy,
            number,
            instance: number % 3,
            sent_ms: sent,
            ended_ms: ended,
            end,
        }
    }

    pub(crate) fn trace(order_id: i64, attempts: Vec<AttemptSpan>, captures: usize) -> IntentTrace {
        IntentTrace {
            kind: IntentKind::Retried,
            order_id,
            attempts,
            captures_ms: vec![600.0; captures],
            server: Vec::new(),
        }
    }

    #[test]
    fn a_long_story_keeps_its_last_lane() {
        let mut attempts: Vec<AttemptSpan> = (0..20)
            .map(|n| {
                let sent = n as f64 * 270.0;
                span(0, n, sent, sent + 250.0, AttemptEnd::Timeout)
            })
            .collect();
        attempts.push(span(0, 20, 5400.0, 5401.0, AttemptEnd::Status(201)));
        let svg = sample_svg("order 4", "test", &trace(4, attempts, 1));
        assert_eq!(svg.matches("class=\"lane attempt\"").count(), MAX_LANES);
        assert!(svg.contains("attempt 21 →") && svg.contains(">201</text>"));
        assert!(svg.contains("9 lanes before the last are left out"));
    }

    #[test]
    fn text_is_escaped() {
        assert_eq!(escape("<a & \"b\">"), "&lt;a &amp; &quot;b&quot;&gt;");
    }
}
