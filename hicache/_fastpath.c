/* Compiled checks for HiRadixCache's hot path (optional: hicache.fastpath falls back
 * to numpy when this module is not built).
 *
 * Each function does in one pass over a few buffers what would otherwise be several numpy
 * calls of ~1 us each. They take numpy arrays (buffer protocol) and never allocate Python
 * objects but their return value; anything unexpected (wrong item size, non-contiguous
 * buffer) is a TypeError or ValueError, never undefined behaviour.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* p = slot / ps and whether slot % ps == 0, with a shift for power-of-two pages (a 64-bit
 * division per page costs more than the rest of a check). */
typedef struct {
    int64_t ps;
    int shift; /* log2(ps) when ps is a power of two, else -1 */
} pagediv;

static pagediv make_pagediv(int64_t ps)
{
    pagediv d = {ps, -1};
    if (ps > 0 && (ps & (ps - 1)) == 0) {
        d.shift = 0;
        while (((int64_t)1 << d.shift) < ps)
            d.shift++;
    }
    return d;
}

static inline int64_t page_of(pagediv d, int64_t slot)
{
    return d.shift >= 0 ? slot >> d.shift : slot / d.ps;
}

static inline int aligned(pagediv d, int64_t slot)
{
    return d.shift >= 0 ? (slot & (d.ps - 1)) == 0 : slot % d.ps == 0;
}

static int get_buf(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, int writable, const char *what)
{
    /* no PyBUF_FORMAT: itemsize is set without it, and numpy then skips building a
       format string at every call */
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0)
        return -1;
    if (view->itemsize != itemsize) {
        PyErr_Format(PyExc_TypeError, "%s: need items of %zd bytes, got %zd", what, itemsize,
                     view->itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* same_bytes(a, b) -> bool: equal lengths and bytes (two C-contiguous buffers). */
static PyObject *same_bytes(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer a, b;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "same_bytes(a, b)");
        return NULL;
    }
    if (PyObject_GetBuffer(args[0], &a, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[1], &b, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&a);
        return NULL;
    }
    int same = a.len == b.len && (a.len == 0 || memcmp(a.buf, b.buf, (size_t)a.len) == 0);
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    return PyBool_FromLong(same);
}

/* fresh_pages(slots, start, free_from, page_size, owned, held, out) -> int
 *
 * Pages of slots[start:] (int64), written to out (int64, room for them), when every page
 * is a whole aligned run of page_size consecutive slots, pages strictly ascend, lie in
 * [0, len(owned)), are allocated (owned[p], bool) and -- for slots before free_from,
 * unless held is None -- held by nobody (held[p] == 0, int32). Returns the number of
 * pages, or -1 when any rule fails (the caller's slow path then names the broken rule).
 * ``out`` None: the rules checked, no page written.
 */
