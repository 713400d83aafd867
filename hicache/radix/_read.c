/* The tree's read path, compiled: the drop-in for the Python form in hicache/radix/read.py
 * (the reference; tests/hicache/radix/test_read.py drives both over random trees and finds
 * them equal). walk, touch and gather are documented there.
 *
 * A node is read through a declared layout, not by attribute name: at import this module
 * finds, in hicache.radix.node.TreeNode's own __slots__, the member of each field it reads
 * (`FIELDS`), checks that it is a writable object slot stored inside the instance, and
 * keeps its offset; a call checks each node's type (one compare: exactly TreeNode) and
 * reads the field at its offset. A TreeNode whose layout is not that refuses the import
 * (hicache.radix.read then uses the Python form and says why in one line).
 *
 * Every entry checks its arguments before it reads through them (docs/DESIGN.md, "Compiled
 * modules"): a wrong type, a tensor that is not int64, on the CPU and contiguous, a key
 * that is not 8-byte items, a negative boundary, a count outside the list, an output of
 * another length: a TypeError or a ValueError naming it, never undefined behaviour. The
 * tensor checks call torch.Tensor's own getters (torch is trusted to answer them for an
 * exact torch.Tensor); a node's fields are held by a reference while they are used.
 */
#include "host_pools/_args.h"
#include "hicache/_tensor.h"
#include <structmember.h>
#include <stdint.h>
#include <string.h>


/* ---- the declared layout of a TreeNode ------------------------------------------------ */
enum { KEY, END, CHILDREN, DEVICE, LAST_ACCESS, HIT_COUNT, NFIELDS };
static const char *const FIELDS[NFIELDS] = {"key", "end", "children", "_device", "last_access", "hit_count"};
static PyTypeObject *node_type;
static Py_ssize_t offset[NFIELDS];
static PyObject *one; /* hit_count's step */

#define FIELD(node, f) (*(PyObject **)((char *)(node) + offset[f])) /* a node's field (NULL: unset) */

/* A node's field, borrowed; NULL with a TypeError when it was never set. */
static PyObject *field(PyObject *node, int f)
{
    PyObject *v = FIELD(node, f);
    if (v == NULL)
        PyErr_Format(PyExc_TypeError, "node: its %s is not set", FIELDS[f]);
    return v;
}

static int is_node(PyObject *obj, const char *what)
{
    if (Py_TYPE(obj) == node_type)
        return 1;
    PyErr_Format(PyExc_TypeError, "%s: need a TreeNode, got %.100s", what, Py_TYPE(obj)->tp_name);
    return 0;
}

/* Binds TreeNode's layout; -1 with ImportError saying what does not fit. */
static int bind_node(void)
{
    PyObject *mod = PyImport_ImportModule("hicache.radix.node");
    PyObject *type = mod == NULL ? NULL : PyObject_GetAttrString(mod, "TreeNode");
    Py_XDECREF(mod);
    if (type == NULL)
        return -1;
    PyTypeObject *t = (PyTypeObject *)type;
    const char *bad = NULL, *why = ": not a writable object slot of its own __slots__";
    if (!PyType_Check(type))
        bad = "it is not a class", why = "";
    else if (t->tp_setattro != PyObject_GenericSetAttr)
        bad = "it defines __setattr__", why = "";
    for (int f = 0; bad == NULL && f < NFIELDS; f++) {
        PyObject *d = PyDict_GetItemString(t->tp_dict, FIELDS[f]); /* borrowed: its own slot, not inherited */
        PyMemberDef *m = d != NULL && Py_IS_TYPE(d, &PyMemberDescr_Type) ? ((PyMemberDescrObject *)d)->d_member : NULL;
        if (m == NULL || m->type != T_OBJECT_EX || (m->flags & READONLY) || m->offset < (Py_ssize_t)sizeof(PyObject)
            || m->offset > t->tp_basicsize - (Py_ssize_t)sizeof(PyObject *))
            bad = FIELDS[f];
        else
            offset[f] = m->offset;
    }
    if (bad != NULL) {
        PyErr_Format(PyExc_ImportError, "hicache.radix._read: TreeNode's layout does not fit (%s%s)", bad, why);
        Py_DECREF(type);
        return -1;
    }
    node_type = t; /* kept for the module's life */
    return 0;
}

