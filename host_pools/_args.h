/* Argument checks shared by the project's C modules (host_pools/_pages.c,
 * hicache/_slot_arrays.c, hicache/radix/_read.c; docs/DESIGN.md, "Compiled modules"): a
 * buffer or an integer argument taken, or a TypeError / ValueError naming it. Every module's
 * SOURCE_SHA256 stamp covers this file too (setup.py, host_pools/compiled.py). */
#ifndef HICACHE_ARGS_H
#define HICACHE_ARGS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#ifndef SOURCE_SHA256
#define SOURCE_SHA256 "" /* built without setup.py: host_pools.compiled refuses it as stale */
#endif

/* ``obj``'s buffer: C-contiguous, ``itemsize``-byte items (0: any), writable if asked; else a
 * TypeError naming the argument (numpy's own error, e.g. a BufferError for a strided view,
 * is replaced: it does not say which argument). */
static int get_buf(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, int writable, const char *what)
{
    /* no PyBUF_FORMAT: itemsize is set without it, and numpy then skips building a format
       string at every call (an item's width is checked, not its type: docs/DESIGN.md) */
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: need a C-contiguous%s buffer of %zd-byte items, got %.100s", what,
                     writable ? " writable" : "", itemsize ? itemsize : 1, Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (itemsize && view->itemsize != itemsize) {
        PyErr_Format(PyExc_TypeError, "%s: need items of %zd bytes, got %zd", what, itemsize, view->itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* An integer argument: TypeError (not an integer) or ValueError (beyond a Py_ssize_t) naming it. */
static int get_ssize(PyObject *obj, const char *what, Py_ssize_t *out)
{
    Py_ssize_t v = PyLong_AsSsize_t(obj);
    if (v == -1 && PyErr_Occurred()) {
        int overflow = PyErr_ExceptionMatches(PyExc_OverflowError);
        PyErr_Clear();
        if (overflow)
            PyErr_Format(PyExc_ValueError, "%s: outside [%zd, %zd]", what, PY_SSIZE_T_MIN, PY_SSIZE_T_MAX);
        else
            PyErr_Format(PyExc_TypeError, "%s: need an integer, got %.100s", what, Py_TYPE(obj)->tp_name);
        return -1;
    }
    *out = v;
    return 0;
}

/* The module made from ``def``, its stamp as SOURCE_SHA256 (host_pools.compiled reads it). */
static PyObject *stamped_module(struct PyModuleDef *def)
{
    PyObject *m = PyModule_Create(def);
    if (m != NULL && PyModule_AddStringConstant(m, "SOURCE_SHA256", SOURCE_SHA256) < 0)
        Py_CLEAR(m);
    return m;
}

#endif
