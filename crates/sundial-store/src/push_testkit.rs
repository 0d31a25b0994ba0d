//! The conformance suite of [`PushSecretStore`] (feature `testkit`), run by every backend with
//! [`push_store_conformance!`](crate::push_store_conformance).
//!
//! The factory returns a [`Fixture`](crate::testkit::Fixture): `Arc<S>` or `(Arc<S>, guard)`, or `None` to skip
//! (a backend whose service is missing here).

use std::sync::Arc;

use sundial_core::Timestamp;
use sundial_core::namespace::DEFAULT_NAMESPACE;

use crate::audit_scope::AuditWrite;
use crate::testkit::in_audit_scope;
use crate::{PushSecret, PushSecretStore};

/// One `#[tokio::test]` per check, each on a fresh store from `$factory`.
#[macro_export]
macro_rules! push_store_conformance {
    (@checks ($factory:expr) $($check:ident)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let fixture = ($factory)().await;
                let Some(store) = $crate::testkit::Fixture::store(&fixture) else {
                    return;
                };
                $crate::push_testkit::$check(store.clone()).await;
                drop(fixture);
            }
        )*
    };
    ($factory:expr $(,)?) => {
        $crate::push_store_conformance!(@checks ($factory)
            push_secrets_round_trip_oldest_first
            push_secret_rotation_expires_the_others_at_once
            push_secret_expiry_never_moves_later
            push_secret_reused_id_is_refused
            push_secrets_are_separate_per_namespace
            push_secret_rotation_stays_in_its_namespace
            push_secret_writes_carry_their_request_audit_record
        );
    };
}

fn secret(id: &str, at: i64) -> PushSecret {
    secret_in(DEFAULT_NAMESPACE, id, at)
}

fn secret_in(ns: &str, id: &str, at: i64) -> PushSecret {
    PushSecret {
        id: id.into(),
        namespace: ns.into(),
        secret: format!("whsec_{id}AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"),
        created_at: Timestamp(at),
        expires_at: None,
    }
}

/// Added secrets read back exactly, oldest first; an empty store has none.
pub async fn push_secrets_round_trip_oldest_first(s: Arc<dyn PushSecretStore>) {
    assert!(
        s.push_secrets(DEFAULT_NAMESPACE)
            .await
            .expect("list")
            .is_empty()
    );
    let mut b = secret("ps_b", 20);
    b.expires_at = Some(Timestamp(99));
    s.add_push_secret(b.clone(), None).await.expect("add b");
    s.add_push_secret(secret("ps_a", 10), None)
        .await
        .expect("add a");
    s.add_push_secret(secret("ps_c", 20), None)
        .await
        .expect("add c");
    let got = s.push_secrets(DEFAULT_NAMESPACE).await.expect("list");
    assert_eq!(got, vec![secret("ps_a", 10), b, secret("ps_c", 20)]);
}

/// A rotation adds the new secret and sets every other active one to expire at the given time,
/// in one write; secrets already expiring earlier keep their time.
pub async fn push_secret_rotation_expires_the_others_at_once(s: Arc<dyn PushSecretStore>) {
    s.add_push_secret(secret("ps_1", 1), None)
        .await
        .expect("add");
    let mut early = secret("ps_2", 2);
    early.expires_at = Some(Timestamp(50));
    s.add_push_secret(early, None).await.expect("add");
    s.add_push_secret(secret("ps_3", 3), Some(Timestamp(100)))
        .await
        .expect("rotate");
    let got = s.push_secrets(DEFAULT_NAMESPACE).await.expect("list");
    let exp: Vec<(&str, Option<i64>)> = got
        .iter()
        .map(|p| (p.id.as_str(), p.expires_at.map(|t| t.0)))
        .collect();
    assert_eq!(
        exp,
        vec![("ps_1", Some(100)), ("ps_2", Some(50)), ("ps_3", None)]
    );
    let active: Vec<&str> = got
        .iter()
        .filter(|p| p.is_active(Timestamp(99)))
        .map(|p| p.id.as_str())
        .collect();
    assert_eq!(active, vec!["ps_1", "ps_3"]);
}

/// Expiring a secret sets its time, never later than it already was; an unknown id says so.
pub async fn push_secret_expiry_never_moves_later(s: Arc<dyn PushSecretStore>) {
    s.add_push_secret(secret("ps_x", 1), None)
        .await
        .expect("add");
    assert!(
        s.expire_push_secret(DEFAULT_NAMESPACE, "ps_x", Timestamp(40))
            .await
            .expect("expire")
    );
    assert!(
        s.expire_push_secret(DEFAULT_NAMESPACE, "ps_x", Timestamp(80))
            .await
            .expect("expire")
    );
    let got = s.push_secrets(DEFAULT_NAMESPACE).await.expect("list");
    assert_eq!(got[0].expires_at, Some(Timestamp(40)));
    assert!(
        !s.expire_push_secret(DEFAULT_NAMESPACE, "ps_nope", Timestamp(1))
            .await
            .expect("expire")
    );
}

/// Adding a secret under an id that exists fails and changes nothing (not even the rotation).
pub async fn push_secret_reused_id_is_refused(s: Arc<dyn PushSecretStore>) {
    s.add_push_secret(secret("ps_1", 1), None)
        .await
        .expect("add");
    let mut again = secret("ps_1", 2);
    again.secret = "whsec_other".into();
    assert!(s.add_push_secret(again, Some(Timestamp(5))).await.is_err());
    assert_eq!(
        s.push_secrets(DEFAULT_NAMESPACE).await.expect("list"),
        vec![secret("ps_1", 1)]
    );
}

