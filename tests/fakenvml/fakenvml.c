/*
 * fakenvml.c - a fake NVIDIA Management Library for tests.
 *
 * Built as libnvidia-ml.so.1 and put first on LD_LIBRARY_PATH, it lets the
 * real pynvml (which dlopen()s "libnvidia-ml.so.1") talk to an invented GPU
 * inventory read from a JSON file, and lets tests inject faults (Xid errors,
 * ECC errors, lost GPUs, telemetry changes) at run time through an
 * append-only text file.
 *
 *   FAKENVML_CONFIG  path of the inventory JSON, read at nvmlInit time
 *   FAKENVML_FAULTS  path of the fault file, polled on every API call and
 *                    every ~10 ms inside nvmlEventSetWait*
 *   FAKENVML_MIG_LOG MIG create/destroy calls, appended; replayed at nvmlInit
 *                    (default "<FAKENVML_FAULTS>.mig", "" for none)
 *
 * See README.md next to this file for the inventory schema and the fault
 * syntax.  Everything here is written from the public NVML API description
 * (function names, structure layouts and constants as pynvml uses them); no
 * NVIDIA header is used.
 *
 * Build:
 *   gcc -shared -fPIC -O2 -Wall -Wextra -o libnvidia-ml.so.1 fakenvml.c -lpthread
 *
 * Layout of this file:
 *   1. NVML ABI: types, constants, structures
 *   2. small utilities
 *   3. JSON reader
 *   4. inventory model and loader
 *   5. global state, locking, handle resolution
 *   6. event sets
 *   7. fault file watcher
 *   8. exported NVML API
 *   9. MIG re-partitioning (GPU and compute instances)
 */

#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

/* Only the NVML entry points are exported; everything else is static. */
#define EXPORT __attribute__((visibility("default")))

/* ======================================================================
 * 1. NVML ABI
 * ====================================================================== */

typedef int nvmlReturn_t;          /* an enum in the real API: int-sized */

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_INSUFFICIENT_POWER = 8,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_IRQ_ISSUE = 11,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_CORRUPTED_INFOROM = 14,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_OPERATING_SYSTEM = 17,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_NO_DATA = 21,
    NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22,
    NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
    NVML_ERROR_FREQ_NOT_SUPPORTED = 24,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_DEPRECATED = 26,
    NVML_ERROR_NOT_READY = 27,
    NVML_ERROR_GPU_NOT_FOUND = 28,
    NVML_ERROR_INVALID_STATE = 29,
    NVML_ERROR_RESET_TYPE_NOT_SUPPORTED = 30,
    NVML_ERROR_UNKNOWN = 999
};

/* Event type bits (nvmlEventType*). */
#define EV_SINGLE_BIT_ECC   0x0000000000000001ULL
#define EV_DOUBLE_BIT_ECC   0x0000000000000002ULL
#define EV_PSTATE           0x0000000000000004ULL
#define EV_XID_CRITICAL     0x0000000000000008ULL
#define EV_CLOCK            0x0000000000000010ULL
#define EV_MIG_CONFIG       0x0000000000000100ULL

/* Topology levels (nvmlGpuTopologyLevel_t). */
#define TOPO_INTERNAL   0
#define TOPO_SINGLE     10
#define TOPO_MULTIPLE   20
#define TOPO_HOSTBRIDGE 30
#define TOPO_NODE       40
#define TOPO_SYSTEM     50

#define NVML_TEMPERATURE_GPU         0
#define NVML_MEMORY_ERROR_CORRECTED   0
#define NVML_MEMORY_ERROR_UNCORRECTED 1
#define NVML_VOLATILE_ECC  0
#define NVML_AGGREGATE_ECC 1
#define NVML_RETIRE_MULTIPLE_SBE 0
#define NVML_RETIRE_DBE          1

#define NVML_NVLINK_MAX_LINKS 36
#define NVML_INSTANCE_ID_NONE 0xFFFFFFFFu   /* NVML_{GPU,COMPUTE}_INSTANCE_ID_ANY */

/* Versioned structure tags: (version << 24) | sizeof(struct). */
#define NVML_MEMORY_V2_VERSION      0x02000028u
#define NVML_TEMPERATURE_V1_VERSION 0x0100000Cu

/* Buffer sizes callers are told to use. */
#define UUID_BUFFER_SIZE      96   /* NVML_DEVICE_UUID_V2_BUFFER_SIZE */
#define NAME_BUFFER_SIZE      96   /* NVML_DEVICE_NAME_V2_BUFFER_SIZE */
#define SERIAL_BUFFER_SIZE    30
#define VERSION_BUFFER_SIZE   80
#define BUSID_BUFFER_SIZE     32
#define BUSID_LEGACY_SIZE     16

/* Opaque handle types.  The pointers really point at fake_gpu / fake_mig /
 * event_set below; they are only ever compared against known objects
 * before being dereferenced. */
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct nvmlEventSet_st *nvmlEventSet_t;

typedef struct {
    char busIdLegacy[BUSID_LEGACY_SIZE];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;       /* (device id << 16) | vendor id */
    unsigned int pciSubSystemId;
    char busId[BUSID_BUFFER_SIZE];
} nvmlPciInfo_t;

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;

typedef struct {
    unsigned int version;
    unsigned int sensorType;
    int temperature;
} nvmlTemperature_v1_t;

typedef struct {
    unsigned int multiprocessorCount;
    unsigned int sharedCopyEngineCount;
    unsigned int sharedDecoderCount;
    unsigned int sharedEncoderCount;
    unsigned int sharedJpegCount;
    unsigned int sharedOfaCount;
    unsigned int gpuInstanceSliceCount;
    unsigned int computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;

/* nvmlEventData_t as filled by nvmlEventSetWait_v2. */
typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

/* The pre-MIG layout filled by the old nvmlEventSetWait. */
typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
} nvmlEventData_v1_t;

/* ======================================================================
 * 2. Utilities
 * ====================================================================== */

static void warnf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void warnf(const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "fakenvml: %s\n", buf);
    fflush(stderr);
}

/* Copy a string into a caller's buffer the way NVML does. */
static nvmlReturn_t copy_out(char *buf, unsigned int len, const char *s)
{
    size_t n = strlen(s);
    if (!buf)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (n + 1 > len)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, s, n + 1);
    return NVML_SUCCESS;
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_ms(double ms)
{
    struct timespec ts;
    if (ms <= 0)
        return;
    ts.tv_sec = (time_t)(ms / 1000.0);
    ts.tv_nsec = (long)((ms - (double)ts.tv_sec * 1000.0) * 1e6);
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* Parse a whole string as an unsigned integer (decimal or 0x hex). */
static int parse_ull(const char *s, unsigned long long *out)
{
    char *end;
    if (!s || !*s || *s == '-')
        return -1;
    errno = 0;
    *out = strtoull(s, &end, 0);
    return (errno || *end) ? -1 : 0;
}

/* "DDDDDDDD:BB:DD.F" or "DDDD:BB:DD.F" (hex) -> numbers. */
static int parse_bus_id(const char *s, unsigned *domain, unsigned *bus, unsigned *dev, unsigned *fn)
{
    unsigned d, b, v, f;
    int used = 0;
    if (sscanf(s, "%x:%x:%x.%x%n", &d, &b, &v, &f, &used) != 4 || s[used] != '\0')
        return -1;
    if (b > 0xFF || v > 0x1F || f > 7)
        return -1;
    *domain = d; *bus = b; *dev = v; *fn = f;
    return 0;
}

/* ======================================================================
 * 3. JSON reader
 *
 * A small recursive-descent parser for RFC 8259 JSON producing a tree of
 * json_value nodes.  Strict: no comments, no trailing commas, no duplicate
 * object keys, no NUL characters inside strings.  Errors carry line:column.
 * ====================================================================== */

typedef enum { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } json_type;

typedef struct json_value json_value;
struct json_value {
    json_type type;
    int line;               /* line where the value starts */
    int boolean;            /* JSON_BOOL */
    double number;          /* JSON_NUMBER */
    int is_integer;         /* JSON_NUMBER without fraction/exponent that fits */
    long long integer;
    char *string;           /* JSON_STRING, UTF-8, NUL-terminated */
    size_t count, cap;      /* JSON_ARRAY / JSON_OBJECT members */
    json_value *items;
    char **keys;            /* JSON_OBJECT member names, parallel to items */
};

typedef struct {
    const char *p, *end, *line_start;
    int line;
    int depth;
    char err[256];
} json_parser;

#define JSON_MAX_DEPTH 64

static int json_fail(json_parser *ps, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int json_fail(json_parser *ps, const char *fmt, ...)
{
    char msg[200];
    va_list ap;
    if (ps->err[0])
        return -1;          /* keep the first (innermost) error */
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(ps->err, sizeof ps->err, "line %d column %d: %s",
             ps->line, (int)(ps->p - ps->line_start) + 1, msg);
    return -1;
}

static void json_free(json_value *v)
{
    size_t i;
    if (!v)
        return;
    free(v->string);
    for (i = 0; i < v->count; i++) {
        json_free(&v->items[i]);
        if (v->keys)
            free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    memset(v, 0, sizeof *v);
}

static void json_skip_ws(json_parser *ps)
{
    while (ps->p < ps->end) {
        char c = *ps->p;
        if (c == '\n') {
            ps->line++;
            ps->p++;
            ps->line_start = ps->p;
        } else if (c == ' ' || c == '\t' || c == '\r') {
            ps->p++;
        } else {
            break;
        }
    }
}

/* Growable byte buffer used while decoding strings. */
typedef struct { char *s; size_t n, cap; } strbuf;

static int sb_put(strbuf *b, char c)
{
    if (b->n + 1 >= b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 32;
        char *s = realloc(b->s, cap);
        if (!s)
            return -1;
        b->s = s;
        b->cap = cap;
    }
    b->s[b->n++] = c;
    b->s[b->n] = '\0';
    return 0;
}

static int sb_put_utf8(strbuf *b, unsigned long cp)
{
    int r = 0;
    if (cp < 0x80) {
        r |= sb_put(b, (char)cp);
    } else if (cp < 0x800) {
        r |= sb_put(b, (char)(0xC0 | (cp >> 6)));
        r |= sb_put(b, (char)(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        r |= sb_put(b, (char)(0xE0 | (cp >> 12)));
        r |= sb_put(b, (char)(0x80 | ((cp >> 6) & 0x3F)));
        r |= sb_put(b, (char)(0x80 | (cp & 0x3F)));
    } else {
        r |= sb_put(b, (char)(0xF0 | (cp >> 18)));
        r |= sb_put(b, (char)(0x80 | ((cp >> 12) & 0x3F)));
        r |= sb_put(b, (char)(0x80 | ((cp >> 6) & 0x3F)));
        r |= sb_put(b, (char)(0x80 | (cp & 0x3F)));
    }
    return r;
}

static int json_hex4(json_parser *ps, unsigned long *out)
{
    int i;
    unsigned long v = 0;
    if (ps->end - ps->p < 4)
        return json_fail(ps, "truncated \\u escape");
    for (i = 0; i < 4; i++) {
        char c = ps->p[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned long)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned long)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned long)(c - 'A' + 10);
        else return json_fail(ps, "bad hex digit in \\u escape");
    }
    ps->p += 4;
    *out = v;
    return 0;
}

/* Parses a string literal; ps->p is at the opening quote. */
static int json_parse_string(json_parser *ps, char **out)
{
    strbuf b = { NULL, 0, 32 };
    ps->p++;                                    /* opening quote */
    b.s = malloc(b.cap);
    if (!b.s)
        goto oom;
    b.s[0] = '\0';
    for (;;) {
        unsigned char c;
        if (ps->p >= ps->end) {
            json_fail(ps, "unterminated string");
            goto fail;
        }
        c = (unsigned char)*ps->p;
        if (c == '"') {
            ps->p++;
            *out = b.s;
            return 0;
        }
        if (c < 0x20) {
            json_fail(ps, "control character in string");
            goto fail;
        }
        if (c != '\\') {
            if (sb_put(&b, (char)c) < 0)
                goto oom;
            ps->p++;
            continue;
        }
        ps->p++;                                /* backslash */
        if (ps->p >= ps->end) {
            json_fail(ps, "unterminated escape");
            goto fail;
        }
        c = (unsigned char)*ps->p++;
        switch (c) {
        case '"': case '\\': case '/':
            if (sb_put(&b, (char)c) < 0) goto oom;
            break;
        case 'b': if (sb_put(&b, '\b') < 0) goto oom; break;
        case 'f': if (sb_put(&b, '\f') < 0) goto oom; break;
        case 'n': if (sb_put(&b, '\n') < 0) goto oom; break;
        case 'r': if (sb_put(&b, '\r') < 0) goto oom; break;
        case 't': if (sb_put(&b, '\t') < 0) goto oom; break;
        case 'u': {
            unsigned long cp, lo;
            if (json_hex4(ps, &cp) < 0)
                goto fail;
            if (cp >= 0xD800 && cp <= 0xDBFF) {         /* surrogate pair */
                if (ps->end - ps->p < 2 || ps->p[0] != '\\' || ps->p[1] != 'u') {
                    json_fail(ps, "unpaired surrogate in \\u escape");
                    goto fail;
                }
                ps->p += 2;
                if (json_hex4(ps, &lo) < 0)
                    goto fail;
                if (lo < 0xDC00 || lo > 0xDFFF) {
                    json_fail(ps, "bad low surrogate in \\u escape");
                    goto fail;
                }
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                json_fail(ps, "unpaired surrogate in \\u escape");
                goto fail;
            }
            if (cp == 0) {
                json_fail(ps, "\\u0000 is not allowed");
                goto fail;
            }
            if (sb_put_utf8(&b, cp) < 0)
                goto oom;
            break;
        }
        default:
            ps->p--;
            json_fail(ps, "bad escape '\\%c'", c);
            goto fail;
        }
    }
oom:
    json_fail(ps, "out of memory");
fail:
    free(b.s);
    return -1;
}

static int json_parse_number(json_parser *ps, json_value *v)
{
    const char *start = ps->p, *q = ps->p;
    int integral = 1;
    char buf[64];
    size_t len;

    if (q < ps->end && *q == '-')
        q++;
    if (q >= ps->end || !isdigit((unsigned char)*q))
        return json_fail(ps, "bad number");
    if (*q == '0') {
        q++;
    } else {
        while (q < ps->end && isdigit((unsigned char)*q))
            q++;
    }
    if (q < ps->end && *q == '.') {
        integral = 0;
        q++;
        if (q >= ps->end || !isdigit((unsigned char)*q))
            return json_fail(ps, "bad number: digit expected after '.'");
        while (q < ps->end && isdigit((unsigned char)*q))
            q++;
    }
    if (q < ps->end && (*q == 'e' || *q == 'E')) {
        integral = 0;
        q++;
        if (q < ps->end && (*q == '+' || *q == '-'))
            q++;
        if (q >= ps->end || !isdigit((unsigned char)*q))
            return json_fail(ps, "bad number: digit expected in exponent");
        while (q < ps->end && isdigit((unsigned char)*q))
            q++;
    }
    len = (size_t)(q - start);
    if (len >= sizeof buf)
        return json_fail(ps, "number too long");
    memcpy(buf, start, len);
    buf[len] = '\0';
    v->type = JSON_NUMBER;
    v->number = strtod(buf, NULL);
    if (integral) {
        errno = 0;
        v->integer = strtoll(buf, NULL, 10);
        v->is_integer = (errno == 0);
    }
    ps->p = q;
    return 0;
}

static int json_parse_value(json_parser *ps, json_value *v);

static int json_append(json_parser *ps, json_value *v, char *key, json_value *item)
{
    if (v->count == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 8;
        json_value *items = realloc(v->items, cap * sizeof *items);
        if (!items)
            return json_fail(ps, "out of memory");
        v->items = items;
        if (v->type == JSON_OBJECT) {
            char **keys = realloc(v->keys, cap * sizeof *keys);
            if (!keys)
                return json_fail(ps, "out of memory");
            v->keys = keys;
        }
        v->cap = cap;
    }
    v->items[v->count] = *item;
    if (v->type == JSON_OBJECT)
        v->keys[v->count] = key;
    v->count++;
    return 0;
}

static int json_parse_container(json_parser *ps, json_value *v, int is_object)
{
    char close = is_object ? '}' : ']';
    v->type = is_object ? JSON_OBJECT : JSON_ARRAY;
    if (++ps->depth > JSON_MAX_DEPTH)
        return json_fail(ps, "nesting too deep");
    ps->p++;                                    /* '{' or '[' */
    json_skip_ws(ps);
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
        ps->depth--;
        return 0;
    }
    for (;;) {
        json_value item;
        char *key = NULL;
        size_t i;

        memset(&item, 0, sizeof item);
        json_skip_ws(ps);
        if (is_object) {
            if (ps->p >= ps->end || *ps->p != '"')
                return json_fail(ps, "object key (a string) expected");
            if (json_parse_string(ps, &key) < 0)
                return -1;
            for (i = 0; i < v->count; i++) {
                if (strcmp(v->keys[i], key) == 0) {
                    free(key);
                    return json_fail(ps, "duplicate key \"%s\"", v->keys[i]);
                }
            }
            json_skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':') {
                free(key);
                return json_fail(ps, "':' expected after object key");
            }
            ps->p++;
        }
        if (json_parse_value(ps, &item) < 0 || json_append(ps, v, key, &item) < 0) {
            free(key);
            json_free(&item);
            return -1;
        }
        json_skip_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        if (ps->p < ps->end && *ps->p == close) {
            ps->p++;
            ps->depth--;
            return 0;
        }
        return json_fail(ps, is_object ? "',' or '}' expected" : "',' or ']' expected");
    }
}

static int json_literal(json_parser *ps, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0)
        return json_fail(ps, "unexpected character '%c'", *ps->p);
    ps->p += n;
    return 0;
}

static int json_parse_value(json_parser *ps, json_value *v)
{
    json_skip_ws(ps);
    v->line = ps->line;
    if (ps->p >= ps->end)
        return json_fail(ps, "unexpected end of input");
    switch (*ps->p) {
    case '{': return json_parse_container(ps, v, 1);
    case '[': return json_parse_container(ps, v, 0);
    case '"':
        v->type = JSON_STRING;
        return json_parse_string(ps, &v->string);
    case 't':
        v->type = JSON_BOOL;
        v->boolean = 1;
        return json_literal(ps, "true");
    case 'f':
        v->type = JSON_BOOL;
        return json_literal(ps, "false");
    case 'n':
        v->type = JSON_NULL;
        return json_literal(ps, "null");
    default:
        return json_parse_number(ps, v);
    }
}

