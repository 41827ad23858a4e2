/* slashrt._native: CPython bindings for the native kernels.
 *
 *   HashAgg(kind, value_dtype)   hash aggregation over int64 keys, a hash index over a
 *                                log-structured store (hashagg.c)
 *   ysb_baseline(records, ad_to_campaign, n_campaigns, window_ms=10000)
 *                                the plain-C YSB loop (ysb_baseline.c)
 *   gather(field, sel, out)      a field of a 1-D or 2-D strided record view, selected rows
 *   minmax_i64(field)            (min, max) of an int64 field view (columns.c)
 *   route(keys, counts, vals, leaders, ...)  rows grouped by their partition's leader (columns.c)
 *   ring_post / ring_poll_data / ring_release
 *                                footers of runs of ring slots, release/acquire ordered (ring.c)
 *   shm_load_u64 / shm_store_u64 / shm_load_u8 / shm_park / shm_unpark / shm_fence /
 *   shm_wake / shm_store_and_wake
 *                                control-block atomics and eventfd wake-ups of rings shared
 *                                between processes (shm.c)
 *
 * Inputs are taken through the buffer protocol (no numpy headers needed): 1-D views of
 * any stride, so a field of a structured array is read in place.  Hot loops run with
 * the GIL released.  slashrt/_kernels.py wraps this module into the public API.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "columns.h"
#include "hashagg.h"
#include "ring.h"
#include "shm.h"
#include "ysb_baseline.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "slashrt's record layouts are little-endian; this kernel assumes a little-endian host"
#endif

/* Below this many rows the GIL hand-off costs more than the loop and invites a thread
 * switch, so small batches (the cache-resident case) keep the GIL. */
#define NOGIL_MIN_ROWS 2048

/* ---- buffer helpers ----------------------------------------------------------------- */

/* Does a buffer format string describe one little-endian int64 (or float64)? */
static int fmt_ok(const char *f, Py_ssize_t itemsize, int want_float) {
    if (f == NULL) f = "B";
    if (*f == '@' || *f == '=' || *f == '<')
        f++;
    else if (*f == '>' || *f == '!')
        return 0;
    if (itemsize != 8 || f[0] == '\0' || f[1] != '\0') return 0;
    if (want_float) return f[0] == 'd';
    return f[0] == 'q' || f[0] == 'l' || f[0] == 'n';
}

/* Get a 1-D (possibly strided) vector of int64 / float64 out of obj. */
static int get_vec(PyObject *obj, Py_buffer *view, int want_float, const char *name,
                   Py_ssize_t *n, Py_ssize_t *stride) {
    if (PyObject_GetBuffer(obj, view, PyBUF_RECORDS_RO) < 0) {
        PyErr_Format(PyExc_TypeError, "%s must be a 1-D %s numpy array (or buffer), not %.100s",
                     name, want_float ? "float64" : "int64", Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (view->ndim != 1 || !fmt_ok(view->format, view->itemsize, want_float)) {
        PyErr_Format(PyExc_TypeError,
                     "%s must be a 1-D %s array (got ndim %d, format '%s', itemsize %zd)", name,
                     want_float ? "float64" : "int64", view->ndim,
                     view->format ? view->format : "B", view->itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    *n = view->shape[0];
    *stride = view->strides[0];
    return 0;
}

/* A writable C-contiguous output vector of exactly n int64 / float64 items. */
static int get_out(PyObject *obj, Py_buffer *view, int want_float, const char *name,
                   Py_ssize_t n) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0)
        return -1;
    if (view->ndim != 1 || !fmt_ok(view->format, view->itemsize, want_float) ||
        view->shape[0] != n) {
        PyErr_Format(PyExc_ValueError, "%s must be a writable contiguous %s array of length %zd",
                     name, want_float ? "float64" : "int64", n);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* Minimal FASTCALL argument parser: fills out[] from positionals then keywords. */
static int parse_fast(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                      const char *fname, const char *const *names, int nreq, int nmax,
                      PyObject **out) {
    for (int i = 0; i < nmax; i++) out[i] = NULL;
    if (nargs > nmax) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %d arguments (%zd given)", fname, nmax,
                     nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) out[i] = args[i];
    if (kwnames) {
        Py_ssize_t nkw = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t j = 0; j < nkw; j++) {
            PyObject *kw = PyTuple_GET_ITEM(kwnames, j);
            int found = -1;
            for (int i = 0; i < nmax; i++)
                if (PyUnicode_CompareWithASCIIString(kw, names[i]) == 0) found = i;
            if (found < 0) {
                PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'",
                             fname, kw);
                return -1;
            }
            if (out[found]) {
                PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'",
                             fname, names[found]);
                return -1;
            }
            out[found] = args[nargs + j];
        }
    }
    for (int i = 0; i < nreq; i++)
        if (!out[i]) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s'", fname, names[i]);
            return -1;
        }
    return 0;
}

/* ---- HashAgg ------------------------------------------------------------------------ */

static const char *const KIND_NAMES[] = {"count", "sum", "min", "max", "mean"};

typedef struct {
    PyObject_HEAD
    ha_table t;
    int ready; /* tp_init succeeded */
    int busy;  /* a GIL-free loop is running on this table (guards against other threads) */
} HashAggObject;

static PyTypeObject HashAggType;

static int ha_check(HashAggObject *self) {
    if (!self->ready) {
        PyErr_SetString(PyExc_RuntimeError, "HashAgg.__init__ was not called");
        return -1;
    }
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError,
                        "HashAgg is being updated by another thread (tables are not thread-safe)");
        return -1;
    }
    return 0;
}

static int HashAgg_init(HashAggObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"kind", "value_dtype", "check_overflow", NULL};
    const char *kind = NULL, *vd = "i8";
    int check_overflow = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "s|sp:HashAgg", kwlist, &kind, &vd, &check_overflow))
        return -1;
    int k = -1;
    for (int i = 0; i < 5; i++)
        if (strcmp(kind, KIND_NAMES[i]) == 0) k = i;
    if (k < 0) {
        PyErr_Format(PyExc_ValueError,
                     "HashAgg kind must be one of count, sum, min, max, mean (got '%s')", kind);
        return -1;
    }
    int isf;
    if (strcmp(vd, "i8") == 0 || strcmp(vd, "<i8") == 0 || strcmp(vd, "int64") == 0)
        isf = 0;
    else if (strcmp(vd, "f8") == 0 || strcmp(vd, "<f8") == 0 || strcmp(vd, "float64") == 0)
        isf = 1;
    else {
        PyErr_Format(PyExc_ValueError, "HashAgg value_dtype must be 'i8' or 'f8' (got '%s')", vd);
        return -1;
    }
    if (self->busy) return ha_check(self);
    if (self->ready) {
        ha_free(&self->t);
        self->ready = 0;
    }
    if (ha_init(&self->t, k, isf)) {
        PyErr_NoMemory();
        return -1;
    }
    self->t.check_ovf = check_overflow;
    self->ready = 1;
    return 0;
}