/* ---- touch -------------------------------------------------------------------------- */
/* touch(nodes, clock, hits) -> nodes holding a device copy; see read.py's `touch`. */
static PyObject *touch(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyList_Check(args[0]) || !PyLong_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "touch(nodes: list, clock: int, hits)");
        return NULL;
    }
    PyObject *nodes = args[0], *clock = args[1];
    int hits = PyObject_IsTrue(args[2]);
    if (hits < 0)
        return NULL;
    Py_ssize_t on_device = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(nodes); i++) { /* its size read again: a __del__ may shrink it */
        PyObject *node = PyList_GET_ITEM(nodes, i);
        if (!is_node(node, "nodes"))
            return NULL;
        Py_INCREF(node);
        PyObject *h = NULL;
        if (hits) {
            PyObject *was = field(node, HIT_COUNT);
            if (was == NULL || !PyLong_CheckExact(was)) {
                if (was != NULL)
                    PyErr_Format(PyExc_TypeError, "nodes[%zd]: its hit_count is not an int", i);
                Py_DECREF(node);
                return NULL;
            }
            if ((h = PyNumber_Add(was, one)) == NULL) {
                Py_DECREF(node);
                return NULL;
            }
        }
        on_device += FIELD(node, DEVICE) != NULL && FIELD(node, DEVICE) != Py_None;
        Py_XSETREF(FIELD(node, LAST_ACCESS), Py_NewRef(clock)); /* the old value's __del__ runs last */
        if (h != NULL)
            Py_XSETREF(FIELD(node, HIT_COUNT), h);
        Py_DECREF(node);
    }
    return PyLong_FromSsize_t(on_device);
}

/* ---- gather ------------------------------------------------------------------------- */
/* gather(nodes, count, out) -> None; see read.py's `gather`. */
static PyObject *gather(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "gather(nodes: list, count, out)");
        return NULL;
    }
    Py_ssize_t count;
    if (get_ssize(args[1], "count", &count) < 0)
        return NULL;
    if (count < 0 || count > PyList_GET_SIZE(args[0])) {
        PyErr_Format(PyExc_ValueError, "count: %zd is outside [0, %zd] (the nodes)", count, PyList_GET_SIZE(args[0]));
        return NULL;
    }
    Py_buffer out;
    if (get_buf(args[2], &out, 8, 1, "out") < 0)
        return NULL;
    enum { FEW = 64 };
    const char *src_few[FEW];
    Py_ssize_t len_few[FEW];
    PyObject *held_few[FEW];
    const char **src = src_few;
    Py_ssize_t *len = len_few;
    PyObject **held = held_few; /* the tensors, held until their bytes are copied */
    if (count > FEW) {
        src = PyMem_Malloc(sizeof(*src) * (size_t)count);
        len = PyMem_Malloc(sizeof(*len) * (size_t)count);
        held = PyMem_Malloc(sizeof(*held) * (size_t)count);
        if (src == NULL || len == NULL || held == NULL) {
            PyMem_Free(src);
            PyMem_Free(len);
            PyMem_Free(held);
            PyBuffer_Release(&out);
            return PyErr_NoMemory();
        }
    }
    Py_ssize_t total = 0, got = 0;
    PyObject *result = NULL;
    for (; got < count; got++) {
        if (got >= PyList_GET_SIZE(args[0])) {  /* the list shrank under us: never read past it */
            PyErr_SetString(PyExc_ValueError, "nodes: the list changed during the call");
            goto done;
        }
        PyObject *node = PyList_GET_ITEM(args[0], got);
        if (!is_node(node, "nodes"))
            goto done;
        PyObject *t = FIELD(node, DEVICE);
        if (t == NULL || t == Py_None) {
            PyErr_Format(PyExc_ValueError, "nodes[%zd]: holds no device slots", got);
            goto done;
        }
        held[got] = Py_NewRef(t);
        if (tensor_items(t, "nodes", got, &src[got], &len[got]) < 0) {
            Py_DECREF(t);
            goto done;
        }
        if (len[got] > PY_SSIZE_T_MAX / 8 - total) {
            Py_DECREF(t);
            PyErr_SetString(PyExc_ValueError, "nodes: more slots than a buffer can hold");
            goto done;
        }
        total += len[got];
    }
    if (total * 8 != out.len) {
        PyErr_Format(PyExc_ValueError, "out: %zd slots into a buffer of %zd", total, out.len / 8);
        goto done;
    }
    char *dst = (char *)out.buf;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (len[i])
            memcpy(dst, src[i], (size_t)len[i] * 8);
        dst += len[i] * 8;
    }
    result = Py_NewRef(Py_None);
