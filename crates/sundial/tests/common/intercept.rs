//! The test kit's forwarding store over a fresh embedded store, for tests that step into its
//! calls (count claims, hold one back to force a race, panic inside one).

use std::sync::Arc;

#[allow(unused_imports)]
pub use sundial_store::forwarding::{Forwarding as Intercepted, Hooks as Intercept};

/// `hooks` over a fresh embedded store in `dir`.
pub fn sqlite<H>(dir: &std::path::Path, hooks: H) -> Intercepted<H> {
    let inner: Arc<dyn sundial::Store> = Arc::new(
        sundial::SqliteStore::open_dir(dir, sundial::SqliteOptions::default())
            .expect("open the embedded store"),
    );
    Intercepted::new(inner, hooks)
}

/// Commits the first claim that starts a run without a worker (an in-process run or a push
/// call), then answers it with an error: a connection that went down around the commit.
pub struct LoseFirstRunAnswer(std::sync::atomic::AtomicBool);

impl LoseFirstRunAnswer {
    pub fn new() -> Self {
        LoseFirstRunAnswer(std::sync::atomic::AtomicBool::new(true))
    }
}

#[async_trait::async_trait]
impl Intercept for LoseFirstRunAnswer {
    async fn claim_due(
        &self,
        inner: &dyn sundial::Store,
        claims: Vec<sundial_store::DueClaim>,
        now: sundial::Timestamp,
        fence: Option<sundial_store::Fence>,
    ) -> Result<Vec<sundial_store::ClaimOutcome>, sundial::StoreError> {
        let run = claims.iter().any(|c| {
            matches!(
                c.target,
                sundial_store::ClaimTarget::Run { worker: None, .. }
            )
        });
        if run && self.0.swap(false, std::sync::atomic::Ordering::SeqCst) {
            inner.claim_due(claims, now, fence).await?;
            return Err(sundial::StoreError::unavailable(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "the connection went down around the commit",
            )));
        }
        inner.claim_due(claims, now, fence).await
    }
}
