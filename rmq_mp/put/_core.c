/* rmq_mp.put._core: the put path's compiled core (C against the CPython API).
 *
 * The pure-Python put path (rmq_mp/put/producer.py, append.py and encoding.py,
 * rmq_mp/format/record.py, shm/put_journal.py, shm/put_lock.py) is the reference; this file
 * does the same work for the common `send` in one call, and gives the put lock its atomic form. Nothing here knows a shared-memory offset: every word index, ring
 * layout and constant comes from Python (shm.layout, shm.flush_requests) when a `Sender` is
 * built, and `layout()` reports the record layout compiled in here so the loader can refuse a
 * core that disagrees with rmq_mp.format.record (rmq_mp/put/native.py).
 *
 * - crc32: IEEE CRC-32 (zlib's), slice-by-8.
 * - encode_own: one v1 CommitLog record, byte for byte `RecordEncoder.encode_own`.
 * - The put lock on atomics: a 32-bit word in the pointer table holding the owner's pid
 *   (compare-and-swap 0 -> pid), bit 30 set while a waiter may sleep on it; a short spin, then
 *   a futex wait on that word (shared, not private: the word is in a MAP_SHARED segment).
 *   The owner pid in the word is what makes a holder's death detectable at once: a waiter that
 *   finds the owner gone takes the lock over with one CAS (Python runs the journal undo).
 * - Sender.send_kw (bound as a producer's `send`): `Producer.send` for the common case (explicit queue id, no user properties,
 *   a known topic and queue, the record fitting the current file): encode, refusal checks,
 *   lock, the fence (a fenced start: unlock, the reference's), journal, copy, queue offset,
 *   write position (the commit point), counters, flush
 *   request, unlock, worker wake-ups, the pool-buffer prefault's call (off the lock, once a put
 *   passes `prefault_at`), the SYNC flush wait with the GIL released, SYNC_MASTER's wait for a
 *   slave's acknowledgement (replica_*: the same ring moves, on the replica-request ring),
 *   metrics and the SendResult.
 *   Anything else returns None *before changing anything shared*, and the Python reference
 *   does the whole send.
 * - The whole-record CRC (enabledAppendPropCRC): the reserved ``__CRC32#`` tail after the
 *   properties, its CRC and digits computed before the put lock over the lock's fields as
 *   guessed, corrected under it where the guess was wrong (crc_tail_init, crc_reserve,
 *   crc_guess, crc_prepare, crc_fill_prepared); a send's body read once, its CRC-32 giving the
 *   body CRC field and, combined with the header's (from its fields' values) and the rest's
 *   (a per-topic, tags and keys constant plus the UNIQ_KEY's changing words: crc_rest_template),
 *   the record's (crc_record_encoded).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "structmember.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <semaphore.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the pointer table holds native little-endian words; the lock word is its low half"
#endif

/* ------------------------------------------------------------------ record layout (v1) */

#define MESSAGE_MAGIC_CODE ((int32_t)0xDAA320A7)
#define POS_QUEUE_OFFSET 20
#define POS_PHY_OFFSET 28
#define POS_SYS_FLAG 36
#define POS_BORN_HOST 48
#define STOREHOST_V6_FLAG 0x20
#define BORNHOST_V6_FLAG 0x10
#define MAX_PROPERTIES_BYTES 32767
#define END_FILE_MIN_BLANK_LENGTH 8
#define UNIQ_KEY_LEN 32

/* ------------------------------------------------------------------ CRC-32 */

static uint32_t crc_table[8][256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
}

static uint32_t crc32_table(uint32_t crc, const uint8_t *p, size_t n) {
    crc = ~crc;
    while (n && ((uintptr_t)p & 7)) {
        crc = crc_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
        n--;
    }
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        v ^= crc;
        crc = crc_table[7][v & 0xFF] ^ crc_table[6][(v >> 8) & 0xFF] ^ crc_table[5][(v >> 16) & 0xFF] ^
              crc_table[4][(v >> 24) & 0xFF] ^ crc_table[3][(v >> 32) & 0xFF] ^
              crc_table[2][(v >> 40) & 0xFF] ^ crc_table[1][(v >> 48) & 0xFF] ^ crc_table[0][v >> 56];
        p += 8;
        n -= 8;
    }
    while (n--) crc = crc_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define RMQ_HAVE_CLMUL 1
/* The CRC of the 128-bit lane `a`: 128 -> 64 bits (x^64), then Barrett to 32 (P, floor(x^64 / P)). */
__attribute__((target("pclmul,sse4.1"))) static inline uint32_t clmul_reduce(__m128i a) {
    const __m128i k128 = _mm_set_epi64x(0x00ccaa009e, 0x01751997d0);
    const __m128i k64 = _mm_set_epi64x(0, 0x0163cd6124);
    const __m128i barrett = _mm_set_epi64x(0x01f7011641, 0x01db710641);
    const __m128i low32 = _mm_setr_epi32(~0, 0, ~0, 0);
    a = _mm_xor_si128(_mm_srli_si128(a, 8), _mm_clmulepi64_si128(a, k128, 0x10));
    a = _mm_xor_si128(_mm_srli_si128(a, 4), _mm_clmulepi64_si128(_mm_and_si128(a, low32), k64, 0x00));
    __m128i t = _mm_clmulepi64_si128(_mm_and_si128(a, low32), barrett, 0x10);
    t = _mm_clmulepi64_si128(_mm_and_si128(t, low32), barrett, 0x00);
    return (uint32_t)_mm_extract_epi32(_mm_xor_si128(a, t), 1);
}

/* CRC-32 by carry-less multiplication (Intel, "Fast CRC Computation for Generic Polynomials
 * Using PCLMULQDQ Instruction", 2009: the bit-reflected variant). Four 128-bit lanes fold 64
 * bytes a step with x^(512+64) and x^512 mod P, fold into one lane (x^(128+64), x^128), take in
 * any further 16-byte blocks, then reduce 128 -> 64 bits (x^64) and Barrett-reduce to 32 bits
 * (P and floor(x^64 / P)). `first` is the stream's first block as loaded, `p` the next 16-byte
 * block and `n` the bytes from there on, a multiple of 16, at least 48. Compiled for pclmul,
 * SSSE3 and SSE4.1 and called only when the CPU has them (`has_clmul`). */
__attribute__((target("pclmul,sse4.1"))) static inline uint32_t clmul_fold(__m128i first, const uint8_t *p,
                                                                            size_t n) {
    const __m128i k512 = _mm_set_epi64x(0x01c6e41596, 0x0154442bd4);
    const __m128i k128 = _mm_set_epi64x(0x00ccaa009e, 0x01751997d0);
    __m128i a = first;
    __m128i b = _mm_loadu_si128((const __m128i *)p);
    __m128i c = _mm_loadu_si128((const __m128i *)(p + 16));
    __m128i d = _mm_loadu_si128((const __m128i *)(p + 32));
    p += 48;
    n -= 48;
#define FOLD(x, k, next) \
    _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), next)
    for (; n >= 64; p += 64, n -= 64) {
        a = FOLD(a, k512, _mm_loadu_si128((const __m128i *)p));
        b = FOLD(b, k512, _mm_loadu_si128((const __m128i *)(p + 16)));
        c = FOLD(c, k512, _mm_loadu_si128((const __m128i *)(p + 32)));
        d = FOLD(d, k512, _mm_loadu_si128((const __m128i *)(p + 48)));
    }
    a = FOLD(a, k128, b);
    a = FOLD(a, k128, c);
    a = FOLD(a, k128, d);
    for (; n >= 16; p += 16, n -= 16) a = FOLD(a, k128, _mm_loadu_si128((const __m128i *)p));
#undef FOLD
    return clmul_reduce(a);
}

/* ``n`` bytes, a multiple of 16, at least 64; ``crc`` is not inverted here. */
__attribute__((target("pclmul,sse4.1"))) static uint32_t crc32_clmul_blocks(uint32_t crc, const uint8_t *p,
                                                                             size_t n) {
    __m128i first = _mm_xor_si128(_mm_loadu_si128((const __m128i *)p), _mm_cvtsi32_si128((int)crc));
    return clmul_fold(first, p + 16, n - 16);
}

/* The raw CRC (register from 0, no inversions) of ``n`` >= 64 bytes of any length, read where
 * they are: as if behind 16 - n % 16 zeros (which add nothing to a raw CRC), the first block is
 * the first n % 16 bytes shifted into its end (one byte shuffle), every later block a plain
 * load. No copy and no byte by table. */
__attribute__((target("pclmul,sse4.1,ssse3"))) static uint32_t crc32_clmul_raw(const uint8_t *p, size_t n) {
    static const uint8_t shuffle[32] = {0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80,
                                        0x80, 0x80, 0x80, 0x80, 0x80, 0,    1,    2,    3,    4,    5,
                                        6,    7,    8,    9,    10,   11,   12,   13,   14,   15};
    size_t lead = (16 - n % 16) % 16; /* mask[i] = i - lead, or 0x80 (a zero) below lead */
    __m128i mask = _mm_loadu_si128((const __m128i *)(shuffle + 16 - lead));
    __m128i first = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)p), mask);
    return clmul_fold(first, p + 16 - lead, n + lead - 16);
}

/* The same for 0 < ``n`` < 64 (the few bytes after a record's body): one lane, each further block
 * folded in by x^(128+64) and x^128, then reduced. Reads 16 bytes from ``p`` even where ``n`` is
 * less (a record's CRC tail follows; the bytes past ``n`` are shuffled out). */
__attribute__((target("pclmul,sse4.1,ssse3"))) static uint32_t crc32_clmul_raw_short(const uint8_t *p, size_t n) {
    static const uint8_t shuffle[32] = {0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80,
                                        0x80, 0x80, 0x80, 0x80, 0x80, 0,    1,    2,    3,    4,    5,
                                        6,    7,    8,    9,    10,   11,   12,   13,   14,   15};
    const __m128i k128 = _mm_set_epi64x(0x00ccaa009e, 0x01751997d0);
    size_t lead = (16 - n % 16) % 16;
    __m128i a = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)p),
                                 _mm_loadu_si128((const __m128i *)(shuffle + 16 - lead)));
    for (p += 16 - lead, n += lead; n > 16; p += 16, n -= 16)
        a = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(a, k128, 0x00), _mm_clmulepi64_si128(a, k128, 0x11)),
                          _mm_loadu_si128((const __m128i *)p));
    return clmul_reduce(a);
}

static int has_clmul;

/* The bytes from 64 on in 16-byte blocks by multiplication, the rest by table. */
static uint32_t crc32_clmul(uint32_t crc, const uint8_t *p, size_t n) {
    size_t blocks = n & ~(size_t)15;
    crc = ~crc32_clmul_blocks(~crc, p, blocks);
    return n > blocks ? crc32_table(crc, p + blocks, n - blocks) : crc;
}
#endif

#ifdef RMQ_HAVE_ZLIB
#include <zlib.h>
/* By multiplication from 64 bytes where the CPU can (128 B: 25 against the table's 70 ns,
 * measured in this loop); else slice-by-8 for small bodies and zlib's braided CRC from 384
 * bytes: 128 B 70 vs 110 ns, 512 B 300 vs 250 ns, 4 KiB 2.5 vs 1.0 us. setup.py links zlib
 * when its header is there. */
static uint32_t crc32_of(uint32_t crc, const uint8_t *p, size_t n) {
#ifdef RMQ_HAVE_CLMUL
    if (has_clmul && n >= 64) return crc32_clmul(crc, p, n);
#endif
    if (n < 384) return crc32_table(crc, p, n);
    while (n > 0x40000000u) {
        crc = (uint32_t)crc32(crc, p, 0x40000000u);
        p += 0x40000000u;
        n -= 0x40000000u;
    }
    return (uint32_t)crc32(crc, p, (uInt)n);
}
#else
static uint32_t crc32_of(uint32_t crc, const uint8_t *p, size_t n) {
#ifdef RMQ_HAVE_CLMUL
    if (has_clmul && n >= 64) return crc32_clmul(crc, p, n);
#endif
    return crc32_table(crc, p, n);
}
#endif

/* ------------------------------------------------------------------ big-endian stores */

static inline void put16(uint8_t *p, uint16_t v) { v = __builtin_bswap16(v); memcpy(p, &v, 2); }
static inline void put32(uint8_t *p, uint32_t v) { v = __builtin_bswap32(v); memcpy(p, &v, 4); }
static inline void put64(uint8_t *p, uint64_t v) { v = __builtin_bswap64(v); memcpy(p, &v, 8); }

typedef struct {
    uint8_t store_ip[16];
    int store_ip_len; /* 4 or 16 */
    int32_t store_port;
    uint8_t born_ip[4]; /* a writer's own born host is IPv4 (RecordEncoder) */
    int32_t born_port;
    int32_t sys_flag;
} Hosts;

static inline Py_ssize_t fixed_size(const Hosts *h) { return 80 + h->store_ip_len + 4; }

/* The store timestamp's position in a record born at an IPv4 host. */
#define POS_STORE_TIMESTAMP (POS_BORN_HOST + 8)

/* One record with QUEUEOFFSET, PHYSICALOFFSET and STORETIMESTAMP 0 (patched under the lock).
 * `out` holds at least fixed_size + body + topic_field + 2 + props bytes. With `keep_body_crc`
 * the body's whole CRC-32 (the field holds 31 bits of it) is left in QUEUEOFFSET's first four
 * bytes, which the lock writes, for the whole-record CRC (crc_prepare: the body read once, here,
 * from where it is, before the stores of the record). */
static Py_ssize_t encode_into(uint8_t *out, const Hosts *h, const uint8_t *topic_field, Py_ssize_t topic_len,
                              const uint8_t *body, Py_ssize_t body_len, int32_t queue_id, int32_t flag,
                              int64_t born_ms, const uint8_t *props, Py_ssize_t props_len, int keep_body_crc) {
    Py_ssize_t fixed = fixed_size(h);
    Py_ssize_t total = fixed + body_len + topic_len + 2 + props_len;
    uint8_t *p = out;
    uint32_t crc = body_len ? crc32_of(0, body, (size_t)body_len) : 0;
    put32(p, (uint32_t)total);
    put32(p + 4, (uint32_t)MESSAGE_MAGIC_CODE);
    put32(p + 8, crc & 0x7FFFFFFFu);
    /* QUEUEID and FLAG as one store, which crc_record_clmul's one load of them is forwarded from */
    uint64_t qid_flag = __builtin_bswap32((uint32_t)queue_id) | (uint64_t)__builtin_bswap32((uint32_t)flag) << 32;
    memcpy(p + 12, &qid_flag, 8);
    memset(p + 20, 0, 16); /* QUEUEOFFSET, PHYSICALOFFSET */
    if (keep_body_crc) memcpy(p + POS_QUEUE_OFFSET, &crc, 4); /* crc_body_of reads it back */
    put32(p + 36, (uint32_t)h->sys_flag);
    put64(p + 40, (uint64_t)born_ms);
    memcpy(p + 48, h->born_ip, 4);
    put32(p + 52, (uint32_t)h->born_port);
    memset(p + 56, 0, 8); /* STORETIMESTAMP */
    memcpy(p + 64, h->store_ip, (size_t)h->store_ip_len);
    p += 64 + h->store_ip_len;
    put32(p, (uint32_t)h->store_port);
    memset(p + 4, 0, 12); /* RECONSUMETIMES, PREPARED TRANSACTION OFFSET */
    put32(p + 16, (uint32_t)body_len);
    p = out + fixed;
    memcpy(p, body, (size_t)body_len);
    p += body_len;
    memcpy(p, topic_field, (size_t)topic_len);
    p += topic_len;
    put16(p, (uint16_t)props_len);
    memcpy(p + 2, props, (size_t)props_len);
    return total;
}

/* ------------------------------------------------------------------ time */

static inline int64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline int64_t real_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Python's floor division of a time_ns (never negative here) by 10^6. */
static inline int64_t real_ms(void) { return real_ns() / 1000000; }

/* ------------------------------------------------------------------ the put lock */

#define LOCK_WAITERS 0x40000000u
#define LOCK_OWNER_MASK 0x3FFFFFFFu

