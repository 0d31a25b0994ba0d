"""Value generators for the string formats of openapi.json that schemathesis does not know.

`.ci/run` loads this module (SCHEMATHESIS_HOOKS) so that the fuzzer can send valid values for
fields whose grammar no pattern states exactly.
"""

import re
from datetime import datetime, timezone

import schemathesis
from hypothesis import strategies as st

# `cron`: five fields. Days of the month stop at 28, so every expression drawn fires in every
# month (the server refuses one that never fires).
_minute = st.one_of(
    st.just("*"),
    st.integers(0, 59).map(str),
    st.integers(1, 30).map(lambda n: f"*/{n}"),
)
_hour = st.one_of(st.just("*"), st.integers(0, 23).map(str))
_day = st.one_of(st.just("*"), st.integers(1, 28).map(str))
_month = st.one_of(st.just("*"), st.integers(1, 12).map(str))
_weekday = st.one_of(st.just("*"), st.integers(0, 6).map(str), st.just("MON-FRI"))

schemathesis.openapi.format(
    "cron", st.tuples(_minute, _hour, _day, _month, _weekday).map(" ".join)
)


# Rules the server checks that JSON Schema cannot state (each is in the field's description in
# openapi.json, and the server refuses a request that breaks one with a 422 naming the field).
# Requests the fuzzer means to be valid are kept to them, so that `positive_data_acceptance`
# checks everything else; requests meant to be invalid are left alone.

_UNITS = {"d": 86_400_000, "h": 3_600_000, "m": 60_000, "s": 1_000, "ms": 1}
_DURATION = re.compile(r"([0-9]+)(ms|d|h|m|s)")
_DAY_MS = _UNITS["d"]


def _millis(value):
    """A wire duration in milliseconds (None when it is not a string)."""
    if not isinstance(value, str):
        return None
    return sum(int(n) * _UNITS[u] for n, u in _DURATION.findall(value))


def _time(value):
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None


_YEAR_MS = 366 * _DAY_MS


def _flow_ok(task):
    """Flow controls: a throttle's `per` and a rate's `per` between 1 ms and 366 days, a rate's
    `limit` at most its `per` in milliseconds, a debounce's `delay` at most 366 days and its
    `max_wait` between that delay and 366 days."""
    for field in ("throttle", "rate"):
        control = task.get(field)
        if isinstance(control, dict):
            per = _millis(control.get("per"))
            if per is not None and not 1 <= per <= _YEAR_MS:
                return False
            limit = control.get("limit")
            if field == "rate" and per is not None and isinstance(limit, int) and limit > per:
                return False
    debounce = task.get("debounce")
    if isinstance(debounce, dict):
        delay = _millis(debounce.get("delay"))
        wait = _millis(debounce.get("max_wait"))
        if delay is not None and delay > _YEAR_MS:
            return False
        if wait is not None and not (delay or 0) <= wait <= _YEAR_MS:
            return False
    return True


def _task_ok(task):
    """A task body: `timeout` (default 5 min) between 1 ms and 7 days, a target's `timeout` not
    above it, a `delay` that keeps the due time before the year 10000, a backoff's `max` not
    below its `initial` (default 5 s) and at most ten years, and the flow controls' rules."""
    if not isinstance(task, dict):
        return True
    if not _flow_ok(task):
        return False
    timeout = _millis(task.get("timeout"))
    if timeout is not None and not 1 <= timeout <= 7 * _DAY_MS:
        return False
    timeout = 300_000 if timeout is None else timeout
    target = task.get("target")
    if isinstance(target, dict):
        call = _millis(target.get("timeout"))
        if call is not None and not 1 <= call <= timeout:
            return False
    delay = _millis(task.get("delay"))
    if delay is not None and delay > 7_000 * 365 * _DAY_MS:
        return False
    backoff = task.get("backoff")
    if isinstance(backoff, dict):
        initial = _millis(backoff.get("initial"))
        cap = _millis(backoff.get("max"))
        if initial is not None and initial > 315_360_000_000 and cap is None:
            return False
        if cap is not None and not (5_000 if initial is None else initial) <= cap <= 315_360_000_000:
            return False
    return True


