/* Raw loopback TCP in phub's byte pattern, with no interpreter anywhere: a layout of the bound
 * data_path.py holds phub to (raw_tcp.py runs it beside the Python layout; the fastest is the bound).
 *
 *     raw_tcp NBYTES ITERATIONS WORKERS [SOCKBUF [update]]
 *
 * Forks one receiver and WORKERS worker processes, as data_path.py's Python layout does. Every
 * worker sends NBYTES to the receiver and reads them back, ITERATIONS times: a sender thread
 * writes the whole buffer while the main thread reads (like `sendall` in a thread beside a
 * `recv_into` loop). The receiver echoes what it reads, a thread per worker, in reads of at most
 * ECHO_BUFFER bytes. SOCKBUF (bytes; 0, the default: the kernel's own sizing) fixes every socket's
 * send and receive buffers. With `update` the receiver is data_path.py's ideal server: after every
 * read it runs the aggregate+NAG pass over its share of what the read brought and sends the
 * updated weights back (`nag_share`). Round 0 warms up (first touch of every page) and is left out
 * of the CPU time.
 *
 * Prints one JSON object: "seconds" (per worker, every round's time, round 0 included),
 * "worker_cpu" (per worker, CPU seconds from round 1 on) and "echo_cpu" (the receiver's CPU
 * seconds after every connection's warm-up round). Exits 1 with a message on any failure, and
 * gives up after TIMEOUT_S seconds (an alarm) rather than hang.
 *
 * Build: cc -O3 -pthread -o raw_tcp raw_tcp.c (raw_tcp.py does, into a temporary folder). The
 * echo is checked at both ends of every round (`check_echo`).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define ECHO_BUFFER (1 << 20)
#define MAX_WORKERS 64
#define MAX_ITERATIONS 1000
#define TIMEOUT_S 300

static size_t nbytes;
static int iterations, workers, sockbuf, update;

static void die(const char *what) {
    fprintf(stderr, "raw_tcp: %s: %s\n", what, strerror(errno));
    exit(1);
}

static double now(clockid_t clock) {
    struct timespec t;
    clock_gettime(clock, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void tune(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (sockbuf) {
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sockbuf, sizeof sockbuf);
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sockbuf, sizeof sockbuf);
    }
}

static void send_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t k = send(fd, p, n, 0);
        if (k < 0) {
            if (errno == EINTR) continue;
            die("send");
        }
        p += k;
        n -= (size_t)k;
    }
}

/* -- the receiver ---------------------------------------------------------------------------- */
static pthread_mutex_t warm_lock = PTHREAD_MUTEX_INITIALIZER;
static double warmed;  /* the process's CPU time when the last connection's warm-up round ended */
static int conns[MAX_WORKERS];  /* each worker's connection, by rank */
static char *reads[MAX_WORKERS];  /* each connection's read buffer: ECHO_BUFFER bytes */
static float *weight, *mom;  /* the ideal server's state (with `update`) */

/* The ideal server's pass over elements [lo, hi) of a round, this connection's share of them
 * (`rank` of `workers`): every worker's copy summed (each read buffer holds it at element
 * `at` + i - lo, whoever's round it is: no waiting, as data_path.py's Python ideal server), then
 * NAG into weight and momentum. */
static void nag_share(size_t lo, size_t hi, size_t at, int rank) {
    const float rescale = 1.0f / workers, lr = 0.05f, mu = 0.9f;
    size_t first = lo + (hi - lo) * rank / workers, last = lo + (hi - lo) * (rank + 1) / workers;
    const float *a = (const float *)reads[0] + at - lo, *b = (const float *)reads[workers > 1] + at - lo;
    for (size_t i = first; i < last; i++) {
        float g = a[i] + (workers > 1 ? b[i] : 0.0f);
        for (int r = 2; r < workers; r++) g += ((const float *)reads[r])[at + i - lo];
        g *= rescale;
        mom[i] = mu * mom[i] + g;
        weight[i] -= lr * (g + mu * mom[i]);
    }
}

/* One connection: echo what it reads, or (with `update`) run the ideal server's pass over it and
 * send the updated weights back. Reads never wrap the buffer, so neither does [done, end). */
