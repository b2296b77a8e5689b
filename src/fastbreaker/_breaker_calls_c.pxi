# The call paths of the compiled breaker, included by _breaker_c.pyx: the awaitable
# GuardedCall of call_async(), the `with` stacks, the decorator (GuardedFunction, guard), the
# admission/finish steps every path shares, and call() as a METH_FASTCALL C function. The twin's
# counterpart is _breaker_calls_py.py.

# An awaitable that is complete when made: `await fb_ready(x)` is x, with no coroutine and no
# StopIteration (the am_send slot returns the result directly; __next__ is there for iterators
# driven by hand).
cdef extern from *:
    """
    typedef struct { PyObject_HEAD PyObject *result; } fb_ready_t;
    static PyObject *fb_ready_type = NULL;
    static PyObject *fb_ready_self(PyObject *self) { Py_INCREF(self); return self; }
    static PySendResult fb_ready_send(PyObject *self, PyObject *arg, PyObject **result) {
        PyObject *r = ((fb_ready_t *)self)->result;
        (void)arg;
        Py_INCREF(r);
        *result = r;
        return PYGEN_RETURN;
    }
    static PyObject *fb_ready_next(PyObject *self) {
        PyObject *e = PyObject_CallOneArg(PyExc_StopIteration, ((fb_ready_t *)self)->result);
        if (e != NULL) {
            PyErr_SetObject(PyExc_StopIteration, e);
            Py_DECREF(e);
        }
        return NULL;
    }
    static void fb_ready_dealloc(PyObject *self) {
        PyTypeObject *tp = Py_TYPE(self);
        Py_XDECREF(((fb_ready_t *)self)->result);
        tp->tp_free(self);
        Py_DECREF(tp);
    }
    static PyType_Slot fb_ready_slots[] = {
        {Py_am_await, (void *)fb_ready_self},
        {Py_am_send, (void *)fb_ready_send},
        {Py_tp_iter, (void *)fb_ready_self},
        {Py_tp_iternext, (void *)fb_ready_next},
        {Py_tp_dealloc, (void *)fb_ready_dealloc},
        {0, NULL},
    };
    static PyType_Spec fb_ready_spec = {
        "fastbreaker._breaker_c.Ready", sizeof(fb_ready_t), 0, Py_TPFLAGS_DEFAULT, fb_ready_slots,
    };
    static int fb_ready_init(void) {
        fb_ready_type = PyType_FromSpec(&fb_ready_spec);
        return fb_ready_type == NULL ? -1 : 0;
    }
    static PyObject *fb_ready(PyObject *result) {
        fb_ready_t *r = PyObject_New(fb_ready_t, (PyTypeObject *)fb_ready_type);
        if (r == NULL) return NULL;  /* (PyObject_New took the heap type's reference) */
        Py_INCREF(result);
        r->result = result;
        return (PyObject *)r;
    }
    """
    int fb_ready_init() except -1
    object fb_ready(object result)

fb_ready_init()


# `await breaker.call_async(fn, ...)`: a compiled awaitable in place of _calls.call_async's
# coroutine, with the same steps at the same moments. Nothing happens until it is first
# driven; then it admits the call (CircuitOpenError if rejected), calls fn and drives what fn
# returned, passing on every value sent or exception thrown, and records the outcome exactly
# once: when fn's awaitable returns, raises, is closed (GeneratorExit: neutral) or is dropped
# while suspended (closed by the finalizer, as a suspended coroutine is). It is a Coroutine
# (collections.abc): send, throw, close, __await__, so asyncio.create_task() takes it. When a
# coroutine awaits it, CPython drives it through its am_send slot (gc_am_send) where the
# interpreter uses that slot (3.10, 3.11): no StopIteration is made for its result.
# It answers every driver as a coroutine does (the twin's call_async is one): driven from inside
# its own call (``executing``: while fn or its awaitable runs) it raises ValueError("coroutine
# already executing") and changes nothing; once finished or closed, send and throw raise
# RuntimeError("cannot reuse already awaited coroutine"); StopIteration thrown in before the
# start becomes RuntimeError (PEP 479) where a coroutine's frame converts it (before 3.12; from
# 3.12 on, a throw into an unstarted coroutine raises without running its frame, unconverted).
cdef bint _UNSTARTED_THROW_RUNS_FRAME = _sys.version_info < (3, 12)

