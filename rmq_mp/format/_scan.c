/* rmq_mp.format._scan: the compiled scan of a run of CommitLog records into dispatch columns.
 *
 * The reference is rmq_mp/format/record_batch.py (numpy, column-wise) and, behind it,
 * record.check_record (one record at a time). This file takes only the common record and hands
 * everything else back: a v1 record whose sizes agree (`calMsgLength`), whose topic and
 * properties are printable-or-control ASCII without NUL (so UTF-8 and UTF-16 code units are its
 * bytes), whose topic is not SCHEDULE_TOPIC_XXXX unless the caller gave the delay level table
 * (its tags code is then the delivery time, `record.cq_tags_code`, for a DELAY of digits) and, with
 * ``check_crc``, whose body CRC matches and whose whole-record CRC (a ``__CRC32#`` tail, when it
 * has one) does too (zlib's CRC; built without zlib, CRC-checked scans are all handed back). For those it writes what `record_batch.RecordBatch` holds: position, size,
 * queue id, queue offset, sysflag, store time, tags hash code and topic index per record, and
 * the index keys (UNIQ_KEY, then each word of KEYS) as (record, `indexKeyHashMethod` of
 * ``topic#key``). Anything else stops the scan at that record, which the Python decoder then
 * reads, so the result is the reference's by construction; the tests compare both on
 * generated and damaged logs (tests/unit/test_record_batch.py).
 *
 * Nothing here knows a field's offset: `configure` receives them from record.fixed_fields
 * (the one layout table), with the magic code, the host flags and the property names.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#ifdef RMQ_HAVE_ZLIB
#include <zlib.h>
#endif

/* What stopped a scan: the limit or the record count, a record for the Python decoder, or the
 * key columns being full. */
enum { SCAN_END = 0, SCAN_DEFER = 1, SCAN_KEYS_FULL = 2 };

/* Columns of the output array, in this order (record_batch.NATIVE_COLUMNS). */
enum { C_POSITION, C_SIZE, C_QUEUE_ID, C_QUEUE_OFFSET, C_SYS_FLAG, C_STORE_TS, C_TAGS, C_TOPIC, N_COLS };

typedef struct {
    int configured;
    int32_t magic_v1;
    uint32_t born_v6_flag, store_v6_flag;
    Py_ssize_t pos_body_crc, pos_queue_id, pos_queue_offset, pos_sys_flag;
    Py_ssize_t pos_store_ts[4], pos_body_len[4], pos_body[4]; /* per host layout 2*born+store */
    char tags[16], keys[16], uniq[16], delay[16];
    Py_ssize_t tags_len, keys_len, uniq_len, delay_len;
    char schedule_topic[64];
    Py_ssize_t schedule_topic_len;
    uint8_t name_value_sep, property_sep, key_sep;
    char crc_name[16]; /* __CRC32#: the whole-record CRC's property (record.PROPERTY_CRC32) */
    Py_ssize_t crc_name_len, crc_reserved;
} Layout;

static Layout L;

static inline uint32_t be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline uint64_t be64(const uint8_t *p) { return ((uint64_t)be32(p) << 32) | be32(p + 4); }

/* Java String.hashCode continued over ASCII bytes (one UTF-16 unit each), modulo 2^32. */
static inline uint32_t java_hash(uint32_t h, const uint8_t *p, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) h = 31u * h + p[i];
    return h;
}

/* IndexFile.indexKeyHashMethod: abs of the int hash, 0 for Integer.MIN_VALUE. */
static inline int64_t index_hash(uint32_t h) {
    int32_t s = (int32_t)h;
    return s == INT32_MIN ? 0 : (s < 0 ? -(int64_t)s : (int64_t)s);
}

/* Every byte in 0x01..0x7F: ASCII without NUL (the bytes are the text's code units). */
/* No byte >= 0x80 and none 0, eight at a time (a byte loop was a third of a 128 B record's
 * scan; the whole-record CRC's 21 bytes of properties cost 10 ns of it): a byte with its high
 * bit set shows in w itself, and where none has, (w - 0x01..) & ~w has a high bit exactly where
 * some byte is 0. The last eight overlap the words before where n is not a multiple. */
