/* LD_PRELOAD shim for the benchmark's load generators and the client-AZ tests: TCP connections
 * leave from $DISKLESS_SOURCE_ADDR.
 *
 * Each load-generator process plays a client in one AZ, and each AZ of the dev cluster is a
 * loopback network (127.0.<az>.x). An unbound socket connecting to 127.0.2.1 leaves from
 * 127.0.0.1, and librdkafka cannot bind a source address, so the brokers could not tell by
 * address which AZ a client is in. This binds every not-yet-bound IPv4 socket to the given
 * address just before connect(); brokers then count bytes by the client's real AZ network.
 * It ships in the package: the benchmark runs from an installed package, without the tests. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*connect_fn)(int, const struct sockaddr *, socklen_t);

int connect(int fd, const struct sockaddr *addr, socklen_t len) {
    static connect_fn real_connect = NULL;
    if (real_connect == NULL) real_connect = (connect_fn)dlsym(RTLD_NEXT, "connect");
    const char *source = getenv("DISKLESS_SOURCE_ADDR");
    if (source != NULL && addr != NULL && addr->sa_family == AF_INET) {
        struct sockaddr_in bound;
        socklen_t bound_len = sizeof(bound);
        memset(&bound, 0, sizeof(bound));
        if (getsockname(fd, (struct sockaddr *)&bound, &bound_len) == 0 && bound.sin_family == AF_INET &&
            bound.sin_port == 0 && bound.sin_addr.s_addr == htonl(INADDR_ANY)) {
            struct sockaddr_in local;
            memset(&local, 0, sizeof(local));
            local.sin_family = AF_INET;
            if (inet_pton(AF_INET, source, &local.sin_addr) == 1) {
                int saved = errno;
                (void)bind(fd, (struct sockaddr *)&local, sizeof(local));
                errno = saved;
            }
        }
    }
    return real_connect(fd, addr, len);
}
