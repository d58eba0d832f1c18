/* The compiled hot path: the objects made once per activity sent or received.
 *
 * Three functions replace Python loops that run once per activity (see
 * porter_mesh/core/speedups.py, which binds them; the callers keep the pure Python
 * equivalents inline). They do what the Python code does (allocate, fill) and one thing
 * Python cannot: they take each new object off the cyclic garbage collector's list.
 *
 * That is safe because none of these objects can be part of a reference cycle. An
 * activity refers only to JSON values (a dict decoded from JSON, bytes, a msgspec struct
 * without GC, the batch it arrived in), never to another activity or to anything that
 * could point back at it; a delivered message is a tuple (immutable) of strings, numbers,
 * its activity and its envelope (a tuple of strings and numbers). Reference counting
 * frees them. Left tracked, the tens of thousands an application holds between two reads
 * of its inbox are walked by every collection and promoted to the older generations,
 * which then trigger full collections of the whole heap: measured on the node benchmark,
 * that collector work was the largest single share of receiving a broadcast. (CPython
 * untracks a plain tuple of untracked items by itself, at its next collection, but not a
 * NamedTuple such as a message.)
 *
 * A fourth, from_dict(), is Activity.from_dict itself for the common case (the speedups
 * module makes it the class's method while the compiled path is on): the method's steps
 * are a few C calls, and run from Python their glue cost some 160 ns of the ~1.3 us of
 * publishing an activity. Every other case goes, unchanged, to the Python method or
 * rules.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

typedef struct {
    PyTypeObject *cls;
    Py_ssize_t off_d, off_i, off_json, off_s, off_src;
} speedups_state;

static speedups_state state = {NULL, 0, 0, 0, 0, 0};

#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))

static int
slot_offset(PyTypeObject *cls, const char *name, Py_ssize_t *out)
{
    PyObject *descr = PyDict_GetItemString(cls->tp_dict, name); /* borrowed */
    if (descr == NULL || !PyObject_TypeCheck(descr, &PyMemberDescr_Type)) {
        PyErr_Format(PyExc_TypeError, "%s has no slot %s", cls->tp_name, name);
        return -1;
    }
    PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
    if (member->type != T_OBJECT_EX || (member->flags & READONLY)) {
        PyErr_Format(PyExc_TypeError, "%s.%s is not a writable object slot",
                     cls->tp_name, name);
        return -1;
    }
    *out = member->offset;
    return 0;
}

static PyObject *
bind(PyObject *Py_UNUSED(module), PyObject *arg)
{
    if (!PyType_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "bind() takes the Activity class");
        return NULL;
    }
    PyTypeObject *cls = (PyTypeObject *)arg;
    speedups_state next = {cls, 0, 0, 0, 0, 0};
    if (slot_offset(cls, "_d", &next.off_d) < 0 || slot_offset(cls, "_i", &next.off_i) < 0 ||
        slot_offset(cls, "_json", &next.off_json) < 0 ||
        slot_offset(cls, "_s", &next.off_s) < 0 || slot_offset(cls, "_src", &next.off_src) < 0)
        return NULL;
    Py_INCREF(cls);
    Py_XDECREF(state.cls);
    state = next;
    Py_RETURN_NONE;
}

/* A new, untracked instance with every slot empty (NULL). */
static PyObject *
new_activity(void)
{
    PyTypeObject *cls = state.cls;
    PyObject *obj = cls->tp_alloc(cls, 0);
    if (obj != NULL && PyObject_IS_GC(obj))
        PyObject_GC_UnTrack(obj);
    return obj;
}

static int
bound(void)
{
    if (state.cls == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "bind() the Activity class first");
        return 0;
    }
    return 1;
}

/* wrap_shapes(shapes, src): one activity per checked shape of a batch, as
 * codec._shaped_many's Python loop makes them: _d and _json None, _s the shape, _src
 * the batch, _i the index. */
static PyObject *
wrap_shapes(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "wrap_shapes(shapes, src) takes two arguments");
        return NULL;
    }
    if (!bound())
        return NULL;
    PyObject *shapes = args[0], *src = args[1];
    if (!PyList_CheckExact(shapes)) {
        PyErr_SetString(PyExc_TypeError, "wrap_shapes() takes a list of shapes");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(shapes);
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *index = PyLong_FromSsize_t(i);
        PyObject *obj = index == NULL ? NULL : new_activity();
        if (obj == NULL) {
            Py_XDECREF(index);
            Py_DECREF(out);
            return NULL;
        }
        PyObject *shape = PyList_GET_ITEM(shapes, i);
        SLOT(obj, state.off_d) = Py_NewRef(Py_None);
        SLOT(obj, state.off_json) = Py_NewRef(Py_None);
        SLOT(obj, state.off_s) = Py_NewRef(shape);
        SLOT(obj, state.off_src) = Py_NewRef(src);
        SLOT(obj, state.off_i) = index;
        PyList_SET_ITEM(out, i, obj);
    }
    return out;
}

/* The activity of checked JSON: _s the shape, _json the bytes, _d and _src None (_i is
 * left unset, as Activity.from_dict leaves it). Borrows both. */