static inline int plain_ascii(const uint8_t *p, Py_ssize_t n) {
    const uint64_t ones = 0x0101010101010101u, highs = 0x8080808080808080u;
    uint64_t bad = 0, w;
    if (n < 8) {
        for (Py_ssize_t i = 0; i < n; i++) bad |= (uint64_t)((p[i] & 0x80) | (p[i] == 0));
        return !bad;
    }
    for (Py_ssize_t i = 0; i + 8 <= n; i += 8) {
        memcpy(&w, p + i, 8);
        bad |= (((w - ones) & ~w) | w) & highs;
    }
    memcpy(&w, p + n - 8, 8);
    bad |= (((w - ones) & ~w) | w) & highs;
    return !bad;
}

static int copy_name(PyObject *cfg, const char *key, char *out, Py_ssize_t cap, Py_ssize_t *len) {
    PyObject *v = PyDict_GetItemString(cfg, key);
    if (v == NULL || !PyBytes_Check(v) || PyBytes_GET_SIZE(v) >= cap) {
        PyErr_Format(PyExc_ValueError, "configure: %s must be bytes shorter than %zd", key, cap);
        return -1;
    }
    *len = PyBytes_GET_SIZE(v);
    memcpy(out, PyBytes_AS_STRING(v), (size_t)*len);
    return 0;
}

