/*
 * phub._fastpath, continued: the round contract, the one table through which the C loops reach
 * the Python objects they read and write (phub/network/fastpath_contract.py documents every field).
 *
 * `contract_fields` names each field a loop uses: the record it belongs to, its name, and how it
 * is reached (a __slots__ member read in place, a position in a tuple, a column of a table, ...).
 * `register_contract(layouts)` is called once, by phub/network/fastpath_contract.py at import: it looks
 * every field up by name in the layouts Python declares (a class, or a record's field names in
 * order) and fills `contract` with the offsets and positions; the loops then read
 * `contract.fast_table.lane` and the like, never a number of their own. A field that is missing
 * (renamed, removed) or not usable is a ContractError naming it, and the previous registration
 * stands. A loop called before any registration makes it first (ensure_contract).
 * Included by _fastpath.c before the loops: one translation unit, several files.
 */
#ifndef PHUB_FASTPATH_CONTRACT_H
#define PHUB_FASTPATH_CONTRACT_H

#include <stddef.h>

/* The ChunkState attributes the loops use, read where ChunkState's __slots__ keep them. */
enum {
    ST_CHUNK, ST_ROUNDS, ST_ARRIVED, ST_MASK, ST_SLOTS, ST_ACC, ST_MOM, ST_WEIGHT, ST_WEIGHT_VIEW, ST_RESULT_VIEW,
    STATE_FIELDS
};

/* Positions in a record (a tuple, a list, a table's row), and how many fields it has. */
typedef struct { Py_ssize_t kind, needs_momentum, learning_rate, momentum, wd, rescale_grad, clip_gradient, width; }
    params_layout;
typedef struct { Py_ssize_t destination, awaited, width; } entry_layout;
typedef struct { Py_ssize_t iteration, handle, width; } awaited_layout;
typedef struct { Py_ssize_t lane, nbytes, ready, width; } fast_table_layout;
typedef struct { Py_ssize_t lane, nbytes, width; } chunk_table_layout;
typedef struct { Py_ssize_t owner, arrived, interface, width; } rack_table_layout;
typedef struct { Py_ssize_t state, acc, last, width; } local_round_layout;
typedef struct { Py_ssize_t state, total, width; } rack_total_layout;

typedef struct {
    int ready;                  /* 1 once a registration succeeded */
    PyTypeObject *chunk_state;  /* aggregation.ChunkState: its instances' slots are read in place */
    Py_ssize_t state[STATE_FIELDS]; /* the slots' offsets in a ChunkState */
    Py_ssize_t chunk_id, handle_arrived; /* looked up by name when used: Chunk.id's position, unused */
    params_layout params;
    entry_layout entry;
    awaited_layout awaited;
    fast_table_layout fast_table;
    chunk_table_layout chunk_table;
    rack_table_layout rack_table;
    local_round_layout local_round;
    rack_total_layout rack_total;
} round_contract;

static round_contract contract;

/* How a field is reached. */
enum {
    FIELD_SLOT,   /* a writable object slot of the record's class, read and written in place */
    FIELD_ATTR,   /* an attribute of an object, by name (the layout lists the class's fields) */
    FIELD_METHOD, /* a method the loops call, by name, on instances of the record's class */
    FIELD_INDEX,  /* a position in a record Python builds (tuple, list or table row) */
    FIELD_OUTPUT, /* a position in a record the loops build: Python's layout must be the same */
};

typedef struct {
    const char *record, *field, *type;
    int how;
    Py_ssize_t at;    /* offsetof(round_contract, ...) of the value this field fills */
    Py_ssize_t width; /* offsetof the record's field count, or -1 */
} contract_field;

