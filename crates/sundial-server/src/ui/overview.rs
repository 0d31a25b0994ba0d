//! The overview: every queue with its counts by state (maintained counters), what is due but
//! not started, whether it is paused, fire lateness percentiles from this server's own
//! histograms, the workers that polled this node recently (in memory), and the shards: this
//! node's on a single node, and on several every node with its last heartbeat and the shards it
//! holds (one read of the membership and lease tables). Also the queue pause and resume posts.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use askama::Template;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::response::Response;
use sundial::{TaskState, Timestamp};
use sundial_store::TaskFilter;

use super::fmt;
use super::{
    Chrome, UiError, UiState, Viewer, action_word, enc, error_page, perform, query_fields, render,
    see_other, viewer, with_notice,
};

/// The histogram of a task's start (or readiness) minus its due time.
const FIRE_LATENESS: &str = "sundial_fire_lateness_seconds";
/// The histogram of a schedule fire's task creation minus its nominal time.
const SCHEDULE_LATENESS: &str = "sundial_schedule_fire_lateness_seconds";
/// How far back the percentiles look (at most; less right after start).
const WINDOW_MS: i64 = 5 * 60 * 1000;
/// Due-but-not-started tasks counted per queue before the page says "more than".
const DUE_COUNT_LIMIT: usize = 100;

/// Cumulative bucket counts of one histogram series: upper bound → count.
type Buckets = BTreeMap<u64, f64>;

/// Snapshots of the lateness histograms (per queue, and the schedules' one under `""`), taken
/// when the overview is shown, so that percentiles cover the last minutes rather than the
/// process's whole life.
#[derive(Default)]
pub(crate) struct LatenessWindow {
    snaps: VecDeque<(Timestamp, BTreeMap<String, Buckets>)>,
}

impl LatenessWindow {
    /// Records `now`'s histograms and answers the baseline to subtract (the newest snapshot at
    /// least [`WINDOW_MS`] old, or the oldest kept) with its time.
    fn baseline(
        &mut self,
        now: Timestamp,
        current: &BTreeMap<String, Buckets>,
    ) -> Option<(Timestamp, BTreeMap<String, Buckets>)> {
        while self.snaps.len() > 1
            && self
                .snaps
                .get(1)
                .is_some_and(|s| now.0 - s.0.0 >= WINDOW_MS)
        {
            self.snaps.pop_front();
        }
        let base = self.snaps.front().cloned();
        if self.snaps.back().is_none_or(|s| now.0 - s.0.0 >= 10_000) {
            self.snaps.push_back((now, current.clone()));
        }
        base
    }
}

/// Parses the `_bucket` lines of `metric` from a Prometheus text rendering, summed per value of
/// the `queue` label (series without one go under `""`).
fn parse_buckets(text: &str, metric: &str, ns: &str) -> BTreeMap<String, Buckets> {
    let prefix = format!("{metric}_bucket");
    let mut out: BTreeMap<String, Buckets> = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(&prefix) else {
            continue;
        };
        let (labels, value) = match rest.strip_prefix('{').and_then(|r| r.split_once('}')) {
            Some((l, v)) => (l, v),
            None => ("", rest),
        };
        let Ok(count) = value.trim().parse::<f64>() else {
            continue;
        };
        let mut queue = String::new();
        let mut le = None;
        // A series without the label is the default namespace's.
        let mut in_namespace = ns == sundial_core::namespace::DEFAULT_NAMESPACE;
        for kv in labels.split(',') {
            if let Some((k, v)) = kv.split_once('=') {
                let v = v.trim_matches('"');
                match k.trim() {
                    "queue" => queue = v.to_string(),
                    "le" => le = Some(v.to_string()),
                    // The viewer's namespace only.
                    "namespace" => in_namespace = v == ns,
                    _ => {}
                }
            }
        }
        let Some(le) = le else { continue };
        if !in_namespace {
            continue;
        }
        // Bounds in microseconds as keys (+Inf as the largest).
        let bound = if le == "+Inf" {
            u64::MAX
        } else {
            match le.parse::<f64>() {
                Ok(s) => (s * 1e6).round() as u64,
                Err(_) => continue,
            }
        };
        *out.entry(queue).or_default().entry(bound).or_default() += count;
    }
    out
}

/// The `q` quantile (0..1) of cumulative buckets, interpolated within the bucket it falls in.
fn quantile(b: &Buckets, q: f64) -> Option<Duration> {
    let total = b.values().copied().fold(0.0, f64::max);
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut prev_bound = 0u64;
    let mut prev_count = 0.0;
    for (&bound, &count) in b {
        if count >= rank {
            if bound == u64::MAX {
                return Some(Duration::from_micros(prev_bound));
            }
            let span = count - prev_count;
            let frac = if span > 0.0 {
                (rank - prev_count) / span
            } else {
                1.0
            };
            let us = prev_bound as f64 + frac * (bound - prev_bound) as f64;
            return Some(Duration::from_micros(us as u64));
        }
        prev_bound = bound;
        prev_count = count;
    }
    None
}