static inline long futex(uint32_t *addr, int op, uint32_t val, const struct timespec *timeout) {
    return syscall(SYS_futex, addr, op, val, timeout, NULL, 0);
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static inline int lock_try(uint32_t *word, uint32_t pid) {
    uint32_t expected = 0;
    return __atomic_compare_exchange_n(word, &expected, pid, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED);
}

/* Spin for up to spin_ns (watching, yielding the CPU between looks: a holder that lost its CPU
 * gets it back), then sleep on the futex until wait_deadline_ns (CLOCK_MONOTONIC). 1 once held.
 * Call without the GIL. */
static int lock_wait(uint32_t *word, uint32_t pid, int64_t spin_ns, int64_t wait_deadline_ns) {
    int64_t now = mono_ns();
    int64_t spin_until = now + spin_ns;
    int looks = 0;
    while (now < spin_until) {
        if (__atomic_load_n(word, __ATOMIC_RELAXED) == 0 && lock_try(word, pid)) return 1;
        if (++looks < 64)
            cpu_relax();
        else
            sched_yield();
        now = mono_ns();
    }
    while (now < wait_deadline_ns) {
        uint32_t v = __atomic_load_n(word, __ATOMIC_RELAXED);
        if (v == 0) {
            uint32_t expected = 0; /* taken as contended: others may still sleep on it */
            if (__atomic_compare_exchange_n(word, &expected, pid | LOCK_WAITERS, 0, __ATOMIC_ACQUIRE,
                                            __ATOMIC_RELAXED))
                return 1;
            continue;
        }
        if (!(v & LOCK_WAITERS)) {
            if (!__atomic_compare_exchange_n(word, &v, v | LOCK_WAITERS, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
                continue;
            v |= LOCK_WAITERS;
        }
        int64_t left = wait_deadline_ns - now;
        struct timespec ts = {(time_t)(left / 1000000000), (long)(left % 1000000000)};
        futex(word, FUTEX_WAIT, v, &ts);
        now = mono_ns();
    }
    return 0;
}

static inline void lock_release(uint32_t *word) {
    uint32_t old = __atomic_exchange_n(word, 0, __ATOMIC_RELEASE);
    if (old & LOCK_WAITERS) futex(word, FUTEX_WAKE, 1, NULL);
}

/* ------------------------------------------------------------------ buffers */

typedef struct {
    Py_buffer view;
    int held;
} Held;

static int hold(Held *h, PyObject *obj, int writable) {
    if (PyObject_GetBuffer(obj, &h->view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0) return -1;
    h->held = 1;
    return 0;
}

static void unhold(Held *h) {
    if (h->held) {
        PyBuffer_Release(&h->view);
        h->held = 0;
    }
}

static uint32_t *lock_word_of(Py_buffer *table, Py_ssize_t index) {
    if (index < 0 || (index + 1) * 8 > table->len) {
        PyErr_SetString(PyExc_IndexError, "lock word outside the table");
        return NULL;
    }
    return (uint32_t *)((char *)table->buf + index * 8);
}

/* lock_acquire(table, index, pid, spin_ns, wait_ms) -> bool: the atomic put lock, taken within
 * spin_ns of watching and wait_ms of sleeping (GIL released). */
static PyObject *py_lock_acquire(PyObject *self, PyObject *args) {
    PyObject *table;
    Py_ssize_t index;
    unsigned int pid;
    long long spin_ns, wait_ms;
    if (!PyArg_ParseTuple(args, "OnILL", &table, &index, &pid, &spin_ns, &wait_ms)) return NULL;
    if (pid == 0 || pid & ~LOCK_OWNER_MASK) return PyErr_Format(PyExc_ValueError, "pid %u out of range", pid);
    Held h = {0};
    if (hold(&h, table, 1) < 0) return NULL;
    uint32_t *word = lock_word_of(&h.view, index);
    if (!word) {
        unhold(&h);
        return NULL;
    }
    int got = lock_try(word, pid);
    if (!got) {
        int64_t deadline = mono_ns() + spin_ns + wait_ms * 1000000;
        Py_BEGIN_ALLOW_THREADS got = lock_wait(word, pid, spin_ns, deadline);
        Py_END_ALLOW_THREADS
    }
    unhold(&h);
    return PyBool_FromLong(got);
}

static PyObject *py_lock_release(PyObject *self, PyObject *args) {
    PyObject *table;
    Py_ssize_t index;
    if (!PyArg_ParseTuple(args, "On", &table, &index)) return NULL;
    Held h = {0};
    if (hold(&h, table, 1) < 0) return NULL;
    uint32_t *word = lock_word_of(&h.view, index);
    if (word) lock_release(word);
    unhold(&h);
    if (!word) return NULL;
    Py_RETURN_NONE;
}

/* lock_cas(table, index, expected, new) -> bool: take over a lock whose owner died. */
static PyObject *py_lock_cas(PyObject *self, PyObject *args) {
    PyObject *table;
    Py_ssize_t index;
    unsigned int expected, desired;
    if (!PyArg_ParseTuple(args, "OnII", &table, &index, &expected, &desired)) return NULL;
    Held h = {0};
    if (hold(&h, table, 1) < 0) return NULL;
    uint32_t *word = lock_word_of(&h.view, index);
    int done = 0;
    if (word)
        done = __atomic_compare_exchange_n(word, &expected, desired, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
    unhold(&h);
    if (!word) return NULL;
    return PyBool_FromLong(done);
}

/* ------------------------------------------------------------------ module-level encode */

static int parse_host(PyObject *ip, long long port, uint8_t *out, int *out_len, int32_t *out_port) {
    char *raw;
    Py_ssize_t n;
    if (PyBytes_AsStringAndSize(ip, &raw, &n) < 0) return -1;
    if (n != 4 && n != 16) {
        PyErr_SetString(PyExc_ValueError, "a host address is 4 or 16 bytes");
        return -1;
    }
    memcpy(out, raw, (size_t)n);
    *out_len = (int)n;
    *out_port = (int32_t)port;
    return 0;
}

static PyObject *py_encode_own(PyObject *self, PyObject *args) {
    Py_buffer topic_field, body, props;
    long long queue_id, flag, born_ms, born_port, store_port;
    PyObject *born_ip, *store_ip;
    if (!PyArg_ParseTuple(args, "y*y*LLLy*OLOL", &topic_field, &body, &queue_id, &flag, &born_ms, &props,
                          &born_ip, &born_port, &store_ip, &store_port))
        return NULL;
    PyObject *out = NULL;
    Hosts h;
    int born_len;
    int32_t bp, sp;
    if (parse_host(born_ip, born_port, h.born_ip, &born_len, &bp) < 0) goto done;
    if (born_len != 4) {
        PyErr_SetString(PyExc_ValueError, "a writer's own born host is IPv4");
        goto done;
    }
    if (parse_host(store_ip, store_port, h.store_ip, &h.store_ip_len, &sp) < 0) goto done;
    if (props.len > MAX_PROPERTIES_BYTES) {
        PyErr_SetString(PyExc_ValueError, "properties too long");
        goto done;
    }
    h.born_port = bp;
    h.store_port = sp;
    h.sys_flag = h.store_ip_len == 16 ? STOREHOST_V6_FLAG : 0;
    Py_ssize_t total = fixed_size(&h) + body.len + topic_field.len + 2 + props.len;
    out = PyByteArray_FromStringAndSize(NULL, total);
    if (out)
        encode_into((uint8_t *)PyByteArray_AS_STRING(out), &h, topic_field.buf, topic_field.len, body.buf,
                    body.len, (int32_t)queue_id, (int32_t)flag, born_ms, props.buf, props.len, 0);
done:
    PyBuffer_Release(&topic_field);
    PyBuffer_Release(&body);
    PyBuffer_Release(&props);
    return out;
}

static PyObject *py_crc32(PyObject *self, PyObject *args) {
    Py_buffer data;
    unsigned int start = 0;
    if (!PyArg_ParseTuple(args, "y*|I", &data, &start)) return NULL;
    uint32_t crc = crc32_of(start, data.buf, (size_t)data.len);
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(crc);
}

/* Test hook: with False the CRC runs as on a CPU without PCLMULQDQ; returns whether this CPU
 * has it (the tests compare both ways with zlib). */
static PyObject *py_set_clmul(PyObject *self, PyObject *arg) {
    int want = PyObject_IsTrue(arg);
    if (want < 0) return NULL;
#ifdef RMQ_HAVE_CLMUL
    __builtin_cpu_init();
    int cpu = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("ssse3") && __builtin_cpu_supports("sse4.1");
    has_clmul = want && cpu;
    return PyBool_FromLong(cpu);
#else
    Py_RETURN_FALSE;
#endif
}

static PyObject *py_layout(PyObject *self, PyObject *noargs) {
    return Py_BuildValue("{s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i}", "MESSAGE_MAGIC_CODE", MESSAGE_MAGIC_CODE,
                         "POS_QUEUE_OFFSET", POS_QUEUE_OFFSET, "POS_PHY_OFFSET", POS_PHY_OFFSET, "POS_SYS_FLAG",
                         POS_SYS_FLAG, "POS_BORN_HOST", POS_BORN_HOST, "STOREHOSTADDRESS_V6_FLAG",
                         STOREHOST_V6_FLAG, "BORNHOST_V6_FLAG", BORNHOST_V6_FLAG, "MAX_PROPERTIES_BYTES",
                         MAX_PROPERTIES_BYTES, "END_FILE_MIN_BLANK_LENGTH", END_FILE_MIN_BLANK_LENGTH,
                         "LOCK_WAITERS", (int)LOCK_WAITERS);
}

/* ------------------------------------------------------------------ Sender */

enum {
    W_WROTE, W_J_ACTIVE, W_J_BEFORE, W_J_AFTER, W_J_SLOT, W_J_QUEUE_OFFSET, W_LAST_STORE_TS, W_PUT_COUNT,
    W_PUT_BYTES, W_STATE, W_HEARTBEAT, W_FLAGS, W_REPUT_FROM, W_FLUSH_SEQ, W_FLUSHED, W_LOCK, W_LOCK_SINCE,
    W_COUNT
};
static const char *const WORD_NAMES[W_COUNT] = {
    "WROTE_POSITION", "JOURNAL_ACTIVE", "JOURNAL_WROTE_BEFORE", "JOURNAL_WROTE_AFTER", "JOURNAL_QUEUE_SLOT",
    "JOURNAL_QUEUE_OFFSET_BEFORE", "LAST_STORE_TIMESTAMP", "PUT_COUNT", "PUT_BYTES", "STATE",
    "SUPERVISOR_HEARTBEAT_MS", "RUNNING_FLAGS", "REPUT_FROM_OFFSET", "FLUSH_REQUEST_SEQ", "FLUSHED_POSITION",
    "PUT_LOCK_OWNER_PID", "PUT_LOCK_SINCE_MS"};

#define MAX_WAKES 2
#define MAX_BOUNDS 64

/* Test hook: stop this process (SIGSTOP) at a point of the put, so a test can kill -9 it there. */
enum { PAUSE_NONE, PAUSE_LOCKED, PAUSE_JOURNALLED, PAUSE_COPIED, PAUSE_FLUSH_WAIT, PAUSE_FLUSH_TIMED_OUT };
static int pause_at = PAUSE_NONE;
#define PAUSE_POINT(p) \
    do {                                      \
        if (pause_at == (p)) kill(getpid(), SIGSTOP); \
    } while (0)

/* Why a send went to the reference, counted per reason in the producer's metrics slot
 * (`shm.metrics.REFERENCE_REASONS` names them, in this order; the Sender checks the count). */
enum {
    REF_ARGUMENT,  /* an argument of a type the core does not take (docs/architecture.md lists them) */
    REF_REFUSED,   /* a message the store refuses: the reference words the reason */
    REF_NEW_QUEUE, /* a queue this producer has not placed yet, or topics.json to be read again */
    REF_NEW_FILE,  /* the records need a new file or a reservation first */
    REF_STORE,     /* the store refuses puts now, lags in dispatch, or the lock was not had in a slice */
    REF_MONTH,     /* the UNIQ_KEY's month rolls over */
    REF_ITEM,      /* a send_batch item the core does not encode (a Message) */
    REF_NO_CORE,   /* counted by Python: a producer without the core (a slave, pure) */
    REF_COUNT
};

/* SYNC_MASTER's replica-request ring (the functions after `Placed`: replica_*). */
typedef struct {
    int on;
    Held ring;
    int64_t capacity, base, slot_size, f_state, f_next, f_deadline, f_pid;
    int64_t st_free, st_waiting, st_done_ok, st_done_timeout, st_abandoned, stale_ms;
    Py_ssize_t seq_word, acked_word, connections_word;
    int64_t timeout_ms, fallbehind_max;
    PyObject *done_names; /* list of str */
    sem_t **done;
    int poke_fd;
    struct sockaddr_un poke_addr;
    socklen_t poke_len;
    PyObject *slave_not_available, *flush_slave_timeout, *no_slave_reason, *timeout_reason, *ring_full_reason;
    PyObject *count; /* ReplicaRequests.count(no_slave: bool): the reference's counters */
} Replica;

typedef struct {
    /* the record shape these are for (crc_state_for): covered 0: none yet; body_len -1: read whole */
    Py_ssize_t covered, fixed, body_len;
    uint32_t shift;        /* x^(8 (covered - 64)) mod P */
    uint32_t ones;         /* ~0 * x^(8 covered) mod P */
    uint32_t head_shift;   /* x^(8 (covered - fixed)): the header's raw CRC past body and rest */
    uint32_t after_shift;  /* x^(8 (covered - fixed - body_len)): the body's past the rest */
    uint32_t field_factor; /* x^(8 (covered - 8)): the body CRC field's word */
    uint32_t body_ones;    /* ~0 * x^(8 body_len): the body's CRC-32 from its raw CRC */
    /* the Sender's header (crc_head_for): a header of `head_fixed` bytes (0: none yet), the raw
     * CRC of its bytes with the per-send words 0, and x^(8 (fixed - k)) for each such word k */
    Py_ssize_t head_fixed;
    uint32_t head_const;
    uint32_t head_factor[12];
    /* this shape's per-send words' factors straight into the record's raw CRC (crc_pairs_for:
     * head_factor times head_shift, two to a 128-bit lane pair as crc_record_clmul multiplies
     * them, CRC_PAIR_*), and the constant of all else (0 pairs_ready: not made for this shape) */
    uint64_t pair_factor[2 * 8];
    uint32_t shape_const;
    int pairs_ready;
    int shape_seen; /* records of this shape prepared by multiplication (crc_prepare) */
} CrcState;

/* A send's topic and properties ("the rest") with its properties' common shape (`build_props`
 * without entries: [TAGS][KEYS]UNIQ_KEY, the id last) are fixed by the topic's field, the tags
 * and the keys given (str and tuple: immutable, so one object is one string of bytes) but for the
 * UNIQ_KEY's 12 time-and-counter characters. `CrcRestKey` names them for the send at hand (set
 * before append_locked, which takes it: topic NULL, no template); `CrcTemplate` holds the last
 * one's raw CRC with those characters 0 (crc_rest_template), and references to what it is of. */
typedef struct {
    PyObject *topic, *tags, *keys; /* borrowed, for one append_locked */
} CrcRestKey;

typedef struct {
    PyObject *topic, *tags, *keys; /* strong references: the objects the rest was made of */
    Py_ssize_t rest_len;           /* 0: no constant for them yet */
    uint32_t rest_const;           /* raw CRC of the rest, the UNIQ_KEY's 12 changing characters 0 */
    long long made;                /* constants made (tests: a repeated send takes its template) */
} CrcTemplate;

typedef struct {
    PyObject_HEAD
    Held table, queues, ring, metrics, uniq_state;
    Py_ssize_t w[W_COUNT];
    Py_ssize_t fence_word; /* FENCE (rmq_mp/put/fence.py), read under the lock by every put */
    int64_t accepting_state, put_blockers, stale_ms, max_lag;
    int64_t pid, spin_ns, slice_ms;
    Hosts hosts;
    int64_t max_message_size;
    uint8_t crc_tail[20]; /* the whole-record CRC's reserved tail (record.CRC_PLACEHOLDER) */
    Py_ssize_t crc_tail_len; /* 0: enabledAppendPropCRC off */
    char uniq_prefix[20];
    /* SYNC: the flush-request ring */
    int sync;
    int64_t ring_capacity, ring_base, ring_slot_size, ring_state, ring_next, ring_deadline, ring_pid;
    int64_t ring_started; /* the slot's started_ns field (shm/flush_requests.py) */
    int64_t send_started_ns; /* CLOCK_MONOTONIC when the send being put began, before the lock */
    int64_t gather_word;  /* FLUSH_GATHER_TICKET: the ticket whose put wakes the gathering flusher */
    int64_t ring_ticket;  /* the ticket take_ring_slot took last */
    int64_t ring_free, ring_waiting, ring_done_ok, ring_done_timeout, ring_abandoned;
    int64_t sync_flush_timeout_ms;
    PyObject *flush_done_names; /* list of str */
    sem_t **flush_done;
    /* worker wake-ups after a put */
    int wakes;
    Py_ssize_t wake_word[MAX_WAKES];
    sem_t *wake_sem[MAX_WAKES];
    /* metrics */
    int has_metrics;
    Py_ssize_t m_puts, m_failures, m_latency_sum, m_latency_buckets, m_hold_sum, m_hold_buckets;
    int n_bounds;
    int64_t bounds[MAX_BOUNDS];
    /* the current file, set by the Python side whenever it changes */
    PyObject *dest; /* pool buffer or the file's mapping; None: no cached file */
    int dest_is_file;
    int fd;
    long long file_from_offset, file_size, pwrite_min_bytes;
    long long reserved_until;
    long long fresh_until_ns;
    long long last_hold_ns;
    long long sent; /* sends this core completed (tests: the fast path is really taken) */
    PyObject *topics; /* dict: topic -> (topic_field: bytes, limit: int, queues: list[(slot, word) | None]) */
    PyObject *last_topic, *last_entry; /* the previous send's topic and entry (a send's dict lookup) */
    /* results: SendResult is built by storing its seven slots (its dataclass __init__ only
     * assigns them, and cost a fifth of a send); the slots are checked at init */
    Py_ssize_t result_slot[7];
    PyObject *result_type, *put_ok, *flush_timeout, *msg_id_prefix, *empty, *ring_full_reason,
        *not_flushed_reason;
    PyObject *reference; /* Producer._send: what the core does not take goes there */
    PyObject *rotate;    /* QueueRouter.queue_for: the round robin for a send without a queue id */
    PyObject *prefault;  /* Appender.prefault_ahead: called off the lock once a put ends at prefault_at */
    long long prefault_at;
    uint8_t *scratch;
    Py_ssize_t scratch_len;
    uint8_t *pbuf; /* a send's properties string (`build_props`), then copied into its record */
    Py_ssize_t pbuf_len;
    uint8_t *kbuf; /* keys given as a sequence, joined */
    Py_ssize_t kbuf_len;
    int64_t max_delay_level;
    Py_ssize_t m_reference; /* metrics word of reference_sends[0]; -1: none */
    int why;                /* why the last send went to the reference (REF_* below) */
    int put_waits;          /* the put at hand waits for its flush (WAIT absent or "true") */
    PyObject *schedule_topic; /* "SCHEDULE_TOPIC_XXXX": a delayed send's topic */
    PyObject *rotated;        /* send_items: the queue id rotated for the item handed back, or None */
    int batching;             /* send_items: metrics once for the call, summed here */
    Py_ssize_t batch_failed;
    int64_t batch_hold_ns;
    Py_ssize_t *starts; /* a batch's record starts in scratch */
    size_t starts_len;
    struct CrcPrepared *crc_pre; /* a batch's CRCs computed before the lock (crc_prepare) */
    size_t crc_pre_len;
    CrcState crc_state; /* the last record shape's constants (crc_prepare) */
    long long crc_misses; /* records whose guessed lock fields were wrong (crc_fill_prepared corrected) */
    CrcRestKey crc_key;   /* the send at hand's rest (crc_rest_template) */
    CrcTemplate crc_tpl;  /* the last rest's CRC constant */
    int closed;
    Replica rep; /* SYNC_MASTER */
} Sender;

static int replica_init(Sender *s, PyObject *d);
static void replica_release(Sender *s);
static void replica_dealloc(Sender *s);

static int64_t dict_i64(PyObject *d, const char *key, int *ok) {
    PyObject *v = PyDict_GetItemString(d, key);
    if (!v) {
        if (*ok) PyErr_Format(PyExc_KeyError, "Sender setting %s missing", key);
        *ok = 0;
        return 0;
    }
    long long x = PyLong_AsLongLong(v);
    if (x == -1 && PyErr_Occurred()) *ok = 0;
    return x;
}

static PyObject *dict_obj(PyObject *d, const char *key, int *ok) {
    PyObject *v = PyDict_GetItemString(d, key);
    if (!v) {
        if (*ok) PyErr_Format(PyExc_KeyError, "Sender setting %s missing", key);
        *ok = 0;
    }
    return v;
}

static sem_t *open_sem(PyObject *name) {
    const char *s = PyUnicode_AsUTF8(name);
    if (!s) return NULL;
    sem_t *sem = sem_open(s, 0);
    if (sem == SEM_FAILED) {
        PyErr_SetFromErrnoWithFilename(PyExc_OSError, s);
        return NULL;
    }
    return sem;
}

static void sender_release(Sender *s) {
    unhold(&s->table);
    unhold(&s->queues);
    unhold(&s->ring);
    unhold(&s->metrics);
    unhold(&s->uniq_state);
    for (int i = 0; i < s->wakes; i++)
        if (s->wake_sem[i]) sem_close(s->wake_sem[i]);
    s->wakes = 0;
    if (s->flush_done) {
        for (int64_t i = 0; i < s->ring_capacity; i++)
            if (s->flush_done[i]) sem_close(s->flush_done[i]);
        PyMem_Free(s->flush_done);
        s->flush_done = NULL;
    }
    Py_CLEAR(s->dest);
    replica_release(s);
    s->closed = 1;
}

static int Sender_traverse(Sender *s, visitproc visit, void *arg) {
    Py_VISIT(s->reference); /* a bound method of the producer, which holds this sender */
    Py_VISIT(s->rotate);
    Py_VISIT(s->prefault);
    return 0;
}

static int Sender_clear(Sender *s) {
    Py_CLEAR(s->reference);
    Py_CLEAR(s->rotate);
    Py_CLEAR(s->prefault);
    return 0;
}

static void Sender_dealloc(Sender *s) {
    PyObject_GC_UnTrack(s);
    Sender_clear(s);
    sender_release(s);
    replica_dealloc(s);
    Py_XDECREF(s->flush_done_names);
    Py_XDECREF(s->topics);
    Py_XDECREF(s->last_topic);
    Py_XDECREF(s->last_entry);
    Py_XDECREF(s->result_type);
    Py_XDECREF(s->put_ok);
    Py_XDECREF(s->flush_timeout);
    Py_XDECREF(s->msg_id_prefix);
    Py_XDECREF(s->empty);
    Py_XDECREF(s->schedule_topic);
    Py_XDECREF(s->rotated);
    Py_XDECREF(s->ring_full_reason);
    Py_XDECREF(s->not_flushed_reason);
    PyMem_Free(s->scratch);
    PyMem_Free(s->pbuf);
    PyMem_Free(s->kbuf);
    PyMem_Free(s->starts);
    PyMem_Free(s->crc_pre);
    Py_XDECREF(s->crc_tpl.topic);
    Py_XDECREF(s->crc_tpl.tags);
    Py_XDECREF(s->crc_tpl.keys);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static const char *const RESULT_FIELDS[7] = {"status",    "queue_id", "queue_offset", "commit_log_offset",
                                             "uniq_key", "reason",   "msg_id_prefix"};

/* The byte offsets of SendResult's slots, in its constructor's order: refused unless the type
 * has exactly these seven object slots and nothing else (no __dict__, no __init__ side effect
 * this would skip: `test_native_send` compares results field by field). */
static int find_result_slots(Sender *s) {
    PyTypeObject *type = (PyTypeObject *)s->result_type;
    if (!PyType_Check(s->result_type) || type->tp_dictoffset != 0) {
        PyErr_SetString(PyExc_TypeError, "result_type must be a slotted class");
        return -1;
    }
    PyObject *slots = PyObject_GetAttrString(s->result_type, "__slots__");
    if (!slots) return -1;
    Py_ssize_t n = PySequence_Size(slots);
    Py_DECREF(slots);
    if (n != 7) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "result_type must have exactly 7 slots");
        return -1;
    }
    for (int i = 0; i < 7; i++) {
        PyObject *desc = PyObject_GetAttrString(s->result_type, RESULT_FIELDS[i]);
        if (!desc) return -1;
        if (Py_TYPE(desc) != &PyMemberDescr_Type ||
            ((PyMemberDescrObject *)desc)->d_member->type != T_OBJECT_EX) {
            Py_DECREF(desc);
            PyErr_Format(PyExc_TypeError, "result_type.%s is not an object slot", RESULT_FIELDS[i]);
            return -1;
        }
        s->result_slot[i] = ((PyMemberDescrObject *)desc)->d_member->offset;
        Py_DECREF(desc);
    }
    return 0;
}

/* A SendResult with its seven slots set (references stolen: every one of them is owned). */
static PyObject *new_result(Sender *s, PyObject *const values[7]) {
    PyTypeObject *type = (PyTypeObject *)s->result_type;
    PyObject *obj = type->tp_alloc(type, 0);
    if (!obj) {
        for (int i = 0; i < 7; i++) Py_DECREF(values[i]);
        return NULL;
    }
    for (int i = 0; i < 7; i++) *(PyObject **)((char *)obj + s->result_slot[i]) = values[i];
    return obj;
}

/* ------------------------------------------------------------------ the whole-record CRC
 *
 * RocketMQ 5.x `enabledAppendPropCRC` (record.py's PROPERTY_CRC32 is the reference): a record's
 * properties end in \x02 and a reserved tail, ``__CRC32#`` \x01 + ten digits + \x02, encoded
 * outside the lock as the placeholder Python hands over; under the lock, once QUEUEOFFSET,
 * PHYSICALOFFSET and STORETIMESTAMP are written, the digits become the CRC of every byte before
 * the tail, least significant digit first (`MessageDecoder.createCrc32`). Three call sites: the
 * properties' length, the tail after them, the CRC in append_locked (computed before the lock,
 * finished under it: crc_prepare, crc_fill_prepared). */
#define CRC_TAIL_LEN 20 /* record.CRC32_RESERVED_LEN: __CRC32# \x01, ten digits, \x02 */
#define CRC_DIGITS_AT 9 /* the digits' place in the tail */

static int crc_tail_init(Sender *s, PyObject *placeholder) {
    if (!placeholder || !PyBytes_Check(placeholder) ||
        (PyBytes_GET_SIZE(placeholder) != 0 && PyBytes_GET_SIZE(placeholder) != CRC_TAIL_LEN)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "crc_placeholder: b'' or the CRC tail");
        return -1;
    }
    s->crc_tail_len = PyBytes_GET_SIZE(placeholder);
    memcpy(s->crc_tail, PyBytes_AS_STRING(placeholder), (size_t)s->crc_tail_len);
    return 0;
}

/* Bytes the CRC adds to properties that do not end in \x02 (the core's never do). */
static inline Py_ssize_t crc_extra(const Sender *s) { return s->crc_tail_len ? 1 + s->crc_tail_len : 0; }

/* The separator and the reserved tail after properties ending at `q`. */
static inline void crc_reserve(const Sender *s, uint8_t *q) {
    if (!s->crc_tail_len) return;
    q[0] = 2;
    memcpy(q + 1, s->crc_tail, (size_t)s->crc_tail_len);
}

/* The CRC outside the lock (issue 35). CRC-32 is affine in its input, so for records M and M0
 * of one length CRC(M) = CRC(M0) ^ raw(M ^ M0), `raw` being the register run from 0 with no final
 * inversion; and zeros before a difference add nothing to `raw`, zeros after it multiply it by
 * x^8 mod P each. The fields the lock fixes lie in [20, 64) (QUEUEOFFSET, PHYSICALOFFSET,
 * STORETIMESTAMP after an IPv4 born host, the only kind the core puts). So before the lock the
 * CRC of the record with those fields guessed (crc_guess: what one producer's put gets), its
 * digits, and per record length x^(8 (N - 64)) (crc_prepare); under the lock the three fields
 * compared with their guesses and, where a guess was wrong, six carry-less products, two
 * reductions and the digits again (crc_fill_prepared), the same few ns whatever the body's size.
 * Without PCLMULQDQ: the XOR of the 44 bytes by table, one multiplication by loop. */
#define CRC_WINDOW_AT POS_QUEUE_OFFSET
#define CRC_WINDOW_END (POS_STORE_TIMESTAMP + 8)

/* a * b mod P, both bit-reflected (bit 31 is x^0), as the CRC register holds them. */
static uint32_t crc_multiply_loop(uint32_t a, uint32_t b) {
    uint32_t product = 0;
    for (uint32_t m = 1u << 31; m; m >>= 1) {
        if (a & m) product ^= b;
        b = b & 1 ? (b >> 1) ^ 0xEDB88320u : b >> 1;
    }
    return product;
}

#ifdef RMQ_HAVE_CLMUL
/* The same by carry-less multiplication: reflected, the 63-bit product shifted left once holds
 * x^0..x^31 in its high word and x^32 times its low word's polynomial in the low word, which
 * Barrett's reduction (crc32_clmul_blocks' last step, its constants) folds in without the table. */
__attribute__((target("pclmul,sse4.1"))) static uint32_t crc_multiply_clmul(uint32_t a, uint32_t b) {
    const __m128i barrett = _mm_set_epi64x(0x01f7011641, 0x01db710641);
    const __m128i low32 = _mm_setr_epi32(~0, 0, ~0, 0);
    __m128i v = _mm_clmulepi64_si128(_mm_cvtsi32_si128((int)a), _mm_cvtsi32_si128((int)b), 0x00);
    v = _mm_slli_epi64(v, 1);
    __m128i t = _mm_clmulepi64_si128(_mm_and_si128(v, low32), barrett, 0x10);
    t = _mm_clmulepi64_si128(_mm_and_si128(t, low32), barrett, 0x00);
    return (uint32_t)_mm_extract_epi32(_mm_xor_si128(v, t), 1);
}
#endif

/* The 32-bit words of [20, 64) that the lock may change: QUEUEOFFSET, PHYSICALOFFSET, and
 * STORETIMESTAMP (its own offset: the bytes between are fixed before the lock). */
static const int CRC_WORD_AT[6] = {POS_QUEUE_OFFSET, POS_QUEUE_OFFSET + 4, POS_PHY_OFFSET, POS_PHY_OFFSET + 4,
                                   POS_STORE_TIMESTAMP, POS_STORE_TIMESTAMP + 4};

#ifdef RMQ_HAVE_CLMUL
/* XOR over k of d[k] * f[k] mod P: the products by carry-less multiplication, summed before the
 * one reduction they share (it is linear), so six words cost about one multiplication. */
__attribute__((target("pclmul,sse4.1"))) static uint32_t crc_multiply_sum6(const uint32_t d[6], const uint32_t f[6]) {
    const __m128i barrett = _mm_set_epi64x(0x01f7011641, 0x01db710641);
    const __m128i low32 = _mm_setr_epi32(~0, 0, ~0, 0);
    __m128i v = _mm_setzero_si128();
    for (int k = 0; k < 6; k++)
        v = _mm_xor_si128(v, _mm_clmulepi64_si128(_mm_cvtsi32_si128((int)d[k]), _mm_cvtsi32_si128((int)f[k]), 0x00));
    v = _mm_slli_epi64(v, 1);
    __m128i t = _mm_clmulepi64_si128(_mm_and_si128(v, low32), barrett, 0x10);
    t = _mm_clmulepi64_si128(_mm_and_si128(t, low32), barrett, 0x00);
    return (uint32_t)_mm_extract_epi32(_mm_xor_si128(v, t), 1);
}
#endif

static inline uint32_t crc_multiply(uint32_t a, uint32_t b) {
#ifdef RMQ_HAVE_CLMUL
    if (has_clmul) return crc_multiply_clmul(a, b);
#endif
    return crc_multiply_loop(a, b);
}

static uint32_t crc_x2n[64]; /* x^(2^k) mod P (crc_shift_init) */

static uint32_t crc_word_factor[6]; /* x^(8 (64 - CRC_WORD_AT[k])) mod P */
static uint32_t crc_x512;            /* x^(8 * 64) mod P */
/* x^(8 (13 - 4 k)) mod P: the UNIQ_KEY's 12 changing characters' words, 13, 9 and 5 bytes before
 * the end of the rest (its \x02 separator after them: crc_rest_template) */
static uint32_t crc_uniq_factor[3];

static uint32_t crc_shift_of(uint64_t n);

static void crc_shift_init(void) {
    uint32_t p = 1u << 30; /* x^1 */
    for (int k = 0; k < 64; k++, p = crc_multiply_loop(p, p)) crc_x2n[k] = p;
    for (int k = 0; k < 6; k++) crc_word_factor[k] = crc_shift_of((uint64_t)(CRC_WINDOW_END - CRC_WORD_AT[k]));
    crc_x512 = crc_shift_of(CRC_WINDOW_END);
    for (int k = 0; k < 3; k++) crc_uniq_factor[k] = crc_shift_of((uint64_t)(13 - 4 * k));
}

/* x^(8 n) mod P: what `n` zero bytes after a difference multiply its raw CRC by. */
static uint32_t crc_shift_of(uint64_t n) {
    uint32_t p = 1u << 31; /* x^0 */
    for (int k = 3; n; n >>= 1, k++)
        if (n & 1) p = crc_multiply(crc_x2n[k & 63], p);
    return p;
}

typedef struct CrcPrepared {
    uint32_t crc;   /* the CRC of the record's first N bytes with the lock's fields as guessed */
    uint32_t shift; /* x^(8 (N - 64)) mod P: what the raw CRC of a change in [20, 64) multiplies by */
} CrcPrepared;

/* The raw CRC (register from 0, no inversions) of `n` >= 64 bytes at `p`: by multiplication
 * where the CPU can, every byte of it where it lies (crc32_clmul_raw: no copy, and no byte by the
 * slice tables, which are cold by the next send), else by table. */
static inline uint32_t crc_raw(const uint8_t *p, Py_ssize_t n) {
#ifdef RMQ_HAVE_CLMUL
    if (has_clmul) return crc32_clmul_raw(p, (size_t)n);
#endif
    return ~crc32_of(~0u, p, (size_t)n);
}

/* The raw CRC of 0 <= `n` < 64 bytes at `p`, followed by at least 16 - n readable bytes. */
static inline uint32_t crc_raw_short(const uint8_t *p, Py_ssize_t n) {
    if (n == 0) return 0;
#ifdef RMQ_HAVE_CLMUL
    if (has_clmul) return crc32_clmul_raw_short(p, (size_t)n);
#endif
    return ~crc32_table(~0u, p, (size_t)n);
}

/* The raw CRC of `n` >= 0 bytes at `p`, followed by at least 16 readable bytes. */
static inline uint32_t crc_raw_any(const uint8_t *p, Py_ssize_t n) {
    return n >= 64 ? crc_raw(p, n) : crc_raw_short(p, n);
}

#ifdef RMQ_HAVE_CLMUL
/* The sum of 32 x 32-bit carry-less products `v` (its low 64 bits) mod P: crc_multiply_clmul's
 * reduction (the products' sum shifted once, Barrett on its low word). */
__attribute__((target("pclmul,sse4.1"))) static inline uint32_t crc_reduce_product(__m128i v) {
    const __m128i barrett = _mm_set_epi64x(0x01f7011641, 0x01db710641);
    const __m128i low32 = _mm_setr_epi32(~0, 0, ~0, 0);
    v = _mm_slli_epi64(v, 1);
    __m128i t = _mm_clmulepi64_si128(_mm_and_si128(v, low32), barrett, 0x10);
    t = _mm_clmulepi64_si128(_mm_and_si128(t, low32), barrett, 0x00);
    return (uint32_t)_mm_extract_epi32(_mm_xor_si128(v, t), 1);
}
#endif


/* The header's words a Sender's records differ in, each its own product in crc_record_encoded
 * (the rest are the Sender's, set once: MAGICCODE, SYSFLAG, the hosts, RECONSUMETIMES and
 * PREPAREDTRANSACTIONOFFSET, 0), in pairs as one 64-bit value gives them: QUEUEOFFSET and
 * PHYSICALOFFSET (guessed), BORNTIMESTAMP, STORETIMESTAMP (guessed), TOTALSIZE with QUEUEID, and
 * FLAG with BODYLENGTH, the header's last word (-4: fixed - 4). The body CRC field (8) is the
 * combine's own product. */
#define CRC_HEAD_WORDS 12
static const int CRC_HEAD_WORD_AT[CRC_HEAD_WORDS] = {POS_QUEUE_OFFSET,    POS_QUEUE_OFFSET + 4,    POS_PHY_OFFSET,
                                                     POS_PHY_OFFSET + 4,  40,                      44,
                                                     POS_STORE_TIMESTAMP, POS_STORE_TIMESTAMP + 4, 0,
                                                     12,                  16,                      -4};


/* The header's per-send words as the register reads them (little-endian loads of their bytes),
 * as the header holds them (crc_head_for). */
static void crc_head_words(uint32_t w[CRC_HEAD_WORDS], const uint8_t *r, Py_ssize_t fixed) {
    for (int k = 0; k < CRC_HEAD_WORDS; k++)
        memcpy(&w[k], r + (CRC_HEAD_WORD_AT[k] < 0 ? fixed : 0) + CRC_HEAD_WORD_AT[k], 4);
}

/* The Sender's header constants for encode_into's record `r` with a `fixed`-byte header, once
 * (a header length is the Sender's): each per-send word's factor, and the header's raw CRC with
 * those words (and the body CRC field) 0: read once here, their products taken out. It holds
 * for every record the Sender encodes: its other words are the Sender's, set once. */
static __attribute__((noinline, cold)) void crc_head_make(CrcState *st, const uint8_t *r, Py_ssize_t fixed) {
    for (int k = 0; k < CRC_HEAD_WORDS; k++)
        st->head_factor[k] = crc_shift_of((uint64_t)(CRC_HEAD_WORD_AT[k] < 0 ? -CRC_HEAD_WORD_AT[k]
                                                                               : fixed - CRC_HEAD_WORD_AT[k]));
    uint32_t w[CRC_HEAD_WORDS], h = crc_raw(r, fixed), field;
    crc_head_words(w, r, fixed);
    for (int k = 0; k < CRC_HEAD_WORDS; k++) h ^= crc_multiply(w[k], st->head_factor[k]);
    memcpy(&field, r + 8, 4); /* 0 as encode_into leaves it; taken out all the same */
    st->head_const = h ^ crc_multiply(field, crc_shift_of((uint64_t)(fixed - 8)));
    st->head_fixed = fixed;
    st->pairs_ready = 0; /* (a Sender's header length does not change: made once) */
}

static inline void crc_head_for(CrcState *st, const uint8_t *r, Py_ssize_t fixed) {
    if (__builtin_expect(fixed != st->head_fixed, 0)) crc_head_make(st, r, fixed);
}

/* What depends on a record's shape alone (`covered` bytes under the CRC, `fixed` of header, a
 * body of `body_len`, or -1: the record read whole), kept in `st` for the next record (a
 * sender's records mostly share one; a new shape costs a few dozen ns of multiplications). */
static __attribute__((noinline)) void crc_state_make(CrcState *st, Py_ssize_t covered, Py_ssize_t fixed,
                                                      Py_ssize_t body_len) {
    st->shift = crc_shift_of((uint64_t)(covered - CRC_WINDOW_END));
    st->ones = crc_multiply(crc_multiply(st->shift, crc_x512), ~0u);
    if (body_len >= 0) {
        uint32_t body_x = crc_shift_of((uint64_t)body_len);
        st->after_shift = crc_shift_of((uint64_t)(covered - fixed - body_len));
        st->head_shift = crc_multiply(body_x, st->after_shift);
        st->field_factor = crc_shift_of((uint64_t)(covered - 8));
        st->body_ones = crc_multiply(body_x, ~0u);
    }
    st->covered = covered, st->fixed = fixed, st->body_len = body_len;
    st->pairs_ready = 0, st->shape_seen = 0;
}

/* (the check inline, the making out of line: the send's CRC code stays a few cache lines) */
static inline void crc_state_for(CrcState *st, Py_ssize_t covered, Py_ssize_t fixed, Py_ssize_t body_len) {
    if (covered != st->covered || fixed != st->fixed || body_len != st->body_len)
        crc_state_make(st, covered, fixed, body_len);
}

/* The lock's fields as they will most likely be, written before crc_prepare: the queue's next
 * offset and the write position read now (racy reads: only a guess; the lock's values are
 * compared with it), and the born time, which the store time is when the lock is had at once.
 * With one producer the guess holds and the lock only compares three integers. */
static inline void crc_guess(uint8_t *r, int64_t queue_offset, int64_t phy_offset, int64_t store_ms) {
    put64(r + POS_QUEUE_OFFSET, (uint64_t)queue_offset);
    put64(r + POS_PHY_OFFSET, (uint64_t)phy_offset);
    put64(r + POS_STORE_TIMESTAMP, (uint64_t)store_ms);
}

/* The body's raw CRC from the CRC-32 encode_into left in QUEUEOFFSET (keep_body_crc):
 * crc = ~(raw ^ ~0 * x^(8 len)). */
static inline uint32_t crc_body_of(const uint8_t *r, const CrcState *st) {
    uint32_t crc;
    memcpy(&crc, r + POS_QUEUE_OFFSET, 4);
    return ~crc ^ st->body_ones;
}

#ifdef RMQ_HAVE_CLMUL
/* The lane pairs of CrcState.pair_factor: a 64-bit value's two 32-bit words as the register
 * reads them (little-endian), each times its factor into the record's raw CRC. */
enum {
    CRC_PAIR_QUEUE,    /* QUEUEOFFSET (guessed) */
    CRC_PAIR_PHY,      /* PHYSICALOFFSET (guessed) */
    CRC_PAIR_TIME,     /* BORNTIMESTAMP and STORETIMESTAMP as one (the store time guessed the born) */
    CRC_PAIR_STORE,    /* STORETIMESTAMP alone: where it differs from the born time */
    CRC_PAIR_QID_FLAG, /* QUEUEID and FLAG */
    CRC_PAIR_BODY,     /* the body's raw CRC (its factor after_shift) and the body CRC field */
    CRC_PAIR_UNIQ,     /* the UNIQ_KEY's first two changing words (crc_rest_template) */
    CRC_PAIR_UNIQ2,    /* its third, and 0 */
    CRC_PAIRS
};

/* The shape's pair factors and constant (CrcState.pair_factor), once a shape and header are known
 * (crc_state_for, crc_head_for): each per-send header word's factor times head_shift, so that its
 * product lands in the record's raw CRC directly, and the words this shape fixes (TOTALSIZE,
 * BODYLENGTH: `r`'s as encode_into wrote them) with head_const and the initial ~0 in one constant.
 * Fifteen multiplications (~35 ns), made at a shape's second record (crc_prepare): a shape's
 * first goes by crc_record_clmul_first, so records whose lengths change every send pay none. */
static __attribute__((noinline)) void crc_pairs_for(CrcState *st, const uint8_t *r, Py_ssize_t fixed) {
    uint32_t g[CRC_HEAD_WORDS], total, len; /* CRC_HEAD_WORD_AT's order */
    for (int k = 0; k < CRC_HEAD_WORDS; k++) g[k] = crc_multiply(st->head_factor[k], st->head_shift);
    uint64_t *f = st->pair_factor;
    f[2 * CRC_PAIR_QUEUE] = g[0], f[2 * CRC_PAIR_QUEUE + 1] = g[1];
    f[2 * CRC_PAIR_PHY] = g[2], f[2 * CRC_PAIR_PHY + 1] = g[3];
    f[2 * CRC_PAIR_TIME] = g[4] ^ g[6], f[2 * CRC_PAIR_TIME + 1] = g[5] ^ g[7]; /* (a + b) w = a w + b w */
    f[2 * CRC_PAIR_STORE] = g[6], f[2 * CRC_PAIR_STORE + 1] = g[7];
    f[2 * CRC_PAIR_QID_FLAG] = g[9], f[2 * CRC_PAIR_QID_FLAG + 1] = g[10];
    f[2 * CRC_PAIR_BODY] = st->after_shift, f[2 * CRC_PAIR_BODY + 1] = st->field_factor;
    f[2 * CRC_PAIR_UNIQ] = crc_uniq_factor[0], f[2 * CRC_PAIR_UNIQ + 1] = crc_uniq_factor[1];
    f[2 * CRC_PAIR_UNIQ2] = crc_uniq_factor[2], f[2 * CRC_PAIR_UNIQ2 + 1] = 0;
    memcpy(&total, r, 4), memcpy(&len, r + fixed - 4, 4);
    st->shape_const = crc_multiply(st->head_const, st->head_shift) ^ crc_multiply(total, g[8]) ^
                      crc_multiply(len, g[11]) ^ st->ones;
    st->pairs_ready = 1;
}

/* The rest's raw CRC by a pass (no template for it, or its constant to be made): out of line. */
__attribute__((target("pclmul,sse4.1,ssse3"), noinline)) static uint32_t crc_rest_pass(const uint8_t *rest,
                                                                                       Py_ssize_t rest_len) {
    return rest_len >= 64 ? crc32_clmul_raw(rest, (size_t)rest_len)
           : rest_len    ? crc32_clmul_raw_short(rest, (size_t)rest_len)
                         : 0;
}

/* The rest's raw CRC less its UNIQ_KEY's changing words (``uniq``: their products, unreduced):
 * the template's constant while the rest's length holds, else a pass, made the constant. */
__attribute__((target("pclmul,sse4.1,ssse3"))) static inline uint32_t crc_rest_const(const uint8_t *rest,
                                                                                     Py_ssize_t rest_len,
                                                                                     CrcTemplate *tpl, __m128i uniq) {
    if (tpl && tpl->rest_len == rest_len) return tpl->rest_const;
    uint32_t t = crc_rest_pass(rest, rest_len);
    if (tpl) {
        t ^= crc_reduce_product(uniq);
        tpl->rest_const = t, tpl->rest_len = rest_len, tpl->made += 1;
    }
    return t;
}

/* d's two 32-bit words times the pair factor k's, added into the accumulators lo and hi. */
#define CRC_PAIR_PRODUCT(lo, hi, d, st, k)                                                               \
    do {                                                                                                 \
        __m128i d_ = _mm_cvtepu32_epi64(_mm_cvtsi64_si128((long long)(d)));                              \
        __m128i f_ = _mm_loadu_si128((const __m128i *)&(st)->pair_factor[2 * (k)]);                       \
        lo = _mm_xor_si128(lo, _mm_clmulepi64_si128(d_, f_, 0x00));                                      \
        hi = _mm_xor_si128(hi, _mm_clmulepi64_si128(d_, f_, 0x11));                                      \
    } while (0)

/* crc_record_encoded by carry-less multiplication, compiled for it as one function. The record's
 * raw CRC is the shape's constant (crc_pairs_for), the rest's (its template's constant, or a pass)
 * and the products of the per-send words with their shape's factors: QUEUEOFFSET, PHYSICALOFFSET
 * and STORETIMESTAMP as guessed (from registers), BORNTIMESTAMP (one product pair with the store
 * time, which is guessed to be it), QUEUEID with FLAG, the body's raw CRC with the body CRC
 * field, and with a template the UNIQ_KEY's three changing words: all independent, one
 * reduction, nothing read that the record's stores have not just forwarded. */
__attribute__((target("pclmul,sse4.1,ssse3"))) static uint32_t crc_record_clmul(uint8_t *r, Py_ssize_t covered,
                                                                                Py_ssize_t fixed, Py_ssize_t body_len,
                                                                                const int64_t guess[3],
                                                                                const CrcState *st, CrcTemplate *tpl) {
    const uint8_t *rest = r + fixed + body_len;
    Py_ssize_t rest_len = covered - fixed - body_len;
    uint32_t b = crc_body_of(r, st), field;
    uint64_t born, qid_flag, store = __builtin_bswap64((uint64_t)guess[2]);
    memcpy(&born, r + 40, 8), memcpy(&field, r + 8, 4), memcpy(&qid_flag, r + 12, 8); /* each one store's */
    __m128i lo = _mm_setzero_si128(), hi = _mm_setzero_si128(), lo2 = _mm_setzero_si128(),
            hi2 = _mm_setzero_si128();
    CRC_PAIR_PRODUCT(lo, hi, __builtin_bswap64((uint64_t)guess[0]), st, CRC_PAIR_QUEUE);
    CRC_PAIR_PRODUCT(lo2, hi2, __builtin_bswap64((uint64_t)guess[1]), st, CRC_PAIR_PHY);
    CRC_PAIR_PRODUCT(lo, hi, born, st, CRC_PAIR_TIME);
    if (__builtin_expect(born != store, 0)) CRC_PAIR_PRODUCT(lo, hi, born ^ store, st, CRC_PAIR_STORE);
    CRC_PAIR_PRODUCT(lo2, hi2, qid_flag, st, CRC_PAIR_QID_FLAG);
    CRC_PAIR_PRODUCT(lo, hi, b | (uint64_t)field << 32, st, CRC_PAIR_BODY);
    /* the rest: its template's constant and the UNIQ_KEY's changing words' products; else one
     * pass (and the template's constant from it) */
    __m128i uniq = _mm_setzero_si128(), uniq2 = _mm_setzero_si128();
    if (tpl) {
        uint64_t id01;
        uint32_t id2;
        memcpy(&id01, rest + rest_len - 13, 8), memcpy(&id2, rest + rest_len - 5, 4);
        CRC_PAIR_PRODUCT(uniq, uniq2, id01, st, CRC_PAIR_UNIQ);
        uniq = _mm_xor_si128(uniq, _mm_clmulepi64_si128(_mm_cvtsi32_si128((int)id2),
                                                        _mm_loadu_si128((const __m128i *)&st->pair_factor[2 * CRC_PAIR_UNIQ2]),
                                                        0x00));
        uniq = _mm_xor_si128(uniq, uniq2);
    }
    uint32_t t = crc_rest_const(rest, rest_len, tpl, uniq);
    __m128i sum = _mm_xor_si128(_mm_xor_si128(lo, hi), _mm_xor_si128(lo2, hi2));
    return ~(crc_reduce_product(_mm_xor_si128(sum, uniq)) ^ t ^ st->shape_const);
}
#undef CRC_PAIR_PRODUCT

/* A shape's first record (its pair factors not made: crc_prepare makes them at its second, so
 * that records whose lengths change every send pay no premultiplication): the header's
 * products with the Sender's factors (head_factor) reduced, then that and the body's, the
 * field's and the rest's combined with the shape's shifts, a second reduction. */
__attribute__((target("pclmul,sse4.1,ssse3"), noinline)) static uint32_t crc_record_clmul_first(uint8_t *r, Py_ssize_t covered,
                                                                                Py_ssize_t fixed, Py_ssize_t body_len,
                                                                                const int64_t guess[3],
                                                                                const CrcState *st, CrcTemplate *tpl) {
    const uint8_t *rest = r + fixed + body_len;
    Py_ssize_t rest_len = covered - fixed - body_len;
    uint32_t b = crc_body_of(r, st), field;
    /* the header's per-send words (CRC_HEAD_WORD_AT), two to a lane from 64-bit values as the
     * register reads their bytes: the guesses from registers, the rest loaded as stored */
    uint64_t born, total_qid, flag_len;
    uint32_t total, qid, flag, len;
    memcpy(&born, r + 40, 8);
    memcpy(&total, r, 4), memcpy(&qid, r + 12, 4), memcpy(&flag, r + 16, 4), memcpy(&len, r + fixed - 4, 4);
    total_qid = total | (uint64_t)qid << 32, flag_len = flag | (uint64_t)len << 32;
    const uint64_t pairs[CRC_HEAD_WORDS / 2] = {__builtin_bswap64((uint64_t)guess[0]),
                                                __builtin_bswap64((uint64_t)guess[1]), born,
                                                __builtin_bswap64((uint64_t)guess[2]), total_qid, flag_len};
    __m128i v = _mm_setzero_si128(), u = _mm_setzero_si128();
#pragma GCC unroll 6
    for (int k = 0; k < CRC_HEAD_WORDS / 2; k++) {
        __m128i d = _mm_cvtepu32_epi64(_mm_cvtsi64_si128((long long)pairs[k]));
        __m128i f = _mm_loadl_epi64((const __m128i *)&st->head_factor[2 * k]);
        f = _mm_cvtepu32_epi64(f);
        v = _mm_xor_si128(v, _mm_clmulepi64_si128(d, f, 0x00));
        u = _mm_xor_si128(u, _mm_clmulepi64_si128(d, f, 0x11));
    }
    uint32_t h = st->head_const ^ crc_reduce_product(_mm_xor_si128(v, u));
    /* the rest: its template's constant and the UNIQ_KEY's changing words' products, summed with
     * the combine's (crc_rest_template); else one pass (and the template's constant from it) */
    __m128i uniq = _mm_setzero_si128();
    if (tpl) {
        uint32_t id[3];
        memcpy(id, rest + rest_len - 13, 12);
        for (int k = 0; k < 3; k++)
            uniq = _mm_xor_si128(uniq, _mm_clmulepi64_si128(_mm_cvtsi32_si128((int)id[k]),
                                                            _mm_cvtsi32_si128((int)crc_uniq_factor[k]), 0x00));
    }
    uint32_t t = crc_rest_const(rest, rest_len, tpl, uniq);
    memcpy(&field, r + 8, 4); /* the field's bytes as the register reads them (0 in head_const) */
    __m128i sum = _mm_xor_si128(
        _mm_xor_si128(_mm_clmulepi64_si128(_mm_cvtsi32_si128((int)h), _mm_cvtsi32_si128((int)st->head_shift), 0x00),
                      _mm_clmulepi64_si128(_mm_cvtsi32_si128((int)b), _mm_cvtsi32_si128((int)st->after_shift), 0x00)),
        _mm_clmulepi64_si128(_mm_cvtsi32_si128((int)field), _mm_cvtsi32_si128((int)st->field_factor), 0x00));
    return ~(crc_reduce_product(_mm_xor_si128(sum, uniq)) ^ t ^ st->ones);
}

#endif

/* The CRC of an encoded record's first `covered` bytes (issue 35), nothing of it read twice:
 * the body's CRC-32, computed by encode_into from where the body is before the record's stores
 * (and left for this: keep_body_crc), gives the body's raw CRC b; the rest (topic, properties)
 * is one pass, or with `tpl` its template's constant plus three products (crc_rest_template);
 * the header is not read: its raw CRC is the Sender's head_const plus its per-send words, from
 * registers, times their factors. The record's raw CRC is raw(header) * x^(8 (len + after)) ^ b
 * * x^(8 after) ^ raw(rest), plus the body CRC field's word times x^(8 (covered - 8)) (0 in
 * head_const). By multiplication every term is one product with a per-shape factor and all
 * share one reduction (crc_pairs_for, crc_record_clmul). Without PCLMULQDQ the guess is
 * written, the header read whole and the rest passed over (no template). */
static uint32_t crc_record_encoded(uint8_t *r, Py_ssize_t covered, Py_ssize_t fixed, Py_ssize_t body_len,
                                   const int64_t guess[3], const CrcState *st, CrcTemplate *tpl) {
#ifdef RMQ_HAVE_CLMUL
    if (has_clmul) return crc_record_clmul(r, covered, fixed, body_len, guess, st, tpl);
#endif
    (void)tpl; /* by table the rest is one pass */
    uint32_t b = crc_body_of(r, st);
    crc_guess(r, guess[0], guess[1], guess[2]);
    uint32_t h = crc_raw(r, fixed); /* the body CRC field in it */
    uint32_t t = crc_raw_any(r + fixed + body_len, covered - fixed - body_len);
    return ~(crc_multiply(h, st->head_shift) ^ crc_multiply(b, st->after_shift) ^ t ^ st->ones);
}

/* The ten digits of a whole-record CRC (31 bits) after the property's name, least significant
 * first (`MessageDecoder.createCrc32`): digit i is crc / 10^i - 10 * (crc / 10^(i+1)), each
 * quotient the compiler's own multiplication by a reciprocal, none waiting on another (the CRC
 * is ready just before the put lock is taken, which waits for these stores: nine independent
 * products of a few cycles' latency, where a chain of them cost ~3 ns more a send). */
static inline void crc_write_digits(uint8_t *r, Py_ssize_t covered, uint32_t crc) {
    uint8_t *digits = r + covered + CRC_DIGITS_AT;
    uint32_t q1 = crc / 10, q2 = crc / 100, q3 = crc / 1000, q4 = crc / 10000, q5 = crc / 100000,
             q6 = crc / 1000000, q7 = crc / 10000000, q8 = crc / 100000000, q9 = crc / 1000000000;
    digits[0] = (uint8_t)('0' + crc - 10 * q1);
    digits[1] = (uint8_t)('0' + q1 - 10 * q2);
    digits[2] = (uint8_t)('0' + q2 - 10 * q3);
    digits[3] = (uint8_t)('0' + q3 - 10 * q4);
    digits[4] = (uint8_t)('0' + q4 - 10 * q5);
    digits[5] = (uint8_t)('0' + q5 - 10 * q6);
    digits[6] = (uint8_t)('0' + q6 - 10 * q7);
    digits[7] = (uint8_t)('0' + q7 - 10 * q8);
    digits[8] = (uint8_t)('0' + q8 - 10 * q9);
    digits[9] = (uint8_t)('0' + q9);
}

/* Before the lock: the record `r` whose CRC covers its first `covered` bytes (>= 64), its
 * digits written as they will stand if the lock's fields are what the caller guessed (`guess`:
 * queue offset, physical offset, store time: in the CRC, not the record's bytes, which the lock
 * writes; crc_guess writes them where the header is read); crc_fill_prepared corrects them
 * under the lock where the guess was wrong. `encoded`: encode_into's record, its body's CRC-32
 * kept (keep_body_crc: crc_record_encoded); else the record is read whole as it is. */
static __attribute__((noinline)) uint32_t crc_prepare_other(uint8_t *r, Py_ssize_t covered, Py_ssize_t fixed,
                                                             int encoded, Py_ssize_t body_len, const int64_t guess[3],
                                                             CrcState *st, CrcTemplate *tpl) {
    crc_state_for(st, covered, fixed, body_len);
    if (encoded) /* (without PCLMULQDQ) */
        return crc_record_encoded(r, covered, fixed, body_len, guess, st,
                                  tpl && covered - fixed - body_len >= 13 ? tpl : NULL);
    crc_guess(r, guess[0], guess[1], guess[2]); /* the initial ~0 run through `covered` bytes, inverted */
    return ~(crc_raw(r, covered) ^ st->ones);
}

static void crc_prepare(uint8_t *r, Py_ssize_t covered, Py_ssize_t fixed, int encoded, const int64_t guess[3],
                        CrcState *st, CrcTemplate *tpl, CrcPrepared *out) {
    Py_ssize_t body_len = -1;
    if (encoded) {
        uint32_t be;
        memcpy(&be, r + fixed - 4, 4); /* BODYLENGTH, the header's last field */
        body_len = (Py_ssize_t)__builtin_bswap32(be);
    }
    uint32_t crc;
#ifdef RMQ_HAVE_CLMUL
    if (encoded && has_clmul) { /* a send's: the code kept to a few lines, the rest out of line */
        crc_head_for(st, r, fixed);
        crc_state_for(st, covered, fixed, body_len);
        CrcTemplate *t = tpl && covered - fixed - body_len >= 13 ? tpl : NULL;
        if (__builtin_expect(!st->pairs_ready, 0) && st->shape_seen++ > 0) crc_pairs_for(st, r, fixed);
        crc = st->pairs_ready ? crc_record_clmul(r, covered, fixed, body_len, guess, st, t)
                              : crc_record_clmul_first(r, covered, fixed, body_len, guess, st, t);
    } else
#endif
        crc = crc_prepare_other(r, covered, fixed, encoded, body_len, guess, st, tpl);
    out->crc = crc;
    out->shift = st->shift;
    crc_write_digits(r, covered, crc & 0x7FFFFFFFu);
}

/* The template for the send at hand's rest (s->crc_key), NULL where it has none. The
 * rest of a send in the common shape (CrcRestKey) is the same bytes for the same topic field, tags
 * and keys objects but for the UNIQ_KEY's time and counter, the 12 characters 13 to 1 bytes
 * before its end. So its raw CRC is a constant, that of the rest with those characters 0, plus
 * their three words times x^(8 (13 - 4 k)): three products summed with the combine's, in its one
 * reduction, where a pass over the ~55 bytes (and its constants) was most of the CRC's cost in a
 * real send (bench/NOTES.md, issue 35). Where the objects differ from the last send's, the
 * Sender's template takes references to them and its constant is made again from the first
 * record's pass (crc_record_clmul). */
static CrcTemplate *crc_rest_template(Sender *s) {
    CrcRestKey k = s->crc_key; /* append_locked clears it after this, whether asked or not */
    if (!k.topic) return NULL;
    CrcTemplate *t = &s->crc_tpl;
    if (t->topic != k.topic || t->tags != k.tags || t->keys != k.keys) {
        Py_XSETREF(t->topic, Py_NewRef(k.topic));
        Py_XSETREF(t->tags, Py_NewRef(k.tags));
        Py_XSETREF(t->keys, Py_NewRef(k.keys));
        t->rest_len = 0;
    }
    return t;
}

/* Under the lock, where the guess was wrong (another producer's put came first): the ten digits
 * after `covered` bytes and the property's name (`record.fill_record_crc`), from the prepared CRC
 * and what the lock's three fields differ by from their guesses (XORs); 0 where nothing differs
 * (the digits crc_prepare wrote stand). */
static int crc_fill_prepared(uint8_t *r, Py_ssize_t covered, const CrcPrepared *pre, int64_t queue_xor,
                             int64_t phy_xor, int64_t store_xor) {
    if (!(queue_xor | phy_xor | store_xor)) return 0;
    uint8_t x[CRC_WINDOW_END - CRC_WINDOW_AT] = {0}; /* [20, 64) as changed, XOR as guessed */
    put64(x + POS_QUEUE_OFFSET - CRC_WINDOW_AT, (uint64_t)queue_xor);
    put64(x + POS_PHY_OFFSET - CRC_WINDOW_AT, (uint64_t)phy_xor);
    put64(x + POS_STORE_TIMESTAMP - CRC_WINDOW_AT, (uint64_t)store_xor);
    uint32_t delta;
#ifdef RMQ_HAVE_CLMUL
    if (has_clmul) {
        /* a changed 32-bit word w at k, read little-endian as the register reads bytes, adds
         * raw(w) * x^(8 (N - k - 4)) = w * x^(8 (64 - k)) * x^(8 (N - 64)) */
        uint32_t d[6];
        for (int k = 0; k < 6; k++) memcpy(&d[k], x + CRC_WORD_AT[k] - CRC_WINDOW_AT, 4);
        delta = crc_multiply(pre->shift, crc_multiply_sum6(d, crc_word_factor));
    } else
#endif
        delta = crc_multiply(pre->shift, ~crc32_table(~0u, x, sizeof x));
    crc_write_digits(r, covered, (pre->crc ^ delta) & 0x7FFFFFFFu);
    return 1;
}

static inline int64_t get64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return (int64_t)__builtin_bswap64(v);
}

/* Test hook: _crc_fill_prepared(record: bytearray, tail_len, queue_offset, phy_offset, store_ms,
 * guess=None, fixed=0) prepares the record as it is (or with the lock's fields guessed: (queue_offset,
 * phy_offset, store_ms), as a put does), patches the three fields and fills the digits. With
 * `fixed` (the header's length, its last 4 bytes BODYLENGTH) the record is made as encode_into
 * leaves a send's (keep_body_crc: the body CRC field written, the body's CRC-32 kept in
 * QUEUEOFFSET) and its CRC computed from the header's fields (crc_record_encoded), twice: as a
 * shape's first record and as its second (by multiplication: two ways, which must agree). */
static PyObject *py_crc_fill_prepared(PyObject *self, PyObject *args) {
    Py_buffer rec;
    Py_ssize_t tail_len;
    long long queue_offset, phy_offset, store_ms;
    PyObject *guess = Py_None;
    long long guessed[3];
    Py_ssize_t fixed = 0;
    if (!PyArg_ParseTuple(args, "w*nLLL|On", &rec, &tail_len, &queue_offset, &phy_offset, &store_ms, &guess,
                          &fixed))
        return NULL;
    if (guess != Py_None && !PyArg_ParseTuple(guess, "LLL", &guessed[0], &guessed[1], &guessed[2])) {
        PyBuffer_Release(&rec);
        return NULL;
    }
    Py_ssize_t covered = rec.len - tail_len;
    if (tail_len < CRC_DIGITS_AT + 10 || covered < CRC_WINDOW_END) {
        PyBuffer_Release(&rec);
        return PyErr_Format(PyExc_ValueError, "a record of at least %d bytes and its CRC tail", CRC_WINDOW_END);
    }
    uint8_t *r = rec.buf;
    int64_t g[3];
    if (guess != Py_None)
        g[0] = guessed[0], g[1] = guessed[1], g[2] = guessed[2];
    else
        g[0] = get64(r + POS_QUEUE_OFFSET), g[1] = get64(r + POS_PHY_OFFSET), g[2] = get64(r + POS_STORE_TIMESTAMP);
    if (fixed) {
        uint32_t body_len = 0;
        if (fixed >= CRC_WINDOW_END + 4 && fixed <= covered) memcpy(&body_len, r + fixed - 4, 4);
        body_len = __builtin_bswap32(body_len);
        if (fixed < CRC_WINDOW_END + 4 || fixed > covered || (Py_ssize_t)body_len > covered - fixed) {
            PyBuffer_Release(&rec);
            /* BODYLENGTH after the lock's fields (a real header has 88 or 100 bytes) */
            return PyErr_Format(PyExc_ValueError, "a header of at least %d bytes whose body fits",
                                CRC_WINDOW_END + 4);
        }
        uint32_t crc = crc32_of(0, r + fixed, body_len); /* as encode_into leaves it (keep_body_crc) */
        put32(r + 8, crc & 0x7FFFFFFFu);
        memcpy(r + POS_QUEUE_OFFSET, &crc, 4);
    }
    CrcState st = {0};
    CrcPrepared pre, again;
    uint8_t window[CRC_WINDOW_END]; /* as it was: the table's way writes the guess over the body's CRC */
    memcpy(window, r, sizeof window);
    crc_prepare(r, covered, fixed, fixed != 0, g, &st, NULL, &pre);
    /* a second record of the shape: by multiplication, its premultiplied factors (crc_pairs_for) */
    memcpy(r, window, sizeof window);
    crc_prepare(r, covered, fixed, fixed != 0, g, &st, NULL, &again);
    if (again.crc != pre.crc || again.shift != pre.shift) {
        PyBuffer_Release(&rec);
        return PyErr_Format(PyExc_AssertionError, "a shape's second record's CRC %08x is not its first's %08x",
                            again.crc, pre.crc);
    }
    put64(r + POS_QUEUE_OFFSET, (uint64_t)queue_offset);
    put64(r + POS_PHY_OFFSET, (uint64_t)phy_offset);
    put64(r + POS_STORE_TIMESTAMP, (uint64_t)store_ms);
    crc_fill_prepared(r, covered, &pre, queue_offset ^ g[0], phy_offset ^ g[1], store_ms ^ g[2]);
    PyBuffer_Release(&rec);
    Py_RETURN_NONE;
}

/* Test hook: _crc_digits(crc) -> the ten digits crc_write_digits writes for 0 <= crc < 2^31. */
static PyObject *py_crc_digits(PyObject *self, PyObject *arg) {
    unsigned long crc = PyLong_AsUnsignedLong(arg);
    if (crc == (unsigned long)-1 && PyErr_Occurred()) return NULL;
    if (crc > 0x7FFFFFFFul) return PyErr_Format(PyExc_ValueError, "a CRC of 31 bits");
    uint8_t r[CRC_DIGITS_AT + 10];
    crc_write_digits(r, 0, (uint32_t)crc);
    return PyBytes_FromStringAndSize((const char *)r + CRC_DIGITS_AT, 10);
}

/* Sender(settings: dict): see rmq_mp/put/producer.py `Producer._native_settings` for the keys. */
static int Sender_init(Sender *s, PyObject *args, PyObject *kwds) {
    PyObject *d;
    if (!PyArg_ParseTuple(args, "O!", &PyDict_Type, &d)) return -1;
    int ok = 1;
    PyObject *words = dict_obj(d, "words", &ok);
    if (!ok) return -1;
    for (int i = 0; i < W_COUNT; i++) {
        s->w[i] = dict_i64(words, WORD_NAMES[i], &ok);
        if (!ok) return -1;
    }
    s->fence_word = dict_i64(d, "fence_word", &ok);
    s->accepting_state = dict_i64(d, "accepting_state", &ok);
    s->put_blockers = dict_i64(d, "put_blockers", &ok);
    s->stale_ms = dict_i64(d, "supervisor_stale_ms", &ok);
    s->max_lag = dict_i64(d, "max_dispatch_lag_bytes", &ok);
    s->pid = dict_i64(d, "pid", &ok);
    s->spin_ns = dict_i64(d, "spin_ns", &ok);
    s->slice_ms = dict_i64(d, "slice_ms", &ok);
    s->max_message_size = dict_i64(d, "max_message_size", &ok);
    if (crc_tail_init(s, dict_obj(d, "crc_placeholder", &ok)) < 0) return -1;
    s->prefault_at = LLONG_MAX; /* until the appender tells of a pool buffer */
    s->put_waits = 1;
    s->sync = (int)dict_i64(d, "sync", &ok);
    s->max_delay_level = dict_i64(d, "max_delay_level", &ok);
    s->m_reference = (Py_ssize_t)dict_i64(d, "reference_word", &ok);
    if (!ok) return -1;
    if (dict_i64(d, "reference_reasons", &ok) != REF_COUNT) {
        if (ok) PyErr_SetString(PyExc_ValueError, "reference_reasons disagree with the core's REF_* reasons");
        return -1;
    }
    if (hold(&s->table, dict_obj(d, "table", &ok), 1) < 0) return -1;
    if (hold(&s->queues, dict_obj(d, "queues", &ok), 1) < 0) return -1;
    if (hold(&s->uniq_state, dict_obj(d, "uniq_state", &ok), 1) < 0) return -1;
    if (s->uniq_state.view.len < 24) {
        PyErr_SetString(PyExc_ValueError, "uniq_state holds counter, month start and next month");
        return -1;
    }
    for (int i = 0; i < W_COUNT; i++)
        if (s->w[i] < 0 || (s->w[i] + 1) * 8 > s->table.view.len) {
            PyErr_Format(PyExc_ValueError, "word %s outside the table", WORD_NAMES[i]);
            return -1;
        }
    if (s->fence_word < 0 || (s->fence_word + 1) * 8 > s->table.view.len) {
        PyErr_SetString(PyExc_ValueError, "word FENCE outside the table");
        return -1;
    }
    PyObject *prefix = dict_obj(d, "uniq_prefix", &ok);
    if (!ok) return -1;
    Py_ssize_t plen;
    const char *p = PyUnicode_AsUTF8AndSize(prefix, &plen);
    if (!p) return -1;
    if (plen != 20) {
        PyErr_SetString(PyExc_ValueError, "uniq_prefix is 20 hex characters (IPv4 client)");
        return -1;
    }
    memcpy(s->uniq_prefix, p, 20);
    int born_len;
    if (parse_host(dict_obj(d, "born_ip", &ok), dict_i64(d, "born_port", &ok), s->hosts.born_ip, &born_len,
                   &s->hosts.born_port) < 0)
        return -1;
    if (parse_host(dict_obj(d, "store_ip", &ok), dict_i64(d, "store_port", &ok), s->hosts.store_ip,
                   &s->hosts.store_ip_len, &s->hosts.store_port) < 0)
        return -1;
    if (born_len != 4) {
        PyErr_SetString(PyExc_ValueError, "a producer's own born host is IPv4");
        return -1;
    }
    s->hosts.sys_flag = s->hosts.store_ip_len == 16 ? STOREHOST_V6_FLAG : 0;
    if (s->sync) {
        if (hold(&s->ring, dict_obj(d, "ring", &ok), 1) < 0) return -1;
        s->ring_capacity = dict_i64(d, "ring_capacity", &ok);
        s->ring_base = dict_i64(d, "ring_base", &ok);
        s->ring_slot_size = dict_i64(d, "ring_slot_size", &ok);
        s->ring_state = dict_i64(d, "ring_state", &ok);
        s->ring_next = dict_i64(d, "ring_next_offset", &ok);
        s->ring_deadline = dict_i64(d, "ring_deadline_ms", &ok);
        s->ring_pid = dict_i64(d, "ring_pid", &ok);
        s->ring_started = dict_i64(d, "ring_started_ns", &ok);
        s->gather_word = dict_i64(d, "gather_word", &ok);
        s->ring_free = dict_i64(d, "FREE", &ok);
        s->ring_waiting = dict_i64(d, "WAITING", &ok);
        s->ring_done_ok = dict_i64(d, "DONE_OK", &ok);
        s->ring_done_timeout = dict_i64(d, "DONE_TIMEOUT", &ok);
        s->ring_abandoned = dict_i64(d, "ABANDONED", &ok);
        s->sync_flush_timeout_ms = dict_i64(d, "sync_flush_timeout_ms", &ok);
        PyObject *names = dict_obj(d, "flush_done_names", &ok);
        if (!ok) return -1;
        if (!PyList_Check(names) || PyList_GET_SIZE(names) != s->ring_capacity || s->ring_capacity < 1 ||
            s->ring_base + s->ring_capacity * s->ring_slot_size > s->ring.view.len ||
            s->gather_word < 0 || (s->gather_word + 1) * 8 > s->table.view.len) {
            PyErr_SetString(PyExc_ValueError, "flush ring settings disagree");
            return -1;
        }
        Py_INCREF(names);
        s->flush_done_names = names;
        s->flush_done = PyMem_Calloc((size_t)s->ring_capacity, sizeof(sem_t *));
        if (!s->flush_done) {
            PyErr_NoMemory();
            return -1;
        }
    }
    if (replica_init(s, d) < 0) return -1;
    PyObject *wakes = dict_obj(d, "wakes", &ok); /* list of (notified word, semaphore name) */
    if (!ok) return -1;
    if (!PyList_Check(wakes) || PyList_GET_SIZE(wakes) > MAX_WAKES) {
        PyErr_SetString(PyExc_ValueError, "wakes: at most two (word, name) pairs");
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(wakes); i++) {
        PyObject *pair = PyList_GET_ITEM(wakes, i);
        PyObject *word, *name;
        if (!PyArg_ParseTuple(pair, "OO", &word, &name)) return -1;
        s->wake_word[i] = PyLong_AsSsize_t(word);
        if (s->wake_word[i] < 0 || (s->wake_word[i] + 1) * 8 > s->table.view.len) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "wake word outside the table");
            return -1;
        }
        s->wake_sem[i] = open_sem(name);
        if (!s->wake_sem[i]) return -1;
        s->wakes = (int)i + 1;
    }
    PyObject *metrics = dict_obj(d, "metrics", &ok);
    if (!ok) return -1;
    if (metrics != Py_None) {
        PyObject *buf, *bounds;
        if (!PyArg_ParseTuple(metrics, "OnnnnnnO", &buf, &s->m_puts, &s->m_failures, &s->m_latency_sum,
                              &s->m_latency_buckets, &s->m_hold_sum, &s->m_hold_buckets, &bounds))
            return -1;
        if (hold(&s->metrics, buf, 1) < 0) return -1;
        Py_ssize_t nb = PySequence_Size(bounds);
        if (nb < 1 || nb > MAX_BOUNDS) {
            PyErr_SetString(PyExc_ValueError, "metrics bounds");
            return -1;
        }
        for (Py_ssize_t i = 0; i < nb; i++) {
            PyObject *b = PySequence_GetItem(bounds, i);
            if (!b) return -1;
            s->bounds[i] = PyLong_AsLongLong(b);
            Py_DECREF(b);
        }
        s->n_bounds = (int)nb;
        Py_ssize_t top = s->m_hold_buckets + nb + 1;
        if (top * 8 > s->metrics.view.len || s->m_latency_buckets + nb + 1 > s->metrics.view.len / 8) {
            PyErr_SetString(PyExc_ValueError, "metrics slot outside its segment");
            return -1;
        }
        s->has_metrics = 1;
        if (s->m_reference >= 0 && (s->m_reference + REF_COUNT) * 8 > s->metrics.view.len) {
            PyErr_SetString(PyExc_ValueError, "reference_sends outside the metrics segment");
            return -1;
        }
    }
    if (!s->has_metrics) s->m_reference = -1;
    s->result_type = Py_NewRef(dict_obj(d, "result_type", &ok));
    if (!ok) return -1;
    if (find_result_slots(s) < 0) return -1;
    s->put_ok = Py_NewRef(dict_obj(d, "PUT_OK", &ok));
    if (!ok) return -1;
    s->flush_timeout = Py_NewRef(dict_obj(d, "FLUSH_DISK_TIMEOUT", &ok));
    if (!ok) return -1;
    s->msg_id_prefix = Py_NewRef(dict_obj(d, "msg_id_prefix", &ok));
    if (!ok) return -1;
    s->ring_full_reason = Py_NewRef(dict_obj(d, "ring_full_reason", &ok));
    if (!ok) return -1;
    s->not_flushed_reason = Py_NewRef(dict_obj(d, "not_flushed_reason", &ok));
    if (!ok) return -1;
    s->empty = PyUnicode_FromString("");
    s->schedule_topic = PyUnicode_InternFromString("SCHEDULE_TOPIC_XXXX");
    if (!s->schedule_topic) return -1;
    s->topics = PyDict_New();
    s->dest = Py_NewRef(Py_None);
    s->fd = -1;
    s->last_hold_ns = -1;
    if (!s->empty || !s->topics) return -1;
    return 0;
}