static void *echo(void *arg) {
    int rank = (int)(long)arg, fd = conns[rank];
    char *buf = reads[rank];
    size_t left = nbytes * iterations, warm_left = nbytes, received = 0, done = 0;
    while (left) {
        size_t start = received % ECHO_BUFFER, room = ECHO_BUFFER - start;
        ssize_t n = recv(fd, buf + start, room < nbytes - received ? room : nbytes - received, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) die("echo recv");
        if (!update) send_all(fd, buf + start, (size_t)n);
        received += (size_t)n;
        if (update && received - done >= 4) {
            size_t end = received - received % 4;
            nag_share(done / 4, end / 4, (done % ECHO_BUFFER) / 4, rank);
            send_all(fd, (const char *)weight + done, end - done);
            done = end;
        }
        if (received == nbytes) received = done = 0;
        left -= (size_t)n;
        if (warm_left) {
            warm_left = (size_t)n >= warm_left ? 0 : warm_left - (size_t)n;
            if (!warm_left) {
                pthread_mutex_lock(&warm_lock);
                double cpu = now(CLOCK_PROCESS_CPUTIME_ID);
                if (cpu > warmed) warmed = cpu;
                pthread_mutex_unlock(&warm_lock);
            }
        }
    }
    return NULL;
}

static void receiver(int listener, int out) {
    pthread_t threads[MAX_WORKERS];
    for (int i = 0; i < workers; i++)  /* all before any thread runs: each reads the others' */
        if (!(reads[i] = calloc(1, ECHO_BUFFER))) die("calloc");
    if (update) {
        weight = malloc(nbytes);
        mom = calloc(1, nbytes);
        if (!weight || !mom) die("malloc");
        for (size_t i = 0; i < nbytes / 4; i++) weight[i] = 0.01f;
    }
    for (int i = 0; i < workers; i++) {
        /* tuned as the listener is: an accepted socket takes its options and buffer sizes */
        if ((conns[i] = accept(listener, NULL, NULL)) < 0) die("accept");
        if (pthread_create(&threads[i], NULL, echo, (void *)(long)i)) die("pthread_create");
    }
    for (int i = 0; i < workers; i++) pthread_join(threads[i], NULL);
    dprintf(out, "echo %.6f\n", now(CLOCK_PROCESS_CPUTIME_ID) - warmed);
}

/* -- a worker -------------------------------------------------------------------------------- */
struct sender { int fd, rounds; const char *src; pthread_mutex_t lock; pthread_cond_t go; };

static void *send_rounds(void *arg) {
    struct sender *s = arg;
    for (int i = 0; i < iterations; i++) {
        pthread_mutex_lock(&s->lock);
        while (s->rounds <= i) pthread_cond_wait(&s->go, &s->lock);
        pthread_mutex_unlock(&s->lock);
        send_all(s->fd, s->src, nbytes);
    }
    return NULL;
}

/* The echo's first and last bytes of a round against what was sent (all of them would cost the
 * worker as much CPU as a receive): a receiver that mixed up or lost bytes fails the run. */
static void check_echo(const char *src, const char *dst) {
    size_t n = nbytes < 4096 ? nbytes : 4096;
    if (memcmp(src, dst, n) || memcmp(src + nbytes - n, dst + nbytes - n, n)) {
        fprintf(stderr, "raw_tcp: the echo sent back other bytes than it was sent\n");
        exit(1);
    }
}

static void worker(int port, int out) {
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(port)};
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0) die("socket");
    tune(fd);
    if (connect(fd, (struct sockaddr *)&to, sizeof to)) die("connect");
    char *src = malloc(nbytes), *dst = malloc(nbytes);
    if (!src || !dst) die("malloc");
    for (size_t i = 0; i < nbytes; i += 4) *(float *)(src + i) = (float)(i / 4 % 1000);
    struct sender s = {.fd = fd, .rounds = 0, .src = src};
    pthread_mutex_init(&s.lock, NULL);
    pthread_cond_init(&s.go, NULL);
    pthread_t thread;
    if (pthread_create(&thread, NULL, send_rounds, &s)) die("pthread_create");
    double seconds[MAX_ITERATIONS], cpu = 0;
    for (int i = 0; i < iterations; i++) {
        if (i == 1) cpu = now(CLOCK_PROCESS_CPUTIME_ID);
        double started = now(CLOCK_MONOTONIC);
        pthread_mutex_lock(&s.lock);
        s.rounds = i + 1;
        pthread_cond_signal(&s.go);
        pthread_mutex_unlock(&s.lock);
        for (size_t got = 0; got < nbytes;) {
            ssize_t n = recv(fd, dst + got, nbytes - got, 0);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) die("worker recv");
            got += (size_t)n;
        }
        seconds[i] = now(CLOCK_MONOTONIC) - started;
        if (!update) check_echo(src, dst);
    }
    pthread_join(thread, NULL);
    cpu = now(CLOCK_PROCESS_CPUTIME_ID) - cpu;
    /* one write, so the lines of the processes never interleave */
    char line[32 * MAX_ITERATIONS + 64];
    int at = snprintf(line, sizeof line, "worker %.6f", cpu);
    for (int i = 0; i < iterations; i++) at += snprintf(line + at, sizeof line - at, " %.6f", seconds[i]);
    snprintf(line + at, sizeof line - at, "\n");
    if (write(out, line, strlen(line)) < 0) die("write");
}