#define SLOT(name, st, type) {"ChunkState", name, type, FIELD_SLOT, offsetof(round_contract, state[st]), -1}
#define AT(record, member) offsetof(round_contract, record.member), offsetof(round_contract, record.width)
static const contract_field contract_fields[] = {
    SLOT("chunk", ST_CHUNK, "chunking.Chunk"),
    SLOT("rounds", ST_ROUNDS, "int, read and written"),
    SLOT("arrived", ST_ARRIVED, "int, read and written"),
    SLOT("mask", ST_MASK, "int, read and written"),
    SLOT("slots", ST_SLOTS, "list of float32 arrays, one per rank"),
    SLOT("acc", ST_ACC, "float32 array"),
    SLOT("mom", ST_MOM, "float32 array or None"),
    SLOT("weight", ST_WEIGHT, "float32 array"),
    SLOT("weight_view", ST_WEIGHT_VIEW, "memoryview"),
    SLOT("result_view", ST_RESULT_VIEW, "memoryview"),
    {"Chunk", "id", "int", FIELD_ATTR, offsetof(round_contract, chunk_id), -1},
    {"Handle", "_arrived", "method(count)", FIELD_METHOD, offsetof(round_contract, handle_arrived), -1},
    {"loop params", "kind", "int", FIELD_INDEX, AT(params, kind)},
    {"loop params", "needs_momentum", "bool", FIELD_INDEX, AT(params, needs_momentum)},
    {"loop params", "learning_rate", "float", FIELD_INDEX, AT(params, learning_rate)},
    {"loop params", "momentum", "float", FIELD_INDEX, AT(params, momentum)},
    {"loop params", "wd", "float", FIELD_INDEX, AT(params, wd)},
    {"loop params", "rescale_grad", "float", FIELD_INDEX, AT(params, rescale_grad)},
    {"loop params", "clip_gradient", "float", FIELD_INDEX, AT(params, clip_gradient)},
    {"expect entry", "destination", "writable bytes", FIELD_INDEX, AT(entry, destination)},
    {"expect entry", "awaited", "list", FIELD_INDEX, AT(entry, awaited)},
    {"awaited", "iteration", "int", FIELD_INDEX, AT(awaited, iteration)},
    {"awaited", "handle", "Handle", FIELD_INDEX, AT(awaited, handle)},
    {"fast_table", "lane", "int32", FIELD_INDEX, AT(fast_table, lane)},
    {"fast_table", "nbytes", "int32", FIELD_INDEX, AT(fast_table, nbytes)},
    {"fast_table", "ready", "int32 (0/1)", FIELD_INDEX, AT(fast_table, ready)},
    {"chunk_table", "lane", "int32", FIELD_INDEX, AT(chunk_table, lane)},
    {"chunk_table", "nbytes", "int32", FIELD_INDEX, AT(chunk_table, nbytes)},
    {"rack_table", "owner", "int64, -1: not here", FIELD_INDEX, AT(rack_table, owner)},
    {"rack_table", "arrived", "int64 bits, read and written", FIELD_INDEX, AT(rack_table, arrived)},
    {"rack_table", "interface", "int64", FIELD_INDEX, AT(rack_table, interface)},
    {"local round", "state", "ChunkState", FIELD_OUTPUT, AT(local_round, state)},
    {"local round", "acc", "float32 buffer", FIELD_OUTPUT, AT(local_round, acc)},
    {"local round", "last", "float32 buffer or None", FIELD_OUTPUT, AT(local_round, last)},
    {"rack total", "state", "ChunkState", FIELD_OUTPUT, AT(rack_total, state)},
    {"rack total", "total", "float32 row", FIELD_OUTPUT, AT(rack_total, total)},
};
#undef SLOT
#undef AT
#define CONTRACT_FIELDS ((Py_ssize_t)(sizeof contract_fields / sizeof contract_fields[0]))

static PyObject *ContractError;
static PyObject *field_names[CONTRACT_FIELDS]; /* contract_fields[i].field, interned at import */

/* Where contract_fields lists the fields the loops name (contract_init checks it): the slots
 * first, in enum order, then Chunk.id and Handle._arrived. */
#define FIELD_CHUNK_ID STATE_FIELDS
#define FIELD_HANDLE_ARRIVED (STATE_FIELDS + 1)

static inline Py_ssize_t *
contract_value(round_contract *c, Py_ssize_t at)
{
    return (Py_ssize_t *)((char *)c + at);
}

/* Whether `descr` is a writable object slot; its offset in *offset. */
static int
writable_slot(PyObject *descr, Py_ssize_t *offset)
{
    if (!Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        return 0;
    }
    PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
    *offset = member->offset;
    return member->type == T_OBJECT_EX && !(member->flags & READONLY);
}