static inline int64_t *words_of(Held *h) { return (int64_t *)h->view.buf; }

static int grow_scratch(Sender *s, Py_ssize_t n) {
    if (n <= s->scratch_len) return 0;
    Py_ssize_t want = n < 4096 ? 4096 : n;
    uint8_t *p = PyMem_Realloc(s->scratch, (size_t)want);
    if (!p) {
        PyErr_NoMemory();
        return -1;
    }
    s->scratch = p;
    s->scratch_len = want;
    return 0;
}

static inline int has_separator(const char *p, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        if ((unsigned char)p[i] <= 2 && p[i] != 0) return 1;
    return 0;
}

static const char HEX[] = "0123456789ABCDEF";

/* A flush-request ring slot for [.., end) (put lock held): `Appender._request_flush`. It carries
 * when the send began (s->send_started_ns, set by each send before the lock). */
static int64_t take_ring_slot(Sender *s, int64_t end, int64_t now_ms) {
    int64_t *w = words_of(&s->table);
    int64_t *ring = words_of(&s->ring);
    int64_t ticket = w[s->w[W_FLUSH_SEQ]];
    for (int64_t i = 0; i < s->ring_capacity; i++) {
        ticket += 1;
        int64_t slot = ticket % s->ring_capacity;
        int64_t base = (s->ring_base + slot * s->ring_slot_size) >> 3;
        int64_t state = ring[base + (s->ring_state >> 3)];
        if (state == s->ring_free ||
            (state != s->ring_waiting && ring[base + (s->ring_deadline >> 3)] + 1000 < now_ms)) {
            ring[base + (s->ring_next >> 3)] = end;
            ring[base + (s->ring_deadline >> 3)] = now_ms + s->sync_flush_timeout_ms;
            ring[base + (s->ring_pid >> 3)] = s->pid;
            ring[base + (s->ring_started >> 3)] = s->send_started_ns; /* the gather's age bound */
            __atomic_store_n(&ring[base + (s->ring_state >> 3)], s->ring_waiting, __ATOMIC_RELEASE);
            w[s->w[W_FLUSH_SEQ]] = ticket;
            s->ring_ticket = ticket;
            return slot;
        }
    }
    w[s->w[W_FLUSH_SEQ]] = ticket;
    return -1;
}

