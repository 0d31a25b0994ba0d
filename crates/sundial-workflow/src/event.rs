//! History events: what a run's history is made of, and how replay tells them apart.
//!
//! A history is a sequence of events numbered from 0. Event 0 is always [`Event::WorkflowStarted`].
//! After it, the history is a series of *workflow tasks*, each recorded as one marker
//! ([`Event::WorkflowTaskCompleted`]) followed by the *commands* the workflow issued in that task
//! (schedule an activity, start a timer, record a side effect, complete…). Between workflow tasks
//! come the *inputs* recorded from outside (an activity's result, a timer that fired, a signal, a
//! cancel request). Replay applies the inputs that precede a marker, runs the workflow until it
//! blocks, and checks that it issued exactly the commands that follow the marker.
//!
//! The JSON form (`{"type": "activity_scheduled", "cmd": 0, …}`) is the stored and the wire form;
//! it is stable: new fields are optional, variants are never renamed.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sundial_core::{Backoff, RunId, TaskId, Timestamp};

/// One event of a history (its `type` and fields; [`WorkflowEvent`] adds its number and time).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema), schema(as = WorkflowEventBody))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// Event 0: the run's type and input.
    WorkflowStarted {
        workflow_type: String,
        input: Value,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        continued_from: Option<RunId>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        parent_workflow_id: Option<String>,
        /// Seeds the workflow's deterministic random numbers.
        #[serde(default)]
        seed: u64,
    },
    /// A workflow task ran; its commands follow. Its time is the workflow's `now()` in that task.
    WorkflowTaskCompleted {
        /// What `continue_as_new_suggested()` answered in that task.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        continue_as_new_suggested: bool,
    },

    // ---- commands (recorded by workflow tasks) ------------------------------------------------
    ActivityScheduled {
        cmd: u32,
        name: String,
        input: Value,
        task: TaskId,
        max_attempts: u32,
        /// Milliseconds; read also from a duration string (`"30s"`), written as the number.
        #[serde(deserialize_with = "sundial_core::duration::millis")]
        timeout_ms: u64,
        backoff: Backoff,
        /// An HTTP target: Sundial calls it (the input as the body) instead of running
        /// activity code; a 2xx answer's body is the result.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        target: Option<sundial_core::Target>,
    },
    ActivityCancelRequested {
        cmd: u32,
        task: TaskId,
    },
    TimerStarted {
        cmd: u32,
        /// Milliseconds since the epoch; read also from an RFC 3339 string, written as the number.
        #[serde(deserialize_with = "sundial_core::rfc3339::millis_or_rfc3339")]
        fire_at: Timestamp,
        task: TaskId,
    },
    TimerCancelled {
        cmd: u32,
        task: TaskId,
    },
    SideEffect {
        cmd: u32,
        value: Value,
    },
    /// `patched(id)` returned true here.
    Patched {
        id: String,
    },
    ChildStartRequested {
        cmd: u32,
        workflow_type: String,
        workflow_id: String,
        input: Value,
        task: TaskId,
    },
    ChildCancelRequested {
        cmd: u32,
        workflow_id: String,
        task: TaskId,
    },
    WorkflowCompleted {
        result: Value,
    },
    WorkflowFailed {
        error: String,
    },
    WorkflowCancelled {
        error: String,
    },
    WorkflowContinuedAsNew {
        new_run_id: RunId,
        input: Value,
    },

    // ---- inputs (recorded from outside the workflow code) ------------------------------------
    ActivityCompleted {
        cmd: u32,
        result: Value,
    },
    ActivityFailed {
        cmd: u32,
        error: String,
        attempts: u32,
    },
    TimerFired {
        cmd: u32,
    },
    SignalReceived {
        name: String,
        input: Value,
    },
    CancelRequested {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    ChildStarted {
        cmd: u32,
        run_id: RunId,
    },
    ChildStartFailed {
        cmd: u32,
        error: String,
    },
    ChildClosed {
        cmd: u32,
        status: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        result: Option<Value>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// Terminated from outside; no workflow code ran.
    WorkflowTerminated {
        reason: String,
    },
}

/// What role an event plays in replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Start,
    Marker,
    Command,
    Input,
}

impl Event {
    pub(crate) fn role(&self) -> Role {
        use Event::*;
        match self {
            WorkflowStarted { .. } => Role::Start,
            WorkflowTaskCompleted { .. } => Role::Marker,
            ActivityScheduled { .. }
            | ActivityCancelRequested { .. }
            | TimerStarted { .. }
            | TimerCancelled { .. }
            | SideEffect { .. }
            | Patched { .. }
            | ChildStartRequested { .. }
            | ChildCancelRequested { .. }
            | WorkflowCompleted { .. }
            | WorkflowFailed { .. }
            | WorkflowCancelled { .. }
            | WorkflowContinuedAsNew { .. } => Role::Command,
            ActivityCompleted { .. }
            | ActivityFailed { .. }
            | TimerFired { .. }
            | SignalReceived { .. }
            | CancelRequested { .. }
            | ChildStarted { .. }
            | ChildStartFailed { .. }
            | ChildClosed { .. }
            | WorkflowTerminated { .. } => Role::Input,
        }
    }

