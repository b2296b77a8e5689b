"""fb.Priority, fb.priority() and fb.current_priority(): a contextvar like fb.deadline."""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest
from hypothesis import given, settings, strategies as st

import fastbreaker


def test_names_values_and_order(fb) -> None:
    P = fb.Priority
    assert [(p.name, int(p)) for p in P] == [
        ("SHEDDABLE", 0),
        ("SHEDDABLE_PLUS", 1),
        ("CRITICAL", 2),
        ("CRITICAL_PLUS", 3),
    ]
    assert P.SHEDDABLE < P.SHEDDABLE_PLUS < P.CRITICAL < P.CRITICAL_PLUS


def test_default_is_critical_and_blocks_nest_and_restore(fb) -> None:
    assert fb.current_priority() is fb.Priority.CRITICAL
    with fb.priority(fb.Priority.SHEDDABLE) as level:
        assert level is fb.Priority.SHEDDABLE
        assert fb.current_priority() is fb.Priority.SHEDDABLE
        with fb.priority(3):
            assert fb.current_priority() is fb.Priority.CRITICAL_PLUS
        assert fb.current_priority() is fb.Priority.SHEDDABLE
    assert fb.current_priority() is fb.Priority.CRITICAL


def test_restored_when_the_block_raises(fb) -> None:
    with pytest.raises(KeyError), fb.priority("sheddable"):
        raise KeyError
    assert fb.current_priority() is fb.Priority.CRITICAL


@pytest.mark.parametrize(
    ("given", "expected"),
    [("SHEDDABLE_PLUS", 1), ("sheddable-plus", 1), (" critical ", 2), ("0", 0), ("3", 3), (1, 1)],
)
def test_parse_accepts_names_and_values(fb, given: object, expected: int) -> None:
    assert fb.Priority.parse(given) is fb.Priority(expected)


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (4, ValueError),
        (-1, ValueError),
        ("urgent", ValueError),
        ("7", ValueError),
        (True, TypeError),
        (1.0, TypeError),
        (None, TypeError),
    ],
)
def test_bad_priority_is_a_clear_error(fb, bad: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="priority"):
        fb.priority(bad)  # type: ignore[arg-type]


def test_a_scope_cannot_be_entered_twice(fb) -> None:
    scope = fb.priority(0)
    with scope, pytest.raises(RuntimeError, match="already active"), scope:
        pass


def test_propagates_into_tasks_and_copied_contexts_not_into_plain_threads(fb) -> None:
    async def child() -> object:
        return fb.current_priority()

    async def main() -> object:
        with fb.priority(fb.Priority.SHEDDABLE):
            task = asyncio.create_task(child())
        return await task

    assert asyncio.run(main()) is fb.Priority.SHEDDABLE

    seen: list[object] = []
    with fb.priority(1):
        ctx = contextvars.copy_context()
        t = threading.Thread(target=lambda: seen.append(fb.current_priority()))
        t.start()
        t.join()
        assert ctx.run(fb.current_priority) is fb.Priority.SHEDDABLE_PLUS
    assert seen == [fb.Priority.CRITICAL]


def test_load_shed_error_carries_reason_and_retry_after(fb) -> None:
    err = fb.LoadShedError("api", "too_old", 0.25)
    assert isinstance(err, fb.BreakerError)
    assert (err.name, err.reason, err.retry_after) == ("api", "too_old", 0.25)
    assert str(err) == "shedder 'api' shed the request (too_old), retry after 0.250s"
    assert fb.LoadShedError.REASONS == ("queue_full", "too_old", "priority", "deadline")


def test_a_load_shed_error_raised_through_a_breaker_is_neutral(fb) -> None:
    cb = fb.CircuitBreaker(failure_threshold=1)

    def shed() -> None:
        raise fb.LoadShedError(None, "priority", 0.0)

    for _ in range(3):
        with pytest.raises(fb.LoadShedError):
            cb.call(shed)
    m = cb.metrics()
    assert (cb.state, m.failures, m.ignored) == (fb.State.CLOSED, 0, 3)


@pytest.mark.parametrize("bad", ["+-1", "--2", "²", "٣", "9" * 5000, "1_0", "0x1", "ſheddable"])
def test_malformed_text_gets_the_documented_error(fb, bad: str) -> None:
    with pytest.raises(ValueError, match=r"priority must be one of SHEDDABLE, .* or 0\.\.3"):
        fb.Priority.parse(bad)


@settings(max_examples=300, deadline=None)
@given(text=st.text() | st.from_regex(r"\s*[+-]{0,2}[0-9]{1,6}\s*", fullmatch=True))
def test_any_text_parses_to_a_priority_or_the_documented_error(text: str) -> None:
    for ns in fastbreaker.testing.implementations().values():
        try:
            got = ns.Priority.parse(text)
        except ValueError as exc:
            assert str(exc).startswith("priority must be one of SHEDDABLE, SHEDDABLE_PLUS, ")
            assert "or 0..3, got " in str(exc)
        else:
            assert isinstance(got, ns.Priority)
            assert got.name == text.strip().upper().replace("-", "_") or got == int(text.strip())