/* WAITING -> ABANDONED (`FlushRequestRing.abandon`), as one compare-and-swap: the flusher may
 * complete the slot between the waiter's last read and this store, and a plain store would turn
 * its DONE_* answer into ABANDONED. Returns the state it found: WAITING (now abandoned), a DONE_*
 * answer (collected here, the slot freed), or another's state (the slot was reused: left as it is). */
static int64_t give_up(Sender *s, int64_t *state) {
    int64_t seen = s->ring_waiting;
    if (__atomic_compare_exchange_n(state, &seen, s->ring_abandoned, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return seen;
    if (seen == s->ring_done_ok || seen == s->ring_done_timeout) *state = s->ring_free;
    return seen;
}

/* Wait for ring slot `slot` to be completed (GIL held on entry and exit; released while
 * sleeping). 1 DONE_OK, 0 timed out, -1 with an exception (a signal handler raised). */
static int wait_for_flush(Sender *s, int64_t slot) {
    int64_t *ring = words_of(&s->ring);
    int64_t *state = &ring[((s->ring_base + slot * s->ring_slot_size) >> 3) + (s->ring_state >> 3)];
    if (!s->flush_done[slot]) {
        s->flush_done[slot] = open_sem(PyList_GET_ITEM(s->flush_done_names, slot));
        if (!s->flush_done[slot]) return -1;
    }
    sem_t *sem = s->flush_done[slot];
    int64_t deadline = real_ns() + s->sync_flush_timeout_ms * 1000000;
    PAUSE_POINT(PAUSE_FLUSH_WAIT);
    for (;;) {
        int64_t st = __atomic_load_n(state, __ATOMIC_ACQUIRE);
        if (st == s->ring_done_ok || st == s->ring_done_timeout) {
            *state = s->ring_free;
            return st == s->ring_done_ok;
        }
        int64_t now = real_ns();
        if (now >= deadline) { /* the flusher is not answering (stopped, or dead) */
            PAUSE_POINT(PAUSE_FLUSH_TIMED_OUT);
            return give_up(s, state) == s->ring_done_ok;
        }
        struct timespec ts = {(time_t)(deadline / 1000000000), (long)(deadline % 1000000000)};
        int rc, err = 0;
        Py_BEGIN_ALLOW_THREADS rc = sem_timedwait(sem, &ts);
        if (rc < 0) err = errno;
        Py_END_ALLOW_THREADS
        if (rc < 0 && err == EINTR && PyErr_CheckSignals() < 0) {
            give_up(s, state);
            return -1;
        }
    }
}

static inline void record_metrics(Sender *s, int64_t latency_ns, Py_ssize_t puts, Py_ssize_t failed,
                                  int64_t hold_ns) {
    if (!s->has_metrics) return;
    int64_t *m = words_of(&s->metrics);
    int64_t latency_us = latency_ns / 1000;
    m[s->m_puts] += puts;
    if (failed) m[s->m_failures] += failed;
    m[s->m_latency_sum] += latency_us;
    int k = 0;
    while (k < s->n_bounds && s->bounds[k] < latency_us) k++;
    m[s->m_latency_buckets + k] += 1;
    if (hold_ns >= 0) {
        int64_t hold_us = hold_ns / 1000;
        m[s->m_hold_sum] += hold_us;
        k = 0;
        while (k < s->n_bounds && s->bounds[k] < hold_us) k++;
        m[s->m_hold_buckets + k] += 1;
    }
}

/* The topic's entry and the queue's offset-table slot and next-offset word, as learned from the
 * reference (`Sender.learn`). 1 found, 0 not (the reference's), -1 with an exception. */
static int find_queue(Sender *s, PyObject *topic, long long queue_id, PyObject **topic_field, int64_t *slot,
                      Py_ssize_t *next_word) {
    PyObject *entry;
    if (topic == s->last_topic) {
        entry = s->last_entry;
    } else {
        entry = PyDict_GetItemWithError(s->topics, topic);
        if (!entry) return PyErr_Occurred() ? -1 : 0;
        Py_INCREF(topic);
        Py_XSETREF(s->last_topic, topic);
        Py_INCREF(entry);
        Py_XSETREF(s->last_entry, entry);
    }
    PyObject *queues = PyTuple_GET_ITEM(entry, 2);
    if (queue_id >= PyList_GET_SIZE(queues)) return 0; /* the list is the topic's queue limit long */
    PyObject *qentry = PyList_GET_ITEM(queues, queue_id);
    if (qentry == Py_None) return 0;
    *topic_field = PyTuple_GET_ITEM(entry, 0);
    *slot = PyLong_AsLongLong(PyTuple_GET_ITEM(qentry, 0));
    *next_word = PyLong_AsSsize_t(PyTuple_GET_ITEM(qentry, 1));
    if (*next_word < 0 || (*next_word + 1) * 8 > s->queues.view.len) {
        PyErr_SetString(PyExc_IndexError, "queue word outside the queue-offset table");
        return -1;
    }
    return 1;
}

/* RocketMQ's checks before the lock (`Producer._refusal`): 1 when a put may go ahead. A refusal
 * is the reference's to word. */
/* Whether `queue_id` is below the limit learned for `topic` (`learn`, `learn_topic`), whether
 * or not this producer has put to that queue yet: a delayed send's own queue. */
static int topic_has_queue(Sender *s, PyObject *topic, long long queue_id) {
    PyObject *entry = topic == s->last_topic ? s->last_entry : PyDict_GetItem(s->topics, topic);
    return entry && queue_id < PyList_GET_SIZE(PyTuple_GET_ITEM(entry, 2));
}

static inline int may_put(Sender *s, int64_t now_ms) {
    int64_t *w = words_of(&s->table);
    return w[s->w[W_STATE]] == s->accepting_state && now_ms - w[s->w[W_HEARTBEAT]] <= s->stale_ms &&
           !(w[s->w[W_FLAGS]] & s->put_blockers) &&
           !(s->max_lag && w[s->w[W_WROTE]] - w[s->w[W_REPUT_FROM]] > s->max_lag);
}

/* `tags` (None or a str without the property separators) as UTF-8; 1 usable, 0 the reference's. */
static int plain_text(PyObject *text, const char **p, Py_ssize_t *n) {
    *p = NULL;
    *n = 0;
    if (text == Py_None) return 1;
    if (!PyUnicode_CheckExact(text)) return 0;
    *p = PyUnicode_AsUTF8AndSize(text, n);
    if (!*p) {
        PyErr_Clear();
        return 0;
    }
    return !has_separator(*p, *n);
}

/* Write [TAGS][KEYS]UNIQ_KEY\x01 + the 32-character id of `counter` at `born_ms` (as
 * `properties_text`); returns the id's address. */
static uint8_t *write_properties(Sender *s, uint8_t *q, const char *tags, Py_ssize_t tags_n, const char *keys,
                                 Py_ssize_t keys_n, int64_t born_ms, int64_t counter) {
    if (tags_n) {
        memcpy(q, "TAGS\x01", 5);
        memcpy(q + 5, tags, (size_t)tags_n);
        q[5 + tags_n] = 2;
        q += 6 + tags_n;
    }
    if (keys_n) {
        memcpy(q, "KEYS\x01", 5);
        memcpy(q + 5, keys, (size_t)keys_n);
        q[5 + keys_n] = 2;
        q += 6 + keys_n;
    }
    memcpy(q, "UNIQ_KEY\x01", 9);
    uint8_t *id = q + 9;
    int64_t *uniq = words_of(&s->uniq_state);
    memcpy(id, s->uniq_prefix, 20);
    uint32_t month_ms = (uint32_t)(born_ms - uniq[1]);
    for (int i = 0; i < 8; i++) id[20 + i] = (uint8_t)HEX[(month_ms >> (28 - 4 * i)) & 0xF];
    for (int i = 0; i < 4; i++) id[28 + i] = (uint8_t)HEX[((uint32_t)counter >> (12 - 4 * i)) & 0xF];
    return id;
}

typedef struct {
    int64_t wrote, queue_offset, store_ts, ring_slot, hold_ns, released_ns;
    int64_t replica_slot; /* SYNC_MASTER: its replica request (REPLICA_* below, or a slot) */
} Placed;

/* ------------------------------------------------------------------ SYNC_MASTER: the replica wait
 *
 * rmq_mp/put/replica_wait.py is the reference (and shm/replica_requests.py the ring's states,
 * shm/flush_requests.py their moves): under the put lock, a put that waits for the store takes
 * a replica-request ticket for its end offset (`replica_take`), unless no slave is connected or
 * the best acknowledged offset is haSlaveFallbehindMax or more behind (SLAVE_NOT_AVAILABLE at
 * once, RocketMQ's isSlaveOK); off the lock it pokes the ha worker's select and sleeps on its
 * slot's semaphore until the ha worker answers or slaveTimeout from the put's time (the lock
 * hold's), never from a wake-up, passes (`replica_wait`: the same deadline as the ha worker's,
 * so a big message taking many frames gets no fresh timeout per wake: RocketMQ #1244, #1535).
 * Outcomes other than PUT_OK are counted by the reference's own `ReplicaRequests.count` (the
 * counters are written under the flags lock). */

#define REPLICA_NO_SLAVE (-2)      /* replica_wait.NO_SLAVE */
#define REPLICA_NOT_REQUESTED (-3) /* replica_wait.NOT_REQUESTED */

/* The replica ring's slot `slot`, field at byte offset `field` (a word index into the ring). */
static inline int64_t *replica_word(Sender *s, int64_t slot, int64_t field) {
    Replica *r = &s->rep;
    return &words_of(&r->ring)[((r->base + slot * r->slot_size) >> 3) + (field >> 3)];
}

/* Put lock held: a ring slot for the bytes below `end` (`ReplicaRequests.request`), NO_SLAVE,
 * or -1 when every slot is taken (`FlushRequestRing.take`'s moves, its STALE_MS reuse too). */
static int64_t replica_take(Sender *s, int64_t end, int64_t put_ms) {
    Replica *r = &s->rep;
    int64_t *w = words_of(&s->table);
    if (__atomic_load_n(&w[r->connections_word], __ATOMIC_ACQUIRE) <= 0 ||
        end - __atomic_load_n(&w[r->acked_word], __ATOMIC_ACQUIRE) >= r->fallbehind_max)
        return REPLICA_NO_SLAVE;
    int64_t ticket = w[r->seq_word];
    for (int64_t i = 0; i < r->capacity; i++) {
        ticket += 1;
        int64_t slot = ticket % r->capacity;
        int64_t state = __atomic_load_n(replica_word(s, slot, r->f_state), __ATOMIC_ACQUIRE);
        if (state == r->st_free || (state != r->st_waiting && *replica_word(s, slot, r->f_deadline) + r->stale_ms < put_ms)) {
            *replica_word(s, slot, r->f_next) = end;
            *replica_word(s, slot, r->f_deadline) = put_ms + r->timeout_ms;
            *replica_word(s, slot, r->f_pid) = s->pid;
            __atomic_store_n(replica_word(s, slot, r->f_state), r->st_waiting, __ATOMIC_RELEASE);
            /* published after its slot says WAITING: the ha worker reads the sequence unlocked */
            __atomic_store_n(&w[r->seq_word], ticket, __ATOMIC_RELEASE);
            return slot;
        }
    }
    w[r->seq_word] = ticket; /* as the reference: the lap's last ticket, none of them taken */
    return -1;
}

/* `ReplicaRequests.wake`: one datagram to the ha worker's abstract address (a full buffer or a
 * restarting worker loses it, which costs one of its looks). */
static void replica_poke(Sender *s) {
    Replica *r = &s->rep;
    if (r->poke_fd >= 0)
        (void)sendto(r->poke_fd, "", 1, MSG_DONTWAIT, (struct sockaddr *)&r->poke_addr, r->poke_len);
}

/* WAITING -> ABANDONED by compare-and-swap (`give_up` for this ring): the state found. */
static int64_t replica_give_up(Sender *s, int64_t *state) {
    Replica *r = &s->rep;
    int64_t seen = r->st_waiting;
    if (__atomic_compare_exchange_n(state, &seen, r->st_abandoned, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return seen;
    if (seen == r->st_done_ok || seen == r->st_done_timeout) *state = r->st_free;
    return seen;
}

/* Wait for slot `slot` until the put's time + slaveTimeout (GIL released while sleeping):
 * 1 DONE_OK, 0 not acknowledged in time, -1 with an exception (a signal handler raised). */
static int replica_wait(Sender *s, int64_t slot, int64_t put_ms) {
    Replica *r = &s->rep;
    int64_t *state = replica_word(s, slot, r->f_state);
    if (!r->done[slot]) {
        r->done[slot] = open_sem(PyList_GET_ITEM(r->done_names, slot));
        if (!r->done[slot]) {
            replica_give_up(s, state);
            return -1;
        }
    }
    int64_t deadline = (put_ms + r->timeout_ms) * 1000000;
    for (;;) {
        int64_t st = __atomic_load_n(state, __ATOMIC_ACQUIRE);
        if (st == r->st_done_ok || st == r->st_done_timeout) {
            __atomic_store_n(state, r->st_free, __ATOMIC_RELEASE);
            return st == r->st_done_ok;
        }
        if (real_ns() >= deadline) /* the ha worker is not answering (stopped, dead, or slow) */
            return replica_give_up(s, state) == r->st_done_ok;
        struct timespec ts = {(time_t)(deadline / 1000000000), (long)(deadline % 1000000000)};
        int rc, err = 0;
        Py_BEGIN_ALLOW_THREADS rc = sem_timedwait(r->done[slot], &ts);
        if (rc < 0) err = errno;
        Py_END_ALLOW_THREADS
        if (rc < 0 && err == EINTR && PyErr_CheckSignals() < 0) {
            replica_give_up(s, state);
            return -1;
        }
    }
}

/* After the flush's answer (`Producer._acknowledge`): SYNC_MASTER's, when the put took a ticket
 * or was refused one. A flush failure stays the answer (RocketMQ's handleDiskFlush before
 * handleHA); the replica outcome is waited for and counted either way, as the reference does. */
static int replica_acknowledge(Sender *s, const Placed *p, PyObject **status, PyObject **reason) {
    Replica *r = &s->rep;
    if (!r->on || p->replica_slot == REPLICA_NOT_REQUESTED) return 0;
    int no_slave = p->replica_slot == REPLICA_NO_SLAVE;
    PyObject *why;
    if (no_slave) {
        why = r->no_slave_reason;
    } else if (p->replica_slot < 0) {
        why = r->ring_full_reason;
    } else {
        replica_poke(s);
        int ok = replica_wait(s, p->replica_slot, p->store_ts);
        if (ok < 0) return -1;
        if (ok) return 0;
        why = r->timeout_reason;
    }
    if (*status == s->put_ok) {
        *status = no_slave ? r->slave_not_available : r->flush_slave_timeout;
        *reason = why;
    }
    PyObject *counted = PyObject_CallOneArg(r->count, no_slave ? Py_True : Py_False);
    if (!counted) return -1;
    Py_DECREF(counted);
    return 0;
}

/* Sender(settings)["replica"]: None, or the ring, its layout and the outcomes' objects
 * (`Producer._native_settings`). */
static int replica_init(Sender *s, PyObject *d) {
    Replica *r = &s->rep;
    r->poke_fd = -1;
    int ok = 1;
    PyObject *rd = dict_obj(d, "replica", &ok);
    if (!ok) return -1;
    if (rd == Py_None) return 0;
    if (!PyDict_Check(rd)) {
        PyErr_SetString(PyExc_TypeError, "replica: None or a dict");
        return -1;
    }
    if (hold(&r->ring, dict_obj(rd, "ring", &ok), 1) < 0) return -1;
    r->capacity = dict_i64(rd, "capacity", &ok);
    r->base = dict_i64(rd, "base", &ok);
    r->slot_size = dict_i64(rd, "slot_size", &ok);
    r->f_state = dict_i64(rd, "state", &ok);
    r->f_next = dict_i64(rd, "next_offset", &ok);
    r->f_deadline = dict_i64(rd, "deadline_ms", &ok);
    r->f_pid = dict_i64(rd, "pid", &ok);
    r->st_free = dict_i64(rd, "FREE", &ok);
    r->st_waiting = dict_i64(rd, "WAITING", &ok);
    r->st_done_ok = dict_i64(rd, "DONE_OK", &ok);
    r->st_done_timeout = dict_i64(rd, "DONE_TIMEOUT", &ok);
    r->st_abandoned = dict_i64(rd, "ABANDONED", &ok);
    r->stale_ms = dict_i64(rd, "stale_ms", &ok);
    r->seq_word = (Py_ssize_t)dict_i64(rd, "seq_word", &ok);
    r->acked_word = (Py_ssize_t)dict_i64(rd, "acked_word", &ok);
    r->connections_word = (Py_ssize_t)dict_i64(rd, "connections_word", &ok);
    r->timeout_ms = dict_i64(rd, "timeout_ms", &ok);
    r->fallbehind_max = dict_i64(rd, "fallbehind_max", &ok);
    PyObject *names = dict_obj(rd, "done_names", &ok), *wake = dict_obj(rd, "wake_address", &ok);
    PyObject *objs[6] = {dict_obj(rd, "SLAVE_NOT_AVAILABLE", &ok), dict_obj(rd, "FLUSH_SLAVE_TIMEOUT", &ok),
                         dict_obj(rd, "no_slave_reason", &ok),      dict_obj(rd, "timeout_reason", &ok),
                         dict_obj(rd, "ring_full_reason", &ok),     dict_obj(rd, "count", &ok)};
    if (!ok) return -1;
    Py_ssize_t words = s->table.view.len / 8;
    if (!PyList_Check(names) || PyList_GET_SIZE(names) != r->capacity || r->capacity < 1 || r->base < 0 ||
        r->base + r->capacity * r->slot_size > r->ring.view.len || r->seq_word < 0 || r->seq_word >= words ||
        r->acked_word < 0 || r->acked_word >= words || r->connections_word < 0 || r->connections_word >= words ||
        !PyBytes_Check(wake) || PyBytes_GET_SIZE(wake) < 2 ||
        (size_t)PyBytes_GET_SIZE(wake) > sizeof r->poke_addr.sun_path || !PyCallable_Check(objs[5])) {
        PyErr_SetString(PyExc_ValueError, "replica ring settings disagree");
        return -1;
    }
    r->done_names = Py_NewRef(names);
    r->slave_not_available = Py_NewRef(objs[0]);
    r->flush_slave_timeout = Py_NewRef(objs[1]);
    r->no_slave_reason = Py_NewRef(objs[2]);
    r->timeout_reason = Py_NewRef(objs[3]);
    r->ring_full_reason = Py_NewRef(objs[4]);
    r->count = Py_NewRef(objs[5]);
    r->done = PyMem_Calloc((size_t)r->capacity, sizeof(sem_t *));
    if (!r->done) {
        PyErr_NoMemory();
        return -1;
    }
    r->poke_addr.sun_family = AF_UNIX;
    memcpy(r->poke_addr.sun_path, PyBytes_AS_STRING(wake), (size_t)PyBytes_GET_SIZE(wake));
    r->poke_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + (size_t)PyBytes_GET_SIZE(wake));
    r->poke_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (r->poke_fd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    r->on = 1;
    return 0;
}

/* close(): the shared views, semaphores and the poke socket (the objects stay until dealloc). */
static void replica_release(Sender *s) {
    Replica *r = &s->rep;
    r->on = 0;
    unhold(&r->ring);
    if (r->done) {
        for (int64_t i = 0; i < r->capacity; i++)
            if (r->done[i]) sem_close(r->done[i]);
        PyMem_Free(r->done);
        r->done = NULL;
    }
    if (r->poke_fd >= 0) close(r->poke_fd);
    r->poke_fd = -1;
}

static void replica_dealloc(Sender *s) {
    Replica *r = &s->rep;
    Py_CLEAR(r->done_names);
    Py_CLEAR(r->slave_not_available);
    Py_CLEAR(r->flush_slave_timeout);
    Py_CLEAR(r->no_slave_reason);
    Py_CLEAR(r->timeout_reason);
    Py_CLEAR(r->ring_full_reason);
    Py_CLEAR(r->count);
}

/* The fence, right after the put lock is taken: 1 when this start is fenced (someone stops it or
 * starts over it: rmq_mp/put/fence.py), the lock released again so the reference words the
 * refusal. A word read: the fencer sets it under this lock, so no put lands after its hold. */
static inline int fenced(Sender *s, int64_t *w, uint32_t *lock) {
    if (__atomic_load_n(&w[s->fence_word], __ATOMIC_ACQUIRE) == 0) return 0;
    lock_release(lock);
    return 1;
}

/* The two shared words the whole-record CRC's guess reads before the lock (append_locked: the
 * write position and the queue's next offset), asked for as soon as the send knows its queue, so
 * that their lines, which the store's workers and other producers write, arrive while the record
 * is encoded rather than on the CRC's path. */
static inline void crc_guess_prefetch(Sender *s, Py_ssize_t next_word) {
    if (!s->crc_tail_len) return;
    __builtin_prefetch(&words_of(&s->table)[s->w[W_WROTE]]);
    __builtin_prefetch(&words_of(&s->queues)[next_word]);
}

/* The put lock's work for scratch[0, size): `n` records, record i at starts[i] (starts NULL: one
 * record at 0), of the queue whose next offset is queues[next_word]; `encoded`: the records are
 * encode_into's with the body's CRC-32 kept for the whole-record CRC (else read whole:
 * crc_prepare). The journal first, then the
 * bytes, the queue's next offset and the write position (the commit point), as
 * `Appender._write_chunk`; counters; a flush request under SYNC. 1 done, 0 the reference's
 * (nothing changed: the records do not fit the cached file, or the lock was not had within a
 * slice), -1 with an exception. */
/* (s->why says why when this hands back; s->put_waits whether a SYNC flush request is made.) */
static int append_locked(Sender *s, Py_ssize_t size, Py_ssize_t n, const Py_ssize_t *starts,
                         int encoded, int64_t slot, Py_ssize_t next_word, int64_t born_ms,
                         Placed *out) {
    int64_t *w = words_of(&s->table);
    uint32_t *lock = (uint32_t *)&w[s->w[W_LOCK]];
    uint32_t pid = (uint32_t)s->pid;
    /* The store time is read when the lock is taken; taken at once, the born time's reading a
     * few hundred ns earlier is that (clock reads are 35-40 ns each on these VMs). */
    int64_t store_ts = born_ms;
    CrcPrepared one_crc, *crcs = &one_crc;
    int64_t guess_wrote = 0, guess_queue = 0;
    CrcTemplate *tpl = s->crc_tail_len && encoded ? crc_rest_template(s) : NULL;
    s->crc_key.topic = NULL; /* the key is the one call's */
    if (s->crc_tail_len) { /* the whole-record CRC's work before the lock (crc_prepare) */
        if (n > 1 && (size_t)n > s->crc_pre_len) {
            CrcPrepared *grown = PyMem_Realloc(s->crc_pre, (size_t)n * sizeof(CrcPrepared));
            if (!grown) {
                PyErr_NoMemory();
                return -1;
            }
            s->crc_pre = grown;
            s->crc_pre_len = (size_t)n;
        }
        if (n > 1) crcs = s->crc_pre;
        guess_wrote = __atomic_load_n(&w[s->w[W_WROTE]], __ATOMIC_RELAXED);
        guess_queue = __atomic_load_n(&words_of(&s->queues)[next_word], __ATOMIC_RELAXED);
        for (Py_ssize_t i = 0; i < n; i++) {
            uint8_t *r = s->scratch + (starts ? starts[i] : 0);
            int64_t guess[3] = {guess_queue + i, guess_wrote + (starts ? starts[i] : 0), born_ms};
            crc_prepare(r, (starts ? (i + 1 < n ? starts[i + 1] : size) - starts[i] : size) - s->crc_tail_len,
                        fixed_size(&s->hosts), encoded, guess, &s->crc_state, tpl, &crcs[i]);
        }
    }
    if (!lock_try(lock, pid)) {
        int got;
        int64_t deadline = mono_ns() + s->spin_ns + s->slice_ms * 1000000;
        Py_BEGIN_ALLOW_THREADS got = lock_wait(lock, pid, s->spin_ns, deadline);
        Py_END_ALLOW_THREADS
        if (!got) { /* a long hold, a dead owner, a busy lock: the reference decides */
            s->why = REF_STORE;
            return 0;
        }
        store_ts = real_ms();
    }
    if (fenced(s, w, lock)) return 0;
    int64_t acquired_ns = mono_ns();
    w[s->w[W_LOCK_SINCE]] = store_ts;
    PAUSE_POINT(PAUSE_LOCKED);
    int64_t wrote = w[s->w[W_WROTE]];
    int64_t position = wrote - s->file_from_offset;
    int use_pwrite = s->dest_is_file && size >= s->pwrite_min_bytes;
    Held dest = {0};
    int ok = s->dest != Py_None && position >= 0 &&
             position <= s->file_size - size - END_FILE_MIN_BLANK_LENGTH && wrote + size <= s->reserved_until;
    if (ok && !use_pwrite) {
        if (hold(&dest, s->dest, 1) < 0)
            ok = -1;
        else if (position + size > dest.view.len) {
            unhold(&dest);
            PyErr_SetString(PyExc_AssertionError, "the cached file's buffer is shorter than its file");
            ok = -1;
        }
    }
    if (ok != 1) { /* a new file or a reservation first: the reference's */
        w[s->w[W_LOCK_SINCE]] = 0;
        lock_release(lock);
        return ok;
    }
    int64_t *qwords = words_of(&s->queues);
    int64_t queue_offset = qwords[next_word];
    /* the whole-record CRC's digits stand where its guess of the lock's fields held */
    int crc_missed = s->crc_tail_len && (queue_offset != guess_queue || wrote != guess_wrote || store_ts != born_ms);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t at = starts ? starts[i] : 0;
        uint8_t *r = s->scratch + at;
        put64(r + POS_QUEUE_OFFSET, (uint64_t)(queue_offset + i));
        put64(r + POS_PHY_OFFSET, (uint64_t)(wrote + at));
        put64(r + POS_STORE_TIMESTAMP, (uint64_t)store_ts);
        if (crc_missed)
            s->crc_misses += crc_fill_prepared(r, (starts ? (i + 1 < n ? starts[i + 1] : size) - at : size) - s->crc_tail_len,
                                               &crcs[i], (queue_offset + i) ^ (guess_queue + i),
                                               (wrote + at) ^ (guess_wrote + at), store_ts ^ born_ms);
    }
    int64_t end = wrote + size;
    /* shm/put_journal.py's protocol: the journal, the bytes, the queue offset, the commit point */
    w[s->w[W_J_BEFORE]] = wrote;
    w[s->w[W_J_AFTER]] = end;
    w[s->w[W_J_SLOT]] = slot;
    w[s->w[W_J_QUEUE_OFFSET]] = queue_offset;
    __atomic_store_n(&w[s->w[W_J_ACTIVE]], 1, __ATOMIC_RELEASE);
    PAUSE_POINT(PAUSE_JOURNALLED);
    if (use_pwrite) {
        Py_ssize_t done = 0;
        while (done < size) {
            ssize_t k = pwrite(s->fd, s->scratch + done, (size_t)(size - done), position + done);
            if (k < 0) {
                if (errno == EINTR) continue;
                int err = errno;
                w[s->w[W_LOCK_SINCE]] = 0; /* the journal stays: the next taker's undo zeroes it */
                lock_release(lock);
                errno = err;
                PyErr_SetFromErrno(PyExc_OSError);
                return -1;
            }
            done += k;
        }
    } else {
        memcpy((char *)dest.view.buf + position, s->scratch, (size_t)size);
        unhold(&dest);
    }
    PAUSE_POINT(PAUSE_COPIED);
    qwords[next_word] = queue_offset + n;
    __atomic_store_n(&w[s->w[W_WROTE]], end, __ATOMIC_RELEASE);
    __atomic_store_n(&w[s->w[W_J_ACTIVE]], 0, __ATOMIC_RELEASE);
    w[s->w[W_LAST_STORE_TS]] = store_ts;
    w[s->w[W_PUT_COUNT]] += n;
    w[s->w[W_PUT_BYTES]] += size;
    out->ring_slot = s->sync && s->put_waits ? take_ring_slot(s, end, store_ts) : -1;
    out->replica_slot = s->rep.on && s->put_waits ? replica_take(s, end, store_ts) : REPLICA_NOT_REQUESTED;
    w[s->w[W_LOCK_SINCE]] = 0;
    lock_release(lock);
    out->released_ns = mono_ns();
    out->hold_ns = out->released_ns - acquired_ns;
    out->wrote = wrote;
    out->queue_offset = queue_offset;
    out->store_ts = store_ts;
    s->last_hold_ns = out->hold_ns;
    /* wake the committer or flusher, and reput (`Producer._wake_workers`) */
    for (int i = 0; i < s->wakes; i++)
        if (w[s->wake_word[i]] == 0) {
            w[s->wake_word[i]] = 1;
            sem_post(s->wake_sem[i]);
        }
    /* the request the flusher's gather waits for last wakes it (`FlushRequests.wake_gather`); the
     * fence orders the ticket's store before this load, as the flusher stores, then reads */
    if (out->ring_slot >= 0 && s->wakes) {
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        if (__atomic_load_n(&w[s->gather_word], __ATOMIC_RELAXED) == s->ring_ticket) sem_post(s->wake_sem[0]);
    }
    /* the next stretch of the pool buffer populated in this process, off the lock (the Python
     * decides what and when: shm.transient_pool.prefault); the put stands whatever it raises */
    if (end >= s->prefault_at && s->prefault) {
        PyObject *r = PyObject_CallNoArgs(s->prefault);
        if (r)
            Py_DECREF(r);
        else
            PyErr_WriteUnraisable(s->prefault);
    }
    return 1;
}

/* What the put was promised (`Producer._acknowledge`): under SYNC_FLUSH, its flush, waited for
 * with the GIL released. Sets the status and reason (borrowed); -1 with an exception. */
static int acknowledge(Sender *s, const Placed *p, int64_t end, PyObject **status, PyObject **reason) {
    *status = s->put_ok;
    *reason = s->empty;
    if (!s->sync) return replica_acknowledge(s, p, status, reason);
    int flushed;
    if (p->ring_slot < 0) {
        flushed = 0;
        *reason = s->ring_full_reason;
    } else {
        flushed = wait_for_flush(s, p->ring_slot);
        if (flushed < 0) return -1;
        if (!flushed) *reason = s->not_flushed_reason;
    }
    int64_t *w = words_of(&s->table);
    if (!flushed)
        *status = s->flush_timeout;
    else if (w[s->w[W_FLUSHED]] < end) {
        PyErr_Format(PyExc_AssertionError, "acknowledged %lld above flushed %lld", (long long)end,
                     (long long)w[s->w[W_FLUSHED]]);
        return -1;
    }
    return replica_acknowledge(s, p, status, reason);
}

/* A queue id and flag the store takes: 1, else 0 (the reference words the refusal). */
static int plain_ids(PyObject *qid_obj, PyObject *flag_obj, long long *queue_id, long long *flag) {
    int overflow;
    if (!PyLong_CheckExact(flag_obj) || !PyLong_CheckExact(qid_obj)) return 0;
    *queue_id = PyLong_AsLongLongAndOverflow(qid_obj, &overflow);
    if (overflow || *queue_id < 0 || *queue_id > INT32_MAX) return 0;
    *flag = PyLong_AsLongLongAndOverflow(flag_obj, &overflow);
    return !overflow && *flag >= INT32_MIN && *flag <= INT32_MAX;
}

/* ------------------------------------------------------------------ a send's properties
 *
 * `properties_text` and `schedule.delayed_put` in C: the properties string a send stores, built
 * in s->pbuf entry by entry (`props_put`), so that one more property is one more call. */

static inline void count_reference(Sender *s, int why, Py_ssize_t n) {
    if (s->m_reference >= 0) words_of(&s->metrics)[s->m_reference + why] += n;
}

static int grow_buffer(uint8_t **buf, Py_ssize_t *cap, Py_ssize_t n) {
    if (n <= *cap) return 0;
    Py_ssize_t want = n < 1024 ? 1024 : n * 2;
    uint8_t *p = PyMem_Realloc(*buf, (size_t)want);
    if (!p) {
        PyErr_NoMemory();
        return -1;
    }
    *buf = p;
    *cap = want;
    return 0;
}

typedef struct {
    Py_ssize_t len;       /* bytes of s->pbuf used */
    Py_ssize_t id_at;     /* where our UNIQ_KEY's 32 characters go; -1: the properties gave one */
    PyObject *uniq_given; /* borrowed: the UNIQ_KEY the properties gave */
    int wait;             /* WAIT absent or "true" (`waits_for_store`) */
    int32_t level;        /* > 0: delayed, at this (clamped) level */
} Props;

/* Append `name\x01value`, after a \x02 unless it is the first (`messageProperties2String`). */
static int props_put(Sender *s, Props *pr, const char *name, Py_ssize_t nn, const char *value, Py_ssize_t vn) {
    if (grow_buffer(&s->pbuf, &s->pbuf_len, pr->len + nn + vn + 2) < 0) return -1;
    uint8_t *q = s->pbuf + pr->len;
    if (pr->len) *q++ = 2;
    memcpy(q, name, (size_t)nn);
    q[nn] = 1;
    memcpy(q + nn + 1, value, (size_t)vn);
    pr->len = (q + nn + 1 + vn) - s->pbuf;
    return 0;
}

/* Our UNIQ_KEY entry, its 32 characters written once the counter is taken (`write_uniq`). */
static int props_put_uniq(Sender *s, Props *pr) {
    static const char blank[UNIQ_KEY_LEN] = {0};
    if (props_put(s, pr, "UNIQ_KEY", 8, blank, UNIQ_KEY_LEN) < 0) return -1;
    pr->id_at = pr->len - UNIQ_KEY_LEN;
    return 0;
}

/* The 32-character id of `counter` at `born_ms` (`UniqueIdGenerator.next_id`) at `id`. */
static void write_uniq(Sender *s, uint8_t *id, int64_t born_ms, int64_t counter) {
    int64_t *uniq = words_of(&s->uniq_state);
    memcpy(id, s->uniq_prefix, 20);
    uint32_t month_ms = (uint32_t)(born_ms - uniq[1]);
    for (int i = 0; i < 8; i++) id[20 + i] = (uint8_t)HEX[(month_ms >> (28 - 4 * i)) & 0xF];
    for (int i = 0; i < 4; i++) id[28 + i] = (uint8_t)HEX[((uint32_t)counter >> (12 - 4 * i)) & 0xF];
}

/* A str's UTF-8: 1, or 0 (s->why set) when it is not an exact str or has no UTF-8 (a lone surrogate). */
static int utf8_of(Sender *s, PyObject *text, const char **p, Py_ssize_t *n) {
    if (!PyUnicode_CheckExact(text)) {
        s->why = REF_ARGUMENT;
        return 0;
    }
    *p = PyUnicode_AsUTF8AndSize(text, n);
    if (*p) return 1;
    PyErr_Clear();
    s->why = REF_REFUSED;
    return 0;
}

/* `schedule.parse_level`: the DELAY value as a Java int (`Integer.parseInt`); 0 when it is none. */
static int parse_level(const char *p, Py_ssize_t n, int64_t *level) {
    Py_ssize_t i = 0;
    int negative = 0;
    if (n && (p[0] == '+' || p[0] == '-')) {
        negative = p[0] == '-';
        i = 1;
    }
    if (i == n) return 0;
    int64_t v = 0;
    for (; i < n; i++) {
        if (p[i] < '0' || p[i] > '9') return 0;
        v = v * 10 + (p[i] - '0');
        if (v > ((int64_t)1 << 31)) return 0;
    }
    v = negative ? -v : v;
    if (v < INT32_MIN || v > INT32_MAX) return 0;
    *level = v;
    return 1;
}

/* Keys (None, a str, or a list or tuple of str joined by spaces: `keys_text`) as UTF-8, in
 * s->kbuf when joined. *present: `if keys` (a non-empty sequence counts even if its text is ''). */
static int keys_of(Sender *s, PyObject *keys, const char **p, Py_ssize_t *n, int *present) {
    *p = "";
    *n = 0;
    *present = 0;
    if (keys == Py_None) return 1;
    if (PyUnicode_CheckExact(keys)) {
        if (!utf8_of(s, keys, p, n)) return 0;
        *present = *n > 0;
        return 1;
    }
    if (!PyList_CheckExact(keys) && !PyTuple_CheckExact(keys)) {
        s->why = REF_ARGUMENT;
        return 0;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(keys), at = 0;
    PyObject **items = PySequence_Fast_ITEMS(keys);
    for (Py_ssize_t i = 0; i < count; i++) {
        const char *k;
        Py_ssize_t kn;
        if (!utf8_of(s, items[i], &k, &kn)) return 0;
        if (grow_buffer(&s->kbuf, &s->kbuf_len, at + kn + 1) < 0) return -1;
        if (i) s->kbuf[at++] = ' ';
        memcpy(s->kbuf + at, k, (size_t)kn);
        at += kn;
    }
    *p = (const char *)s->kbuf;
    *n = at;
    *present = count > 0;
    return 1;
}

static PyObject *DELAY_NAME; /* "DELAY", interned at import */

/* `value` >= 0 in decimal at `out` (room for its digits); its length. */
static Py_ssize_t decimal(char *out, long long value) {
    char digits[20];
    Py_ssize_t n = 0;
    do {
        digits[n++] = (char)('0' + value % 10);
        value /= 10;
    } while (value > 0);
    for (Py_ssize_t i = 0; i < n; i++) out[i] = digits[n - 1 - i];
    return n;
}

static inline int is_name(const char *p, Py_ssize_t n, const char *name) {
    return (Py_ssize_t)strlen(name) == n && memcmp(p, name, (size_t)n) == 0;
}

/* The properties string of a send (`properties_text`, then `schedule.delayed_put` when its DELAY
 * is a level above 0): 1 built in s->pbuf, 0 the reference's (s->why), -1 with an exception.
 * `topic` and `queue_id` are the real ones (REAL_TOPIC, REAL_QID of a delayed put). */
static int build_props(Sender *s, PyObject *tags, PyObject *keys, PyObject *props, PyObject *topic,
                       long long queue_id, Props *pr) {
    pr->len = 0;
    pr->id_at = -1;
    pr->uniq_given = NULL;
    pr->wait = 1;
    pr->level = 0;
    const char *tags_p = "", *keys_p;
    Py_ssize_t tags_n = 0, keys_n;
    int keys_present, rc;
    if (tags != Py_None && !utf8_of(s, tags, &tags_p, &tags_n)) return 0;
    if ((rc = keys_of(s, keys, &keys_p, &keys_n, &keys_present)) <= 0) return rc;
    s->why = REF_REFUSED; /* for every refusal below */
    if (has_separator(tags_p, tags_n) || has_separator(keys_p, keys_n)) return 0;
    Py_ssize_t entries = 0;
    if (props != Py_None) {
        if (!PyDict_CheckExact(props)) {
            s->why = REF_ARGUMENT;
            return 0;
        }
        entries = PyDict_GET_SIZE(props);
    }
    if (!entries) { /* the common shape: TAGS, KEYS, UNIQ_KEY */
        if (tags_n && props_put(s, pr, "TAGS", 4, tags_p, tags_n) < 0) return -1;
        if (keys_present && props_put(s, pr, "KEYS", 4, keys_p, keys_n) < 0) return -1;
        if (props_put_uniq(s, pr) < 0) return -1;
        return 1;
    }
    /* DELAY first: whether the entries are rewritten (clamped DELAY, REAL_TOPIC, REAL_QID) */
    char level_text[16], qid_text[16];
    Py_ssize_t level_n = 0, qid_n = 0, topic_n = 0;
    const char *topic_p = "";
    int clamped = 0;
    PyObject *delay = PyDict_GetItemWithError(props, DELAY_NAME); /* interned: no str made a send */
    if (!delay && PyErr_Occurred()) return -1;
    if (delay) {
        const char *d;
        Py_ssize_t dn;
        int64_t level;
        if (!utf8_of(s, delay, &d, &dn)) return 0;
        if (!parse_level(d, dn, &level)) {
            s->why = REF_REFUSED;
            return 0;
        }
        if (level > 0) {
            clamped = level > s->max_delay_level;
            pr->level = (int32_t)(clamped ? s->max_delay_level : level);
            level_n = decimal(level_text, pr->level); /* not snprintf: 12% of a delayed send */
            qid_n = decimal(qid_text, queue_id);
            if (!utf8_of(s, topic, &topic_p, &topic_n)) return 0;
        }
    }
    int tags_done = 0, keys_done = 0, topic_done = 0, qid_done = 0;
    Py_ssize_t pos = 0;
    PyObject *name_o, *value_o;
    while (PyDict_Next(props, &pos, &name_o, &value_o)) {
        const char *name, *value;
        Py_ssize_t nn, vn;
        if (!utf8_of(s, name_o, &name, &nn) || !utf8_of(s, value_o, &value, &vn)) return 0;
        s->why = REF_REFUSED;
        if (has_separator(name, nn)) return 0;
        if (tags_n && is_name(name, nn, "TAGS")) { /* props[TAGS] = tags: the given value is not stored */
            value = tags_p, vn = tags_n, tags_done = 1;
        } else if (keys_present && is_name(name, nn, "KEYS")) {
            value = keys_p, vn = keys_n, keys_done = 1;
        } else {
            if (has_separator(value, vn)) return 0;
            if (is_name(name, nn, "UNIQ_KEY")) pr->uniq_given = value_o;
            if (is_name(name, nn, "WAIT")) pr->wait = vn == 4 && memcmp(value, "true", 4) == 0;
            if (pr->level) {
                if (clamped && is_name(name, nn, "DELAY")) value = level_text, vn = level_n;
                if (is_name(name, nn, "REAL_TOPIC")) value = topic_p, vn = topic_n, topic_done = 1;
                if (is_name(name, nn, "REAL_QID")) value = qid_text, vn = qid_n, qid_done = 1;
            }
        }
        if (pr->level && (!nn || !vn)) continue; /* delayed: the string went through string2messageProperties */
        if (props_put(s, pr, name, nn, value, vn) < 0) return -1;
    }
    if (tags_n && !tags_done && props_put(s, pr, "TAGS", 4, tags_p, tags_n) < 0) return -1;
    if (keys_present && !keys_done && !(pr->level && !keys_n) && props_put(s, pr, "KEYS", 4, keys_p, keys_n) < 0)
        return -1;
    if (!pr->uniq_given && props_put_uniq(s, pr) < 0) return -1;
    if (pr->level) {
        if (!topic_done && props_put(s, pr, "REAL_TOPIC", 10, topic_p, topic_n) < 0) return -1;
        if (!qid_done && props_put(s, pr, "REAL_QID", 8, qid_text, qid_n) < 0) return -1;
    }
    return 1;
}

/* The reserved CRC tail after the properties built in s->pbuf (`crc_reserve`), in pr->len. */
static int props_put_crc(Sender *s, Props *pr) {
    if (!s->crc_tail_len) return 0;
    if (grow_buffer(&s->pbuf, &s->pbuf_len, pr->len + crc_extra(s)) < 0) return -1;
    crc_reserve(s, s->pbuf + pr->len);
    pr->len += crc_extra(s);
    return 0;
}

/* A body: bytes, or any C-contiguous buffer (bytearray, memoryview, numpy array) held in `view`
 * until the record is encoded. 1, or 0 (s->why) when it is none of them. */
static int body_of(Sender *s, PyObject *body, Py_buffer *view, const uint8_t **p, Py_ssize_t *n) {
    view->obj = NULL;
    if (PyBytes_CheckExact(body)) {
        *p = (const uint8_t *)PyBytes_AS_STRING(body);
        *n = PyBytes_GET_SIZE(body);
        return 1;
    }
    s->why = REF_ARGUMENT;
    if (PyUnicode_Check(body) || PyLong_Check(body) || !PyObject_CheckBuffer(body)) return 0;
    if (PyObject_GetBuffer(body, view, PyBUF_SIMPLE) < 0) { /* not contiguous: memoryview().tobytes() */
        PyErr_Clear();
        view->obj = NULL;
        return 0;
    }
    *p = view->buf;
    *n = view->len;
    return 1;
}

/* One message (topic, body, tags, keys, properties, queue_id, flag) stored, or None before
 * anything shared changed (s->why says why): the reference's. Sender_send_kw's fast path. */
static PyObject *Sender_send(Sender *s, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) return PyErr_Format(PyExc_TypeError, "send takes 7 arguments");
    s->why = REF_STORE;
    if (s->closed) Py_RETURN_NONE;
    int64_t started_ns = mono_ns();
    s->send_started_ns = started_ns;
    PyObject *topic = args[0], *body = args[1], *tags = args[2], *keys = args[3], *props = args[4],
             *qid_obj = args[5], *flag_obj = args[6];
    long long queue_id, flag;
    s->why = REF_ARGUMENT;
    if (!PyUnicode_CheckExact(topic) || !plain_ids(qid_obj, flag_obj, &queue_id, &flag)) Py_RETURN_NONE;
    s->why = REF_NEW_QUEUE;
    if (started_ns >= s->fresh_until_ns) Py_RETURN_NONE; /* topics.json to be looked at again */
    PyObject *topic_field;
    int64_t slot;
    Py_ssize_t next_word;
    int found = find_queue(s, topic, queue_id, &topic_field, &slot, &next_word);
    if (found < 0) return NULL;
    if (found) crc_guess_prefetch(s, next_word);
    /* a delayed send's own queue is not put to: it needs only to be one of the topic's */
    if (!found && (props == Py_None || !topic_has_queue(s, topic, queue_id))) Py_RETURN_NONE;
    Py_buffer view;
    const uint8_t *body_p;
    Py_ssize_t body_len;
    if (!body_of(s, body, &view, &body_p, &body_len)) Py_RETURN_NONE;
    PyObject *result = NULL, *uniq_str = NULL;
    Props pr;
    int built = build_props(s, tags, keys, props, topic, queue_id, &pr);
    if (built < 0 || (built && props_put_crc(s, &pr) < 0)) goto done;
    if (!built) goto hand_back;
    s->why = REF_NEW_QUEUE;
    if (!found && !pr.level) goto hand_back;
    s->why = REF_REFUSED;
    if (body_len > s->max_message_size || pr.len > MAX_PROPERTIES_BYTES) goto hand_back;
    long long record_queue_id = queue_id;
    if (pr.level) { /* `CommitLog.asyncPutMessage`'s delay rewrite: SCHEDULE_TOPIC_XXXX, level - 1 */
        record_queue_id = pr.level - 1;
        s->why = REF_NEW_QUEUE;
        found = find_queue(s, s->schedule_topic, record_queue_id, &topic_field, &slot, &next_word);
        if (found < 0) goto done;
        if (!found) goto hand_back;
    }
    int64_t born_ms = real_ns() / 1000000;
    int64_t *uniq = words_of(&s->uniq_state); /* counter, month start ms, next month ms */
    s->why = REF_MONTH;
    if (born_ms >= uniq[2] || born_ms < uniq[1]) goto hand_back;
    s->why = REF_STORE;
    if (!may_put(s, born_ms)) goto hand_back;
    Py_ssize_t topic_len = PyBytes_GET_SIZE(topic_field);
    Py_ssize_t size = fixed_size(&s->hosts) + body_len + topic_len + 2 + pr.len;
    if (grow_scratch(s, size) < 0) goto done;
    int64_t counter = uniq[0];
    uniq[0] = counter + 1;
    if (pr.id_at >= 0) {
        write_uniq(s, s->pbuf + pr.id_at, born_ms, counter);
        uniq_str = PyUnicode_FromKindAndData(PyUnicode_1BYTE_KIND, s->pbuf + pr.id_at, UNIQ_KEY_LEN);
    } else {
        uniq_str = Py_NewRef(pr.uniq_given);
    }
    if (!uniq_str) goto done;
    encode_into(s->scratch, &s->hosts, (const uint8_t *)PyBytes_AS_STRING(topic_field), topic_len, body_p,
                body_len, (int32_t)record_queue_id, (int32_t)flag, born_ms, s->pbuf, pr.len, s->crc_tail_len != 0);
    if (view.obj) PyBuffer_Release(&view); /* the body is in the record now */
    /* ---- the put */
    Placed placed;
    s->why = REF_NEW_FILE;
    s->put_waits = pr.wait;
    /* the rest's CRC template (crc_rest_template): the common shape, keys immutable */
    if ((props == Py_None || PyDict_GET_SIZE(props) == 0) && pr.id_at >= 0 &&
        (keys == Py_None || PyUnicode_CheckExact(keys) || PyTuple_CheckExact(keys)))
        s->crc_key = (CrcRestKey){topic_field, tags, keys};
    int put = append_locked(s, size, 1, NULL, 1, slot, next_word, born_ms, &placed);
    s->put_waits = 1;
    PyObject *status = s->put_ok, *reason = s->empty;
    if (put < 0 || (put && pr.wait && acknowledge(s, &placed, placed.wrote + size, &status, &reason) < 0)) {
        Py_DECREF(uniq_str);
        return NULL;
    }
    if (!put) {
        Py_DECREF(uniq_str);
        Py_RETURN_NONE;
    }
    int64_t latency_ns = ((s->sync || s->rep.on) && pr.wait ? mono_ns() : placed.released_ns) - started_ns;
    if (s->batching) { /* send_items records the whole call once */
        s->batch_failed += status != s->put_ok;
        s->batch_hold_ns += placed.hold_ns;
    } else {
        record_metrics(s, latency_ns, 1, status != s->put_ok, placed.hold_ns);
    }
    s->sent += 1;
    PyObject *qoff = PyLong_FromLongLong(placed.queue_offset), *phy = PyLong_FromLongLong(placed.wrote);
    if (!qoff || !phy) {
        Py_XDECREF(qoff);
        Py_XDECREF(phy);
        Py_DECREF(uniq_str);
        return NULL;
    }
    PyObject *values[7] = {Py_NewRef(status), Py_NewRef(qid_obj), qoff,          phy,
                           uniq_str,          Py_NewRef(reason),  Py_NewRef(s->msg_id_prefix)};
    return new_result(s, values);
hand_back:
    result = Py_NewRef(Py_None);
done:
    if (view.obj) PyBuffer_Release(&view);
    Py_XDECREF(uniq_str);
    return result;
}

#define MAX_BATCH 65536

/* Room for `more` bytes after `at` in s->scratch, doubling (a batch grows it record by record). */
static int scratch_room(Sender *s, Py_ssize_t at, Py_ssize_t more) {
    if (at + more <= s->scratch_len) return 0;
    return grow_scratch(s, at + more > 2 * s->scratch_len ? at + more : 2 * s->scratch_len);
}

/* send_batch(topic, bodies, tags, keys, properties, queue_id, flag) -> (status, reason,
 * queue_offset, phy_offset, born_ms, first_counter, record_size, ends) | None. RocketMQ's batch
 * for one queue (`MessageBatch`), stored whole in the current file. `bodies`: a list or tuple of
 * buffers (bytes, bytearray, memoryview, numpy); `keys`: None or one entry per body (None, a str,
 * a list or tuple of str); `properties`: None or a dict common to all (no DELAY level above 0:
 * RocketMQ refuses a delayed batch, and the reference words it). Each record's properties are
 * `properties_text`'s (`build_props`), so with neither keys nor properties they are one template
 * whose UNIQ_KEY counter digits change. `record_size` when every record has one size (ends None),
 * else -1 and each record's end in the run. None: the reference's, nothing shared changed. */
static PyObject *Sender_send_batch(Sender *s, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) return PyErr_Format(PyExc_TypeError, "send_batch takes 7 arguments");
    s->why = REF_STORE;
    if (s->closed) Py_RETURN_NONE;
    int64_t started_ns = mono_ns();
    s->send_started_ns = started_ns;
    PyObject *topic = args[0], *bodies = args[1], *tags = args[2], *keys = args[3], *props = args[4],
             *qid_obj = args[5], *flag_obj = args[6];
    long long queue_id, flag;
    s->why = REF_ARGUMENT;
    if (!PyUnicode_CheckExact(topic) || !(PyList_CheckExact(bodies) || PyTuple_CheckExact(bodies)) ||
        !plain_ids(qid_obj, flag_obj, &queue_id, &flag))
        Py_RETURN_NONE;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(bodies);
    if (keys != Py_None &&
        (!(PyList_CheckExact(keys) || PyTuple_CheckExact(keys)) || PySequence_Fast_GET_SIZE(keys) != n))
        Py_RETURN_NONE;
    /* the template path: no keys, no properties (an empty dict is none, as `properties_text` has it) */
    int common = keys == Py_None && (props == Py_None || (PyDict_CheckExact(props) && !PyDict_GET_SIZE(props)));
    s->why = REF_NEW_QUEUE;
    if (n < 1 || n > MAX_BATCH || started_ns >= s->fresh_until_ns) Py_RETURN_NONE;
    PyObject *topic_field;
    int64_t slot;
    Py_ssize_t next_word;
    int found = find_queue(s, topic, queue_id, &topic_field, &slot, &next_word);
    if (found <= 0) return found < 0 ? NULL : Py_NewRef(Py_None);
    crc_guess_prefetch(s, next_word);
    int64_t born_ms = real_ns() / 1000000;
    int64_t *uniq = words_of(&s->uniq_state);
    s->why = REF_MONTH;
    if (born_ms >= uniq[2] || born_ms < uniq[1]) Py_RETURN_NONE;
    s->why = REF_STORE;
    if (!may_put(s, born_ms)) Py_RETURN_NONE;
    if ((size_t)n > s->starts_len) {
        Py_ssize_t *p = PyMem_Realloc(s->starts, (size_t)n * sizeof(Py_ssize_t));
        if (!p) return PyErr_NoMemory();
        s->starts = p;
        s->starts_len = (size_t)n;
    }
    PyObject **items = PySequence_Fast_ITEMS(bodies);
    Py_ssize_t topic_len = PyBytes_GET_SIZE(topic_field), at = 0;
    int64_t first = uniq[0]; /* taken (uniq[0] moved on) only once every record is encoded */
    Props pr = {0};
    pr.wait = 1;
    uint8_t *id = NULL;
    if (common) { /* one properties string; only its UNIQ_KEY's counter digits change */
        const char *tags_p;
        Py_ssize_t tags_n;
        s->why = tags == Py_None || PyUnicode_CheckExact(tags) ? REF_REFUSED : REF_ARGUMENT;
        if (!plain_text(tags, &tags_p, &tags_n)) Py_RETURN_NONE;
        pr.len = (tags_n ? 6 + tags_n : 0) + 9 + UNIQ_KEY_LEN + crc_extra(s);
        if (pr.len > MAX_PROPERTIES_BYTES) Py_RETURN_NONE;
        if (grow_buffer(&s->pbuf, &s->pbuf_len, pr.len) < 0) return NULL;
        id = write_properties(s, s->pbuf, tags_p, tags_n, NULL, 0, born_ms, first);
        crc_reserve(s, id + UNIQ_KEY_LEN);
    }
    int uniform = 1;
    Py_ssize_t record_size = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (common) {
            uint32_t c = (uint32_t)(first + i);
            for (int k = 0; k < 4; k++) id[28 + k] = (uint8_t)HEX[(c >> (12 - 4 * k)) & 0xF];
        } else {
            int built = build_props(s, tags, keys == Py_None ? Py_None : PySequence_Fast_ITEMS(keys)[i], props,
                                    topic, queue_id, &pr);
            if (built < 0 || (built && props_put_crc(s, &pr) < 0)) return NULL;
            if (!built) Py_RETURN_NONE;
            s->why = REF_REFUSED; /* a delay level: RocketMQ refuses the batch, the reference says so */
            if (pr.level || pr.len > MAX_PROPERTIES_BYTES) Py_RETURN_NONE;
            if (pr.id_at >= 0) write_uniq(s, s->pbuf + pr.id_at, born_ms, first + i);
        }
        Py_buffer view;
        const uint8_t *body_p;
        Py_ssize_t body_len;
        if (!body_of(s, items[i], &view, &body_p, &body_len)) Py_RETURN_NONE;
        Py_ssize_t size = fixed_size(&s->hosts) + body_len + topic_len + 2 + pr.len;
        s->why = REF_REFUSED;
        if (body_len > s->max_message_size || scratch_room(s, at, size) < 0) {
            if (view.obj) PyBuffer_Release(&view);
            return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
        }
        s->starts[i] = at;
        at += encode_into(s->scratch + at, &s->hosts, (const uint8_t *)PyBytes_AS_STRING(topic_field), topic_len,
                          body_p, body_len, (int32_t)queue_id, (int32_t)flag, born_ms, s->pbuf, pr.len,
                          s->crc_tail_len != 0);
        if (view.obj) PyBuffer_Release(&view);
        if (i == 0) record_size = at;
        uniform &= at - s->starts[i] == record_size;
    }
    Py_ssize_t size = at;
    uniq[0] = first + n;
    Placed placed;
    s->why = REF_NEW_FILE;
    s->put_waits = pr.wait;
    if (common) s->crc_key = (CrcRestKey){topic_field, tags, Py_None}; /* crc_rest_template */
    int done = append_locked(s, size, n, s->starts, 1, slot, next_word, born_ms, &placed);
    s->put_waits = 1;
    PyObject *status = s->put_ok, *reason = s->empty;
    if (done <= 0 || (pr.wait && acknowledge(s, &placed, placed.wrote + size, &status, &reason) < 0))
        return done == 0 ? Py_NewRef(Py_None) : NULL;
    int64_t latency_ns = ((s->sync || s->rep.on) && pr.wait ? mono_ns() : placed.released_ns) - started_ns;
    record_metrics(s, latency_ns, n, status != s->put_ok ? n : 0, placed.hold_ns);
    s->sent += n;
    PyObject *ends;
    if (uniform) {
        ends = Py_NewRef(Py_None);
    } else {
        ends = PyList_New(n);
        if (!ends) return NULL;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *e = PyLong_FromSsize_t(i + 1 < n ? s->starts[i + 1] : size);
            if (!e) {
                Py_DECREF(ends);
                return NULL;
            }
            PyList_SET_ITEM(ends, i, e);
        }
    }
    return Py_BuildValue("OOLLLLnN", status, reason, (long long)placed.queue_offset, (long long)placed.wrote,
                         (long long)born_ms, (long long)first, uniform ? record_size : (Py_ssize_t)-1, ends);
}