static void HashAgg_dealloc(HashAggObject *self) {
    if (self->ready) ha_free(&self->t);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Shared by update() and merge(): counts == NULL means one per row. */
static PyObject *ha_fold(HashAggObject *self, PyObject *keys, PyObject *counts, PyObject *vals,
                         const char *vname) {
    if (ha_check(self)) return NULL;
    Py_buffer kv, cv, vv;
    Py_ssize_t n, ks, cn = 0, cs = 0, vn = 0, vs = 0;
    const int kind = self->t.kind;
    int have_c = 0, have_v = 0;
    if (get_vec(keys, &kv, 0, "keys", &n, &ks)) return NULL;
    if (counts) {
        if (get_vec(counts, &cv, 0, "counts", &cn, &cs)) goto fail;
        have_c = 1;
        if (cn != n) {
            PyErr_Format(PyExc_ValueError, "counts has length %zd, keys has %zd", cn, n);
            goto fail;
        }
    }
    if (kind == HA_COUNT) {
        /* count keeps no value: whatever was passed is ignored, not even checked */
    } else if (vals && vals != Py_None) {
        if (get_vec(vals, &vv, self->t.is_float, vname, &vn, &vs)) goto fail;
        have_v = 1;
        if (vn != n) {
            PyErr_Format(PyExc_ValueError, "%s has length %zd, keys has %zd", vname, vn, n);
            goto fail;
        }
    } else {
        PyErr_Format(PyExc_TypeError, "%s are required for kind '%s'", vname, KIND_NAMES[kind]);
        goto fail;
    }
    int rc;
    const char *cp = have_c ? (const char *)cv.buf : NULL;
    const char *vp = have_v ? (const char *)vv.buf : NULL;
    if (n >= NOGIL_MIN_ROWS) {
        self->busy = 1;
        Py_BEGIN_ALLOW_THREADS
        rc = ha_apply(&self->t, kv.buf, ks, cp, cs, vp, vs, (size_t)n);
        Py_END_ALLOW_THREADS
        self->busy = 0;
    } else {
        rc = ha_apply(&self->t, kv.buf, ks, cp, cs, vp, vs, (size_t)n);
    }
    PyBuffer_Release(&kv);
    if (have_c) PyBuffer_Release(&cv);
    if (have_v) PyBuffer_Release(&vv);
    if (rc) return PyErr_NoMemory();
    Py_RETURN_NONE;
fail:
    PyBuffer_Release(&kv);
    if (have_c) PyBuffer_Release(&cv);
    if (have_v) PyBuffer_Release(&vv);
    return NULL;
}

/* A 1-D or 2-D (possibly strided) int64 / float64 view out of obj, e.g. a field of the
 * records of a run of ring slots. */
static int get_view(PyObject *obj, Py_buffer *b, int want_float, const char *name, ha_view *v) {
    if (PyObject_GetBuffer(obj, b, PyBUF_RECORDS_RO) < 0) {
        PyErr_Format(PyExc_TypeError, "%s must be a 1-D or 2-D %s numpy array (or buffer), not %.100s",
                     name, want_float ? "float64" : "int64", Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (b->ndim < 1 || b->ndim > 2 || !fmt_ok(b->format, b->itemsize, want_float)) {
        PyErr_Format(PyExc_TypeError,
                     "%s must be a 1-D or 2-D %s array (got ndim %d, format '%s', itemsize %zd)",
                     name, want_float ? "float64" : "int64", b->ndim, b->format ? b->format : "B",
                     b->itemsize);
        PyBuffer_Release(b);
        return -1;
    }
    v->base = (const char *)b->buf;
    if (b->ndim == 1) {
        v->rows = 1;
        v->cols = b->shape[0];
        v->row_stride = 0;
        v->col_stride = b->strides[0];
    } else {
        v->rows = b->shape[0];
        v->cols = b->shape[1];
        v->row_stride = b->strides[0];
        v->col_stride = b->strides[1];
    }
    return 0;
}

/* update() and update_within(): times NULL means every row. */
static PyObject *ha_update_common(HashAggObject *self, PyObject *keys, PyObject *values,
                                  PyObject *times, int64_t tlo, int64_t thi) {
    if (ha_check(self)) return NULL;
    const int kind = self->t.kind;
    Py_buffer kb, vb, tb;
    ha_view kv, vv, tv;
    int have_v = 0, have_t = 0;
    if (get_view(keys, &kb, 0, "keys", &kv)) return NULL;
    if (kind == HA_COUNT) {
        /* count keeps no value: whatever was passed is ignored, not even checked */
    } else if (values && values != Py_None) {
        if (get_view(values, &vb, self->t.is_float, "values", &vv)) goto fail;
        have_v = 1;
        if (kb.ndim == 1 && vb.ndim == 1 && vv.cols != kv.cols) {
            PyErr_Format(PyExc_ValueError, "values has length %lld, keys has %lld",
                         (long long)vv.cols, (long long)kv.cols);
            goto fail;
        }
        if (kb.ndim != vb.ndim || vv.rows != kv.rows || vv.cols != kv.cols) {
            PyErr_Format(PyExc_ValueError, "values has shape (%lld, %lld), keys has (%lld, %lld)",
                         (long long)vv.rows, (long long)vv.cols, (long long)kv.rows, (long long)kv.cols);
            goto fail;
        }
    } else {
        PyErr_Format(PyExc_TypeError, "values are required for kind '%s'", KIND_NAMES[kind]);
        goto fail;
    }
    if (times) {
        if (get_view(times, &tb, 0, "times", &tv)) goto fail;
        have_t = 1;
        if (kb.ndim != tb.ndim || tv.rows != kv.rows || tv.cols != kv.cols) {
            PyErr_Format(PyExc_ValueError, "times has shape (%lld, %lld), keys has (%lld, %lld)",
                         (long long)tv.rows, (long long)tv.cols, (long long)kv.rows, (long long)kv.cols);
            goto fail;
        }
    }
    int rc;
    int64_t done = 0;
    const ha_view *vp = have_v ? &vv : NULL, *tp = have_t ? &tv : NULL;
    if (kv.rows * kv.cols >= NOGIL_MIN_ROWS) {
        self->busy = 1;
        Py_BEGIN_ALLOW_THREADS
        rc = ha_update_view_until(&self->t, &kv, vp, tp, tlo, thi, &done);
        Py_END_ALLOW_THREADS
        self->busy = 0;
    } else {
        rc = ha_update_view_until(&self->t, &kv, vp, tp, tlo, thi, &done);
    }
    PyBuffer_Release(&kb);
    if (have_v) PyBuffer_Release(&vb);
    if (have_t) PyBuffer_Release(&tb);
    if (rc) return PyErr_NoMemory();
    if (times) return PyLong_FromLongLong((long long)done);
    Py_RETURN_NONE;
fail:
    PyBuffer_Release(&kb);
    if (have_v) PyBuffer_Release(&vb);
    if (have_t) PyBuffer_Release(&tb);
    return NULL;
}

static PyObject *HashAgg_update(HashAggObject *self, PyObject *const *args, Py_ssize_t nargs,
                                PyObject *kwnames) {
    static const char *const names[] = {"keys", "values"};
    PyObject *a[2];
    if (parse_fast(args, nargs, kwnames, "update", names, 1, 2, a)) return NULL;
    return ha_update_common(self, a[0], a[1], NULL, 0, 0);
}

static PyObject *HashAgg_update_within(HashAggObject *self, PyObject *const *args, Py_ssize_t nargs,
                                       PyObject *kwnames) {
    static const char *const names[] = {"keys", "values", "times", "lo", "hi"};
    PyObject *a[5];
    if (parse_fast(args, nargs, kwnames, "update_within", names, 5, 5, a)) return NULL;
    long long lo = PyLong_AsLongLong(a[3]);
    if (lo == -1 && PyErr_Occurred()) return NULL;
    long long hi = PyLong_AsLongLong(a[4]);
    if (hi == -1 && PyErr_Occurred()) return NULL;
    return ha_update_common(self, a[0], a[1], a[2], (int64_t)lo, (int64_t)hi);
}

static PyObject *HashAgg_merge(HashAggObject *self, PyObject *const *args, Py_ssize_t nargs,
                               PyObject *kwnames) {
    static const char *const names[] = {"keys", "counts", "vals"};
    PyObject *a[3];
    if (parse_fast(args, nargs, kwnames, "merge", names, 2, 3, a)) return NULL;
    return ha_fold(self, a[0], a[1], a[2], "vals");
}

static PyObject *HashAgg_merge_from(HashAggObject *self, PyObject *other) {
    if (ha_check(self)) return NULL;
    if (!PyObject_TypeCheck(other, &HashAggType)) {
        PyErr_Format(PyExc_TypeError, "merge_from needs a native HashAgg, not %.100s",
                     Py_TYPE(other)->tp_name);
        return NULL;
    }
    HashAggObject *o = (HashAggObject *)other;
    if (ha_check(o)) return NULL;
    if (o->t.kind != self->t.kind || o->t.is_float != self->t.is_float) {
        PyErr_Format(PyExc_ValueError, "merge_from: cannot join HashAgg(%s, %s) into HashAgg(%s, %s)",
                     KIND_NAMES[o->t.kind], o->t.is_float ? "f8" : "i8",
                     KIND_NAMES[self->t.kind], self->t.is_float ? "f8" : "i8");
        return NULL;
    }
    int rc;
    self->busy = o->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    rc = ha_merge_table(&self->t, &o->t);
    Py_END_ALLOW_THREADS
    self->busy = o->busy = 0;
    if (rc) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* Three writable output vectors of n items (int64 keys, int64 counts, vals of the table). */
static int get_outs(HashAggObject *self, PyObject *const *args, Py_ssize_t n, Py_buffer *k,
                    Py_buffer *c, Py_buffer *v) {
    if (get_out(args[0], k, 0, "keys", n)) return -1;
    if (get_out(args[1], c, 0, "counts", n)) {
        PyBuffer_Release(k);
        return -1;
    }
    if (get_out(args[2], v, self->t.is_float, "vals", n)) {
        PyBuffer_Release(k);
        PyBuffer_Release(c);
        return -1;
    }
    return 0;
}

/* Run `call` (an int-returning expression on self->t), without the GIL when the log is long. */
#define HA_RUN(self, rc, call)                                                                 \
    do {                                                                                       \
        if ((self)->t.n >= NOGIL_MIN_ROWS) {                                                   \
            (self)->busy = 1;                                                                  \
            Py_BEGIN_ALLOW_THREADS                                                             \
            rc = (call);                                                                       \
            Py_END_ALLOW_THREADS                                                               \
            (self)->busy = 0;                                                                  \
        } else {                                                                               \
            rc = (call);                                                                       \
        }                                                                                      \
    } while (0)

static PyObject *HashAgg_export_into(HashAggObject *self, PyObject *const *args,
                                     Py_ssize_t nargs) {
    if (ha_check(self)) return NULL;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "_export_into(keys, counts, vals) takes 3 arguments");
        return NULL;
    }
    Py_buffer k, c, v;
    if (get_outs(self, args, (Py_ssize_t)ha_len(&self->t), &k, &c, &v)) return NULL;
    int rc;
    HA_RUN(self, rc, ha_export(&self->t, (int64_t *)k.buf, (int64_t *)c.buf, (ha_val *)v.buf));
    PyBuffer_Release(&k);
    PyBuffer_Release(&c);
    PyBuffer_Release(&v);
    if (rc) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *HashAgg_ship_into(HashAggObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (ha_check(self)) return NULL;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "_ship_into(keys, counts, vals) takes 3 arguments");
        return NULL;
    }
    Py_buffer k, c, v;
    if (get_outs(self, args, (Py_ssize_t)ha_len(&self->t), &k, &c, &v)) return NULL;
    int rc;
    HA_RUN(self, rc, ha_ship(&self->t, (int64_t *)k.buf, (int64_t *)c.buf, (ha_val *)v.buf));
    PyBuffer_Release(&k);
    PyBuffer_Release(&c);
    PyBuffer_Release(&v);
    if (rc) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* LSN argument of delta(): an int in [log_floor, log_end]. */
static int get_since(HashAggObject *self, PyObject *obj, uint64_t *since) {
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (x == -1 && PyErr_Occurred()) return -1;
    if (overflow || x < 0 || (uint64_t)x < ha_log_floor(&self->t) ||
        (uint64_t)x > ha_log_end(&self->t)) {
        PyErr_Format(PyExc_ValueError,
                     "delta(since=%R): not a valid log position, valid are %llu (log_floor: "
                     "older marks were compacted or reset away) to %llu (log_end)",
                     obj, (unsigned long long)ha_log_floor(&self->t),
                     (unsigned long long)ha_log_end(&self->t));
        return -1;
    }
    *since = (uint64_t)x;
    return 0;
}

static PyObject *HashAgg_delta_into(HashAggObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (ha_check(self)) return NULL;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "_delta_into(since, keys, counts, vals) takes 4 arguments");
        return NULL;
    }
    uint64_t since;
    if (get_since(self, args[0], &since)) return NULL;
    Py_buffer k, c, v;
    if (get_outs(self, args + 1, (Py_ssize_t)ha_delta(&self->t, since, NULL, NULL, NULL), &k, &c, &v))
        return NULL;
    int64_t rc;
    HA_RUN(self, rc, ha_delta(&self->t, since, (int64_t *)k.buf, (int64_t *)c.buf, (ha_val *)v.buf));
    PyBuffer_Release(&k);
    PyBuffer_Release(&c);
    PyBuffer_Release(&v);
    (void)rc; /* since was checked above */
    Py_RETURN_NONE;
}