/* Parses a whole document.  On error returns -1 with a message in err. */
static int json_parse(const char *text, size_t len, json_value *out, char *err, size_t errlen)
{
    json_parser ps;
    memset(&ps, 0, sizeof ps);
    memset(out, 0, sizeof *out);
    ps.p = ps.line_start = text;
    ps.end = text + len;
    ps.line = 1;
    if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0)   /* UTF-8 BOM */
        ps.p = ps.line_start = text + 3;
    if (json_parse_value(&ps, out) == 0) {
        json_skip_ws(&ps);
        if (ps.p == ps.end)
            return 0;
        json_fail(&ps, "trailing characters after the JSON value");
    }
    json_free(out);
    snprintf(err, errlen, "%s", ps.err);
    return -1;
}

static const json_value *json_get(const json_value *obj, const char *key)
{
    size_t i;
    if (!obj || obj->type != JSON_OBJECT)
        return NULL;
    for (i = 0; i < obj->count; i++)
        if (strcmp(obj->keys[i], key) == 0)
            return &obj->items[i];
    return NULL;
}

/* ======================================================================
 * 4. Inventory model and loader
 * ====================================================================== */

#define MAX_GPUS         64
#define MAX_MIG          16
#define MAX_RETIRED      64
#define GPU_MAGIC        0x47505521u    /* "GPU!" */
#define MIG_MAGIC        0x4D494721u    /* "MIG!" */
#define SET_MAGIC        0x45565321u    /* "EVS!" */
#define GI_MAGIC         0x47494E21u    /* "GIN!" */
#define CI_MAGIC         0x43494E21u    /* "CIN!" */
#define MAX_GI           8
#define MAX_PROCS        64

typedef struct fake_gpu fake_gpu;
typedef struct fake_gi fake_gi;

/* A GPU-instance profile of a MIG model (see section 9). */
typedef struct {
    const char *name;                   /* "1g.10gb" */
    unsigned nvml_profile;              /* NVML_GPU_INSTANCE_PROFILE_* */
    unsigned id;                        /* profile id (nvidia-smi's "ID") */
    unsigned slices;                    /* compute slices */
    unsigned size;                      /* memory slices a placement covers */
    unsigned starts;                    /* bit s: a placement may start at memory slice s */
    unsigned instances;                 /* at most this many at once */
    unsigned sm, ce, dec, enc, jpeg, ofa;
    unsigned long long memory_mb;
} gi_profile;

typedef struct {
    const char *name;                   /* "a100-80gb" */
    const gi_profile *profiles;
    unsigned n;
} mig_model;

/* A GPU instance: a placement of a profile on its GPU.  Its compute
 * instances are the MIG devices whose gio points at it. */
struct fake_gi {
    uint32_t magic;
    fake_gpu *gpu;
    const gi_profile *prof;
    unsigned id, start;
};

typedef struct {
    uint32_t magic;
    fake_gpu *parent;
    fake_gi *gio;                       /* its GPU instance (NULL: layout not modelled) */
    uint32_t ci_magic;                  /* &ci_magic is the nvmlComputeInstance_t */
    unsigned ci_profile, ci_start;      /* compute-instance profile and placement */
    unsigned index;                     /* position under the parent (at load time) */
    char uuid[UUID_BUFFER_SIZE];
    char name[NAME_BUFFER_SIZE];
    char profile[32];
    unsigned gi, ci;
    unsigned slices, ci_slices;
    unsigned sm_count, copy_engines, decoders, encoders, jpegs, ofas;
    unsigned long long memory_mb, memory_used_mb;
} fake_mig;

typedef struct {
    int present;                        /* listed in the inventory */
    int active;
    int peer;                           /* GPU index or -1 */
    int has_remote;                     /* remote_pci_bus_id given */
    nvmlPciInfo_t remote;
} fake_link;

struct fake_gpu {
    uint32_t magic;
    unsigned index;
    char uuid[UUID_BUFFER_SIZE];
    char name[NAME_BUFFER_SIZE];
    char serial[SERIAL_BUFFER_SIZE];
    nvmlPciInfo_t pci;
    unsigned minor;
    int has_numa, numa_node;
    int has_cc, cc_major, cc_minor;
    unsigned sm_count;

    unsigned long long memory_mb, memory_used_mb, memory_reserved_mb;
    unsigned temperature, util_gpu, util_mem, power_mw;
    int has_power_limit;
    unsigned power_limit_mw;

    int mig_capable, mig_current, mig_pending;
    unsigned max_mig;
    unsigned n_mig;
    fake_mig *migs[MAX_MIG];            /* in nvmlDeviceGetMigDeviceHandleByIndex order */
    const mig_model *model;             /* MIG profiles, NULL: cannot be re-partitioned */
    char mig_fixed[160];                /* why the static layout is not modelled, "" if it is */
    unsigned n_gi;
    fake_gi *gis[MAX_GI];
    unsigned mig_seq;                   /* compute instances created (makes new UUIDs) */

    fake_link links[NVML_NVLINK_MAX_LINKS];

    int remap_supported;
    unsigned remap_correctable, remap_uncorrectable, remap_pending, remap_failure;

    int retired_supported, retired_pending;
    unsigned n_retired[2];              /* indexed by retirement cause */
    unsigned long long retired_addr[2][MAX_RETIRED];
    unsigned long long retired_time[2][MAX_RETIRED];

    int ecc_supported, ecc_enabled;
    unsigned long long ecc[2][2];       /* [error type][counter type] */

    unsigned long long supported_events;
    int lost;
};

/* A process running on a GPU or a MIG device (fault lines "proc"/"endproc"). */
typedef struct {
    unsigned pid, gpu, gi, ci;          /* gi = ci = NVML_INSTANCE_ID_NONE: the whole GPU */
    unsigned long long mem_mb;
} fake_proc;

/* Every fake_mig and fake_gi is allocated here and freed with the
 * inventory, so a handle to a destroyed instance never points at freed
 * memory (it fails validation instead). */
typedef struct pool_block {
    struct pool_block *next;
    max_align_t data[];
} pool_block;

typedef struct {
    char driver[VERSION_BUFFER_SIZE];
    char nvml_version[VERSION_BUFFER_SIZE];
    int cuda;
    int mig_event_device_is_parent;     /* where MIG Xids point: parent or MIG */
    unsigned n_gpus;
    fake_gpu *gpus;
    unsigned char topo[MAX_GPUS][MAX_GPUS];
    pool_block *pool;
    unsigned n_procs;
    fake_proc procs[MAX_PROCS];
} inventory;

static void *pool_alloc(inventory *inv, size_t n)
{
    pool_block *b = calloc(1, sizeof *b + n);
    if (!b)
        return NULL;
    b->next = inv->pool;
    inv->pool = b;
    return b->data;
}

typedef struct {
    char err[512];
} loader;

static int load_fail(loader *ld, const char *ctx, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int load_fail(loader *ld, const char *ctx, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(ld->err, sizeof ld->err, "%s: %s", ctx, msg);
    return -1;
}

/* Rejects keys that are not in the NULL-terminated allowed list: a typo in
 * an inventory should fail loudly instead of silently using a default. */
static int check_keys(loader *ld, const char *ctx, const json_value *obj, const char *const *allowed)
{
    size_t i;
    const char *const *a;
    if (!obj || obj->type != JSON_OBJECT)
        return load_fail(ld, ctx, "expected an object");
    for (i = 0; i < obj->count; i++) {
        for (a = allowed; *a; a++)
            if (strcmp(*a, obj->keys[i]) == 0)
                break;
        if (!*a)
            return load_fail(ld, ctx, "unknown key \"%s\" (line %d)", obj->keys[i], obj->items[i].line);
    }
    return 0;
}

/* Integer member.  Returns 1 if present, 0 if absent (out = dflt), -1 on error. */
static int get_int(loader *ld, const char *ctx, const json_value *obj, const char *key,
                   long long lo, long long hi, long long dflt, int required, long long *out)
{
    const json_value *v = json_get(obj, key);
    *out = dflt;
    if (!v || v->type == JSON_NULL) {
        if (required)
            return load_fail(ld, ctx, "missing \"%s\"", key);
        return 0;
    }
    if (v->type == JSON_STRING) {       /* allow "0x20B210DE" style */
        unsigned long long u;
        if (parse_ull(v->string, &u) < 0 || u > (unsigned long long)LLONG_MAX)
            return load_fail(ld, ctx, "\"%s\" must be an integer (line %d)", key, v->line);
        *out = (long long)u;
    } else if (v->type == JSON_NUMBER && v->is_integer) {
        *out = v->integer;
    } else {
        return load_fail(ld, ctx, "\"%s\" must be an integer (line %d)", key, v->line);
    }
    if (*out < lo || *out > hi)
        return load_fail(ld, ctx, "\"%s\" = %lld is out of range [%lld, %lld] (line %d)",
                         key, *out, lo, hi, v->line);
    return 1;
}

static int get_uint(loader *ld, const char *ctx, const json_value *obj, const char *key,
                    unsigned long long hi, unsigned long long dflt, int required, unsigned long long *out)
{
    long long v;
    int r = get_int(ld, ctx, obj, key, 0, (long long)hi, (long long)dflt, required, &v);
    *out = (unsigned long long)v;
    return r;
}

static int get_bool(loader *ld, const char *ctx, const json_value *obj, const char *key, int dflt, int *out)
{
    const json_value *v = json_get(obj, key);
    *out = dflt;
    if (!v || v->type == JSON_NULL)
        return 0;
    if (v->type != JSON_BOOL)
        return load_fail(ld, ctx, "\"%s\" must be true or false (line %d)", key, v->line);
    *out = v->boolean;
    return 1;
}

static int get_string(loader *ld, const char *ctx, const json_value *obj, const char *key,
                      char *dst, size_t dstsz, const char *dflt, int required)
{
    const json_value *v = json_get(obj, key);
    if (!v || v->type == JSON_NULL) {
        if (required)
            return load_fail(ld, ctx, "missing \"%s\"", key);
        snprintf(dst, dstsz, "%s", dflt ? dflt : "");
        return 0;
    }
    if (v->type != JSON_STRING)
        return load_fail(ld, ctx, "\"%s\" must be a string (line %d)", key, v->line);
    if (strlen(v->string) >= dstsz)
        return load_fail(ld, ctx, "\"%s\" is longer than %zu characters (line %d)", key, dstsz - 1, v->line);
    snprintf(dst, dstsz, "%s", v->string);
    return 1;
}

/* Fills an nvmlPciInfo_t from a bus id string, normalised the way NVML
 * prints it ("%08X:%02X:%02X.0" and the legacy "%04X:%02X:%02X.0"). */
static int fill_pci(nvmlPciInfo_t *pci, const char *bus_id)
{
    unsigned d, b, v, f;
    if (parse_bus_id(bus_id, &d, &b, &v, &f) < 0)
        return -1;
    pci->domain = d;
    pci->bus = b;
    pci->device = v;
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.%X", d, b, v, f);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", d & 0xFFFF, b, v, f);
    return 0;
}

static int parse_topology_level(const json_value *v, unsigned char *out)
{
    static const struct { const char *name; unsigned char level; } names[] = {
        { "INTERNAL", TOPO_INTERNAL }, { "SINGLE", TOPO_SINGLE },
        { "MULTIPLE", TOPO_MULTIPLE }, { "HOSTBRIDGE", TOPO_HOSTBRIDGE },
        { "NODE", TOPO_NODE }, { "CPU", TOPO_NODE }, { "SYSTEM", TOPO_SYSTEM },
    };
    size_t i;
    if (v->type == JSON_NUMBER && v->is_integer) {
        for (i = 0; i < sizeof names / sizeof names[0]; i++) {
            if (v->integer == names[i].level) {
                *out = names[i].level;
                return 0;
            }
        }
        return -1;
    }
    if (v->type == JSON_STRING) {
        const char *s = v->string;
        if (strncmp(s, "NVML_TOPOLOGY_", 14) == 0)
            s += 14;
        for (i = 0; i < sizeof names / sizeof names[0]; i++) {
            if (strcasecmp(s, names[i].name) == 0) {
                *out = names[i].level;
                return 0;
            }
        }
    }
    return -1;
}

static int uuid_taken(const inventory *inv, unsigned upto_gpu, const char *uuid)
{
    unsigned i, j;
    for (i = 0; i <= upto_gpu && i < inv->n_gpus; i++) {
        const fake_gpu *g = &inv->gpus[i];
        if (g->magic && strcmp(g->uuid, uuid) == 0)
            return 1;
        for (j = 0; j < g->n_mig; j++)
            if (strcmp(g->migs[j]->uuid, uuid) == 0)
                return 1;
    }
    return 0;
}

static int load_mig(loader *ld, inventory *inv, fake_gpu *g, unsigned k, const json_value *m)
{
    static const char *const keys[] = {
        "uuid", "name", "profile", "slices", "ci_slices", "memory_mb", "memory_used_mb",
        "gi", "ci", "sm_count", "copy_engines", "decoders", "encoders", "jpegs", "ofas", NULL
    };
    char ctx[64];
    fake_mig *mig;
    unsigned long long u;
    unsigned j;

    snprintf(ctx, sizeof ctx, "gpus[%u].mig_devices[%u]", g->index, k);
    if (check_keys(ld, ctx, m, keys) < 0)
        return -1;
    mig = pool_alloc(inv, sizeof *mig);
    if (!mig)
        return load_fail(ld, ctx, "out of memory");
    g->migs[k] = mig;
    mig->parent = g;
    mig->index = k;
    if (get_string(ld, ctx, m, "uuid", mig->uuid, 80, NULL, 1) < 0)
        return -1;
    if (strncmp(mig->uuid, "MIG-", 4) != 0)
        return load_fail(ld, ctx, "uuid \"%s\" must start with \"MIG-\"", mig->uuid);
    if (uuid_taken(inv, g->index, mig->uuid))
        return load_fail(ld, ctx, "duplicate uuid \"%s\"", mig->uuid);
    if (get_string(ld, ctx, m, "profile", mig->profile, sizeof mig->profile, NULL, 1) < 0)
        return -1;
    {
        char dflt[NAME_BUFFER_SIZE + 40];
        snprintf(dflt, sizeof dflt, "%s MIG %s", g->name, mig->profile);
        dflt[NAME_BUFFER_SIZE - 1] = '\0';
        if (get_string(ld, ctx, m, "name", mig->name, sizeof mig->name, dflt, 0) < 0)
            return -1;
    }
    if (get_uint(ld, ctx, m, "slices", 8, 0, 1, &u) < 0) return -1;
    mig->slices = (unsigned)u;
    if (get_uint(ld, ctx, m, "ci_slices", 8, mig->slices, 0, &u) < 0) return -1;
    mig->ci_slices = (unsigned)u;
    if (get_uint(ld, ctx, m, "memory_mb", 1ULL << 40, 0, 1, &mig->memory_mb) < 0) return -1;
    if (get_uint(ld, ctx, m, "memory_used_mb", mig->memory_mb, 0, 0, &mig->memory_used_mb) < 0) return -1;
    if (get_uint(ld, ctx, m, "gi", 0xFFFFFFFEu, 0, 1, &u) < 0) return -1;
    mig->gi = (unsigned)u;
    if (get_uint(ld, ctx, m, "ci", 0xFFFFFFFEu, 0, 1, &u) < 0) return -1;
    mig->ci = (unsigned)u;
    if (get_uint(ld, ctx, m, "sm_count", 100000, 0, 0, &u) < 0) return -1;
    mig->sm_count = (unsigned)u;
    if (get_uint(ld, ctx, m, "copy_engines", 64, 0, 0, &u) < 0) return -1;
    mig->copy_engines = (unsigned)u;
    if (get_uint(ld, ctx, m, "decoders", 64, 0, 0, &u) < 0) return -1;
    mig->decoders = (unsigned)u;
    if (get_uint(ld, ctx, m, "encoders", 64, 0, 0, &u) < 0) return -1;
    mig->encoders = (unsigned)u;
    if (get_uint(ld, ctx, m, "jpegs", 64, 0, 0, &u) < 0) return -1;
    mig->jpegs = (unsigned)u;
    if (get_uint(ld, ctx, m, "ofas", 64, 0, 0, &u) < 0) return -1;
    mig->ofas = (unsigned)u;
    for (j = 0; j < k; j++)
        if (g->migs[j]->gi == mig->gi && g->migs[j]->ci == mig->ci)
            return load_fail(ld, ctx, "another MIG device already has gi %u ci %u", mig->gi, mig->ci);
    mig->magic = MIG_MAGIC;
    return 0;
}

static int load_links(loader *ld, fake_gpu *g, const json_value *arr, unsigned n_gpus)
{
    static const char *const keys[] = { "link", "links", "peer", "remote_pci_bus_id", "active", NULL };
    size_t i, j;
    char ctx[64];

    if (arr->type != JSON_ARRAY)
        return load_fail(ld, "nvlinks", "gpus[%u].nvlinks must be an array", g->index);
    for (i = 0; i < arr->count; i++) {
        const json_value *e = &arr->items[i];
        const json_value *list = json_get(e, "links");
        long long link, peer;
        int active, has_link;
        char remote[BUSID_BUFFER_SIZE];
        int has_remote;
        size_t n_links;

        snprintf(ctx, sizeof ctx, "gpus[%u].nvlinks[%zu]", g->index, i);
        if (check_keys(ld, ctx, e, keys) < 0)
            return -1;
        has_link = get_int(ld, ctx, e, "link", 0, NVML_NVLINK_MAX_LINKS - 1, 0, 0, &link);
        if (has_link < 0)
            return -1;
        if (has_link == (list != NULL))
            return load_fail(ld, ctx, "give exactly one of \"link\" and \"links\"");
        if (list && list->type != JSON_ARRAY)
            return load_fail(ld, ctx, "\"links\" must be an array of link numbers");
        if (get_int(ld, ctx, e, "peer", 0, (long long)n_gpus - 1, -1, 0, &peer) < 0)
            return -1;
        if (peer == (long long)g->index)
            return load_fail(ld, ctx, "a GPU cannot be its own NVLink peer");
        if ((has_remote = get_string(ld, ctx, e, "remote_pci_bus_id", remote, sizeof remote, NULL, 0)) < 0)
            return -1;
        if ((peer >= 0) == (has_remote == 1))
            return load_fail(ld, ctx, "give exactly one of \"peer\" and \"remote_pci_bus_id\"");
        if (get_bool(ld, ctx, e, "active", 1, &active) < 0)
            return -1;

        n_links = list ? list->count : 1;
        for (j = 0; j < n_links; j++) {
            fake_link *l;
            if (list) {
                const json_value *x = &list->items[j];
                if (x->type != JSON_NUMBER || !x->is_integer || x->integer < 0 ||
                    x->integer >= NVML_NVLINK_MAX_LINKS)
                    return load_fail(ld, ctx, "\"links\" entries must be integers in [0, %d]",
                                     NVML_NVLINK_MAX_LINKS - 1);
                link = x->integer;
            }
            l = &g->links[link];
            if (l->present)
                return load_fail(ld, ctx, "link %lld is listed twice", link);
            l->present = 1;
            l->active = active;
            l->peer = (int)peer;
            l->has_remote = has_remote == 1;
            if (l->has_remote && fill_pci(&l->remote, remote) < 0)
                return load_fail(ld, ctx, "bad remote_pci_bus_id \"%s\"", remote);
        }
    }
    return 0;
}

