/* Small string and number helpers shared by every module. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ganglion/common.h"

int gang_strlcpy(char *dst, const char *src, size_t cap)
{
    if (cap == 0)
        return GANG_ERANGE;
    size_t n = strlen(src);
    if (n >= cap) {
        memcpy(dst, src, cap - 1);
        dst[cap - 1] = '\0';
        return GANG_ERANGE;
    }
    memcpy(dst, src, n + 1);
    return 0;
}

/* Strict base-10 parse: the whole string must be a number within [lo, hi]. */
int gang_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    if (s == NULL || *s == '\0')
        return GANG_EINVAL;
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end != '\0')
        return GANG_EINVAL;
    if (errno == ERANGE || v < lo || v > hi)
        return GANG_ERANGE;
    *out = (int64_t)v;
    return 0;
}

void gang_set_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    if (err == NULL || errlen == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

int gang_hex_digit(int ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}