static PyObject *HashAgg_mark(HashAggObject *self, PyObject *unused) {
    if (ha_check(self)) return NULL;
    uint64_t lsn = 0;
    int rc;
    HA_RUN(self, rc, ha_mark(&self->t, &lsn));
    if (rc) return PyErr_NoMemory();
    return PyLong_FromUnsignedLongLong(lsn);
}

static PyObject *HashAgg_compact(HashAggObject *self, PyObject *unused) {
    if (ha_check(self)) return NULL;
    int rc;
    HA_RUN(self, rc, ha_compact(&self->t));
    if (rc) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *HashAgg_clear(HashAggObject *self, PyObject *unused) {
    if (ha_check(self)) return NULL;
    if (ha_clear(&self->t)) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *HashAgg_reset(HashAggObject *self, PyObject *unused) {
    if (ha_check(self)) return NULL;
    ha_reset(&self->t);
    Py_RETURN_NONE;
}

static PyObject *HashAgg_sizeof(HashAggObject *self, PyObject *unused) {
    size_t extra = self->ready ? ha_nbytes(&self->t) - sizeof(ha_table) : 0;
    return PyLong_FromSize_t((size_t)Py_TYPE(self)->tp_basicsize + extra);
}

static Py_ssize_t HashAgg_len(HashAggObject *self) {
    return self->ready ? (Py_ssize_t)ha_len(&self->t) : 0;
}

static PyObject *HashAgg_get_kind(HashAggObject *self, void *c) {
    if (!self->ready) Py_RETURN_NONE;
    return PyUnicode_FromString(KIND_NAMES[self->t.kind]);
}

static PyObject *HashAgg_get_value_dtype(HashAggObject *self, void *c) {
    if (!self->ready) Py_RETURN_NONE;
    return PyUnicode_FromString(self->t.is_float ? "f8" : "i8");
}

static PyObject *HashAgg_get_nbytes(HashAggObject *self, void *c) {
    return PyLong_FromSize_t(self->ready ? ha_nbytes(&self->t) : 0);
}

static PyObject *HashAgg_get_capacity(HashAggObject *self, void *c) {
    return PyLong_FromUnsignedLongLong(self->ready ? self->t.cap : 0);
}

static PyObject *HashAgg_get_log_len(HashAggObject *self, void *c) {
    return PyLong_FromUnsignedLongLong(self->ready ? self->t.n : 0);
}

static PyObject *HashAgg_get_log_end(HashAggObject *self, void *c) {
    return PyLong_FromUnsignedLongLong(self->ready ? ha_log_end(&self->t) : 0);
}

static PyObject *HashAgg_get_log_floor(HashAggObject *self, void *c) {
    return PyLong_FromUnsignedLongLong(self->ready ? ha_log_floor(&self->t) : 0);
}

static PyObject *HashAgg_get_overflowed(HashAggObject *self, void *c) {
    return PyBool_FromLong(self->ready && self->t.overflowed);
}

/* A restored table takes the flag of the one it was exported from (export() carries none). */
static int HashAgg_set_overflowed(HashAggObject *self, PyObject *value, void *c) {
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "HashAgg.overflowed cannot be deleted");
        return -1;
    }
    if (ha_check(self) < 0) return -1;
    int flag = PyObject_IsTrue(value);
    if (flag < 0) return -1;
    self->t.overflowed = flag;
    return 0;
}