/* ---- MIG models: GPU-instance profiles and placements -----------------
 *
 * A MIG GPU has 8 memory slices and 7 compute slices.  A GPU instance of a
 * profile covers `size` consecutive memory slices starting at one of the
 * offsets its profile allows, and instances may not overlap (this also
 * bounds the compute slices to 7).  The GPU-instance id follows from the
 * placement: 0 for the whole GPU, 1-2 for the halves (size 4), 3-6 for the
 * quarters (size 2), 7-14 for single slices, as on an A100. */

static const gi_profile PROFILES_A100_40GB[] = {
    /* name      enum  id sl sz starts inst  sm ce dec enc jpg ofa  memory */
    { "1g.5gb",  0x0, 19, 1, 1, 0x7F, 7,  14, 1, 0, 0, 0, 0,  4864 },
    { "1g.10gb", 0x9, 15, 1, 2, 0x55, 4,  14, 1, 1, 0, 1, 0,  9856 },
    { "2g.10gb", 0x1, 14, 2, 2, 0x15, 3,  28, 2, 1, 0, 0, 0,  9856 },
    { "3g.20gb", 0x2,  9, 3, 4, 0x11, 2,  42, 3, 2, 0, 0, 0, 19968 },
    { "4g.20gb", 0x3,  5, 4, 4, 0x01, 1,  56, 4, 2, 0, 0, 0, 19968 },
    { "7g.40gb", 0x4,  0, 7, 8, 0x01, 1,  98, 7, 5, 0, 1, 1, 40192 },
};

static const gi_profile PROFILES_A100_80GB[] = {
    { "1g.10gb", 0x0, 19, 1, 1, 0x7F, 7,  14, 1, 0, 0, 0, 0,  9728 },
    { "1g.20gb", 0x9, 15, 1, 2, 0x55, 4,  14, 1, 1, 0, 1, 0, 19968 },
    { "2g.20gb", 0x1, 14, 2, 2, 0x15, 3,  28, 2, 1, 0, 0, 0, 19968 },
    { "3g.40gb", 0x2,  9, 3, 4, 0x11, 2,  42, 3, 2, 0, 0, 0, 40192 },
    { "4g.40gb", 0x3,  5, 4, 4, 0x01, 1,  56, 4, 2, 0, 0, 0, 40192 },
    { "7g.80gb", 0x4,  0, 7, 8, 0x01, 1,  98, 7, 5, 0, 1, 1, 80896 },
};

static const gi_profile PROFILES_H100_80GB[] = {
    { "1g.10gb", 0x0, 19, 1, 1, 0x7F, 7,  16, 1, 1, 0, 1, 0,  9856 },
    { "1g.20gb", 0x9, 15, 1, 2, 0x55, 4,  16, 1, 1, 0, 1, 0, 19968 },
    { "2g.20gb", 0x1, 14, 2, 2, 0x15, 3,  32, 2, 2, 0, 2, 0, 19968 },
    { "3g.40gb", 0x2,  9, 3, 4, 0x11, 2,  60, 3, 3, 0, 3, 0, 40320 },
    { "4g.40gb", 0x3,  5, 4, 4, 0x01, 1,  64, 4, 4, 0, 4, 0, 40320 },
    { "7g.80gb", 0x4,  0, 7, 8, 0x01, 1, 132, 7, 7, 0, 7, 1, 80896 },
};

#define MODEL(n, t) { n, t, sizeof t / sizeof t[0] }
static const mig_model MIG_MODELS[] = {
    MODEL("a100-40gb", PROFILES_A100_40GB),
    MODEL("a100-80gb", PROFILES_A100_80GB),
    MODEL("h100-80gb", PROFILES_H100_80GB),
};
#undef MODEL

#define MIG_MEMORY_SLICES 8

/* The MIG model of a GPU: the inventory's "mig_model", else guessed from the
 * product name and memory (A100 40/80 GB, H100 80 GB); NULL for others. */
static const mig_model *guess_mig_model(const fake_gpu *g)
{
    const char *want = NULL;
    size_t i;
    if (strstr(g->name, "H100") && g->memory_mb >= 65536)
        want = "h100-80gb";
    else if (strstr(g->name, "A100"))
        want = g->memory_mb >= 65536 ? "a100-80gb" : "a100-40gb";
    for (i = 0; want && i < sizeof MIG_MODELS / sizeof MIG_MODELS[0]; i++)
        if (strcmp(MIG_MODELS[i].name, want) == 0)
            return &MIG_MODELS[i];
    return NULL;
}

static const gi_profile *profile_by_enum(const fake_gpu *g, unsigned e)
{
    unsigned i;
    for (i = 0; g->model && i < g->model->n; i++)
        if (g->model->profiles[i].nvml_profile == e)
            return &g->model->profiles[i];
    return NULL;
}

static const gi_profile *profile_by_id(const fake_gpu *g, unsigned id)
{
    unsigned i;
    for (i = 0; g->model && i < g->model->n; i++)
        if (g->model->profiles[i].id == id)
            return &g->model->profiles[i];
    return NULL;
}

/* "3g.40gb", or "1c.3g.40gb" for a compute instance smaller than its GPU instance. */
static const gi_profile *profile_by_name(const fake_gpu *g, const char *name)
{
    unsigned i;
    const char *dot = strchr(name, '.');
    if (dot && dot[-1] == 'c' && strchr(dot + 1, '.'))
        name = dot + 1;
    for (i = 0; g->model && i < g->model->n; i++)
        if (strcmp(g->model->profiles[i].name, name) == 0)
            return &g->model->profiles[i];
    return NULL;
}

static unsigned gi_id_for(unsigned size, unsigned start)
{
    switch (size) {
    case 8: return 0;
    case 4: return 1 + start / 4;
    case 2: return 3 + start / 2;
    default: return 7 + start;
    }
}

/* Compute-instance profiles: NVML_COMPUTE_INSTANCE_PROFILE_{1,2,3,4,7}_SLICE
 * are 0-4; the profile id is the enum value. */
static unsigned ci_profile_slices(unsigned e)
{
    static const unsigned slices[] = { 1, 2, 3, 4, 7 };
    return e < 5 ? slices[e] : 0;
}

static int ci_profile_for_slices(unsigned n)
{
    unsigned e;
    for (e = 0; e < 5; e++)
        if (ci_profile_slices(e) == n)
            return (int)e;
    return -1;
}

/* Memory slices covered by the GPU's instances. */
static unsigned gi_used_mask(const fake_gpu *g)
{
    unsigned i, mask = 0;
    for (i = 0; i < g->n_gi; i++)
        mask |= ((1u << g->gis[i]->prof->size) - 1) << g->gis[i]->start;
    return mask;
}

static int placement_free(const fake_gpu *g, const gi_profile *p, unsigned start)
{
    unsigned want;
    if (start >= MIG_MEMORY_SLICES || !(p->starts & (1u << start)))
        return 0;
    want = ((1u << p->size) - 1) << start;
    return !(gi_used_mask(g) & want);
}

static unsigned gi_count(const fake_gpu *g, const gi_profile *p)
{
    unsigned i, n = 0;
    for (i = 0; i < g->n_gi; i++)
        n += g->gis[i]->prof == p;
    return n;
}

static fake_gi *gi_by_id(const fake_gpu *g, unsigned id)
{
    unsigned i;
    for (i = 0; i < g->n_gi; i++)
        if (g->gis[i]->id == id)
            return g->gis[i];
    return NULL;
}

static fake_gi *gi_add(inventory *inv, fake_gpu *g, const gi_profile *p, unsigned start)
{
    fake_gi *gi = pool_alloc(inv, sizeof *gi);
    if (!gi)
        return NULL;
    gi->magic = GI_MAGIC;
    gi->gpu = g;
    gi->prof = p;
    gi->start = start;
    gi->id = gi_id_for(p->size, start);
    g->gis[g->n_gi++] = gi;
    return gi;
}

/* Works out the GPU and compute instances behind the inventory's MIG
 * devices.  When they do not describe a layout the model allows, the GPU
 * keeps its MIG devices but cannot be re-partitioned; mig_fixed says why. */
static int build_static_layout(inventory *inv, fake_gpu *g)
{
    unsigned j, k;
    g->mig_fixed[0] = '\0';
    g->n_gi = 0;
    if (!g->mig_capable || !g->model) {
        snprintf(g->mig_fixed, sizeof g->mig_fixed, "%s",
                 g->mig_capable ? "no MIG model for this GPU (set \"mig_model\")" : "not MIG capable");
        return 0;
    }
    for (j = 0; j < g->n_mig && !g->mig_fixed[0]; j++) {
        fake_mig *m = g->migs[j];
        const gi_profile *p = profile_by_name(g, m->profile);
        fake_gi *gi = gi_by_id(g, m->gi);
        unsigned start = 0, used = 0;
        int cip = ci_profile_for_slices(m->ci_slices);
        if (!p) {
            snprintf(g->mig_fixed, sizeof g->mig_fixed, "MIG device %u: profile \"%s\" is not one of %s",
                     j, m->profile, g->model->name);
            break;
        }
        if (!gi) {
            for (start = 0; start < MIG_MEMORY_SLICES; start++)
                if ((p->starts & (1u << start)) && gi_id_for(p->size, start) == m->gi)
                    break;
            if (start == MIG_MEMORY_SLICES || !placement_free(g, p, start) || g->n_gi == MAX_GI) {
                snprintf(g->mig_fixed, sizeof g->mig_fixed,
                         "MIG device %u: GPU instance %u cannot hold a %s instance here", j, m->gi, p->name);
                break;
            }
            gi = gi_add(inv, g, p, start);
            if (!gi)
                return -1;
        } else if (gi->prof != p) {
            snprintf(g->mig_fixed, sizeof g->mig_fixed,
                     "MIG device %u: GPU instance %u is a %s instance, not %s", j, m->gi, gi->prof->name, p->name);
            break;
        }
        for (k = 0; k < j; k++)
            if (g->migs[k]->gio == gi)
                used += g->migs[k]->ci_slices;
        if (m->slices != p->slices || cip < 0 || used + m->ci_slices > p->slices) {
            snprintf(g->mig_fixed, sizeof g->mig_fixed,
                     "MIG device %u: %u/%u slices do not fit GPU instance %u (%s)",
                     j, m->ci_slices, m->slices, m->gi, p->name);
            break;
        }
        m->gio = gi;
        m->ci_profile = (unsigned)cip;
        m->ci_start = used;
    }
    if (g->mig_fixed[0]) {
        for (j = 0; j < g->n_mig; j++)
            g->migs[j]->gio = NULL;
        for (j = 0; j < g->n_gi; j++)
            g->gis[j]->magic = 0;
        g->n_gi = 0;
    }
    return 0;
}

static int load_gpu(loader *ld, inventory *inv, unsigned idx, const json_value *o)
{
    static const char *const keys[] = {
        "uuid", "name", "serial", "memory_mb", "memory_used_mb", "memory_reserved_mb",
        "pci_bus_id", "pci_device_id", "pci_subsystem_id", "minor_number", "numa_node",
        "compute_capability", "sm_count", "temperature", "utilization", "memory_utilization",
        "power_mw", "power_limit_mw", "mig", "mig_pending", "max_mig_devices", "mig_devices",
        "nvlinks", "remapped_rows", "retired_pages", "ecc", "supported_events", "mig_model", NULL
    };
    static const char *const remap_keys[] = {
        "supported", "correctable", "uncorrectable", "pending", "failure", NULL
    };
    static const char *const retired_keys[] = { "supported", "pending", "sbe", "dbe", NULL };
    static const char *const ecc_keys[] = {
        "supported", "enabled", "volatile_corrected", "volatile_uncorrected",
        "aggregate_corrected", "aggregate_uncorrected", NULL
    };
    fake_gpu *g = &inv->gpus[idx];
    char ctx[48], bus[BUSID_BUFFER_SIZE];
    unsigned long long u;
    long long s;
    const json_value *v;
    unsigned j;
    int b, r;

    snprintf(ctx, sizeof ctx, "gpus[%u]", idx);
    if (check_keys(ld, ctx, o, keys) < 0)
        return -1;
    g->index = idx;
    for (j = 0; j < NVML_NVLINK_MAX_LINKS; j++)
        g->links[j].peer = -1;

    if (get_string(ld, ctx, o, "uuid", g->uuid, 80, NULL, 1) < 0)
        return -1;
    if (strncmp(g->uuid, "GPU-", 4) != 0)
        return load_fail(ld, ctx, "uuid \"%s\" must start with \"GPU-\"", g->uuid);
    if (uuid_taken(inv, idx, g->uuid))
        return load_fail(ld, ctx, "duplicate uuid \"%s\"", g->uuid);
    if (get_string(ld, ctx, o, "name", g->name, 64, NULL, 1) < 0)
        return -1;
    if (get_string(ld, ctx, o, "serial", g->serial, sizeof g->serial, NULL, 0) < 0)
        return -1;
    if (get_uint(ld, ctx, o, "memory_mb", 1ULL << 40, 0, 1, &g->memory_mb) < 0)
        return -1;
    if (get_uint(ld, ctx, o, "memory_reserved_mb", g->memory_mb, 0, 0, &g->memory_reserved_mb) < 0)
        return -1;
    if (get_uint(ld, ctx, o, "memory_used_mb", g->memory_mb - g->memory_reserved_mb, 0, 0, &g->memory_used_mb) < 0)
        return -1;

    if (get_string(ld, ctx, o, "pci_bus_id", bus, sizeof bus, NULL, 1) < 0)
        return -1;
    if (fill_pci(&g->pci, bus) < 0)
        return load_fail(ld, ctx, "bad pci_bus_id \"%s\" (want DDDDDDDD:BB:DD.F)", bus);
    for (j = 0; j < idx; j++)
        if (strcmp(inv->gpus[j].pci.busId, g->pci.busId) == 0)
            return load_fail(ld, ctx, "pci_bus_id %s is also used by gpus[%u]", g->pci.busId, j);
    if (get_uint(ld, ctx, o, "pci_device_id", 0xFFFFFFFFu, 0, 0, &u) < 0) return -1;
    g->pci.pciDeviceId = (unsigned)u;
    if (get_uint(ld, ctx, o, "pci_subsystem_id", 0xFFFFFFFFu, 0, 0, &u) < 0) return -1;
    g->pci.pciSubSystemId = (unsigned)u;
    if (get_uint(ld, ctx, o, "minor_number", 255, idx, 0, &u) < 0) return -1;
    g->minor = (unsigned)u;

    if ((r = get_int(ld, ctx, o, "numa_node", -1, 1023, -1, 0, &s)) < 0)
        return -1;
    g->has_numa = r;
    g->numa_node = (int)s;

    v = json_get(o, "compute_capability");
    if (v && v->type != JSON_NULL) {
        int maj, min, used = 0;
        if (v->type != JSON_STRING || sscanf(v->string, "%d.%d%n", &maj, &min, &used) != 2 ||
            v->string[used] != '\0' || maj < 0 || min < 0)
            return load_fail(ld, ctx, "\"compute_capability\" must be a string like \"8.0\"");
        g->has_cc = 1;
        g->cc_major = maj;
        g->cc_minor = min;
    }
    if (get_uint(ld, ctx, o, "sm_count", 100000, 0, 0, &u) < 0) return -1;
    g->sm_count = (unsigned)u;
    if (get_uint(ld, ctx, o, "temperature", 200, 35, 0, &u) < 0) return -1;
    g->temperature = (unsigned)u;
    if (get_uint(ld, ctx, o, "utilization", 100, 0, 0, &u) < 0) return -1;
    g->util_gpu = (unsigned)u;
    if (get_uint(ld, ctx, o, "memory_utilization", 100, 0, 0, &u) < 0) return -1;
    g->util_mem = (unsigned)u;
    if (get_uint(ld, ctx, o, "power_mw", 10000000, 50000, 0, &u) < 0) return -1;
    g->power_mw = (unsigned)u;
    if ((r = get_uint(ld, ctx, o, "power_limit_mw", 10000000, 0, 0, &u)) < 0) return -1;
    g->has_power_limit = r;
    g->power_limit_mw = (unsigned)u;

    /* MIG: key absent = GPU not MIG capable; false = capable, disabled. */
    v = json_get(o, "mig");
    g->mig_capable = v && v->type != JSON_NULL;
    if (get_bool(ld, ctx, o, "mig", 0, &g->mig_current) < 0)
        return -1;
    if (get_bool(ld, ctx, o, "mig_pending", g->mig_current, &g->mig_pending) < 0)
        return -1;
    if (!g->mig_capable && json_get(o, "mig_pending"))
        return load_fail(ld, ctx, "\"mig_pending\" needs \"mig\" (the GPU is not MIG capable without it)");
    if (get_uint(ld, ctx, o, "max_mig_devices", MAX_MIG, 7, 0, &u) < 0) return -1;
    g->max_mig = (unsigned)u;
    v = json_get(o, "mig_devices");
    if (v && v->type != JSON_NULL) {
        if (v->type != JSON_ARRAY)
            return load_fail(ld, ctx, "\"mig_devices\" must be an array");
        if (v->count && !g->mig_current)
            return load_fail(ld, ctx, "\"mig_devices\" given but \"mig\" is not true");
        if (v->count > g->max_mig)
            return load_fail(ld, ctx, "%zu MIG devices exceed max_mig_devices %u", v->count, g->max_mig);
        for (j = 0; j < v->count; j++) {
            if (load_mig(ld, inv, g, j, &v->items[j]) < 0)
                return -1;
            g->n_mig = j + 1;
        }
    }
    {
        char model[16];
        size_t mi;
        r = get_string(ld, ctx, o, "mig_model", model, sizeof model, NULL, 0);
        if (r < 0)
            return -1;
        if (r == 0) {
            g->model = guess_mig_model(g);
        } else if (strcmp(model, "none") != 0) {
            for (mi = 0; mi < sizeof MIG_MODELS / sizeof MIG_MODELS[0]; mi++)
                if (strcmp(MIG_MODELS[mi].name, model) == 0)
                    g->model = &MIG_MODELS[mi];
            if (!g->model)
                return load_fail(ld, ctx, "\"mig_model\" must be a100-40gb, a100-80gb, h100-80gb or none");
        }
        if (r == 1 && !g->mig_capable)
            return load_fail(ld, ctx, "\"mig_model\" needs \"mig\" (the GPU is not MIG capable without it)");
        if (build_static_layout(inv, g) < 0)
            return load_fail(ld, ctx, "out of memory");
    }

    v = json_get(o, "nvlinks");
    if (v && v->type != JSON_NULL && load_links(ld, g, v, inv->n_gpus) < 0)
        return -1;

    v = json_get(o, "remapped_rows");
    if (v && v->type != JSON_NULL) {
        char c2[64];
        snprintf(c2, sizeof c2, "%s.remapped_rows", ctx);
        if (check_keys(ld, c2, v, remap_keys) < 0) return -1;
        if (get_bool(ld, c2, v, "supported", 1, &g->remap_supported) < 0) return -1;
        if (get_uint(ld, c2, v, "correctable", 100000, 0, 0, &u) < 0) return -1;
        g->remap_correctable = (unsigned)u;
        if (get_uint(ld, c2, v, "uncorrectable", 100000, 0, 0, &u) < 0) return -1;
        g->remap_uncorrectable = (unsigned)u;
        if (get_bool(ld, c2, v, "pending", 0, &b) < 0) return -1;
        g->remap_pending = (unsigned)b;
        if (get_bool(ld, c2, v, "failure", 0, &b) < 0) return -1;
        g->remap_failure = (unsigned)b;
    }

    v = json_get(o, "retired_pages");
    if (v && v->type != JSON_NULL) {
        char c2[64];
        int cause;
        snprintf(c2, sizeof c2, "%s.retired_pages", ctx);
        if (check_keys(ld, c2, v, retired_keys) < 0) return -1;
        if (get_bool(ld, c2, v, "supported", 1, &g->retired_supported) < 0) return -1;
        if (get_bool(ld, c2, v, "pending", 0, &g->retired_pending) < 0) return -1;
        for (cause = 0; cause < 2; cause++) {
            const json_value *list = json_get(v, cause == NVML_RETIRE_DBE ? "dbe" : "sbe");
            if (!list || list->type == JSON_NULL)
                continue;
            if (list->type != JSON_ARRAY || list->count > MAX_RETIRED)
                return load_fail(ld, c2, "\"sbe\"/\"dbe\" must be arrays of at most %d addresses", MAX_RETIRED);
            for (j = 0; j < list->count; j++) {
                const json_value *a = &list->items[j];
                unsigned long long addr;
                if (a->type == JSON_STRING && parse_ull(a->string, &addr) == 0) {
                    /* ok */
                } else if (a->type == JSON_NUMBER && a->is_integer && a->integer >= 0) {
                    addr = (unsigned long long)a->integer;
                } else {
                    return load_fail(ld, c2, "page addresses must be integers or \"0x...\" strings");
                }
                g->retired_addr[cause][j] = addr;
                g->retired_time[cause][j] = 1700000000ULL + j;
            }
            g->n_retired[cause] = (unsigned)list->count;
        }
    }

    g->ecc_supported = 1;
    g->ecc_enabled = 1;
    v = json_get(o, "ecc");
    if (v && v->type != JSON_NULL) {
        char c2[64];
        snprintf(c2, sizeof c2, "%s.ecc", ctx);
        if (check_keys(ld, c2, v, ecc_keys) < 0) return -1;
        if (get_bool(ld, c2, v, "supported", 1, &g->ecc_supported) < 0) return -1;
        if (get_bool(ld, c2, v, "enabled", g->ecc_supported, &g->ecc_enabled) < 0) return -1;
        if (get_uint(ld, c2, v, "volatile_corrected", 1ULL << 40, 0, 0,
                     &g->ecc[NVML_MEMORY_ERROR_CORRECTED][NVML_VOLATILE_ECC]) < 0) return -1;
        if (get_uint(ld, c2, v, "volatile_uncorrected", 1ULL << 40, 0, 0,
                     &g->ecc[NVML_MEMORY_ERROR_UNCORRECTED][NVML_VOLATILE_ECC]) < 0) return -1;
        if (get_uint(ld, c2, v, "aggregate_corrected", 1ULL << 40, 0, 0,
                     &g->ecc[NVML_MEMORY_ERROR_CORRECTED][NVML_AGGREGATE_ECC]) < 0) return -1;
        if (get_uint(ld, c2, v, "aggregate_uncorrected", 1ULL << 40, 0, 0,
                     &g->ecc[NVML_MEMORY_ERROR_UNCORRECTED][NVML_AGGREGATE_ECC]) < 0) return -1;
        if (!g->ecc_supported && g->ecc_enabled)
            return load_fail(ld, c2, "ECC cannot be enabled when not supported");
    }

    /* What a data-center GPU typically reports. */
    g->supported_events = EV_XID_CRITICAL | EV_PSTATE | EV_CLOCK;
    if (g->ecc_enabled)
        g->supported_events |= EV_SINGLE_BIT_ECC | EV_DOUBLE_BIT_ECC;
    if (g->mig_capable)
        g->supported_events |= EV_MIG_CONFIG;
    if (get_uint(ld, ctx, o, "supported_events", ~0ULL >> 1, g->supported_events, 0, &u) < 0)
        return -1;
    g->supported_events = u;

    g->magic = GPU_MAGIC;
    return 0;
}