fn minus(cur: &Buckets, base: Option<&Buckets>) -> Buckets {
    cur.iter()
        .map(|(k, v)| {
            (
                *k,
                (v - base.and_then(|b| b.get(k)).copied().unwrap_or(0.0)).max(0.0),
            )
        })
        .collect()
}

fn merged<'a>(all: impl Iterator<Item = &'a Buckets>) -> Buckets {
    let mut out = Buckets::new();
    for b in all {
        for (k, v) in b {
            *out.entry(*k).or_default() += v;
        }
    }
    out
}

struct Percentiles {
    p50: String,
    p99: String,
    samples: u64,
}

fn percentiles(b: &Buckets) -> Percentiles {
    let show = |d: Option<Duration>| d.map(fmt::short).unwrap_or_else(|| "–".into());
    Percentiles {
        p50: show(quantile(b, 0.5)),
        p99: show(quantile(b, 0.99)),
        samples: b.values().copied().fold(0.0, f64::max) as u64,
    }
}

struct QueueRow {
    queue: String,
    href: String,
    action: String,
    paused: bool,
    counts: Vec<(&'static str, u64, String)>,
    due_waiting: String,
    overdue: String,
    lateness: Percentiles,
}

struct WorkerRow {
    worker: String,
    queue: String,
    href: String,
    last_seen: String,
    last_seen_full: String,
    polls: u64,
}

struct NodeRow {
    node: String,
    this: bool,
    live: bool,
    heartbeat: String,
    heartbeat_full: String,
    shards: String,
    count: usize,
}

#[derive(Template)]
#[template(path = "ui/overview.html")]
struct OverviewPage {
    workers: Vec<WorkerRow>,
    workers_window: String,
    nodes: Option<Vec<NodeRow>>,
    unowned: String,
    chrome: Chrome,
    states: Vec<&'static str>,
    queues: Vec<QueueRow>,
    show_internal: bool,
    internal_hidden: usize,
    all_lateness: Option<Percentiles>,
    schedule_lateness: Option<Percentiles>,
    window: String,
    metrics: bool,
    shards: String,
    schedules: bool,
    workflows: bool,
}

/// `GET /ui`.
pub(crate) async fn page(
    State(st): State<UiState>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    let v = match viewer(&st, &headers, "/ui").await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let q = query_fields(raw.as_deref());
    match overview(
        &st,
        &v,
        q.get("internal").as_deref() == Some("true"),
        q.get("notice"),
    )
    .await
    {
        Ok(r) => r,
        Err(e) => error_page(&v, e),
    }
}

async fn overview(
    st: &UiState,
    v: &Viewer,
    show_internal: bool,
    notice: Option<String>,
) -> Result<Response, UiError> {
    let s = &st.app.sundial;
    let now = s.clock().now();
    // The viewer's namespace's queues, by the names it knows them by.
    let infos: Vec<_> = s
        .queues()
        .await?
        .into_iter()
        .filter_map(|mut q| {
            q.queue = v.ns.local(&q.queue)?.to_string();
            Some(q)
        })
        .collect();
    // Lateness percentiles from the server's own histograms, over the last minutes.
    let rendered = st.app.config.prometheus.as_ref().map(|h| h.render());
    let (by_queue, schedule_lat, window) = match &rendered {
        Some(text) => {
            let mut cur = parse_buckets(text, FIRE_LATENESS, v.ns.name());
            let sched = parse_buckets(text, SCHEDULE_LATENESS, v.ns.name());
            cur.insert("\u{0}schedules".to_string(), merged(sched.values()));
            let base = st
                .lateness
                .lock()
                .ok()
                .and_then(|mut w| w.baseline(now, &cur));
            let window = match &base {
                Some((t, _)) if now.0 > t.0 => format!(
                    "over the last {}",
                    fmt::short(Duration::from_millis((now.0 - t.0) as u64))
                ),
                _ => "since the server started".to_string(),
            };
            let base_map = base.map(|(_, m)| m);
            let deltas: BTreeMap<String, Buckets> = cur
                .iter()
                .map(|(k, b)| {
                    (
                        k.clone(),
                        minus(b, base_map.as_ref().and_then(|m| m.get(k))),
                    )
                })
                .collect();
            let sched = deltas.get("\u{0}schedules").cloned();
            (Some(deltas), sched, window)
        }
        None => (None, None, String::new()),
    };
    let mut queues = Vec::new();
    let mut internal_hidden = 0;
    for info in &infos {
        if !show_internal && sundial::is_internal_queue(&info.queue) {
            internal_hidden += 1;
            continue;
        }
        let ready = info.counts.get(&TaskState::Ready).copied().unwrap_or(0);
        let due_waiting = if info.oldest_overdue_at.is_some() {
            // Scheduled tasks already due (a paused queue, or a busy one), counted up to a
            // bound; ready ones come from the counters.
            let overdue = s
                .list(
                    TaskFilter {
                        queue: Some(v.ns.qualify(&info.queue)),
                        state: Some(TaskState::Scheduled),
                        due_before: Some(Timestamp(now.0 + 1)),
                        ..TaskFilter::default()
                    },
                    DUE_COUNT_LIMIT,
                )
                .await?;
            let more = overdue.next_cursor.is_some();
            let n = ready + overdue.tasks.len() as u64;
            if more {
                format!("more than {n}")
            } else {
                n.to_string()
            }
        } else {
            ready.to_string()
        };
        let lat = by_queue
            .as_ref()
            .and_then(|m| m.get(&info.queue))
            .map(percentiles)
            .unwrap_or(Percentiles {
                p50: "–".into(),
                p99: "–".into(),
                samples: 0,
            });
        queues.push(QueueRow {
            href: format!("/ui/tasks?queue={}", enc(&info.queue)),
            action: format!(
                "/ui/queues/{}/{}",
                super::enc_path(&info.queue),
                if info.paused { "resume" } else { "pause" }
            ),
            queue: info.queue.clone(),
            paused: info.paused,
            counts: TaskState::ALL
                .iter()
                .map(|state| {
                    (
                        state.as_str(),
                        info.counts.get(state).copied().unwrap_or(0),
                        format!(
                            "/ui/tasks?queue={}&state={}",
                            enc(&info.queue),
                            state.as_str()
                        ),
                    )
                })
                .collect(),
            due_waiting,
            overdue: info
                .lateness
                .map(|d| format!("oldest {} late", fmt::short(d)))
                .unwrap_or_default(),
            lateness: lat,
        });
    }
    let all_lateness = by_queue.as_ref().map(|m| {
        percentiles(&merged(
            m.iter()
                .filter(|(k, _)| !k.starts_with('\u{0}'))
                .map(|(_, b)| b),
        ))
    });
    let owned = s.owned_shards();
    let view = s.cluster_view().await?;
    let shards = match &view {
        None => format!(
            "Single node: this server runs all {} shards.",
            s.config().shard_count
        ),
        Some(v) => format!(
            "Several nodes: this node ({}) runs {} of {} shards.",
            v.node,
            owned.len(),
            v.shard_count
        ),
    };
    let unowned = view
        .as_ref()
        .map(|v| join_shards(&v.unowned))
        .unwrap_or_default();
    let nodes = view.map(|v| {
        v.nodes
            .into_iter()
            .map(|n| NodeRow {
                this: n.node == v.node,
                live: n.live,
                heartbeat: n
                    .last_seen
                    .map(|t| fmt::relative(t, now))
                    .unwrap_or_else(|| "left".into()),
                heartbeat_full: n.last_seen.map(fmt::rfc3339).unwrap_or_default(),
                count: n.shards.len(),
                shards: join_shards(&n.shards),
                node: n.node,
            })
            .collect()
    });
    // In memory, this node's pollers only.
    let workers = s
        .workers_seen(Timestamp(
            now.0 - crate::ops::WORKERS_RECENT.as_millis() as i64,
        ))
        .into_iter()
        .filter_map(|mut w| {
            w.queue = v.ns.local(&w.queue)?.to_string();
            Some(w)
        })
        .map(|w| WorkerRow {
            worker: w.worker.unwrap_or_else(|| "(unnamed)".into()),
            href: format!("/ui/tasks?queue={}", enc(&w.queue)),
            queue: w.queue,
            last_seen: fmt::relative(w.last_seen, now),
            last_seen_full: fmt::rfc3339(w.last_seen),
            polls: w.polls,
        })
        .collect();
    let t = OverviewPage {
        chrome: Chrome::new(v, "overview", "Overview").notice(notice),
        workers,
        workers_window: fmt::short(crate::ops::WORKERS_RECENT),
        nodes,
        unowned,
        states: TaskState::ALL.iter().map(|s| s.as_str()).collect(),
        queues,
        show_internal,
        internal_hidden,
        all_lateness,
        schedule_lateness: schedule_lat.as_ref().map(percentiles),
        window,
        metrics: rendered.is_some(),
        shards,
        schedules: st.schedules.is_some(),
        workflows: st.workflows.is_some(),
    };
    Ok(render(v, &t))
}

/// `0, 3, 7` (or `none`).
fn join_shards(shards: &[u32]) -> String {
    if shards.is_empty() {
        return "none".to_string();
    }
    shards
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// `POST /ui/queues/{queue}/{pause|resume}`.
pub(crate) async fn queue_action(
    State(st): State<UiState>,
    headers: HeaderMap,
    Path((queue, action)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    let word = action_word(&action, &["pause", "resume"]).to_string();
    let st2 = st.clone();
    perform(
        &st,
        &headers,
        &body,
        format!("/ui/queues/{{queue}}/{word}"),
        Some(queue.clone()),
        |v, f| async move {
            let r = async {
                let s = &st2.app.sundial;
                let stored = v.ns.given("queue", &queue)?;
                let notice = match action.as_str() {
                    "pause" => {
                        s.pause_queue(&stored).await?;
                        format!("Queue {queue} paused: its due tasks wait.")
                    }
                    "resume" => {
                        s.resume_queue(&stored).await?;
                        format!("Queue {queue} resumed.")
                    }
                    _ => {
                        return Err(UiError::not_found(format!("no such action: {action:?}")));
                    }
                };
                let back = match f.get("back") {
                    Some(b) if b.starts_with("/ui") && !b.starts_with("//") => b,
                    _ => "/ui".to_string(),
                };
                Ok(see_other(&with_notice(&back, &notice)))
            }
            .await;
            (None, r)
        },
    )
    .await
}

/// `POST /ui/namespace`: a viewer of every namespace chooses the one the pages show (kept in a
/// cookie); a token bound to a namespace keeps its own.
pub(crate) async fn switch_namespace(
    State(st): State<UiState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let st2 = st.clone();
    let chosen = super::Fields::parse(&body)
        .get("namespace")
        .unwrap_or_default();
    perform(
        &st,
        &headers,
        &body,
        "/ui/namespace".to_string(),
        Some(chosen.clone()),
        |v, _f| async move {
            let r = async {
                if !v.may_switch_namespace() {
                    return Err(UiError::new(
                        axum::http::StatusCode::FORBIDDEN,
                        "this token belongs to one namespace; sign in with another token to see another",
                    ));
                }
                let chosen = chosen.trim().to_string();
                if !sundial_core::namespace::is_valid_name(&chosen)
                    || !st2.access.namespace_exists(&chosen).await
                {
                    return Err(UiError::not_found(format!("no such namespace: {chosen:?}")));
                }
                let mut resp = see_other(&with_notice("/ui", &format!("Showing namespace {chosen}.")));
                if let Some(c) = super::session::namespace_cookie(&st2, &chosen) {
                    resp.headers_mut().append(axum::http::header::SET_COOKIE, c);
                }
                Ok(resp)
            }
            .await;
            (None, r)
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
# TYPE sundial_fire_lateness_seconds histogram
sundial_fire_lateness_seconds_bucket{queue=\"a\",target=\"handler\",le=\"0.001\"} 50
sundial_fire_lateness_seconds_bucket{queue=\"a\",target=\"handler\",le=\"0.01\"} 99
sundial_fire_lateness_seconds_bucket{queue=\"a\",target=\"handler\",le=\"0.1\"} 100
sundial_fire_lateness_seconds_bucket{queue=\"a\",target=\"handler\",le=\"+Inf\"} 100
sundial_fire_lateness_seconds_sum{queue=\"a\",target=\"handler\"} 0.3
sundial_fire_lateness_seconds_count{queue=\"a\",target=\"handler\"} 100
";

    #[test]
    fn percentiles_come_from_the_buckets() {
        let b = parse_buckets(TEXT, FIRE_LATENESS, "default");
        let a = &b["a"];
        assert_eq!(quantile(a, 0.5), Some(Duration::from_micros(1_000)));
        assert_eq!(quantile(a, 0.99), Some(Duration::from_micros(10_000)));
        assert_eq!(quantile(&Buckets::new(), 0.5), None);
    }

    #[test]
    fn the_window_subtracts_an_older_snapshot() {
        let b = parse_buckets(TEXT, FIRE_LATENESS, "default");
        let mut w = LatenessWindow::default();
        assert!(w.baseline(Timestamp(0), &b).is_none());
        let (t, base) = w.baseline(Timestamp(60_000), &b).expect("a baseline");
        assert_eq!(t, Timestamp(0));
        let d = minus(&b["a"], base.get("a"));
        assert_eq!(quantile(&d, 0.5), None, "nothing new since the snapshot");
    }
}