static const char *const ITEM_FIELDS[7] = {"topic", "body", "tags", "keys", "properties", "queue_id", "flag"};

/* send_items(items: list) -> list[SendResult]: `send_batch` of send keyword dicts, each stored
 * as `send` stores it (its own queue, keys, tags and properties; a lock hold each), in order,
 * up to the first the core does not take (a Message, an unknown field, whatever `Sender_send`
 * hands back): the results of those before it, and s->why says why (the reference sends the
 * rest). */
static PyObject *Sender_send_items(Sender *s, PyObject *items) {
    if (!PyList_CheckExact(items)) return PyErr_Format(PyExc_TypeError, "send_items takes a list");
    PyObject *results = PyList_New(0), *zero = PyLong_FromLong(0);
    int64_t started_ns = mono_ns();
    int handed_back = 0;
    Py_CLEAR(s->rotated);
    s->batching = 1;
    s->batch_failed = 0;
    s->batch_hold_ns = 0;
    if (!results || !zero) goto fail;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        s->why = REF_ITEM;
        if (!PyDict_CheckExact(item)) break;
        PyObject *given[7];
        Py_ssize_t known = 0;
        for (int k = 0; k < 7; k++) {
            given[k] = PyDict_GetItemString(item, ITEM_FIELDS[k]); /* borrowed (NULL: absent) */
            known += given[k] != NULL;
        }
        s->why = REF_ARGUMENT;
        if (known != PyDict_GET_SIZE(item) || !given[0] || !given[1] || !PyUnicode_CheckExact(given[0])) break;
        for (int k = 2; k < 6; k++)
            if (!given[k]) given[k] = Py_None;
        if (!given[6]) given[6] = zero;
        PyObject *rotated = NULL;
        if (given[5] == Py_None) {
            PyObject *call[2] = {given[0], Py_None};
            if (!(rotated = PyObject_Vectorcall(s->rotate, call, 2, NULL))) goto fail;
            given[5] = rotated;
        }
        PyObject *result = Sender_send(s, given, 7);
        if (!result) {
            Py_XDECREF(rotated);
            goto fail;
        }
        if (result == Py_None) { /* the reference sends it on the queue rotated for it */
            Py_DECREF(result);
            s->rotated = rotated;
            handed_back = 1;
            break;
        }
        Py_XDECREF(rotated);
        int appended = PyList_Append(results, result);
        Py_DECREF(result);
        if (appended < 0) goto fail;
    }
    Py_DECREF(zero);
    s->batching = 0;
    Py_ssize_t n = PyList_GET_SIZE(results);
    handed_back |= n < PyList_GET_SIZE(items);
    /* one observation a call: handed back, the reference records the call with these in it */
    if (n && !handed_back) record_metrics(s, mono_ns() - started_ns, n, s->batch_failed, s->batch_hold_ns);
    return results;
