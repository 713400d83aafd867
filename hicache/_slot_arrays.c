/* One-pass operations on int64 slot and page arrays (hicache/slot_arrays.py: the numpy form
 * and the contract of each; this is its compiled drop-in, built by setup.py when a C
 * compiler is there).
 *
 * Each function does in one pass over a few buffers what would otherwise be several numpy
 * calls of ~1 us each. They take numpy arrays (buffer protocol) and never allocate Python
 * objects but their return value. Every argument is checked before anything is read or
 * written through it (docs/DESIGN.md, "Compiled modules"): its type, item width,
 * contiguity, writability and size in O(1), with arithmetic that cannot overflow, and every
 * index written through. A bad argument is a TypeError or a ValueError naming it, never
 * undefined behaviour.
 */
#include "host_pools/_args.h"
#include "hicache/_tensor.h"
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

static inline int64_t page_of(pagediv d, int64_t slot) /* slot >= 0 */
{
    return d.shift >= 0 ? slot >> d.shift : slot / d.ps;
}

static inline int aligned(pagediv d, int64_t slot)
{
    return d.shift >= 0 ? (slot & (d.ps - 1)) == 0 : slot % d.ps == 0;
}

/* same_bytes(a, b) -> bool: equal lengths and bytes (two C-contiguous buffers). */
static PyObject *same_bytes(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer a, b;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "same_bytes(a, b)");
        return NULL;
    }
    if (get_buf(args[0], &a, 0, 0, "a") < 0)
        return NULL;
    if (get_buf(args[1], &b, 0, 0, "b") < 0) {
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
 * unless held is None -- held by nobody (held[p] == 0, int32, at least len(owned) of them).
 * Returns the number of pages, or -1 when any rule fails (the caller's slow path then
 * names the broken rule). ``out`` None: the rules checked, no page written. ValueError:
 * page_size < 1, start outside [0, len(slots)], held or out too short.
 */
static PyObject *fresh_pages(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer s, owned, held, out;
    PyObject *result = NULL;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError,
                        "fresh_pages(slots, start, free_from, page_size, owned, held, out)");
        return NULL;
    }
    Py_ssize_t start, free_from, ps;
    if (get_ssize(args[1], "start", &start) < 0 || get_ssize(args[2], "free_from", &free_from) < 0
        || get_ssize(args[3], "page_size", &ps) < 0)
        return NULL;
    if (ps < 1) {
        PyErr_Format(PyExc_ValueError, "page_size: must be >= 1, got %zd", ps);
        return NULL;
    }
    int use_held = args[5] != Py_None, use_out = args[6] != Py_None;
    if (get_buf(args[0], &s, 8, 0, "slots") < 0)
        return NULL;
    if (get_buf(args[4], &owned, 1, 0, "owned") < 0)
        goto fail_s;
    if (use_held && get_buf(args[5], &held, 4, 0, "held") < 0)
        goto fail_owned;
    if (use_out && get_buf(args[6], &out, 8, 1, "out") < 0)
        goto fail_held;
    Py_ssize_t n = s.len / 8, num_pages = owned.len;
    if (start < 0 || start > n || (use_held && held.len / 4 < num_pages)
        || (use_out && out.len / 8 < (n - start) / ps)) {
        PyErr_Format(PyExc_ValueError, "fresh_pages: start %zd outside [0, %zd], or held / out shorter than the "
                     "pages", start, n);
        goto release;
    }
    const int64_t *slot = (const int64_t *)s.buf;
    const char *own = (const char *)owned.buf;
    const int32_t *hold = use_held ? (const int32_t *)held.buf : NULL;
    int64_t *pages = use_out ? (int64_t *)out.buf : NULL;
    Py_ssize_t count = -1;
    if (!use_held)
        free_from = 0;
    if ((n - start) % ps == 0) {
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
            Py_ssize_t j = 1; /* unsigned: first + j cannot overflow */
            while (j < ps && (uint64_t)slot[i + j] == (uint64_t)first + (uint64_t)j)
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
    result = PyLong_FromSsize_t(count);
release:
    if (use_out)
        PyBuffer_Release(&out);
fail_held:
    if (use_held)
        PyBuffer_Release(&held);
fail_owned:
    PyBuffer_Release(&owned);
fail_s:
    PyBuffer_Release(&s);
    return result;
}

/* hold(slots, page_size, held, delta) -> None: held[slots[i] // page_size] += delta for
 * every page start i of slots (int64; held int32). Every page is range-checked first:
 * nothing changes on error. A count wraps at 2**32 (unsigned: never undefined). */