/* -- the launcher ---------------------------------------------------------------------------- */
int main(int argc, char **argv) {
    if (argc < 4 || argc > 6 || (argc > 5 && strcmp(argv[5], "update")) || atoll(argv[1]) < 4 || atoi(argv[2]) < 2 || atoi(argv[2]) > MAX_ITERATIONS ||
        atoi(argv[3]) < 1 || atoi(argv[3]) > MAX_WORKERS) {
        fprintf(stderr, "usage: raw_tcp NBYTES(>=4) ITERATIONS(2..%d) WORKERS(1..%d) [SOCKBUF [update]]\n",
                MAX_ITERATIONS, MAX_WORKERS);
        return 2;
    }
    nbytes = (size_t)atoll(argv[1]) / 4 * 4;
    iterations = atoi(argv[2]);
    workers = atoi(argv[3]);
    sockbuf = argc > 4 ? atoi(argv[4]) : 0;
    update = argc > 5 && !strcmp(argv[5], "update");
    alarm(TIMEOUT_S);  /* and every child sets its own: nothing here outlives it */

    struct sockaddr_in at = {.sin_family = AF_INET};
    socklen_t len = sizeof at;
    at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int listener = socket(AF_INET, SOCK_STREAM, 0), report[2];
    if (listener >= 0) tune(listener);  /* the accepted sockets' buffers are sized from the start */
    if (listener < 0 || bind(listener, (struct sockaddr *)&at, sizeof at) || listen(listener, workers) ||
        getsockname(listener, (struct sockaddr *)&at, &len) || pipe(report))
        die("listen");
    pid_t kids[MAX_WORKERS + 1];
    for (int i = 0; i <= workers; i++) {
        kids[i] = fork();
        if (kids[i] < 0) die("fork");
        if (kids[i] == 0) {
            alarm(TIMEOUT_S);  /* a child's own: fork does not pass the launcher's on */
            close(report[0]);
            if (i == 0) receiver(listener, report[1]);
            else worker(ntohs(at.sin_port), report[1]);
            _exit(0);
        }
    }
    close(report[1]);
    close(listener);
    /* the first process to fail takes the others down at once, rather than leave them waiting */
    int failed = 0, status;
    for (int left = workers + 1; left; left--) {
        if (wait(&status) < 0) die("wait");
        if ((!WIFEXITED(status) || WEXITSTATUS(status)) && !failed) {
            failed = 1;
            for (int i = 0; i <= workers; i++) kill(kids[i], SIGKILL);
            if (WIFSIGNALED(status)) fprintf(stderr, "raw_tcp: a process died of signal %d\n", WTERMSIG(status));
        }
    }
    if (failed) {
        fprintf(stderr, "raw_tcp: a process failed\n");
        return 1;
    }
    /* the children's lines, turned into one JSON object */
    static char text[(32 * MAX_ITERATIONS + 64) * (MAX_WORKERS + 1)];
    size_t have = 0;
    for (ssize_t n; (n = read(report[0], text + have, sizeof text - 1 - have)) > 0;) have += (size_t)n;
    text[have] = 0;
    printf("{\"seconds\": [");
    const char *sep = "";
    char *save, *line;
    double echo_cpu = -1;
    static double cpu[MAX_WORKERS];
    int w = 0;
    for (line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (sscanf(line, "echo %lf", &echo_cpu) == 1) continue;
        char *p = line + strlen("worker ");
        cpu[w++] = strtod(p, &p);
        printf("%s[", sep);
        for (int i = 0; i < iterations; i++) printf("%s%.6f", i ? ", " : "", strtod(p, &p));
        printf("]");
        sep = ", ";
    }
    printf("], \"worker_cpu\": [");
    for (int i = 0; i < w; i++) printf("%s%.6f", i ? ", " : "", cpu[i]);
    printf("], \"echo_cpu\": %.6f}\n", echo_cpu);
    return w == workers && echo_cpu >= 0 ? 0 : 1;
}