static int load_topology(loader *ld, inventory *inv, const json_value *arr)
{
    static const char *const keys[] = { "gpus", "level", NULL };
    size_t i, a, b;
    char ctx[48];

    if (arr->type != JSON_ARRAY)
        return load_fail(ld, "topology", "must be an array");
    for (i = 0; i < arr->count; i++) {
        const json_value *e = &arr->items[i];
        const json_value *list, *lv;
        unsigned char level;

        snprintf(ctx, sizeof ctx, "topology[%zu]", i);
        if (check_keys(ld, ctx, e, keys) < 0)
            return -1;
        list = json_get(e, "gpus");
        lv = json_get(e, "level");
        if (!list || list->type != JSON_ARRAY || list->count < 2)
            return load_fail(ld, ctx, "\"gpus\" must list at least two GPU indices");
        if (!lv || parse_topology_level(lv, &level) < 0)
            return load_fail(ld, ctx, "\"level\" must be one of NVML_TOPOLOGY_{INTERNAL,SINGLE,"
                                      "MULTIPLE,HOSTBRIDGE,NODE,SYSTEM} (or its number)");
        for (a = 0; a < list->count; a++) {
            const json_value *x = &list->items[a];
            if (x->type != JSON_NUMBER || !x->is_integer || x->integer < 0 ||
                x->integer >= (long long)inv->n_gpus)
                return load_fail(ld, ctx, "GPU indices must be integers below the GPU count (%u)",
                                 inv->n_gpus);
        }
        /* The level applies to every pair in the group; later entries win. */
        for (a = 0; a < list->count; a++) {
            for (b = 0; b < list->count; b++) {
                long long x = list->items[a].integer, y = list->items[b].integer;
                if (x != y)
                    inv->topo[x][y] = level;
            }
        }
    }
    return 0;
}

static void inventory_free(inventory *inv)
{
    if (!inv)
        return;
    while (inv->pool) {
        pool_block *b = inv->pool;
        inv->pool = b->next;
        free(b);
    }
    free(inv->gpus);
    free(inv);
}

/* Reads and validates the inventory.  Returns NULL with ld->err set. */
static inventory *inventory_load(loader *ld, const char *path)
{
    static const char *const keys[] = {
        "driver", "cuda", "nvml_version", "mig_event_device", "gpus", "topology", NULL
    };
    inventory *inv = NULL;
    json_value root;
    char *text = NULL, jerr[256], mig_dev[16];
    size_t len = 0;
    long long cuda;
    const json_value *gpus, *topo;
    unsigned i, j;
    FILE *f;

    memset(&root, 0, sizeof root);
    f = fopen(path, "rb");
    if (!f) {
        load_fail(ld, path, "cannot open: %s", strerror(errno));
        return NULL;
    }
    {
        char chunk[65536];
        size_t n;
        while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
            char *t = realloc(text, len + n + 1);
            if (!t) {
                fclose(f);
                free(text);
                load_fail(ld, path, "out of memory");
                return NULL;
            }
            text = t;
            memcpy(text + len, chunk, n);
            len += n;
        }
        if (ferror(f)) {
            fclose(f);
            free(text);
            load_fail(ld, path, "read error");
            return NULL;
        }
        fclose(f);
    }
    if (json_parse(text ? text : "", len, &root, jerr, sizeof jerr) < 0) {
        free(text);
        load_fail(ld, path, "invalid JSON: %s", jerr);
        return NULL;
    }
    free(text);

    inv = calloc(1, sizeof *inv);
    if (!inv) {
        load_fail(ld, path, "out of memory");
        goto fail;
    }
    if (check_keys(ld, "inventory", &root, keys) < 0)
        goto fail;
    if (get_string(ld, "inventory", &root, "driver", inv->driver, sizeof inv->driver, "580.00.01", 0) < 0)
        goto fail;
    if (get_int(ld, "inventory", &root, "cuda", 1000, 99999, 12080, 0, &cuda) < 0)
        goto fail;
    inv->cuda = (int)cuda;
    {
        char dflt[VERSION_BUFFER_SIZE + 16];
        snprintf(dflt, sizeof dflt, "%d.%s", inv->cuda / 1000, inv->driver);
        dflt[VERSION_BUFFER_SIZE - 1] = '\0';
        if (get_string(ld, "inventory", &root, "nvml_version", inv->nvml_version,
                       sizeof inv->nvml_version, dflt, 0) < 0)
            goto fail;
    }
    if (get_string(ld, "inventory", &root, "mig_event_device", mig_dev, sizeof mig_dev, "mig", 0) < 0)
        goto fail;
    if (strcmp(mig_dev, "parent") == 0) {
        inv->mig_event_device_is_parent = 1;
    } else if (strcmp(mig_dev, "mig") != 0) {
        load_fail(ld, "inventory", "\"mig_event_device\" must be \"mig\" or \"parent\"");
        goto fail;
    }

    gpus = json_get(&root, "gpus");
    if (!gpus || gpus->type != JSON_ARRAY) {
        load_fail(ld, "inventory", "\"gpus\" must be an array");
        goto fail;
    }
    if (gpus->count > MAX_GPUS) {
        load_fail(ld, "inventory", "at most %d GPUs are supported", MAX_GPUS);
        goto fail;
    }
    inv->n_gpus = (unsigned)gpus->count;
    inv->gpus = calloc(inv->n_gpus ? inv->n_gpus : 1, sizeof *inv->gpus);
    if (!inv->gpus) {
        load_fail(ld, path, "out of memory");
        goto fail;
    }
    for (i = 0; i < inv->n_gpus; i++)
        if (load_gpu(ld, inv, i, &gpus->items[i]) < 0)
            goto fail;

    for (i = 0; i < MAX_GPUS; i++)
        for (j = 0; j < MAX_GPUS; j++)
            inv->topo[i][j] = (i == j) ? TOPO_INTERNAL : TOPO_SYSTEM;
    topo = json_get(&root, "topology");
    if (topo && topo->type != JSON_NULL && load_topology(ld, inv, topo) < 0)
        goto fail;

    json_free(&root);
    return inv;
fail:
    json_free(&root);
    inventory_free(inv);
    return NULL;
}

/* ======================================================================
 * 5. Global state, locking, handle resolution
 * ====================================================================== */

#define EVQ_CAP 256

typedef struct {
    void *device;                       /* fake_gpu* or fake_mig* */
    unsigned long long type, data;
    unsigned gi, ci;
    int lost;                           /* pseudo-entry: report GPU_IS_LOST */
} fake_event;

typedef struct event_set {
    uint32_t magic;
    struct event_set *next;
    unsigned long long mask[MAX_GPUS];  /* registered event types per GPU */
    fake_event q[EVQ_CAP];              /* FIFO ring */
    unsigned head, count;
} event_set;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned g_init_count;           /* nvmlInit nesting depth */
static inventory *g_inv;
static event_set *g_sets;

static struct {
    int enabled;
    char path[4096];
    int have_stat;
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
    off_t offset;                       /* bytes consumed (complete lines) */
    unsigned long lineno;               /* lines consumed */
} g_faults;

static void poll_faults_locked(void);

/* Every API entry point brackets its work with enter()/leave(). */
static nvmlReturn_t enter(void)
{
    pthread_mutex_lock(&g_lock);
    if (!g_init_count)
        return NVML_ERROR_UNINITIALIZED;
    poll_faults_locked();
    return NVML_SUCCESS;
}

static nvmlReturn_t leave(nvmlReturn_t r)
{
    pthread_mutex_unlock(&g_lock);
    return r;
}

static fake_gpu *find_gpu(const void *h)
{
    unsigned i;
    for (i = 0; i < g_inv->n_gpus; i++)
        if ((const void *)&g_inv->gpus[i] == h)
            return &g_inv->gpus[i];
    return NULL;
}

static fake_mig *find_mig(const void *h)
{
    unsigned i, j;
    for (i = 0; i < g_inv->n_gpus; i++)
        for (j = 0; j < g_inv->gpus[i].n_mig; j++)
            if ((const void *)g_inv->gpus[i].migs[j] == h)
                return g_inv->gpus[i].migs[j];
    return NULL;
}

typedef struct {
    fake_gpu *gpu;                      /* the physical GPU (parent for MIG) */
    fake_mig *mig;                      /* non-NULL for a MIG device handle */
} dev_ref;

enum {
    ALLOW_MIG = 1,                      /* the call is meaningful on MIG handles */
    IGNORE_LOST = 2                     /* pure handle bookkeeping, works when lost */
};

/* Validates a device handle.  MIG handles are rejected with NOT_SUPPORTED
 * unless ALLOW_MIG; a lost GPU (or any of its MIG devices) gives
 * GPU_IS_LOST unless IGNORE_LOST. */