cdef extern from "Python.h":
    int PyIter_Send(PyObject *iter, PyObject *arg, PyObject **presult)
    bint PyCoro_CheckExact(object o)

cdef extern from *:
    """
    static void fb_set_am_send(PyObject *type, void *fn) {
        PyTypeObject *tp = (PyTypeObject *)type;
        if (tp->tp_as_async != NULL) tp->tp_as_async->am_send = (sendfunc)fn;
    }
    """
    void fb_set_am_send(object type, void *fn)

cdef enum:
    GC_NEW = 0
    GC_RUNNING = 1
    GC_DONE = 2


@cython.final
cdef class GuardedCall:
    """What the compiled ``breaker.call_async(fn, ...)`` returns: await it (internal)."""

    cdef CircuitBreaker breaker
    cdef object fn, args, kwargs, inner
    cdef int64_t permit, start
    cdef int state
    cdef bint executing

    def __await__(self):
        return self

    def __iter__(self):
        return self

    def __next__(self):
        cdef int returned = 0
        result = gc_advance(self, None, &returned)
        if returned:
            raise StopIteration(result)
        return result

    def send(self, value):
        """Send ``value`` into the awaited call (as ``coroutine.send``)."""
        cdef int returned = 0
        result = gc_advance(self, value, &returned)
        if returned:
            raise StopIteration(result)
        return result

    def throw(self, typ, val=None, tb=None):
        """Raise an exception into the awaited call (as ``coroutine.throw``)."""
        cdef int returned = 0
        result = gc_throw(self, typ, val, tb, &returned)
        if returned:
            raise StopIteration(result)
        return result

    def close(self):
        """Close the awaited call; a call in flight is recorded as neutral (GeneratorExit)."""
        gc_close(self)

    def __del__(self):
        if self.state == GC_RUNNING and not self.executing:
            gc_close(self)


cdef int gc_not_executing(GuardedCall g) except -1:
    if g.executing:
        raise ValueError("coroutine already executing")
    return 0


cdef object gc_start(GuardedCall g):
    """Admit the call and call fn: its awaitable becomes g.inner (_calls.call_async's steps)."""
    cdef CircuitBreaker b = g.breaker
    cdef int64_t permit, start = 0
    fn, args, kwargs = g.fn, g.args, g.kwargs
    g.state = GC_DONE  # until admitted: an error on the way leaves nothing to release
    g.fn = g.args = g.kwargs = None
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {fn!r}")
    permit = acquire_or_reject(b)
    if permit < 0:
        raise open_error(b)
    if cfg_of(&b.st).timed:
        start = _calls.start_or_release(b, permit)
    g.executing = 1
    try:
        aw = fn(*args, **kwargs)
        inner = aw if PyCoro_CheckExact(aw) else _calls.awaiting(aw)
    except BaseException as exc:
        g.executing = 0
        _calls.finish_raised(b, permit, start, exc)
        raise
    g.executing = 0
    g.permit = permit
    g.start = start
    g.inner = inner
    g.state = GC_RUNNING


cdef object gc_returned(GuardedCall g, result):
    """fn's awaitable returned ``result``: record the success."""
    cdef CircuitBreaker b = g.breaker
    g.state = GC_DONE
    g.inner = None
    if cfg_of(&b.st).timed:
        _calls.finish_returned(b, g.permit, g.start)
    else:
        finish(b, g.permit, FB_SUCCESS)
    return result


cdef object gc_raised(GuardedCall g, exc):
    """fn's awaitable raised ``exc``: record its outcome (the caller re-raises it)."""
    cdef CircuitBreaker b = g.breaker
    g.state = GC_DONE
    g.inner = None
    if cfg_of(&b.st).timed:
        _calls.finish_raised(b, g.permit, g.start, exc)
    else:
        finish(b, g.permit, (<Config>cfg_of(&b.st).owner).options.classify(exc))


