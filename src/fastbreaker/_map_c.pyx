# cython: language_level=3, freethreading_compatible=True
"""The compiled BreakerMap: key lookup and CLOSED admission in one C call.

``_map_py.py`` is the pure-Python twin and the specification of the call path; ``_map.py``
selects the class. Only what every keyed call runs is written here; construction, creation,
eviction and metrics are the functions of ``_map_steps`` (shared with the twin), so that logic
exists once. The map is one extension type, not a Python subclass of one: CPython 3.11
specializes a method call only when the receiver's type is exactly the method's type, and a
subclass costs ~12 ns per call.

``allow(key)`` admits a CLOSED breaker through the core's C API (``fb_breaker_acquire_closed``)
instead of calling its ``allow()`` method: that saves one Python-level call, which is what keeps
``m.allow(key)`` next to the cost of ``d[key].allow()``. That entry point reads the state word and
admits in one step (it admits only a CLOSED, unclaimed word, where admission makes no
transition), so no transition can fall between the check and the admission, with or without the
GIL. Every other state goes through ``breaker.allow()``, which fires state-change callbacks.
"""

cimport cython
from cpython.exc cimport PyErr_Clear
from cpython.ref cimport PyObject, Py_DECREF, Py_INCREF

from libc.stdint cimport int64_t

from ._breaker_c cimport (fb_breaker_t, fb_breaker_handle, fb_breaker_acquire_closed,
                          fb_breaker_call, fb_breaker_record, fb_breaker_state,
                          fb_breaker_spare, FB_SUCCESS, FB_FAILURE)

cdef extern from "_fb_atomic.h" nogil:
    int64_t fb_load_acq(int64_t *p)

from . import _breaker_c
from . import _map_steps as _steps
from ._keywords import check_keywords as _check_keywords, keyword_names as _keyword_names
from ._options import class_signature
from ._region_map import TAGS_AT as _TAGS_AT

cdef Py_ssize_t TAGS_AT = _TAGS_AT

cdef extern from *:
    """
    /* A new reference to d[key], or NULL (absent, or an error is set). Free-threaded builds need
       the strong reference: another thread may drop the key meanwhile. */
    static CYTHON_INLINE PyObject *fb_map_get(PyObject *d, PyObject *key) {
    #if PY_VERSION_HEX >= 0x030D0000
        PyObject *v = NULL;
        (void)PyDict_GetItemRef(d, key, &v);
        return v;
    #else
        PyObject *v = PyDict_GetItemWithError(d, key);
        Py_XINCREF(v);
        return v;
    #endif
    }
    """
    PyObject *fb_map_get(PyObject *d, object key)


cdef extern from *:
    """
    /* The map's dict. On a free-threaded build, a dict whose keys are all str compares, along a
       probe, each stored key it meets by first taking a reference to it: a key added by another
       thread (its count not yet shared) sends the lookup to the dict's lock, and otherwise the
       count is a word the threads write in turn. A dict that has held a non-str key keeps the
       general layout, which compares the stored hash first and touches only a key whose hash is
       equal. So a free-threaded map's dict holds a non-str key for a moment at creation. */
    static PyObject *fb_map_new_dict(void) {
        PyObject *d = PyDict_New();
    #ifdef Py_GIL_DISABLED
        if (d != NULL) {
            PyObject *k = PyLong_FromLong(0);
            if (k == NULL || PyDict_SetItem(d, k, Py_None) < 0 || PyDict_DelItem(d, k) < 0) {
                Py_XDECREF(k);
                Py_DECREF(d);
                return NULL;
            }
            Py_DECREF(k);
        }
    #endif
        return d;
    }
    """
    dict fb_map_new_dict()


cdef object lookup_rest(BreakerMap m, object key, PyObject *p):
    # p: fb_map_get's new reference to the key's breaker, or NULL
    cdef int64_t *bound
    if p == NULL:
        # absent, or unhashable: _new raises the error that names the parameter
        PyErr_Clear()
        return _steps._new(m, key)
    breaker = <object>p
    Py_DECREF(breaker)  # <object> took its own reference
    # a shared map (_region_map): the slot must still hold this key (its tag unchanged)
    bound = fb_breaker_spare(fb_breaker_handle(breaker))
    if fb_load_acq(&m.tags[bound[0]]) != bound[1]:
        return _steps._new(m, key)
    return breaker