/// Each namespace lists only its own secrets; expiring another namespace's secret by its id
/// answers "no such secret" and changes nothing; an id is unique across namespaces.
pub async fn push_secrets_are_separate_per_namespace(s: Arc<dyn PushSecretStore>) {
    s.add_push_secret(secret("ps_d", 1), None)
        .await
        .expect("add default");
    s.add_push_secret(secret_in("acme", "ps_a", 2), None)
        .await
        .expect("add acme");
    s.add_push_secret(secret_in("beta", "ps_b", 3), None)
        .await
        .expect("add beta");
    assert_eq!(
        s.push_secrets(DEFAULT_NAMESPACE).await.expect("list"),
        vec![secret("ps_d", 1)]
    );
    assert_eq!(
        s.push_secrets("acme").await.expect("list"),
        vec![secret_in("acme", "ps_a", 2)]
    );
    assert!(s.push_secrets("empty").await.expect("list").is_empty());

    assert!(
        !s.expire_push_secret(DEFAULT_NAMESPACE, "ps_a", Timestamp(5))
            .await
            .expect("expire"),
        "another namespace's secret is not found"
    );
    assert!(
        !s.expire_push_secret("beta", "ps_a", Timestamp(5))
            .await
            .expect("expire")
    );
    assert_eq!(
        s.push_secrets("acme").await.expect("list")[0].expires_at,
        None,
        "and it is untouched"
    );
    assert!(
        s.expire_push_secret("acme", "ps_a", Timestamp(5))
            .await
            .expect("expire")
    );
    assert_eq!(
        s.push_secrets("acme").await.expect("list")[0].expires_at,
        Some(Timestamp(5))
    );

    // An id taken in one namespace is refused in another, and nothing is written.
    assert!(
        s.add_push_secret(secret_in("beta", "ps_d", 9), Some(Timestamp(7)))
            .await
            .is_err()
    );
    assert_eq!(
        s.push_secrets("beta").await.expect("list"),
        vec![secret_in("beta", "ps_b", 3)]
    );
    assert_eq!(
        s.push_secrets(DEFAULT_NAMESPACE).await.expect("list"),
        vec![secret("ps_d", 1)]
    );
}

/// A rotation expires the other secrets of its own namespace only: other namespaces' active
/// secrets keep signing, each namespace rotating on its own.
pub async fn push_secret_rotation_stays_in_its_namespace(s: Arc<dyn PushSecretStore>) {
    s.add_push_secret(secret("ps_d1", 1), None)
        .await
        .expect("add default");
    s.add_push_secret(secret_in("acme", "ps_a1", 2), None)
        .await
        .expect("add acme");
    s.add_push_secret(secret_in("beta", "ps_b1", 3), None)
        .await
        .expect("add beta");
    s.add_push_secret(secret_in("acme", "ps_a2", 4), Some(Timestamp(100)))
        .await
        .expect("rotate acme");
    let expiries = |v: Vec<PushSecret>| -> Vec<(String, Option<i64>)> {
        v.into_iter()
            .map(|p| (p.id, p.expires_at.map(|t| t.0)))
            .collect()
    };
    assert_eq!(
        expiries(s.push_secrets("acme").await.expect("list")),
        vec![("ps_a1".into(), Some(100)), ("ps_a2".into(), None)]
    );
    assert_eq!(
        expiries(s.push_secrets(DEFAULT_NAMESPACE).await.expect("list")),
        vec![("ps_d1".into(), None)]
    );
    assert_eq!(
        expiries(s.push_secrets("beta").await.expect("list")),
        vec![("ps_b1".into(), None)]
    );

    s.add_push_secret(secret("ps_d2", 5), Some(Timestamp(50)))
        .await
        .expect("rotate default");
    assert_eq!(
        expiries(s.push_secrets(DEFAULT_NAMESPACE).await.expect("list")),
        vec![("ps_d1".into(), Some(50)), ("ps_d2".into(), None)]
    );
    assert_eq!(
        expiries(s.push_secrets("acme").await.expect("list")),
        vec![("ps_a1".into(), Some(100)), ("ps_a2".into(), None)],
        "acme's are as acme's rotation left them"
    );
    assert_eq!(
        expiries(s.push_secrets("beta").await.expect("list")),
        vec![("ps_b1".into(), None)]
    );
}

/// Adding and expiring a secret commit the request's audit record with the write itself;
/// expiring a secret that does not exist leaves it pending for the caller.
pub async fn push_secret_writes_carry_their_request_audit_record(s: Arc<dyn PushSecretStore>) {
    let written = |w: AuditWrite| matches!(w, AuditWrite::Written { .. });
    let (r, w) = in_audit_scope(
        "POST /v1/push/secrets",
        s.add_push_secret(secret("audited", 10), None),
    )
    .await;
    r.expect("add");
    assert!(written(w), "add: {w:?}");
    let (r, w) = in_audit_scope(
        "POST /v1/push/secrets/{id}/expire",
        s.expire_push_secret(DEFAULT_NAMESPACE, "audited", Timestamp(20)),
    )
    .await;
    assert!(r.expect("expire"), "the secret exists");
    assert!(written(w), "expire: {w:?}");
    let (r, w) = in_audit_scope(
        "POST /v1/push/secrets/{id}/expire",
        s.expire_push_secret(DEFAULT_NAMESPACE, "nowhere", Timestamp(20)),
    )
    .await;
    assert!(!r.expect("expire"), "no such secret");
    assert_eq!(w, AuditWrite::Pending, "expiring nothing writes no record");
}
