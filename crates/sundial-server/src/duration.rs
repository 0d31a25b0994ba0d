//! Durations on the wire (`"1500ms"`, `"30s"`, `"5m"`, `"1h30m"`, `"3d"`): the parser, formatter
//! and serde helpers live in [`sundial_core::duration`], shared with the workflow crate; this
//! module keeps the server's paths (`sundial_server::duration::parse`, `crate::duration::opt`).

pub use sundial_core::duration::*;