static PyObject *HashAgg_get_check_overflow(HashAggObject *self, void *c) {
    return PyBool_FromLong(self->ready && self->t.check_ovf);
}

static PyMethodDef HashAgg_methods[] = {
    {"update", (PyCFunction)(void (*)(void))HashAgg_update, METH_FASTCALL | METH_KEYWORDS,
     "update(keys, values=None): fold one batch in (count += 1, val op= value per row)."},
    {"update_within", (PyCFunction)(void (*)(void))HashAgg_update_within, METH_FASTCALL | METH_KEYWORDS,
     "update_within(keys, values, times, lo, hi) -> int: update() with the longest prefix of rows "
     "whose time lies in [lo, hi]; returns its length."},
    {"merge", (PyCFunction)(void (*)(void))HashAgg_merge, METH_FASTCALL | METH_KEYWORDS,
     "merge(keys, counts, vals=None): CRDT join of a partial given as exported arrays."},
    {"merge_from", (PyCFunction)HashAgg_merge_from, METH_O,
     "merge_from(other): CRDT join of another native HashAgg of the same kind and dtype."},
    {"_export_into", (PyCFunction)(void (*)(void))HashAgg_export_into, METH_FASTCALL,
     "_export_into(keys, counts, vals): fill preallocated arrays of length len(self)."},
    {"_ship_into", (PyCFunction)(void (*)(void))HashAgg_ship_into, METH_FASTCALL,
     "_ship_into(keys, counts, vals): _export_into, then empty the table for the next epoch."},
    {"_delta_into", (PyCFunction)(void (*)(void))HashAgg_delta_into, METH_FASTCALL,
     "_delta_into(since, keys, counts, vals): fill arrays of length log_end - since with the "
     "log entries from position since."},
    {"mark", (PyCFunction)HashAgg_mark, METH_NOARGS,
     "mark() -> int: freeze the log (an epoch boundary) and return the position of its end."},
    {"compact", (PyCFunction)HashAgg_compact, METH_NOARGS,
     "compact(): drop superseded entries of the frozen log prefix (log_floor moves up to the "
     "latest mark)."},
    {"reset", (PyCFunction)HashAgg_reset, METH_NOARGS,
     "reset(): drop every key but keep the capacity, to be refilled to a similar size."},
    {"clear", (PyCFunction)HashAgg_clear, METH_NOARGS,
     "clear(): drop every key and shrink back to the initial capacity."},
    {"__sizeof__", (PyCFunction)HashAgg_sizeof, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef HashAgg_getset[] = {
    {"kind", (getter)HashAgg_get_kind, NULL, "aggregate kind", NULL},
    {"value_dtype", (getter)HashAgg_get_value_dtype, NULL, "'i8' or 'f8'", NULL},
    {"nbytes", (getter)HashAgg_get_nbytes, NULL, "bytes held by the table", NULL},
    {"capacity", (getter)HashAgg_get_capacity, NULL, "slots in the open-addressing index", NULL},
    {"log_len", (getter)HashAgg_get_log_len, NULL,
     "entries in the log, superseded ones included (>= len)", NULL},
    {"log_end", (getter)HashAgg_get_log_end, NULL,
     "log position (LSN) of the end of the log: what mark() would return", NULL},
    {"log_floor", (getter)HashAgg_get_log_floor, NULL,
     "oldest log position delta() accepts", NULL},
    {"overflowed", (getter)HashAgg_get_overflowed, (setter)HashAgg_set_overflowed,
     "an integer sum left the int64 range (and wrapped) since the table was last emptied "
     "(only a table made with check_overflow=True checks); settable, for a restored table", NULL},
    {"check_overflow", (getter)HashAgg_get_check_overflow, NULL,
     "whether integer sums are checked for overflow (sets overflowed)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods HashAgg_as_sequence = {
    .sq_length = (lenfunc)HashAgg_len,
};

static PyTypeObject HashAggType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "slashrt._native.HashAgg",
    .tp_basicsize = sizeof(HashAggObject),
    .tp_dealloc = (destructor)HashAgg_dealloc,
    .tp_as_sequence = &HashAgg_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "HashAgg(kind, value_dtype='i8', check_overflow=False): hash aggregation over int64 keys: a hash "
              "index (open addressing, linear probing, prefetching batch loop) over a "
              "log-structured store whose tail since mark() is the delta of an epoch.",
    .tp_methods = HashAgg_methods,
    .tp_getset = HashAgg_getset,
    .tp_init = (initproc)HashAgg_init,
    .tp_new = PyType_GenericNew,
};

/* ---- ysb_baseline ------------------------------------------------------------------- */

static PyObject *py_ysb_baseline(PyObject *mod, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"records", "ad_to_campaign", "n_campaigns", "window_ms", NULL};
    PyObject *recobj, *mapobj;
    long long ncamp, W = 10000;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOL|L:ysb_baseline", kwlist, &recobj, &mapobj,
                                     &ncamp, &W))
        return NULL;
    if (ncamp < 1 || W < 1) {
        PyErr_Format(PyExc_ValueError,
                     "ysb_baseline: n_campaigns and window_ms must be positive (got %lld, %lld)",
                     ncamp, W);
        return NULL;
    }
    Py_buffer rv, mv;
    if (PyObject_GetBuffer(recobj, &rv, PyBUF_RECORDS_RO) < 0) return NULL;
    size_t n;
    if (!PyBuffer_IsContiguous(&rv, 'C')) {
        PyErr_SetString(PyExc_ValueError, "ysb_baseline: records must be C-contiguous");
        PyBuffer_Release(&rv);
        return NULL;
    }
    if (rv.ndim == 1 && rv.itemsize == YSB_RECORD_SIZE) {
        n = (size_t)rv.shape[0];
    } else if (rv.itemsize == 1 && rv.len % YSB_RECORD_SIZE == 0) {
        n = (size_t)(rv.len / YSB_RECORD_SIZE); /* raw bytes of back-to-back records */
    } else {
        PyErr_Format(PyExc_ValueError,
                     "ysb_baseline: records must be a 1-D array of %d-byte records "
                     "(got ndim %d, itemsize %zd)",
                     YSB_RECORD_SIZE, rv.ndim, rv.itemsize);
        PyBuffer_Release(&rv);
        return NULL;
    }
    Py_ssize_t nmap, mstride;
    if (get_vec(mapobj, &mv, 0, "ad_to_campaign", &nmap, &mstride)) {
        PyBuffer_Release(&rv);
        return NULL;
    }
    ysb_grid g;
    int rc;
    size_t nz = 0;
    Py_BEGIN_ALLOW_THREADS
    rc = ysb_count((const unsigned char *)rv.buf, n, (const char *)mv.buf, mstride, nmap, ncamp,
                   W, &g);
    if (rc == YSB_OK && g.grid) {
        const int64_t total = g.nwin * ncamp;
        for (int64_t i = 0; i < total; i++) nz += g.grid[i] != 0;
    }
    Py_END_ALLOW_THREADS
    if (rc != YSB_OK) {
        const unsigned char *r = (const unsigned char *)rv.buf + g.err_row * YSB_RECORD_SIZE;
        long long ad, t;
        memcpy(&t, r, 8);
        memcpy(&ad, r + 8, 8);
        switch (rc) {
        case YSB_BAD_AD:
            PyErr_Format(PyExc_ValueError,
                         "ysb_baseline: record %zu has ad_id %lld outside ad_to_campaign "
                         "(valid ad_ids are 0..%zd)",
                         g.err_row, ad, nmap - 1);
            break;
        case YSB_BAD_CAMPAIGN:
            PyErr_Format(PyExc_ValueError,
                         "ysb_baseline: record %zu: ad_to_campaign[%lld] = %lld is not a campaign "
                         "in [0, n_campaigns=%lld)",
                         g.err_row, ad, (long long)g.err_val, ncamp);
            break;
        case YSB_NOMEM:
            PyErr_NoMemory();
            break;
        case YSB_SPAN:
            PyErr_Format(PyExc_ValueError,
                         "ysb_baseline: record %zu: event_time %lld makes the windows x campaigns "
                         "grid exceed %lld cells (event times span too far)",
                         g.err_row, t, (long long)YSB_MAX_CELLS);
            break;
        default:
            PyErr_Format(PyExc_ValueError,
                         "ysb_baseline: record %zu: event_time %lld is out of range", g.err_row,
                         t);
        }
        PyBuffer_Release(&rv);
        PyBuffer_Release(&mv);
        return NULL;
    }
    PyBuffer_Release(&rv);
    PyBuffer_Release(&mv);
    PyObject *ow = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(nz * 8));
    PyObject *oc = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(nz * 8));
    PyObject *on = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(nz * 8));
    if (!ow || !oc || !on) {
        Py_XDECREF(ow);
        Py_XDECREF(oc);
        Py_XDECREF(on);
        free(g.grid);
        return NULL;
    }
    int64_t *pw = (int64_t *)PyByteArray_AS_STRING(ow);
    int64_t *pc = (int64_t *)PyByteArray_AS_STRING(oc);
    int64_t *pn = (int64_t *)PyByteArray_AS_STRING(on);
    if (g.grid) {
        Py_BEGIN_ALLOW_THREADS
        size_t o = 0;
        for (int64_t r = 0; r < g.nwin; r++) {
            const int64_t *row = g.grid + r * ncamp;
            for (int64_t c = 0; c < ncamp; c++) {
                if (row[c] == 0) continue;
                pw[o] = (g.w0 + r) * W;
                pc[o] = c;
                pn[o] = row[c];
                o++;
            }
        }
        Py_END_ALLOW_THREADS
        free(g.grid);
    }
    return Py_BuildValue("(NNN)", ow, oc, on);
}