cdef inline object lookup(BreakerMap m, object key):
    # <PyObject *>: no reference taken on the dict (on a free-threaded build its count would
    # be a word that every thread's lookups write)
    cdef PyObject *p = fb_map_get(<PyObject *>m._d, key)
    # The hit in a map of its own is all that is inlined into every keyed call; a miss and a
    # shared map's tag check are lookup_rest's, out of line (inlined whole, the function was
    # too large for the compiler to inline: 21 instructions more per m.allow(key)).
    if p != NULL and m.tags == NULL:
        breaker = <object>p
        Py_DECREF(breaker)  # <object> took its own reference
        return breaker
    return lookup_rest(m, key, p)


_SIGNATURE = class_signature(_steps.map_signature())
_KEYWORDS = _keyword_names(_SIGNATURE)


@cython.final
cdef class BreakerMap:
    """One circuit breaker per key (a host, or a ``(host, operation)`` tuple), bounded, no threads.

    ``BreakerMap(failure_threshold=5, reset_timeout=30.0, *, <every CircuitBreaker option but
    name>, max_open_ratio=1.0, max_keys=None, clock=None)``. Keys are any hashable. The full
    documentation is the pure-Python twin's (``fastbreaker._map_py.BreakerMap``): the two
    behave identically.
    """

    # help() and inspect.signature(): built from BreakerOptions's, where the options are written.
    __signature__ = _SIGNATURE

    cdef readonly dict _d
    cdef public object _options, _group, _config, _detached, _hook, _lock
    cdef public object _max_keys, _room, _evicted, _untracked, _dropped, _owner
    cdef public object _table          # a shared map's table (_region_map), else None
    cdef int64_t *tags                 # a shared map's slot tags, else NULL
    cdef object __weakref__

    # The rare paths are the twin's functions, so that their logic exists once.
    _core = _breaker_c

    def __cinit__(self, *args, **kwargs):
        self._d = fb_map_new_dict()

    def __init__(self, *args, **kwargs):
        if kwargs and not _KEYWORDS.issuperset(kwargs):  # name this class, not BreakerOptions
            _check_keywords("BreakerMap", kwargs, _KEYWORDS)
        _steps._init(self, *args, **kwargs)

    def _set_tags(self, view):
        """A shared map: ``view`` is its block in the region (the slots' tags are read there)."""
        cdef const unsigned char[::1] mv = view
        self.tags = <int64_t *>&mv[TAGS_AT]

    # -- the call path ---------------------------------------------------------------------------
    # An uninitialised map (made with __new__) has an empty dict: every keyed call reaches
    # _steps._new, which raises the error that names the problem, so the hot path checks nothing.
    @cython.binding(False)
    def allow(self, key):
        """Admit one call for ``key`` (True) or reject it (False); creates the key's breaker."""
        cdef object breaker = lookup(self, key)
        cdef fb_breaker_t *h = fb_breaker_handle(breaker)
        # CLOSED: admitted in C (no transition possible); otherwise the Python path, which
        # fires state-change callbacks.
        if fb_breaker_acquire_closed(h) >= 0:
            return True
        return breaker.allow()

    @cython.binding(False)
    def record_success(self, key, elapsed=None):
        """Report a success for ``key`` (``elapsed`` seconds make it slow when over the limit)."""
        # the core's C entry point when there is no duration (no method lookup: on a
        # free-threaded build the method's reference count is a word every thread writes)
        if elapsed is None:
            fb_breaker_record(lookup(self, key), FB_SUCCESS)
        else:
            lookup(self, key).record_success(elapsed)

    @cython.binding(False)
    def record_failure(self, key):
        """Report a failure for ``key``."""
        fb_breaker_record(lookup(self, key), FB_FAILURE)

    # call(key, fn, /, *args, **kwargs): a METH_FASTCALL C function, installed below the class.

    def call_async(self, key, fn, /, *args, **kwargs):
        """Await ``fn(*args, **kwargs)`` through ``key``'s breaker."""
        return lookup(self, key).call_async(fn, *args, **kwargs)

    def __getitem__(self, key):
        """The key's breaker, created if absent."""
        return lookup(self, key)

    def get(self, key):
        """The key's breaker, or None; never creates one."""
        if self._config is None:
            raise _steps._uninitialised()
        if self._table is not None:
            return _steps._shared_get(self, key)
        return self._d.get(key)

    def __contains__(self, key):
        if self._config is None:
            raise _steps._uninitialised()
        if self._table is not None:
            return _steps._shared_contains(self, key)
        return key in self._d

    def __len__(self):
        if self._config is None:
            raise _steps._uninitialised()
        if self._table is not None:
            return self._table.assigned
        return len(self._d)

    # -- the rest ----------------------------------------------------------------------------------
    def __iter__(self):
        """The keys currently held, in creation order (a snapshot)."""
        return _steps._iter(self)

    def open_keys(self):
        """Keys whose breaker is OPEN, HALF_OPEN or ISOLATED (the stored state; no transition)."""
        return _steps._open_keys(self)

    def metrics(self):
        """A snapshot: counts by state, evictions, suppressed trips, and cumulative call totals."""
        return _steps._metrics(self)

    def on_state_change(self, callback):
        """Register ``callback(key, old_state, new_state)`` for every breaker of the map."""
        return _steps._on_state_change(self, callback)

    def __repr__(self):
        return _steps._repr(self)

    # One rule on both cores: a map is neither copied nor pickled (its breakers are live state).
    def __copy__(self):
        _steps._refuse_copy(self)

    def __deepcopy__(self, memo):
        _steps._refuse_copy(self)

    def __reduce_ex__(self, protocol):
        _steps._refuse_copy(self)

    def __reduce__(self):
        _steps._refuse_copy(self)

    def _closed_items(self):
        """``(key, breaker)`` for the held breakers whose stored state is CLOSED, oldest first."""
        for key, breaker in self._d.items():
            if fb_breaker_state(fb_breaker_handle(breaker)) == 0:
                yield key, breaker

    def _detach(self, breaker, shared, detached, in_flight_ok=True):
        """Give ``breaker`` a group-less config iff it is CLOSED, with no transition in between.

        A breaker on the map's ``shared`` config gets ``detached``; one with its own listeners
        gets a private group-less copy without the map's hook. Unless ``in_flight_ok``, a breaker
        with more permits than outcomes is kept. The core swaps under a claim of the breaker's
        state word, so no trip can slip in between (it would leave the map's count of
        non-CLOSED breakers off by one forever), with or without the GIL, and no admission
        under the GIL. The listener lock
        keeps a concurrent on_state_change() from re-attaching a copy of the map's config.
        """
        with _breaker_c._listener_lock:
            config = breaker._config
            if config is shared:
                config = detached
            else:
                config = config.copy(keep_group=False)
                config.hook = None
            return breaker._swap_config_if_closed(config, in_flight_ok)


