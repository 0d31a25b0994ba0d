//! Namespaces: how one namespace's objects are named in the store, so that teams sharing one
//! Sundial cannot see or collide with each other's tasks, queues, keys, schedules and workflows.
//!
//! The `default` namespace stores every name as given (so data written before namespaces existed
//! is the default namespace's). Any other namespace `ns` stores a name `n` as `ns`, then the
//! [`SEPARATOR`], then `n`. The separator is a control character, which no queue name, kind,
//! key, schedule id or workflow id may contain ([`crate::task`] refuses control characters in
//! every name), so the encoding is unambiguous and two namespaces' names never meet. Everything
//! the engine keys by name (queue state, pauses, wake-ups, polls, per-queue settings and
//! retention, exclusive keys) is then per namespace without knowing of namespaces at all.
//!
//! This module owns the encoding and nothing else: it never does I/O, and it does not decide who
//! may use a namespace (that is the server's access layer).

/// The namespace of every request that names none; its names are stored unchanged.
pub const DEFAULT_NAMESPACE: &str = "default";

/// Between a namespace and a name in stored names (ASCII unit separator, a control character).
pub const SEPARATOR: char = '\u{1f}';

/// Whether `ns` is a namespace name: 1 to 63 lower-case letters, digits, `-` and `_`, starting
/// with a letter.
pub fn is_valid_name(ns: &str) -> bool {
    !ns.is_empty()
        && ns.len() <= 63
        && ns.as_bytes()[0].is_ascii_lowercase()
        && ns
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// Whether a stored name's namespace part, if it has one, is a namespace name.
pub fn has_valid_namespace(stored: &str) -> bool {
    match stored.split_once(SEPARATOR) {
        Some((ns, _)) => is_valid_name(ns) && ns != DEFAULT_NAMESPACE,
        None => true,
    }
}

/// The stored form of `name` in namespace `ns`.
pub fn qualify(ns: &str, name: &str) -> String {
    if ns == DEFAULT_NAMESPACE {
        name.to_string()
    } else {
        let mut s = String::with_capacity(ns.len() + 1 + name.len());
        s.push_str(ns);
        s.push(SEPARATOR);
        s.push_str(name);
        s
    }
}

/// The namespace and the name of a stored name.
pub fn split(stored: &str) -> (&str, &str) {
    match stored.split_once(SEPARATOR) {
        Some((ns, name)) => (ns, name),
        None => (DEFAULT_NAMESPACE, stored),
    }
}

/// The namespace a stored name belongs to.
pub fn namespace_of(stored: &str) -> &str {
    split(stored).0
}

/// Whether the stored name belongs to namespace `ns`.
pub fn belongs(ns: &str, stored: &str) -> bool {
    namespace_of(stored) == ns
}

/// The name as its namespace knows it (the stored name without its namespace).
pub fn local(stored: &str) -> &str {
    split(stored).1
}

/// What every stored name of namespace `ns` starts with; `None` for the default namespace, whose
/// names are those without a [`SEPARATOR`]. Stores use this to select one namespace's rows.
pub fn stored_prefix(ns: &str) -> Option<String> {
    (ns != DEFAULT_NAMESPACE).then(|| {
        let mut s = String::with_capacity(ns.len() + 1);
        s.push_str(ns);
        s.push(SEPARATOR);
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_namespace_stores_names_unchanged() {
        assert_eq!(qualify(DEFAULT_NAMESPACE, "emails"), "emails");
        assert_eq!(split("emails"), (DEFAULT_NAMESPACE, "emails"));
        assert!(belongs(DEFAULT_NAMESPACE, "emails"));
        assert_eq!(stored_prefix(DEFAULT_NAMESPACE), None);
    }

    #[test]
    fn another_namespace_round_trips_and_never_meets_the_default() {
        let stored = qualify("acme", "emails");
        assert_ne!(stored, "emails");
        assert_eq!(split(&stored), ("acme", "emails"));
        assert_eq!(local(&stored), "emails");
        assert!(belongs("acme", &stored));
        assert!(!belongs(DEFAULT_NAMESPACE, &stored));
        assert!(!belongs("acm", &stored));
        assert!(stored.starts_with(&stored_prefix("acme").unwrap_or_default()));
        // A name that itself looks like a namespace path stays the namespace's own.
        let odd = qualify("acme", "other/emails");
        assert_eq!(split(&odd), ("acme", "other/emails"));
    }
}