cdef object gc_advance(GuardedCall g, value, int *returned):
    """One step: what fn's awaitable yields, or (``returned`` set) what it returned."""
    cdef PyObject *out = NULL
    cdef int r
    if g.executing:
        raise ValueError("coroutine already executing")
    if g.state == GC_NEW:
        if value is not None:
            raise TypeError("can't send non-None value to a just-started coroutine")
        gc_start(g)
    elif g.state == GC_DONE:
        raise RuntimeError("cannot reuse already awaited coroutine")
    inner = g.inner
    g.executing = 1
    r = PyIter_Send(<PyObject *>inner, <PyObject *>value, &out)
    g.executing = 0
    try:
        if r == -1:
            raise_current()
    except BaseException as exc:
        gc_raised(g, exc)
        raise
    result = <object>out
    Py_DECREF(result)  # <object> took its own reference
    if r == 1:  # PYGEN_NEXT: fn's awaitable is suspended
        return result
    returned[0] = 1
    return gc_returned(g, result)


cdef object gc_throw(GuardedCall g, typ, val, tb, int *returned):
    gc_not_executing(g)
    if g.state == GC_DONE:
        raise RuntimeError("cannot reuse already awaited coroutine")
    if g.state == GC_NEW:
        # not started: as a coroutine, it raises the exception it is given (and is finished)
        g.state = GC_DONE
        g.fn = g.args = g.kwargs = None
        try:
            return _calls.throw_into(None, typ, val, tb)
        except StopIteration as stop:
            if _UNSTARTED_THROW_RUNS_FRAME:
                raise RuntimeError("coroutine raised StopIteration") from stop
            raise
    inner = g.inner
    g.executing = 1
    try:
        result = _calls.throw_into(inner, typ, val, tb)
    except StopIteration as stop:
        g.executing = 0
        returned[0] = 1
        return gc_returned(g, stop.value)
    except BaseException as exc:
        g.executing = 0
        gc_raised(g, exc)
        raise
    g.executing = 0
    return result


cdef object gc_close(GuardedCall g):
    gc_not_executing(g)
    if g.state != GC_RUNNING:
        g.state = GC_DONE
        g.fn = g.args = g.kwargs = None
        return
    inner = g.inner
    g.executing = 1
    try:
        inner.close()
    except BaseException as exc:
        g.executing = 0
        gc_raised(g, exc)
        raise
    g.executing = 0
    gc_raised(g, GeneratorExit())


cdef int raise_current() except -1:
    """PyIter_Send returned an error: let Cython raise the exception it set."""
    return -1


cdef int gc_am_send(PyObject *self, PyObject *arg, PyObject **presult) except -1:
    """The am_send slot: 1 (PYGEN_NEXT) with the value yielded, 0 (PYGEN_RETURN) with the
    result, or -1 (PYGEN_ERROR) with the exception set."""
    cdef int returned = 0
    result = gc_advance(<GuardedCall>self, <object>arg, &returned)
    Py_INCREF(result)
    presult[0] = <PyObject *>result
    return 0 if returned else 1


fb_set_am_send(GuardedCall, <void *>gc_am_send)
import collections.abc as _abc
_abc.Coroutine.register(GuardedCall)


# `with breaker:` bookkeeping (the compiled counterpart of _calls' Block stacks; same
# observable rules). Each context (thread or asyncio task) that enters a block gets one
# WithStack, found through a ContextVar and owned by the context that made it: a child task
# inherits its parent's value but, being another Context object, makes its own stack on first
# use, so a stack is only ever pushed and popped by the one thread running its context (a
# context cannot be entered twice at once). Entering a block pushes (breaker, permit, start)
# onto it; a normal exit pops the top entry. Nothing is allocated per block.
#
# An exit in a foreign context (a generator closed by another thread or task) cannot find its
# entry on its own stack: it takes, from every live stack, the most recently entered open entry
# of the same breaker. Each entry has a word, (version << 1) | taken: taking an entry, by its
# owner or by a foreign exit, is one CAS from open to taken on the version that was read, so
# every entry is taken exactly once. An owner skips entries taken by a foreign exit and drops
# them once they reach the top. A slot is reused only under a new version, so a foreign exit
# that read a slot before it was reused fails its CAS and looks again. The registry of stacks
# is a list guarded by a spin lock, taken only by foreign exits, by a stack that grows, and by
# a stack's creation and destruction. While a stack has open entries the registry holds a
# reference to it, so that a block entered in a context that has since ended (a thread that
# finished with a suspended generator) can still be taken by the exit that comes later.
ctypedef struct with_entry_t:
    int64_t word
    PyObject *breaker       # a strong reference while the entry is on its stack
    int64_t permit
    int64_t start
    int64_t order           # global entry order: "most recently entered" for foreign exits

