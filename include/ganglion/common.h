/*
 * ganglion common module: error codes, logging, the parameter registry, clocks and
 * backoff. Every other module sits on top of this one; it depends on nothing but libc.
 */
#ifndef GANGLION_COMMON_H
#define GANGLION_COMMON_H

#include <stdarg.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* ---------------------------------------------------------------------------------
 * Errors (libuv style): functions return 0 or a negative GANG_E* code. One X-macro
 * generates the enum, gang_strerror() and gang_err_name(). Codes that mirror an errno
 * use its negative value so that system errors pass through unchanged.
 * --------------------------------------------------------------------------------- */
#define GANG_ERRNO_MAP(XX)                                                                         \
    XX(EINVAL, -22, "invalid argument")                                                            \
    XX(ENOMEM, -12, "out of memory")                                                               \
    XX(EIO, -5, "input/output error")                                                              \
    XX(EAGAIN, -11, "resource temporarily unavailable")                                            \
    XX(ENOENT, -2, "no such file or directory")                                                    \
    XX(EACCES, -13, "permission denied")                                                           \
    XX(EEXIST, -17, "already exists")                                                              \
    XX(EMSGSIZE, -90, "message too long")                                                          \
    XX(EPROTO, -71, "protocol error")                                                              \
    XX(ECONNRESET, -104, "connection reset by peer")                                               \
    XX(ECONNREFUSED, -111, "connection refused")                                                   \
    XX(ETIMEDOUT, -110, "timed out")                                                               \
    XX(ENOSYS, -38, "not built into this binary")                                                  \
    XX(ERANGE, -34, "value out of range")                                                          \
    XX(EVERSION, -3001, "unsupported protocol version")                                            \
    XX(EAUTH, -3002, "authentication failed")                                                      \
    XX(ESTALE, -3003, "message of an older generation")                                            \
    XX(EPEER, -3004, "a remote rank failed")                                                       \
    XX(EABORTED, -3005, "operation aborted")                                                       \
    XX(EDUPLICATE, -3006, "duplicate rank")                                                        \
    XX(EMISMATCH, -3007, "gang configuration mismatch")                                            \
    XX(ERESOLVE, -3008, "name does not resolve")                                                   \
    XX(EBUDGET, -3009, "restart budget spent")                                                     \
    XX(ECLOSED, -3010, "connection closed")                                                        \
    XX(EUSAGE, -3011, "usage error")                                                               \
    XX(EMODEL, -3012, "model or weights error")                                                    \
    XX(EINTERNAL, -3013, "internal error")                                                         \
    XX(EGPU, -3014, "GPU failed its health check")

typedef enum {
#define GANG_ERR_ENUM_(name, val, msg) GANG_##name = (val),
    GANG_ERRNO_MAP(GANG_ERR_ENUM_)
#undef GANG_ERR_ENUM_
} gang_errno_t;

/* Returns a static human-readable message for a GANG_E* code (or "unknown error"). */
const char *gang_strerror(int err);
/* Returns the static symbolic name ("GANG_ETIMEDOUT") of a code, or "GANG_E?" if unknown. */
const char *gang_err_name(int err);
/* Maps a positive errno value to a GANG_E* code (known ones keep their value). */
int gang_err_from_errno(int errnum);

/* Process exit codes of the external contract (docs/design.md §3). */
enum {
    GANG_EXIT_OK = 0,
    GANG_EXIT_USAGE = 2, /* usage / config error, never retried */
    GANG_EXIT_MODEL = 3, /* model / weights error, never retried */
    GANG_EXIT_INTERNAL = 70,
    GANG_EXIT_TEMPFAIL = 75 /* transient failure, retryable */
};
/* Maps an error code to the exit code the contract gives it. */
int gang_exit_code_for(int err);

/* ---------------------------------------------------------------------------------
 * Logging. Text ("2026-11-30T19:00:00.123Z INFO node=1 rank=3 gen=7 msg") or JSON lines
 * ({"ts":...,"level":...,"node":1,"rank":3,"gen":7,"msg":...}). Every line carries the
 * node, rank and generation of the process (-1 when not known yet). Thread-safe: a line
 * is written with one write(2). Writes to stderr.
 * --------------------------------------------------------------------------------- */
