//! The Charts page: failure records opened and closed per hour by kind over the last day, read
//! from the records; the queue's depth and its oldest ready job's wait, from samples this
//! process takes on a timer (kept 24 hours in memory). Drawn on the server as inline SVG, with
//! every text escaped here and counts on hover through `<title>` elements: no script.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use askama::Template;
use axum::Router;
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::get;
use chrono::{DateTime, DurationRound, TimeDelta, Timelike, Utc};
use redrive_core::{Counts, FailureRecord, RecordState};

use crate::filter::Filter;
use crate::pages::{READ_AT_MOST, Shared, frame, matching, render};
use crate::views::{Frame, duration};
use crate::{App, Records};

/// Hours the charts cover: the current one and the 23 before it.
const HOURS: usize = 24;
/// Kinds drawn in a colour of their own; the rest share one ("other kinds").
const COLOURS: [&str; 7] = ["#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#8c7a00"];
const OTHER_COLOUR: &str = "#8a8f98";
/// Columns of a line chart: each shows the highest sample of its 5 minutes.
const COLUMNS: usize = 288;

pub(crate) fn routes<B: Records>() -> Router<Arc<App<B>>> {
    Router::new().route("/charts", get(page::<B>))
}

/// `text` for SVG or HTML text and attribute values, as askama escapes it.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&#38;"),
            '<' => out.push_str("&#60;"),
            '>' => out.push_str("&#62;"),
            '"' => out.push_str("&#34;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// When a record left open; `None` while open.
fn closed_at(state: &RecordState) -> Option<DateTime<Utc>> {
    match state {
        RecordState::Open => None,
        RecordState::Replaying { at, .. }
        | RecordState::Confirmed { at, .. }
        | RecordState::FailedAgain { at, .. }
        | RecordState::Discarded { at, .. } => Some(*at),
    }
}

/// Records opened and closed per hour, by kind: `[hour]` counts, the first hour starting at
/// `start`.
#[derive(Debug, PartialEq)]
struct Hourly {
    start: DateTime<Utc>,
    opened: BTreeMap<String, [u64; HOURS]>,
    closed: BTreeMap<String, [u64; HOURS]>,
}

impl Hourly {
    /// The hours up to `now`'s: a record opened when it was written (`last_failed_at`), closed
    /// when it was replayed or discarded. Times outside those 24 hours are left out.
    fn of(records: &[FailureRecord], now: DateTime<Utc>) -> Self {
        let this_hour = now.duration_trunc(TimeDelta::hours(1)).unwrap_or(now);
        let start = this_hour - TimeDelta::hours(HOURS as i64 - 1);
        let hour = |at: DateTime<Utc>| {
            let h = (at - start).num_seconds().div_euclid(3600);
            usize::try_from(h).ok().filter(|h| *h < HOURS)
        };
        let mut hourly = Self { start, opened: BTreeMap::new(), closed: BTreeMap::new() };
        for r in records {
            if let Some(h) = hour(r.last_failed_at) {
                hourly.opened.entry(r.kind.clone()).or_insert([0; HOURS])[h] += 1;
            }
            if let Some(h) = closed_at(&r.state).and_then(hour) {
                hourly.closed.entry(r.kind.clone()).or_insert([0; HOURS])[h] += 1;
            }
        }
        hourly
    }
}

/// A chart's top: its highest value rounded up to 2, 4, 6, 8 or 10 times a power of ten (at
/// least 2), so that the gridline halfway is a whole number too.
fn nice_max(max: f64) -> f64 {
    let mut step = 1.0;
    loop {
        for m in [2.0, 4.0, 6.0, 8.0, 10.0] {
            if max <= step * m {
                return step * m;
            }
        }
        step *= 10.0;
    }
}

// The drawing area of every chart, in SVG units (the SVG scales to the page's width).
const WIDTH: f64 = 800.0;
const LEFT: f64 = 48.0;
const RIGHT: f64 = 12.0;
const TOP: f64 = 34.0;
const PLOT: f64 = 170.0;
const HEIGHT: f64 = TOP + PLOT + 26.0;

/// An SVG's opening tag and the y axis (gridlines at 0, half and the top, labelled by `label`).
fn frame_svg(out: &mut String, id: &str, what: &str, top: f64, label: impl Fn(f64) -> String) {
    let _ = write!(
        out,
        r##"<svg id="{id}" class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{}" font-family="system-ui, sans-serif" font-size="12">"##,
        escape(what)
    );
    for part in [0.0, 0.5, 1.0] {
        let y = TOP + PLOT * (1.0 - part);
        let _ = write!(
            out,
            r##"<line x1="{LEFT}" x2="{}" y1="{y}" y2="{y}" stroke="{}"/><text x="{}" y="{}" text-anchor="end" fill="#5d6470">{}</text>"##,
            WIDTH - RIGHT,
            if part == 0.0 { "#9aa0aa" } else { "#e3e6eb" },
            LEFT - 6.0,
            y + 4.0,
            escape(&label(top * part))
        );
    }
}

/// An hour's label under the x axis at `x`: `14:00`.
fn hour_label(out: &mut String, x: f64, at: DateTime<Utc>) {
    let _ = write!(
        out,
        r##"<text class="hour" x="{x:.1}" y="{}" text-anchor="middle" fill="#5d6470">{:02}:00</text>"##,
        TOP + PLOT + 18.0,
        at.hour()
    );
}

/// What stands for the kinds past the seventh.
const OTHER: &str = "other kinds";

/// The bars' kinds and colours, busiest first (opened and closed together), so that a kind has
/// the same colour in both charts; past seven kinds the quietest share one, [`OTHER`].
fn legend(hourly: &Hourly) -> Vec<(String, &'static str)> {
    let mut totals: BTreeMap<&str, u64> = BTreeMap::new();
    for (kind, counts) in hourly.opened.iter().chain(&hourly.closed) {
        *totals.entry(kind).or_default() += counts.iter().sum::<u64>();
    }
    let mut kinds: Vec<(&str, u64)> = totals.into_iter().collect();
    kinds.sort_by_key(|(kind, n)| (std::cmp::Reverse(*n), *kind));
    let fold = kinds.len() > COLOURS.len();
    let coloured = if fold { COLOURS.len() - 1 } else { COLOURS.len() };
    let mut legend: Vec<_> = kinds.iter().take(coloured).zip(COLOURS).map(|((k, _), c)| (k.to_string(), c)).collect();
    if fold {
        legend.push((OTHER.into(), OTHER_COLOUR));
    }
    legend
}

/// A legend's entries in a row above a chart.
fn keys<'a>(out: &mut String, entries: impl Iterator<Item = (&'a str, &'a str)>) {
    let mut x = LEFT;
    for (name, colour) in entries {
        let _ = write!(
            out,
            r##"<rect class="key" x="{x}" y="8" width="12" height="12" fill="{colour}"/><text x="{}" y="18">{}</text>"##,
            x + 16.0,
            escape(name)
        );
        x += 16.0 + 7.0 * name.chars().count().min(40) as f64 + 18.0;
    }
}

