//! Fault battery, model-based store test on PostgreSQL: random operation sequences against the
//! store (a fresh schema per sequence) and an in-memory reference model agree after every step,
//! and no execution id is reused (`sundial_store::model_testkit`). Short form: 24 sequences of up
//! to 60 steps; long form (`SUNDIAL_FAULTS_LONG=1`): 128 of up to 120. Skipped without
//! `SUNDIAL_TEST_DATABASE_URL` (see `common/mod.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic on failure

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};

use proptest::prelude::*;
use sundial_store::model_testkit::{Applied, ops_strategy, run};

fn long() -> bool {
    std::env::var_os("SUNDIAL_FAULTS_LONG").is_some_and(|v| v == "1")
}

static STEPS: AtomicUsize = AtomicUsize::new(0);
static CASES: AtomicUsize = AtomicUsize::new(0);
static APPLIED: std::sync::Mutex<Option<Applied>> = std::sync::Mutex::new(None);

#[test]
fn store_model() {
    if common::database_url().is_none() {
        return;
    }
    let (cases, max_len) = if long() { (128, 120) } else { (24, 60) };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let config = ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(ops in ops_strategy(max_len))| {
        let result = rt.block_on(async {
            let (store, guard) = common::fresh_postgres().await.expect("PostgreSQL");
            let result = run(store.as_ref(), &ops).await;
            drop(store);
            drop(guard);
            result
        });
        CASES.fetch_add(1, Ordering::Relaxed);
        STEPS.fetch_add(ops.len(), Ordering::Relaxed);
        match result {
            Ok(applied) => APPLIED
                .lock()
                .unwrap()
                .get_or_insert_with(Applied::default)
                .add(&applied),
            Err(e) => prop_assert!(false, "{}", e),
        }
    });
    println!(
        "FAULT store_model: backend=postgres form={} sequences={} steps={} disagreements=0 reused_execution_ids=0 applied: {}",
        if long() { "long" } else { "short" },
        CASES.load(Ordering::Relaxed),
        STEPS.load(Ordering::Relaxed),
        APPLIED.lock().unwrap().clone().unwrap_or_default()
    );
}