ctypedef struct with_stack_t:
    with_entry_t *items
    int64_t n               # entries on the stack (written by the owner only)
    int64_t cap
    int64_t ver             # the owner's version counter for entry words
    int64_t open            # entries not yet taken (atomic)
    PyObject *obj           # the WithStack
    with_stack_t *prev
    with_stack_t *next

cdef int64_t _with_lock = 0
cdef int64_t _with_order = 0
cdef with_stack_t _with_head    # sentinel of the registry's circular list
_with_head.prev = &_with_head
_with_head.next = &_with_head

cdef inline void with_lock() noexcept nogil:
    cdef int64_t expected
    while True:
        expected = 0
        if fb_cas_strong(&_with_lock, &expected, 1):
            return

cdef inline void with_unlock() noexcept nogil:
    fb_store_rel(&_with_lock, 0)


@cython.final
@cython.no_gc
cdef class WithStack:
    """The open ``with`` blocks of one context (internal)."""

    cdef with_stack_t s
    cdef Py_ssize_t owner   # the owning Context's address (compared, never dereferenced)

    def __cinit__(self):
        self.s.items = <with_entry_t *>PyMem_Calloc(8, sizeof(with_entry_t))
        if self.s.items == NULL:
            raise MemoryError()
        self.s.cap = 8
        self.s.obj = <PyObject *>self
        with_lock()
        self.s.prev = &_with_head
        self.s.next = _with_head.next
        _with_head.next.prev = &self.s
        _with_head.next = &self.s
        with_unlock()

    def __dealloc__(self):
        cdef int64_t i
        if self.s.next != NULL:
            with_lock()
            self.s.prev.next = self.s.next
            self.s.next.prev = self.s.prev
            with_unlock()
        for i in range(self.s.n):
            Py_DECREF(<object>self.s.items[i].breaker)
        PyMem_Free(self.s.items)

    @property
    def open_blocks(self):
        """How many blocks entered in this context are open (for tests)."""
        cdef int64_t i, k = 0
        for i in range(self.s.n):
            if not (fb_load_acq(&self.s.items[i].word) & 1):
                k += 1
        return k


cdef object _with_var = _contextvars.ContextVar("fastbreaker_with_blocks", default=None)


cdef inline WithStack own_stack():
    """This context's stack, or None when it has none yet."""
    cdef PyObject *value
    PyContextVar_Get(_with_var, NULL, &value)
    cdef Py_ssize_t ctx = <Py_ssize_t>fb_tstate_get().context
    if value != <PyObject *>None and (<WithStack>value).owner == ctx:
        Py_DECREF(<object>value)
        return <WithStack>value
    Py_DECREF(<object>value)
    return None


cdef WithStack new_stack():
    cdef WithStack st = WithStack.__new__(WithStack)
    st.owner = <Py_ssize_t>fb_tstate_get().context  # set by PyContextVar_Get in own_stack
    PyContextVar_Set(_with_var, st)
    return st


cdef inline void drop_taken(WithStack st) noexcept:
    """Pop the entries on top that an exit has taken (the owner only)."""
    cdef int64_t n = st.s.n
    cdef with_entry_t *e
    while n > 0:
        e = &st.s.items[n - 1]
        if not (fb_load_acq(&e.word) & 1):
            break
        n -= 1
        fb_store_rel(&st.s.n, n)
        Py_DECREF(<object>e.breaker)


cdef int grow(WithStack st) except -1:
    cdef int64_t cap = st.s.cap * 2
    with_lock()  # a foreign exit may be reading the items
    items = <with_entry_t *>PyMem_Realloc(st.s.items, cap * sizeof(with_entry_t))
    if items != NULL:
        st.s.items = items
        st.s.cap = cap
    with_unlock()
    if items == NULL:
        raise MemoryError()
    return 0