done:
    for (Py_ssize_t i = 0; i < got; i++)
        Py_DECREF(held[i]);
    if (src != src_few) {
        PyMem_Free(src);
        PyMem_Free(len);
        PyMem_Free(held);
    }
    PyBuffer_Release(&out);
    return result;
}

/* ---- walk --------------------------------------------------------------------------- */
/* The child of ``children`` filed under the page at ``p`` (``pb`` bytes, at least 8), as a
 * new reference, or NULL (an error set, or none filed): the rule of read.py's `child_at`. */
static PyObject *child_at(PyObject *children, const char *p, Py_ssize_t pb)
{
    PyObject *tok = PyBytes_FromStringAndSize(p, 8);
    if (tok == NULL)
        return NULL;
    PyObject *found = PyDict_GetItemWithError(children, tok); /* borrowed */
    Py_DECREF(tok);
    if (found == NULL)
        return NULL;
    if (!PyDict_CheckExact(found)) {
        if (!is_node(found, "walk: a child"))
            return NULL;
        return Py_NewRef(found);
    }
    Py_INCREF(found); /* a key's __eq__ could drop it from its parent during the lookup */
    PyObject *page = PyBytes_FromStringAndSize(p, pb), *child = NULL;
    if (page != NULL) {
        child = PyDict_GetItemWithError(found, page);
        Py_DECREF(page);
        if (child != NULL && !is_node(child, "walk: a child"))
            child = NULL;
        Py_XINCREF(child);
    }
    Py_DECREF(found);
    return child;
}

/* How ``child``'s key meets the key ``kb`` (``n`` bytes) at byte ``off`` (n - off >= 8): 2 in
 * full, 1 in the key's next page only (``pb`` bytes, or what is left of the key: read.py's
 * `child_at`), 0 not even there, -1 on error; ``*m``: its length. */
static int meet(PyObject *child, const char *kb, Py_ssize_t off, Py_ssize_t n, Py_ssize_t pb, Py_ssize_t *m)
{
    PyObject *ck = field(child, KEY);
    if (ck == NULL)
        return -1;
    if (!PyBytes_Check(ck)) {
        PyErr_SetString(PyExc_TypeError, "walk: a node's key must be bytes");
        return -1;
    }
    const char *c = PyBytes_AS_STRING(ck);
    Py_ssize_t len = PyBytes_GET_SIZE(ck), rest = n - off, page = pb < rest ? pb : rest;
    *m = len;
    if (len > 0 && len <= rest && memcmp(kb + off, c, (size_t)len) == 0)
        return 2;
    return len >= page && memcmp(kb + off, c, (size_t)page) == 0;
}

/* The key of a walk: bytes, or a C-contiguous buffer of 8-byte items (an int64 array). */
static int key_buffer(PyObject *key, Py_buffer *view)
{
    if (PyObject_GetBuffer(key, view, PyBUF_C_CONTIGUOUS) == 0) {
        if (view->itemsize == 8 || PyBytes_CheckExact(key))
            return 0;
        PyBuffer_Release(view);
    }
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError, "key: need bytes or a C-contiguous int64 array, got %.100s", Py_TYPE(key)->tp_name);
    return -1;
}