/// Stacked bars per hour, a colour per kind as `legend` gives them, each bar's count in its
/// `<title>`.
fn bars(
    id: &str,
    what: &str,
    verb: &str,
    start: DateTime<Utc>,
    by_kind: &BTreeMap<String, [u64; HOURS]>,
    legend: &[(String, &str)],
) -> String {
    let mut kinds: Vec<[u64; HOURS]> = vec![[0; HOURS]; legend.len()];
    for (kind, counts) in by_kind {
        let i = legend.iter().position(|(k, _)| k == kind).unwrap_or(legend.len().saturating_sub(1));
        if let Some(sum) = kinds.get_mut(i) {
            sum.iter_mut().zip(counts).for_each(|(s, c)| *s += c);
        }
    }
    let totals: Vec<u64> = (0..HOURS).map(|h| kinds.iter().map(|c| c[h]).sum()).collect();
    let top = nice_max(totals.iter().copied().max().unwrap_or(0) as f64);
    let mut out = String::new();
    frame_svg(&mut out, id, what, top, |v| format!("{v}"));
    keys(&mut out, legend.iter().map(|(k, c)| (k.as_str(), *c)));
    let kinds: Vec<(&str, &str, [u64; HOURS])> =
        legend.iter().zip(kinds).map(|((k, c), counts)| (k.as_str(), *c, counts)).collect();
    let slot = (WIDTH - LEFT - RIGHT) / HOURS as f64;
    for h in 0..HOURS {
        let from = start + TimeDelta::hours(h as i64);
        let x = LEFT + slot * h as f64;
        let mut y = TOP + PLOT;
        for (kind, colour, counts) in &kinds {
            if counts[h] == 0 {
                continue;
            }
            let height = PLOT * counts[h] as f64 / top;
            y -= height;
            let _ = write!(
                out,
                r##"<rect class="bar" x="{:.1}" y="{y:.1}" width="{:.1}" height="{height:.1}" fill="{}"><title>{}: {} {verb} {:02}:00–{:02}:00 UTC</title></rect>"##,
                x + 2.0,
                slot - 4.0,
                colour,
                escape(kind),
                counts[h],
                from.hour(),
                (from.hour() + 1) % 24
            );
        }
        if h % 3 == 0 {
            hour_label(&mut out, x + slot / 2.0, from);
        }
    }
    out.push_str("</svg>");
    out
}

