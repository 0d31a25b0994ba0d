//! The push client against loopback sinks: headers and signatures, refused destinations (no
//! connection opened), no redirects, the body cap, timeouts and slow receivers. Every socket in
//! this file is on 127.0.0.0/8.
#![allow(clippy::disallowed_methods)] // timing assertions read the wall clock

mod common;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Behaviour, Sink};
use sundial_core::{PushMethod, Target};
use sundial_push::{
    AddressPolicy, CallError, CallRequest, ClientConfig, MAX_RESPONSE_BYTES, PushClient,
    SigningKey, StaticLookup,
};

fn request(timeout: Duration) -> CallRequest {
    CallRequest {
        webhook_id: "msg_1".into(),
        timestamp: 1_700_000_000,
        task_id: "t1".into(),
        attempt: 2,
        execution_id: "e1".into(),
        traceparent: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into()),
        body: br#"{"a":1}"#.to_vec(),
        timeout,
    }
}

fn client(allow: &[String], lookup: StaticLookup) -> PushClient {
    PushClient::new(ClientConfig {
        policy: AddressPolicy::parse(allow).expect("allow list"),
        lookup: Arc::new(lookup),
        ..ClientConfig::default()
    })
    .expect("client")
}

fn ok200() -> Behaviour {
    Behaviour::Answer {
        status: 200,
        headers: vec![("content-type".into(), "application/json".into())],
        body: br#"{"ok":true}"#.to_vec(),
    }
}

