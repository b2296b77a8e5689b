# cython: language_level=3, freethreading_compatible=True
# cython: auto_pickle=False
"""The fast path of ``LoadShedder``, compiled: ``_shed_py`` (the spec) without a Python frame.

``with shedder:`` while nobody waits costs one call of the limit's admission and one of its
release, plus what ``with`` costs on any C object. The admission count is a C atomic, so it is
exact on free-threaded builds too.
"""

from cpython.contextvars cimport get_value
from libc.stdint cimport int64_t

from ._deadline import current_var as _deadline_var

cdef extern from "_fb_atomic.h" nogil:
    int64_t fb_add(int64_t *p, int64_t v)
    int64_t fb_load_rlx(int64_t *p)
    void fb_store_rlx(int64_t *p, int64_t v)

cdef object _dl_var = _deadline_var


cdef class ShedderCore:
    """The admission fast path of ``LoadShedder`` (internal: see ``_shed_py``)."""

    cdef public object _try
    cdef public object _rel
    cdef public Py_ssize_t _live
    cdef public bint _idle
    cdef int64_t admitted

    @property
    def _admitted(self):
        return fb_load_rlx(&self.admitted)

    @_admitted.setter
    def _admitted(self, int64_t value):
        fb_store_rlx(&self.admitted, value)

    def _admit_one(self):
        """Count one admission."""
        fb_add(&self.admitted, 1)

    def __enter__(self):
        if self._live == 0 and get_value(_dl_var, None) is None and self._try():
            fb_add(&self.admitted, 1)
            return self
        self._acquire()
        return self

    def __exit__(self, exc_type, exc, tb):
        if self._idle:
            self._rel()
            if not self._idle:
                self._kick()  # someone queued meanwhile: the slot just freed is theirs
            return None
        self._exit_slow(exc)
        return None
