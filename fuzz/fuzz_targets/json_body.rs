//! The JSON body parser for every request type that takes a body from the network: any bytes
//! give a value or an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sundial_server::extract::parse_json;
use sundial_server::schedules::ScheduleRequest;
use sundial_server::wire::{CreateBatch, CreateTask, PollRequest};

fuzz_target!(|data: &[u8]| {
    let _ = parse_json::<CreateTask>(data);
    let _ = parse_json::<CreateBatch>(data);
    let _ = parse_json::<PollRequest>(data);
    let _ = parse_json::<ScheduleRequest>(data);
    let _ = parse_json::<serde_json::Value>(data);
});