static PyObject *fresh_pages(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer s, owned, held, out;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError,
                        "fresh_pages(slots, start, free_from, page_size, owned, held, out)");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    Py_ssize_t free_from = PyLong_AsSsize_t(args[2]);
    Py_ssize_t ps = PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred())
        return NULL;
    int use_held = args[5] != Py_None;
    if (get_buf(args[0], &s, 8, 0, "slots") < 0)
        return NULL;
    if (get_buf(args[4], &owned, 1, 0, "owned") < 0) {
        PyBuffer_Release(&s);
        return NULL;
    }
    if (use_held && get_buf(args[5], &held, 4, 0, "held") < 0) {
        PyBuffer_Release(&s);
        PyBuffer_Release(&owned);
        return NULL;
    }
    int use_out = args[6] != Py_None;
    if (use_out && get_buf(args[6], &out, 8, 1, "out") < 0) {
        PyBuffer_Release(&s);
        PyBuffer_Release(&owned);
        if (use_held)
            PyBuffer_Release(&held);
        return NULL;
    }
    const int64_t *slot = (const int64_t *)s.buf;
    const char *own = (const char *)owned.buf;
    const int32_t *hold = use_held ? (const int32_t *)held.buf : NULL;
    int64_t *pages = use_out ? (int64_t *)out.buf : NULL;
    Py_ssize_t n = s.len / 8, num_pages = owned.len, out_len = use_out ? out.len / 8 : PY_SSIZE_T_MAX;
    Py_ssize_t count = -1;
    if (!use_held)
        free_from = 0;
    if (ps >= 1 && start >= 0 && start <= n && (n - start) % ps == 0
        && (!use_held || held.len / 4 >= num_pages) && out_len >= (n - start) / ps) {
        pagediv div = make_pagediv(ps);
        int64_t prev = -1;
        Py_ssize_t i = start, k = 0;
        if (ps == 1) { /* a page is a slot: nothing to align, no run to follow (p <= prev: p < 0 too) */
            Py_ssize_t held_end = !use_held ? start : free_from < n ? free_from : n;
            for (; i < n; i++) {
                int64_t p = slot[i];
                if (p <= prev || p >= num_pages || !own[p] || (i < held_end && hold[p]))
                    break;
                prev = p;
            }
            k = i - start;
            if (pages != NULL && k > 0)
                memcpy(pages, slot + start, (size_t)k * sizeof(int64_t));
        }
        for (; i < n; i += ps, k++) {
            int64_t first = slot[i];
            if (first < 0 || !aligned(div, first))
                break;
            int64_t p = page_of(div, first);
            if (p <= prev || p >= num_pages || !own[p] || (i < free_from && hold[p]))
                break;
            Py_ssize_t j = 1;
            while (j < ps && slot[i + j] == first + j)
                j++;
            if (j < ps)
                break;
            if (pages != NULL)
                pages[k] = p;
            prev = p;
        }
        if (i >= n)
            count = k;
    }
    PyBuffer_Release(&s);
    PyBuffer_Release(&owned);
    if (use_held)
        PyBuffer_Release(&held);
    if (use_out)
        PyBuffer_Release(&out);
    return PyLong_FromSsize_t(count);
}

/* hold(slots, page_size, held, delta) -> None: held[slots[i] // page_size] += delta for
 * every page start i of slots (the holder's own whole pages, in range: trusted). */
static PyObject *hold(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer s, held;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "hold(slots, page_size, held, delta)");
        return NULL;
    }
    Py_ssize_t ps = PyLong_AsSsize_t(args[1]);
    long delta = PyLong_AsLong(args[3]);
    if (PyErr_Occurred())
        return NULL;
    if (ps < 1) {
        PyErr_SetString(PyExc_ValueError, "page_size: must be >= 1");
        return NULL;
    }
    if (get_buf(args[0], &s, 8, 0, "slots") < 0)
        return NULL;
    if (get_buf(args[2], &held, 4, 1, "held") < 0) {
        PyBuffer_Release(&s);
        return NULL;
    }
    const int64_t *slot = (const int64_t *)s.buf;
    int32_t *count = (int32_t *)held.buf;
    Py_ssize_t n = s.len / 8, num_pages = held.len / 4;
    pagediv div = make_pagediv(ps);
    int ok = 1;
    for (Py_ssize_t i = 0; i < n; i += ps) {  /* range-checked first: nothing changes on error */
        if (slot[i] < 0 || page_of(div, slot[i]) >= num_pages) {
            ok = 0;
            break;
        }
    }
    if (ok)
        for (Py_ssize_t i = 0; i < n; i += ps)
            count[page_of(div, slot[i])] += (int32_t)delta;
    PyBuffer_Release(&s);
    PyBuffer_Release(&held);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "slots: a page outside the held counts");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *s_end, *s_children, *s_key, *s_device, *s_last_access, *s_hit_count, *s_data_ptr, *s_numel, *one;

/* torch.Tensor (the type named "Tensor" first seen here) and its data_ptr and numel
 * methods, looked up once: a call of the method itself skips the lookup on each tensor
 * (its type, then its instance dict), a third of a gather's cost per node. */
static PyTypeObject *tensor_type;
static PyObject *tensor_data_ptr, *tensor_numel;