/* ---- column kernels ------------------------------------------------------------------ */

/* Fill a field_view from a 1-D or 2-D strided buffer (rows x cols). */
static int get_field_view(PyObject *obj, Py_buffer *b, field_view *v, const char *what) {
    if (PyObject_GetBuffer(obj, b, PyBUF_RECORDS_RO) < 0) return -1;
    if (b->ndim < 1 || b->ndim > 2) {
        PyErr_Format(PyExc_ValueError, "%s must be 1-D or 2-D, got %d dimensions", what, b->ndim);
        PyBuffer_Release(b);
        return -1;
    }
    v->base = (const char *)b->buf;
    v->itemsize = b->itemsize;
    if (b->ndim == 1) {
        v->rows = 1;
        v->cols = b->shape[0];
        v->row_stride = 0;
        v->col_stride = b->strides[0];
    } else {
        v->rows = b->shape[0];
        v->cols = b->shape[1];
        v->row_stride = b->strides[0];
        v->col_stride = b->strides[1];
    }
    return 0;
}

static PyObject *py_gather(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "gather(field, sel_or_None, out)");
        return NULL;
    }
    Py_buffer fb, sb = {0}, ob;
    field_view v;
    if (get_field_view(args[0], &fb, &v, "field") < 0) return NULL;
    int have_sel = args[1] != Py_None;
    if (have_sel && PyObject_GetBuffer(args[1], &sb, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) goto fail_f;
    if (PyObject_GetBuffer(args[2], &ob, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) goto fail_s;
    int64_t m = have_sel ? (int64_t)(sb.len / 8) : v.rows * v.cols;
    if (have_sel && (sb.itemsize != 8 || !fmt_ok(sb.format, sb.itemsize, 0))) {
        PyErr_SetString(PyExc_TypeError, "gather: sel must be a contiguous int64 array");
        goto fail_o;
    }
    if (ob.len != m * v.itemsize) {
        PyErr_Format(PyExc_ValueError, "gather: out has %zd bytes, needs %lld", ob.len, (long long)(m * v.itemsize));
        goto fail_o;
    }
    int64_t bad;
    if (m >= NOGIL_MIN_ROWS) {
        Py_BEGIN_ALLOW_THREADS
        bad = columns_gather(&v, have_sel ? (const int64_t *)sb.buf : NULL, m, (char *)ob.buf);
        Py_END_ALLOW_THREADS
    } else {
        bad = columns_gather(&v, have_sel ? (const int64_t *)sb.buf : NULL, m, (char *)ob.buf);
    }
    if (bad) {
        PyErr_Format(PyExc_IndexError, "gather: index %lld out of range for %lld rows",
                     (long long)((const int64_t *)sb.buf)[bad - 1], (long long)(v.rows * v.cols));
        goto fail_o;
    }
    PyBuffer_Release(&ob);
    if (have_sel) PyBuffer_Release(&sb);
    PyBuffer_Release(&fb);
    Py_RETURN_NONE;
fail_o:
    PyBuffer_Release(&ob);
fail_s:
    if (have_sel) PyBuffer_Release(&sb);
fail_f:
    PyBuffer_Release(&fb);
    return NULL;
}

static PyObject *py_minmax_i64(PyObject *mod, PyObject *field) {
    Py_buffer fb;
    field_view v;
    if (get_field_view(field, &fb, &v, "field") < 0) return NULL;
    if (!fmt_ok(fb.format, fb.itemsize, 0)) {
        PyBuffer_Release(&fb);
        PyErr_SetString(PyExc_TypeError, "minmax_i64: field must be int64");
        return NULL;
    }
    if (v.rows * v.cols == 0) {
        PyBuffer_Release(&fb);
        PyErr_SetString(PyExc_ValueError, "minmax_i64 of an empty field");
        return NULL;
    }
    int64_t lo, hi;
    columns_minmax_i64(&v, &lo, &hi);
    PyBuffer_Release(&fb);
    return Py_BuildValue("(LL)", (long long)lo, (long long)hi);
}

/* route(keys, counts, vals, leaders, keys_out, counts_out, vals_out, offsets): C-contiguous
 * 8-byte columns of n rows, leaders int64[partitions], offsets int64[owners + 1]; the three
 * outputs writable 1-D views of one common stride (plain arrays, or fields of structured rows). */
static PyObject *py_route(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "route(keys, counts, vals, leaders, keys_out, counts_out, vals_out, offsets)");
        return NULL;
    }
    Py_buffer b[8];
    int got = 0, ok = 1;
    for (; got < 8; got++) {
        const int strided_out = got >= 4 && got < 7;
        const int flags = (strided_out ? PyBUF_RECORDS : PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) |
                          (got >= 4 ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(args[got], &b[got], flags) < 0) {
            ok = 0;
            break;
        }
        if (b[got].itemsize != 8 || (strided_out && (b[got].ndim != 1 || b[got].strides[0] != b[4].strides[0]))) {
            PyErr_Format(PyExc_TypeError, "route: argument %d must hold 8-byte items (outputs: 1-D, one stride)", got);
            got++;
            ok = 0;
            break;
        }
    }
    if (ok) {
        const int64_t n = b[0].len / 8, partitions = b[3].len / 8, owners = b[7].len / 8 - 1;
        if (b[1].len / 8 != n || b[2].len / 8 != n || b[4].shape[0] != n || b[5].shape[0] != n ||
            b[6].shape[0] != n || partitions < 1 || partitions >= ((int64_t)1 << 31) || owners < 1) {
            PyErr_SetString(PyExc_ValueError, "route: columns of different lengths, or no partitions or owners");
            ok = 0;
        } else {
            const int64_t *leaders = (const int64_t *)b[3].buf;
            for (int64_t p = 0; p < partitions && ok; p++)
                if (leaders[p] < 0 || leaders[p] >= owners) {
                    PyErr_Format(PyExc_ValueError, "route: partition %lld has leader %lld, not in [0, %lld)",
                                 (long long)p, (long long)leaders[p], (long long)owners);
                    ok = 0;
                }
            if (ok) {
                int bad;
                Py_BEGIN_ALLOW_THREADS
                bad = columns_route((const int64_t *)b[0].buf, (const int64_t *)b[1].buf, (const uint64_t *)b[2].buf, n,
                                    leaders, partitions, owners, (char *)b[4].buf, (char *)b[5].buf, (char *)b[6].buf,
                                    b[4].strides[0], (int64_t *)b[7].buf);
                Py_END_ALLOW_THREADS
                if (bad) {
                    PyErr_NoMemory();
                    ok = 0;
                }
            }
        }
    }
    for (int i = 0; i < got; i++) PyBuffer_Release(&b[i]);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* ---- ring footers ---------------------------------------------------------------------- */