/// One reading of the queue.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Sample {
    at: DateTime<Utc>,
    queued: u64,
    /// `None` where the broker cannot tell what is scheduled.
    ready: Option<u64>,
    running: u64,
    /// Zero when nothing is ready; `None` where the broker cannot tell.
    oldest_ready: Option<Duration>,
}

impl Sample {
    fn of(at: DateTime<Utc>, counts: &Counts) -> Self {
        let ready = counts.scheduled.map(|s| counts.queued.saturating_sub(s));
        let oldest_ready = counts.oldest_ready.or((ready == Some(0)).then_some(Duration::ZERO));
        Self { at, queued: counts.queued, ready, running: counts.running, oldest_ready }
    }
}

/// The queue's samples of the last 24 hours, in this process's memory: at most 86,400 (one a
/// second, the most [`Dashboard::with_sample_every`](crate::Dashboard::with_sample_every) allows).
pub(crate) struct Samples {
    every: Duration,
    since: DateTime<Utc>,
    ring: Mutex<VecDeque<Sample>>,
}

impl Samples {
    pub(crate) fn new(every: Duration) -> Self {
        Self { every, since: Utc::now(), ring: Mutex::new(VecDeque::new()) }
    }

    fn push(&self, sample: Sample) {
        let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let cutoff = sample.at - TimeDelta::hours(HOURS as i64);
        while ring.front().is_some_and(|s| s.at < cutoff) {
            ring.pop_front();
        }
        ring.push_back(sample);
    }

    fn read(&self) -> Vec<Sample> {
        self.ring.lock().unwrap_or_else(|e| e.into_inner()).iter().copied().collect()
    }
}

/// Samples the queue every `app.samples.every` while the dashboard's routes exist; stops
/// without them. Needs a tokio runtime: without one, the charts say there are no samples.
pub(crate) fn start_sampling<B: Records>(app: &Arc<App<B>>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::warn!("the dashboard's router was built outside a tokio runtime: the queue is not sampled");
        return;
    };
    let every = app.samples.every;
    let app: Weak<App<B>> = Arc::downgrade(app);
    runtime.spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(app) = app.upgrade() else { return };
            match app.backend.counts().await {
                Ok(counts) => app.samples.push(Sample::of(Utc::now(), &counts)),
                Err(e) => tracing::warn!(error = %e, "the dashboard could not sample the queue"),
            }
        }
    });
}

