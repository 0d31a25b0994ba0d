//! Cron expressions: compiling never panics, and a compiled expression's next fire after any
//! instant is strictly after it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sundial::Timestamp;
use sundial_core::schedule::ScheduleSpec;

fuzz_target!(|data: &[u8]| {
    // The first eight bytes pick the instant asked about, the rest is the expression.
    if data.len() < 8 {
        return;
    }
    let (at, expr) = data.split_at(8);
    let Ok(expr) = std::str::from_utf8(expr) else {
        return;
    };
    let mut raw = [0u8; 8];
    raw.copy_from_slice(at);
    // 1970 .. 2100, in milliseconds.
    let at = (u64::from_le_bytes(raw) % 4_102_444_800_000) as i64;
    if let Ok(compiled) = ScheduleSpec::cron(expr.to_owned()).compile() {
        let t = Timestamp::from_millis(at);
        if let Some(next) = compiled.next_fire_after(t) {
            assert!(next > t, "{expr:?}: next fire {next:?} is not after {t:?}");
        }
    }
});