    /// The JSON `type` of the event.
    pub fn type_name(&self) -> &'static str {
        use Event::*;
        match self {
            WorkflowStarted { .. } => "workflow_started",
            WorkflowTaskCompleted { .. } => "workflow_task_completed",
            ActivityScheduled { .. } => "activity_scheduled",
            ActivityCancelRequested { .. } => "activity_cancel_requested",
            TimerStarted { .. } => "timer_started",
            TimerCancelled { .. } => "timer_cancelled",
            SideEffect { .. } => "side_effect",
            Patched { .. } => "patched",
            ChildStartRequested { .. } => "child_start_requested",
            ChildCancelRequested { .. } => "child_cancel_requested",
            WorkflowCompleted { .. } => "workflow_completed",
            WorkflowFailed { .. } => "workflow_failed",
            WorkflowCancelled { .. } => "workflow_cancelled",
            WorkflowContinuedAsNew { .. } => "workflow_continued_as_new",
            ActivityCompleted { .. } => "activity_completed",
            ActivityFailed { .. } => "activity_failed",
            TimerFired { .. } => "timer_fired",
            SignalReceived { .. } => "signal_received",
            CancelRequested { .. } => "cancel_requested",
            ChildStarted { .. } => "child_started",
            ChildStartFailed { .. } => "child_start_failed",
            ChildClosed { .. } => "child_closed",
            WorkflowTerminated { .. } => "workflow_terminated",
        }
    }

    /// A short human description, for non-determinism reports.
    pub fn describe(&self) -> String {
        use Event::*;
        match self {
            ActivityScheduled { cmd, name, .. } => format!("activity {name:?} (command {cmd})"),
            ActivityCancelRequested { cmd, .. } => {
                format!("cancel of activity command {cmd}")
            }
            TimerStarted { cmd, .. } => format!("timer (command {cmd})"),
            TimerCancelled { cmd, .. } => format!("cancel of timer command {cmd}"),
            SideEffect { cmd, .. } => format!("side effect (command {cmd})"),
            Patched { id } => format!("patch marker {id:?}"),
            ChildStartRequested {
                cmd, workflow_type, ..
            } => format!("child workflow {workflow_type:?} (command {cmd})"),
            ChildCancelRequested { cmd, .. } => format!("cancel of child command {cmd}"),
            WorkflowCompleted { .. } => "workflow completion".into(),
            WorkflowFailed { .. } => "workflow failure".into(),
            WorkflowCancelled { .. } => "workflow cancellation".into(),
            WorkflowContinuedAsNew { .. } => "continue-as-new".into(),
            other => other.type_name().replace('_', " "),
        }
    }

    /// Whether a command the workflow issued now is the one recorded: same kind, same command
    /// number, same identity (activity name, child type, patch id). Inputs, durations and ids
    /// generated at record time are not compared.
    pub(crate) fn same_command(recorded: &Event, issued: &Event) -> bool {
        use Event::*;
        match (recorded, issued) {
            (
                ActivityScheduled {
                    cmd: a, name: n, ..
                },
                ActivityScheduled {
                    cmd: b, name: m, ..
                },
            ) => a == b && n == m,
            (ActivityCancelRequested { cmd: a, .. }, ActivityCancelRequested { cmd: b, .. })
            | (TimerStarted { cmd: a, .. }, TimerStarted { cmd: b, .. })
            | (TimerCancelled { cmd: a, .. }, TimerCancelled { cmd: b, .. })
            | (SideEffect { cmd: a, .. }, SideEffect { cmd: b, .. })
            | (ChildCancelRequested { cmd: a, .. }, ChildCancelRequested { cmd: b, .. }) => a == b,
            (Patched { id: a }, Patched { id: b }) => a == b,
            (
                ChildStartRequested {
                    cmd: a,
                    workflow_type: x,
                    ..
                },
                ChildStartRequested {
                    cmd: b,
                    workflow_type: y,
                    ..
                },
            ) => a == b && x == y,
            (WorkflowCompleted { .. }, WorkflowCompleted { .. })
            | (WorkflowFailed { .. }, WorkflowFailed { .. })
            | (WorkflowCancelled { .. }, WorkflowCancelled { .. })
            | (WorkflowContinuedAsNew { .. }, WorkflowContinuedAsNew { .. }) => true,
            _ => false,
        }
    }
}

/// An event with its number and time, as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkflowEvent {
    pub seq: u64,
    /// Milliseconds since the Unix epoch.
    pub at: Timestamp,
    #[serde(flatten)]
    pub event: Event,
}