/// A line: its name, its colour and its value in a sample (`None` where unknown).
type Series = (&'static str, &'static str, fn(&Sample) -> Option<f64>);

/// Line charts over the last 24 hours up to `now`, one line per series, each column the
/// highest of its samples; a series a sample lacks breaks its line. Each column's values in its
/// `<title>`.
fn lines(
    id: &str,
    what: &str,
    samples: &[Sample],
    now: DateTime<Utc>,
    series: &[Series],
    label: impl Fn(f64) -> String,
) -> String {
    let start = now - TimeDelta::hours(HOURS as i64);
    let span = (now - start).num_milliseconds() as f64;
    let mut columns: Vec<Vec<Option<f64>>> = vec![vec![None; series.len()]; COLUMNS];
    let mut seen = vec![false; COLUMNS];
    for s in samples.iter().filter(|s| s.at >= start && s.at <= now) {
        let c = (((s.at - start).num_milliseconds() as f64 / span) * COLUMNS as f64) as usize;
        let c = c.min(COLUMNS - 1);
        seen[c] = true;
        for (i, (_, _, value)) in series.iter().enumerate() {
            if let Some(v) = value(s) {
                columns[c][i] = Some(columns[c][i].map_or(v, |old: f64| old.max(v)));
            }
        }
    }
    let highest = columns.iter().flatten().flatten().copied().fold(0.0, f64::max);
    let top = nice_max(highest);
    let mut out = String::new();
    frame_svg(&mut out, id, what, top, &label);
    keys(&mut out, series.iter().map(|(name, colour, _)| (*name, *colour)));
    let slot = (WIDTH - LEFT - RIGHT) / COLUMNS as f64;
    let at_x = |c: usize| LEFT + slot * (c as f64 + 0.5);
    let at_y = |v: f64| TOP + PLOT * (1.0 - v / top);
    for (i, (_, colour, _)) in series.iter().enumerate() {
        // The first series wider, so that it shows under another with the same values.
        let (width, radius) = if i == 0 { (4.0, 5.0) } else { (2.0, 3.5) };
        // A line through consecutive columns that have the value; a lone point as a dot.
        let mut run: Vec<(f64, f64)> = Vec::new();
        let flush = |run: &mut Vec<(f64, f64)>, out: &mut String| {
            match run.as_slice() {
                [] => {}
                [(x, y)] => {
                    let _ = write!(
                        out,
                        r##"<circle class="point" cx="{x:.1}" cy="{y:.1}" r="{radius}" fill="{colour}"/>"##
                    );
                }
                points => {
                    let points: Vec<String> = points.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
                    let _ = write!(
                        out,
                        r##"<polyline class="line" points="{}" fill="none" stroke="{colour}" stroke-width="{width}"/>"##,
                        points.join(" ")
                    );
                }
            }
            run.clear();
        };
        for (c, column) in columns.iter().enumerate() {
            match column[i] {
                Some(v) => run.push((at_x(c), at_y(v))),
                None if seen[c] => flush(&mut run, &mut out),
                None => {} // not sampled then: the line goes on to the next sample
            }
        }
        flush(&mut run, &mut out);
    }
    for (c, column) in columns.iter().enumerate().filter(|(c, _)| seen[*c]) {
        let from = start + TimeDelta::milliseconds((span / COLUMNS as f64 * c as f64) as i64);
        let values: Vec<String> = series
            .iter()
            .zip(column)
            .map(|((name, ..), v)| format!("{name} {}", v.map_or_else(|| "unknown".into(), &label)))
            .collect();
        let _ = write!(
            out,
            r##"<rect class="hover" x="{:.1}" y="{TOP}" width="{slot:.1}" height="{PLOT}" fill="#000" fill-opacity="0"><title>{} UTC: {}</title></rect>"##,
            at_x(c) - slot / 2.0,
            from.format("%H:%M"),
            escape(&values.join(", "))
        );
    }
    let first_hour = start.duration_trunc(TimeDelta::hours(1)).unwrap_or(start) + TimeDelta::hours(1);
    for h in (0..HOURS).step_by(3) {
        let at = first_hour + TimeDelta::hours(h as i64);
        let x = LEFT + (WIDTH - LEFT - RIGHT) * (at - start).num_milliseconds() as f64 / span;
        hour_label(&mut out, x, at);
    }
    out.push_str("</svg>");
    out
}