/* walk(node, key, page_bytes, hint) -> (path, partial); see read.py's `walk`. */
static PyObject *walk(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || (args[3] != Py_None && !PyList_Check(args[3]))) {
        PyErr_SetString(PyExc_TypeError, "walk(node, key, page_bytes, hint: list | None)");
        return NULL;
    }
    if (!is_node(args[0], "node"))
        return NULL;
    Py_ssize_t pb;
    if (get_ssize(args[2], "page_bytes", &pb) < 0)
        return NULL;
    if (pb < 8 || pb % 8) {
        PyErr_Format(PyExc_ValueError, "page_bytes: must be a positive multiple of 8, got %zd", pb);
        return NULL;
    }
    PyObject *end = field(args[0], END);
    if (end == NULL)
        return NULL;
    int overflow = 0;
    long long first = PyLong_Check(end) ? PyLong_AsLongLongAndOverflow(end, &overflow) : -1;
    if (first == -1 && PyErr_Occurred())
        return NULL;
    if (!PyLong_Check(end) || overflow < 0 || (first < 0 && overflow == 0)) {
        PyErr_Format(PyExc_ValueError, "node: its end must be an int >= 0, got %R", end);
        return NULL;
    }
    Py_buffer view;
    if (key_buffer(args[1], &view) < 0)
        return NULL;
    const char *kb = (const char *)view.buf;
    Py_ssize_t n = view.len;
    PyObject *path = PyList_New(0), *partial = Py_NewRef(Py_None), *out = NULL;
    PyObject *hint = args[3] == Py_None ? NULL : Py_NewRef(args[3]);
    PyObject *children = field(args[0], CHILDREN);
    Py_XINCREF(children);
    /* beyond the key (or overflowing: beyond any key): nothing below it matches */
    Py_ssize_t off = overflow || first > n / 8 ? n : (Py_ssize_t)first * 8;
    if (path == NULL || children == NULL)
        goto done;
    for (Py_ssize_t level = 0; n - off >= 8; level++) {
        if (!PyDict_CheckExact(children)) {
            PyErr_SetString(PyExc_TypeError, "walk: a node's children must be a dict");
            goto done;
        }
        Py_ssize_t m = 0;
        int how = 0;
        /* the hinted node while the key matches it in full; else the lookup */
        PyObject *child = hint != NULL && level < PyList_GET_SIZE(hint) ? PyList_GET_ITEM(hint, level) : NULL;
        if (child != NULL) {
            if (!is_node(child, "hint"))
                goto done;
            Py_INCREF(child);
            if ((how = meet(child, kb, off, n, pb, &m)) != 2) {
                Py_CLEAR(child);
                if (how < 0)
                    goto done;
            }
        }
        if (child == NULL) {
            Py_CLEAR(hint);
            child = child_at(children, kb + off, pb <= n - off ? pb : n - off);
            if (child == NULL && PyErr_Occurred())
                goto done;
            how = child == NULL ? 0 : meet(child, kb, off, n, pb, &m);
            if (how != 2) {
                if (how == 1)  /* its first page matches, not all of it */
                    Py_SETREF(partial, Py_NewRef(child));
                Py_XDECREF(child);
                if (how < 0)
                    goto done;
                break;  /* none filed, one sharing only the first token, or a partial match */
            }
        }
        int err = PyList_Append(path, child);
        off += m;
        PyObject *below = field(child, CHILDREN);
        Py_XINCREF(below);
        Py_DECREF(child);
        Py_SETREF(children, below);
        if (err < 0 || children == NULL)
            goto done;
    }
    out = PyTuple_Pack(2, path, partial);
done:
    Py_XDECREF(path);
    Py_XDECREF(children);
    Py_XDECREF(hint);
    Py_DECREF(partial);
    PyBuffer_Release(&view);
    return out;
}

static PyMethodDef methods[] = {
    {"walk", (PyCFunction)(void (*)(void))walk, METH_FASTCALL,
     "walk(node, key, page_bytes, hint) -> (fully matched nodes, partly matched node or None)."},
    {"touch", (PyCFunction)(void (*)(void))touch, METH_FASTCALL,
     "touch(nodes, clock, hits) -> nodes holding a device copy (last_access set, hit_count raised if hits)."},
    {"gather", (PyCFunction)(void (*)(void))gather, METH_FASTCALL,
     "gather(nodes, count, out): the device slots of the first count nodes, one after another, into out."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_read", "The tree's read path, compiled.", -1, methods};

PyMODINIT_FUNC PyInit__read(void)
{
    static int bound; /* both layouts, once for the process */
    if (!bound && ((one = PyLong_FromLong(1)) == NULL || bind_node() < 0 || bind_tensor() < 0)) {
        node_type = NULL; /* nothing half bound: an import again binds again */
        return NULL;
    }
    bound = 1;
    return stamped_module(&module);
}