static void learn_tensor_type(PyObject *t)
{
    PyTypeObject *type = Py_TYPE(t);
    if (tensor_type != NULL || strcmp(type->tp_name, "Tensor") != 0)
        return;
    PyObject *ptr = PyObject_GetAttr((PyObject *)type, s_data_ptr);
    PyObject *num = ptr == NULL ? NULL : PyObject_GetAttr((PyObject *)type, s_numel);
    if (num == NULL) {  /* not this type after all: keep asking each tensor */
        Py_XDECREF(ptr);
        PyErr_Clear();
        return;
    }
    Py_INCREF(type);
    tensor_type = type, tensor_data_ptr = ptr, tensor_numel = num;
}

/* The data pointer and element count of a tensor (``data_ptr()``, ``numel()``); -1 on error. */
static int tensor_span(PyObject *t, const char **data, Py_ssize_t *n)
{
    if (tensor_type == NULL)
        learn_tensor_type(t);
    int known = Py_TYPE(t) == tensor_type;
    PyObject *ptr = known ? PyObject_CallOneArg(tensor_data_ptr, t) : PyObject_CallMethodNoArgs(t, s_data_ptr);
    if (ptr == NULL)
        return -1;
    PyObject *num = known ? PyObject_CallOneArg(tensor_numel, t) : PyObject_CallMethodNoArgs(t, s_numel);
    if (num == NULL) {
        Py_DECREF(ptr);
        return -1;
    }
    *data = (const char *)PyLong_AsVoidPtr(ptr);
    *n = PyLong_AsSsize_t(num);
    Py_DECREF(ptr);
    Py_DECREF(num);
    return PyErr_Occurred() ? -1 : 0;
}

/* touch(nodes, clock, hits) -> int
 *
 * Set ``last_access = clock`` on every node of the list ``nodes`` (a walk's path) and, when
 * ``hits`` is true, add one to its ``hit_count``; returns how many of them hold a device
 * copy (``_device is not None``: a prefix of a path, device copies being closed under parent).
 */
static PyObject *touch(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "touch(nodes: list, clock, hits)");
        return NULL;
    }
    PyObject *nodes = args[0], *clock = args[1];
    int hits = PyObject_IsTrue(args[2]);
    if (hits < 0)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(nodes), on_device = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *node = PyList_GET_ITEM(nodes, i); /* borrowed */
        if (PyObject_SetAttr(node, s_last_access, clock) < 0)
            return NULL;
        if (hits) {
            PyObject *h = PyObject_GetAttr(node, s_hit_count);
            if (h == NULL)
                return NULL;
            PyObject *h1 = PyNumber_Add(h, one);
            Py_DECREF(h);
            if (h1 == NULL || PyObject_SetAttr(node, s_hit_count, h1) < 0) {
                Py_XDECREF(h1);
                return NULL;
            }
            Py_DECREF(h1);
        }
        PyObject *dev = PyObject_GetAttr(node, s_device);
        if (dev == NULL)
            return NULL;
        on_device += dev != Py_None;
        Py_DECREF(dev);
    }
    return PyLong_FromSsize_t(on_device);
}

/* gather(nodes, count, out) -> None
 *
 * Copy the device slots (``_device``: the tree's own 1-D int64 contiguous CPU tensors) of
 * the first ``count`` nodes of the list ``nodes``, one after another, into ``out`` (an
 * int64 buffer of exactly their total length; ValueError otherwise, before any copy).
 */