static PyObject *
checked_activity(PyObject *shape, PyObject *raw)
{
    PyObject *obj = new_activity();
    if (obj == NULL)
        return NULL;
    SLOT(obj, state.off_d) = Py_NewRef(Py_None);
    SLOT(obj, state.off_src) = Py_NewRef(Py_None);
    SLOT(obj, state.off_s) = Py_NewRef(shape);
    SLOT(obj, state.off_json) = Py_NewRef(raw);
    return obj;
}

/* with_shape(shape, raw): the activity Activity.from_dict makes of checked JSON. */
static PyObject *
with_shape(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "with_shape(shape, raw) takes two arguments");
        return NULL;
    }
    if (!bound())
        return NULL;
    return checked_activity(args[0], args[1]);
}

/* What from_dict() needs besides the class: given once by bind_from_dict(). */
typedef struct {
    PyObject *python;     /* the Python from_dict(cls, data): every case but the common one */
    PyObject *dumps;      /* orjson.dumps */
    PyObject *fallback;   /* its default= (the model's own values inside Python input) */
    PyObject *decode;     /* the C schema's decoder of one activity */
    PyObject *refused;    /* the exceptions by which the schema refuses (a tuple) */
    PyObject *unset;      /* msgspec.UNSET: no context given */
    PyObject *good;       /* the set of contexts already found valid */
    PyObject *context_ok; /* context_ok(value) -> bool: the Python check of a new one */
    PyObject *by_rules;   /* by_rules(raw) -> activity: the Python rules' activity */
    PyObject *context;    /* "context", interned */
    Py_ssize_t max_bytes; /* the largest activity */
} from_dict_state;

static from_dict_state checks = {NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                                 NULL, 0};

/* bind_from_dict(python, dumps, default, decode, refused, unset, good, context_ok,
 * by_rules, max_bytes) */
static PyObject *
bind_from_dict(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "bind_from_dict() takes ten arguments");
        return NULL;
    }
    if (!PyTuple_Check(args[4]) || !PyAnySet_Check(args[6])) {
        PyErr_SetString(PyExc_TypeError,
                        "bind_from_dict(): refused must be a tuple, good a set");
        return NULL;
    }
    Py_ssize_t max_bytes = PyLong_AsSsize_t(args[9]);
    if (max_bytes == -1 && PyErr_Occurred())
        return NULL;
    PyObject *context = PyUnicode_InternFromString("context");
    if (context == NULL)
        return NULL;
    PyObject **fields[] = {&checks.python, &checks.dumps, &checks.fallback, &checks.decode,
                           &checks.refused, &checks.unset, &checks.good,
                           &checks.context_ok, &checks.by_rules};
    for (Py_ssize_t i = 0; i < 9; i++)
        Py_XSETREF(*fields[i], Py_NewRef(args[i]));
    Py_XSETREF(checks.context, context);
    checks.max_bytes = max_bytes;
    Py_RETURN_NONE;
}

/* Whether a shape's context lets it through (1), sends it to the rules (0), or an
 * error was raised (-1): absent, already found valid, or valid by the Python check. */
static int
context_passes(PyObject *shape)
{
    PyObject *context = PyObject_GetAttr(shape, checks.context);
    if (context == NULL)
        return -1;
    int good = context == checks.unset ? 1 : PySet_Contains(checks.good, context);
    if (good == 0) {
        PyObject *ok = PyObject_Vectorcall(checks.context_ok, &context, 1, NULL);
        good = ok == NULL ? -1 : PyObject_IsTrue(ok);
        Py_XDECREF(ok);
    }
    Py_DECREF(context);
    return good;
}

/* from_dict(cls, data): Activity.from_dict in one C call for the common case (a plain
 * dict that JSON holds, within the size limit, of a shape the C schema takes), the same
 * steps as the Python method's; anything else is handed, unchanged, to the Python
 * method (which raises the full explanation) or to the Python rules. */
static PyObject *
from_dict(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "from_dict(cls, data) takes two arguments");
        return NULL;
    }
    if (!bound())
        return NULL;
    if (checks.python == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "bind_from_dict() first");
        return NULL;
    }
    if (args[0] != (PyObject *)state.cls || !PyDict_CheckExact(args[1]))
        return PyObject_Vectorcall(checks.python, args, 2, NULL);
    PyObject *call[2] = {args[1], checks.fallback};
    PyObject *raw = PyObject_Vectorcall(checks.dumps, call, 2, NULL);
    if (raw == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_TypeError))
            return NULL;
        PyErr_Clear();
        return PyObject_Vectorcall(checks.python, args, 2, NULL);
    }
    if (!PyBytes_CheckExact(raw) || PyBytes_GET_SIZE(raw) > checks.max_bytes) {
        Py_DECREF(raw);
        return PyObject_Vectorcall(checks.python, args, 2, NULL);
    }
    PyObject *shape = PyObject_Vectorcall(checks.decode, &raw, 1, NULL);
    int passes;
    if (shape == NULL) {
        if (!PyErr_ExceptionMatches(checks.refused)) {
            Py_DECREF(raw);
            return NULL;
        }
        PyErr_Clear();
        passes = 0;
    }
    else {
        passes = context_passes(shape);
    }
    if (passes <= 0) {
        Py_XDECREF(shape);
        PyObject *made = passes < 0 ? NULL
                                    : PyObject_Vectorcall(checks.by_rules, &raw, 1, NULL);
        Py_DECREF(raw);
        return made;
    }
    PyObject *obj = checked_activity(shape, raw);
    Py_DECREF(shape);
    Py_DECREF(raw);
    return obj;
}

