/* Compiled core of PageAllocator's free stack (optional: host_pools.allocator keeps its
 * numpy code for when this module is not built; both give the same pages).
 *
 * An allocation or a free is a handful of numpy calls of about a microsecond each (a
 * slice, a reversal, a run check, two scatters and a gather); here it is one pass over
 * the few pages it touches. The functions take numpy arrays (buffer protocol), allocate
 * nothing and check every argument before they read or write through it: the types, the
 * item widths, contiguity, writability and sizes in O(1), with arithmetic that cannot
 * overflow, and every index they write through. A bad argument is a TypeError or a
 * ValueError naming it, never undefined behaviour (docs/DESIGN.md, "Compiled modules").
 * The caller holds the allocator's lock.
 */
#include "_args.h"
#include <stdint.h>
#include <stdlib.h>


static int cmp_int64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* take(stack, top, owned, generation, out[, page_size]) -> None
 *
 * The n pages on top of ``stack`` (``top`` entries live; the top one first), ascending,
 * into out[0:n]; each marked allocated in ``owned`` (bool) and its allocation generation
 * raised by one in ``generation`` (int64, one per page of ``owned``), the new values into
 * out[n:2n]. ``out`` is int64: 2n items, or with ``page_size`` n * (2 + page_size), the
 * pages' token slots following, page after page (page p: p * page_size ... p * page_size
 * + page_size - 1). n <= top <= len(stack); the caller lowers its top by n. Every page
 * taken is checked to lie in [0, len(owned)) before anything is written.
 */
static PyObject *take(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 && nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "take(stack, top, owned, generation, out[, page_size])");
        return NULL;
    }
    Py_ssize_t top, page_size = 0;
    if (get_ssize(args[1], "top", &top) < 0 || (nargs == 6 && get_ssize(args[5], "page_size", &page_size) < 0))
        return NULL;
    /* 8 * (2 + page_size) bytes per page, and a slot p * page_size + j, must fit: checked here */
    if (nargs == 6 && (page_size < 1 || page_size > PY_SSIZE_T_MAX / 8 - 2)) {
        PyErr_Format(PyExc_ValueError, "page_size: must be in [1, %zd], got %zd", PY_SSIZE_T_MAX / 8 - 2, page_size);
        return NULL;
    }
    Py_buffer stack, owned, gen, out;
    if (get_buf(args[0], &stack, 8, 0, "stack") < 0)
        return NULL;
    if (get_buf(args[2], &owned, 1, 1, "owned") < 0)
        goto fail_stack;
    if (get_buf(args[3], &gen, 8, 1, "generation") < 0)
        goto fail_owned;
    if (get_buf(args[4], &out, 8, 1, "out") < 0)
        goto fail_gen;
    Py_ssize_t per_page = 8 * (2 + page_size);
    Py_ssize_t n = out.len / per_page, num_pages = owned.len;
    if (out.len % per_page || top < n || top > stack.len / 8 || gen.len / 8 != num_pages) {
        PyErr_Format(PyExc_ValueError, "take: out of %zd items is not %zd pages of %zd items from a stack of %zd "
                     "(top %zd) over %zd pages", out.len / 8, n, per_page / 8, stack.len / 8, top, num_pages);
        goto fail;
    }
    if (page_size && num_pages > INT64_MAX / page_size) {
        PyErr_Format(PyExc_ValueError, "page_size: %zd pages of %zd slots overflow an int64 slot", num_pages,
                     page_size);
        goto fail;
    }
    const int64_t *st = (const int64_t *)stack.buf;
    int64_t *pages = (int64_t *)out.buf, *gens = pages + n, *g = (int64_t *)gen.buf;
    char *own = (char *)owned.buf;
    int sorted = 1;
    int64_t prev = -1; /* pages are >= 0: the first one is above it */
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t p = st[top - 1 - i];
        if ((uint64_t)p >= (uint64_t)num_pages) { /* negative ones wrap around: one compare */
            PyErr_Format(PyExc_ValueError, "stack: page %lld is outside [0, %zd)", (long long)p, num_pages);
            goto fail;
        }
        pages[i] = p;
        sorted &= prev < p;
        prev = p;
    }
    if (!sorted)
        qsort(pages, (size_t)n, sizeof(int64_t), cmp_int64);
    for (Py_ssize_t i = 0; i < n; i++) {
        own[pages[i]] = 1;
        /* unsigned: a generation at INT64_MAX (only ever a caller's array) wraps, never overflows */
        gens[i] = g[pages[i]] = (int64_t)((uint64_t)g[pages[i]] + 1);
    }
    int64_t *slot = pages + 2 * n;
    for (Py_ssize_t i = 0; page_size && i < n; i++) {
        int64_t first = pages[i] * page_size; /* < num_pages * page_size: no overflow (checked) */
        for (Py_ssize_t j = 0; j < page_size; j++)
            *slot++ = first + j;
    }
    PyBuffer_Release(&out);
    PyBuffer_Release(&gen);
    PyBuffer_Release(&owned);
    PyBuffer_Release(&stack);
    Py_RETURN_NONE;