typedef enum { GANG_LOG_DEBUG = 0, GANG_LOG_INFO, GANG_LOG_WARN, GANG_LOG_ERROR } gang_log_level;
typedef enum { GANG_LOG_TEXT = 0, GANG_LOG_JSON } gang_log_format;

void gang_log_configure(gang_log_format fmt, gang_log_level min_level);
/* Sets the identity printed on every line; -1 leaves a field unknown. */
void gang_log_set_identity(int node, int rank);
void gang_log_set_generation(int64_t gen);
/* Parses "text"/"json" and "debug"/"info"/"warn"/"error"; returns GANG_EINVAL otherwise. */
int gang_log_parse_format(const char *s, gang_log_format *out);
int gang_log_parse_level(const char *s, gang_log_level *out);
/* Redirects output to fd (default 2); for tests. */
void gang_log_set_fd(int fd);
void gang_log_write(gang_log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define gang_debug(...) gang_log_write(GANG_LOG_DEBUG, __VA_ARGS__)
#define gang_info(...) gang_log_write(GANG_LOG_INFO, __VA_ARGS__)
#define gang_warn(...) gang_log_write(GANG_LOG_WARN, __VA_ARGS__)
#define gang_error(...) gang_log_write(GANG_LOG_ERROR, __VA_ARGS__)

/*
 * A rate limit for lines a remote peer can cause (a refused connection each): at most
 * GANG_LOG_LIMIT_BURST lines per GANG_LOG_LIMIT_WINDOW_MS, so a flood costs a few lines
 * every window instead of one per connection. Zero-initialise; one thread per limiter.
 */
#define GANG_LOG_LIMIT_BURST 10
#define GANG_LOG_LIMIT_WINDOW_MS 10000
typedef struct gang_log_limit {
    uint64_t window_start_ms;
    uint32_t in_window;  /* lines written in the current window */
    uint64_t suppressed; /* lines held back since the last one written */
} gang_log_limit;
/* Whether one more line may be written at now_ms. When it may, *held receives how many
 * were held back since the last one written (to be said in this one) and the count
 * restarts; when not, the line is counted as held back. */
bool gang_log_limit_allow(gang_log_limit *l, uint64_t now_ms, uint64_t *held);

/* ---------------------------------------------------------------------------------
 * Parameter registry (NCCL_PARAM style): every tunable has a flag, a GANGLION_* env twin
 * (derived from the flag: --heartbeat-interval-ms -> GANGLION_HEARTBEAT_INTERVAL_MS), a
 * default and a help line. The list lives in include/ganglion/params.def; precedence is
 * flag > environment > default. Nothing else in the code base reads GANGLION_* env.
 * --------------------------------------------------------------------------------- */
typedef enum {
    GANG_PARAM_INT = 0,
    GANG_PARAM_STR,
    GANG_PARAM_BOOL,
    GANG_PARAM_DOUBLE /* option tables only (bench, generate); the serve registry has none */
} gang_param_type;

#define GANG_PARAM_STR_MAX 256

/* The attribute column of params.def: is the flag forwarded to spawned processes? */
#define GANG_PARAM_NOFWD 0u /* this process's business only */
#define GANG_PARAM_FWD 1u   /* forwarded to workers and local agents (gang_params_forward_args) */

typedef struct gang_params {
#define GANG_PARAM_INT_(field, flag, def, lo, hi, attr, help) int64_t field;
#define GANG_PARAM_STR_(field, flag, def, attr, help) char field[GANG_PARAM_STR_MAX];
#define GANG_PARAM_BOOL_(field, flag, def, attr, help) int field;
#include "ganglion/params.def"
#undef GANG_PARAM_INT_
#undef GANG_PARAM_STR_
#undef GANG_PARAM_BOOL_
} gang_params;

typedef struct gang_param_info {
    const char *flag; /* "heartbeat-interval-ms" (without dashes) */
    gang_param_type type;
    const char *def; /* default as text */
    int64_t lo, hi;  /* bounds of INT params; of DOUBLE params when dlo < dhi */
    const char *help;
    size_t offset;   /* into gang_params, or into the option table's struct */
    double dlo, dhi; /* bounds of DOUBLE params */
    size_t str_cap;  /* capacity of a STR field of an option table; 0 = GANG_PARAM_STR_MAX */
} gang_param_info;

/*
 * Option tables: the registry's machinery for any struct. A subcommand (bench, generate,
 * mkmodel) describes its own options as a gang_param_info array whose offsets point into
 * its own options struct; INT fields are int64_t, BOOL int, DOUBLE double, STR char
 * arrays of str_cap bytes. Parsing follows the same rules as the registry's flags.
 */
typedef struct gang_opt_table {
    const gang_param_info *items;
    size_t count;
} gang_opt_table;

/*
 * Entries of an option table over the struct TYPE: flag name, field, default as text,
 * bounds (INT and DOUBLE) and help. STR fields are char arrays; their capacity is taken
 * from the field. GANG_OPT_TABLE(items) makes the table of a static array.
 */
#define GANG_OPT_INT(TYPE, flag_, field_, def_, lo_, hi_, help_)                                   \
    {                                                                                              \
        .flag = (flag_), .type = GANG_PARAM_INT, .def = (def_), .lo = (lo_), .hi = (hi_),          \
        .help = (help_), .offset = offsetof(TYPE, field_)                                          \
    }
#define GANG_OPT_STR(TYPE, flag_, field_, def_, help_)                                             \
    {                                                                                              \
        .flag = (flag_), .type = GANG_PARAM_STR, .def = (def_), .help = (help_),                   \
        .offset = offsetof(TYPE, field_), .str_cap = sizeof(((TYPE *)0)->field_)                   \
    }
#define GANG_OPT_BOOL(TYPE, flag_, field_, def_, help_)                                            \
    {                                                                                              \
        .flag = (flag_), .type = GANG_PARAM_BOOL, .def = (def_), .hi = 1, .help = (help_),         \
        .offset = offsetof(TYPE, field_)                                                           \
    }
#define GANG_OPT_DOUBLE(TYPE, flag_, field_, def_, lo_, hi_, help_)                                \
    {                                                                                              \
        .flag = (flag_), .type = GANG_PARAM_DOUBLE, .def = (def_), .dlo = (lo_), .dhi = (hi_),     \
        .help = (help_), .offset = offsetof(TYPE, field_)                                          \
    }
#define GANG_OPT_TABLE(items)                                                                      \
    {                                                                                              \
        (items), sizeof(items) / sizeof((items)[0])                                                \
    }

/* Fills every field of base with its default. */
void gang_opts_defaults(const gang_opt_table *t, void *base);
/* Looks a flag up by name (without dashes); NULL when absent. */
const gang_param_info *gang_opts_find(const gang_opt_table *t, const char *flag, size_t len);
/* Sets one option from text, with the table's validation. */
int gang_opts_set(const gang_opt_table *t, void *base, const char *flag, const char *value,
                  char *err, size_t errlen);
/*
 * Parses argv[0..argc) against t (rules as gang_params_parse_args). Arguments not in t go
 * to rest when rest is non-NULL (in order), else they are a usage error.
 */
int gang_opts_parse_args(const gang_opt_table *t, void *base, int argc, char **argv, char **rest,
                         int *nrest, char *err, size_t errlen);
/* Prints one line per option: flag, help and default; env twins when with_env. */
void gang_opts_print_help(const gang_opt_table *t, FILE *out, int with_env);

/*
 * A subcommand's command line: its name, usage synopsis, a paragraph of help, its option
 * table and whether the serve registry's flags are accepted too (then --help lists them).
 * Every subcommand parses through gang_opts_cli and prints its help with
 * gang_opts_cli_help, so --help is generated from the same table that parses.
 */
typedef struct gang_opt_cmd {
    const char *name;     /* "bench allreduce": prefixes messages */
    const char *synopsis; /* what follows "ganglion NAME" in the usage line */
    const char *about;    /* printed under the usage line; NULL for none */
    const gang_opt_table *table;
    int serve_flags; /* 1: also lists the serve registry in --help */
} gang_opt_cmd;

#define GANG_OPTS_HELP 1 /* gang_opts_cli: --help was asked for and printed */

/* Prints the usage line, the about text and every option of cmd (serve flags too). */
void gang_opts_cli_help(const gang_opt_cmd *cmd, FILE *out);
/*
 * Parses argv[1..argc) (argv[0] is the subcommand's name) into base against cmd->table
 * after filling every default. "-h"/"--help" anywhere before a "--" prints the help on
 * stdout and returns GANG_OPTS_HELP. Arguments not in the table go to rest (rest must
 * hold argc entries) when rest is non-NULL, else they are errors. Returns 0,
 * GANG_OPTS_HELP, or GANG_EUSAGE after printing "ganglion NAME: why" and a pointer to
 * --help on stderr.
 */
int gang_opts_cli(const gang_opt_cmd *cmd, void *base, int argc, char **argv, char **rest,
                  int *nrest);
/* Prints "ganglion NAME: message" and the --help hint on stderr; returns GANG_EUSAGE. */
int gang_opts_usage_error(const gang_opt_cmd *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/*
 * Checks that value is one of the '|'-separated choices ("socket|mpi"); returns its index,
 * or GANG_EUSAGE with "--flag: 'v' is not one of socket|mpi" in err.
 */
int gang_opts_choice(const char *flag, const char *value, const char *choices, char *err,
                     size_t errlen);
/*
 * Parses a comma-separated list of at most cap integers in [lo, hi] ("1,8") into out.
 * Returns the count (>= 1), or GANG_EINVAL for an empty, malformed or too long list.
 */
int gang_parse_i64_list(const char *s, int64_t lo, int64_t hi, int64_t *out, int cap);

/* Writes the environment twin of a flag ("GANGLION_HTTP_PORT") into out. */
void gang_param_env_name(const char *flag, char *out, size_t cap);
/* The environment twin of the registered boolean flag, for code that runs without a loaded
 * registry (a library's defaults, in the test binaries and benches): 1 with *out set when
 * it is set, 0 (*out untouched) when it is not, GANG_EUSAGE (a warning logged, *out
 * untouched) when it is not a boolean, GANG_EINVAL for a flag that is not a registered
 * boolean. */
int gang_param_env_bool(const char *flag, int *out);
/* The registry, in declaration order; *count receives its length. */
const gang_param_info *gang_params_registry(size_t *count);
/* Fills p with every default. */
void gang_params_defaults(gang_params *p);
/*
 * Applies GANGLION_* variables found in envp (a NULL-terminated "K=V" array, usually
 * environ). On a bad value returns GANG_EUSAGE and writes a message into err.
 */
int gang_params_from_env(gang_params *p, char *const *envp, char *err, size_t errlen);
/*
 * Parses "--flag value", "--flag=value" and "--bool-flag" from argv[0..argc). Arguments
 * that are not registered flags are left in order in rest (rest[0..*nrest)) so the caller
 * can handle subcommand-specific ones; rest may be NULL to refuse them. Returns 0, or
 * GANG_EUSAGE with a message in err.
 */
int gang_params_parse_args(gang_params *p, int argc, char **argv, char **rest, int *nrest,
                           char *err, size_t errlen);
/*
 * The effective parameters of a process: defaults, then the GANGLION_* variables of envp,
 * then argv (as gang_params_parse_args, rest likewise). 0 or GANG_EUSAGE with err. On success
 * the library choices are recorded for gang_dynlib_open (gang_dynlib_configure).
 */
int gang_params_load(gang_params *p, char *const *envp, int argc, char **argv, char **rest,
                     int *nrest, char *err, size_t errlen);
/* Sets one parameter from text, with the same validation as flags. */
int gang_params_set(gang_params *p, const char *flag, const char *value, char *err, size_t errlen);
/* Prints every parameter: flag, env twin, default and help. */
void gang_params_print_help(FILE *out);
/* Prints the effective values (for --check-config); tokens are never printed. */
void gang_params_print_values(const gang_params *p, FILE *out);

/* The attribute of registry entry pi (GANG_PARAM_FWD or GANG_PARAM_NOFWD); pi must point
 * into gang_params_registry(). */
unsigned gang_param_attr(const gang_param_info *pi);

/* An argument list built by gang_params_forward_args: argv[0..argc) point into the same
 * allocation as argv itself, and argv[argc] is NULL. Release with gang_args_free. */
typedef struct gang_args {
    char **argv;
    int argc;
} gang_args;

/*
 * The one place a process's parameters become a child's command line: "--flag=value" with
 * the effective value of every registry entry marked GANG_PARAM_FWD, in registry order,
 * except those named in omit (a NULL-terminated list of flags the caller sets itself, or
 * NULL). The supervisor (agent -> workers) and local mode (parent -> agents) both use it;
 * gang_params_parse_args reads the result back to the same values. Returns 0 or
 * GANG_ENOMEM (*out is then empty).
 */
int gang_params_forward_args(const gang_params *p, const char *const *omit, gang_args *out);
/* Deep-copies src into *dst (one allocation). Returns 0 or GANG_ENOMEM. */
int gang_args_copy(const gang_args *src, gang_args *dst);
/* Frees what a gang_args holds and empties it; NULL-safe. */
void gang_args_free(gang_args *a);

/* ---------------------------------------------------------------------------------
 * Libraries opened at run time (common/dynlib.c): NCCL, cuBLAS/cuBLASLt.
 * --------------------------------------------------------------------------------- */
typedef struct gang_dynlib {
    const char *what;               /* "NCCL": prefixes the log lines */
    const char *soname;             /* "libnccl.so.2" */
    const char *flag;               /* the explicit choice: "nccl-library" (a file or a dir) */
    const char *const *py_packages; /* NULL-terminated Python packages holding lib/SONAME */
    const char *build_dir;          /* where the build found it; may be "" */
    const char *probe_symbol;       /* a symbol of the library, for dladdr */
} gang_dynlib;

/*
 * Records the explicit library choices of p (--nccl-library, --cuda-library-dir) and the
 * probe's deadline; gang_params_load calls it. Without it (test binaries, benches with
 * their own options) the environment twins are read. Call before threads start.
 */
void gang_dynlib_configure(const gang_params *p);
/*
 * Opens lib with dlopen (RTLD_NOW | RTLD_LOCAL), searching in order: the explicit choice
 * (only it, when given), the Python environment's packages (python3 on PATH asked once
 * per process, under --lib-probe-timeout-ms), the loader's own search, lib->build_dir.
 * On success *handle is the library (never closed) and loaded the file mapped (dladdr),
 * which is logged. GANG_ENOENT with one error line naming every place tried; GANG_EINVAL
 * for an explicit value too long. Thread-safe.
 */
int gang_dynlib_open(const gang_dynlib *lib, void **handle, char *loaded, size_t cap);

/* ---------------------------------------------------------------------------------
 * Element types (common/dtype.c): the one enum of the kernels, the communicators and the
 * model files.
 * --------------------------------------------------------------------------------- */
typedef enum gang_dtype {
    GANG_DTYPE_F32 = 0,
    GANG_DTYPE_F16 = 1,  /* IEEE half; reductions accumulate in f32 */
    GANG_DTYPE_BF16 = 2, /* bfloat16; reductions accumulate in f32, round to nearest even */
    GANG_DTYPE_I32 = 3
} gang_dtype;

/* Bytes of one element of dt (0 for an unknown dtype). */
size_t gang_dtype_size(gang_dtype dt);
const char *gang_dtype_name(gang_dtype dt);

/* ---------------------------------------------------------------------------------
 * Half-precision conversion (host memory). Safetensors checkpoints
 * store F16 and BF16 weights; the kernels compute in f32.
 *   f16 -> f32 and bf16 -> f32 are exact (subnormals, infinities and NaN payloads kept).
 *   f32 -> f16 and f32 -> bf16 round to nearest, ties to even; values beyond the f16
 *   range become infinity; NaN stays a (quiet) NaN with its sign.
 * --------------------------------------------------------------------------------- */
float gang_f16_to_f32(uint16_t h);
uint16_t gang_f32_to_f16(float f);
float gang_bf16_to_f32(uint16_t h);
uint16_t gang_f32_to_bf16(float f);

/* Array forms of the above: n elements from src to dst, which must not overlap. Return 0,
 * or GANG_EINVAL for a NULL pointer with n > 0. */
int gang_f16_to_f32_array(const uint16_t *src, float *dst, size_t n);
int gang_f32_to_f16_array(const float *src, uint16_t *dst, size_t n);
int gang_bf16_to_f32_array(const uint16_t *src, float *dst, size_t n);
int gang_f32_to_bf16_array(const float *src, uint16_t *dst, size_t n);

/* ---------------------------------------------------------------------------------
 * Clocks and backoff.
 * --------------------------------------------------------------------------------- */
/* Monotonic clock in milliseconds / nanoseconds. */
uint64_t gang_now_ms(void);
/* The absolute deadline timeout_ms from now (gang_now_ms), saturating instead of wrapping. */
uint64_t gang_deadline_after(uint64_t timeout_ms);
/*
 * The time left until deadline, for the next operation: 0 and *left >= 1, GANG_ETIMEDOUT
 * once it has passed (communicator calls reject a zero timeout), GANG_EINVAL for NULL.
 */
int gang_deadline_left(uint64_t deadline, uint64_t *left);
uint64_t gang_now_ns(void);
/* Wall clock in milliseconds since the epoch. */
uint64_t gang_wall_ms(void);
/* Sleeps ms milliseconds (restarting on EINTR). */
void gang_sleep_ms(uint64_t ms);

/*
 * Bounded exponential backoff with jitter. The n-th delay is drawn uniformly from
 * [d/2, d] with d = min(max_ms, initial_ms * 2^n) ("equal jitter"): the floor keeps
 * retries from hammering, the jitter keeps many Pods from retrying in lockstep.
 */
typedef struct gang_backoff {
    uint64_t initial_ms; /* first nominal delay */
    uint64_t max_ms;     /* cap on the nominal delay */
    uint32_t attempt;    /* delays handed out since the last reset */
    uint64_t rng;        /* xorshift state; never 0 */
} gang_backoff;

void gang_backoff_init(gang_backoff *b, uint64_t initial_ms, uint64_t max_ms, uint64_t seed);
uint64_t gang_backoff_next(gang_backoff *b);
void gang_backoff_reset(gang_backoff *b);

/* ---------------------------------------------------------------------------------
 * Message codec (common/codec.c): one cursor over a bounded buffer and one call per field
 * type, each of which encodes or decodes depending on the cursor's direction. A message
 * is described once, by a function that calls the field functions in wire order on its
 * struct; the same function then encodes (struct -> bytes) and decodes (bytes -> struct),
 * so the two cannot drift apart. Every multi-byte value is little-endian; f32 travels as
 * its IEEE bit pattern, i32 as its two's complement.
 *
 * Errors are sticky: the first failing field records its error and every later field is
 * a no-op, so a description function needs no checks of its own and the caller asks
 * gang_codec_finish once at the end.
 *   encode: a field out of its bounds (a count over its maximum, a string longer than
 *           its capacity or its length field) is GANG_EINVAL; when the fields are valid
 *           but the buffer is too small, the encoder keeps counting, so finish answers
 *           GANG_EMSGSIZE and c->off is the size the message needs (a buffer of NULL
 *           with cap 0 measures a message).
 *   decode: a field that would read past the end, a count over its maximum, a string
 *           too long for its destination or with a NUL inside, and (at finish) bytes
 *           left over are all GANG_EPROTO. Decoding never reads outside buf[0..len) and
 *           never writes more than a field's stated maximum into its destination.
 * Description functions may also refuse a whole message with gang_codec_fail.
 * --------------------------------------------------------------------------------- */
typedef struct gang_codec {
    int decoding;        /* 1: bytes -> struct; 0: struct -> bytes */
    uint8_t *wbuf;       /* encode: destination (NULL with cap 0 to measure) */
    const uint8_t *rbuf; /* decode: source */
    size_t cap;          /* encode: bytes at wbuf; decode: bytes at rbuf */
    size_t off;          /* bytes produced (also past cap) or consumed so far */
    int err;             /* the first error, 0 while every field went well */
} gang_codec;

/* A cursor that encodes into buf[0..cap). */
void gang_codec_encoder(gang_codec *c, void *buf, size_t cap);
/* A cursor that decodes from buf[0..len). */
void gang_codec_decoder(gang_codec *c, const void *buf, size_t len);
/*
 * Ends a message: 0 and the bytes produced or consumed in *len (may be NULL); else the
 * first field's error, GANG_EMSGSIZE for an encoder whose buffer was too small, or
 * GANG_EPROTO for a decoder that did not consume its whole input.
 */
int gang_codec_finish(const gang_codec *c, size_t *len);
/* Refuses the message with err (a negative GANG_E* code) unless it already failed. */
void gang_codec_fail(gang_codec *c, int err);
/* Whether every field so far went well (description functions branch on it rarely). */
static inline int gang_codec_ok(const gang_codec *c)
{
    return c->err == 0;
}

void gang_codec_u8(gang_codec *c, uint8_t *v);
void gang_codec_u16(gang_codec *c, uint16_t *v);
void gang_codec_u32(gang_codec *c, uint32_t *v);
void gang_codec_u64(gang_codec *c, uint64_t *v);
void gang_codec_i32(gang_codec *c, int32_t *v);
void gang_codec_f32(gang_codec *c, float *v);
/*
 * A uint32_t value that travels in width bytes (1, 2 or 4) and must not exceed max:
 * flags and small counts kept as uint32_t in memory. Out of range: GANG_EINVAL when
 * encoding, GANG_EPROTO when decoding (*v is then left unchanged).
 */
void gang_codec_uint(gang_codec *c, uint32_t *v, unsigned width, uint32_t max);
/* n raw bytes (nonces, MACs, digests). */
void gang_codec_bytes(gang_codec *c, void *p, size_t n);
/* n int32 / float values, no count on the wire (the count is known from elsewhere). */
void gang_codec_i32_array(gang_codec *c, int32_t *a, size_t n);
void gang_codec_f32_array(gang_codec *c, float *a, size_t n);
/*
 * A count of width bytes (1, 2 or 4) in *n, then *n int32 values into a[0..max): the
 * count over max is refused before anything is copied.
 */
void gang_codec_i32_list(gang_codec *c, uint32_t *n, unsigned width, int32_t *a, uint32_t max);
/* A length of width bytes in *len, then *len raw bytes into p[0..max). */
void gang_codec_blob(gang_codec *c, uint32_t *len, unsigned width, void *p, uint32_t max);
/*
 * A C string s of capacity cap (NUL included) as a length of width bytes (1, 2 or 4)
 * and its bytes without the NUL. Encoding refuses a string that fills cap without a NUL
 * or whose length does not fit width; decoding refuses a length >= cap and an embedded
 * NUL (the C string would be shorter than what was sent), and NUL-terminates s.
 */
void gang_codec_str(gang_codec *c, char *s, size_t cap, unsigned width);

/* Copies src into dst (size cap) always NUL-terminating; returns GANG_ERANGE if cut. */
int gang_strlcpy(char *dst, const char *src, size_t cap);

/*
 * Runs fn(ctx, lo, hi) over [0, n) cut into contiguous slices, one per thread on up to
 * GANG_SLICES_MAX threads (no more than the CPUs online, nor n / min_per_thread), every
 * slice but the last a multiple of align elements (align >= 1). The caller's thread runs
 * the first slice, and any slice whose thread cannot be started. Returns when every slice
 * has run. For load-time work whose result does not depend on the split (filling and
 * converting large arrays), never for anything on a request's path.
 */
#define GANG_SLICES_MAX 16
void gang_parallel_slices(size_t n, size_t align, size_t min_per_thread,
                          void (*fn)(void *ctx, size_t lo, size_t hi), void *ctx);

/*
 * The host heap of a phase that builds something big out of large temporary blocks, one
 * after another: a model's layers for a device, each read or drawn, cut, packed, moved
 * and freed. glibc maps every block above its mmap threshold (32 MiB at most) apart and
 * unmaps it at free, and a thread's own arena gives back what its heaps free, so every
 * layer came back as fresh pages that the kernel faults in and zeroes again (1.3 GB a
 * layer for an 8B model: most of the build's time). From the first gang_heap_reuse_begin
 * to the last gang_heap_reuse_end (they nest, from any threads) glibc maps no block apart
 * and keeps what is freed, so each layer reuses the previous one's pages; the last end
 * brings glibc's default values back (its mmap threshold then no longer rises on its
 * own, as any mallopt of the trim threshold leaves it) and returns the pages kept
 * (malloc_trim). Blocks allocated inside live on as usual. gang_heap_single_arena,
 * called before the threads that allocate are created, has them share the main arena,
 * which keeps what they free (an arena once made stays). Not for memory whose pages
 * matter after the phase (weights the CPU streams from huge pages): a reused page is a
 * page of whatever was freed before it. mallopt failing leaves the defaults: slower, not
 * wrong.
 */
void gang_heap_single_arena(void);
void gang_heap_reuse_begin(void);
void gang_heap_reuse_end(void);
/*
 * Formats a one-line error message into err[0..errlen) for functions that report why they
 * refused something. Does nothing when err is NULL or errlen is 0; always NUL-terminates.
 */
void gang_set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The value 0..15 of one hexadecimal digit (either case), or -1 for any other character. */
int gang_hex_digit(int ch);
/* Parses a base-10 integer within [lo, hi]; returns GANG_EINVAL / GANG_ERANGE. */
int gang_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out);

#endif /* GANGLION_COMMON_H */