# -- call(): a METH_FASTCALL C function -----------------------------------------------------------
# `m.call(key, fn)` is the hot path of a map. As a `def` with *args and **kwargs, Cython made an
# empty dict for **kwargs on every call (issue 26: m.call(key, f) minus f() was 1.47x
# d[key].call(f) on Floor objects in instructions, callgrind); as a C function it packs nothing
# when fn takes no arguments, and calls the core's C entry point (no method lookup).
cdef extern from *:
    """
    typedef PyObject *(*fb_map_fastcall_t)(PyObject *, PyObject **, Py_ssize_t, PyObject *);
    static PyMethodDef fb_map_call_def = {"call", NULL, METH_FASTCALL | METH_KEYWORDS,
        "call($self, key, fn, /, *args, **kwargs)\\n--\\n\\n"
        "Call ``fn(*args, **kwargs)`` through ``key``'s breaker (CircuitOpenError if rejected)."};
    static int fb_map_install_call(PyObject *type, fb_map_fastcall_t impl) {
        PyTypeObject *t = (PyTypeObject *)type;
        PyObject *descr;
        int r;
        fb_map_call_def.ml_meth = (PyCFunction)(void (*)(void))impl;
        descr = PyDescr_NewMethod(t, &fb_map_call_def);
        if (descr == NULL) return -1;
        r = PyDict_SetItemString(t->tp_dict, fb_map_call_def.ml_name, descr);
        Py_DECREF(descr);
        PyType_Modified(t);
        return r;
    }
    """
    ctypedef PyObject *(*fb_map_fastcall_t)(PyObject *, PyObject **, Py_ssize_t, PyObject *)
    int fb_map_install_call(PyObject *t, fb_map_fastcall_t impl) except -1

cdef PyObject *map_call(PyObject *self, PyObject **args, Py_ssize_t nargs,
                        PyObject *kwnames) except NULL:
    cdef Py_ssize_t i, nkw = 0 if kwnames == NULL else len(<tuple>kwnames)
    cdef tuple rest = ()
    cdef dict kwargs = None
    if nargs < 2:
        raise TypeError(f"call() takes at least 2 positional arguments ({nargs} given)")
    if nargs > 2:
        rest = tuple([<object>args[i] for i in range(2, nargs)])
    if nkw:
        kwargs = {(<tuple>kwnames)[i]: <object>args[nargs + i] for i in range(nkw)}
    result = fb_breaker_call(lookup(<BreakerMap><object>self, <object>args[0]), <object>args[1],
                             rest, kwargs)
    Py_INCREF(result)
    return <PyObject *>result

fb_map_install_call(<PyObject *>BreakerMap, <fb_map_fastcall_t>map_call)