fail:
    PyBuffer_Release(&out);
fail_gen:
    PyBuffer_Release(&gen);
fail_owned:
    PyBuffer_Release(&owned);
fail_stack:
    PyBuffer_Release(&stack);
    return NULL;
}

/* give(stack, top, owned, pages) -> new top, or -1 (nothing changed)
 *
 * Free ``pages`` (int64, distinct): -1 when one of them is not allocated in ``owned`` (the
 * caller names it); else each is marked free and pushed onto ``stack`` above ``top`` (in
 * [0, len(stack)]), the last page first (so the next take hands them out in their order).
 */
static PyObject *give(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "give(stack, top, owned, pages)");
        return NULL;
    }
    Py_ssize_t top;
    if (get_ssize(args[1], "top", &top) < 0)
        return NULL;
    Py_buffer stack, owned, pg;
    if (get_buf(args[0], &stack, 8, 1, "stack") < 0)
        return NULL;
    if (get_buf(args[2], &owned, 1, 1, "owned") < 0) {
        PyBuffer_Release(&stack);
        return NULL;
    }
    if (get_buf(args[3], &pg, 8, 0, "pages") < 0) {
        PyBuffer_Release(&owned);
        PyBuffer_Release(&stack);
        return NULL;
    }
    Py_ssize_t n = pg.len / 8, num_pages = owned.len, room = stack.len / 8;
    const int64_t *pages = (const int64_t *)pg.buf;
    int64_t *st = (int64_t *)stack.buf;
    char *own = (char *)owned.buf;
    Py_ssize_t result = 0;
    if (top < 0 || top > room) {  /* before the sum below: top + n cannot overflow then */
        PyErr_Format(PyExc_ValueError, "top: must be in [0, %zd] (the stack's length), got %zd", room, top);
        result = -2;
    }
    for (Py_ssize_t i = 0; result >= 0 && i < n; i++) {
        if ((uint64_t)pages[i] >= (uint64_t)num_pages) {
            PyErr_Format(PyExc_ValueError, "pages: page %lld is outside [0, %zd)", (long long)pages[i], num_pages);
            result = -2;
        } else if (!own[pages[i]]) {
            result = -1;
        }
    }
    /* distinct allocated pages are not on the stack: they fit above its top */
    if (result == 0 && n > room - top) {
        PyErr_Format(PyExc_ValueError, "pages: %zd pages above top %zd of a stack of %zd", n, top, room);
        result = -2;
    }
    if (result == 0) {
        for (Py_ssize_t i = 0; i < n; i++) {
            own[pages[i]] = 0;
            st[top + i] = pages[n - 1 - i];
        }
        result = top + n;
    }
    PyBuffer_Release(&pg);
    PyBuffer_Release(&owned);
    PyBuffer_Release(&stack);
    if (result == -2)
        return NULL;
    return PyLong_FromSsize_t(result);
}

static PyMethodDef methods[] = {
    {"take", (PyCFunction)(void (*)(void))take, METH_FASTCALL,
     "take(stack, top, owned, generation, out[, page_size]): the top pages, ascending, their new "
     "generations and, asked, their slots."},
    {"give", (PyCFunction)(void (*)(void))give, METH_FASTCALL,
     "give(stack, top, owned, pages) -> new top, or -1 when a page is not allocated (nothing changed)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_pages",
                                    "Compiled core of PageAllocator's free stack.", -1, methods};

PyMODINIT_FUNC PyInit__pages(void)
{
    return stamped_module(&module);
}