fail:
    s->batching = 0;
    Py_XDECREF(results);
    Py_XDECREF(zero);
    return NULL;
}

/* put_encoded(topic, queue_id, record, wait) -> (status, reason, queue_offset, phy_offset) | None:
 * one record the reference encoded (a `Message` as given: its own born host and time, sys flag,
 * reconsume times), stored by the core's put (lock, journal, copy, queue offset, flush wait).
 * Only a dispatchable record born at an IPv4 host (its store time where the core patches it);
 * None before anything shared changed (s->why): the reference's. */
static PyObject *Sender_put_encoded(Sender *s, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) return PyErr_Format(PyExc_TypeError, "put_encoded takes 4 arguments");
    s->why = REF_STORE;
    if (s->closed) Py_RETURN_NONE;
    int64_t started_ns = mono_ns();
    s->send_started_ns = started_ns;
    PyObject *topic = args[0], *qid_obj = args[1], *data = args[2];
    int wait = PyObject_IsTrue(args[3]);
    long long queue_id, flag;
    s->why = REF_ARGUMENT;
    if (wait < 0 || !PyUnicode_CheckExact(topic) || !plain_ids(qid_obj, qid_obj, &queue_id, &flag))
        return wait < 0 ? NULL : Py_NewRef(Py_None);
    s->why = REF_NEW_QUEUE;
    if (started_ns >= s->fresh_until_ns) Py_RETURN_NONE;
    PyObject *topic_field;
    int64_t slot;
    Py_ssize_t next_word;
    int found = find_queue(s, topic, queue_id, &topic_field, &slot, &next_word);
    if (found <= 0) return found < 0 ? NULL : Py_NewRef(Py_None);
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) return NULL;
    Py_ssize_t size = view.len;
    int32_t sys_flag = size >= POS_SYS_FLAG + 4 ? (int32_t)__builtin_bswap32(*(uint32_t *)((uint8_t *)view.buf + POS_SYS_FLAG)) : -1;
    s->why = REF_ITEM;
    /* transaction type bits (PREPARED 0x4, ROLLBACK 0x8): not dispatched, no queue offset */
    if (sys_flag < 0 || (sys_flag & (BORNHOST_V6_FLAG | 0xC)) || size < fixed_size(&s->hosts) ||
        grow_scratch(s, size) < 0) {
        PyBuffer_Release(&view);
        return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
    }
    memcpy(s->scratch, view.buf, (size_t)size);
    PyBuffer_Release(&view);
    int64_t now_ms = real_ns() / 1000000;
    s->why = REF_STORE;
    if (!may_put(s, now_ms)) Py_RETURN_NONE;
    Placed placed;
    s->why = REF_NEW_FILE;
    s->put_waits = wait;
    int put = append_locked(s, size, 1, NULL, 0, slot, next_word, now_ms, &placed);
    s->put_waits = 1;
    PyObject *status = s->put_ok, *reason = s->empty;
    if (put < 0 || (put && wait && acknowledge(s, &placed, placed.wrote + size, &status, &reason) < 0))
        return NULL;
    if (!put) Py_RETURN_NONE;
    int64_t latency_ns = ((s->sync || s->rep.on) && wait ? mono_ns() : placed.released_ns) - started_ns;
    record_metrics(s, latency_ns, 1, status != s->put_ok, placed.hold_ns);
    s->sent += 1;
    return Py_BuildValue("OOLL", status, reason, (long long)placed.queue_offset, (long long)placed.wrote);
}