impl WorkflowEvent {
    /// Decodes a stored event.
    pub fn decode(e: &sundial_store::HistoryEvent) -> Result<Self, serde_json::Error> {
        Ok(WorkflowEvent {
            seq: e.seq,
            at: e.at,
            event: serde_json::from_str(&e.data)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_form_is_tagged_and_round_trips() {
        let e = Event::ActivityScheduled {
            cmd: 2,
            name: "charge".into(),
            input: serde_json::json!({"amount": 5}),
            task: TaskId::from_bytes([1; 16]),
            max_attempts: 3,
            timeout_ms: 1_000,
            backoff: Backoff::default(),
            target: None,
        };
        let s = serde_json::to_string(&e).expect("serialise");
        assert!(
            s.starts_with(r#"{"type":"activity_scheduled","cmd":2"#),
            "{s}"
        );
        assert!(
            !s.contains("target"),
            "no target: not written (older histories read alike)"
        );
        assert_eq!(serde_json::from_str::<Event>(&s).expect("parse"), e);
        let with = Event::ActivityScheduled {
            cmd: 2,
            name: "charge".into(),
            input: serde_json::json!({"amount": 5}),
            task: TaskId::from_bytes([1; 16]),
            max_attempts: 3,
            timeout_ms: 1_000,
            backoff: Backoff::default(),
            target: Some(sundial_core::Target::new("https://example.com/charge")),
        };
        let s = serde_json::to_string(&with).expect("serialise");
        assert_eq!(serde_json::from_str::<Event>(&s).expect("parse"), with);
        let m: Event =
            serde_json::from_str(r#"{"type":"workflow_task_completed"}"#).expect("parse");
        assert_eq!(
            m,
            Event::WorkflowTaskCompleted {
                continue_as_new_suggested: false
            }
        );
        let w = WorkflowEvent {
            seq: 4,
            at: Timestamp(9),
            event: Event::TimerFired { cmd: 1 },
        };
        let s = serde_json::to_string(&w).expect("serialise");
        assert_eq!(s, r#"{"seq":4,"at":9,"type":"timer_fired","cmd":1}"#);
        assert_eq!(serde_json::from_str::<WorkflowEvent>(&s).expect("parse"), w);
    }

    /// Commands from a remote worker may give durations and times in the task API's forms; they
    /// are stored in the numeric form.
    #[test]
    fn commands_take_duration_strings_and_rfc3339_times() {
        let timer: Event = serde_json::from_str(
            r#"{"type":"timer_started","cmd":1,"fire_at":"2030-01-02T03:04:05.250Z","task":"00000000-0000-0000-0000-000000000001"}"#,
        )
        .expect("parse");
        let Event::TimerStarted { fire_at, .. } = &timer else {
            panic!("{timer:?}")
        };
        assert_eq!(*fire_at, Timestamp(1_893_553_445_250));
        let s = serde_json::to_string(&timer).expect("serialise");
        assert!(s.contains(r#""fire_at":1893553445250"#), "{s}");
        let numeric: Event = serde_json::from_str(&s).expect("parse");
        assert_eq!(numeric, timer);

        let act: Event = serde_json::from_str(
            r#"{"type":"activity_scheduled","cmd":2,"name":"charge","input":null,"task":"00000000-0000-0000-0000-000000000002","max_attempts":3,"timeout_ms":"30s","backoff":{"initial_ms":"1s","factor":2.0,"max_ms":"1h","jitter":0.0}}"#,
        )
        .expect("parse");
        let Event::ActivityScheduled {
            timeout_ms,
            backoff,
            ..
        } = &act
        else {
            panic!("{act:?}")
        };
        assert_eq!(*timeout_ms, 30_000);
        assert_eq!((backoff.initial_ms, backoff.max_ms), (1_000, 3_600_000));
        let s = serde_json::to_string(&act).expect("serialise");
        assert!(s.contains(r#""timeout_ms":30000"#), "{s}");

        for (bad, says) in [
            (r#""fire_at":"tomorrow""#, "use RFC 3339"),
            (r#""fire_at":1.5"#, "whole milliseconds"),
        ] {
            let json = format!(
                r#"{{"type":"timer_started","cmd":1,{bad},"task":"00000000-0000-0000-0000-000000000001"}}"#
            );
            let e = serde_json::from_str::<Event>(&json)
                .expect_err(bad)
                .to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
        let e = serde_json::from_str::<Event>(
            r#"{"type":"activity_scheduled","cmd":2,"name":"c","input":null,"task":"00000000-0000-0000-0000-000000000002","max_attempts":3,"timeout_ms":"30 s","backoff":{"initial_ms":1,"factor":2.0,"max_ms":1,"jitter":0.0}}"#,
        )
        .expect_err("a bad duration")
        .to_string();
        assert!(e.contains("spaces are not allowed"), "{e}");
    }
}