static PyObject *gather(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "gather(nodes: list, count, out)");
        return NULL;
    }
    Py_ssize_t count = PyLong_AsSsize_t(args[1]);
    if (count == -1 && PyErr_Occurred())
        return NULL;
    if (count < 0 || count > PyList_GET_SIZE(args[0])) {
        PyErr_SetString(PyExc_ValueError, "gather: count outside the list");
        return NULL;
    }
    Py_buffer out;
    if (get_buf(args[2], &out, 8, 1, "out") < 0)
        return NULL;
    enum { FEW = 64 };
    const char *src_few[FEW];
    Py_ssize_t len_few[FEW];
    const char **src = src_few;
    Py_ssize_t *len = len_few;
    if (count > FEW) {
        src = PyMem_Malloc(sizeof(*src) * (size_t)count);
        len = PyMem_Malloc(sizeof(*len) * (size_t)count);
        if (src == NULL || len == NULL) {
            PyMem_Free(src);
            PyMem_Free(len);
            PyBuffer_Release(&out);
            return PyErr_NoMemory();
        }
    }
    Py_ssize_t total = 0;
    PyObject *result = NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *t = PyObject_GetAttr(PyList_GET_ITEM(args[0], i), s_device);
        if (t == NULL)
            goto done;
        int bad = tensor_span(t, &src[i], &len[i]);
        Py_DECREF(t);
        if (bad)
            goto done;
        total += len[i];
    }
    if (total * 8 != out.len) {
        PyErr_Format(PyExc_ValueError, "gather: %zd slots into a buffer of %zd", total, out.len / 8);
        goto done;
    }
    char *dst = (char *)out.buf;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (len[i])
            memcpy(dst, src[i], (size_t)len[i] * 8);
        dst += len[i] * 8;
    }
    result = Py_None;
    Py_INCREF(result);
done:
    if (src != src_few) {
        PyMem_Free(src);
        PyMem_Free(len);
    }
    PyBuffer_Release(&out);
    return result;
}


/* The child of a node's ``children`` filed under the page at ``p`` (``pb`` bytes, at least
 * 8), borrowed, or NULL (an error set, or none filed): the child filed under its first
 * token, whose first page the caller compares, or the one of that page. The layout
 * (hicache.radix.node): keyed by the bytes of the page's first token id; where children
 * share a first token, that key holds a dict of them keyed by the bytes of their first page. */
static PyObject *child_at(PyObject *children, const char *p, Py_ssize_t pb)
{
    PyObject *tok = PyBytes_FromStringAndSize(p, 8);
    if (tok == NULL)
        return NULL;
    PyObject *found = PyDict_GetItemWithError(children, tok); /* borrowed */
    Py_DECREF(tok);
    if (found == NULL || !PyDict_CheckExact(found))
        return found;
    PyObject *page = PyBytes_FromStringAndSize(p, pb);
    if (page == NULL)
        return NULL;
    found = PyDict_GetItemWithError(found, page);
    Py_DECREF(page);
    return found;
}

/* How ``child``'s key meets the key ``kb`` (``n`` bytes) at byte ``off``: 2 in full, 1 in
 * its first page (``pb`` bytes) only, 0 not even there, -1 on error; ``*m``: its length. */
static int meet(PyObject *child, const char *kb, Py_ssize_t off, Py_ssize_t n, Py_ssize_t pb, Py_ssize_t *m)
{
    PyObject *ck = PyObject_GetAttr(child, s_key);
    if (ck == NULL)
        return -1;
    if (!PyBytes_Check(ck)) {
        Py_DECREF(ck);
        PyErr_SetString(PyExc_TypeError, "walk: a node's key must be bytes");
        return -1;
    }
    const char *c = PyBytes_AS_STRING(ck);
    Py_ssize_t len = PyBytes_GET_SIZE(ck), first = pb < len ? pb : len;
    int how = len > 0 && off + len <= n && memcmp(kb + off, c, (size_t)len) == 0 ? 2
              : first > 0 && off + first <= n && memcmp(kb + off, c, (size_t)first) == 0;
    Py_DECREF(ck);
    *m = len;
    return how;
}

/* walk(node, key, page_bytes, hint) -> (path, partial)
 *
 * The radix walk of HiRadixCache below ``node``: ``key`` is a whole key from the root
 * (int64 token ids: an int64 array or its bytes, whole pages), a node's ``children`` are
 * filed as `child_at` reads them and its ``key`` holds its tokens' bytes. ``path`` lists
 * the nodes matched in full; ``partial`` is the next node when its key matches only in
 * part (the caller finds how much), else None. ``hint`` (a list or None) is an earlier
 * walk's path from the same ``node`` in the tree as it stands: a hinted node whose key
 * matches in full is taken without a lookup; from the first that does not, the walk
 * looks up (a hint never changes the answer, only its cost).
 */