static PyObject *Sender_count_reference(Sender *s, PyObject *args) {
    int why;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "in", &why, &n)) return NULL;
    if (why < 0 || why >= REF_COUNT) return PyErr_Format(PyExc_ValueError, "no reason %d", why);
    if (!s->closed) count_reference(s, why, n);
    Py_RETURN_NONE;
}

static PyObject *KW_NAMES[5]; /* tags, keys, properties, queue_id, flag (interned at import) */

/* Producer.send's signature, bound on the producer instance (`Producer._bind`): send(topic, body,
 * *, tags=None, keys=None, properties=None, queue_id=None, flag=0). The common message goes
 * through `Sender_send`; anything else, and whatever that hands back, to the reference
 * (`Producer._send`), with the queue id the round robin chose. Saves the Python frame of a
 * wrapper: 15-17% of a send. */
static PyObject *Sender_send_kw(Sender *s, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *given[7] = {NULL, NULL, Py_None, Py_None, Py_None, Py_None, NULL};
    if (nargs != 2) {
        if (nargs > 2) return PyErr_Format(PyExc_TypeError, "send() takes 2 positional arguments but %zd were given", nargs);
    }
    for (Py_ssize_t i = 0; i < nargs; i++) given[i] = args[i];
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, k);
        int at = -1;
        for (int j = 0; j < 5 && at < 0; j++)
            if (name == KW_NAMES[j]) at = j;
        for (int j = 0; j < 5 && at < 0; j++)
            if (PyUnicode_Compare(name, KW_NAMES[j]) == 0) at = j;
        if (at < 0) {
            if (PyUnicode_Check(name) && (PyUnicode_CompareWithASCIIString(name, "topic") == 0 ||
                                          PyUnicode_CompareWithASCIIString(name, "body") == 0)) {
                int pos = PyUnicode_CompareWithASCIIString(name, "body") == 0;
                if (given[pos]) return PyErr_Format(PyExc_TypeError, "send() got multiple values for argument '%U'", name);
                given[pos] = args[nargs + k];
                continue;
            }
            return PyErr_Format(PyExc_TypeError, "send() got an unexpected keyword argument '%S'", name);
        }
        given[2 + at] = args[nargs + k];
    }
    if (!given[0] || !given[1])
        return PyErr_Format(PyExc_TypeError, "send() missing required argument '%s'", given[0] ? "body" : "topic");
    PyObject *flag = given[6] ? given[6] : NULL;
    PyObject *zero = NULL;
    if (!flag) flag = zero = PyLong_FromLong(0);
    if (!flag) return NULL;
    PyObject *queue_id = given[5], *rotated = NULL, *result = NULL;
    int named = queue_id != Py_None;
    if (!s->reference || !s->rotate) {
        PyErr_SetString(PyExc_RuntimeError, "the compiled send is not bound to a producer");
        goto done;
    }
    if (!named && PyUnicode_CheckExact(given[0])) {
        PyObject *call[2] = {given[0], Py_None};
        rotated = PyObject_Vectorcall(s->rotate, call, 2, NULL);
        if (!rotated) goto done;
        queue_id = rotated;
    }
    s->why = REF_ARGUMENT;
    if (PyUnicode_CheckExact(given[0]) && queue_id != Py_None) {
        PyObject *fast[7] = {given[0], given[1], given[2], given[3], given[4], queue_id, flag};
        result = Sender_send(s, fast, 7);
        if (result != Py_None) goto done;
        Py_CLEAR(result);
    }
    count_reference(s, s->why, 1);
    {
        PyObject *call[8] = {given[0], given[1], given[2], given[3], given[4], queue_id, flag,
                             named ? Py_True : Py_False};
        result = PyObject_Vectorcall(s->reference, call, 8, NULL);
    }
