/* Switches valgrind's callgrind on and off around a phase of a benchmark (client
 * requests: no-ops when the process does not run under valgrind). Built on first use by
 * bench/tree_instructions.py with the system compiler and valgrind's headers. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <valgrind/callgrind.h>

static PyObject *start(PyObject *self, PyObject *unused)
{
    CALLGRIND_START_INSTRUMENTATION;
    Py_RETURN_NONE;
}

static PyObject *toggle(PyObject *self, PyObject *unused)
{
    CALLGRIND_TOGGLE_COLLECT;
    Py_RETURN_NONE;
}

static PyObject *dump(PyObject *self, PyObject *name)
{
    const char *text = PyUnicode_AsUTF8(name);
    if (text == NULL)
        return NULL;
    CALLGRIND_DUMP_STATS_AT(text);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"start", start, METH_NOARGS, "start(): instrument from now on (the run starts uninstrumented)."},
    {"toggle", toggle, METH_NOARGS, "toggle(): collect from here until the next toggle (or stop)."},
    {"dump", dump, METH_O, "dump(name): write what was collected so far to the next dump file."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "callgrind_toggle", NULL, -1, methods};

PyMODINIT_FUNC PyInit_callgrind_toggle(void)
{
    return PyModule_Create(&module);
}