cdef int push_block(CircuitBreaker b, int64_t permit, int64_t start) except -1:
    st = own_stack()
    if st is None:
        st = new_stack()
    else:
        drop_taken(st)
    cdef int64_t n = st.s.n
    if n == st.s.cap:
        grow(st)
    cdef with_entry_t *e = &st.s.items[n]
    Py_INCREF(b)
    e.breaker = <PyObject *>b
    e.permit = permit
    e.start = start
    e.order = fb_add(&_with_order, 1)
    if fb_add(&st.s.open, 1) == 1:
        Py_INCREF(st)  # the registry's reference while an entry is open
    st.s.ver += 1
    fb_store_rel(&e.word, st.s.ver << 1)
    fb_store_rel(&st.s.n, n + 1)
    return 0


cdef bint pop_block(CircuitBreaker b, int64_t *permit, int64_t *start) except -1:
    """Take the entry of the exiting block of ``b``: False if it is not on this context's
    stack (a foreign exit)."""
    cdef with_entry_t *e
    cdef int64_t i, w
    st = own_stack()
    if st is None:
        return False
    i = st.s.n - 1
    while i >= 0:
        e = &st.s.items[i]
        w = fb_load_acq(&e.word)
        if e.breaker == <PyObject *>b and not (w & 1):
            permit[0] = e.permit
            start[0] = e.start
            if fb_cas_strong(&e.word, &w, w | 1):
                drop_taken(st)
                if fb_add(&st.s.open, -1) == 0:
                    Py_DECREF(st)  # this context holds it too: never the last reference
                return True
            continue  # taken meanwhile by a foreign exit: look again
        i -= 1
    return False


cdef int take_foreign(CircuitBreaker b, int64_t *permit, int64_t *start) except -1:
    """Take the most recently entered open entry of ``b`` on any stack."""
    cdef with_stack_t *s
    cdef with_entry_t *e
    cdef with_entry_t *best
    cdef with_stack_t *best_s
    cdef int64_t i, n, w, best_w, best_order, p = 0, t = 0
    cdef bint found
    cdef PyObject *release
    while True:
        best = NULL
        best_s = NULL
        best_w = 0
        best_order = -1
        with_lock()
        s = _with_head.next
        while s != &_with_head:
            n = fb_load_acq(&s.n)
            for i in range(n):
                e = &s.items[i]
                w = fb_load_acq(&e.word)
                if not (w & 1) and e.breaker == <PyObject *>b and e.order > best_order:
                    best, best_s, best_w, best_order = e, s, w, e.order
                    p, t = e.permit, e.start
            s = s.next
        found = best != NULL and fb_cas_strong(&best.word, &best_w, best_w | 1)
        release = NULL
        if found and fb_add(&best_s.open, -1) == 0:
            release = best_s.obj
        with_unlock()
        if release != NULL:
            Py_DECREF(<object>release)  # may free a stack whose context has ended
        if found:
            permit[0] = p
            start[0] = t
            return 0
        if best == NULL:
            raise RuntimeError("breaker exited a `with` block that it never entered")


def open_with_blocks(breaker):
    """How many ``with`` blocks of ``breaker`` are open in every context (for tests)."""
    cdef with_stack_t *s
    cdef int64_t i, k = 0
    with_lock()
    s = _with_head.next
    while s != &_with_head:
        for i in range(fb_load_acq(&s.n)):
            if not (fb_load_acq(&s.items[i].word) & 1) and s.items[i].breaker == <PyObject *>breaker:
                k += 1
        s = s.next
    with_unlock()
    return k


cdef inline object label_of(CircuitBreaker self):
    label = self._label
    if label is None or type(label) is str:  # label_name's common cases, without a call
        return label
    return label_name(label)

cdef object open_error(CircuitBreaker self):
    live(self)
    cdef int64_t w = fb_load_acq(&self.st.s.word)
    return CircuitOpenError(label_of(self), _STATES[w & ST_MASK], retry_after_of(self, w))

