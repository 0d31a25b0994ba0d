//! The store conformance suite (feature `testkit`): behaviour every backend must show.
