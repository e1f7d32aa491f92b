/* rmq_mp.store._index: IndexFile.put_hashes' entry and slot writes, compiled.
 *
 * The reference is rmq_mp/store/index_file.py: `put_hash` (one RocketMQ `putKey`) and the
 * numpy `put_hashes`. This loop is `putKey` for each key in order, minus what Python keeps (the
 * header, the begin and end fields, the time differences, which numpy computes for all keys):
 * read the key's slot (a value <= 0 or past the entry count reads as 0, as `putKey` treats
 * it), write the entry (keyHash, phyOffset, timeDiff, prevIndex, big-endian), then point the
 * slot at it. Entry before slot, as `putKey`: a crash between leaves slots past the header's
 * count, which `_repair_torn_put` recognises. The tests compare its bytes with `put_hash`'s
 * (tests/unit/test_dispatch_batch.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

static inline uint32_t be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline void put32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static inline void put64(uint8_t *p, uint64_t v) {
    put32(p, (uint32_t)(v >> 32));
    put32(p + 4, (uint32_t)v);
}

PyDoc_STRVAR(put_entries_doc,
             "put_entries(mm, slots_at, hash_slot_num, entries_at, entry_size, first, key_hash, phy_offset, "
             "time_diff) -> new_slots\n\n"
             "putKey for each key in order into the mapped index file ``mm``: entries numbered from\n"
             "``first``; key_hash, phy_offset and time_diff are int64 buffers of one length. Returns how\n"
             "many keys found their slot empty (the header's hashSlotCount grows by that).");

static PyObject *put_entries(PyObject *self, PyObject *args) {
    Py_buffer mm, hashes, phys, diffs;
    Py_ssize_t slots_at, slot_num, entries_at, entry_size, first;
    if (!PyArg_ParseTuple(args, "w*nnnnny*y*y*", &mm, &slots_at, &slot_num, &entries_at, &entry_size, &first,
                          &hashes, &phys, &diffs))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t count = hashes.len / (Py_ssize_t)sizeof(int64_t);
    if (phys.len != hashes.len || diffs.len != hashes.len || hashes.len % (Py_ssize_t)sizeof(int64_t) ||
        slot_num <= 0 || entry_size < 20 || first < 1 || slots_at < 0 || slots_at + slot_num * 4 > entries_at ||
        entries_at + (first + count) * entry_size > mm.len || first + count > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "put_entries: arrays or positions out of range");
        goto done;
    }
    uint8_t *base = mm.buf;
    const int64_t *h = hashes.buf, *phy = phys.buf, *diff = diffs.buf;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (h[i] < 0 || h[i] > INT32_MAX || diff[i] < 0 || diff[i] > INT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "put_entries: a key hash or time difference is not a non-negative int");
            goto done;
        }
    }
    Py_ssize_t new_slots = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t number = first + i;
        uint8_t *slot = base + slots_at + (h[i] % slot_num) * 4;
        int32_t prev = (int32_t)be32(slot);
        if (prev <= 0 || prev > number) prev = 0;
        new_slots += prev == 0;
        uint8_t *entry = base + entries_at + number * entry_size;
        put32(entry, (uint32_t)h[i]);
        put64(entry + 4, (uint64_t)phy[i]);
        put32(entry + 12, (uint32_t)diff[i]);
        put32(entry + 16, (uint32_t)prev);
        put32(slot, (uint32_t)number);
    }
    result = PyLong_FromSsize_t(new_slots);
done:
    PyBuffer_Release(&mm);
    PyBuffer_Release(&hashes);
    PyBuffer_Release(&phys);
    PyBuffer_Release(&diffs);
    return result;
}

static PyMethodDef methods[] = {
    {"put_entries", put_entries, METH_VARARGS, put_entries_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_index", "IndexFile.put_hashes' entry and slot writes, compiled.", -1, methods,
};

PyMODINIT_FUNC PyInit__index(void) { return PyModule_Create(&module); }