/* A writable (or read-only) contiguous ring buffer that holds slots [first, first + k). */
static int get_ring(PyObject *obj, Py_buffer *b, int writable, int64_t slot_size, int64_t first, int64_t k) {
    if (PyObject_GetBuffer(obj, b, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0) return -1;
    if (slot_size < RING_FOOTER_SIZE || first < 0 || k < 0 || (first + k) * slot_size > b->len) {
        PyErr_Format(PyExc_ValueError, "ring of %zd bytes has no slots [%lld, %lld) of %lld bytes", b->len,
                     (long long)first, (long long)(first + k), (long long)slot_size);
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

static PyObject *py_ring_post(PyObject *mod, PyObject *args) {
    PyObject *ring;
    long long slot_size, first, k;
    unsigned long long seq0, epoch; /* footer fields are u64 */
    unsigned int count, nbytes;
    int kind;
    if (!PyArg_ParseTuple(args, "OLLLIIKKi", &ring, &slot_size, &first, &k, &count, &nbytes, &seq0, &epoch, &kind))
        return NULL;
    Py_buffer b;
    if (get_ring(ring, &b, 1, slot_size, first, k) < 0) return NULL;
    if ((long long)nbytes > slot_size - RING_FOOTER_SIZE) {
        PyBuffer_Release(&b);
        return PyErr_Format(PyExc_ValueError, "payload of %u bytes does not fit a %lld-byte slot", nbytes, slot_size);
    }
    ring_post((char *)b.buf, slot_size, first, k, count, nbytes, (uint64_t)seq0, (uint64_t)epoch, (uint8_t)kind);
    PyBuffer_Release(&b);
    Py_RETURN_NONE;
}

static PyObject *py_ring_poll_data(PyObject *mod, PyObject *args) {
    PyObject *ring;
    long long slot_size, first, max_k, expected_seq, record_size;
    if (!PyArg_ParseTuple(args, "OLLLLL", &ring, &slot_size, &first, &max_k, &expected_seq, &record_size)) return NULL;
    Py_buffer b;
    if (get_ring(ring, &b, 0, slot_size, first, max_k) < 0) return NULL;
    uint32_t count = 0;
    int64_t n = ring_poll_data((const char *)b.buf, slot_size, first, max_k, (uint64_t)expected_seq, record_size, &count);
    PyBuffer_Release(&b);
    return Py_BuildValue("(LI)", (long long)n, count);
}

static PyObject *py_ring_release(PyObject *mod, PyObject *args) {
    PyObject *ring;
    long long slot_size, first, k;
    if (!PyArg_ParseTuple(args, "OLLL", &ring, &slot_size, &first, &k)) return NULL;
    Py_buffer b;
    if (get_ring(ring, &b, 1, slot_size, first, k) < 0) return NULL;
    ring_release((char *)b.buf, slot_size, first, k);
    PyBuffer_Release(&b);
    Py_RETURN_NONE;
}

static PyObject *py_copy_rows_max(PyObject *mod, PyObject *args) {
    PyObject *dst, *src;
    long long row_bytes, record_size, field_offset;
    if (!PyArg_ParseTuple(args, "OOLLL", &dst, &src, &row_bytes, &record_size, &field_offset)) return NULL;
    Py_buffer db, sb;
    field_view v;
    if (PyObject_GetBuffer(dst, &db, PyBUF_RECORDS) < 0) return NULL;
    if (db.ndim != 2 || db.itemsize != 1 || db.strides[1] != 1 || db.shape[1] < row_bytes || record_size <= 0 ||
        field_offset + 8 > record_size) {
        PyBuffer_Release(&db);
        PyErr_SetString(PyExc_ValueError, "copy_rows_max: dst must be a 2-D uint8 view with rows of >= row_bytes "
                                          "contiguous bytes, and the field must fit a record");
        return NULL;
    }
    v.base = (const char *)db.buf;
    v.rows = db.shape[0];
    v.cols = db.shape[1];
    v.row_stride = db.strides[0];
    v.col_stride = 1;
    v.itemsize = 1;
    if (PyObject_GetBuffer(src, &sb, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&db);
        return NULL;
    }
    if (sb.len != v.rows * row_bytes) {
        PyErr_Format(PyExc_ValueError, "copy_rows_max: src has %zd bytes, expected %lld", sb.len,
                     (long long)(v.rows * row_bytes));
        PyBuffer_Release(&sb);
        PyBuffer_Release(&db);
        return NULL;
    }
    int64_t hi;
    Py_BEGIN_ALLOW_THREADS
    hi = columns_copy_rows_max(&v, (const char *)sb.buf, row_bytes, record_size, field_offset);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&sb);
    PyBuffer_Release(&db);
    return PyLong_FromLongLong(hi);
}

/* ---- shared-memory control block ------------------------------------------------------- */

/* A pointer to the `size`-byte word at byte `off` of a contiguous buffer, naturally aligned. */
static char *shm_word(PyObject *obj, PyObject *offobj, Py_ssize_t size, int writable, Py_buffer *b) {
    Py_ssize_t off = PyLong_AsSsize_t(offobj);
    if (off == -1 && PyErr_Occurred()) return NULL;
    if (PyObject_GetBuffer(obj, b, PyBUF_SIMPLE | (writable ? PyBUF_WRITABLE : 0)) < 0) return NULL;
    char *p = (char *)b->buf + off;
    if (off < 0 || off + size > b->len || ((uintptr_t)p % (uintptr_t)size) != 0) {
        PyErr_Format(PyExc_ValueError, "no aligned %zd-byte word at offset %zd of a %zd-byte buffer", size, off, b->len);
        PyBuffer_Release(b);
        return NULL;
    }
    return p;
}

static int shm_nargs(Py_ssize_t nargs, Py_ssize_t want, const char *usage) {
    if (nargs == want) return 0;
    PyErr_Format(PyExc_TypeError, "%s", usage);
    return -1;
}

static int shm_fd(PyObject *obj) {
    long fd = PyLong_AsLong(obj);
    if (fd == -1 && PyErr_Occurred()) return -1;
    if (fd < 0 || fd > INT_MAX) {
        PyErr_Format(PyExc_ValueError, "bad file descriptor %ld", fd);
        return -1;
    }
    return (int)fd;
}

static PyObject *shm_wake_result(int rc) {
    if (rc < 0) {
        errno = -rc;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyBool_FromLong(rc);
}

static PyObject *py_shm_load_u64(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (shm_nargs(nargs, 2, "shm_load_u64(buf, off)")) return NULL;
    Py_buffer b;
    char *p = shm_word(args[0], args[1], 8, 0, &b);
    if (!p) return NULL;
    uint64_t v = shm_load_acquire_u64(p);
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLongLong(v);
}

static PyObject *py_shm_store_u64(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (shm_nargs(nargs, 3, "shm_store_u64(buf, off, value)")) return NULL;
    unsigned long long v = PyLong_AsUnsignedLongLong(args[2]);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    Py_buffer b;
    char *p = shm_word(args[0], args[1], 8, 1, &b);
    if (!p) return NULL;
    shm_store_release_u64(p, v);
    PyBuffer_Release(&b);
    Py_RETURN_NONE;
}

static PyObject *py_shm_load_u8(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (shm_nargs(nargs, 2, "shm_load_u8(buf, off)")) return NULL;
    Py_buffer b;
    char *p = shm_word(args[0], args[1], 1, 0, &b);
    if (!p) return NULL;
    uint8_t v = shm_load_acquire_u8(p);
    PyBuffer_Release(&b);
    return PyLong_FromLong(v);
}

static PyObject *py_shm_park(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (shm_nargs(nargs, 3, "shm_park(buf, off, want)")) return NULL;
    unsigned long long want = PyLong_AsUnsignedLongLong(args[2]);
    if (want == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    if (want == 0) {
        PyErr_SetString(PyExc_ValueError, "shm_park: want must be nonzero (0 means not parked)");
        return NULL;
    }
    Py_buffer b;
    char *p = shm_word(args[0], args[1], 8, 1, &b);
    if (!p) return NULL;
    uint64_t old = shm_park(p, want);
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLongLong(old);
}

static PyObject *py_shm_unpark(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (shm_nargs(nargs, 2, "shm_unpark(buf, off)")) return NULL;
    Py_buffer b;
    char *p = shm_word(args[0], args[1], 8, 1, &b);
    if (!p) return NULL;
    shm_unpark(p);
    PyBuffer_Release(&b);
    Py_RETURN_NONE;
}

static PyObject *py_shm_fence(PyObject *mod, PyObject *unused) {
    shm_fence();
    Py_RETURN_NONE;
}

static PyObject *py_shm_wake(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (shm_nargs(nargs, 4, "shm_wake(buf, parked_off, value, efd)")) return NULL;
    unsigned long long v = PyLong_AsUnsignedLongLong(args[2]);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    int efd = shm_fd(args[3]);
    if (efd < 0) return NULL;
    Py_buffer b;
    char *p = shm_word(args[0], args[1], 8, 1, &b);
    if (!p) return NULL;
    int rc = shm_wake(p, v, efd);
    PyBuffer_Release(&b);
    return shm_wake_result(rc);
}

static PyObject *py_shm_store_and_wake(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (shm_nargs(nargs, 5, "shm_store_and_wake(buf, off, value, parked_off, efd)")) return NULL;
    unsigned long long v = PyLong_AsUnsignedLongLong(args[2]);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    int efd = shm_fd(args[4]);
    if (efd < 0) return NULL;
    Py_buffer b, pb;
    char *p = shm_word(args[0], args[1], 8, 1, &b);
    if (!p) return NULL;
    char *q = shm_word(args[0], args[3], 8, 1, &pb);
    if (!q) {
        PyBuffer_Release(&b);
        return NULL;
    }
    int rc = shm_store_and_wake(p, v, q, efd);
    PyBuffer_Release(&pb);
    PyBuffer_Release(&b);
    return shm_wake_result(rc);
}

static PyMethodDef module_methods[] = {
    {"copy_rows_max", py_copy_rows_max, METH_VARARGS,
     "copy_rows_max(dst2d, src, row_bytes, record_size, field_offset) -> max int64 field of the copied records."},
    {"ring_post", py_ring_post, METH_VARARGS,
     "ring_post(ring, slot_size, first, k, count, nbytes, seq0, epoch, kind): footers of k slots, flag last (release)."},
    {"ring_poll_data", py_ring_poll_data, METH_VARARGS,
     "ring_poll_data(ring, slot_size, first, max_k, expected_seq, record_size) -> (n, count): posted, well-formed "
     "data buffers with one record count at the head of the ring (acquire loads)."},
    {"ring_release", py_ring_release, METH_VARARGS, "ring_release(ring, slot_size, first, k): clear k flags (release)."},
    {"shm_load_u64", (PyCFunction)(void (*)(void))py_shm_load_u64, METH_FASTCALL,
     "shm_load_u64(buf, off) -> the u64 at byte off (acquire load)."},
    {"shm_store_u64", (PyCFunction)(void (*)(void))py_shm_store_u64, METH_FASTCALL,
     "shm_store_u64(buf, off, value): store a u64 at byte off (release store)."},
    {"shm_load_u8", (PyCFunction)(void (*)(void))py_shm_load_u8, METH_FASTCALL,
     "shm_load_u8(buf, off) -> the byte at off (acquire load), e.g. a slot flag."},
    {"shm_park", (PyCFunction)(void (*)(void))py_shm_park, METH_FASTCALL,
     "shm_park(buf, off, want) -> old: set the parked word to want (nonzero; seq_cst exchange)."},
    {"shm_unpark", (PyCFunction)(void (*)(void))py_shm_unpark, METH_FASTCALL,
     "shm_unpark(buf, off): clear the parked word (seq_cst)."},
    {"shm_fence", py_shm_fence, METH_NOARGS, "shm_fence(): a full (seq_cst) memory fence."},
    {"shm_wake", (PyCFunction)(void (*)(void))py_shm_wake, METH_FASTCALL,
     "shm_wake(buf, parked_off, value, efd) -> woke: fence; if the parked word is set and value >= it, "
     "clear it and write 1 to the eventfd."},
    {"shm_store_and_wake", (PyCFunction)(void (*)(void))py_shm_store_and_wake, METH_FASTCALL,
     "shm_store_and_wake(buf, off, value, parked_off, efd) -> woke: release store of value, then shm_wake."},
    {"gather", (PyCFunction)(void (*)(void))py_gather, METH_FASTCALL,
     "gather(field, sel, out): out[i] = flat element sel[i] of a 1-D/2-D strided field view "
     "(sel None: every element, row-major)."},
    {"minmax_i64", (PyCFunction)py_minmax_i64, METH_O, "minmax_i64(field) -> (min, max) of an int64 field view."},
    {"route", (PyCFunction)(void (*)(void))py_route, METH_FASTCALL,
     "route(keys, counts, vals, leaders, keys_out, counts_out, vals_out, offsets): group rows by the "
     "leader of each key's partition (stable)."},
    {"ysb_baseline", (PyCFunction)(void (*)(void))py_ysb_baseline, METH_VARARGS | METH_KEYWORDS,
     "ysb_baseline(records, ad_to_campaign, n_campaigns, window_ms=10000) -> "
     "(window_start, campaign, count) as three bytearrays of int64, sorted by window then "
     "campaign, nonzero counts only."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "slashrt._native",
    .m_doc = "Native kernels of slashrt (hash aggregation, YSB baseline); see slashrt._kernels.",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__native(void) {
    if (PyType_Ready(&HashAggType) < 0) return NULL;
    PyObject *m = PyModule_Create(&native_module);
    if (!m) return NULL;
    Py_INCREF(&HashAggType);
    if (PyModule_AddObject(m, "HashAgg", (PyObject *)&HashAggType) < 0) {
        Py_DECREF(&HashAggType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "DENSE_MAX", HA_DENSE_MAX) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
