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