fn lo(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

#[tokio::test]
async fn sends_the_signed_request() {
    let sink = Sink::start("127.0.0.1", ok200()).await;
    let c = client(&[sink.addr.to_string()], StaticLookup::new());
    let key = SigningKey::generate();
    let target = Target::new(sink.url("/hook?x=1"))
        .method(PushMethod::Put)
        .header("x-tenant", "acme");
    let resp = c
        .call(
            &target,
            std::slice::from_ref(&key),
            request(Duration::from_secs(5)),
        )
        .await
        .expect("answer");
    assert_eq!(resp.status, 200);
    assert_eq!(resp.body, br#"{"ok":true}"#);
    assert_eq!(resp.content_type.as_deref(), Some("application/json"));
    assert!(!resp.truncated);
    let got = sink.requests();
    assert_eq!(got.len(), 1);
    let r = &got[0];
    assert_eq!(r.method, "PUT");
    assert_eq!(r.path, "/hook?x=1");
    assert_eq!(r.body, br#"{"a":1}"#);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("x-tenant"), Some("acme"));
    assert_eq!(r.header("webhook-id"), Some("msg_1"));
    assert_eq!(r.header("webhook-timestamp"), Some("1700000000"));
    assert_eq!(
        r.header("webhook-signature"),
        Some(key.sign("msg_1", 1_700_000_000, br#"{"a":1}"#).as_str())
    );
    assert_eq!(r.header("sundial-task-id"), Some("t1"));
    assert_eq!(r.header("sundial-attempt"), Some("2"));
    assert_eq!(r.header("sundial-execution-id"), Some("e1"));
    assert_eq!(
        r.header("traceparent"),
        Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    );
}

#[tokio::test]
async fn loopback_that_is_not_allowed_is_never_connected() {
    let sink = Sink::start("127.0.0.2", ok200()).await;
    let port = sink.addr.port();
    // Nothing allowed; one entry for another port of the same address; one for another address.
    for allow in [
        vec![],
        vec![format!("127.0.0.2:{}", port.wrapping_add(1))],
        vec!["127.0.0.1/32".to_string()],
    ] {
        let lookup = StaticLookup::new()
            .with("sink.test", &[lo("127.0.0.2")])
            .with("mixed.test", &[lo("127.0.0.1"), lo("127.0.0.2")]);
        let c = client(&allow, lookup);
        for url in [
            sink.url("/"),
            format!("http://sink.test:{port}/"),
            format!("http://mixed.test:{port}/"),
            format!("http://[::ffff:127.0.0.2]:{port}/"),
        ] {
            let err = c
                .call(&Target::new(&url), &[], request(Duration::from_secs(5)))
                .await
                .expect_err("refused");
            assert!(
                matches!(err, CallError::Refused(_)),
                "{url} {allow:?}: {err}"
            );
            assert!(!err.is_retryable());
        }
    }
    assert_eq!(sink.connection_count(), 0);

    // The same sink once allowed, by address and by name: reached.
    let lookup = StaticLookup::new().with("sink.test", &[lo("127.0.0.2")]);
    let c = client(&[format!("sink.test:{port}")], lookup);
    let r = c
        .call(
            &Target::new(format!("http://sink.test:{port}/")),
            &[],
            request(Duration::from_secs(5)),
        )
        .await
        .expect("allowed by name");
    assert_eq!(r.status, 200);
    assert_eq!(sink.connection_count(), 1);
}

#[tokio::test]
async fn names_that_do_not_resolve_fail_retryably() {
    let c = client(&[], StaticLookup::new());
    let err = c
        .call(
            &Target::new("http://nowhere.test/"),
            &[],
            request(Duration::from_secs(5)),
        )
        .await
        .expect_err("no such name");
    assert!(err.is_retryable(), "{err}");
}

#[tokio::test]
async fn redirects_are_not_followed() {
    let elsewhere = Sink::start("127.0.0.1", ok200()).await;
    let sink = Sink::start(
        "127.0.0.1",
        Behaviour::Answer {
            status: 302,
            headers: vec![("location".into(), elsewhere.url("/"))],
            body: vec![],
        },
    )
    .await;
    let c = client(&["127.0.0.1/32".into()], StaticLookup::new());
    let r = c
        .call(
            &Target::new(sink.url("/")),
            &[],
            request(Duration::from_secs(5)),
        )
        .await
        .expect("answer");
    assert_eq!(r.status, 302);
    assert_eq!(elsewhere.connection_count(), 0);
}

#[tokio::test]
async fn a_huge_response_is_cut_at_the_cap() {
    const GIB: u64 = 1 << 30;
    let sink = Sink::start("127.0.0.1", Behaviour::Huge(GIB)).await;
    let c = client(&["127.0.0.1/32".into()], StaticLookup::new());
    let t0 = Instant::now();
    let r = c
        .call(
            &Target::new(sink.url("/")),
            &[],
            request(Duration::from_secs(30)),
        )
        .await
        .expect("answer");
    assert_eq!(r.body.len(), MAX_RESPONSE_BYTES);
    assert!(r.truncated);
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    // The sink stops soon after the client hangs up: far less than the gibibyte was sent.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let sent = sink.written.load(std::sync::atomic::Ordering::SeqCst);
    assert!(sent < GIB / 8, "the sink wrote {sent} bytes");
}

#[tokio::test]
async fn a_receiver_that_never_answers_times_out() {
    let sink = Sink::start("127.0.0.1", Behaviour::Silent).await;
    let c = client(&["127.0.0.1/32".into()], StaticLookup::new());
    let t0 = Instant::now();
    let err = c
        .call(
            &Target::new(sink.url("/")),
            &[],
            request(Duration::from_millis(300)),
        )
        .await
        .expect_err("timeout");
    assert!(matches!(err, CallError::Timeout(_)), "{err}");
    assert!(err.is_retryable());
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(3),
        "{took:?}"
    );
}

#[tokio::test]
async fn a_slowloris_receiver_does_not_stall_other_calls() {
    let slow = Sink::start("127.0.0.1", Behaviour::Slowloris(Duration::from_millis(50))).await;
    let fast = Sink::start("127.0.0.1", ok200()).await;
    let c = client(&["127.0.0.1/32".into()], StaticLookup::new());
    let t0 = Instant::now();
    let mut slow_calls = Vec::new();
    for _ in 0..20 {
        let c = c.clone();
        let url = slow.url("/");
        slow_calls.push(tokio::spawn(async move {
            c.call(
                &Target::new(url),
                &[],
                request(Duration::from_millis(1_500)),
            )
            .await
        }));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    for _ in 0..20 {
        let t = Instant::now();
        let r = c
            .call(
                &Target::new(fast.url("/")),
                &[],
                request(Duration::from_secs(5)),
            )
            .await
            .expect("fast answer");
        assert_eq!(r.status, 200);
        assert!(
            t.elapsed() < Duration::from_millis(500),
            "{:?}",
            t.elapsed()
        );
    }
    for s in slow_calls {
        let err = s.await.expect("join").expect_err("slowloris times out");
        assert!(matches!(err, CallError::Timeout(_)), "{err}");
    }
    assert!(t0.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn bad_urls_are_refused_before_any_connection() {
    let c = client(&[], StaticLookup::new());
    for url in ["ftp://127.0.0.1/", "http://u:p@127.0.0.1/", "not a url"] {
        let err = c
            .call(&Target::new(url), &[], request(Duration::from_secs(1)))
            .await
            .expect_err("bad url");
        assert!(matches!(err, CallError::Url(_)), "{url}: {err}");
    }
}
