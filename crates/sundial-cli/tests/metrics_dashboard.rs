//! The Grafana dashboard (`deploy/grafana/sundial.json`) and the sample Prometheus alerts
//! (`deploy/prometheus/sundial-alerts.yml`) query only series that `/metrics` has: the real binary
//! is driven through every path that records a series (create, fire, poll, complete, fail until
//! dead, a lease that expires, a schedule firing on its own and triggered, a workflow start), then
//! every `sundial_*` (and `process_*`) name in the queries must appear in its scrape, with the labels the queries
//! select on or group by. Renaming a metric without updating the dashboard and the alerts fails
//! here.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic on failure

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use common::Server;
use serde_json::{Value, json};
use sundial_server::wire::CreateTask;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every `expr` of the dashboard's panels (and its templating queries).
fn dashboard_queries() -> Vec<String> {
    let text = std::fs::read_to_string(repo().join("deploy/grafana/sundial.json")).unwrap();
    let dash: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut out = Vec::new();
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("expr" | "definition", Value::String(s)) => out.push(s.clone()),
                        _ => walk(v, out),
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    walk(&dash, &mut out);
    out
}

/// Every `expr:` of the alert rules (one line each, as the file's header asks).
fn alert_queries() -> Vec<String> {
    let text =
        std::fs::read_to_string(repo().join("deploy/prometheus/sundial-alerts.yml")).unwrap();
    text.lines()
        .filter_map(|l| l.trim_start().strip_prefix("expr:"))
        .map(|e| e.trim().to_string())
        .collect()
}

/// Series names in the scrape, each with the label names seen on it.
fn scraped_series(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let end = line.find(['{', ' ']).unwrap_or(line.len());
        let labels = out.entry(line[..end].to_string()).or_default();
        if let Some(rest) = line[end..].strip_prefix('{') {
            let inner = &rest[..rest.find('}').unwrap_or(rest.len())];
            for pair in inner.split(',').filter(|p| !p.is_empty()) {
                if let Some((k, _)) = pair.split_once('=') {
                    labels.insert(k.trim().to_string());
                }
            }
        }
    }
    out
}