/* Fill one SLOT or METHOD field from the class `cls`; 0, or -1 with ContractError set. */
static int
register_class_field(round_contract *c, const contract_field *f, PyObject *name, PyObject *cls)
{
    if (!PyType_Check(cls)) {
        PyErr_Format(ContractError, "the layout of %s must be its class, not %.100s", f->record, Py_TYPE(cls)->tp_name);
        return -1;
    }
    const char *cls_name = ((PyTypeObject *)cls)->tp_name;
    PyObject *descr = PyObject_GetAttr(cls, name);
    if (descr == NULL) {
        PyErr_Clear();
        PyErr_Format(ContractError, "phub._fastpath reads %s.%s (%s), which %.100s lacks: renamed or removed?",
                     f->record, f->field, f->type, cls_name);
        return -1;
    }
    int usable = 1;
    if (f->how == FIELD_SLOT) {
        usable = writable_slot(descr, contract_value(c, f->at));
        c->chunk_state = (PyTypeObject *)cls;
    } else {
        usable = PyCallable_Check(descr);
    }
    Py_DECREF(descr);
    if (!usable) {
        PyErr_Format(ContractError, "phub._fastpath reads %s.%s, but %.100s.%s is not %s", f->record, f->field,
                     cls_name, f->field, f->how == FIELD_SLOT ? "a writable __slots__ attribute" : "a method");
        return -1;
    }
    return 0;
}

/* Fill one INDEX, OUTPUT or ATTR field from `names`, the record's field names in order. */
static int
register_named_field(round_contract *c, const contract_field *f, PyObject *name, PyObject *names, Py_ssize_t order)
{
    if (!PyTuple_Check(names)) {
        PyErr_Format(ContractError, "the layout of %s must be a tuple of field names, not %.100s", f->record,
                     Py_TYPE(names)->tp_name);
        return -1;
    }
    Py_ssize_t index = -1, width = PyTuple_GET_SIZE(names);
    for (Py_ssize_t i = 0; i < width && index < 0; i++) {
        PyObject *given = PyTuple_GET_ITEM(names, i);
        int same = PyUnicode_Check(given) ? PyUnicode_Compare(given, name) : 1;
        if (same == -1 && PyErr_Occurred()) {
            return -1;
        }
        index = same == 0 ? i : -1;
    }
    if (index < 0) {
        PyErr_Format(ContractError, "phub._fastpath uses field '%s' (%s) of the %s, which its layout %R lacks: "
                     "renamed or removed?", f->field, f->type, f->record, names);
        return -1;
    }
    if (f->how == FIELD_OUTPUT && index != order) {
        PyErr_Format(ContractError, "phub._fastpath builds the %s with '%s' at position %zd, but its layout %R puts it "
                     "at %zd", f->record, f->field, order, names, index);
        return -1;
    }
    *contract_value(c, f->at) = index;
    if (f->width >= 0) {
        *contract_value(c, f->width) = width;
    }
    return 0;
}

/* Fill contract_fields[i] from `layouts`; `order`: its position among its record's fields. */
static int
register_field(round_contract *c, Py_ssize_t i, Py_ssize_t order, PyObject *layouts)
{
    const contract_field *f = &contract_fields[i];
    PyObject *layout = PyDict_GetItemString(layouts, f->record); /* borrowed */
    if (layout == NULL) {
        PyErr_Format(ContractError, "no layout for the %s, whose field '%s' phub._fastpath reads", f->record, f->field);
        return -1;
    }
    if (f->how == FIELD_SLOT || f->how == FIELD_METHOD) {
        return register_class_field(c, f, field_names[i], layout);
    }
    return register_named_field(c, f, field_names[i], layout, order);
}

PyDoc_STRVAR(register_contract_doc,
"register_contract(layouts)\n--\n\n"
"Look up by name every field the loops read or write (contract_fields()) in `layouts`, a dict:\n"
"record -> its class (ChunkState, Handle) or its field names in order (a tuple), and from now on\n"
"reach them there. ContractError, naming the field, when one is missing or unusable; the previous\n"
"registration then stands. phub/network/fastpath_contract.py calls it once, at import.");

