//! The wire's RFC 3339 parser: never panics, and whatever it accepts formats back to a string
//! that parses to the same instant.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sundial_server::time;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(t) = time::parse(s) {
        assert_eq!(time::parse(&time::format(t)), Ok(t), "round trip of {s:?}");
    }
});