/// A `sundial_*` metric used in a query, with the label names in its `{...}` selector.
#[derive(Debug)]
struct Use {
    metric: String,
    selected: Vec<String>,
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

fn metric_uses(query: &str) -> Vec<Use> {
    let mut out = Vec::new();
    let mut rest = query;
    while let Some(i) = ["sundial_", "process_"]
        .iter()
        .filter_map(|p| rest.find(p))
        .min()
    {
        let before = rest[..i].chars().last();
        let tail = &rest[i..];
        let end = tail.find(|c: char| !is_ident(c)).unwrap_or(tail.len());
        let name = &tail[..end];
        let mut selected = Vec::new();
        if before.is_none_or(|c| !is_ident(c)) {
            if let Some(sel) = tail[end..].strip_prefix('{') {
                let inner = &sel[..sel.find('}').unwrap_or(sel.len())];
                for m in inner.split(',') {
                    let key: String = m.trim().chars().take_while(|c| is_ident(*c)).collect();
                    if !key.is_empty() {
                        selected.push(key);
                    }
                }
            }
            out.push(Use {
                metric: name.to_string(),
                selected,
            });
        }
        rest = &tail[end..];
    }
    out
}

/// Label names in `by (...)` clauses.
fn grouped_labels(query: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = query;
    while let Some(i) = rest.find("by (") {
        let inner = &rest[i + 4..];
        let close = inner.find(')').unwrap_or(inner.len());
        out.extend(inner[..close].split(',').map(|s| s.trim().to_string()));
        rest = &inner[close..];
    }
    out
}

async fn wait_until<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let waited = tokio::time::timeout(Duration::from_secs(30), async {
        while !f().await {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "timed out waiting for {what}");
}

/// Drives the server through every path that records a series.
async fn exercise(server: &Server) {
    let client = server.client();
    let http = sundial_cli::http_client_builder().build().unwrap();
    let post = |path: &str, body: Value| {
        let req = http.post(format!("{}{path}", server.url)).json(&body);
        async move {
            let resp = req.send().await.unwrap();
            assert!(resp.status().is_success(), "{}", resp.text().await.unwrap());
        }
    };

    // Created, readied, polled, completed.
    let mut ok = CreateTask::new("ok");
    ok.queue = Some("metrics".into());
    client.create(&ok).await.unwrap();
    // Failed, retried, failed again: dead.
    let mut bad = CreateTask::new("bad");
    bad.queue = Some("metrics".into());
    bad.max_attempts = Some(2);
    bad.backoff = Some(sundial_server::wire::BackoffSpec {
        initial: Some("10ms".into()),
        jitter: Some(0.0),
        ..Default::default()
    });
    client.create(&bad).await.unwrap();
    // Polled and abandoned: its lease expires.
    let mut lost = CreateTask::new("lost");
    lost.queue = Some("leases".into());
    lost.timeout = Some("1s".into());
    client.create(&lost).await.unwrap();

    let mut dead = false;
    let mut completed = false;
    // Each poll waits up to 1 s; the three tasks need three or four.
    for _ in 0..30 {
        if dead && completed {
            break;
        }
        let polled = client
            .poll("metrics", "w", 10, Duration::from_secs(1), None)
            .await
            .unwrap();
        for t in polled.tasks {
            if t.kind == "ok" {
                client.complete(t.id, t.execution_id, None).await.unwrap();
                completed = true;
            } else {
                let v = client
                    .fail(t.id, t.execution_id, "boom".into(), true)
                    .await
                    .unwrap();
                dead |= v.state.as_str() == "dead";
            }
        }
    }
    assert!(dead && completed, "the tasks did not finish");
    let polled = client
        .poll("leases", "w", 1, Duration::from_secs(5), None)
        .await
        .unwrap();
    let abandoned = polled.tasks.first().expect("the lease task").id.to_string();
    wait_until("the lease to expire", || {
        let c = &client;
        let id = abandoned.clone();
        async move { c.get(&id).await.unwrap().state.as_str() != "running" }
    })
    .await;

    // A schedule firing on its own (lateness is recorded for those) and triggered.
    post(
        "/v1/schedules",
        json!({"id": "every-second", "every": "1s", "overlap": "allow_all", "task": {"kind": "tick", "queue": "ticks"}}),
    )
    .await;
    post("/v1/schedules/every-second/trigger", json!(null)).await;
    // A workflow start.
    post("/v1/workflows", json!({"type": "metrics-flow"})).await;
    let url = format!("{}/metrics", server.url);
    wait_until("a scheduled fire", || {
        let http = &http;
        let url = url.clone();
        async move {
            let text = http.get(&url).send().await.unwrap().text().await.unwrap();
            text.contains("sundial_schedule_fire_lateness_seconds_count")
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_and_alerts_query_only_series_that_exist() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    exercise(&server).await;
    let text = sundial_cli::http_client_builder()
        .build()
        .unwrap()
        .get(format!("{}/metrics", server.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let series = scraped_series(&text);

    let dashboard = dashboard_queries();
    let alerts = alert_queries();
    assert!(
        dashboard.len() >= 20,
        "found {} dashboard queries",
        dashboard.len()
    );
    assert!(
        alerts.len() >= 5,
        "found {} alert expressions",
        alerts.len()
    );

    // Labels Prometheus adds at scrape time, and the histogram bucket label.
    let added: BTreeSet<&str> = ["instance", "job", "le"].into();
    let mut problems = Vec::new();
    let mut used = BTreeSet::new();
    for (source, query) in dashboard
        .iter()
        .map(|q| ("dashboard", q))
        .chain(alerts.iter().map(|q| ("alerts", q)))
    {
        let uses = metric_uses(query);
        if uses.is_empty() {
            problems.push(format!(
                "{source}: no sundial_ or process_ series in {query}"
            ));
        }
        let mut labels_here = BTreeSet::new();
        for u in &uses {
            used.insert(u.metric.clone());
            let Some(labels) = series.get(&u.metric) else {
                problems.push(format!(
                    "{source}: {} is not in /metrics ({query})",
                    u.metric
                ));
                continue;
            };
            labels_here.extend(labels.iter().cloned());
            for l in &u.selected {
                if !labels.contains(l) {
                    problems.push(format!("{source}: {} has no label {l} ({query})", u.metric));
                }
            }
        }
        for l in grouped_labels(query) {
            if !added.contains(l.as_str()) && !labels_here.contains(&l) {
                problems.push(format!("{source}: no series of {query} has the label {l}"));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "the dashboard or the alerts query what /metrics does not have:\n{}\n\n/metrics had: {:?}",
        problems.join("\n"),
        series.keys().collect::<Vec<_>>()
    );
    println!(
        "dashboard and alerts: {} queries over {} series, all in /metrics",
        dashboard.len() + alerts.len(),
        used.len()
    );
}

/// The label names a series may carry: each has a value from a fixed list or from names the
/// operator chose (queues, shards, route templates), never an id, a kind or an attempt.
const BOUNDED_LABELS: [&str; 13] = [
    "namespace",
    "queue",
    "state",
    "shard",
    "outcome",
    "reason",
    "status",
    "what",
    "target",
    "route",
    "method",
    "status_class",
    "version",
];

/// `/metrics` after the whole exercise follows the Prometheus naming conventions: counters end in
/// `_total` and nothing else does, histograms and time gauges are in base units (`_seconds`,
/// `_bytes`; never milliseconds), every `sundial_` metric has `# HELP`, and label names come from
/// a bounded set with no value that looks like an id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_follow_the_prometheus_naming_conventions() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    exercise(&server).await;
    let text = scrape(&server.url).await;
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut helped = BTreeSet::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        match (words.next(), words.next(), words.next(), words.next()) {
            (Some("#"), Some("TYPE"), Some(name), Some(kind)) => {
                types.insert(name.to_string(), kind.to_string());
            }
            (Some("#"), Some("HELP"), Some(name), _) => {
                helped.insert(name.to_string());
            }
            _ => {}
        }
    }
    assert!(
        types.len() >= 25,
        "found {} typed metrics\n{text}",
        types.len()
    );
    let mut problems = Vec::new();
    for (name, kind) in &types {
        let total = name.ends_with("_total");
        match kind.as_str() {
            "counter" if !total => problems.push(format!("counter {name} does not end in _total")),
            "counter" => {}
            _ if total => problems.push(format!("{kind} {name} ends in _total")),
            "histogram" | "summary"
                if !(name.ends_with("_seconds") || name.ends_with("_bytes")) =>
            {
                problems.push(format!("{kind} {name} is not in a base unit"))
            }
            _ => {}
        }
        for unit in [
            "_milliseconds",
            "_ms",
            "_millis",
            "_microseconds",
            "_minutes",
            "_hours",
            "_kilobytes",
            "_megabytes",
        ] {
            if name.contains(&format!("{unit}_")) || name.ends_with(unit) {
                problems.push(format!("{name} is in {unit}, not a base unit"));
            }
        }
        if name.starts_with("sundial_") && !helped.contains(name) {
            problems.push(format!("{name} has no # HELP"));
        }
    }
    let id_like =
        |v: &str| v.len() >= 32 && v.chars().filter(|c| c.is_ascii_hexdigit()).count() >= 32;
    for line in text.lines().filter(|l| l.starts_with("sundial_")) {
        let Some(open) = line.find('{') else { continue };
        let inner = &line[open + 1..line.rfind('}').unwrap_or(line.len())];
        for pair in inner.split("\",").filter(|p| !p.is_empty()) {
            let Some((k, v)) = pair.split_once("=\"") else {
                continue;
            };
            let k = k.trim_start_matches(',');
            if k != "le" && !BOUNDED_LABELS.contains(&k) {
                problems.push(format!("label {k} is not a bounded one: {line}"));
            }
            if id_like(v.trim_end_matches('"')) {
                problems.push(format!("label {k} holds an id: {line}"));
            }
        }
    }
    problems.sort();
    problems.dedup();
    assert!(problems.is_empty(), "{}\n\n{text}", problems.join("\n"));
}

#[test]
fn the_query_reader_finds_names_selectors_and_groupings() {
    let q = r#"histogram_quantile(0.99, sum by (le, queue) (rate(sundial_fire_lateness_seconds_bucket{queue=~"$queue", target="ready"}[5m]))) > 30"#;
    let uses = metric_uses(q);
    assert_eq!(uses.len(), 1);
    assert_eq!(uses[0].metric, "sundial_fire_lateness_seconds_bucket");
    assert_eq!(uses[0].selected, ["queue", "target"]);
    assert_eq!(grouped_labels(q), ["le", "queue"]);
    let s =
        scraped_series("# HELP x\nsundial_tasks{queue=\"a\",state=\"ready\"} 1\nsundial_up 1\n");
    assert_eq!(
        s["sundial_tasks"],
        BTreeSet::from(["queue".to_string(), "state".to_string()])
    );
    assert!(s["sundial_up"].is_empty());
}

async fn scrape(url: &str) -> String {
    sundial_cli::http_client_builder()
        .build()
        .unwrap()
        .get(format!("{url}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The counters `describe_metrics` describes (`describe_counter!("name", ...)`).
fn described_counters() -> Vec<String> {
    let text = std::fs::read_to_string(repo().join("crates/sundial-server/src/lib.rs")).unwrap();
    text.match_indices("describe_counter!(")
        .filter_map(|(i, m)| {
            let rest = text[i + m.len()..].trim_start().strip_prefix('"')?;
            Some(rest.split('"').next()?.to_string())
        })
        .collect()
}

/// A fresh server, before anything happened: every counter has a series at 0 (the per-queue ones
/// for the `default` queue), so that a rate or an alert over it has data from the start; the
/// process metrics are there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_server_reports_every_counter_from_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let text = scrape(&server.url).await;
    let series = scraped_series(&text);
    let counters = described_counters();
    assert!(counters.len() >= 15, "found {} counters", counters.len());
    let missing: Vec<&String> = counters
        .iter()
        // HTTP request counters are labelled by the request; they appear with the first one.
        .filter(|c| *c != "sundial_http_requests_total")
        .filter(|c| !series.contains_key(c.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "not in a fresh scrape: {missing:?}\n{text}"
    );
    assert!(
        text.contains(r#"sundial_lease_expiries_total{namespace="default",queue="default"} 0"#),
        "{text}"
    );
    for p in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_start_time_seconds",
    ] {
        assert!(series.contains_key(p), "no {p} in\n{text}");
    }
    // A queue seen for the first time gets its counters at 0 on the next scrape.
    let mut t = CreateTask::new("later");
    t.queue = Some("fresh-queue".into());
    t.delay = Some("1h".into());
    let created = server.client().create(&t).await.unwrap();
    let text = scrape(&server.url).await;
    assert!(
        text.contains(r#"sundial_task_dead_total{namespace="default",queue="fresh-queue"} 0"#),
        "{text}"
    );
    assert!(
        text.contains(r#"sundial_task_created_total{namespace="default",queue="fresh-queue"} 1"#),
        "{text}"
    );
    // Requests are counted by route template, not by the path sent.
    assert!(
        text.contains(
            r#"sundial_http_requests_total{route="/v1/tasks",method="POST",status_class="2xx"} 1"#
        ),
        "{text}"
    );
    server
        .client()
        .get(&uuid::Uuid::now_v7().to_string())
        .await
        .ok();
    server
        .client()
        .cancel(&created.id.to_string())
        .await
        .unwrap();
    let text = scrape(&server.url).await;
    assert!(
        text.contains(r#"sundial_task_cancelled_total{namespace="default",queue="fresh-queue"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"sundial_http_requests_total{route="/v1/tasks/{id}",method="GET",status_class="4xx"} 1"#),
        "{text}"
    );
}

/// The sum of a histogram's samples, over every label set.
fn histogram_sum(text: &str, name: &str) -> f64 {
    let prefix = format!("{name}_sum");
    text.lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A task whose `run_at` is years in the past runs at once; its lateness is measured from its
/// creation, not from that `run_at`, and so is the worker's pickup wait. No attempt, kind or id
/// label appears on the task series.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_past_run_at_is_not_counted_as_lateness() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let client = server.client();
    let mut t = CreateTask::new("old");
    t.queue = Some("past".into());
    t.run_at = Some("2019-01-01T00:00:00Z".into());
    client.create(&t).await.unwrap();
    let polled = client
        .poll("past", "w", 1, Duration::from_secs(5), None)
        .await
        .unwrap();
    let task = polled.tasks.first().expect("the task is due at once");
    client
        .fail(task.id, task.execution_id, "once more".into(), true)
        .await
        .unwrap();
    let text = scrape(&server.url).await;
    for name in [
        "sundial_fire_lateness_seconds",
        "sundial_dispatch_wait_seconds",
    ] {
        let sum = histogram_sum(&text, name);
        assert!(
            sum < 60.0,
            "{name} sums to {sum} s for a task that ran at once\n{text}"
        );
    }
    assert!(
        text.contains(r#"sundial_task_failures_total{namespace="default",queue="past"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"sundial_task_retries_total{namespace="default",queue="past"} 1"#),
        "{text}"
    );
    for label in ["attempt=", "kind=", "id="] {
        assert!(
            !text
                .lines()
                .any(|l| l.starts_with("sundial_task") && l.contains(label)),
            "a task series has the unbounded label {label}\n{text}"
        );
    }
}