# A permit, or FB_REJECTED (the caller raises open_error: see call()).
cdef inline int64_t admit(CircuitBreaker self) except? -9:
    cdef int trans = 0
    cdef int64_t permit = acquire(&self.st, -1, &trans)
    if permit == FB_NEED_CLOCK_ or trans:
        return acquire_or_reject_slow(self, permit, trans)
    return permit

# Run fn under `permit` and record its outcome. The arguments are a vector: `n` positional ones
# at `argv`, then those named by the tuple `kwnames` (vectorcall), or the dict `kwargs`.
cdef object guarded_run(CircuitBreaker self, int64_t permit, fn, PyObject **argv, size_t n,
                        PyObject *kwnames, dict kwargs):
    cdef int64_t start = 0
    cdef config_t *c
    cdef Config config
    # Hold the config for the whole call: a BreakerMap may swap it while fn runs.
    config = <Config>cfg_of(&self.st).owner
    c = &config.c
    if c.timed:
        start = _calls.start_or_release(self, permit)
    try:
        if kwargs:
            result = PyObject_VectorcallDict(fn, argv, n, <PyObject *>kwargs)
        else:
            result = PyObject_Vectorcall(fn, argv, n, kwnames)
    except BaseException as exc:
        if c.timed:
            _calls.finish_raised(self, permit, start, exc)
        else:
            finish(self, permit, config.options.classify(exc))
        raise
    if c.timed:
        _calls.finish_returned(self, permit, start)
    else:
        finish(self, permit, FB_SUCCESS)
    return result


@cython.final
cdef class GuardedFunction:
    """``@breaker`` on a coroutine function, compiled: a call returns the awaitable of
    ``breaker.call_async(fn, *args, **kwargs)``, so no coroutine frame of its own runs. It
    passes for the coroutine function it wraps: ``functools.update_wrapper`` metadata, the
    wrapped function's ``__code__`` (``inspect.iscoroutinefunction`` and
    ``asyncio.iscoroutinefunction`` hold, and ``inspect.signature`` is the wrapped one's), it
    binds as a method, and it pickles and copies by reference, as a function does."""

    cdef CircuitBreaker breaker
    cdef object fn
    cdef dict __dict__
    cdef object __weakref__

    def __call__(self, *args, **kwargs):
        cdef GuardedCall g = GuardedCall.__new__(GuardedCall)
        g.breaker = self.breaker
        g.fn = self.fn
        g.args = args
        g.kwargs = kwargs
        return g

    def __get__(self, obj, objtype):
        if obj is None:
            return self
        return _MethodType(self, obj)

    def __repr__(self):
        return f"<guarded coroutine function {getattr(self, '__qualname__', self.fn)!r}>"

    def __reduce__(self):
        return self.__qualname__


cdef object guard_async(CircuitBreaker breaker, fn):
    """The compiled wrapper behind ``@breaker`` on a coroutine function (GuardedFunction)."""
    cdef GuardedFunction g = GuardedFunction.__new__(GuardedFunction)
    g.breaker = breaker
    g.fn = fn
    target = _calls._call_target(fn)
    wrapper = <object>g
    wrapper.__code__ = getattr(target, "__code__", None)
    wrapper.__defaults__ = getattr(target, "__defaults__", None)
    wrapper.__kwdefaults__ = getattr(target, "__kwdefaults__", None)
    # what a callable object lacks (update_wrapper copies only what fn has), as for a function
    wrapper.__name__ = getattr(target, "__name__", "guarded")
    wrapper.__qualname__ = getattr(target, "__qualname__", wrapper.__name__)
    wrapper.__annotations__ = {}
    _update_wrapper(wrapper, fn)
    if _markcoroutinefunction is not None:
        _markcoroutinefunction(g)
    return g


cdef object guard(CircuitBreaker breaker, fn):
    """The compiled wrapper behind ``@breaker`` on a sync function."""
    def guarded(*args, **kwargs):
        cdef int64_t permit = admit(breaker)
        if permit < 0:
            raise open_error(breaker)
        return guarded_run(breaker, permit, fn, PySequence_Fast_ITEMS(args), len(args), NULL,
                           kwargs)
    return _update_wrapper(guarded, fn)


