"""The first attempt of ``@fb.retry`` on a sync function: the pure-Python twin of ``_retry_c``.

A retried call almost always succeeds at once, so the first attempt is all that most calls run:
read the current deadline, call, report the success to the budget. Everything else (a deadline
is current, the first attempt failed) is ``_retry.run_from``, shared by both cores.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from . import _retry
from ._deadline import current_var

__all__ = ["first_attempt"]


def first_attempt(policy: _retry.Policy, fn: Callable[..., Any]) -> Callable[..., Any]:
    """The wrapper of ``fn`` whose first attempt runs here (``functools.wraps`` of ``fn``)."""
    budget = policy.budget
    current = current_var.get
    rest = _retry.run_from

    @functools.wraps(fn)
    def retrying_call(*args: Any, **kwargs: Any) -> Any:
        dl = current()
        if dl is not None:
            return rest(policy, fn, args, kwargs, dl, None)
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:
            failed = exc  # retried outside the handler: no later error is chained to this one
        else:
            if budget is not None:
                budget.record_success()
            return result
        return rest(policy, fn, args, kwargs, None, failed)

    return retrying_call