done:
    Py_XDECREF(rotated);
    Py_XDECREF(zero);
    return result;
}

/* bind(reference, rotate, prefault): the producer's reference send and round robin (see
 * Sender_send_kw), and its appender's pool-buffer prefault (see append_locked). */
static PyObject *Sender_bind(Sender *s, PyObject *args) {
    PyObject *reference, *rotate, *prefault;
    if (!PyArg_ParseTuple(args, "OOO", &reference, &rotate, &prefault)) return NULL;
    Py_INCREF(reference);
    Py_XSETREF(s->reference, reference);
    Py_INCREF(rotate);
    Py_XSETREF(s->rotate, rotate);
    Py_INCREF(prefault);
    Py_XSETREF(s->prefault, prefault);
    Py_RETURN_NONE;
}

/* set_file(dest, dest_is_file, fd, file_from_offset, file_size, pwrite_min_bytes): the segment at
 * the write position (dest None: none cached). */
static PyObject *Sender_set_file(Sender *s, PyObject *args) {
    PyObject *dest;
    int is_file, fd;
    long long from, size, pwrite_min;
    if (!PyArg_ParseTuple(args, "OpiLLL", &dest, &is_file, &fd, &from, &size, &pwrite_min)) return NULL;
    Py_INCREF(dest);
    Py_XSETREF(s->dest, dest); /* NULL after close */
    s->dest_is_file = is_file;
    s->fd = fd;
    s->file_from_offset = from;
    s->file_size = size;
    s->pwrite_min_bytes = pwrite_min;
    Py_RETURN_NONE;
}

/* learn(topic, topic_field, limit, queue_id, slot, next_word): a queue the reference placed. */
/* The topic's entry (topic_field, limit, [queue -> (slot, word) | None] * limit), made anew
 * when absent or learned with another limit; borrowed, NULL with an exception. */
static PyObject *topic_entry(Sender *s, PyObject *topic, PyObject *topic_field, PyObject *limit, Py_ssize_t n) {
    PyObject *entry = PyDict_GetItemWithError(s->topics, topic);
    if (!entry && PyErr_Occurred()) return NULL;
    if (entry && PyObject_RichCompareBool(PyTuple_GET_ITEM(entry, 1), limit, Py_EQ) != 1) entry = NULL;
    if (!entry) {
        PyObject *queues = PyList_New(n);
        if (!queues) return NULL;
        for (Py_ssize_t i = 0; i < n; i++) PyList_SET_ITEM(queues, i, Py_NewRef(Py_None));
        entry = PyTuple_Pack(3, topic_field, limit, queues);
        Py_DECREF(queues);
        if (!entry || PyDict_SetItem(s->topics, topic, entry) < 0) {
            Py_XDECREF(entry);
            return NULL;
        }
        Py_DECREF(entry);
        Py_CLEAR(s->last_topic); /* the cached entry may be the one replaced */
        Py_CLEAR(s->last_entry);
    }
    return entry;
}

static PyObject *Sender_learn(Sender *s, PyObject *args) {
    PyObject *topic, *topic_field, *limit, *queue_id, *slot, *word;
    if (!PyArg_ParseTuple(args, "UO!OOOO", &topic, &PyBytes_Type, &topic_field, &limit, &queue_id, &slot, &word))
        return NULL;
    Py_ssize_t n = PyLong_AsSsize_t(limit);
    Py_ssize_t qid = PyLong_AsSsize_t(queue_id);
    if (PyErr_Occurred()) return NULL;
    if (qid < 0 || qid >= n || n > (1 << 20)) return PyErr_Format(PyExc_ValueError, "queue id %zd outside 0..%zd", qid, n - 1);
    PyObject *entry = topic_entry(s, topic, topic_field, limit, n);
    if (!entry) return NULL;
    PyObject *pair = PyTuple_Pack(2, slot, word);
    if (!pair) return NULL;
    if (PyList_SetItem(PyTuple_GET_ITEM(entry, 2), qid, pair) < 0) return NULL;
    Py_RETURN_NONE;
}

/* learn_topic(topic, topic_field, limit): the topic's queue limit alone (the reference sent a
 * delayed message on one of its queues, which holds nothing of it: `topic_has_queue`). */
static PyObject *Sender_learn_topic(Sender *s, PyObject *args) {
    PyObject *topic, *topic_field, *limit;
    if (!PyArg_ParseTuple(args, "UO!O", &topic, &PyBytes_Type, &topic_field, &limit)) return NULL;
    Py_ssize_t n = PyLong_AsSsize_t(limit);
    if (PyErr_Occurred()) return NULL;
    if (n < 0 || n > (1 << 20)) return PyErr_Format(PyExc_ValueError, "limit %zd outside 0..2^20", n);
    if (!topic_entry(s, topic, topic_field, limit, n)) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Sender_forget_topics(Sender *s, PyObject *noargs) {
    Py_CLEAR(s->last_topic);
    Py_CLEAR(s->last_entry);
    PyDict_Clear(s->topics);
    Py_RETURN_NONE;
}

static PyObject *Sender_close(Sender *s, PyObject *noargs) {
    Sender_clear(s);
    sender_release(s);
    Py_RETURN_NONE;
}

static PyMethodDef Sender_methods[] = {
    {"send_batch", (PyCFunction)(void (*)(void))Sender_send_batch, METH_FASTCALL,
     "send_batch(topic, bodies, tags, keys, properties, queue_id, flag) -> (status, reason, queue_offset, phy_offset, born_ms, "
     "first_counter, record_size, ends) | None (None: the reference's)"},
    {"send_kw", (PyCFunction)(void (*)(void))Sender_send_kw, METH_FASTCALL | METH_KEYWORDS,
     "send(topic, body, *, tags=None, keys=None, properties=None, queue_id=None, flag=0) -> SendResult: "
     "Producer.send, bound on the producer; the compiled core first, else the reference"},
    {"send_items", (PyCFunction)Sender_send_items, METH_O,
     "send_items(items: list[dict]) -> list[SendResult]: send_batch's keyword dicts, each as send, up to the "
     "first the core does not take (`why` says why)"},
    {"put_encoded", (PyCFunction)(void (*)(void))Sender_put_encoded, METH_FASTCALL,
     "put_encoded(topic, queue_id, record, wait) -> (status, reason, queue_offset, phy_offset) | None: a record "
     "the reference encoded, put by the core"},
    {"count_reference", (PyCFunction)Sender_count_reference, METH_VARARGS,
     "count_reference(why, n): n sends the reference served, for reason why (REF_*)"},
    {"bind", (PyCFunction)Sender_bind, METH_VARARGS,
     "bind(reference, rotate, prefault): the producer's send, round robin and pool-buffer prefault"},
    {"set_file", (PyCFunction)Sender_set_file, METH_VARARGS, "the segment at the write position"},
    {"learn", (PyCFunction)Sender_learn, METH_VARARGS, "a queue and its offset-table slot"},
    {"learn_topic", (PyCFunction)Sender_learn_topic, METH_VARARGS, "a topic's queue limit (a delayed send's)"},
    {"forget_topics", (PyCFunction)Sender_forget_topics, METH_NOARGS, "topics.json changed"},
    {"close", (PyCFunction)Sender_close, METH_NOARGS, "release every shared buffer (before closing them)"},
    {NULL}};

static PyMemberDef Sender_members[] = {
    {"reserved_until", T_LONGLONG, offsetof(Sender, reserved_until), 0,
     "commit-log offset below which blocks are known reserved (Appender._reserved_until)"},
    {"prefault_at", T_LONGLONG, offsetof(Sender, prefault_at), 0,
     "commit-log offset from which a put calls the bound prefault (Appender._prefault_at)"},
    {"fresh_until_ns", T_LONGLONG, offsetof(Sender, fresh_until_ns), 0,
     "CLOCK_MONOTONIC ns until which the learned queue limits hold (topics.json looked at)"},
    {"last_hold_ns", T_LONGLONG, offsetof(Sender, last_hold_ns), READONLY, "the last lock hold, ns"},
    {"sent", T_LONGLONG, offsetof(Sender, sent), READONLY, "sends this core completed"},
    {"crc_templates", T_LONGLONG, offsetof(Sender, crc_tpl.made), READONLY,
     "the rest's CRC constants made (a send's topic, tags or keys not the last's: crc_rest_template)"},
    {"crc_misses", T_LONGLONG, offsetof(Sender, crc_misses), READONLY,
     "records whose whole-record CRC was corrected under the lock (its fields guessed wrong)"},
    {"why", T_INT, offsetof(Sender, why), READONLY, "why the last send went to the reference (REF_*)"},
    {"rotated", T_OBJECT, offsetof(Sender, rotated), READONLY,
     "send_items: the queue id rotated for the item it handed back (None: none rotated)"},
    {NULL}};

static PyTypeObject SenderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "rmq_mp.put._core.Sender",
    .tp_basicsize = sizeof(Sender),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)Sender_traverse,
    .tp_clear = (inquiry)Sender_clear,
    .tp_doc = "One producer's compiled send for one start of a store (rmq_mp/put/native.py builds it).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Sender_init,
    .tp_dealloc = (destructor)Sender_dealloc,
    .tp_methods = Sender_methods,
    .tp_members = Sender_members,
};

static PyObject *py_set_pause(PyObject *self, PyObject *args) {
    int at;
    if (!PyArg_ParseTuple(args, "i", &at)) return NULL;
    if (at < PAUSE_NONE || at > PAUSE_FLUSH_TIMED_OUT) return PyErr_Format(PyExc_ValueError, "no pause point %d", at);
    pause_at = at;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"crc32", py_crc32, METH_VARARGS, "crc32(data, start=0) -> int: zlib.crc32"},
    {"_set_clmul", py_set_clmul, METH_O, "_set_clmul(on) -> bool: test hook, the CRC by table alone; CPU has it"},
    {"_crc_fill_prepared", py_crc_fill_prepared, METH_VARARGS,
     "test hook: _crc_fill_prepared(record, tail_len, queue_offset, phy_offset, store_ms, guess=None, fixed=0), "
     "the put's CRC"},
    {"_crc_digits", py_crc_digits, METH_O, "test hook: _crc_digits(crc), the CRC property's ten digits"},
    {"encode_own", py_encode_own, METH_VARARGS,
     "encode_own(topic_field, body, queue_id, flag, born_ms, props, born_ip, born_port, store_ip, store_port)"
     " -> bytearray: RecordEncoder.encode_own"},
    {"layout", py_layout, METH_NOARGS, "the record layout and constants compiled in"},
    {"lock_acquire", py_lock_acquire, METH_VARARGS,
     "lock_acquire(table, word_index, pid, spin_ns, wait_ms) -> bool (GIL released while sleeping)"},
    {"lock_release", py_lock_release, METH_VARARGS, "lock_release(table, word_index)"},
    {"lock_cas", py_lock_cas, METH_VARARGS, "lock_cas(table, word_index, expected, new) -> bool"},
    {"_set_pause", py_set_pause, METH_VARARGS,
     "test hook: SIGSTOP this process at a point of the put (0 none, 1 locked, 2 journalled, 3 copied, "
     "4 flush wait, 5 flush wait timed out, before it abandons its slot)"},
    {NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_core", "rmq-mp's compiled put path", -1, methods};

PyMODINIT_FUNC PyInit__core(void) {
    crc_init();
    crc_shift_init();
#ifdef RMQ_HAVE_CLMUL
    __builtin_cpu_init();
    has_clmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("ssse3") && __builtin_cpu_supports("sse4.1");
#endif
    static const char *const kw[5] = {"tags", "keys", "properties", "queue_id", "flag"};
    for (int i = 0; i < 5; i++)
        if (!(KW_NAMES[i] = PyUnicode_InternFromString(kw[i]))) return NULL;
    if (!(DELAY_NAME = PyUnicode_InternFromString("DELAY"))) return NULL;
    if (PyType_Ready(&SenderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    if (PyModule_AddObjectRef(m, "Sender", (PyObject *)&SenderType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
