//! Name resolution for push calls: every address a name resolves to is checked against the
//! [`AddressPolicy`] before any socket opens, and the connection goes to exactly the addresses
//! that were checked (the HTTP client connects to what this resolver returns; nothing resolves
//! the name a second time, so DNS rebinding cannot swap the address after the check).
//!
//! The resolver needs the port of the call (allow entries can name one). reqwest's resolver
//! interface sees only the name, so the call runs inside a task-local [`CallScope`] that carries
//! the URL's host and port; a resolution outside a scope (a connection the pool finishes in the
//! background after its request went elsewhere) is refused, which only wastes that connection.
//!
//! A name with any refused address is refused as a whole: an answer that mixes a public and a
//! private address is exactly what a rebinding attack looks like.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use crate::address::{AddressPolicy, Refused};

/// A future of resolved addresses.
pub type LookupFuture = Pin<Box<dyn Future<Output = io::Result<Vec<IpAddr>>> + Send>>;

/// Turns a host name into addresses. [`SystemLookup`] in production; tests use
/// [`StaticLookup`] to map test names to loopback addresses.
pub trait Lookup: Send + Sync + 'static {
    fn lookup(&self, host: &str) -> LookupFuture;
}

/// The operating system's resolver (`getaddrinfo` on a blocking thread).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemLookup;

impl Lookup for SystemLookup {
    fn lookup(&self, host: &str) -> LookupFuture {
        let host = host.to_string();
        Box::pin(async move {
            let addrs = tokio::net::lookup_host((host.as_str(), 0)).await?;
            Ok(addrs.map(|a| a.ip()).collect())
        })
    }
}

/// A fixed table of names (lower case) to addresses; any other name does not resolve.
#[derive(Debug, Clone, Default)]
pub struct StaticLookup {
    names: HashMap<String, Vec<IpAddr>>,
}

impl StaticLookup {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn with(mut self, name: &str, addrs: &[IpAddr]) -> Self {
        self.names.insert(name.to_ascii_lowercase(), addrs.to_vec());
        self
    }
}

impl Lookup for StaticLookup {
    fn lookup(&self, host: &str) -> LookupFuture {
        let found = self.names.get(&host.to_ascii_lowercase()).cloned();
        let host = host.to_string();
        Box::pin(async move {
            found.ok_or_else(|| {
                io::Error::new(io::ErrorKind::NotFound, format!("{host} does not resolve"))
            })
        })
    }
}

/// The destination of the call in progress, and where a refusal is reported back.
#[derive(Debug, Clone)]
pub(crate) struct CallScope {
    pub host: String,
    pub port: u16,
    pub refused: Arc<Mutex<Option<Refused>>>,
}

tokio::task_local! {
    pub(crate) static CALL: CallScope;
}

/// The resolver handed to reqwest.
pub(crate) struct CheckedResolver {
    pub lookup: Arc<dyn Lookup>,
    pub policy: Arc<AddressPolicy>,
}

impl Resolve for CheckedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let scope = CALL.try_with(Clone::clone);
        let lookup = self.lookup.clone();
        let policy = self.policy.clone();
        let host = name.as_str().to_string();
        Box::pin(async move {
            let Ok(scope) = scope else {
                return Err("a push destination is resolved only inside its call".into());
            };
            if !scope.host.eq_ignore_ascii_case(&host) {
                return Err(format!("{host} is not the destination of this call").into());
            }
            let ips = lookup.lookup(&host).await?;
            if ips.is_empty() {
                return Err(format!("{host} resolved to no address").into());
            }
            let addrs: Vec<SocketAddr> = ips
                .into_iter()
                .map(|ip| SocketAddr::new(ip, scope.port))
                .collect();
            for a in &addrs {
                if let Err(refused) = policy.check(&host, *a) {
                    if let Ok(mut slot) = scope.refused.lock() {
                        *slot = Some(refused.clone());
                    }
                    return Err(Box::new(refused) as Box<dyn std::error::Error + Send + Sync>);
                }
            }
            Ok(Box::new(addrs.into_iter()) as Addrs)
        })
    }
}