/* One message tuple of messages() (below): its items, the activity number i of the
 * list, its sequence number and journal position given (borrowed). */
static PyObject *
new_message(PyTypeObject *type, PyObject *const *args, PyObject *activities, Py_ssize_t i,
            PyObject *number, PyObject *position)
{
#if PY_VERSION_HEX >= 0x030E0000
    /* From 3.14 a tuple caches its hash in a field that the tuple constructor sets, so
     * the instance is made by it, from a plain tuple of the items. */
    PyObject *items = PyTuple_Pack(8, args[1], args[2], PyList_GET_ITEM(activities, i),
                                   args[4], number, args[6], position, args[8]);
    if (items == NULL)
        return NULL;
    PyObject *call = PyTuple_Pack(1, items);
    Py_DECREF(items);
    if (call == NULL)
        return NULL;
    PyObject *msg = PyTuple_Type.tp_new(type, call, NULL);
    Py_DECREF(call);
    return msg;
#else
    PyObject *msg = type->tp_alloc(type, 8);
    if (msg == NULL)
        return NULL;
    PyTuple_SET_ITEM(msg, 0, Py_NewRef(args[1]));
    PyTuple_SET_ITEM(msg, 1, Py_NewRef(args[2]));
    PyTuple_SET_ITEM(msg, 2, Py_NewRef(PyList_GET_ITEM(activities, i)));
    PyTuple_SET_ITEM(msg, 3, Py_NewRef(args[4]));
    PyTuple_SET_ITEM(msg, 4, Py_NewRef(number));
    PyTuple_SET_ITEM(msg, 5, Py_NewRef(args[6]));
    PyTuple_SET_ITEM(msg, 6, Py_NewRef(position));
    PyTuple_SET_ITEM(msg, 7, Py_NewRef(args[8]));
    return msg;
#endif
}

/* messages(cls, channel, sender, activities, env, seq, direct, offset, redelivered):
 * one cls tuple per activity, as Inbox.deliver's comprehension makes them:
 * (channel, sender, activity, env, seq + i, direct, offset + i or -1, redelivered). */
static PyObject *
messages(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "messages() takes nine arguments");
        return NULL;
    }
    PyObject *cls = args[0], *activities = args[3];
    if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "messages() makes instances of a tuple class");
        return NULL;
    }
    if (!PyList_CheckExact(activities)) {
        PyErr_SetString(PyExc_TypeError, "messages() takes a list of activities");
        return NULL;
    }
    Py_ssize_t seq = PyLong_AsSsize_t(args[5]);
    Py_ssize_t offset = PyLong_AsSsize_t(args[7]);
    if ((seq == -1 || offset == -1) && PyErr_Occurred())
        return NULL;
    PyTypeObject *type = (PyTypeObject *)cls;
    Py_ssize_t n = PyList_GET_SIZE(activities);
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *number = PyLong_FromSsize_t(seq + i);
        PyObject *position = number == NULL ? NULL
                             : PyLong_FromSsize_t(offset < 0 ? -1 : offset + i);
        PyObject *msg = position == NULL ? NULL : new_message(type, args, activities, i,
                                                               number, position);
        Py_XDECREF(number);
        Py_XDECREF(position);
        if (msg == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyObject_GC_UnTrack(msg);
        PyList_SET_ITEM(out, i, msg);
    }
    return out;
}

static PyMethodDef methods[] = {
    {"messages", (PyCFunction)(void (*)(void))messages, METH_FASTCALL,
     "messages(cls, channel, sender, activities, env, seq, direct, offset, redelivered)"
     " -> list: one delivered-message tuple per activity."},
    {"bind", bind, METH_O, "bind(cls): the class whose instances the functions make."},
    {"wrap_shapes", (PyCFunction)(void (*)(void))wrap_shapes, METH_FASTCALL,
     "wrap_shapes(shapes, src) -> list: one activity per shape of a batch."},
    {"with_shape", (PyCFunction)(void (*)(void))with_shape, METH_FASTCALL,
     "with_shape(shape, raw) -> activity: an activity of checked JSON bytes."},
    {"bind_from_dict", (PyCFunction)(void (*)(void))bind_from_dict, METH_FASTCALL,
     "bind_from_dict(python, dumps, default, decode, refused, unset, good, context_ok,"
     " by_rules, max_bytes): what from_dict() uses."},
    {"from_dict", (PyCFunction)(void (*)(void))from_dict, METH_FASTCALL,
     "from_dict(cls, data) -> activity: Activity.from_dict, the common case in C."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_speedups",
    "The compiled hot path of porter_mesh (optional; see porter_mesh/core/speedups.py).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    return PyModule_Create(&module_def);
}