static PyObject *hold(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer s, held;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "hold(slots, page_size, held, delta)");
        return NULL;
    }
    Py_ssize_t ps, delta;
    if (get_ssize(args[1], "page_size", &ps) < 0 || get_ssize(args[3], "delta", &delta) < 0)
        return NULL;
    if (ps < 1 || delta < INT32_MIN || delta > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "page_size, delta: need page_size >= 1 and an int32 delta, got %zd, %zd", ps,
                     delta);
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
        for (Py_ssize_t i = 0; i < n; i += ps) {
            int32_t *c = count + page_of(div, slot[i]);
            *c = (int32_t)((uint32_t)*c + (uint32_t)delta);
        }
    PyBuffer_Release(&s);
    PyBuffer_Release(&held);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "slots: a page outside the held counts");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* rows(slots, tokens_per_row, out) -> None
 *
 * out[i] = slots[i * tokens_per_row] // tokens_per_row: the rows of whole rows of slots
 * (``slots`` an int64 contiguous CPU tensor of the controller's own or checked slots, >= 0:
 * read where it lies, its ``numpy()`` would cost ~6k instructions; ``out`` an int64 array
 * of exactly numel / tokens_per_row items; ValueError otherwise).
 */
static PyObject *rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "rows(slots, tokens_per_row, out)");
        return NULL;
    }
    Py_ssize_t tpr;
    if (get_ssize(args[1], "tokens_per_row", &tpr) < 0)
        return NULL;
    if (tpr < 1) {
        PyErr_Format(PyExc_ValueError, "tokens_per_row: must be >= 1, got %zd", tpr);
        return NULL;
    }
    const char *data;
    Py_ssize_t n;
    Py_buffer out;
    if (tensor_items(args[0], "slots", -1, &data, &n) < 0 || get_buf(args[2], &out, 8, 1, "out") < 0)
        return NULL; /* nothing else runs Python code: the tensor's items stay where they are */
    int ok = n % tpr == 0 && out.len / 8 == n / tpr;
    if (ok) {
        const int64_t *slot = (const int64_t *)data;
        int64_t *row = (int64_t *)out.buf;
        pagediv div = make_pagediv(tpr);
        for (Py_ssize_t i = 0, k = 0; i < n; i += tpr, k++)
            row[k] = page_of(div, slot[i]);
    }
    PyBuffer_Release(&out);
    if (!ok) {
        PyErr_Format(PyExc_ValueError, "rows: %zd slots are not %zd rows of %zd", n, out.len / 8, tpr);
        return NULL;
    }
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
        ok = (uint64_t)idx[i] < (uint64_t)size;
    if (ok) {
        int64_t *out = (int64_t *)d.buf;
        for (Py_ssize_t i = 0; i < n; i++)
            out[idx[i]] = val[i];
    }
    Py_ssize_t nv = v.len / 8;
    PyBuffer_Release(&v);
    PyBuffer_Release(&ix);
    PyBuffer_Release(&d);
    if (!ok) {
        PyErr_Format(PyExc_ValueError, "put: %zd indices (each in [0, %zd)) for %zd values", n, size, nv);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"put", (PyCFunction)(void (*)(void))put, METH_FASTCALL,
     "put(dst, index, values): dst[index[i]] = values[i] (int64, every index range-checked first)."},
    {"rows", (PyCFunction)(void (*)(void))rows, METH_FASTCALL,
     "rows(slots, tokens_per_row, out): out[i] = slots[i * tokens_per_row] // tokens_per_row."},
    {"same_bytes", (PyCFunction)(void (*)(void))same_bytes, METH_FASTCALL,
     "same_bytes(a, b) -> bool: equal lengths and bytes of two C-contiguous buffers."},
    {"fresh_pages", (PyCFunction)(void (*)(void))fresh_pages, METH_FASTCALL,
     "fresh_pages(slots, start, free_from, page_size, owned, held, out) -> pages written, or -1."},
    {"hold", (PyCFunction)(void (*)(void))hold, METH_FASTCALL,
     "hold(slots, page_size, held, delta): count the pages of slots as held (+) or given back (-)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_slot_arrays",
                                    "One-pass operations on int64 slot and page arrays.", -1, methods};

PyMODINIT_FUNC PyInit__slot_arrays(void)
{
    return bind_tensor() < 0 ? NULL : stamped_module(&module);
}