static nvmlReturn_t resolve(nvmlDevice_t h, int flags, dev_ref *out)
{
    out->gpu = find_gpu(h);
    out->mig = NULL;
    if (!out->gpu) {
        out->mig = find_mig(h);
        if (!out->mig)
            return NVML_ERROR_INVALID_ARGUMENT;
        out->gpu = out->mig->parent;
    }
    if (out->gpu->lost && !(flags & IGNORE_LOST))
        return NVML_ERROR_GPU_IS_LOST;
    if (out->mig && !(flags & ALLOW_MIG))
        return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

/* enter() + resolve() in one step; the lock is held on return either way. */
static nvmlReturn_t enter_dev(nvmlDevice_t h, int flags, dev_ref *out)
{
    nvmlReturn_t r = enter();
    if (r != NVML_SUCCESS)
        return r;
    return resolve(h, flags, out);
}

/* ======================================================================
 * 6. Event sets
 * ====================================================================== */

static event_set *find_set(const void *p)
{
    event_set *s;
    for (s = g_sets; s; s = s->next)
        if ((const void *)s == p)
            return s;
    return NULL;
}

static void enqueue(event_set *s, const fake_event *e)
{
    if (s->count == EVQ_CAP) {
        warnf("event queue full (%d events); dropping an event of type 0x%llx", EVQ_CAP, e->type);
        return;
    }
    s->q[(s->head + s->count) % EVQ_CAP] = *e;
    s->count++;
}

/* Delivers an event to every set that registered its type on the GPU. */
static void emit(fake_gpu *g, fake_mig *mig, unsigned long long type, unsigned long long data)
{
    event_set *s;
    fake_event e;

    if (g->lost)
        return;                         /* a GPU off the bus reports nothing */
    memset(&e, 0, sizeof e);
    e.type = type;
    e.data = data;
    if (mig) {
        e.device = g_inv->mig_event_device_is_parent ? (void *)g : (void *)mig;
        e.gi = mig->gi;
        e.ci = mig->ci;
    } else {
        e.device = g;
        e.gi = NVML_INSTANCE_ID_NONE;
        e.ci = NVML_INSTANCE_ID_NONE;
    }
    for (s = g_sets; s; s = s->next)
        if (s->mask[g->index] & type)
            enqueue(s, &e);
}

/* Queues a one-shot GPU_IS_LOST report in every set watching the GPU. */
static void emit_lost(fake_gpu *g)
{
    event_set *s;
    fake_event e;
    memset(&e, 0, sizeof e);
    e.device = g;
    e.lost = 1;
    e.gi = e.ci = NVML_INSTANCE_ID_NONE;
    for (s = g_sets; s; s = s->next)
        if (s->mask[g->index])
            enqueue(s, &e);
}

static void free_all_sets(void)
{
    while (g_sets) {
        event_set *s = g_sets;
        g_sets = s->next;
        s->magic = 0;
        free(s);
    }
}

/* ======================================================================
 * 7. Fault file watcher
 *
 * The file is append-only by convention.  We remember how many bytes
 * (= complete lines) were consumed and apply every new complete line once.
 * A trailing line without '\n' waits until it is completed.  If the file
 * shrinks or is replaced (new inode) it is read again from the start.
 * ====================================================================== */

static int parse_uint_tok(const char *tok, unsigned long long max, unsigned long long *out)
{
    return (parse_ull(tok, out) == 0 && *out <= max) ? 0 : -1;
}

static void apply_fault(char *line, unsigned long lineno)
{
    char *argv[8], *save = NULL, *tok;
    int argc = 0;
    unsigned long long gpu_idx, a, b, c;
    fake_gpu *g;
    const char *cmd;

    for (tok = strtok_r(line, " \t", &save); tok && argc < 8; tok = strtok_r(NULL, " \t", &save))
        argv[argc++] = tok;
    if (argc == 0 || argv[0][0] == '#')
        return;
    cmd = argv[0];
    if (tok) {
        warnf("FAKENVML_FAULTS line %lu: too many words; ignored", lineno);
        return;
    }
    if (argc < 2 || parse_uint_tok(argv[1], UINT_MAX, &gpu_idx) < 0) {
        warnf("FAKENVML_FAULTS line %lu: \"%s\" needs a GPU index; ignored", lineno, cmd);
        return;
    }
    if (gpu_idx >= g_inv->n_gpus) {
        warnf("FAKENVML_FAULTS line %lu: no GPU %llu (there are %u); ignored", lineno, gpu_idx, g_inv->n_gpus);
        return;
    }
    g = &g_inv->gpus[gpu_idx];

    if (strcmp(cmd, "xid") == 0) {
        /* xid GPU XID [mig GI CI] */
        if (argc == 3 && parse_uint_tok(argv[2], ~0ULL, &a) == 0) {
            emit(g, NULL, EV_XID_CRITICAL, a);
            return;
        }
        if (argc == 6 && strcmp(argv[3], "mig") == 0 && parse_uint_tok(argv[2], ~0ULL, &a) == 0 &&
            parse_uint_tok(argv[4], UINT_MAX, &b) == 0 && parse_uint_tok(argv[5], UINT_MAX, &c) == 0) {
            unsigned j;
            for (j = 0; j < g->n_mig; j++) {
                if (g->migs[j]->gi == b && g->migs[j]->ci == c) {
                    emit(g, g->migs[j], EV_XID_CRITICAL, a);
                    return;
                }
            }
            warnf("FAKENVML_FAULTS line %lu: GPU %llu has no MIG device gi %llu ci %llu; ignored",
                  lineno, gpu_idx, b, c);
            return;
        }
        warnf("FAKENVML_FAULTS line %lu: usage: xid GPU XID [mig GI CI]; ignored", lineno);
    } else if (strcmp(cmd, "ecc") == 0) {
        /* ecc GPU [double|single] */
        int dbe = argc == 2 || strcmp(argv[2], "double") == 0;
        if (argc > 3 || (argc == 3 && !dbe && strcmp(argv[2], "single") != 0)) {
            warnf("FAKENVML_FAULTS line %lu: usage: ecc GPU [double|single]; ignored", lineno);
            return;
        }
        if (!g->ecc_enabled) {
            warnf("FAKENVML_FAULTS line %lu: ECC is not enabled on GPU %llu; ignored", lineno, gpu_idx);
            return;
        }
        if (g->lost)
            return;
        {
            int type = dbe ? NVML_MEMORY_ERROR_UNCORRECTED : NVML_MEMORY_ERROR_CORRECTED;
            g->ecc[type][NVML_VOLATILE_ECC]++;
            g->ecc[type][NVML_AGGREGATE_ECC]++;
        }
        emit(g, NULL, dbe ? EV_DOUBLE_BIT_ECC : EV_SINGLE_BIT_ECC, 0);
    } else if (strcmp(cmd, "proc") == 0 && (argc == 4 || argc == 7) &&
               parse_uint_tok(argv[2], UINT_MAX, &a) == 0 && parse_uint_tok(argv[3], 1ULL << 40, &b) == 0 &&
               (argc == 4 || strcmp(argv[4], "mig") == 0)) {
        /* proc GPU PID MEM_MB [mig GI CI] */
        unsigned long long gi = NVML_INSTANCE_ID_NONE, ci = NVML_INSTANCE_ID_NONE;
        fake_proc *p;
        if (argc == 7 && (parse_uint_tok(argv[5], 0xFFFFFFFEu, &gi) < 0 || parse_uint_tok(argv[6], 0xFFFFFFFEu, &ci) < 0)) {
            warnf("FAKENVML_FAULTS line %lu: usage: proc GPU PID MEM_MB [mig GI CI]; ignored", lineno);
            return;
        }
        if (g_inv->n_procs == MAX_PROCS) {
            warnf("FAKENVML_FAULTS line %lu: more than %d processes; ignored", lineno, MAX_PROCS);
            return;
        }
        p = &g_inv->procs[g_inv->n_procs++];
        p->gpu = (unsigned)gpu_idx;
        p->pid = (unsigned)a;
        p->mem_mb = b;
        p->gi = (unsigned)gi;
        p->ci = (unsigned)ci;
    } else if (strcmp(cmd, "endproc") == 0 && argc == 3 && parse_uint_tok(argv[2], UINT_MAX, &a) == 0) {
        unsigned i, j;
        for (i = j = 0; i < g_inv->n_procs; i++)
            if (g_inv->procs[i].gpu != gpu_idx || g_inv->procs[i].pid != a)
                g_inv->procs[j++] = g_inv->procs[i];
        g_inv->n_procs = j;
    } else if (strcmp(cmd, "lost") == 0 && argc == 2) {
        if (!g->lost) {
            emit_lost(g);
            g->lost = 1;
        }
    } else if (strcmp(cmd, "recover") == 0 && argc == 2) {
        g->lost = 0;
    } else if (strcmp(cmd, "temp") == 0 && argc == 3 && parse_uint_tok(argv[2], 200, &a) == 0) {
        g->temperature = (unsigned)a;
    } else if (strcmp(cmd, "util") == 0 && (argc == 4 || argc == 5) &&
               parse_uint_tok(argv[2], 100, &a) == 0 &&
               parse_uint_tok(argv[3], g->memory_mb - g->memory_reserved_mb, &b) == 0 &&
               (argc == 4 || parse_uint_tok(argv[4], 100, &c) == 0)) {
        g->util_gpu = (unsigned)a;
        g->memory_used_mb = b;
        if (argc == 5)
            g->util_mem = (unsigned)c;
    } else if (strcmp(cmd, "power") == 0 && argc == 3 && parse_uint_tok(argv[2], 10000000, &a) == 0) {
        g->power_mw = (unsigned)a;
    } else if (strcmp(cmd, "remap") == 0 && argc >= 3) {
        if (!g->remap_supported)
            warnf("FAKENVML_FAULTS line %lu: GPU %llu does not support row remapping (applied anyway)",
                  lineno, gpu_idx);
        if (argc == 3 && strcmp(argv[2], "failure") == 0)
            g->remap_failure = 1;
        else if (argc == 3 && strcmp(argv[2], "pending") == 0)
            g->remap_pending = 1;
        else if (argc == 3 && strcmp(argv[2], "clear") == 0)
            g->remap_pending = g->remap_failure = 0;
        else if (argc == 4 && strcmp(argv[2], "correctable") == 0 && parse_uint_tok(argv[3], UINT_MAX, &a) == 0)
            g->remap_correctable = (unsigned)a;
        else if (argc == 4 && strcmp(argv[2], "uncorrectable") == 0 && parse_uint_tok(argv[3], UINT_MAX, &a) == 0)
            g->remap_uncorrectable = (unsigned)a;
        else
            warnf("FAKENVML_FAULTS line %lu: usage: remap GPU failure|pending|clear|"
                  "correctable N|uncorrectable N; ignored", lineno);
    } else if (strcmp(cmd, "retire") == 0 && argc == 4 &&
               (strcmp(argv[2], "sbe") == 0 || strcmp(argv[2], "dbe") == 0) &&
               parse_uint_tok(argv[3], ~0ULL, &a) == 0) {
        int cause = strcmp(argv[2], "dbe") == 0 ? NVML_RETIRE_DBE : NVML_RETIRE_MULTIPLE_SBE;
        if (g->n_retired[cause] >= MAX_RETIRED) {
            warnf("FAKENVML_FAULTS line %lu: too many retired pages; ignored", lineno);
            return;
        }
        g->retired_addr[cause][g->n_retired[cause]] = a;
        g->retired_time[cause][g->n_retired[cause]] = (unsigned long long)time(NULL);
        g->n_retired[cause]++;
        g->retired_pending = 1;
    } else {
        warnf("FAKENVML_FAULTS line %lu: cannot parse \"%s ...\"; ignored", lineno, cmd);
    }
}

static void poll_faults_locked(void)
{
    struct stat st;
    int fd;
    char *buf;
    size_t len = 0, cap, start, i;

    if (!g_faults.enabled)
        return;
    if (stat(g_faults.path, &st) != 0) {
        if (g_faults.have_stat) {           /* removed: a new file starts over */
            g_faults.have_stat = 0;
            g_faults.offset = 0;
            g_faults.lineno = 0;
        }
        return;
    }
    if (g_faults.have_stat && st.st_dev == g_faults.dev && st.st_ino == g_faults.ino &&
        st.st_size == g_faults.size && st.st_mtim.tv_sec == g_faults.mtime.tv_sec &&
        st.st_mtim.tv_nsec == g_faults.mtime.tv_nsec)
        return;                             /* unchanged */
    if (g_faults.have_stat && (st.st_dev != g_faults.dev || st.st_ino != g_faults.ino)) {
        g_faults.offset = 0;                /* replaced by another file */
        g_faults.lineno = 0;
    }
    if (st.st_size < g_faults.offset) {     /* truncated */
        g_faults.offset = 0;
        g_faults.lineno = 0;
    }
    g_faults.have_stat = 1;
    g_faults.dev = st.st_dev;
    g_faults.ino = st.st_ino;
    g_faults.size = st.st_size;
    g_faults.mtime = st.st_mtim;
    if (st.st_size <= g_faults.offset)
        return;

    fd = open(g_faults.path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    cap = (size_t)(st.st_size - g_faults.offset) + 4096;
    buf = malloc(cap + 1);
    if (!buf) {
        close(fd);
        return;
    }
    for (;;) {                              /* read to EOF from the offset */
        ssize_t n;
        if (len == cap) {
            char *nb = realloc(buf, cap * 2 + 1);
            if (!nb)
                break;
            buf = nb;
            cap *= 2;
        }
        n = pread(fd, buf + len, cap - len, g_faults.offset + (off_t)len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    close(fd);

    for (start = 0, i = 0; i < len; i++) {
        if (buf[i] != '\n')
            continue;
        buf[i] = '\0';
        if (i > start && buf[i - 1] == '\r')
            buf[i - 1] = '\0';
        g_faults.lineno++;
        apply_fault(buf + start, g_faults.lineno);
        start = i + 1;
    }
    g_faults.offset += (off_t)start;        /* a partial last line stays unread */
    free(buf);
}

/* ======================================================================
 * 8. Exported NVML API
 * ====================================================================== */

/* ---- init / shutdown / errors ---------------------------------------- */

static void setup_mig_log(void);        /* section 9 */

static nvmlReturn_t do_init(void)
{
    const char *cfg, *faults;
    inventory *inv;
    loader ld;

    pthread_mutex_lock(&g_lock);
    if (g_init_count) {                     /* nested init: reference count */
        g_init_count++;
        return leave(NVML_SUCCESS);
    }
    cfg = getenv("FAKENVML_CONFIG");
    if (!cfg || !*cfg) {
        warnf("nvmlInit: FAKENVML_CONFIG is not set; behaving as if no NVIDIA driver is installed");
        return leave(NVML_ERROR_LIBRARY_NOT_FOUND);
    }
    memset(&ld, 0, sizeof ld);
    inv = inventory_load(&ld, cfg);
    if (!inv) {
        warnf("nvmlInit: bad inventory: %s", ld.err);
        return leave(NVML_ERROR_UNKNOWN);
    }
    g_inv = inv;

    memset(&g_faults, 0, sizeof g_faults);
    faults = getenv("FAKENVML_FAULTS");
    if (faults && *faults) {
        if (strlen(faults) >= sizeof g_faults.path) {
            warnf("nvmlInit: FAKENVML_FAULTS path too long; faults disabled");
        } else {
            snprintf(g_faults.path, sizeof g_faults.path, "%s", faults);
            g_faults.enabled = 1;
        }
    }
    g_init_count = 1;
    setup_mig_log();                        /* the MIG layout as earlier calls left it */
    poll_faults_locked();                   /* state faults already written apply now */
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlInit(void) { return do_init(); }
EXPORT nvmlReturn_t nvmlInit_v2(void) { return do_init(); }

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;                            /* NO_GPUS / NO_ATTACH make no difference here */
    return do_init();
}

EXPORT nvmlReturn_t nvmlShutdown(void)
{
    pthread_mutex_lock(&g_lock);
    if (!g_init_count)
        return leave(NVML_ERROR_UNINITIALIZED);
    if (--g_init_count == 0) {
        /* Handles and event sets die with the last reference. */
        free_all_sets();
        inventory_free(g_inv);
        g_inv = NULL;
        memset(&g_faults, 0, sizeof g_faults);
    }
    return leave(NVML_SUCCESS);
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND:
        return "NVML Shared Library Not Found (fakenvml: FAKENVML_CONFIG is not set)";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_VGPU_ECC_NOT_SUPPORTED: return "ECC is not supported on vGPU";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient resources";
    case NVML_ERROR_FREQ_NOT_SUPPORTED: return "Frequency not supported";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_DEPRECATED: return "Deprecated";
    case NVML_ERROR_NOT_READY: return "Not ready";
    case NVML_ERROR_GPU_NOT_FOUND: return "GPU not found";
    case NVML_ERROR_INVALID_STATE: return "Invalid state";
    case NVML_ERROR_RESET_TYPE_NOT_SUPPORTED: return "Reset type not supported";
    case NVML_ERROR_UNKNOWN:
        return "Unknown Error (fakenvml: the FAKENVML_CONFIG inventory could not be loaded; see stderr)";
    default: return "Unknown Error";
    }
}

/* ---- system queries --------------------------------------------------- */

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    nvmlReturn_t r = enter();
    if (r == NVML_SUCCESS)
        r = copy_out(version, length, g_inv->driver);
    return leave(r);
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    nvmlReturn_t r = enter();
    if (r == NVML_SUCCESS)
        r = copy_out(version, length, g_inv->nvml_version);
    return leave(r);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    nvmlReturn_t r = enter();
    if (r == NVML_SUCCESS) {
        if (!cudaDriverVersion)
            r = NVML_ERROR_INVALID_ARGUMENT;
        else
            *cudaDriverVersion = g_inv->cuda;
    }
    return leave(r);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

/* GPUs attached to the NUMA node of the given CPU number (we treat the CPU
 * number as the NUMA node id). */
EXPORT nvmlReturn_t nvmlSystemGetTopologyGpuSet(unsigned int cpuNumber, unsigned int *count,
                                                nvmlDevice_t *deviceArray)
{
    unsigned i, n = 0;
    nvmlReturn_t r = enter();
    if (r != NVML_SUCCESS)
        return leave(r);
    if (!count)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (i = 0; i < g_inv->n_gpus; i++)
        if (g_inv->gpus[i].has_numa && g_inv->gpus[i].numa_node == (int)cpuNumber)
            n++;
    if (!deviceArray) {
        *count = n;
        return leave(NVML_SUCCESS);
    }
    if (*count < n) {
        *count = n;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (i = 0, n = 0; i < g_inv->n_gpus; i++)
        if (g_inv->gpus[i].has_numa && g_inv->gpus[i].numa_node == (int)cpuNumber)
            deviceArray[n++] = (nvmlDevice_t)(void *)&g_inv->gpus[i];
    *count = n;
    return leave(NVML_SUCCESS);
}

/* ---- device enumeration ----------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    nvmlReturn_t r = enter();
    if (r == NVML_SUCCESS) {
        if (!deviceCount)
            r = NVML_ERROR_INVALID_ARGUMENT;
        else
            *deviceCount = g_inv->n_gpus;
    }
    return leave(r);
}

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount)
{
    return nvmlDeviceGetCount_v2(deviceCount);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    nvmlReturn_t r = enter();
    if (r != NVML_SUCCESS)
        return leave(r);
    if (!device || index >= g_inv->n_gpus)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (g_inv->gpus[index].lost)
        return leave(NVML_ERROR_GPU_IS_LOST);
    *device = (nvmlDevice_t)(void *)&g_inv->gpus[index];
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

/* Finds GPUs and MIG devices by UUID. */
EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    unsigned i, j;
    nvmlReturn_t r = enter();
    if (r != NVML_SUCCESS)
        return leave(r);
    if (!uuid || !device)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (i = 0; i < g_inv->n_gpus; i++) {
        fake_gpu *g = &g_inv->gpus[i];
        void *found = NULL;
        if (strcmp(g->uuid, uuid) == 0)
            found = g;
        for (j = 0; !found && j < g->n_mig; j++)
            if (strcmp(g->migs[j]->uuid, uuid) == 0)
                found = g->migs[j];
        if (found) {
            if (g->lost)
                return leave(NVML_ERROR_GPU_IS_LOST);
            *device = (nvmlDevice_t)found;
            return leave(NVML_SUCCESS);
        }
    }
    return leave(NVML_ERROR_NOT_FOUND);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    unsigned d, b, v, f, i;
    nvmlReturn_t r = enter();
    if (r != NVML_SUCCESS)
        return leave(r);
    if (!pciBusId || !device || parse_bus_id(pciBusId, &d, &b, &v, &f) < 0)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (i = 0; i < g_inv->n_gpus; i++) {
        fake_gpu *g = &g_inv->gpus[i];
        if (g->pci.domain == d && g->pci.bus == b && g->pci.device == v) {
            if (g->lost)
                return leave(NVML_ERROR_GPU_IS_LOST);
            *device = (nvmlDevice_t)(void *)g;
            return leave(NVML_SUCCESS);
        }
    }
    return leave(NVML_ERROR_NOT_FOUND);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByPciBusId_v2(pciBusId, device);
}

/* ---- identification --------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    dev_ref d;
    nvmlReturn_t r = enter_dev(device, 0, &d);
    if (r == NVML_SUCCESS) {
        if (!index)
            r = NVML_ERROR_INVALID_ARGUMENT;
        else
            *index = d.gpu->index;
    }
    return leave(r);
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    dev_ref d;
    nvmlReturn_t r = enter_dev(device, ALLOW_MIG, &d);
    if (r == NVML_SUCCESS)
        r = copy_out(uuid, length, d.mig ? d.mig->uuid : d.gpu->uuid);
    return leave(r);
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    dev_ref d;
    nvmlReturn_t r = enter_dev(device, ALLOW_MIG, &d);
    if (r == NVML_SUCCESS)
        r = copy_out(name, length, d.mig ? d.mig->name : d.gpu->name);
    return leave(r);
}

EXPORT nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length)
{
    dev_ref d;
    nvmlReturn_t r = enter_dev(device, 0, &d);
    if (r == NVML_SUCCESS)
        r = d.gpu->serial[0] ? copy_out(serial, length, d.gpu->serial) : NVML_ERROR_NOT_SUPPORTED;
    return leave(r);
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    dev_ref d;
    nvmlReturn_t r = enter_dev(device, 0, &d);
    if (r == NVML_SUCCESS) {
        if (!minorNumber)
            r = NVML_ERROR_INVALID_ARGUMENT;
        else
            *minorNumber = d.gpu->minor;
    }
    return leave(r);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    dev_ref d;
    nvmlReturn_t r = enter_dev(device, 0, &d);
    if (r == NVML_SUCCESS) {
        if (!pci)
            r = NVML_ERROR_INVALID_ARGUMENT;
        else
            *pci = d.gpu->pci;
    }
    return leave(r);
}

EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    dev_ref d;
    nvmlReturn_t r = enter_dev(device, ALLOW_MIG, &d);
    if (r == NVML_SUCCESS) {
        if (!major || !minor) {
            r = NVML_ERROR_INVALID_ARGUMENT;
        } else if (!d.gpu->has_cc) {
            r = NVML_ERROR_NOT_SUPPORTED;
        } else {
            *major = d.gpu->cc_major;
            *minor = d.gpu->cc_minor;
        }
    }
    return leave(r);
}

/* ---- memory ----------------------------------------------------------- */

#define MIB(x) ((unsigned long long)(x) * 1024ULL * 1024ULL)

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    dev_ref d;
    nvmlReturn_t r = enter_dev(device, ALLOW_MIG, &d);
    if (r != NVML_SUCCESS)
        return leave(r);
    if (!memory)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (d.mig) {
        memory->total = MIB(d.mig->memory_mb);
        memory->used = MIB(d.mig->memory_used_mb);
    } else {
        /* v1 counts the driver-reserved memory as used. */
        memory->total = MIB(d.gpu->memory_mb);
        memory->used = MIB(d.gpu->memory_used_mb + d.gpu->memory_reserved_mb);
    }
    memory->free = memory->total - memory->used;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    dev_ref d;
    nvmlReturn_t r = enter_dev(device, ALLOW_MIG, &d);
    if (r != NVML_SUCCESS)
        return leave(r);
    if (!memory)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (memory->version != NVML_MEMORY_V2_VERSION)
        return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    if (d.mig) {
        memory->total = MIB(d.mig->memory_mb);
        memory->reserved = 0;
        memory->used = MIB(d.mig->memory_used_mb);
    } else {
        memory->total = MIB(d.gpu->memory_mb);
        memory->reserved = MIB(d.gpu->memory_reserved_mb);
        memory->used = MIB(d.gpu->memory_used_mb);
    }
    memory->free = memory->total - memory->reserved - memory->used;
    return leave(NVML_SUCCESS);
}

/* ---- MIG -------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode)
{
    dev_ref d;
    nvmlReturn_t r = enter_dev(device, 0, &d);
    if (r != NVML_SUCCESS)
        return leave(r);
    if (!currentMode || !pendingMode)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!d.gpu->mig_capable)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *currentMode = (unsigned)d.gpu->mig_current;
    *pendingMode = (unsigned)d.gpu->mig_pending;
    return leave(NVML_SUCCESS);
}

/* Zero unless MIG is enabled (as NVML documents). */
EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    dev_ref d;
    nvmlReturn_t r = enter_dev(device, 0, &d);
    if (r == NVML_SUCCESS) {
        if (!count)
            r = NVML_ERROR_INVALID_ARGUMENT;
        else
            *count = d.gpu->mig_current ? d.gpu->max_mig : 0;
    }
    return leave(r);
}

/* MIG devices occupy indices 0..n-1; indices below the maximum but without
 * a device give NOT_FOUND, as on a partly partitioned GPU. */
EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                        nvmlDevice_t *migDevice)
{
    dev_ref d;
    nvmlReturn_t r = enter_dev(device, 0, &d);
    if (r != NVML_SUCCESS)
        return leave(r);
    if (!migDevice)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!d.gpu->mig_capable)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    if (!d.gpu->mig_current || index >= d.gpu->max_mig)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (index >= d.gpu->n_mig)
        return leave(NVML_ERROR_NOT_FOUND);
    *migDevice = (nvmlDevice_t)(void *)d.gpu->migs[index];
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice)
{
    dev_ref d;
    nvmlReturn_t r = enter_dev(device, ALLOW_MIG | IGNORE_LOST, &d);
    if (r == NVML_SUCCESS) {
        if (!isMigDevice)
            r = NVML_ERROR_INVALID_ARGUMENT;
        else
            *isMigDevice = d.mig != NULL;
    }
    return leave(r);
}

EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device)
{
    dev_ref d;
    nvmlReturn_t r = enter_dev(migDevice, ALLOW_MIG | IGNORE_LOST, &d);
    if (r == NVML_SUCCESS) {
        if (!device || !d.mig)
            r = NVML_ERROR_INVALID_ARGUMENT;
        else
            *device = (nvmlDevice_t)(void *)d.gpu;
    }
    return leave(r);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id)
{
    dev_ref d;
    nvmlReturn_t r = enter_dev(device, ALLOW_MIG, &d);
    if (r == NVML_SUCCESS) {
        if (!id)
            r = NVML_ERROR_INVALID_ARGUMENT;
        else if (!d.mig)
            r = NVML_ERROR_NOT_SUPPORTED;
        else
            *id = d.mig->gi;
    }
    return leave(r);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id)
{
    dev_ref d;
    nvmlReturn_t r = enter_dev(device, ALLOW_MIG, &d);
    if (r == NVML_SUCCESS) {
        if (!id)
            r = NVML_ERROR_INVALID_ARGUMENT;
        else if (!d.mig)
            r = NVML_ERROR_NOT_SUPPORTED;
        else
            *id = d.mig->ci;
    }
    return leave(r);
}

/* Like NVML, only MIG device handles are supported. */
EXPORT nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes)
{
    dev_ref d;
    nvmlReturn_t r = enter_dev(device, ALLOW_MIG, &d);
    if (r != NVML_SUCCESS)
        return leave(r);
    if (!attributes)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!d.mig)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    memset(attributes, 0, sizeof *attributes);
    attributes->multiprocessorCount = d.mig->sm_count;
    attributes->sharedCopyEngineCount = d.mig->copy_engines;
    attributes->sharedDecoderCount = d.mig->decoders;
    attributes->sharedEncoderCount = d.mig->encoders;
    attributes->sharedJpegCount = d.mig->jpegs;
    attributes->sharedOfaCount = d.mig->ofas;
    attributes->gpuInstanceSliceCount = d.mig->slices;
    attributes->computeInstanceSliceCount = d.mig->ci_slices;
    attributes->memorySizeMB = d.mig->memory_mb;
    return leave(NVML_SUCCESS);
}

/* ---- NVLink and topology ---------------------------------------------- */

/* Links absent from the inventory are NOT_SUPPORTED, which is what a GPU
 * without NVLink (e.g. an H100 PCIe in a VM) reports for every link. */
static nvmlReturn_t get_link(nvmlDevice_t device, unsigned int link, fake_link **out)
{
    dev_ref d;
    nvmlReturn_t r = enter_dev(device, 0, &d);
    if (r != NVML_SUCCESS)
        return r;
    if (link >= NVML_NVLINK_MAX_LINKS)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!d.gpu->links[link].present)
        return NVML_ERROR_NOT_SUPPORTED;
    *out = &d.gpu->links[link];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, unsigned int *isActive)
{
    fake_link *l;
    nvmlReturn_t r = get_link(device, link, &l);
    if (r == NVML_SUCCESS) {
        if (!isActive)
            r = NVML_ERROR_INVALID_ARGUMENT;
        else
            *isActive = (unsigned)l->active;
    }
    return leave(r);
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci)
{
    fake_link *l;
    nvmlReturn_t r = get_link(device, link, &l);
    if (r == NVML_SUCCESS) {
        if (!pci)
            r = NVML_ERROR_INVALID_ARGUMENT;
        else if (l->peer >= 0)
            *pci = g_inv->gpus[l->peer].pci;
        else
            *pci = l->remote;
    }
    return leave(r);
}

EXPORT nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1, nvmlDevice_t device2,
                                                        unsigned int *pathInfo)
{
    dev_ref a, b;
    nvmlReturn_t r = enter_dev(device1, 0, &a);
    if (r == NVML_SUCCESS)
        r = resolve(device2, 0, &b);
    if (r == NVML_SUCCESS) {
        if (!pathInfo)
            r = NVML_ERROR_INVALID_ARGUMENT;
        else
            *pathInfo = g_inv->topo[a.gpu->index][b.gpu->index];
    }
    return leave(r);
}

EXPORT nvmlReturn_t nvmlDeviceGetTopologyNearestGpus(nvmlDevice_t device, unsigned int level,
                                                     unsigned int *count, nvmlDevice_t *deviceArray)
{
    dev_ref d;
    unsigned i, n = 0;
    nvmlReturn_t r = enter_dev(device, 0, &d);
    if (r != NVML_SUCCESS)
        return leave(r);
    if (!count)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (i = 0; i < g_inv->n_gpus; i++)
        if (i != d.gpu->index && g_inv->topo[d.gpu->index][i] <= level)
            n++;
    if (!deviceArray) {
        *count = n;
        return leave(NVML_SUCCESS);
    }
    if (*count < n) {
        *count = n;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (i = 0, n = 0; i < g_inv->n_gpus; i++)
        if (i != d.gpu->index && g_inv->topo[d.gpu->index][i] <= level)
            deviceArray[n++] = (nvmlDevice_t)(void *)&g_inv->gpus[i];
    *count = n;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, int *node)
{
    dev_ref d;
    nvmlReturn_t r = enter_dev(device, 0, &d);
    if (r == NVML_SUCCESS) {
        if (!node)
            r = NVML_ERROR_INVALID_ARGUMENT;
        else if (!d.gpu->has_numa)
            r = NVML_ERROR_NOT_SUPPORTED;
        else
            *node = d.gpu->numa_node;
    }
    return leave(r);
}

/* ---- telemetry -------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, unsigned int sensorType, unsigned int *temp)
{
    dev_ref d;
    nvmlReturn_t r = enter_dev(device, 0, &d);
    if (r == NVML_SUCCESS) {
        if (!temp || sensorType != NVML_TEMPERATURE_GPU)
            r = NVML_ERROR_INVALID_ARGUMENT;
        else
            *temp = d.gpu->temperature;
    }
    return leave(r);
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_v1_t *temperature)
{
    dev_ref d;
    nvmlReturn_t r = enter_dev(device, 0, &d);
    if (r == NVML_SUCCESS) {
        if (!temperature)
            r = NVML_ERROR_INVALID_ARGUMENT;
        else if (temperature->version != NVML_TEMPERATURE_V1_VERSION)
            r = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
        else if (temperature->sensorType != NVML_TEMPERATURE_GPU)
            r = NVML_ERROR_INVALID_ARGUMENT;
        else
            temperature->temperature = (int)d.gpu->temperature;
    }
    return leave(r);
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    dev_ref d;
    nvmlReturn_t r = enter_dev(device, 0, &d);
    if (r == NVML_SUCCESS) {
        if (!utilization) {
            r = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            utilization->gpu = d.gpu->util_gpu;
            utilization->memory = d.gpu->util_mem;
        }
    }
    return leave(r);
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    dev_ref d;
    nvmlReturn_t r = enter_dev(device, 0, &d);
    if (r == NVML_SUCCESS) {
        if (!power)
            r = NVML_ERROR_INVALID_ARGUMENT;
        else
            *power = d.gpu->power_mw;
    }
    return leave(r);
}

static nvmlReturn_t get_power_limit(nvmlDevice_t device, unsigned int *limit)
{
    dev_ref d;
    nvmlReturn_t r = enter_dev(device, 0, &d);
    if (r == NVML_SUCCESS) {
        if (!limit)
            r = NVML_ERROR_INVALID_ARGUMENT;
        else if (!d.gpu->has_power_limit)
            r = NVML_ERROR_NOT_SUPPORTED;
        else
            *limit = d.gpu->power_limit_mw;
    }
    return leave(r);
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *limit)
{
    return get_power_limit(device, limit);
}

EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit)
{
    return get_power_limit(device, limit);
}

/* nvmlProcessInfo_v2_t (the _v3 call fills the same layout). */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

/* Processes come from "proc" fault lines.  On a GPU handle: every process
 * on the GPU, its MIG devices' included; on a MIG handle: that device's. */
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount, void *infos)
{
    dev_ref d;
    unsigned i, n = 0;
    nvmlProcessInfo_t *out = infos;
    nvmlReturn_t r = enter_dev(device, ALLOW_MIG, &d);
    if (r != NVML_SUCCESS)
        return leave(r);
    if (!infoCount)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (i = 0; i < g_inv->n_procs; i++) {
        const fake_proc *p = &g_inv->procs[i];
        if (p->gpu != d.gpu->index || (d.mig && (p->gi != d.mig->gi || p->ci != d.mig->ci)))
            continue;
        if (out && n < *infoCount) {
            out[n].pid = p->pid;
            out[n].usedGpuMemory = MIB(p->mem_mb);
            out[n].gpuInstanceId = p->gi;
            out[n].computeInstanceId = p->ci;
        }
        n++;
    }
    if (n > *infoCount || (n && !out))
        r = NVML_ERROR_INSUFFICIENT_SIZE;
    *infoCount = n;
    return leave(r);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount, void *infos)
{
    return nvmlDeviceGetComputeRunningProcesses_v3(device, infoCount, infos);
}

/* ---- health: remapped rows, retired pages, ECC ------------------------ */

EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows, unsigned int *uncRows,
                                              unsigned int *isPending, unsigned int *failureOccurred)
{
    dev_ref d;
    nvmlReturn_t r = enter_dev(device, 0, &d);
    if (r != NVML_SUCCESS)
        return leave(r);
    if (!corrRows || !uncRows || !isPending || !failureOccurred)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!d.gpu->remap_supported)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *corrRows = d.gpu->remap_correctable;
    *uncRows = d.gpu->remap_uncorrectable;
    *isPending = d.gpu->remap_pending;
    *failureOccurred = d.gpu->remap_failure;
    return leave(NVML_SUCCESS);
}

/* Shared by both versions: the usual NVML size-query protocol. */
static nvmlReturn_t get_retired(nvmlDevice_t device, unsigned int cause, unsigned int *pageCount,
                                unsigned long long *addresses, unsigned long long *timestamps)
{
    dev_ref d;
    unsigned n, i;
    nvmlReturn_t r = enter_dev(device, 0, &d);
    if (r != NVML_SUCCESS)
        return leave(r);
    if (!pageCount || cause > NVML_RETIRE_DBE)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!d.gpu->retired_supported)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    n = d.gpu->n_retired[cause];
    if (n == 0) {
        *pageCount = 0;
        return leave(NVML_SUCCESS);
    }
    if (!addresses || *pageCount < n) {
        *pageCount = n;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (i = 0; i < n; i++) {
        addresses[i] = d.gpu->retired_addr[cause][i];
        if (timestamps)
            timestamps[i] = d.gpu->retired_time[cause][i];
    }
    *pageCount = n;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t device, unsigned int cause, unsigned int *pageCount,
                                              unsigned long long *addresses)
{
    return get_retired(device, cause, pageCount, addresses, NULL);
}

EXPORT nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t device, unsigned int cause, unsigned int *pageCount,
                                                 unsigned long long *addresses, unsigned long long *timestamps)
{
    return get_retired(device, cause, pageCount, addresses, timestamps);
}

EXPORT nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, unsigned int *isPending)
{
    dev_ref d;
    nvmlReturn_t r = enter_dev(device, 0, &d);
    if (r == NVML_SUCCESS) {
        if (!isPending)
            r = NVML_ERROR_INVALID_ARGUMENT;
        else if (!d.gpu->retired_supported)
            r = NVML_ERROR_NOT_SUPPORTED;
        else
            *isPending = (unsigned)d.gpu->retired_pending;
    }
    return leave(r);
}

EXPORT nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending)
{
    dev_ref d;
    nvmlReturn_t r = enter_dev(device, 0, &d);
    if (r == NVML_SUCCESS) {
        if (!current || !pending) {
            r = NVML_ERROR_INVALID_ARGUMENT;
        } else if (!d.gpu->ecc_supported) {
            r = NVML_ERROR_NOT_SUPPORTED;
        } else {
            *current = (unsigned)d.gpu->ecc_enabled;
            *pending = (unsigned)d.gpu->ecc_enabled;
        }
    }
    return leave(r);
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, unsigned int errorType,
                                                unsigned int counterType, unsigned long long *eccCounts)
{
    dev_ref d;
    nvmlReturn_t r = enter_dev(device, 0, &d);
    if (r == NVML_SUCCESS) {
        if (!eccCounts || errorType > NVML_MEMORY_ERROR_UNCORRECTED || counterType > NVML_AGGREGATE_ECC)
            r = NVML_ERROR_INVALID_ARGUMENT;
        else if (!d.gpu->ecc_enabled)
            r = NVML_ERROR_NOT_SUPPORTED;
        else
            *eccCounts = d.gpu->ecc[errorType][counterType];
    }
    return leave(r);
}

/* ---- events ----------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes)
{
    dev_ref d;
    nvmlReturn_t r = enter_dev(device, 0, &d);
    if (r == NVML_SUCCESS) {
        if (!eventTypes)
            r = NVML_ERROR_INVALID_ARGUMENT;
        else
            *eventTypes = d.gpu->supported_events;
    }
    return leave(r);
}

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    event_set *s;
    nvmlReturn_t r = enter();
    if (r != NVML_SUCCESS)
        return leave(r);
    if (!set)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    s = calloc(1, sizeof *s);
    if (!s)
        return leave(NVML_ERROR_MEMORY);
    s->magic = SET_MAGIC;
    s->next = g_sets;
    g_sets = s;
    *set = (nvmlEventSet_t)(void *)s;
    return leave(NVML_SUCCESS);
}

/* Events are registered on physical GPUs; events of the GPU's MIG devices
 * are delivered through the parent's registration.  Asking for a type the
 * GPU does not support fails with NOT_SUPPORTED, as in NVML. */
EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set)
{
    dev_ref d;
    event_set *s;
    nvmlReturn_t r = enter_dev(device, 0, &d);
    if (r != NVML_SUCCESS)
        return leave(r);
    s = find_set(set);
    if (!s)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (eventTypes & ~d.gpu->supported_events)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    s->mask[d.gpu->index] |= eventTypes;
    return leave(NVML_SUCCESS);
}

/* Waits for the next event, polling the fault file every 10 ms.  A GPU that
 * was lost while registered in the set produces one GPU_IS_LOST result
 * (in order with the other events); afterwards the set keeps delivering
 * events of the remaining GPUs. */
static nvmlReturn_t wait_event(nvmlEventSet_t set, fake_event *out, unsigned int timeoutms)
{
    double deadline = now_seconds() + timeoutms / 1000.0;
    for (;;) {
        event_set *s;
        double left;
        nvmlReturn_t r = enter();
        if (r != NVML_SUCCESS)
            return leave(r);
        s = find_set(set);
        if (!s)
            return leave(NVML_ERROR_INVALID_ARGUMENT);
        if (s->count) {
            *out = s->q[s->head];
            s->head = (s->head + 1) % EVQ_CAP;
            s->count--;
            return leave(out->lost ? NVML_ERROR_GPU_IS_LOST : NVML_SUCCESS);
        }
        leave(NVML_SUCCESS);
        left = (deadline - now_seconds()) * 1000.0;
        if (left <= 0)
            return NVML_ERROR_TIMEOUT;
        sleep_ms(left < 10.0 ? left : 10.0);
    }
}

EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    fake_event e;
    nvmlReturn_t r;
    if (!data)
        return NVML_ERROR_INVALID_ARGUMENT;
    r = wait_event(set, &e, timeoutms);
    if (r == NVML_SUCCESS || r == NVML_ERROR_GPU_IS_LOST) {
        data->device = (nvmlDevice_t)e.device;
        data->eventType = e.type;
        data->eventData = e.data;
        data->gpuInstanceId = e.gi;
        data->computeInstanceId = e.ci;
    }
    return r;
}

EXPORT nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_v1_t *data, unsigned int timeoutms)
{
    fake_event e;
    nvmlReturn_t r;
    if (!data)
        return NVML_ERROR_INVALID_ARGUMENT;
    r = wait_event(set, &e, timeoutms);
    if (r == NVML_SUCCESS || r == NVML_ERROR_GPU_IS_LOST) {
        data->device = (nvmlDevice_t)e.device;
        data->eventType = e.type;
        data->eventData = e.data;
    }
    return r;
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    event_set **pp;
    nvmlReturn_t r = enter();
    if (r != NVML_SUCCESS)
        return leave(r);
    for (pp = &g_sets; *pp; pp = &(*pp)->next) {
        if ((void *)*pp == (void *)set) {
            event_set *s = *pp;
            *pp = s->next;
            s->magic = 0;
            free(s);
            return leave(NVML_SUCCESS);
        }
    }
    return leave(NVML_ERROR_INVALID_ARGUMENT);
}

/* ======================================================================
 * 9. MIG re-partitioning: GPU instances and compute instances
 *
 * Each compute instance is one MIG device.  Creating one appends a MIG
 * device to its GPU's nvmlDeviceGetMigDeviceHandleByIndex list, with a new
 * UUID; destroying one removes it (the others keep their order).  Every
 * create/destroy call is appended to the MIG log (FAKENVML_MIG_LOG, by
 * default "<FAKENVML_FAULTS>.mig"), and nvmlInit replays the successful
 * ones, so the layout outlives nvmlShutdown and is seen by processes that
 * start later, as a real driver keeps it.
 * ====================================================================== */

typedef struct nvmlGpuInstance_st *nvmlGpuInstance_t;
typedef struct nvmlComputeInstance_st *nvmlComputeInstance_t;

typedef struct {
    unsigned int start, size;
} nvmlPlacement_t;                      /* GPU- and compute-instance placements */

typedef struct {
    unsigned int id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount;
    unsigned int copyEngineCount, decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
} nvmlGpuInstanceProfileInfo_t;

typedef struct {
    unsigned int version;
    unsigned int id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount;
    unsigned int copyEngineCount, decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
    char name[NAME_BUFFER_SIZE];
} nvmlGpuInstanceProfileInfo_v2_t;

#define NVML_GI_PROFILE_INFO_V2_VERSION 0x02000098u
#define NVML_CI_PROFILE_INFO_V2_VERSION 0x02000088u

typedef struct {
    unsigned int id, sliceCount, instanceCount, multiprocessorCount;
    unsigned int sharedCopyEngineCount, sharedDecoderCount, sharedEncoderCount;
    unsigned int sharedJpegCount, sharedOfaCount;
} nvmlComputeInstanceProfileInfo_t;

typedef struct {
    unsigned int version;
    unsigned int id, sliceCount, instanceCount, multiprocessorCount;
    unsigned int sharedCopyEngineCount, sharedDecoderCount, sharedEncoderCount;
    unsigned int sharedJpegCount, sharedOfaCount;
    char name[NAME_BUFFER_SIZE];
} nvmlComputeInstanceProfileInfo_v2_t;

typedef struct {
    nvmlDevice_t device;
    unsigned int id, profileId;
    nvmlPlacement_t placement;
} nvmlGpuInstanceInfo_t;

typedef struct {
    nvmlDevice_t device;
    nvmlGpuInstance_t gpuInstance;
    unsigned int id, profileId;
    nvmlPlacement_t placement;
} nvmlComputeInstanceInfo_t;

static struct {
    char path[4096];                    /* "" = no log */
    int replaying;
} g_miglog;

static const char *result_name(nvmlReturn_t r)
{
    switch (r) {
    case NVML_SUCCESS: return "SUCCESS";
    case NVML_ERROR_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case NVML_ERROR_NOT_SUPPORTED: return "NOT_SUPPORTED";
    case NVML_ERROR_NOT_FOUND: return "NOT_FOUND";
    case NVML_ERROR_GPU_IS_LOST: return "GPU_IS_LOST";
    case NVML_ERROR_IN_USE: return "IN_USE";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "INSUFFICIENT_RESOURCES";
    default: return "UNKNOWN";
    }
}

/* Appends one line to the MIG log with a single O_APPEND write. */
static void mig_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void mig_log(const char *fmt, ...)
{
    char line[512];
    va_list ap;
    int n, fd;
    if (!g_miglog.path[0] || g_miglog.replaying)
        return;
    va_start(ap, fmt);
    n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (n < 0 || n >= (int)sizeof line - 1)
        return;
    line[n++] = '\n';
    fd = open(g_miglog.path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        warnf("FAKENVML_MIG_LOG %s: %s", g_miglog.path, strerror(errno));
        return;
    }
    if (write(fd, line, (size_t)n) != n)
        warnf("FAKENVML_MIG_LOG %s: short write", g_miglog.path);
    close(fd);
}

static fake_gi *find_gi(const void *h)
{
    unsigned i, j;
    for (i = 0; i < g_inv->n_gpus; i++)
        for (j = 0; j < g_inv->gpus[i].n_gi; j++)
            if ((const void *)g_inv->gpus[i].gis[j] == h)
                return g_inv->gpus[i].gis[j];
    return NULL;
}

static fake_mig *find_ci(const void *h)
{
    unsigned i, j;
    for (i = 0; i < g_inv->n_gpus; i++)
        for (j = 0; j < g_inv->gpus[i].n_mig; j++) {
            fake_mig *m = g_inv->gpus[i].migs[j];
            if ((const void *)&m->ci_magic == h && m->gio)
                return m;
        }
    return NULL;
}

/* The GPU must be in MIG mode with a modelled layout. */
static nvmlReturn_t mig_ready(fake_gpu *g)
{
    if (!g->mig_capable || !g->mig_current || !g->model)
        return NVML_ERROR_NOT_SUPPORTED;
    if (g->mig_fixed[0]) {
        warnf("GPU %u cannot be re-partitioned: %s", g->index, g->mig_fixed);
        return NVML_ERROR_NOT_SUPPORTED;
    }
    return NVML_SUCCESS;
}

static unsigned procs_on(unsigned gpu, unsigned gi, unsigned ci)
{
    unsigned i, n = 0;
    for (i = 0; i < g_inv->n_procs; i++) {
        const fake_proc *p = &g_inv->procs[i];
        n += p->gpu == gpu && (gi == NVML_INSTANCE_ID_NONE || (p->gi == gi && (ci == NVML_INSTANCE_ID_NONE || p->ci == ci)));
    }
    return n;
}

/* start < 0: the lowest free allowed start. */
static nvmlReturn_t gi_create(fake_gpu *g, const gi_profile *p, int start, fake_gi **out)
{
    unsigned s;
    if (g->n_gi == MAX_GI || gi_count(g, p) >= p->instances)
        return NVML_ERROR_INSUFFICIENT_RESOURCES;
    if (start >= 0) {
        if (start >= MIG_MEMORY_SLICES || !(p->starts & (1u << start)))
            return NVML_ERROR_INVALID_ARGUMENT;
        if (!placement_free(g, p, (unsigned)start))
            return NVML_ERROR_INSUFFICIENT_RESOURCES;
        s = (unsigned)start;
    } else {
        for (s = 0; s < MIG_MEMORY_SLICES && !placement_free(g, p, s); s++)
            ;
        if (s == MIG_MEMORY_SLICES)
            return NVML_ERROR_INSUFFICIENT_RESOURCES;
    }
    *out = gi_add(g_inv, g, p, s);
    if (!*out)
        return NVML_ERROR_MEMORY;
    emit(g, NULL, EV_MIG_CONFIG, 0);
    return NVML_SUCCESS;
}

static nvmlReturn_t gi_destroy(fake_gi *gi)
{
    fake_gpu *g = gi->gpu;
    unsigned i, j;
    for (i = 0; i < g->n_mig; i++)
        if (g->migs[i]->gio == gi)
            return NVML_ERROR_IN_USE;   /* destroy its compute instances first */
    if (procs_on(g->index, gi->id, NVML_INSTANCE_ID_NONE))
        return NVML_ERROR_IN_USE;
    for (i = j = 0; i < g->n_gi; i++)
        if (g->gis[i] != gi)
            g->gis[j++] = g->gis[i];
    g->n_gi = j;
    gi->magic = 0;
    emit(g, NULL, EV_MIG_CONFIG, 0);
    return NVML_SUCCESS;
}

/* 64-bit FNV-1a, for UUIDs that are the same in every run. */
static unsigned long long fnv1a(unsigned long long h, const void *data, size_t n)
{
    const unsigned char *p = data;
    size_t i;
    for (i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001B3ULL;
    }
    return h;
}

static void new_mig_uuid(fake_gpu *g, unsigned gi, unsigned ci, char *out, size_t outsz)
{
    do {
        unsigned key[3] = { gi, ci, g->mig_seq++ };
        unsigned long long a = fnv1a(0xCBF29CE484222325ULL, g->uuid, strlen(g->uuid));
        unsigned long long b;
        a = fnv1a(a, key, sizeof key);
        b = fnv1a(a ^ 0x5bd1e995ULL, key, sizeof key);
        snprintf(out, outsz, "MIG-%08llx-%04llx-%04llx-%04llx-%012llx", a >> 32, (a >> 16) & 0xFFFF,
                 a & 0xFFFF, b >> 48, b & 0xFFFFFFFFFFFFULL);
    } while (uuid_taken(g_inv, g_inv->n_gpus - 1, out));
}

/* uuid: NULL for a new one (replay passes the logged one). */
static nvmlReturn_t ci_create(fake_gi *gi, unsigned profile, const char *uuid, fake_mig **out)
{
    fake_gpu *g = gi->gpu;
    unsigned n = ci_profile_slices(profile), used = 0, ids = 0, i, start, id;
    fake_mig *m;
    if (!n || n > gi->prof->slices)
        return NVML_ERROR_NOT_SUPPORTED;
    for (i = 0; i < g->n_mig; i++)
        if (g->migs[i]->gio == gi) {
            used |= ((1u << g->migs[i]->ci_slices) - 1) << g->migs[i]->ci_start;
            ids |= 1u << g->migs[i]->ci;
        }
    for (start = 0; start + n <= gi->prof->slices; start += n)
        if (!(used & (((1u << n) - 1) << start)))
            break;
    if (start + n > gi->prof->slices || g->n_mig >= g->max_mig)
        return NVML_ERROR_INSUFFICIENT_RESOURCES;
    for (id = 0; ids & (1u << id); id++)
        ;
    m = pool_alloc(g_inv, sizeof *m);
    if (!m)
        return NVML_ERROR_MEMORY;
    m->parent = g;
    m->gio = gi;
    m->ci_magic = CI_MAGIC;
    m->ci_profile = profile;
    m->ci_start = start;
    m->index = g->n_mig;
    m->gi = gi->id;
    m->ci = id;
    m->slices = gi->prof->slices;
    m->ci_slices = n;
    if (n == gi->prof->slices)
        snprintf(m->profile, sizeof m->profile, "%s", gi->prof->name);
    else
        snprintf(m->profile, sizeof m->profile, "%uc.%s", n, gi->prof->name);
    snprintf(m->name, sizeof m->name, "%.60s MIG %.24s", g->name, m->profile);
    if (uuid)
        snprintf(m->uuid, sizeof m->uuid, "%s", uuid);
    else
        new_mig_uuid(g, gi->id, id, m->uuid, sizeof m->uuid);
    m->memory_mb = gi->prof->memory_mb;
    m->sm_count = gi->prof->sm * n / gi->prof->slices;
    m->copy_engines = gi->prof->ce;
    m->decoders = gi->prof->dec;
    m->encoders = gi->prof->enc;
    m->jpegs = gi->prof->jpeg;
    m->ofas = gi->prof->ofa;
    m->magic = MIG_MAGIC;
    g->migs[g->n_mig++] = m;
    *out = m;
    emit(g, NULL, EV_MIG_CONFIG, 0);
    return NVML_SUCCESS;
}

static nvmlReturn_t ci_destroy(fake_mig *m)
{
    fake_gpu *g = m->parent;
    unsigned i, j;
    if (procs_on(g->index, m->gi, m->ci))
        return NVML_ERROR_IN_USE;
    for (i = j = 0; i < g->n_mig; i++)
        if (g->migs[i] != m)
            g->migs[j++] = g->migs[i];
    g->n_mig = j;
    m->magic = 0;
    m->ci_magic = 0;
    emit(g, NULL, EV_MIG_CONFIG, 0);
    return NVML_SUCCESS;
}

/* ---- replaying the MIG log at nvmlInit -------------------------------- */

static const char *log_field(char *const *argv, int argc, const char *key)
{
    int i;
    size_t n = strlen(key);
    for (i = 1; i < argc; i++)
        if (strncmp(argv[i], key, n) == 0 && argv[i][n] == '=')
            return argv[i] + n + 1;
    return NULL;
}

static int log_uint(char *const *argv, int argc, const char *key, unsigned *out)
{
    const char *v = log_field(argv, argc, key);
    unsigned long long u;
    if (!v || parse_ull(v, &u) < 0 || u > UINT_MAX)
        return -1;
    *out = (unsigned)u;
    return 0;
}

/* Applies one successful call of the log; -1 when it does not apply. */
static int replay_line(char *line)
{
    char *argv[12], *save = NULL, *tok;
    int argc = 0;
    unsigned gpu, gi_id, ci_id, profile, start;
    const char *result, *uuid;
    fake_gpu *g;
    fake_gi *gi;
    fake_mig *m = NULL;
    unsigned i;

    for (tok = strtok_r(line, " \t", &save); tok && argc < 12; tok = strtok_r(NULL, " \t", &save))
        argv[argc++] = tok;
    if (argc == 0 || argv[0][0] == '#')
        return 0;
    result = log_field(argv, argc, "result");
    if (!result || strcmp(result, "SUCCESS") != 0)
        return 0;                       /* refused calls changed nothing */
    if (log_uint(argv, argc, "gpu", &gpu) < 0 || gpu >= g_inv->n_gpus ||
        log_uint(argv, argc, "gi", &gi_id) < 0)
        return -1;
    g = &g_inv->gpus[gpu];
    if (mig_ready(g) != NVML_SUCCESS)
        return -1;
    gi = gi_by_id(g, gi_id);
    if (strcmp(argv[0], "gi-create") == 0) {
        const gi_profile *p;
        if (log_uint(argv, argc, "profile", &profile) < 0 || log_uint(argv, argc, "start", &start) < 0 ||
            !(p = profile_by_id(g, profile)) || gi_create(g, p, (int)start, &gi) != NVML_SUCCESS)
            return -1;
        return gi->id == gi_id ? 0 : -1;
    }
    if (!gi)
        return -1;
    if (strcmp(argv[0], "gi-destroy") == 0)
        return gi_destroy(gi) == NVML_SUCCESS ? 0 : -1;
    if (log_uint(argv, argc, "ci", &ci_id) < 0)
        return -1;
    if (strcmp(argv[0], "ci-create") == 0) {
        uuid = log_field(argv, argc, "uuid");
        if (!uuid || strncmp(uuid, "MIG-", 4) != 0 || strlen(uuid) >= 80 ||
            uuid_taken(g_inv, g_inv->n_gpus - 1, uuid) ||
            log_uint(argv, argc, "profile", &profile) < 0 || ci_create(gi, profile, uuid, &m) != NVML_SUCCESS)
            return -1;
        return m->ci == ci_id ? 0 : -1;
    }
    if (strcmp(argv[0], "ci-destroy") == 0) {
        for (i = 0; i < g->n_mig; i++)
            if (g->migs[i]->gio == gi && g->migs[i]->ci == ci_id)
                return ci_destroy(g->migs[i]) == NVML_SUCCESS ? 0 : -1;
    }
    return -1;
}

static void replay_mig_log(void)
{
    FILE *f;
    char line[600];
    unsigned long lineno = 0;
    if (!g_miglog.path[0])
        return;
    f = fopen(g_miglog.path, "r");
    if (!f)
        return;                         /* nothing changed yet */
    g_miglog.replaying = 1;
    while (fgets(line, sizeof line, f)) {
        char copy[600];
        lineno++;
        line[strcspn(line, "\n")] = '\0';
        snprintf(copy, sizeof copy, "%s", line);
        if (replay_line(line) < 0) {
            warnf("FAKENVML_MIG_LOG line %lu does not apply to the current layout; "
                  "the rest of the log is ignored: %s", lineno, copy);
            break;
        }
    }
    g_miglog.replaying = 0;
    fclose(f);
}

