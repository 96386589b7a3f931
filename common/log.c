/*
 * Logging: one line per call, text or JSON, each carrying node, rank and generation.
 * The identity lives in process-wide atomics so any thread can log without locks; the
 * line is assembled in a stack buffer and written with a single write(2), which keeps
 * lines from different threads and processes (sharing a pipe) from interleaving.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ganglion/common.h"

#define LOG_LINE_MAX 4096

static _Atomic int log_fmt = GANG_LOG_TEXT;
static _Atomic int log_min = GANG_LOG_INFO;
static _Atomic int log_node = -1;
static _Atomic int log_rank = -1;
static _Atomic int64_t log_gen = -1;
static _Atomic int log_fd = 2;

static const char *const level_names[] = {"DEBUG", "INFO", "WARN", "ERROR"};

void gang_log_configure(gang_log_format fmt, gang_log_level min_level)
{
    log_fmt = fmt;
    log_min = min_level;
}

void gang_log_set_identity(int node, int rank)
{
    log_node = node;
    log_rank = rank;
}

void gang_log_set_generation(int64_t gen)
{
    log_gen = gen;
}

void gang_log_set_fd(int fd)
{
    log_fd = fd;
}

int gang_log_parse_format(const char *s, gang_log_format *out)
{
    if (strcmp(s, "text") == 0)
        *out = GANG_LOG_TEXT;
    else if (strcmp(s, "json") == 0)
        *out = GANG_LOG_JSON;
    else
        return GANG_EINVAL;
    return 0;
}

int gang_log_parse_level(const char *s, gang_log_level *out)
{
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(s, level_names[i]) == 0) {
            *out = (gang_log_level)i;
            return 0;
        }
    }
    return GANG_EINVAL;
}

/* Appends msg as a JSON string body (without quotes), escaping what JSON requires. */
static size_t json_escape(char *dst, size_t cap, const char *msg)
{
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)msg; *p && n + 7 < cap; p++) {
        if (*p == '"' || *p == '\\') {
            dst[n++] = '\\';
            dst[n++] = (char)*p;
        } else if (*p == '\n') {
            dst[n++] = '\\';
            dst[n++] = 'n';
        } else if (*p < 0x20) {
            n += (size_t)snprintf(dst + n, cap - n, "\\u%04x", *p);
        } else {
            dst[n++] = (char)*p;
        }
    }
    dst[n] = '\0';
    return n;
}

void gang_log_write(gang_log_level lvl, const char *fmt, ...)
{
    if ((int)lvl < log_min)
        return;
    char msg[LOG_LINE_MAX / 2];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);

    uint64_t ms = gang_wall_ms();
    time_t secs = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&secs, &tm);
    char ts[64];
    snprintf(ts, sizeof(ts), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(ms % 1000));

    char line[LOG_LINE_MAX];
    int n;
    if (log_fmt == GANG_LOG_JSON) {
        char esc[LOG_LINE_MAX / 2 + 64];
        json_escape(esc, sizeof(esc), msg);
        n = snprintf(line, sizeof(line),
                     "{\"ts\":\"%s\",\"level\":\"%s\",\"pid\":%d,\"node\":%d,\"rank\":%d,"
                     "\"gen\":%lld,\"msg\":\"%s\"}\n",
                     ts, level_names[lvl], (int)getpid(), log_node, log_rank, (long long)log_gen,
                     esc);
    } else {
        n = snprintf(line, sizeof(line), "%s %-5s node=%d rank=%d gen=%lld pid=%d %s\n", ts,
                     level_names[lvl], log_node, log_rank, (long long)log_gen, (int)getpid(), msg);
    }
    if (n < 0)
        return;
    if ((size_t)n >= sizeof(line)) {
        n = (int)sizeof(line) - 1;
        line[n - 1] = '\n';
    }
    ssize_t w = write(log_fd, line, (size_t)n);
    (void)w;
}

bool gang_log_limit_allow(gang_log_limit *l, uint64_t now_ms, uint64_t *held)
{
    if (l->in_window == 0 || now_ms - l->window_start_ms >= GANG_LOG_LIMIT_WINDOW_MS) {
        l->window_start_ms = now_ms;
        l->in_window = 0;
    }
    if (l->in_window >= GANG_LOG_LIMIT_BURST) {
        l->suppressed++;
        return false;
    }
    l->in_window++;
    *held = l->suppressed;
    l->suppressed = 0;
    return true;
}
