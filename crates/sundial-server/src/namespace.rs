//! The namespace of a request, and the mapping between the names a namespace's clients use and
//! the names the store keeps (see `sundial_core::namespace` for the encoding).
//!
//! A namespace is chosen by a path prefix: `/v1/namespaces/{ns}/tasks/…` is `/v1/tasks/…` in
//! namespace `ns`; a path without the prefix is the `default` namespace, so clients that predate
//! namespaces keep working. [`select`] runs before routing: it strips the prefix and inserts a
//! [`RequestNamespace`], so every route exists once and its template (metrics, the route matrix,
//! the OpenAPI document) is the same in every namespace. The access layer then refuses a
//! namespace that does not exist (`404`) and a token bound to another one (`404`).
//!
//! Handlers take an [`Ns`] and pass every name through it: [`Ns::qualify`] on the way in,
//! [`Ns::own`] on the way out (which also answers whether a stored object is the namespace's at
//! all: one that is not reads as `404`, exactly like an id that does not exist).
//!
//! This module never touches the store and never decides who may do what.

use axum::extract::{FromRequestParts, Request};
use axum::http::Uri;
use axum::http::request::Parts;
use sundial::{Task, TaskSpec};
use sundial_core::namespace::{self, DEFAULT_NAMESPACE};

/// The path prefix that selects a namespace: `/v1/namespaces/{ns}/…`.
pub const PREFIX: &str = "/v1/namespaces/";

/// The namespace a request named by its path (absent: `default`). Inserted by [`select`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestNamespace(pub String);

/// Strips a `/v1/namespaces/{ns}` prefix from the path and records `{ns}` as the request's
/// namespace. `/v1/namespaces` itself (the admin routes that list and add namespaces) and
/// `/v1/namespaces/{ns}` with nothing after it are left alone.
pub async fn select(mut req: Request) -> Request {
    let Some(rest) = req.uri().path().strip_prefix(PREFIX) else {
        return req;
    };
    let Some((ns, tail)) = rest.split_once('/') else {
        return req;
    };
    if tail.is_empty() || ns.is_empty() {
        return req;
    }
    let ns = ns.to_string();
    let path_and_query = match req.uri().query() {
        Some(q) => format!("/v1/{tail}?{q}"),
        None => format!("/v1/{tail}"),
    };
    let mut parts = req.uri().clone().into_parts();
    let Ok(pq) = path_and_query.parse() else {
        return req;
    };
    parts.path_and_query = Some(pq);
    if let Ok(uri) = Uri::from_parts(parts) {
        *req.uri_mut() = uri;
        req.extensions_mut().insert(RequestNamespace(ns));
    }
    req
}

/// Kinds starting with `sundial.` are Sundial's own (schedule ticks, workflow timers and child
/// starts): their handlers act on what the payload names, so a client may not create one (in
/// any namespace, it could otherwise fire another namespace's schedule).
pub fn check_kind_given(field: &str, kind: &str) -> Result<(), crate::error::ApiError> {
    if kind.starts_with(sundial_core::INTERNAL_QUEUE_PREFIX) {
        return Err(crate::error::ApiError::invalid(
            field,
            format!(
                "kinds starting with {:?} are Sundial's own",
                sundial_core::INTERNAL_QUEUE_PREFIX
            ),
        ));
    }
    Ok(())
}

/// Queues starting with `sundial.` are Sundial's own (schedule ticks, workflow steps): no client
/// creates a task in one or polls one through the task API (the workflow worker routes serve
/// the workflow queues).
pub fn check_queue_given(field: &str, queue: &str) -> Result<(), crate::error::ApiError> {
    if sundial_core::is_internal_queue(queue) {
        return Err(crate::error::ApiError::invalid(
            field,
            format!(
                "queues starting with {:?} are Sundial's own",
                sundial_core::INTERNAL_QUEUE_PREFIX
            ),
        ));
    }
    Ok(())
}

/// The request's namespace, for handlers: never fails (no prefix is the default namespace).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ns(pub String);

impl<S: Send + Sync> FromRequestParts<S> for Ns {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Ns::of(&parts.extensions))
    }
}

impl Default for Ns {
    fn default() -> Self {
        Ns(DEFAULT_NAMESPACE.to_string())
    }
}

impl Ns {
    /// The namespace recorded in a request's extensions (the default one when none is).
    pub fn of(ext: &axum::http::Extensions) -> Ns {
        ext.get::<RequestNamespace>()
            .map_or_else(Ns::default, |n| Ns(n.0.clone()))
    }

    pub fn name(&self) -> &str {
        &self.0
    }

    pub fn is_default(&self) -> bool {
        self.0 == DEFAULT_NAMESPACE
    }

    /// The stored form of a name of this namespace (a queue, key, schedule or workflow id).
    pub fn qualify(&self, name: &str) -> String {
        namespace::qualify(&self.0, name)
    }

