/* A minimal splice(2) TCP relay, the same-run reference for one tunnel's throughput
 * (issue 22): listens on 127.0.0.1:0 (prints the port), and for each connection dials the
 * fixed upstream given as "IP PORT" and moves bytes both ways through 1 MiB pipes with
 * blocking splice, one thread per direction, half-closing at EOF. No CONNECT, no policy, no
 * audit: the floor a relay in this position costs. Built and run by benches/proxy_loopback.rs
 * (`--c-relay`); loopback only. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

struct dir { int from, to; };

static void *pump(void *arg) {
    struct dir *d = arg;
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) return NULL;
    fcntl(p[1], F_SETPIPE_SZ, 1 << 20);
    for (;;) {
        ssize_t n = splice(d->from, NULL, p[1], NULL, 1 << 20, SPLICE_F_MOVE | SPLICE_F_MORE);
        if (n <= 0) break;
        while (n > 0) {
            ssize_t m = splice(p[0], NULL, d->to, NULL, n, SPLICE_F_MOVE | SPLICE_F_MORE);
            if (m <= 0) { n = -1; break; }
            n -= m;
        }
        if (n < 0) break;
    }
    shutdown(d->to, SHUT_WR);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    signal(SIGCHLD, SIG_IGN);
    struct sockaddr_in up = { .sin_family = AF_INET, .sin_port = htons(atoi(argv[2])) };
    inet_pton(AF_INET, argv[1], &up.sin_addr);
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET };
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    socklen_t len = sizeof a;
    if (bind(l, (void *)&a, sizeof a) || listen(l, 16) || getsockname(l, (void *)&a, &len)) return 1;
    printf("%d\n", ntohs(a.sin_port));
    fflush(stdout);
    for (;;) {
        int c = accept(l, NULL, NULL);
        if (c < 0) continue;
        if (fork() == 0) {
            int u = socket(AF_INET, SOCK_STREAM, 0);
            int one = 1;
            setsockopt(u, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            if (connect(u, (void *)&up, sizeof up)) _exit(1);
            struct dir d1 = { c, u }, d2 = { u, c };
            pthread_t t;
            pthread_create(&t, NULL, pump, &d2);
            pump(&d1);
            pthread_join(t, NULL);
            _exit(0);
        }
        close(c);
    }
}
