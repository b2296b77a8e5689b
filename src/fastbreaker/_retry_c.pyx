# cython: language_level=3, freethreading_compatible=True
"""The first attempt of ``@fb.retry`` on a sync function, compiled; ``_retry_py.py`` is its twin
and specification.

The compiled wrapper is an extension type rather than a function: a call reaches its ``__call__``
with the arguments already in a tuple (a Cython function would copy them into a new one, and
build a keyword dict even when there is none), it reads the current deadline through the C API
(``PyContextVar_Get``), and calls ``fn`` with no Python frame of its own. It behaves as the twin's
``functools.wraps`` function does: it has ``__wrapped__``, ``__name__``, ``__doc__`` and the rest,
binds as a method, and pickles by qualified name. Everything after a first attempt that failed,
or under a current deadline, is ``_retry.run_from``, shared by both cores.
"""

cimport cython
from cpython.contextvars cimport get_value

cdef extern from "Python.h":
    object PyMethod_New(object func, object self)  # Cython's cpython.method has 2.x's 3 args

from functools import update_wrapper as _update_wrapper

from . import _retry
from ._deadline import current_var as _current_var


@cython.final
cdef class RetryingCall:
    """A sync function retried by ``@fb.retry``: ``functools.wraps`` of the function."""

    cdef object policy, fn, budget, rest, var
    cdef dict __dict__
    cdef object __weakref__

    def __call__(self, *args, **kwargs):
        cdef object dl = get_value(self.var)
        if dl is not None:
            return self.rest(self.policy, self.fn, args, kwargs, dl, None)
        try:
            result = self.fn(*args, **kwargs) if kwargs else self.fn(*args)
        except Exception as exc:
            failed = exc  # retried outside the handler: no later error is chained to this one
        else:
            if self.budget is not None:
                self.budget.record_success()
            return result
        return self.rest(self.policy, self.fn, args, kwargs, None, failed)

    def __get__(self, obj, objtype):
        # A function is a descriptor: so is this, so that a decorated method binds.
        return self if obj is None else PyMethod_New(self, obj)

    def __reduce__(self):
        # Like a function: pickled by reference to its qualified name in its module.
        return self.__qualname__

    def __repr__(self):
        return f"<retrying {self.fn!r}>"


def first_attempt(policy, fn):
    """The wrapper of ``fn`` whose first attempt runs here (``functools.wraps`` of ``fn``)."""
    cdef RetryingCall wrapper = RetryingCall.__new__(RetryingCall)
    wrapper.policy = policy
    wrapper.fn = fn
    wrapper.budget = policy.budget
    wrapper.rest = _retry.run_from
    wrapper.var = _current_var
    return _update_wrapper(wrapper, fn)