    /// The stored form of a name a client of this namespace gave, refusing (`None`) one that
    /// holds the separator: in the default namespace, whose names are stored unchanged, such a
    /// name would be another namespace's stored name.
    pub fn qualify_given(&self, name: &str) -> Option<String> {
        (!name.contains(namespace::SEPARATOR)).then(|| self.qualify(name))
    }

    /// Whether a stored name is this namespace's.
    pub fn owns(&self, stored: &str) -> bool {
        namespace::belongs(&self.0, stored)
    }

    /// A stored name as this namespace knows it; `None` when it is another namespace's.
    pub fn local<'a>(&self, stored: &'a str) -> Option<&'a str> {
        self.owns(stored).then(|| namespace::local(stored))
    }

    /// The stored form of a name a client gave for `field`, or `422` when it holds the
    /// separator (a control character no name may hold: in the default namespace, whose names
    /// are stored unchanged, it would name another namespace's object).
    pub fn given(&self, field: &str, name: &str) -> Result<String, crate::error::ApiError> {
        self.qualify_given(name).ok_or_else(|| {
            crate::error::ApiError::invalid(field, "control characters are not allowed")
        })
    }

    /// A task spec a client gave, in this namespace (queue, key and exclusive key qualified);
    /// `422` when one of them holds the separator.
    pub fn spec(&self, spec: TaskSpec) -> Result<TaskSpec, crate::error::ApiError> {
        check_kind_given("kind", &spec.kind)?;
        check_queue_given("queue", &spec.queue)?;
        self.given("queue", &spec.queue)?;
        if let Some(k) = &spec.key {
            self.given("key", k)?;
        }
        if let Some(ex) = &spec.exclusive {
            self.given("exclusive", &ex.key)?;
        }
        Ok(spec.in_namespace(&self.0))
    }

    /// A stored task as this namespace sees it (its names unqualified); `None` when it is
    /// another namespace's task. A schedule tick sits in Sundial's one shared tick queue (a
    /// default-namespace name) but belongs to its schedule's namespace: the stored schedule id
    /// its payload names decides.
    pub fn own(&self, mut task: Task) -> Option<Task> {
        if !self.owns(&task.queue) {
            return None;
        }
        if task.kind == sundial_store::TICK_KIND
            && let Some(schedule) = task.payload.get("schedule").and_then(|s| s.as_str())
            && !self.owns(schedule)
        {
            return None;
        }
        if !self.is_default() {
            task.queue = namespace::local(&task.queue).to_string();
            task.key = task.key.map(|k| namespace::local(&k).to_string());
            if let Some(ex) = &mut task.exclusive {
                ex.key = namespace::local(&ex.key).to_string();
            }
            if let Some(key) = task.rate.as_mut().and_then(|r| r.key.as_mut()) {
                *key = namespace::local(key).to_string();
            }
        }
        Some(task)
    }

    /// The path of an API route in this namespace (`/v1/tasks/…` →
    /// `/v1/namespaces/{ns}/tasks/…`), for `Location` headers and links.
    pub fn path(&self, v1_path: &str) -> String {
        match v1_path.strip_prefix("/v1/") {
            Some(rest) if !self.is_default() => format!("{PREFIX}{}/{rest}", self.0),
            _ => v1_path.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;

    async fn selected(uri: &str) -> (String, Option<String>) {
        let req = Request::builder().uri(uri).body(Body::empty()).unwrap();
        let req = select(req).await;
        (
            req.uri().to_string(),
            req.extensions()
                .get::<RequestNamespace>()
                .map(|n| n.0.clone()),
        )
    }

    #[tokio::test]
    async fn a_prefixed_path_names_its_namespace_and_keeps_its_query() {
        assert_eq!(
            selected("/v1/namespaces/acme/tasks?queue=q&limit=2").await,
            ("/v1/tasks?queue=q&limit=2".to_string(), Some("acme".into()))
        );
        assert_eq!(
            selected("/v1/namespaces/acme/queues/q/poll").await,
            ("/v1/queues/q/poll".to_string(), Some("acme".into()))
        );
    }

    #[tokio::test]
    async fn the_namespace_admin_routes_and_plain_paths_are_left_alone() {
        for uri in [
            "/v1/namespaces",
            "/v1/namespaces/acme",
            "/v1/namespaces/acme/",
            "/v1/tasks",
        ] {
            assert_eq!(selected(uri).await, (uri.to_string(), None), "{uri}");
        }
    }

    #[test]
    fn paths_and_names_map_both_ways() {
        let acme = Ns("acme".into());
        assert_eq!(acme.path("/v1/tasks/1"), "/v1/namespaces/acme/tasks/1");
        assert_eq!(Ns::default().path("/v1/tasks/1"), "/v1/tasks/1");
        let stored = acme.qualify("emails");
        assert_eq!(acme.local(&stored), Some("emails"));
        assert_eq!(Ns::default().local(&stored), None);
        assert_eq!(acme.local("emails"), None);
        assert_eq!(acme.qualify_given("emails"), Some(stored.clone()));
        assert_eq!(Ns::default().qualify_given(&stored), None);
        assert_eq!(acme.qualify_given(&stored), None);
    }
}