static void setup_mig_log(void)
{
    const char *log = getenv("FAKENVML_MIG_LOG");
    const char *faults = getenv("FAKENVML_FAULTS");
    g_miglog.path[0] = '\0';
    if (log) {
        if (*log && strlen(log) < sizeof g_miglog.path)
            snprintf(g_miglog.path, sizeof g_miglog.path, "%s", log);
    } else if (faults && *faults && strlen(faults) + 4 < sizeof g_miglog.path) {
        snprintf(g_miglog.path, sizeof g_miglog.path, "%s.mig", faults);
    }
    replay_mig_log();
}

/* ---- exported: profiles ------------------------------------------------ */

static void fill_gi_info(const gi_profile *p, nvmlGpuInstanceProfileInfo_t *info)
{
    memset(info, 0, sizeof *info);
    info->id = p->id;
    info->sliceCount = p->slices;
    info->instanceCount = p->instances;
    info->multiprocessorCount = p->sm;
    info->copyEngineCount = p->ce;
    info->decoderCount = p->dec;
    info->encoderCount = p->enc;
    info->jpegCount = p->jpeg;
    info->ofaCount = p->ofa;
    info->memorySizeMB = p->memory_mb;
}

/* Profile information is there whether MIG is on or off, on a MIG-capable
 * GPU of a known model; other profiles give NOT_SUPPORTED. */
static nvmlReturn_t enter_profile(nvmlDevice_t device, unsigned profile, const gi_profile **p)
{
    dev_ref d;
    nvmlReturn_t r = enter_dev(device, 0, &d);
    if (r != NVML_SUCCESS)
        return r;
    if (profile >= 0x12)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!d.gpu->mig_capable || !(*p = profile_by_enum(d.gpu, profile)))
        return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
                                                        nvmlGpuInstanceProfileInfo_t *info)
{
    const gi_profile *p;
    nvmlReturn_t r = enter_profile(device, profile, &p);
    if (r == NVML_SUCCESS) {
        if (!info)
            r = NVML_ERROR_INVALID_ARGUMENT;
        else
            fill_gi_info(p, info);
    }
    return leave(r);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device, unsigned int profile,
                                                         nvmlGpuInstanceProfileInfo_v2_t *info)
{
    const gi_profile *p;
    nvmlGpuInstanceProfileInfo_t v1;
    nvmlReturn_t r = enter_profile(device, profile, &p);
    if (r != NVML_SUCCESS)
        return leave(r);
    if (!info)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (info->version != NVML_GI_PROFILE_INFO_V2_VERSION)
        return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    fill_gi_info(p, &v1);
    memset(info, 0, sizeof *info);
    info->version = NVML_GI_PROFILE_INFO_V2_VERSION;
    info->id = v1.id;
    info->isP2pSupported = v1.isP2pSupported;
    info->sliceCount = v1.sliceCount;
    info->instanceCount = v1.instanceCount;
    info->multiprocessorCount = v1.multiprocessorCount;
    info->copyEngineCount = v1.copyEngineCount;
    info->decoderCount = v1.decoderCount;
    info->encoderCount = v1.encoderCount;
    info->jpegCount = v1.jpegCount;
    info->ofaCount = v1.ofaCount;
    info->memorySizeMB = v1.memorySizeMB;
    snprintf(info->name, sizeof info->name, "MIG %s", p->name);
    return leave(NVML_SUCCESS);
}

/* enter_dev for calls that take a profile id and need MIG on. */
static nvmlReturn_t enter_mig(nvmlDevice_t device, unsigned profile_id, dev_ref *d, const gi_profile **p)
{
    nvmlReturn_t r = enter_dev(device, 0, d);
    if (r != NVML_SUCCESS)
        return r;
    if ((r = mig_ready(d->gpu)) != NVML_SUCCESS)
        return r;
    if (p && !(*p = profile_by_id(d->gpu, profile_id)))
        return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDevice_t device, unsigned int profileId,
                                                              unsigned int *count)
{
    dev_ref d;
    const gi_profile *p;
    unsigned s, n = 0, room, mask = 0;
    nvmlReturn_t r = enter_mig(device, profileId, &d, &p);
    if (r != NVML_SUCCESS)
        return leave(r);
    if (!count)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    /* Greedy over the free allowed placements, lowest first. */
    for (s = 0; s < MIG_MEMORY_SLICES; s++) {
        unsigned want = ((1u << p->size) - 1) << s;
        if (placement_free(d.gpu, p, s) && !(mask & want)) {
            mask |= want;
            n++;
        }
    }
    room = p->instances - gi_count(d.gpu, p);
    *count = n < room ? n : room;
    return leave(NVML_SUCCESS);
}

/* All placements the profile allows, taken or not (as NVML's _v2).  With
 * placements NULL, *count is set to their number; otherwise *count is the
 * array's length (INSUFFICIENT_SIZE if too short) and is set to the number
 * written. */
EXPORT nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t device, unsigned int profileId,
                                                                  nvmlPlacement_t *placements,
                                                                  unsigned int *count)
{
    dev_ref d;
    const gi_profile *p;
    unsigned s, n = 0;
    nvmlReturn_t r = enter_dev(device, 0, &d);
    if (r != NVML_SUCCESS)
        return leave(r);
    if (!d.gpu->mig_capable || !d.gpu->model)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    if (!(p = profile_by_id(d.gpu, profileId)) || !count)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (s = 0; s < MIG_MEMORY_SLICES; s++)
        n += (p->starts >> s) & 1;
    if (!placements) {
        *count = n;
        return leave(NVML_SUCCESS);
    }
    if (*count < n) {
        *count = n;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (s = 0, n = 0; s < MIG_MEMORY_SLICES; s++)
        if (p->starts & (1u << s)) {
            placements[n].start = s;
            placements[n].size = p->size;
            n++;
        }
    *count = n;
    return leave(NVML_SUCCESS);
}

/* ---- exported: GPU instances ------------------------------------------- */

static nvmlReturn_t create_gi(nvmlDevice_t device, unsigned profileId, const nvmlPlacement_t *placement,
                              nvmlGpuInstance_t *out)
{
    dev_ref d;
    const gi_profile *p = NULL;
    fake_gi *gi = NULL;
    char where[16];
    nvmlReturn_t r = enter_dev(device, 0, &d);
    if (r != NVML_SUCCESS)
        return leave(r);
    if (placement)
        snprintf(where, sizeof where, "%u", placement->start);
    else
        snprintf(where, sizeof where, "any");
    r = mig_ready(d.gpu);
    if (r == NVML_SUCCESS && (!out || !(p = profile_by_id(d.gpu, profileId))))
        r = NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS && placement && placement->size != p->size)
        r = NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS)
        r = gi_create(d.gpu, p, placement ? (int)(placement->start < 64 ? placement->start : 64) : -1, &gi);
    if (r == NVML_SUCCESS) {
        *out = (nvmlGpuInstance_t)(void *)gi;
        mig_log("gi-create gpu=%u profile=%u start=%u gi=%u result=SUCCESS", d.gpu->index, profileId,
                gi->start, gi->id);
    } else {
        mig_log("gi-create gpu=%u profile=%u start=%s result=%s", d.gpu->index, profileId, where,
                result_name(r));
    }
    return leave(r);
}

EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstance(nvmlDevice_t device, unsigned int profileId,
                                                nvmlGpuInstance_t *gpuInstance)
{
    return create_gi(device, profileId, NULL, gpuInstance);
}

EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(nvmlDevice_t device, unsigned int profileId,
                                                             const nvmlPlacement_t *placement,
                                                             nvmlGpuInstance_t *gpuInstance)
{
    if (!placement) {
        nvmlReturn_t r = enter();
        return leave(r != NVML_SUCCESS ? r : NVML_ERROR_INVALID_ARGUMENT);
    }
    return create_gi(device, profileId, placement, gpuInstance);
}

/* A GPU-instance handle: INVALID_ARGUMENT if unknown or destroyed. */
static nvmlReturn_t enter_gi(nvmlGpuInstance_t h, fake_gi **out)
{
    nvmlReturn_t r = enter();
    if (r != NVML_SUCCESS)
        return r;
    if (!(*out = find_gi(h)))
        return NVML_ERROR_INVALID_ARGUMENT;
    return (*out)->gpu->lost ? NVML_ERROR_GPU_IS_LOST : NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t gpuInstance)
{
    fake_gi *gi;
    unsigned gpu, id;
    nvmlReturn_t r = enter_gi(gpuInstance, &gi);
    if (r != NVML_SUCCESS)
        return leave(r);
    gpu = gi->gpu->index;
    id = gi->id;
    r = gi_destroy(gi);
    mig_log("gi-destroy gpu=%u gi=%u result=%s", gpu, id, result_name(r));
    return leave(r);
}

/* Fills gpuInstances (which the caller sizes by the profile's
 * instanceCount, as NVML asks) with the instances of that profile. */
EXPORT nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int profileId,
                                              nvmlGpuInstance_t *gpuInstances, unsigned int *count)
{
    dev_ref d;
    const gi_profile *p;
    unsigned i, n = 0;
    nvmlReturn_t r = enter_mig(device, profileId, &d, &p);
    if (r != NVML_SUCCESS)
        return leave(r);
    if (!gpuInstances || !count)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (i = 0; i < d.gpu->n_gi; i++)
        if (d.gpu->gis[i]->prof == p)
            gpuInstances[n++] = (nvmlGpuInstance_t)(void *)d.gpu->gis[i];
    *count = n;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id,
                                                 nvmlGpuInstance_t *gpuInstance)
{
    dev_ref d;
    fake_gi *gi;
    nvmlReturn_t r = enter_mig(device, 0, &d, NULL);
    if (r != NVML_SUCCESS)
        return leave(r);
    if (!gpuInstance)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!(gi = gi_by_id(d.gpu, id)))
        return leave(NVML_ERROR_NOT_FOUND);
    *gpuInstance = (nvmlGpuInstance_t)(void *)gi;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance, nvmlGpuInstanceInfo_t *info)
{
    fake_gi *gi;
    nvmlReturn_t r = enter_gi(gpuInstance, &gi);
    if (r != NVML_SUCCESS)
        return leave(r);
    if (!info)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    memset(info, 0, sizeof *info);
    info->device = (nvmlDevice_t)(void *)gi->gpu;
    info->id = gi->id;
    info->profileId = gi->prof->id;
    info->placement.start = gi->start;
    info->placement.size = gi->prof->size;
    return leave(NVML_SUCCESS);
}

/* ---- exported: compute instances --------------------------------------- */

static nvmlReturn_t ci_profile_info(fake_gi *gi, unsigned profile, unsigned engProfile,
                                    nvmlComputeInstanceProfileInfo_t *info)
{
    unsigned n = ci_profile_slices(profile);
    if (profile >= 0x9 || engProfile != 0 || !info)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!n || n > gi->prof->slices)
        return NVML_ERROR_NOT_SUPPORTED;
    memset(info, 0, sizeof *info);
    info->id = profile;
    info->sliceCount = n;
    info->instanceCount = gi->prof->slices / n;
    info->multiprocessorCount = gi->prof->sm * n / gi->prof->slices;
    info->sharedCopyEngineCount = gi->prof->ce;
    info->sharedDecoderCount = gi->prof->dec;
    info->sharedEncoderCount = gi->prof->enc;
    info->sharedJpegCount = gi->prof->jpeg;
    info->sharedOfaCount = gi->prof->ofa;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(nvmlGpuInstance_t gpuInstance, unsigned int profile,
                                                                 unsigned int engProfile,
                                                                 nvmlComputeInstanceProfileInfo_t *info)
{
    fake_gi *gi;
    nvmlReturn_t r = enter_gi(gpuInstance, &gi);
    if (r == NVML_SUCCESS)
        r = ci_profile_info(gi, profile, engProfile, info);
    return leave(r);
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(nvmlGpuInstance_t gpuInstance, unsigned int profile,
                                                                  unsigned int engProfile,
                                                                  nvmlComputeInstanceProfileInfo_v2_t *info)
{
    fake_gi *gi;
    nvmlComputeInstanceProfileInfo_t v1;
    nvmlReturn_t r = enter_gi(gpuInstance, &gi);
    if (r != NVML_SUCCESS)
        return leave(r);
    if (!info)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (info->version != NVML_CI_PROFILE_INFO_V2_VERSION)
        return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    if ((r = ci_profile_info(gi, profile, engProfile, &v1)) != NVML_SUCCESS)
        return leave(r);
    memset(info, 0, sizeof *info);
    info->version = NVML_CI_PROFILE_INFO_V2_VERSION;
    info->id = v1.id;
    info->sliceCount = v1.sliceCount;
    info->instanceCount = v1.instanceCount;
    info->multiprocessorCount = v1.multiprocessorCount;
    info->sharedCopyEngineCount = v1.sharedCopyEngineCount;
    info->sharedDecoderCount = v1.sharedDecoderCount;
    info->sharedEncoderCount = v1.sharedEncoderCount;
    info->sharedJpegCount = v1.sharedJpegCount;
    info->sharedOfaCount = v1.sharedOfaCount;
    if (v1.sliceCount == gi->prof->slices)
        snprintf(info->name, sizeof info->name, "MIG %s", gi->prof->name);
    else
        snprintf(info->name, sizeof info->name, "MIG %uc.%s", v1.sliceCount, gi->prof->name);
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceRemainingCapacity(nvmlGpuInstance_t gpuInstance,
                                                                       unsigned int profileId, unsigned int *count)
{
    fake_gi *gi;
    unsigned n = ci_profile_slices(profileId), used = 0, i, start, free_n = 0;
    nvmlReturn_t r = enter_gi(gpuInstance, &gi);
    if (r != NVML_SUCCESS)
        return leave(r);
    if (!count || !n)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (n > gi->prof->slices)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    for (i = 0; i < gi->gpu->n_mig; i++)
        if (gi->gpu->migs[i]->gio == gi)
            used |= ((1u << gi->gpu->migs[i]->ci_slices) - 1) << gi->gpu->migs[i]->ci_start;
    for (start = 0; start + n <= gi->prof->slices; start += n)
        free_n += !(used & (((1u << n) - 1) << start));
    i = gi->gpu->max_mig - gi->gpu->n_mig;
    *count = free_n < i ? free_n : i;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t gpuInstance, unsigned int profileId,
                                                         nvmlComputeInstance_t *computeInstance)
{
    fake_gi *gi;
    fake_mig *m = NULL;
    nvmlReturn_t r = enter_gi(gpuInstance, &gi);
    if (r != NVML_SUCCESS)
        return leave(r);
    if (!computeInstance || profileId >= 0x9)
        r = NVML_ERROR_INVALID_ARGUMENT;
    else
        r = ci_create(gi, profileId, NULL, &m);
    if (r == NVML_SUCCESS) {
        *computeInstance = (nvmlComputeInstance_t)(void *)&m->ci_magic;
        mig_log("ci-create gpu=%u gi=%u profile=%u ci=%u uuid=%s result=SUCCESS", gi->gpu->index, gi->id,
                profileId, m->ci, m->uuid);
    } else {
        mig_log("ci-create gpu=%u gi=%u profile=%u result=%s", gi->gpu->index, gi->id, profileId,
                result_name(r));
    }
    return leave(r);
}

static nvmlReturn_t enter_ci(nvmlComputeInstance_t h, fake_mig **out)
{
    nvmlReturn_t r = enter();
    if (r != NVML_SUCCESS)
        return r;
    if (!(*out = find_ci(h)))
        return NVML_ERROR_INVALID_ARGUMENT;
    return (*out)->parent->lost ? NVML_ERROR_GPU_IS_LOST : NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t computeInstance)
{
    fake_mig *m;
    char uuid[UUID_BUFFER_SIZE];
    unsigned gpu, gi, ci;
    nvmlReturn_t r = enter_ci(computeInstance, &m);
    if (r != NVML_SUCCESS)
        return leave(r);
    snprintf(uuid, sizeof uuid, "%s", m->uuid);
    gpu = m->parent->index;
    gi = m->gi;
    ci = m->ci;
    r = ci_destroy(m);
    mig_log("ci-destroy gpu=%u gi=%u ci=%u uuid=%s result=%s", gpu, gi, ci, uuid, result_name(r));
    return leave(r);
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t gpuInstance, unsigned int profileId,
                                                       nvmlComputeInstance_t *computeInstances, unsigned int *count)
{
    fake_gi *gi;
    unsigned i, n = 0;
    nvmlReturn_t r = enter_gi(gpuInstance, &gi);
    if (r != NVML_SUCCESS)
        return leave(r);
    if (!computeInstances || !count || profileId >= 0x9)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (i = 0; i < gi->gpu->n_mig; i++) {
        fake_mig *m = gi->gpu->migs[i];
        if (m->gio == gi && m->ci_profile == profileId)
            computeInstances[n++] = (nvmlComputeInstance_t)(void *)&m->ci_magic;
    }
    *count = n;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t gpuInstance, unsigned int id,
                                                          nvmlComputeInstance_t *computeInstance)
{
    fake_gi *gi;
    unsigned i;
    nvmlReturn_t r = enter_gi(gpuInstance, &gi);
    if (r != NVML_SUCCESS)
        return leave(r);
    if (!computeInstance)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (i = 0; i < gi->gpu->n_mig; i++)
        if (gi->gpu->migs[i]->gio == gi && gi->gpu->migs[i]->ci == id) {
            *computeInstance = (nvmlComputeInstance_t)(void *)&gi->gpu->migs[i]->ci_magic;
            return leave(NVML_SUCCESS);
        }
    return leave(NVML_ERROR_NOT_FOUND);
}

EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t computeInstance,
                                                  nvmlComputeInstanceInfo_t *info)
{
    fake_mig *m;
    nvmlReturn_t r = enter_ci(computeInstance, &m);
    if (r != NVML_SUCCESS)
        return leave(r);
    if (!info)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    memset(info, 0, sizeof *info);
    info->device = (nvmlDevice_t)(void *)m;
    info->gpuInstance = (nvmlGpuInstance_t)(void *)m->gio;
    info->id = m->ci;
    info->profileId = m->ci_profile;
    info->placement.start = m->ci_start;
    info->placement.size = m->ci_slices;
    return leave(NVML_SUCCESS);
}