/// `90s`, `12m`, `3h`: an axis's or a hover's wait.
fn wait(seconds: f64) -> String {
    match seconds {
        s if s < 120.0 => format!("{s:.0}s"),
        s if s < 7200.0 => format!("{:.0}m", s / 60.0),
        s => format!("{:.1}h", s / 3600.0),
    }
}

#[derive(Template)]
#[template(path = "charts.html")]
struct Charts {
    frame: Frame,
    /// The SVGs, escaped as they were built.
    opened: String,
    closed: String,
    depth: String,
    oldest: String,
    opened_total: u64,
    closed_total: u64,
    truncated: Option<usize>,
    every: String,
    since: String,
    samples: usize,
}

async fn page<B: Records>(axum::extract::State(app): Shared<B>) -> Response {
    let every = Filter { state: "all".into(), ..Filter::default() };
    let (records, truncated) = match matching(&app, &every, READ_AT_MOST).await {
        Ok(found) => found,
        Err(response) => return response,
    };
    let now = Utc::now();
    let hourly = Hourly::of(&records, now);
    let legend = legend(&hourly);
    let total = |m: &BTreeMap<String, [u64; HOURS]>| m.values().flatten().sum();
    let samples = app.samples.read();
    let depth: [Series; 3] = [
        ("queued", "#0072b2", |s| Some(s.queued as f64)),
        ("ready", "#e69f00", |s| s.ready.map(|n| n as f64)),
        ("running", "#009e73", |s| Some(s.running as f64)),
    ];
    let oldest: [Series; 1] = [("oldest ready job's wait", "#d55e00", |s| s.oldest_ready.map(|d| d.as_secs_f64()))];
    let page = Charts {
        frame: frame("Charts"),
        opened: bars("opened", "Records opened per hour, by kind", "opened", hourly.start, &hourly.opened, &legend),
        closed: bars("closed", "Records closed per hour, by kind", "closed", hourly.start, &hourly.closed, &legend),
        depth: lines("depth", "Queue depth", &samples, now, &depth, |v| format!("{v:.0}")),
        oldest: lines("oldest", "Oldest ready job's wait", &samples, now, &oldest, wait),
        opened_total: total(&hourly.opened),
        closed_total: total(&hourly.closed),
        truncated: truncated.then_some(READ_AT_MOST),
        every: duration(app.samples.every),
        since: crate::views::time(app.samples.since),
        samples: samples.len(),
    };
    render(StatusCode::OK, page)
}

