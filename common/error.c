/* Error codes: names and messages generated from the one X-macro in common.h. */
#include <errno.h>

#include "ganglion/common.h"

const char *gang_strerror(int err)
{
    switch (err) {
#define GANG_ERR_MSG_(name, val, msg)                                                              \
    case GANG_##name:                                                                              \
        return msg;
        GANG_ERRNO_MAP(GANG_ERR_MSG_)
#undef GANG_ERR_MSG_
    case 0:
        return "success";
    default:
        return "unknown error";
    }
}

const char *gang_err_name(int err)
{
    switch (err) {
#define GANG_ERR_NAME_(name, val, msg)                                                             \
    case GANG_##name:                                                                              \
        return "GANG_" #name;
        GANG_ERRNO_MAP(GANG_ERR_NAME_)
#undef GANG_ERR_NAME_
    case 0:
        return "OK";
    default:
        return "GANG_E?";
    }
}

/*
 * errno values that have a GANG_ twin keep their (negated) value; the rest collapse into
 * GANG_EIO so that callers only ever see codes gang_strerror() can describe.
 */
int gang_err_from_errno(int errnum)
{
    int neg = -errnum;
    switch (neg) {
#define GANG_ERR_KNOWN_(name, val, msg) case GANG_##name:
        GANG_ERRNO_MAP(GANG_ERR_KNOWN_)
#undef GANG_ERR_KNOWN_
        if (neg > -1000)
            return neg;
        return GANG_EIO;
    case -EPIPE:
        return GANG_ECONNRESET;
    case -EADDRINUSE:
        return GANG_EEXIST;
    default:
        return GANG_EIO;
    }
}

/*
 * The contract's exit codes: configuration mistakes and bad models are never retried (2, 3),
 * everything a restart could cure is EX_TEMPFAIL (75), broken invariants are 70.
 */
int gang_exit_code_for(int err)
{
    switch (err) {
    case 0:
        return GANG_EXIT_OK;
    case GANG_EUSAGE:
    case GANG_EMISMATCH:
        return GANG_EXIT_USAGE;
    case GANG_EMODEL:
        return GANG_EXIT_MODEL;
    case GANG_EINTERNAL:
        return GANG_EXIT_INTERNAL;
    default:
        return GANG_EXIT_TEMPFAIL;
    }
}