def _schedule_ok(body):
    """A schedule body: `every` at most 36,500 days, `jitter` at most a day, `catchup_window` at
    most 365 days, `end_at` not before `start_at`, and its task's rules."""
    every = _millis(body.get("every"))
    jitter = _millis(body.get("jitter"))
    if every is not None and every > 36_500 * _DAY_MS:
        return False
    if jitter is not None and jitter > _DAY_MS:
        return False
    catchup = _millis(body.get("catchup_window"))
    if catchup is not None and catchup > 365 * _DAY_MS:
        return False
    start, end = _time(body.get("start_at")), _time(body.get("end_at"))
    if start is not None and end is not None and end < start:
        return False
    # The buffering overlap rules use the schedule's own exclusive key.
    task = body.get("task")
    if (
        body.get("overlap") in ("buffer_one", "buffer_all")
        and isinstance(task, dict)
        and task.get("exclusive") is not None
    ):
        return False
    return _task_ok(task)


def _backfill_ok(body):
    """A backfill: `from` not after `to`, `to` not in the future, and at most 1,000 fire times
    between them (which depends on the schedule: under 1,000 s holds for every schedule, whose
    fires are at least a second apart)."""
    start, end = _time(body.get("from")), _time(body.get("to"))
    if start is None or end is None:
        return True
    return start <= end <= datetime.now(timezone.utc) and (end - start).total_seconds() < 1_000


def _queue_settings_ok(case, body):
    """A queue's settings: Sundial's own queues (`sundial.*`) take no `target` and no
    `concurrency`, and a target's `timeout` is between 1 ms and the longest task timeout (7 days)."""
    queue = (case.path_parameters or {}).get("queue")
    target = body.get("target")
    own = isinstance(queue, str) and queue.startswith("sundial.")
    if own and (target is not None or body.get("concurrency") is not None):
        return False
    if isinstance(target, dict):
        call = _millis(target.get("timeout"))
        if call is not None and not 1 <= call <= 7 * _DAY_MS:
            return False
    return True


def _signal_ok(case):
    """A signal's name is at most 100 bytes of UTF-8 (`maxLength` counts characters)."""
    name = (case.path_parameters or {}).get("name")
    return not isinstance(name, str) or len(name.encode("utf-8", "surrogatepass")) <= 100


def _valid(case):
    """Whether a request meant to be valid keeps to the rules above (others pass as they are)."""
    if case.operation.path == "/v1/workflows/{id}/signals/{name}":
        return _signal_ok(case)
    body = case.body
    if not isinstance(body, dict):
        return True
    method, path = case.operation.method.upper(), case.operation.path
    if method == "POST" and path == "/v1/tasks":
        return _task_ok(body)
    if method == "POST" and path == "/v1/tasks:batch":
        return all(_task_ok(t) for t in body.get("tasks") or [])
    if path in ("/v1/schedules", "/v1/schedules/{id}", "/v1/schedules:preview"):
        return _schedule_ok(body)
    if path == "/v1/schedules/{id}/backfill":
        return _backfill_ok(body)
    if method == "PUT" and path == "/v1/queues/{queue}":
        return _queue_settings_ok(case, body)
    return True


def _positive(case):
    meta = case.meta
    return meta is None or not meta.generation.mode.is_negative


@schemathesis.hook
def filter_case(context, case):
    return not _positive(case) or _valid(case)


@schemathesis.hook
def before_add_examples(context, examples):
    # Explicit examples (built from the document's examples, in the examples and fuzzing
    # phases) skip `filter_case`: drop those that break a rule here.
    examples[:] = [case for case in examples if not _positive(case) or _valid(case)]
