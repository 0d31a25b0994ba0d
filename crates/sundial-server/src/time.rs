//! Times on the wire: RFC 3339 with an explicit offset (`"2030-01-02T03:04:05Z"`). The parser and
//! formatter live in [`sundial_core::rfc3339`], shared with the workflow crate; this module keeps
//! the server's paths (`sundial_server::time::parse`, `format`).

pub use sundial_core::rfc3339::*;