static PyObject *
fp_register_contract(PyObject *self, PyObject *layouts)
{
    if (!PyDict_Check(layouts)) {
        return PyErr_Format(PyExc_TypeError, "register_contract takes a dict, not %.100s", Py_TYPE(layouts)->tp_name);
    }
    round_contract fresh = {0};
    Py_ssize_t order = 0;
    for (Py_ssize_t i = 0; i < CONTRACT_FIELDS; i++) {
        order = i > 0 && strcmp(contract_fields[i].record, contract_fields[i - 1].record) == 0 ? order + 1 : 0;
        if (register_field(&fresh, i, order, layouts) < 0) {
            return NULL;
        }
    }
    Py_INCREF(fresh.chunk_state);
    Py_XDECREF(contract.chunk_state);
    fresh.ready = 1;
    contract = fresh;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(contract_fields_doc,
"contract_fields()\n--\n\n"
"The fields the loops read or write, as (record, field, type, how) tuples; `how` is 'slot',\n"
"'attribute', 'method', 'index' or 'output'.");

static PyObject *
fp_contract_fields(PyObject *self, PyObject *unused)
{
    static const char *const hows[] = {"slot", "attribute", "method", "index", "output"};
    PyObject *list = PyList_New(CONTRACT_FIELDS);
    for (Py_ssize_t i = 0; list != NULL && i < CONTRACT_FIELDS; i++) {
        const contract_field *f = &contract_fields[i];
        PyObject *item = Py_BuildValue("ssss", f->record, f->field, f->type, hows[f->how]);
        if (item == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, i, item);
    }
    return list;
}

PyDoc_STRVAR(registered_contract_doc,
"registered_contract()\n--\n\n"
"What the registration found: {(record, field): offset or position}, and (record, '<width>')\n"
"the number of fields of each positional record; None before any registration.");

static PyObject *
fp_registered_contract(PyObject *self, PyObject *unused)
{
    if (!contract.ready) {
        Py_RETURN_NONE;
    }
    PyObject *found = PyDict_New();
    for (Py_ssize_t i = 0; found != NULL && i < CONTRACT_FIELDS; i++) {
        const contract_field *f = &contract_fields[i];
        PyObject *key = Py_BuildValue("ss", f->record, f->field);
        PyObject *value = PyLong_FromSsize_t(*contract_value(&contract, f->at));
        PyObject *width_key = f->width < 0 ? NULL : Py_BuildValue("ss", f->record, "<width>");
        PyObject *width = f->width < 0 ? NULL : PyLong_FromSsize_t(*contract_value(&contract, f->width));
        int status = key == NULL || value == NULL || (f->width >= 0 && (width_key == NULL || width == NULL)) ? -1
                     : PyDict_SetItem(found, key, value);
        if (status == 0 && width_key != NULL) {
            status = PyDict_SetItem(found, width_key, width);
        }
        Py_XDECREF(key);
        Py_XDECREF(value);
        Py_XDECREF(width_key);
        Py_XDECREF(width);
        if (status < 0) {
            Py_CLEAR(found);
        }
    }
    return found;
}

/* Register the contract if nothing has yet (a loop called by code that imported phub._fastpath
 * itself): phub.network.fastpath_contract.register(). 0, or -1 with an exception set. */
static int
ensure_contract(void)
{
    if (contract.ready) {
        return 0;
    }
    PyObject *module = PyImport_ImportModule("phub.network.fastpath_contract");
    PyObject *done = module == NULL ? NULL : PyObject_CallMethod(module, "register", NULL);
    Py_XDECREF(module);
    if (done == NULL) {
        return -1;
    }
    Py_DECREF(done);
    if (!contract.ready) {
        PyErr_SetString(ContractError, "phub.network.fastpath_contract.register() did not register the round contract");
        return -1;
    }
    return 0;
}

/* Intern the field names and make ContractError; at module init. 0, or -1 with an exception set. */
static int
contract_init(PyObject *module)
{
    for (int st = 0; st < STATE_FIELDS; st++) {
        const Py_ssize_t slot_at = (Py_ssize_t)offsetof(round_contract, state) + st * (Py_ssize_t)sizeof(Py_ssize_t);
        if (contract_fields[st].at != slot_at) {
            PyErr_SetString(PyExc_SystemError, "phub._fastpath: contract_fields lists the slots out of order");
            return -1;
        }
    }
    if (strcmp(contract_fields[FIELD_CHUNK_ID].field, "id") != 0 ||
        strcmp(contract_fields[FIELD_HANDLE_ARRIVED].field, "_arrived") != 0) {
        PyErr_SetString(PyExc_SystemError, "phub._fastpath: contract_fields has Chunk.id or Handle._arrived elsewhere");
        return -1;
    }
    for (Py_ssize_t i = 0; i < CONTRACT_FIELDS; i++) {
        if ((field_names[i] = PyUnicode_InternFromString(contract_fields[i].field)) == NULL) {
            return -1;
        }
    }
    ContractError = PyErr_NewExceptionWithDoc(
        "phub._fastpath.ContractError",
        "A field the C loops read or write is missing from, or unusable in, the Python layout given.",
        PyExc_LookupError, NULL);
    if (ContractError == NULL || PyModule_AddObjectRef(module, "ContractError", ContractError) < 0) {
        return -1;
    }
    return 0;
}

#endif /* PHUB_FASTPATH_CONTRACT_H */
