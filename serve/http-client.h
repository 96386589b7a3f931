/*
 * A tiny blocking HTTP client for the commands that talk to a gang they started (bench
 * watches /status, generate posts a completion): one request, one deadline.
 */
#ifndef GANGLION_LAUNCHER_HTTP_CLIENT_H
#define GANGLION_LAUNCHER_HTTP_CLIENT_H

#define GANG_HTTP_CLIENT_MAX_BODY (4u << 20)

/*
 * Sends METHOD path to http://host:port (host an IPv4 literal) with body (JSON, or NULL
 * for none) and reads the answer; connect, send and receive must all finish within
 * timeout_ms. Reading stops at Content-Length or EOF. On success returns 0 with the status
 * code in *status and the body, NUL-terminated and owned by the caller (free()), in *out.
 * Errors: GANG_EINVAL (bad host), GANG_ETIMEDOUT, GANG_EPROTO (not HTTP), GANG_EMSGSIZE
 * (body over GANG_HTTP_CLIENT_MAX_BODY), GANG_ENOMEM, or a socket error such as
 * GANG_ECONNREFUSED.
 */
int gang_http_fetch(const char *host, int port, const char *method, const char *path,
                    const char *body, int timeout_ms, int *status, char **out);

#endif