static PyObject *walk(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || (args[3] != Py_None && !PyList_Check(args[3]))) {
        PyErr_SetString(PyExc_TypeError, "walk(node, key, page_bytes, hint: list | None)");
        return NULL;
    }
    Py_ssize_t pb = PyLong_AsSsize_t(args[2]);
    if (pb == -1 && PyErr_Occurred())
        return NULL;
    if (pb < 8 || pb % 8) {
        PyErr_SetString(PyExc_ValueError, "page_bytes: must be a positive multiple of 8");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[1], &view, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    const char *kb = (const char *)view.buf;
    Py_ssize_t n = view.len, hinted = args[3] == Py_None ? 0 : PyList_GET_SIZE(args[3]);
    PyObject *path = NULL, *children = NULL, *partial = Py_None, *out = NULL;
    Py_INCREF(partial);
    PyObject *end = PyObject_GetAttr(args[0], s_end);
    if (end == NULL)
        goto done;
    Py_ssize_t off = PyLong_AsSsize_t(end);
    Py_DECREF(end);
    if (off == -1 && PyErr_Occurred())
        goto done;
    off *= 8;
    path = PyList_New(0);
    children = PyObject_GetAttr(args[0], s_children);
    if (path == NULL || children == NULL)
        goto done;
    for (Py_ssize_t level = 0; off + 8 <= n; level++) {
        if (!PyDict_Check(children)) {
            PyErr_SetString(PyExc_TypeError, "walk: a node's children must be a dict");
            goto done;
        }
        Py_ssize_t m = 0;
        int how = 0;
        /* the hinted node while the key matches it in full; else the lookup */
        PyObject *child = level < hinted ? PyList_GET_ITEM(args[3], level) : NULL; /* borrowed */
        if (child != NULL && (how = meet(child, kb, off, n, pb, &m)) != 2) {
            if (how < 0)
                goto done;
            child = NULL;
        }
        if (child == NULL) {
            hinted = 0;
            child = child_at(children, kb + off, off + pb <= n ? pb : n - off);
            if (child == NULL && PyErr_Occurred())
                goto done;
            how = child == NULL ? 0 : meet(child, kb, off, n, pb, &m);
            if (how < 0)
                goto done;
            if (how == 0)  /* none filed, or one sharing only the first token */
                break;
            if (how == 1) {  /* its first page matches, not all of it */
                Py_SETREF(partial, Py_NewRef(child));
                break;
            }
        }
        if (PyList_Append(path, child) < 0)
            goto done;
        off += m;
        Py_SETREF(children, PyObject_GetAttr(child, s_children));
        if (children == NULL)
            goto done;
    }
    out = PyTuple_Pack(2, path, partial);
done:
    Py_XDECREF(path);
    Py_XDECREF(children);
    Py_DECREF(partial);
    PyBuffer_Release(&view);
    return out;
}

/* rows(slots, tokens_per_row, out) -> None
 *
 * out[i] = slots[i * tokens_per_row] / tokens_per_row: the rows of whole rows of slots
 * (``slots`` a 1-D int64 contiguous CPU tensor of the controller's own or checked slots;
 * ``out`` an int64 buffer of exactly numel / tokens_per_row items; ValueError otherwise).
 */
static PyObject *rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "rows(slots, tokens_per_row, out)");
        return NULL;
    }
    Py_ssize_t tpr = PyLong_AsSsize_t(args[1]);
    if (tpr == -1 && PyErr_Occurred())
        return NULL;
    if (tpr < 1) {
        PyErr_SetString(PyExc_ValueError, "tokens_per_row: must be >= 1");
        return NULL;
    }
    const char *data;
    Py_ssize_t n;
    if (tensor_span(args[0], &data, &n) < 0)
        return NULL;
    const int64_t *slot = (const int64_t *)data;
    Py_buffer out;
    if (get_buf(args[2], &out, 8, 1, "out") < 0)
        return NULL;
    if (n % tpr || out.len / 8 != n / tpr) {
        PyBuffer_Release(&out);
        PyErr_Format(PyExc_ValueError, "rows: %zd slots are not %zd rows of %zd", n, out.len / 8, tpr);
        return NULL;
    }
    pagediv div = make_pagediv(tpr);
    int64_t *row = (int64_t *)out.buf;
    for (Py_ssize_t i = 0, k = 0; i < n; i += tpr, k++)
        row[k] = page_of(div, slot[i]);
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