#[cfg(test)]
mod tests {
    use redrive_core::{FailureId, IdempotencyKey, JobId, ProviderKey, Severity};

    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        text.parse().unwrap()
    }

    fn record(kind: &str, failed: &str, state: RecordState) -> FailureRecord {
        // Kind names are checked on enqueue; a record read from a store is escaped all the same.
        let key = IdempotencyKey::builder("k").fact("n", 1).build().unwrap();
        FailureRecord {
            id: FailureId("1".into()),
            job_id: JobId("1".into()),
            kind: kind.into(),
            provider_key: ProviderKey::mint(),
            key,
            payload: serde_json::json!({}),
            last_error: String::new(),
            errors: Vec::new(),
            attempts: 1,
            cap: 1,
            severity: Severity::Error,
            first_failed_at: at(failed),
            last_failed_at: at(failed),
            state,
            replay_of: None,
            amended: None,
            trace_id: None,
        }
    }

    fn discarded(when: &str) -> RecordState {
        RecordState::Discarded { at: at(when), reason: "r".into(), actor: "ada".into() }
    }

    #[test]
    fn records_fall_into_the_hour_they_opened_and_the_hour_they_closed() {
        let now = at("2025-06-13T14:20:00Z");
        let records = [
            record("ship", "2025-06-13T14:05:00Z", RecordState::Open),
            record("ship", "2025-06-13T13:59:59Z", discarded("2025-06-13T14:10:00Z")),
            record("charge", "2025-06-13T09:30:00Z", RecordState::replaying("", "ada", false)),
            record(
                "charge",
                "2025-06-13T09:00:00Z",
                RecordState::Confirmed {
                    at: at("2025-06-13T10:00:00Z"),
                    reason: String::new(),
                    actor: "ada".into(),
                    amended: false,
                    confirmed_at: at("2025-06-13T11:00:00Z"),
                },
            ),
        ];
        let hourly = Hourly::of(&records, now);
        assert_eq!(hourly.start, at("2025-06-12T15:00:00Z"), "the current hour is the last of 24");
        let (last, nine, ten) = (HOURS - 1, HOURS - 6, HOURS - 5);
        assert_eq!(hourly.opened["ship"][last], 1);
        assert_eq!(hourly.opened["ship"][last - 1], 1, "13:59:59 is the hour before");
        assert_eq!(hourly.closed["ship"][last], 1);
        assert_eq!(hourly.opened["charge"][nine], 2);
        assert_eq!(hourly.closed["charge"][ten], 1, "closed when replayed, not when confirmed");
        // The replay just now (`replaying` stamps the real clock) is outside this made-up day.
        assert_eq!(hourly.closed["charge"].iter().sum::<u64>(), 1);
        assert_eq!(hourly.opened.values().flatten().sum::<u64>(), 4);
    }

    #[test]
    fn the_window_holds_the_current_hour_and_the_23_before_it() {
        let now = at("2025-06-13T14:00:00Z");
        let records = [
            record("ship", "2025-06-12T15:00:00Z", RecordState::Open), // the first instant in
            record("ship", "2025-06-12T14:59:59Z", discarded("2025-06-13T14:00:00Z")), // opened before
            record("ship", "2025-06-13T15:00:00Z", RecordState::Open), // a clock ahead: out
        ];
        let hourly = Hourly::of(&records, now);
        assert_eq!(hourly.opened["ship"][0], 1);
        assert_eq!(hourly.opened["ship"].iter().sum::<u64>(), 1);
        assert_eq!(hourly.closed["ship"][HOURS - 1], 1, "the hour that has just begun");
    }

    #[test]
    fn a_bar_per_kind_and_hour_with_its_count_and_kind_names_escaped() {
        let now = at("2025-06-13T14:20:00Z");
        let records = [
            record("<script>alert(1)</script>", "2025-06-13T14:05:00Z", RecordState::Open),
            record("<script>alert(1)</script>", "2025-06-13T14:06:00Z", RecordState::Open),
            record("ship", "2025-06-13T12:05:00Z", RecordState::Open),
        ];
        let hourly = Hourly::of(&records, now);
        let svg = bars("opened", "Records opened", "opened", hourly.start, &hourly.opened, &legend(&hourly));
        assert!(!svg.contains("<script"), "{svg}");
        assert!(
            svg.contains("<title>&#60;script&#62;alert(1)&#60;/script&#62;: 2 opened 14:00–15:00 UTC</title>"),
            "{svg}"
        );
        assert!(svg.contains("<title>ship: 1 opened 12:00–13:00 UTC</title>"), "{svg}");
        assert_eq!(svg.matches("class=\"bar\"").count(), 2);
        assert_eq!(svg.matches("class=\"key\"").count(), 2, "a legend entry per kind");
        assert_eq!(svg.matches("class=\"hour\"").count(), 8, "every third hour labelled");
        assert_eq!(escape("a&b\"'"), "a&#38;b&#34;&#39;");
    }

    #[test]
    fn beyond_seven_kinds_the_quietest_share_one_colour() {
        let now = at("2025-06-13T14:20:00Z");
        let records: Vec<_> =
            (0..10).map(|n| record(&format!("kind{n}"), "2025-06-13T14:05:00Z", RecordState::Open)).collect();
        let hourly = Hourly::of(&records, now);
        let svg = bars("opened", "Records opened", "opened", hourly.start, &hourly.opened, &legend(&hourly));
        assert_eq!(svg.matches("class=\"key\"").count(), 7);
        assert!(svg.contains("<title>other kinds: 4 opened 14:00–15:00 UTC</title>"), "{svg}");
    }

    #[test]
    fn a_kind_has_the_same_colour_in_both_charts() {
        let now = at("2025-06-13T14:20:00Z");
        let records = [
            record("ship", "2025-06-13T14:05:00Z", RecordState::Open),
            record("ship", "2025-06-13T14:06:00Z", RecordState::Open),
            record("ship", "2025-06-13T14:07:00Z", RecordState::Open),
            // Counted twice, opened and closed: 2, fewer than ship's 3.
            record("charge", "2025-06-13T13:05:00Z", discarded("2025-06-13T14:00:00Z")),
        ];
        let hourly = Hourly::of(&records, now);
        let legend = legend(&hourly);
        assert_eq!(legend, [("ship".to_owned(), COLOURS[0]), ("charge".to_owned(), COLOURS[1])], "busiest first");
        let closed = bars("closed", "Records closed", "closed", hourly.start, &hourly.closed, &legend);
        assert!(closed.contains(&format!("fill=\"{}\"><title>charge: 1 closed", COLOURS[1])), "{closed}");
    }

    #[test]
    fn samples_older_than_a_day_leave_and_lines_break_where_a_figure_is_unknown() {
        let samples = Samples::new(Duration::from_secs(60));
        let counts = Counts { queued: 5, running: 1, scheduled: Some(2), oldest_ready: Some(Duration::from_secs(90)) };
        samples.push(Sample::of(at("2025-06-12T13:00:00Z"), &counts));
        samples.push(Sample::of(at("2025-06-13T12:00:00Z"), &counts));
        samples.push(Sample::of(at("2025-06-13T13:59:00Z"), &counts));
        assert_eq!(samples.read().len(), 2, "the day-old sample left");
        let unknown = Counts { scheduled: None, oldest_ready: None, ..counts };
        samples.push(Sample::of(at("2025-06-13T14:00:00Z"), &unknown));
        let read = samples.read();
        assert_eq!(read[0].ready, Some(3));
        let series: [Series; 2] =
            [("queued", "#000", |s| Some(s.queued as f64)), ("ready", "#111", |s| s.ready.map(|n| n as f64))];
        let svg = lines("depth", "Queue depth", &read, at("2025-06-13T14:10:00Z"), &series, |v| format!("{v:.0}"));
        assert_eq!(svg.matches("class=\"line\"").count(), 2, "queued through all three: {svg}");
        assert_eq!(svg.matches("class=\"point\"").count(), 0, "ready's line stops before the unknown: {svg}");
        assert_eq!(svg.matches("class=\"hover\"").count(), 3);
        assert!(svg.contains("14:00 UTC: queued 5, ready unknown</title>"), "{svg}");
        let nothing_ready =
            Sample::of(at("2025-06-13T14:00:00Z"), &Counts { queued: 2, scheduled: Some(2), ..unknown });
        assert_eq!(nothing_ready.oldest_ready, Some(Duration::ZERO));
    }
}