static int get_int(PyObject *cfg, const char *key, long long *out) {
    PyObject *v = PyDict_GetItemString(cfg, key);
    if (v == NULL) {
        PyErr_Format(PyExc_KeyError, "configure: %s missing", key);
        return -1;
    }
    *out = PyLong_AsLongLong(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int get_four(PyObject *cfg, const char *key, Py_ssize_t out[4]) {
    PyObject *v = PyDict_GetItemString(cfg, key);
    if (v == NULL || !PyTuple_Check(v) || PyTuple_GET_SIZE(v) != 4) {
        PyErr_Format(PyExc_ValueError, "configure: %s must be a 4-tuple", key);
        return -1;
    }
    for (int i = 0; i < 4; i++) {
        out[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(v, i));
        if (out[i] == -1 && PyErr_Occurred()) return -1;
    }
    return 0;
}

PyDoc_STRVAR(configure_doc, "configure(layout: dict) -> None: the record layout and names, from Python.");

static PyObject *scan_configure(PyObject *self, PyObject *cfg) {
    if (!PyDict_Check(cfg)) {
        PyErr_SetString(PyExc_TypeError, "configure takes a dict");
        return NULL;
    }
    long long v;
    Layout n;
    memset(&n, 0, sizeof n);
#define INT_FIELD(name, dst)                    \
    if (get_int(cfg, name, &v) < 0) return NULL; \
    dst = v;
    INT_FIELD("MESSAGE_MAGIC_CODE", n.magic_v1)
    INT_FIELD("BORNHOST_V6_FLAG", n.born_v6_flag)
    INT_FIELD("STOREHOSTADDRESS_V6_FLAG", n.store_v6_flag)
    INT_FIELD("BODYCRC", n.pos_body_crc)
    INT_FIELD("QUEUEID", n.pos_queue_id)
    INT_FIELD("QUEUEOFFSET", n.pos_queue_offset)
    INT_FIELD("SYSFLAG", n.pos_sys_flag)
    INT_FIELD("NAME_VALUE_SEPARATOR", n.name_value_sep)
    INT_FIELD("PROPERTY_SEPARATOR", n.property_sep)
    INT_FIELD("KEY_SEPARATOR", n.key_sep)
    INT_FIELD("CRC32_RESERVED_LEN", n.crc_reserved)
#undef INT_FIELD
    if (get_four(cfg, "STORETIMESTAMP", n.pos_store_ts) < 0 || get_four(cfg, "BODYLEN", n.pos_body_len) < 0 ||
        get_four(cfg, "BODY", n.pos_body) < 0)
        return NULL;
    if (copy_name(cfg, "TAGS", n.tags, sizeof n.tags, &n.tags_len) < 0 ||
        copy_name(cfg, "KEYS", n.keys, sizeof n.keys, &n.keys_len) < 0 ||
        copy_name(cfg, "UNIQ_KEY", n.uniq, sizeof n.uniq, &n.uniq_len) < 0 ||
        copy_name(cfg, "DELAY", n.delay, sizeof n.delay, &n.delay_len) < 0 ||
        copy_name(cfg, "SCHEDULE_TOPIC", n.schedule_topic, sizeof n.schedule_topic, &n.schedule_topic_len) < 0 ||
        copy_name(cfg, "PROPERTY_CRC32", n.crc_name, sizeof n.crc_name, &n.crc_name_len) < 0)
        return NULL;
    if (n.crc_reserved != n.crc_name_len + 12) {
        PyErr_SetString(PyExc_ValueError, "configure: the CRC tail is name, \\x01, 10 digits, \\x02");
        return NULL;
    }
    n.configured = 1;
    L = n;
    Py_RETURN_NONE;
}

#ifdef RMQ_HAVE_ZLIB
/* The whole-record CRC (RocketMQ 5.x `enabledAppendPropCRC`; record.record_crc_problem is the
 * reference): 1 when the record's properties end in a well-formed __CRC32# tail whose digits
 * (least significant first) are the CRC of every byte before it, or in nothing that looks like
 * one; 0 for anything else, which the Python decoder reads and names. */
static int record_crc_ok(const uint8_t *r, Py_ssize_t total, Py_ssize_t props_len) {
    Py_ssize_t reserved = L.crc_reserved;
    if (props_len < reserved) return 1;
    const uint8_t *t = r + total - reserved;
    const uint8_t *digits = t + L.crc_name_len + 1;
    int shaped = t[L.crc_name_len] == L.name_value_sep && t[reserved - 1] == L.property_sep;
    if (memcmp(t, L.crc_name, (size_t)L.crc_name_len) != 0) { /* a damaged name (shaped, or near): Python's */
        int off = 0;
        for (Py_ssize_t i = 0; i < L.crc_name_len; i++) off += t[i] != (uint8_t)L.crc_name[i];
        return !shaped && off > 2;
    }
    if (!shaped) return 0;
    uint32_t stored = 0;
    for (int i = 9; i >= 0; i--) {
        if (digits[i] < '0' || digits[i] > '9') return 0;
        uint64_t next = (uint64_t)stored * 10u + (uint32_t)(digits[i] - '0');
        if (next > 0x7FFFFFFFu) return 0;
        stored = (uint32_t)next;
    }
    uint32_t crc = (uint32_t)crc32(0L, r, (uInt)(total - reserved)) & 0x7FFFFFFFu;
    return crc == stored;
}
#endif

/* Topic lookup: the last topic seen, else the dict (bytes -> index), else a new entry. */
/* A common record at r (at most `room` bytes there): v1 magic, sizes that add up as RocketMQ's
 * calMsgLength, ASCII topic and properties. 1 with its parts in *f, else 0 (the caller's slow
 * path decides). The one framing rule of both walks (scan_segment's and queue_ends'). */
typedef struct {
    Py_ssize_t total, body, body_len, topic_len, props_len;
    const uint8_t *topic, *props;
    uint32_t sys_flag;
    int layout; /* 2 * born host v6 + store host v6: the index of L.pos_body and the like */
} Framed;

static inline int common_record(const uint8_t *r, Py_ssize_t room, Framed *f) {
    Py_ssize_t total = (int32_t)be32(r);
    if ((int32_t)be32(r + 4) != L.magic_v1 || total < L.pos_body[0] + 3 || total > room) return 0;
    uint32_t sys_flag = be32(r + L.pos_sys_flag);
    int layout = 2 * ((sys_flag & L.born_v6_flag) != 0) + ((sys_flag & L.store_v6_flag) != 0);
    Py_ssize_t body = L.pos_body[layout];
    if (total < body + 3) return 0;
    Py_ssize_t body_len = (int32_t)be32(r + L.pos_body_len[layout]);
    if (body_len < 0 || body_len > total - body - 3) return 0;
    const uint8_t *t = r + body + body_len;
    Py_ssize_t topic_len = t[0];
    if (topic_len == 0 || body + body_len + 3 + topic_len > total) return 0;
    Py_ssize_t props_len = (int16_t)(((uint16_t)t[1 + topic_len] << 8) | t[2 + topic_len]);
    if (props_len < 0 || body + body_len + 3 + topic_len + props_len != total) return 0; /* calMsgLength */
    *f = (Framed){total, body, body_len, topic_len, props_len, t + 1, t + 3 + topic_len, sys_flag, layout};
    return plain_ascii(f->topic, topic_len) && plain_ascii(f->props, props_len);
}

typedef struct {
    uint8_t bytes[256];
    Py_ssize_t len; /* -1: none yet */
    int64_t index;
    uint32_t prefix_hash; /* Java hash of "topic#" */
} TopicCache;

/* The topic's index, registering a new one in ``ids``/``topics``; -1 with an exception set. */
static int64_t topic_index(TopicCache *tc, const uint8_t *t, Py_ssize_t n, PyObject *ids, PyObject *topics) {
    if (tc->len == n && memcmp(tc->bytes, t, (size_t)n) == 0) return tc->index;
    PyObject *key = PyBytes_FromStringAndSize((const char *)t, n);
    if (key == NULL) return -1;
    int64_t index;
    PyObject *found = PyDict_GetItemWithError(ids, key);
    if (found != NULL) {
        index = PyLong_AsLongLong(found);
    } else if (PyErr_Occurred()) {
        index = -1;
    } else {
        PyObject *text = PyUnicode_DecodeASCII((const char *)t, n, "strict");
        PyObject *num = PyLong_FromSsize_t(PyList_GET_SIZE(topics));
        if (text == NULL || num == NULL || PyList_Append(topics, text) < 0 || PyDict_SetItem(ids, key, num) < 0)
            index = -1;
        else
            index = PyList_GET_SIZE(topics) - 1;
        Py_XDECREF(text);
        Py_XDECREF(num);
    }
    Py_DECREF(key);
    if (index < 0) return -1;
    memcpy(tc->bytes, t, (size_t)n);
    tc->len = n;
    tc->index = index;
    tc->prefix_hash = 31u * java_hash(0, t, n) + (uint8_t)'#';
    return index;
}

typedef struct {
    const uint8_t *p;
    Py_ssize_t n; /* -1: absent */
} Text;

/* string2messageProperties over ASCII bytes, keeping the names dispatch reads (DELAY only when
 * `delay` is given: a SCHEDULE_TOPIC_XXXX record's): chunks split on PROPERTY_SEPARATOR, each
 * counting when its first NAME_VALUE_SEPARATOR leaves a non-empty name and value; the last
 * chunk of a name wins. */
static void read_properties(const uint8_t *s, Py_ssize_t len, Text *tags, Text *keys, Text *uniq, Text *delay) {
    const uint8_t *e = s + len;
    *tags = *keys = *uniq = (Text){NULL, -1};
    if (delay) *delay = (Text){NULL, -1};
    for (;;) {
        const uint8_t *chunk_end = memchr(s, L.property_sep, (size_t)(e - s));
        if (chunk_end == NULL) chunk_end = e;
        const uint8_t *sep = memchr(s, L.name_value_sep, (size_t)(chunk_end - s));
        if (sep != NULL && sep > s && sep < chunk_end - 1) {
            Py_ssize_t name_len = sep - s;
            Text value = {sep + 1, chunk_end - sep - 1};
            if (name_len == L.tags_len && memcmp(s, L.tags, (size_t)name_len) == 0)
                *tags = value;
            else if (name_len == L.keys_len && memcmp(s, L.keys, (size_t)name_len) == 0)
                *keys = value;
            else if (name_len == L.uniq_len && memcmp(s, L.uniq, (size_t)name_len) == 0)
                *uniq = value;
            else if (delay && name_len == L.delay_len && memcmp(s, L.delay, (size_t)name_len) == 0)
                *delay = value;
        }
        if (chunk_end == e) return;
        s = chunk_end + 1;
    }
}

/* Index keys of a record: UNIQ_KEY (if any), then each non-empty word of KEYS. */
static Py_ssize_t count_keys(Text uniq, Text keys) {
    Py_ssize_t count = uniq.n > 0;
    Py_ssize_t word = 0;
    for (Py_ssize_t i = 0; i < keys.n; i++) {
        if (keys.p[i] == L.key_sep) {
            count += word > 0;
            word = 0;
        } else {
            word++;
        }
    }
    return count + (word > 0);
}

static Py_ssize_t write_keys(Text uniq, Text keys, uint32_t prefix, int64_t record, int64_t *key_rec,
                             int64_t *key_hash, Py_ssize_t at) {
    if (uniq.n > 0) {
        key_rec[at] = record;
        key_hash[at++] = index_hash(java_hash(prefix, uniq.p, uniq.n));
    }
    Py_ssize_t start = 0;
    for (Py_ssize_t i = 0; i <= keys.n; i++) {
        if (i == keys.n || keys.p[i] == L.key_sep) {
            if (i > start) {
                key_rec[at] = record;
                key_hash[at++] = index_hash(java_hash(prefix, keys.p + start, i - start));
            }
            start = i + 1;
        }
    }
    return at;
}

#define MAX_DELAY_LEVELS 64

/* `record.cq_tags_code`'s level of a SCHEDULE_TOPIC_XXXX record: int(DELAY) clamped to the last
 * level, for a DELAY of an optional sign and ASCII digits; 0 (the tags hash stays) when absent or
 * not above 0; -1 for any other text (spaces, underscores: Python's int() decides them). */
static int64_t delay_level(Text delay, Py_ssize_t levels) {
    if (delay.n <= 0) return 0;
    Py_ssize_t i = delay.p[0] == '+' || delay.p[0] == '-';
    int negative = delay.p[0] == '-';
    if (i == delay.n) return -1;
    int64_t v = 0;
    for (; i < delay.n; i++) {
        if (delay.p[i] < '0' || delay.p[i] > '9') return -1;
        if (v <= levels) v = v * 10 + (delay.p[i] - '0'); /* past the table: clamped anyway */
    }
    if (negative || v == 0) return 0;
    return v < levels ? v : levels;
}

PyDoc_STRVAR(scan_doc,
             "scan(buf, pos, limit, max_records, check_crc, topic_ids, topics, columns, row, keys, key_row,\n"
             "     delay_level_ms=None) -> (records, next_pos, keys_written, why)\n\n"
             "Decode the common records of buf[pos:limit] into ``columns`` (int64, shape (8, cap), rows\n"
             "from ``row``) and ``keys`` (int64, shape (2, key_cap), from ``key_row``): at most\n"
             "``max_records``. ``why``: 0 the limit or the count was reached, 1 the record at next_pos\n"
             "is for the Python decoder, 2 the key columns are full. ``delay_level_ms``: a tuple of each\n"
             "delay level's ms (messageDelayLevel), with which SCHEDULE_TOPIC_XXXX records are read too.");

static PyObject *scan_scan(PyObject *self, PyObject *args) {
    Py_buffer buf, cols, keys;
    Py_ssize_t pos, limit, max_records, row0, key_row0;
    int check_crc;
    PyObject *ids, *topics, *levels_obj = Py_None;
    if (!L.configured) {
        PyErr_SetString(PyExc_RuntimeError, "scan: configure() was not called");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "y*nnnpO!O!w*nw*n|O", &buf, &pos, &limit, &max_records, &check_crc, &PyDict_Type,
                          &ids, &PyList_Type, &topics, &cols, &row0, &keys, &key_row0, &levels_obj))
        return NULL;
    PyObject *result = NULL;
    /* the delay level table; -1 levels: SCHEDULE_TOPIC_XXXX records are the Python decoder's */
    int64_t level_ms[MAX_DELAY_LEVELS];
    Py_ssize_t levels = -1;
    if (levels_obj != Py_None) {
        if (!PyTuple_Check(levels_obj)) {
            PyErr_SetString(PyExc_TypeError, "scan: delay_level_ms must be a tuple of ints");
            goto done;
        }
        if (PyTuple_GET_SIZE(levels_obj) <= MAX_DELAY_LEVELS) {
            levels = PyTuple_GET_SIZE(levels_obj);
            for (Py_ssize_t i = 0; i < levels; i++) {
                level_ms[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(levels_obj, i));
                if (level_ms[i] == -1 && PyErr_Occurred()) goto done;
            }
        }
    }
    Py_ssize_t cap = cols.len / (Py_ssize_t)(N_COLS * sizeof(int64_t));
    Py_ssize_t key_cap = keys.len / (Py_ssize_t)(2 * sizeof(int64_t));
    if (pos < 0 || limit > buf.len || pos > limit || row0 < 0 || max_records < 0 || row0 + max_records > cap ||
        key_row0 < 0 || key_row0 > key_cap) {
        PyErr_SetString(PyExc_ValueError, "scan: position, limit or rows out of range");
        goto done;
    }
    const uint8_t *base = buf.buf;
    int64_t *col = cols.buf;
    int64_t *key_rec = keys.buf, *key_hash = (int64_t *)keys.buf + key_cap;
    TopicCache tc;
    tc.len = -1;
    Py_ssize_t p = pos, n = 0, k = key_row0;
    int why = SCAN_END;
#ifndef RMQ_HAVE_ZLIB
    if (check_crc) why = SCAN_DEFER, max_records = 0;
#endif
    while (p < limit && n < max_records) {
        why = SCAN_DEFER;
        if (limit - p < 8) break;
        const uint8_t *r = base + p;
        Framed f;
        if (!common_record(r, limit - p, &f)) break;
        Py_ssize_t total = f.total, body = f.body, body_len = f.body_len, topic_len = f.topic_len;
        Py_ssize_t props_len = f.props_len;
        const uint8_t *topic = f.topic, *props = f.props;
        uint32_t sys_flag = f.sys_flag;
        int layout = f.layout;
        int schedule = topic_len == L.schedule_topic_len && memcmp(topic, L.schedule_topic, (size_t)topic_len) == 0;
        if (schedule && levels < 0) break;
#ifdef RMQ_HAVE_ZLIB
        if (check_crc) {
            uint32_t crc = (uint32_t)crc32(0L, r + body, (uInt)body_len) & 0x7FFFFFFFu;
            if (crc != be32(r + L.pos_body_crc)) break;
            if (!record_crc_ok(r, total, props_len)) break;
        }
#endif
        Text tags, keys_text, uniq, delay;
        read_properties(props, props_len, &tags, &keys_text, &uniq, schedule ? &delay : NULL);
        int64_t level = schedule ? delay_level(delay, levels) : 0;
        if (level < 0) break;
        if (k + count_keys(uniq, keys_text) > key_cap) {
            why = SCAN_KEYS_FULL;
            break;
        }
        int64_t index = topic_index(&tc, topic, topic_len, ids, topics);
        if (index < 0) goto done;
        Py_ssize_t i = row0 + n;
        col[C_POSITION * cap + i] = p;
        col[C_SIZE * cap + i] = total;
        col[C_QUEUE_ID * cap + i] = (int32_t)be32(r + L.pos_queue_id);
        col[C_QUEUE_OFFSET * cap + i] = (int64_t)be64(r + L.pos_queue_offset);
        col[C_SYS_FLAG * cap + i] = (int32_t)sys_flag;
        col[C_STORE_TS * cap + i] = (int64_t)be64(r + L.pos_store_ts[layout]);
        col[C_TAGS * cap + i] = level > 0   ? col[C_STORE_TS * cap + i] + level_ms[level - 1]
                                : tags.n > 0 ? (int32_t)java_hash(0, tags.p, tags.n)
                                             : 0;
        col[C_TOPIC * cap + i] = index;
        k = write_keys(uniq, keys_text, tc.prefix_hash, i, key_rec, key_hash, k);
        p += total;
        n++;
        why = SCAN_END;
    }
    result = Py_BuildValue("nnni", n, p, k - key_row0, why);
done:
    PyBuffer_Release(&buf);
    PyBuffer_Release(&cols);
    PyBuffer_Release(&keys);
    return result;
}

/* One queue's row of `queue_ends`' output: the first queue offset met and the highest + 1. */
enum { Q_TOPIC, Q_QUEUE_ID, Q_FIRST, Q_END, N_QCOLS };

PyDoc_STRVAR(queue_ends_doc,
             "queue_ends(buf, pos, limit, max_records, skip_topic, topic_ids, topics, out)\n"
             "    -> (records, next_pos, queues, why)\n\n"
             "Walk the common records of buf[pos:limit] (the ones `scan` takes without CRC and without\n"
             "the delay table) and write each queue met once into ``out`` (int64, shape (4, cap)):\n"
             "topic index, queue id, first queue offset, highest queue offset + 1. Nothing else of a\n"
             "record is read (a slave's ha worker needs only where the whole records end and each\n"
             "queue's next offset). ``why``: 0 the limit or the count was reached, 1 the record at\n"
             "next_pos is for the Python decoder (or its topic is ``skip_topic``), 2 ``out`` is full.");

static PyObject *scan_queue_ends(PyObject *self, PyObject *args) {
    Py_buffer buf, out;
    Py_ssize_t pos, limit, max_records;
    const char *skip;
    Py_ssize_t skip_len;
    PyObject *ids, *topics;
    if (!L.configured) {
        PyErr_SetString(PyExc_RuntimeError, "queue_ends: configure() was not called");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "y*nnny#O!O!w*", &buf, &pos, &limit, &max_records, &skip, &skip_len, &PyDict_Type,
                          &ids, &PyList_Type, &topics, &out))
        return NULL;
    PyObject *result = NULL;
    int32_t *slots = NULL;
    Py_ssize_t cap = out.len / (Py_ssize_t)(N_QCOLS * sizeof(int64_t));
    if (pos < 0 || limit > buf.len || pos > limit || max_records < 0 || cap < 1) {
        PyErr_SetString(PyExc_ValueError, "queue_ends: position, limit or output out of range");
        goto done;
    }
    /* open addressing over (topic index, queue id): at most half full */
    Py_ssize_t nslots = 2;
    while (nslots < 2 * cap) nslots *= 2;
    slots = PyMem_Malloc((size_t)nslots * sizeof(int32_t));
    if (slots == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    memset(slots, 0xFF, (size_t)nslots * sizeof(int32_t));
    const uint8_t *base = buf.buf;
    int64_t *q = out.buf;
    TopicCache tc;
    tc.len = -1;
    Py_ssize_t p = pos, n = 0, queues = 0, last = -1;
    int why = SCAN_END;
    while (p < limit && n < max_records) {
        why = SCAN_DEFER;
        if (limit - p < 8) break;
        const uint8_t *r = base + p;
        Framed f;
        if (!common_record(r, limit - p, &f)) break;
        Py_ssize_t total = f.total, topic_len = f.topic_len;
        const uint8_t *topic = f.topic;
        if (topic_len == L.schedule_topic_len && memcmp(topic, L.schedule_topic, (size_t)topic_len) == 0) break;
        if (topic_len == skip_len && memcmp(topic, skip, (size_t)topic_len) == 0) break;
        int64_t index = topic_index(&tc, topic, topic_len, ids, topics);
        if (index < 0) goto done;
        int64_t queue_id = (int32_t)be32(r + L.pos_queue_id);
        int64_t offset = (int64_t)be64(r + L.pos_queue_offset);
        Py_ssize_t row = last;
        if (row < 0 || q[Q_TOPIC * cap + row] != index || q[Q_QUEUE_ID * cap + row] != queue_id) {
            uint64_t key = (uint64_t)index << 32 ^ (uint32_t)queue_id;
            Py_ssize_t s = (Py_ssize_t)((key * 0x9E3779B97F4A7C15u) >> 40) & (nslots - 1);
            while ((row = slots[s]) >= 0 &&
                   (q[Q_TOPIC * cap + row] != index || q[Q_QUEUE_ID * cap + row] != queue_id))
                s = (s + 1) & (nslots - 1);
            if (row < 0) {
                if (queues == cap) {
                    why = SCAN_KEYS_FULL;
                    break;
                }
                row = slots[s] = (int32_t)queues++;
                q[Q_TOPIC * cap + row] = index;
                q[Q_QUEUE_ID * cap + row] = queue_id;
                q[Q_FIRST * cap + row] = offset;
                q[Q_END * cap + row] = offset + 1;
            }
            last = row;
        }
        if (offset + 1 > q[Q_END * cap + row]) q[Q_END * cap + row] = offset + 1;
        p += total;
        n++;
        why = SCAN_END;
    }
    result = Py_BuildValue("nnni", n, p, queues, why);
done:
    PyMem_Free(slots);
    PyBuffer_Release(&buf);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"configure", scan_configure, METH_O, configure_doc},
    {"scan", scan_scan, METH_VARARGS, scan_doc},
    {"queue_ends", scan_queue_ends, METH_VARARGS, queue_ends_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_scan", "The compiled scan of CommitLog records into dispatch columns.", -1, methods,
};

PyMODINIT_FUNC PyInit__scan(void) {
    PyObject *mod = PyModule_Create(&module);
    if (mod == NULL) return NULL;
#ifdef RMQ_HAVE_ZLIB
    if (PyModule_AddIntConstant(mod, "HAVE_CRC", 1) < 0) goto fail;
#else
    if (PyModule_AddIntConstant(mod, "HAVE_CRC", 0) < 0) goto fail;
#endif
    return mod;
fail:
    Py_DECREF(mod);
    return NULL;
}
