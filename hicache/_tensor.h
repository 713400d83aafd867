/* int64 slot tensors as hicache's C modules read them (radix/_read.c, _slot_arrays.c; their
 * stamps cover this file): torch.Tensor, torch.int64 and the getters a check calls, looked
 * up once at import (`bind_tensor`) and called without the descriptor protocol (the type is
 * checked first: exactly torch.Tensor), and `tensor_items`, the check of one tensor before
 * its items are read. Torch is trusted to answer its own getters for an exact tensor
 * (docs/DESIGN.md). A tensor's own ``numpy()`` would do the same checks at ~6k instructions. */
#ifndef HICACHE_TENSOR_H
#define HICACHE_TENSOR_H

#include <Python.h>

static PyTypeObject *tensor_type;
static PyObject *int64_dtype, *no_args;
static PyGetSetDef *get_dtype, *get_is_cpu;
static PyMethodDef *m_is_contiguous, *m_data_ptr, *m_numel;

static PyObject *call_getter(PyGetSetDef *g, PyObject *t)
{
    return g->get(t, g->closure);
}

static PyObject *call_method(PyMethodDef *m, PyObject *t)
{
    if (m->ml_flags & METH_NOARGS)
        return m->ml_meth(t, NULL);
    return ((PyCFunctionWithKeywords)(void (*)(void))m->ml_meth)(t, no_args, NULL); /* METH_VARARGS | KEYWORDS */
}

/* Whether a getter's result ``r`` (a new reference, released) is ``want``: 1, 0, or -1 (it raised). */
static int answer_is(PyObject *r, PyObject *want)
{
    if (r == NULL)
        return -1;
    Py_DECREF(r); /* only its identity is compared */
    return r == want;
}

static int bind_tensor(void)
{
    PyObject *torch = PyImport_ImportModule("torch");
    if (torch == NULL)
        return -1;
    PyObject *type = PyObject_GetAttrString(torch, "Tensor");
    int64_dtype = PyObject_GetAttrString(torch, "int64");
    Py_DECREF(torch);
    no_args = PyTuple_New(0);
    if (type == NULL || int64_dtype == NULL || no_args == NULL || !PyType_Check(type))
        return -1;
    tensor_type = (PyTypeObject *)type; /* these references are kept for the module's life */
    PyGetSetDef **gets[] = {&get_dtype, &get_is_cpu};
    PyMethodDef **meths[] = {&m_is_contiguous, &m_data_ptr, &m_numel};
    const char *names[] = {"dtype", "is_cpu", "is_contiguous", "data_ptr", "numel"};
    for (int i = 0; i < 5; i++) {
        PyObject *d = PyObject_GetAttrString(type, names[i]); /* a descriptor, from the class: itself */
        int ok = 0;
        if (d != NULL && i < 2 && Py_IS_TYPE(d, &PyGetSetDescr_Type)) {
            *gets[i] = ((PyGetSetDescrObject *)d)->d_getset;
            ok = (*gets[i])->get != NULL;
        } else if (d != NULL && i >= 2 && Py_IS_TYPE(d, &PyMethodDescr_Type)) {
            *meths[i - 2] = ((PyMethodDescrObject *)d)->d_method;
            int flags = (*meths[i - 2])->ml_flags & (METH_NOARGS | METH_VARARGS | METH_KEYWORDS | METH_FASTCALL | METH_O);
            ok = flags == METH_NOARGS || flags == (METH_VARARGS | METH_KEYWORDS);
        }
        if (!ok) {  /* d stays referenced: its definition is read for the module's life */
            Py_XDECREF(d);
            PyErr_Clear();
            PyErr_Format(PyExc_ImportError, "hicache.radix._read: torch.Tensor.%s is not the built-in it reads",
                         names[i]);
            return -1;
        }
    }
    return 0;
}

/* ``exc`` with ``text``, naming ``what`` (``what[i]`` for i >= 0: an item of a list). */
static void tensor_error(PyObject *exc, const char *what, Py_ssize_t i, const char *text)
{
    if (i < 0)
        PyErr_Format(exc, "%s: %s", what, text);
    else
        PyErr_Format(exc, "%s[%zd]: %s", what, i, text);
}

/* The int64 items of ``t``, an exact torch.Tensor of int64 on the CPU, contiguous; -1 with a
 * TypeError naming ``what`` (``what[i]`` for i >= 0: an item of a list) otherwise. */
static int tensor_items(PyObject *t, const char *what, Py_ssize_t i, const char **data, Py_ssize_t *n)
{
    const char *why = NULL;
    int ok = 0;
    if (Py_TYPE(t) != tensor_type)
        why = "is not a torch.Tensor";
    else if ((ok = answer_is(call_getter(get_dtype, t), int64_dtype)) <= 0)
        why = "is not int64";
    else if ((ok = answer_is(call_getter(get_is_cpu, t), Py_True)) <= 0)
        why = "is not on the CPU";
    else if ((ok = answer_is(call_method(m_is_contiguous, t), Py_True)) <= 0)
        why = "is not contiguous";
    if (why != NULL) {
        if (ok < 0)  /* the getter raised: its error stands */
            return -1;
        char text[200];
        PyOS_snprintf(text, sizeof text, "need an int64 contiguous CPU torch.Tensor, got one that %s (%.100s)", why,
                      Py_TYPE(t)->tp_name);
        tensor_error(PyExc_TypeError, what, i, text);
        return -1;
    }
    PyObject *ptr = call_method(m_data_ptr, t);
    if (ptr == NULL)
        return -1;
    PyObject *num = call_method(m_numel, t);
    if (num == NULL) {
        Py_DECREF(ptr);
        return -1;
    }
    *data = (const char *)PyLong_AsVoidPtr(ptr);
    *n = PyLong_AsSsize_t(num);
    Py_DECREF(ptr);
    Py_DECREF(num);
    if (PyErr_Occurred())
        return -1;
    if (*n < 0 || *n > PY_SSIZE_T_MAX / 8 || (*data == NULL && *n > 0)) { /* its storage freed under it */
        tensor_error(PyExc_ValueError, what, i, "a tensor with no storage behind it");
        return -1;
    }
    return 0;
}

#endif
