/*
 * The one HTTP client (http-client.h): non-blocking socket, poll, one deadline for the
 * whole exchange.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ganglion/common.h"
#include "ganglion/serve.h"

/* Waits until fd is ready for events or the monotonic deadline passes. */
static int wait_fd(int fd, short events, uint64_t deadline_ms)
{
    for (;;) {
        uint64_t now = gang_now_ms();
        struct pollfd pfd = {.fd = fd, .events = events};
        int rc;

        if (now >= deadline_ms)
            return GANG_ETIMEDOUT;
        rc = poll(&pfd, 1, (int)(deadline_ms - now));
        if (rc > 0)
            return 0;
        if (rc < 0 && errno != EINTR)
            return gang_err_from_errno(errno);
    }
}

/* Finds the Content-Length value in the header block head[0..len), or -1. */
static long header_content_length(const char *head, size_t len)
{
    static const char key[] = "\r\ncontent-length:";
    size_t klen = sizeof key - 1;

    for (size_t i = 0; i + klen <= len; i++) {
        if (strncasecmp(head + i, key, klen) == 0)
            return strtol(head + i + klen, NULL, 10);
    }
    return -1;
}

/* Connects fd to sa by the deadline. */
static int connect_by(int fd, const struct sockaddr_in *sa, uint64_t deadline)
{
    int err = 0, rc;
    socklen_t elen = sizeof err;

    if (connect(fd, (const struct sockaddr *)sa, sizeof *sa) == 0)
        return 0;
    if (errno != EINPROGRESS)
        return gang_err_from_errno(errno);
    rc = wait_fd(fd, POLLOUT, deadline);
    if (rc < 0)
        return rc;
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen);
    return err != 0 ? gang_err_from_errno(err) : 0;
}

/* Sends buf[0..len) by the deadline. */
static int send_by(int fd, const char *buf, size_t len, uint64_t deadline)
{
    size_t sent = 0;

    while (sent < len) {
        ssize_t n = send(fd, buf + sent, len - sent, MSG_NOSIGNAL);
        if (n > 0) {
            sent += (size_t)n;
            continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EINTR)
            return gang_err_from_errno(errno);
        int rc = wait_fd(fd, POLLOUT, deadline);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/*
 * Reads the answer into a malloc'ed buffer until EOF or Content-Length; on success *out
 * holds len bytes plus a NUL.
 */
static int recv_by(int fd, uint64_t deadline, char **out, size_t *outlen)
{
    size_t cap = 8192, len = 0;
    char *buf = malloc(cap);
    int rc = 0;

    if (buf == NULL)
        return GANG_ENOMEM;
    for (;;) {
        if (len + 1 >= cap) {
            char *nb = cap >= GANG_HTTP_CLIENT_MAX_BODY ? NULL : realloc(buf, cap * 2);
            if (nb == NULL) {
                rc = cap >= GANG_HTTP_CLIENT_MAX_BODY ? GANG_EMSGSIZE : GANG_ENOMEM;
                goto out_free;
            }
            buf = nb;
            cap *= 2;
        }
        ssize_t n = recv(fd, buf + len, cap - len - 1, 0);
        if (n == 0)
            break;
        if (n < 0) {
            if (errno != EAGAIN && errno != EINTR) {
                rc = gang_err_from_errno(errno);
                goto out_free;
            }
            rc = wait_fd(fd, POLLIN, deadline);
            if (rc < 0)
                goto out_free;
            continue;
        }
        len += (size_t)n;
        buf[len] = '\0';
        char *eoh = strstr(buf, "\r\n\r\n");
        if (eoh != NULL) {
            long clen = header_content_length(buf, (size_t)(eoh - buf) + 2);
            if (clen >= 0 && len >= (size_t)(eoh + 4 - buf) + (size_t)clen)
                break;
        }
    }
    buf[len] = '\0';
    *out = buf;
    *outlen = len;
    return 0;

out_free:
    free(buf);
    return rc;
}

int gang_http_fetch(const char *host, int port, const char *method, const char *path,
                    const char *body, int timeout_ms, int *status, char **out)
{
    uint64_t deadline = gang_now_ms() + (uint64_t)timeout_ms;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    size_t blen = body ? strlen(body) : 0, len = 0;
    char head[512], *buf = NULL;
    int fd, rc;

    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
        return GANG_EINVAL;
    int hl = snprintf(head, sizeof head,
                      "%s %s HTTP/1.1\r\nHost: %s:%d\r\nConnection: close\r\n"
                      "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                      method, path, host, port, blen);
    if (hl < 0 || (size_t)hl >= sizeof head)
        return GANG_EINVAL;
    fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return gang_err_from_errno(errno);
    rc = connect_by(fd, &sa, deadline);
    if (rc == 0)
        rc = send_by(fd, head, (size_t)hl, deadline);
    if (rc == 0 && blen > 0)
        rc = send_by(fd, body, blen, deadline);
    if (rc == 0)
        rc = recv_by(fd, deadline, &buf, &len);
    if (rc != 0)
        goto out_close;
    char *eoh = strstr(buf, "\r\n\r\n");
    if (eoh == NULL || sscanf(buf, "HTTP/%*d.%*d %d", status) != 1) {
        free(buf);
        rc = GANG_EPROTO;
        goto out_close;
    }
    memmove(buf, eoh + 4, len - (size_t)(eoh + 4 - buf) + 1);
    *out = buf;

out_close:
    close(fd);
    return rc;
}
