//! `openapi.json` at the repository root is a committed copy of the server's OpenAPI document (the
//! one served at `/openapi.json`). The Python and TypeScript clients are checked against that copy,
//! so this test fails when the server's document changes and the copy was not updated.
//!
//! To regenerate the copy after an API change:
//!
//! ```sh
//! SUNDIAL_UPDATE_OPENAPI=1 cargo test -p sundial-server --test openapi_snapshot
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic on failure

use std::path::PathBuf;

fn snapshot_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../openapi.json")
}

fn current_document() -> String {
    let mut json = sundial_server::openapi()
        .to_pretty_json()
        .expect("the OpenAPI document serialises");
    json.push('\n');
    json
}

#[test]
fn committed_openapi_json_matches_the_server_document() {
    let path = snapshot_path();
    let current = current_document();
    if std::env::var_os("SUNDIAL_UPDATE_OPENAPI").is_some_and(|v| v == "1") {
        std::fs::write(&path, &current).expect("write openapi.json");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed == current {
        return;
    }
    let first_difference = committed
        .lines()
        .zip(current.lines())
        .enumerate()
        .find(|(_, (a, b))| a != b)
        .map(|(i, (a, b))| {
            format!(
                "first difference at line {}:\n  committed: {a}\n  server:    {b}",
                i + 1
            )
        })
        .unwrap_or_else(|| {
            format!(
                "the committed copy has {} lines, the server's document {}",
                committed.lines().count(),
                current.lines().count()
            )
        });
    panic!(
        "openapi.json ({}) differs from the server's OpenAPI document; {first_difference}\n\n\
         If the API change is intended, regenerate the copy and commit it:\n\n    \
         SUNDIAL_UPDATE_OPENAPI=1 cargo test -p sundial-server --test openapi_snapshot\n",
        path.display()
    );
}

/// The served document is the one the snapshot holds.
#[tokio::test]
async fn served_document_is_the_snapshotted_one() {
    use tower::ServiceExt;
    let dir = tempfile::tempdir().unwrap();
    let sundial = sundial::Sundial::open(dir.path()).await.unwrap();
    let app = sundial_server::router(sundial, sundial_server::ServerConfig::default());
    let req = axum::http::Request::builder()
        .uri("/openapi.json")
        .body(axum::body::Body::empty())
        .unwrap();
    let resp = app.oneshot(req).await.unwrap();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    let served: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    let generated: serde_json::Value = serde_json::from_str(&current_document()).unwrap();
    assert_eq!(served, generated);
}