/* put(dst, index, values) -> None: dst[index[i]] = values[i] (int64 arrays; every index
 * range-checked first: nothing changes on error). The controller's host stamps at an ack. */
static PyObject *put(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "put(dst, index, values)");
        return NULL;
    }
    Py_buffer d, ix, v;
    if (get_buf(args[0], &d, 8, 1, "dst") < 0)
        return NULL;
    if (get_buf(args[1], &ix, 8, 0, "index") < 0) {
        PyBuffer_Release(&d);
        return NULL;
    }
    if (get_buf(args[2], &v, 8, 0, "values") < 0) {
        PyBuffer_Release(&ix);
        PyBuffer_Release(&d);
        return NULL;
    }
    Py_ssize_t n = ix.len / 8, size = d.len / 8;
    const int64_t *idx = (const int64_t *)ix.buf, *val = (const int64_t *)v.buf;
    int ok = v.len == ix.len;
    for (Py_ssize_t i = 0; ok && i < n; i++)
        ok = idx[i] >= 0 && idx[i] < size;
    if (ok) {
        int64_t *out = (int64_t *)d.buf;
        for (Py_ssize_t i = 0; i < n; i++)
            out[idx[i]] = val[i];
    }
    PyBuffer_Release(&v);
    PyBuffer_Release(&ix);
    PyBuffer_Release(&d);
    if (!ok) {
        PyErr_Format(PyExc_ValueError, "put: %zd indices (each in [0, %zd)) for %zd values", n, size, v.len / 8);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"put", (PyCFunction)(void (*)(void))put, METH_FASTCALL,
     "put(dst, index, values): dst[index[i]] = values[i] (int64, every index range-checked first)."},
    {"rows", (PyCFunction)(void (*)(void))rows, METH_FASTCALL,
     "rows(slots, tokens_per_row, out): out[i] = slots[i * tokens_per_row] // tokens_per_row."},
    {"touch", (PyCFunction)(void (*)(void))touch, METH_FASTCALL,
     "touch(nodes, clock, hits) -> nodes holding a device copy (last_access set, hit_count raised if hits)."},
    {"gather", (PyCFunction)(void (*)(void))gather, METH_FASTCALL,
     "gather(nodes, count, out): the device slots of the first count nodes, one after another, into out."},
    {"walk", (PyCFunction)(void (*)(void))walk, METH_FASTCALL,
     "walk(node, key, page_bytes, hint) -> (fully matched nodes, partly matched node or None)."},
    {"same_bytes", (PyCFunction)(void (*)(void))same_bytes, METH_FASTCALL,
     "same_bytes(a, b) -> bool: equal lengths and bytes of two C-contiguous buffers."},
    {"fresh_pages", (PyCFunction)(void (*)(void))fresh_pages, METH_FASTCALL,
     "fresh_pages(slots, start, free_from, page_size, owned, held, out) -> pages written, or -1."},
    {"hold", (PyCFunction)(void (*)(void))hold, METH_FASTCALL,
     "hold(slots, page_size, held, delta): count the pages of slots as held (+) or given back (-)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastpath",
                                    "Compiled checks of HiRadixCache's hot path.", -1, methods};

PyMODINIT_FUNC PyInit__fastpath(void)
{
    s_end = PyUnicode_InternFromString("end");
    s_children = PyUnicode_InternFromString("children");
    s_key = PyUnicode_InternFromString("key");
    s_device = PyUnicode_InternFromString("_device");
    s_last_access = PyUnicode_InternFromString("last_access");
    s_hit_count = PyUnicode_InternFromString("hit_count");
    s_data_ptr = PyUnicode_InternFromString("data_ptr");
    s_numel = PyUnicode_InternFromString("numel");
    one = PyLong_FromLong(1);
    if (s_end == NULL || s_children == NULL || s_key == NULL || s_device == NULL || s_last_access == NULL
        || s_hit_count == NULL || s_data_ptr == NULL || s_numel == NULL || one == NULL)
        return NULL;
    return PyModule_Create(&module);
}
