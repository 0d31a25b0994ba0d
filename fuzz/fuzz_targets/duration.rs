//! The wire's duration parser (`"90s"`, `"1h30m"`): never panics, and whatever it accepts
//! formats back to a string that parses to the same duration.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sundial_server::duration;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(d) = duration::parse(s) {
        assert_eq!(duration::parse(&duration::format(d)), Ok(d), "round trip of {s:?}");
    }
});