cdef int64_t acquire_or_reject(CircuitBreaker self) except? -9:
    live(self)
    return admit(self)

cdef int64_t acquire_or_reject_slow(CircuitBreaker self, int64_t permit, int trans) except? -9:
    if permit == FB_NEED_CLOCK_:
        permit = acquire(&self.st, now_of(self), &trans)
    if trans:
        try:
            fire(self, trans)
        except BaseException:
            # a callback raised a BaseException (KeyboardInterrupt): the caller never gets the
            # permit, so give it back, or the probe slot stays taken
            if permit >= 0:
                finish(self, permit, FB_NEUTRAL)
            raise
    return permit

cdef object finish(CircuitBreaker self, int64_t permit, int outcome, bint raw=False):
    cdef int trans = 0
    cdef int r
    cdef int64_t now = -1
    # A Python clock is read before anything is recorded when the outcome may need the time (it
    # can trip or re-open), so that a clock that raises or returns garbage loses nothing: a raw
    # record_*() records nothing and raises; a call path's permit is given back as neutral (a
    # probe slot must not stay taken), then the clock's error propagates.
    if not live(self).use_c_clock and outcome != FB_NEUTRAL and (
            outcome != FB_SUCCESS or self.st.win != NULL):
        try:
            now = now_of(self)
        except BaseException:
            if not raw:
                finish(self, permit, FB_NEUTRAL)
            raise
    r = release(&self.st, permit, outcome, now, &trans)
    if r == FB_NEED_CLOCK_:
        r = release(&self.st, permit, outcome, now_of(self), &trans)
    if r == NEED_TRIP:
        r = trip_auto(&self.st, permit, now_of(self), &trans)
    if trans:
        fire(self, trans)


# -- call(): a METH_FASTCALL C function -----------------------------------------------------------
# `breaker.call(fn, *args, **kwargs)` is the hot path. As a C function it forwards its argument
# vector to fn as is (no *args tuple, no **kwargs dict), and it raises CircuitOpenError without
# Cython's raise statement, which would add a traceback frame for the breaker's own code: the
# frame costs more than the whole admission, and the caller's frames are all a user needs.
cdef extern from *:
    """
    typedef PyObject *(*fb_fastcall_kw_t)(PyObject *, PyObject **, Py_ssize_t, PyObject *);
    static PyMethodDef fb_call_def = {"call", NULL, METH_FASTCALL | METH_KEYWORDS,
        "call($self, fn, /, *args, **kwargs)\\n--\\n\\n"
        "Call ``fn(*args, **kwargs)`` through the breaker; raise CircuitOpenError if rejected."};
    static int fb_install_fastcall(PyObject *type, fb_fastcall_kw_t impl) {
        PyTypeObject *t = (PyTypeObject *)type;
        PyObject *descr;
        int r;
        fb_call_def.ml_meth = (PyCFunction)(void (*)(void))impl;
        descr = PyDescr_NewMethod(t, &fb_call_def);
        if (descr == NULL) return -1;
        r = PyDict_SetItemString(t->tp_dict, fb_call_def.ml_name, descr);
        Py_DECREF(descr);
        PyType_Modified(t);
        return r;
    }
    """
    ctypedef PyObject *(*fb_fastcall_kw_t)(PyObject *, PyObject **, Py_ssize_t, PyObject *)
    int fb_install_fastcall(PyObject *t, fb_fastcall_kw_t impl) except -1

cdef PyObject *call_fastcall(PyObject *self, PyObject **args, Py_ssize_t nargs,
                             PyObject *kwnames) except NULL:
    if nargs < 1:
        raise TypeError("call() missing required argument 'fn' (pos 1)")
    fn = <object>args[0]
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {fn!r}")
    cdef CircuitBreaker b = <CircuitBreaker><object>self
    live(b)
    cdef int64_t permit = admit(b)
    if permit < 0:
        err = open_error(b)
        PyErr_SetObject(<PyObject *>CircuitOpenError, <PyObject *>err)
        return NULL
    result = guarded_run(b, permit, fn, args + 1, nargs - 1, kwnames, None)
    Py_INCREF(result)
    return <PyObject *>result
