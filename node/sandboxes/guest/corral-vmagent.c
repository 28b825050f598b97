/* corral-vmagent: PID 1 of a microVM sandbox and the node's agent inside it.
 *
 *   corral-vmagent --ctl PATH --data PATH [--no-system]
 *   corral-vmagent --ctl-fd N --data-fd M [--no-system]
 *
 * The node talks to it over two ports (in the guest: virtio-serial character devices; a
 * PATH naming a Unix socket is connected to instead, for tests of the reopening on the
 * host). The protocol, frames and bounds are in docs/microvm-protocol.md and in the
 * docstring of node/sandboxes/microvm/channel.py.
 *
 * One single-threaded poll loop is the only writer of both ports. Each EXEC and each file
 * request is a forked child that takes the user (setgroups, setresgid, setresuid; the user
 * resolved by parsing the guest's /etc/passwd and /etc/group: no NSS in a static binary)
 * before it touches a path; a command's output comes back through pipes (or a terminal), a
 * file child's through a SOCK_SEQPACKET socketpair whose packets are protocol frames (the
 * main loop forwards them, splitting FILE_DATA to the stream's credit).
 *
 * The connection: a frame larger than 65536 bytes, a type not allowed on its port, or a
 * field list without its final NUL ends it. Ending it kills every stream's session and
 * forgets every stream; then with --ctl/--data the ports are closed and reopened (after a
 * short sleep; the same on EOF or hangup), with --ctl-fd/--data-fd (tests on the host) the
 * agent exits with status 0 instead. --no-system: HELLO leaves the clock, the hostname and
 * /etc/machine-id alone, and commands run in the agent's own cgroup (tests on the host).
 *
 * Commands run in a cgroup of their own (/sys/fs/cgroup/corral-commands, cgroup v2), whose
 * pids.max HELLO sets from the sandbox's pids: a fork bomb in the guest stops there, and
 * the agent (in the root group) still forks the next command and every file call.
 *
 * PID 1: ignores every signal it can, reaps every orphan (SIGCHLD via signalfd; on the
 * host it makes itself a child subreaper so it reaps its sessions' orphans too).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <linux/random.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#define HDR 12
#define MAX_PAYLOAD 65536
#define MAX_STREAMS 1024
#define WINDOW 262144u
#define QUEUE_HIGH 262144u        /* a port's queue above this: stop reading sources */
#define CTL_PAUSE (1u << 20)      /* ctl queue above this: stop reading the host's ctl */
#define MAX_GROUPS 256
#define MAX_LIST 65536            /* most entries one LIST answers (else too_many) */
#define MAX_DEPTH 64
#define PTY_DRAIN (1u << 20)
#define MAX_PATH 4096

enum {
    T_HELLO = 1, T_HELLO_OK = 2, T_PING = 3, T_PONG = 4,
    T_EXEC = 10, T_STARTED = 11, T_EXIT = 12, T_SIGNAL = 13, T_STDIN = 14,
    T_STDIN_CLOSE = 15, T_RESIZE = 16, T_RELEASE = 17, T_ERROR = 19,
    T_STDOUT = 20, T_STDERR = 21, T_CREDIT = 30,
    T_FILE_READ = 40, T_FILE_INFO = 41, T_FILE_DATA = 42, T_FILE_END = 43,
    T_FILE_WRITE = 44, T_ENTRY = 45, T_STAT = 46, T_LIST = 47, T_LIST_END = 48,
    T_MKDIR = 49, T_REMOVE = 50, T_MOVE = 51,
};

/* ---- small helpers ---------------------------------------------------------------- */

struct buf {
    char *p;
    size_t off, len, cap; /* bytes p[off .. off+len) */
};

static void die_oom(void) {
    static const char m[] = "corral-vmagent: out of memory\n";
    if (write(2, m, sizeof m - 1) < 0) {
    }
    /* PID 1 must not exit: wait for memory to come back */
    sleep(1);
}

static void buf_reserve(struct buf *b, size_t more) {
    if (b->off + b->len + more <= b->cap)
        return;
    if (b->off > 0) {
        memmove(b->p, b->p + b->off, b->len);
        b->off = 0;
        if (b->len + more <= b->cap)
            return;
    }
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more)
        cap *= 2;
    char *p;
    while ((p = realloc(b->p, cap)) == NULL)
        die_oom();
    b->p = p;
    b->cap = cap;
}

static void buf_add(struct buf *b, const void *data, size_t n) {
    if (n == 0)
        return;
    buf_reserve(b, n);
    memcpy(b->p + b->off + b->len, data, n);
    b->len += n;
}

static void buf_eat(struct buf *b, size_t n) {
    b->off += n;
    b->len -= n;
    if (b->len == 0)
        b->off = 0;
}

static void buf_free(struct buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

static void put_u32(char *p, uint32_t v) {
    p[0] = (char)(v & 0xff), p[1] = (char)((v >> 8) & 0xff);
    p[2] = (char)((v >> 16) & 0xff), p[3] = (char)((v >> 24) & 0xff);
}

static void put_u16(char *p, uint16_t v) {
    p[0] = (char)(v & 0xff), p[1] = (char)((v >> 8) & 0xff);
}

static uint32_t get_u32(const char *s) {
    const unsigned char *p = (const unsigned char *)s;
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint16_t get_u16(const char *s) {
    const unsigned char *p = (const unsigned char *)s;
    return (uint16_t)(p[0] | p[1] << 8);
}

static void header(char *h, uint32_t len, uint32_t id, uint16_t type) {
    put_u32(h, len);
    put_u32(h + 4, id);
    put_u16(h + 8, type);
    put_u16(h + 10, 0);
}

/* fields: NUL-terminated key=value strings */
struct fields {
    struct buf b;
};

static void field(struct fields *f, const char *key, const char *value) {
    size_t k = strlen(key), v = strlen(value);
    if (f->b.len + k + v + 2 > MAX_PAYLOAD)
        return; /* never exceeds in practice: paths are < 4096 */
    buf_add(&f->b, key, k);
    buf_add(&f->b, "=", 1);
    buf_add(&f->b, value, v);
    buf_add(&f->b, "", 1);
}

static void fieldf(struct fields *f, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void fieldf(struct fields *f, const char *key, const char *fmt, ...) {
    char v[64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v, sizeof v, fmt, ap);
    va_end(ap);
    field(f, key, v);
}

/* The value of the first field `key` in a well-formed payload (ends with NUL), or NULL.
 * `from`: continue after a previous match (repeated keys), else NULL. */
static const char *get_field(const char *p, size_t len, const char *key, const char **from) {
    size_t k = strlen(key);
    const char *s = from && *from ? *from : p;
    const char *end = p + len;
    while (s < end) {
        size_t n = strlen(s);
        const char *next = s + n + 1;
        if (n > k && memcmp(s, key, k) == 0 && s[k] == '=') {
            if (from)
                *from = next;
            return s + k + 1;
        }
        s = next;
    }
    if (from)
        *from = end;
    return NULL;
}

static int parse_u64(const char *s, unsigned long long max, unsigned long long *out) {
    if (s == NULL || *s < '0' || *s > '9')
        return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v > max)
        return -1;
    *out = v;
    return 0;
}

static const char *errno_code(int e) {
    switch (e) {
    case ENOENT: return "path_not_found";
    case EEXIST: case ENOTEMPTY: return "path_exists";
    case ENOTDIR: return "not_a_directory";
    case EACCES: case EPERM: case EROFS: return "permission_denied";
    case EISDIR: case EINVAL: case ELOOP: case ENAMETOOLONG: case EXDEV: case EBUSY:
        return "invalid_path";
    case ENOSPC: case EDQUOT: return "disk_full";
    default: return "internal";
    }
}

/* ---- users: the guest's /etc/passwd and /etc/group, parsed here ------------------- */

struct user {
    uid_t uid;
    gid_t gid;
    gid_t groups[MAX_GROUPS];
    int ngroups;
};

/* Calls fn(fields[], nfields, ctx) for each line of a colon-separated file; stops when fn
 * returns nonzero and returns that. */
static int each_line(const char *path, int (*fn)(char **, int, void *), void *ctx) {
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return 0;
    char *line = NULL;
    size_t cap = 0;
    int rc = 0;
    while (rc == 0 && getline(&line, &cap, f) >= 0) {
        line[strcspn(line, "\n")] = 0;
        char *parts[8];
        int n = 0;
        char *s = line;
        while (n < 8) {
            parts[n++] = s;
            char *c = strchr(s, ':');
            if (c == NULL)
                break;
            *c = 0;
            s = c + 1;
        }
        rc = fn(parts, n, ctx);
    }
    free(line);
    fclose(f);
    return rc;
}

static int parse_id(const char *s, unsigned *out) {
    unsigned long long v;
    if (parse_u64(s, 0xfffffffeu, &v) < 0)
        return -1;
    *out = (unsigned)v;
    return 0;
}

struct pw_query {
    const char *name; /* by name, or by uid when NULL */
    unsigned uid;
    char found_name[256];
    unsigned found_uid, found_gid;
    int found;
};

static int pw_match(char **f, int n, void *ctx) {
    struct pw_query *q = ctx;
    unsigned uid, gid;
    if (n < 4 || parse_id(f[2], &uid) < 0 || parse_id(f[3], &gid) < 0)
        return 0;
    if (q->name ? strcmp(f[0], q->name) != 0 : uid != q->uid)
        return 0;
    snprintf(q->found_name, sizeof q->found_name, "%s", f[0]);
    q->found_uid = uid, q->found_gid = gid, q->found = 1;
    return 1;
}

struct gr_query {
    const char *member;
    struct user *u;
    unsigned gid; /* by gid: name */
    char found_name[256];
    int found;
};

static int gr_members(char **f, int n, void *ctx) {
    struct gr_query *q = ctx;
    unsigned gid;
    if (n < 4 || parse_id(f[2], &gid) < 0)
        return 0;
    for (char *m = f[3]; *m;) {
        size_t len = strcspn(m, ",");
        if (len == strlen(q->member) && memcmp(m, q->member, len) == 0) {
            int dup = 0;
            for (int i = 0; i < q->u->ngroups; i++)
                dup |= q->u->groups[i] == gid;
            if (!dup && q->u->ngroups < MAX_GROUPS)
                q->u->groups[q->u->ngroups++] = gid;
        }
        m += len;
        if (*m == ',')
            m++;
    }
    return 0;
}

static int gr_name(char **f, int n, void *ctx) {
    struct gr_query *q = ctx;
    unsigned gid;
    if (n < 3 || parse_id(f[2], &gid) < 0 || gid != q->gid)
        return 0;
    snprintf(q->found_name, sizeof q->found_name, "%s", f[0]);
    q->found = 1;
    return 1;
}

/* `spec`: a name, a uid, or uid:gid. 0 when resolved. */
static int resolve_user(const char *spec, struct user *u) {
    memset(u, 0, sizeof *u);
    if (spec == NULL || !*spec)
        return -1;
    struct pw_query q = {0};
    unsigned uid, gid;
    const char *colon = strchr(spec, ':');
    if (colon) {
        char a[32];
        size_t n = (size_t)(colon - spec);
        if (n >= sizeof a)
            return -1;
        memcpy(a, spec, n);
        a[n] = 0;
        if (parse_id(a, &uid) < 0 || parse_id(colon + 1, &gid) < 0)
            return -1;
        q.uid = uid;
        each_line("/etc/passwd", pw_match, &q);
    } else if (parse_id(spec, &uid) == 0) {
        q.uid = uid;
        each_line("/etc/passwd", pw_match, &q);
        gid = q.found ? q.found_gid : uid;
    } else {
        q.name = spec;
        each_line("/etc/passwd", pw_match, &q);
        if (!q.found)
            return -1;
        uid = q.found_uid, gid = q.found_gid;
    }
    u->uid = uid, u->gid = gid;
    u->groups[u->ngroups++] = gid;
    if (q.found) {
        struct gr_query g = {.member = q.found_name, .u = u};
        each_line("/etc/group", gr_members, &g);
    }
    return 0;
}

static int take_user(const struct user *u) {
    if (geteuid() != 0 && u->uid == geteuid() && u->gid == getegid())
        return 0; /* on the host, not root: already that user */
    if (setgroups((size_t)u->ngroups, u->groups) < 0 || setresgid(u->gid, u->gid, u->gid) < 0 ||
        setresuid(u->uid, u->uid, u->uid) < 0)
        return -1;
    return 0;
}

static void child_signals(void) {
    sigset_t none;
    sigemptyset(&none);
    for (int s = 1; s < NSIG; s++)
        signal(s, SIG_DFL);
    sigprocmask(SIG_SETMASK, &none, NULL);
}

/* ---- ports ------------------------------------------------------------------------ */

struct port {
    int fd;
    const char *path;
    struct buf out;
    char in[HDR + MAX_PAYLOAD];
    size_t inlen;
};

static struct port ctl = {.fd = -1}, data = {.fd = -1};
static int fd_mode, no_system;

/* ---- the commands' cgroup --------------------------------------------------------- */

#define COMMANDS_CGROUP "/sys/fs/cgroup/corral-commands"
/* its cgroup.procs, open: each command's child joins it before it takes its user (the
 * descriptor closes at exec) */
static int commands_procs = -1;

static void make_commands_cgroup(void) {
    if (no_system)
        return;
    if (mount("cgroup2", "/sys/fs/cgroup", "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) <
            0 &&
        errno != EBUSY) {
        perror("corral-vmagent: mount cgroup2 (commands run without a pids limit)");
        return;
    }
    int fd = open("/sys/fs/cgroup/cgroup.subtree_control", O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, "+pids", 5) < 0)
        perror("corral-vmagent: enable the pids controller");
    if (fd >= 0)
        close(fd);
    if (mkdir(COMMANDS_CGROUP, 0755) < 0 && errno != EEXIST) {
        perror("corral-vmagent: mkdir " COMMANDS_CGROUP);
        return;
    }
    commands_procs = open(COMMANDS_CGROUP "/cgroup.procs", O_WRONLY | O_CLOEXEC);
    if (commands_procs < 0)
        perror("corral-vmagent: open " COMMANDS_CGROUP "/cgroup.procs");
}

static void set_commands_pids(const char *max) {
    int fd = open(COMMANDS_CGROUP "/pids.max", O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, max, strlen(max)) < 0)
        perror("corral-vmagent: pids.max");
    if (fd >= 0)
        close(fd);
}

static void frame_to(struct port *p, uint32_t id, uint16_t type, const void *payload,
                     size_t len) {
    char h[HDR];
    header(h, (uint32_t)len, id, type);
    buf_add(&p->out, h, HDR);
    if (len)
        buf_add(&p->out, payload, len);
}

static void fields_to(struct port *p, uint32_t id, uint16_t type, struct fields *f) {
    frame_to(p, id, type, f->b.p ? f->b.p + f->b.off : "", f->b.len);
    buf_free(&f->b);
}

static void error_to_host(uint32_t id, const char *code, const char *message) {
    struct fields f = {0};
    field(&f, "code", code);
    field(&f, "message", message);
    fields_to(&ctl, id, T_ERROR, &f);
}

static void credit_to_host(uint32_t id, size_t n) {
    struct fields f = {0};
    fieldf(&f, "bytes", "%zu", n);
    fields_to(&ctl, id, T_CREDIT, &f);
}

static int set_nonblock(int fd) {
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static int open_port(const char *path) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISSOCK(st.st_mode)) {
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        if (fd < 0 || strlen(path) >= sizeof a.sun_path) {
            if (fd >= 0)
                close(fd);
            return -1;
        }
        strcpy(a.sun_path, path);
        if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0 || set_nonblock(fd) < 0) {
            close(fd);
            return -1;
        }
        return fd;
    }
    return open(path, O_RDWR | O_NOCTTY | O_CLOEXEC | O_NONBLOCK);
}

static void open_ports(void) {
    for (;;) {
        ctl.fd = open_port(ctl.path);
        data.fd = ctl.fd >= 0 ? open_port(data.path) : -1;
        if (ctl.fd >= 0 && data.fd >= 0)
            return;
        if (ctl.fd >= 0)
            close(ctl.fd);
        ctl.fd = -1;
        usleep(100000);
    }
}

/* ---- streams ---------------------------------------------------------------------- */

enum { K_EXEC = 1, K_FILE = 2 };

struct stream {
    uint32_t id;
    int kind;
    pid_t pid;
    int exited, status, exit_sent;
    int out[2];           /* exec: stdout, stderr (pty: out[0] only); file: the socket */
    long long drain[2];   /* after the exit: bytes still to drain, -1 not yet exited */
    int in;               /* exec: stdin's write end, -1 none */
    int pty;              /* exec: the terminal's master (resize), -1 none */
    unsigned long long out_credit; /* bytes we may still send the host on this stream */
    unsigned long long in_window;  /* bytes the host may still send us */
    struct buf inbuf;     /* host bytes not yet handed on */
    int in_closed, in_close_done;
    struct buf held;      /* file: FILE_DATA bytes waiting for credit */
    int answered;         /* file: its final reply (or FILE_END) went to the host */
};

static struct stream *streams[MAX_STREAMS];
static int nstreams;
/* bumped when the connection ends / when a stream is forgotten: pointers into the
 * table taken before are stale */
static unsigned conn_epoch, table_epoch;

static struct stream *find(uint32_t id) {
    for (int i = 0; i < nstreams; i++)
        if (streams[i]->id == id)
            return streams[i];
    return NULL;
}

static void close_fd(int *fd) {
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

/* The command's whole session; and the command itself, which may not have called setsid
 * yet (STARTED goes out as soon as it is forked): then its group does not exist. */
static void kill_session(struct stream *s, int sig) {
    kill(-s->pid, sig);
    if (!s->exited)
        kill(s->pid, sig);
}

static void forget(struct stream *s, int kill_it) {
    if (kill_it && s->pid > 0) {
        if (s->kind == K_EXEC)
            kill_session(s, SIGKILL);
        else if (!s->exited)
            kill(s->pid, SIGKILL);
    }
    close_fd(&s->out[0]);
    close_fd(&s->out[1]);
    close_fd(&s->in);
    close_fd(&s->pty);
    buf_free(&s->inbuf);
    buf_free(&s->held);
    for (int i = 0; i < nstreams; i++)
        if (streams[i] == s) {
            streams[i] = streams[--nstreams];
            break;
        }
    table_epoch++;
    free(s);
}

static struct stream *new_stream(uint32_t id, int kind) {
    struct stream *s;
    while ((s = calloc(1, sizeof *s)) == NULL)
        die_oom();
    s->id = id, s->kind = kind;
    s->out[0] = s->out[1] = s->in = s->pty = -1;
    s->drain[0] = s->drain[1] = -1;
    s->out_credit = WINDOW;
    streams[nstreams++] = s;
    return s;
}

static int conn_used; /* a frame came on this connection (else it ends quietly) */

static void drop_connection(const char *why) {
    conn_epoch++;
    if (conn_used || fd_mode)
        fprintf(stderr, "corral-vmagent: connection ended: %s\n", why);
    conn_used = 0;
    while (nstreams > 0)
        forget(streams[0], 1);
    close_fd(&ctl.fd);
    close_fd(&data.fd);
    buf_free(&ctl.out);
    buf_free(&data.out);
    ctl.inlen = data.inlen = 0;
    if (fd_mode)
        exit(0);
    usleep(100000);
    open_ports();
}

/* ---- HELLO ------------------------------------------------------------------------ */

static int unhex(const char *s, unsigned char *out, size_t n) {
    if (strlen(s) != 2 * n)
        return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1)
            return -1;
        out[i] = (unsigned char)v;
    }
    return 0;
}

static void hello(uint32_t id, const char *p, size_t len) {
    const char *t = get_field(p, len, "time_ns", NULL);
    const char *e = get_field(p, len, "entropy", NULL);
    const char *h = get_field(p, len, "hostname", NULL);
    const char *m = get_field(p, len, "machine_id", NULL);
    const char *pids = get_field(p, len, "pids", NULL);
    unsigned long long ns, max_pids;
    if (pids && parse_u64(pids, 1u << 22, &max_pids) == 0 && max_pids > 0 && commands_procs >= 0)
        set_commands_pids(pids);
    if (t && parse_u64(t, ~0ull, &ns) == 0 && !no_system) {
        struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000ull),
                              .tv_nsec = (long)(ns % 1000000000ull)};
        if (clock_settime(CLOCK_REALTIME, &ts) < 0)
            perror("corral-vmagent: clock_settime");
    }
    struct {
        struct rand_pool_info info;
        unsigned char bytes[64];
    } pool;
    if (e && unhex(e, pool.bytes, 64) == 0) {
        int fd = open("/dev/urandom", O_WRONLY | O_CLOEXEC);
        pool.info.entropy_count = 64 * 8;
        pool.info.buf_size = 64;
        if (fd >= 0 && ioctl(fd, RNDADDENTROPY, &pool) < 0) {
            if (write(fd, pool.bytes, 64) < 0) { /* mixed in, not credited */
            }
        }
        if (fd >= 0)
            close(fd);
    }
    if (h && *h && strlen(h) <= 64 && !no_system && sethostname(h, strlen(h)) < 0)
        perror("corral-vmagent: sethostname");
    unsigned char mid[16];
    /* mounted once: a later HELLO (a claimed warm clone's new identity, a reconnection)
     * rewrites the file under the bind mount, and stacks nothing */
    static int machine_id_set;
    if (m && unhex(m, mid, 16) == 0 && !no_system && machine_id_set) {
        int fd = open("/run/corral-machine-id/machine-id", O_WRONLY | O_TRUNC | O_CLOEXEC);
        char line[34];
        snprintf(line, sizeof line, "%s\n", m);
        if (fd < 0 || write(fd, line, 33) != 33)
            perror("corral-vmagent: machine-id");
        if (fd >= 0)
            close(fd);
    } else if (m && unhex(m, mid, 16) == 0 && !no_system) {
        machine_id_set = 1;
        /* a tmpfs of its own, bound over /etc/machine-id */
        mkdir("/run", 0755); /* an image without one */
        mkdir("/run/corral-machine-id", 0755);
        if (mount("tmpfs", "/run/corral-machine-id", "tmpfs", 0, "size=4k,mode=0755") == 0) {
            int fd = open("/run/corral-machine-id/machine-id",
                          O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0444);
            if (fd >= 0) {
                char line[34];
                snprintf(line, sizeof line, "%s\n", m);
                if (write(fd, line, 33) < 0) {
                }
                close(fd);
                int target = open("/etc/machine-id", O_WRONLY | O_CREAT | O_CLOEXEC, 0444);
                if (target >= 0)
                    close(target);
                mount("/run/corral-machine-id/machine-id", "/etc/machine-id", NULL, MS_BIND,
                      NULL);
            }
        }
    }
    struct fields f = {0};
    field(&f, "version", "1");
    fieldf(&f, "pid", "%d", (int)getpid());
    fields_to(&ctl, id, T_HELLO_OK, &f);
}

/* ---- EXEC ------------------------------------------------------------------------- */

static void say(const char *a, const char *b, const char *c) {
    dprintf(2, "corral-vmagent: %s%s%s\n", a, b, c);
}

static _Noreturn void exec_child(char **argv, char **envp, const char *cwd,
                                 const struct user *u, int fd0, int fd1, int fd2, int tty) {
    child_signals();
    setsid();
    if (commands_procs >= 0 && write(commands_procs, "0", 1) < 0) {
        say("cannot join " COMMANDS_CGROUP ": ", strerror(errno), "");
        _exit(126);
    }
    if (tty >= 0 && ioctl(tty, TIOCSCTTY, 0) < 0)
        _exit(126);
    if (fd0 < 0)
        fd0 = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd0 < 0 || dup2(fd0, 0) < 0 || dup2(fd1, 1) < 0 || dup2(fd2, 2) < 0)
        _exit(126);
    if (take_user(u) < 0) {
        say("cannot take the user: ", strerror(errno), "");
        _exit(126);
    }
    if (chdir(cwd) < 0) {
        say(cwd, ": ", strerror(errno));
        _exit(126);
    }
    const char *name = argv[0];
    if (strchr(name, '/')) {
        execve(name, argv, envp);
        say(name, ": ", strerror(errno));
        _exit(errno == ENOENT ? 127 : 126);
    }
    const char *path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
    for (char **e = envp; *e; e++)
        if (strncmp(*e, "PATH=", 5) == 0)
            path = *e + 5;
    int seen_eacces = 0, last = ENOENT;
    char full[MAX_PATH];
    for (const char *d = path;;) {
        size_t n = strcspn(d, ":");
        if (snprintf(full, sizeof full, "%.*s%s%s", (int)n, n ? d : ".", "/", name) <
            (int)sizeof full) {
            execve(full, argv, envp);
            if (errno == EACCES)
                seen_eacces = 1;
            else if (errno != ENOENT && errno != ENOTDIR)
                last = errno;
        }
        if (!d[n])
            break;
        d += n + 1;
    }
    if (seen_eacces)
        last = EACCES;
    if (last == ENOENT) {
        say(name, ": command not found", "");
        _exit(127);
    }
    say(name, ": ", strerror(last));
    _exit(126);
}

static void exec_request(uint32_t id, const char *p, size_t len) {
    struct stream *s = find(id);
    if (s) {
        if (s->kind == K_EXEC) {
            struct fields f = {0};
            fieldf(&f, "pid", "%d", (int)s->pid);
            fields_to(&ctl, id, T_STARTED, &f);
        } else {
            error_to_host(id, "bad_request", "the stream is in use");
        }
        return;
    }
    if (id == 0)
        return error_to_host(id, "bad_request", "stream 0 is the connection's");
    if (nstreams >= MAX_STREAMS)
        return error_to_host(id, "too_many", "too many streams");
    struct user u;
    const char *user = get_field(p, len, "user", NULL);
    if (user == NULL)
        return error_to_host(id, "bad_request", "no user");
    if (resolve_user(user, &u) < 0)
        return error_to_host(id, "no_such_user", user);
    const char *cwd = get_field(p, len, "cwd", NULL);
    if (cwd == NULL || !*cwd)
        cwd = "/";
    int nargs = 0, nenv = 0;
    for (const char *it = NULL; get_field(p, len, "arg", &it);)
        nargs++;
    for (const char *it = NULL; get_field(p, len, "env", &it);)
        nenv++;
    if (nargs == 0)
        return error_to_host(id, "bad_request", "no arg");
    const char *stdin_f = get_field(p, len, "stdin", NULL);
    int want_stdin = stdin_f && strcmp(stdin_f, "1") == 0;
    const char *pty_f = get_field(p, len, "pty", NULL);
    unsigned cols = 0, rows = 0;
    if (pty_f) {
        char extra;
        if (sscanf(pty_f, "%5ux%5u%c", &cols, &rows, &extra) != 2 || cols < 1 || rows < 1 ||
            cols > 65535 || rows > 65535)
            return error_to_host(id, "bad_request", "bad pty");
    }
    char **argv = calloc((size_t)nargs + 1, sizeof *argv);
    char **envp = calloc((size_t)nenv + 1, sizeof *envp);
    if (!argv || !envp) {
        free(argv);
        free(envp);
        return error_to_host(id, "internal", "out of memory");
    }
    int i = 0;
    for (const char *it = NULL, *v; (v = get_field(p, len, "arg", &it));)
        argv[i++] = (char *)v;
    i = 0;
    for (const char *it = NULL, *v; (v = get_field(p, len, "env", &it));)
        envp[i++] = (char *)v;

    int outp[2] = {-1, -1}, errp[2] = {-1, -1}, inp[2] = {-1, -1}, master = -1, slave = -1;
    int ok = 1;
    if (pty_f) {
        struct winsize ws = {.ws_row = (unsigned short)rows, .ws_col = (unsigned short)cols};
        master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
        ok = master >= 0 && unlockpt(master) == 0 && ioctl(master, TIOCSWINSZ, &ws) == 0;
        if (ok)
            slave = ioctl(master, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC);
        ok = ok && slave >= 0;
        if (ok && fchown(slave, u.uid, (gid_t)-1) < 0 && geteuid() == 0)
            ok = 0;
    } else {
        ok = pipe2(outp, O_CLOEXEC) == 0 && pipe2(errp, O_CLOEXEC) == 0;
    }
    if (ok && want_stdin && !pty_f)
        ok = pipe2(inp, O_CLOEXEC) == 0;
    pid_t pid = ok ? fork() : -1;
    if (pid == 0) {
        if (pty_f)
            exec_child(argv, envp, cwd, &u, slave, slave, slave, slave);
        exec_child(argv, envp, cwd, &u, inp[0], outp[1], errp[1], -1);
    }
    int saved = errno;
    free(argv);
    free(envp);
    close_fd(&outp[1]);
    close_fd(&errp[1]);
    close_fd(&inp[0]);
    close_fd(&slave);
    if (pid < 0) {
        close_fd(&outp[0]);
        close_fd(&errp[0]);
        close_fd(&inp[1]);
        close_fd(&master);
        return error_to_host(id, saved == EAGAIN || saved == ENOMEM ? "too_many" : "internal",
                             strerror(saved));
    }
    s = new_stream(id, K_EXEC);
    s->pid = pid;
    if (pty_f) {
        s->out[0] = master;
        s->pty = fcntl(master, F_DUPFD_CLOEXEC, 3);
        if (want_stdin)
            s->in = fcntl(master, F_DUPFD_CLOEXEC, 3);
    } else {
        s->out[0] = outp[0], s->out[1] = errp[0], s->in = inp[1];
    }
    for (int k = 0; k < 2; k++)
        if (s->out[k] >= 0)
            set_nonblock(s->out[k]);
    if (s->in >= 0)
        set_nonblock(s->in);
    s->in_window = s->in >= 0 ? WINDOW : 0;
    struct fields f = {0};
    fieldf(&f, "pid", "%d", (int)pid);
    fields_to(&ctl, id, T_STARTED, &f);
}

/* ---- file children ---------------------------------------------------------------- */

static int fsock = -1; /* in a file child: its socket to the main loop */

static void child_send(uint16_t type, const void *payload, size_t len) {
    static char pkt[HDR + MAX_PAYLOAD];
    header(pkt, (uint32_t)len, 0, type);
    memcpy(pkt + HDR, payload, len);
    if (send(fsock, pkt, HDR + len, MSG_NOSIGNAL) < 0)
        _exit(1);
}

static void child_fields(uint16_t type, struct fields *f) {
    child_send(type, f->b.p ? f->b.p + f->b.off : "", f->b.len);
    buf_free(&f->b);
}

static _Noreturn void child_error(const char *code, const char *message) {
    struct fields f = {0};
    field(&f, "code", code);
    field(&f, "message", message);
    child_fields(T_ERROR, &f);
    _exit(0);
}

static _Noreturn void child_errno(const char *path) {
    int e = errno;
    char m[MAX_PATH + 128];
    snprintf(m, sizeof m, "%s: %s", path, strerror(e));
    child_error(errno_code(e), m);
}

static void name_of(int is_group, unsigned id, char *out, size_t n) {
    static int cached[2] = {-1, -1};
    static char names[2][256];
    if (cached[is_group] != (int)id) {
        names[is_group][0] = 0;
        if (is_group) {
            struct gr_query q = {.gid = id};
            each_line("/etc/group", gr_name, &q);
            if (q.found)
                snprintf(names[1], sizeof names[1], "%s", q.found_name);
        } else {
            struct pw_query q = {.uid = id};
            each_line("/etc/passwd", pw_match, &q);
            if (q.found)
                snprintf(names[0], sizeof names[0], "%s", q.found_name);
        }
        cached[is_group] = (int)id;
    }
    if (names[is_group][0])
        snprintf(out, n, "%s", names[is_group]);
    else
        snprintf(out, n, "%u", id);
}

static void entry_fields(struct fields *f, const char *path, const struct stat *st) {
    const char *slash = strrchr(path, '/');
    const char *name = slash && slash[1] ? slash + 1 : path;
    const char *type = S_ISREG(st->st_mode) ? "file" : S_ISDIR(st->st_mode) ? "dir"
                       : S_ISLNK(st->st_mode) ? "symlink" : "other";
    char owner[256], group[256];
    name_of(0, st->st_uid, owner, sizeof owner);
    name_of(1, st->st_gid, group, sizeof group);
    field(f, "name", name);
    field(f, "path", path);
    field(f, "type", type);
    fieldf(f, "size", "%lld", (long long)st->st_size);
    fieldf(f, "mode", "%o", (unsigned)(st->st_mode & 07777));
    fieldf(f, "uid", "%u", (unsigned)st->st_uid);
    fieldf(f, "gid", "%u", (unsigned)st->st_gid);
    field(f, "owner", owner);
    field(f, "group", group);
    fieldf(f, "mtime_ns", "%lld",
           (long long)st->st_mtim.tv_sec * 1000000000ll + st->st_mtim.tv_nsec);
    if (S_ISLNK(st->st_mode)) {
        char target[MAX_PATH];
        ssize_t n = readlink(path, target, sizeof target - 1);
        target[n > 0 ? n : 0] = 0;
        field(f, "target", target);
    }
}

static void send_entry(const char *path, const struct stat *st) {
    struct fields f = {0};
    entry_fields(&f, path, st);
    child_fields(T_ENTRY, &f);
}

static void send_lstat_entry(const char *path) {
    struct stat st;
    if (lstat(path, &st) < 0)
        child_errno(path);
    send_entry(path, &st);
}

static const char *checked_path(const char *p, size_t len, const char *key) {
    const char *path = get_field(p, len, key, NULL);
    if (path == NULL)
        child_error("bad_request", key);
    if (path[0] != '/' || strlen(path) >= MAX_PATH)
        child_error("invalid_path", "the path must be absolute");
    return path;
}

/* Makes the parents of `path` (as the user). */
static void make_parents(const char *path) {
    char tmp[MAX_PATH];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *s = tmp + 1; (s = strchr(s, '/')) != NULL; s++) {
        *s = 0;
        if (mkdir(tmp, 0755) < 0 && errno != EEXIST)
            child_errno(tmp);
        *s = '/';
    }
}

static void file_read(const char *p, size_t len) {
    const char *path = checked_path(p, len, "path");
    unsigned long long max;
    if (parse_u64(get_field(p, len, "max", NULL), ~0ull >> 1, &max) < 0)
        child_error("bad_request", "max");
    int fd = open(path, O_RDONLY | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0)
        child_errno(path);
    if (!S_ISREG(st.st_mode))
        child_error("invalid_path", "not a regular file");
    if ((unsigned long long)st.st_size > max)
        child_error("file_too_large", "the file is larger than asked");
    fcntl(fd, F_SETFL, 0);
    struct fields f = {0};
    entry_fields(&f, path, &st);
    child_fields(T_FILE_INFO, &f);
    static char chunk[MAX_PAYLOAD];
    unsigned long long total = 0;
    for (;;) {
        ssize_t n = read(fd, chunk, sizeof chunk);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (n < 0) {
                field(&f, "code", errno_code(errno));
                field(&f, "message", strerror(errno));
            }
            child_fields(T_FILE_END, &f);
            return;
        }
        total += (unsigned long long)n;
        if (total > max) {
            field(&f, "code", "file_too_large");
            field(&f, "message", "the file grew larger than asked");
            child_fields(T_FILE_END, &f);
            return;
        }
        child_send(T_FILE_DATA, chunk, (size_t)n);
    }
}

static void file_write(const char *p, size_t len) {
    const char *path = checked_path(p, len, "path");
    const char *mode_f = get_field(p, len, "mode", NULL);
    char *end = NULL;
    unsigned long mode = mode_f ? strtoul(mode_f, &end, 8) : 0644;
    if (mode_f && (!*mode_f || *end || mode > 07777))
        child_error("bad_request", "mode");
    make_parents(path);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOCTTY | O_CLOEXEC, (mode_t)mode);
    if (fd < 0)
        child_errno(path);
    if (fchmod(fd, (mode_t)mode) < 0)
        child_errno(path);
    struct fields f = {0};
    fieldf(&f, "bytes", "%u", WINDOW);
    child_fields(T_CREDIT, &f);
    static char pkt[HDR + MAX_PAYLOAD + 1];
    for (;;) {
        ssize_t n = recv(fsock, pkt, sizeof pkt, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < HDR)
            _exit(1); /* the main loop gave up on the stream */
        uint16_t type = get_u16(pkt + 8);
        if (type == T_FILE_END)
            break;
        for (ssize_t off = HDR; off < n;) {
            ssize_t w = write(fd, pkt + off, (size_t)(n - off));
            if (w < 0 && errno == EINTR)
                continue;
            if (w < 0)
                child_errno(path);
            off += w;
        }
    }
    if (close(fd) < 0)
        child_errno(path);
    send_lstat_entry(path);
}

struct listed {
    char *path;
    struct stat st;
};

static struct listed *list;
static size_t nlist, caplist;

static void walk(const char *dir, int level, int depth) {
    DIR *d = opendir(dir);
    if (d == NULL) {
        if (level == 1)
            child_errno(dir);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        char path[MAX_PATH];
        if (snprintf(path, sizeof path, "%s%s%s", dir, strcmp(dir, "/") ? "/" : "", e->d_name) >=
            (int)sizeof path)
            continue;
        if (nlist >= MAX_LIST)
            child_error("too_many", "too many entries: list less deep");
        if (nlist == caplist) {
            caplist = caplist ? caplist * 2 : 256;
            list = realloc(list, caplist * sizeof *list);
            if (list == NULL)
                child_error("internal", "out of memory");
        }
        if (lstat(path, &list[nlist].st) < 0)
            continue;
        list[nlist].path = strdup(path);
        if (list[nlist].path == NULL)
            child_error("internal", "out of memory");
        int is_dir = S_ISDIR(list[nlist].st.st_mode);
        nlist++;
        if (is_dir && level < depth)
            walk(path, level + 1, depth);
    }
    closedir(d);
}

static int by_path(const void *a, const void *b) {
    return strcmp(((const struct listed *)a)->path, ((const struct listed *)b)->path);
}

static void file_list(const char *p, size_t len) {
    const char *path = checked_path(p, len, "path");
    unsigned long long depth;
    if (parse_u64(get_field(p, len, "depth", NULL), MAX_DEPTH, &depth) < 0 || depth < 1)
        child_error("bad_request", "depth");
    struct stat st;
    if (lstat(path, &st) < 0)
        child_errno(path);
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        child_errno(path);
    }
    char dir[MAX_PATH];
    snprintf(dir, sizeof dir, "%s", path);
    for (size_t n = strlen(dir); n > 1 && dir[n - 1] == '/'; n--)
        dir[n - 1] = 0;
    walk(dir, 1, (int)depth);
    qsort(list, nlist, sizeof *list, by_path);
    for (size_t i = 0; i < nlist; i++)
        send_entry(list[i].path, &list[i].st);
    child_send(T_LIST_END, "", 0);
}

static int remove_tree(int dirfd, const char *name) {
    int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOTDIR ? unlinkat(dirfd, name, 0) : -1;
    DIR *d = fdopendir(fd);
    if (d == NULL) {
        close(fd);
        return -1;
    }
    struct dirent *e;
    int rc = 0;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if (e->d_type == DT_DIR || e->d_type == DT_UNKNOWN)
            rc = remove_tree(fd, e->d_name);
        else
            rc = unlinkat(fd, e->d_name, 0);
    }
    int saved = errno;
    closedir(d);
    errno = saved;
    return rc == 0 ? unlinkat(dirfd, name, AT_REMOVEDIR) : -1;
}

static _Noreturn void file_child(uint16_t type, const char *p, size_t len) {
    const char *path;
    struct stat st;
    switch (type) {
    case T_FILE_READ:
        file_read(p, len);
        break;
    case T_FILE_WRITE:
        file_write(p, len);
        break;
    case T_STAT:
        send_lstat_entry(checked_path(p, len, "path"));
        break;
    case T_LIST:
        file_list(p, len);
        break;
    case T_MKDIR:
        path = checked_path(p, len, "path");
        if (lstat(path, &st) == 0)
            child_error("path_exists", path);
        make_parents(path);
        if (mkdir(path, 0755) < 0)
            child_errno(path);
        send_lstat_entry(path);
        break;
    case T_REMOVE:
        path = checked_path(p, len, "path");
        if (strspn(path, "/") == strlen(path))
            child_error("invalid_path", "cannot remove /");
        if (lstat(path, &st) < 0)
            child_errno(path);
        if (S_ISDIR(st.st_mode) ? remove_tree(AT_FDCWD, path) < 0 : unlink(path) < 0)
            child_errno(path);
        send_entry(path, &st);
        break;
    case T_MOVE: {
        const char *src = checked_path(p, len, "source");
        const char *dst = checked_path(p, len, "destination");
        if (rename(src, dst) < 0) {
            int e = errno;
            const char *which_path = e == ENOENT && access(src, F_OK) == 0 ? dst : src;
            errno = e;
            child_errno(which_path);
        }
        send_lstat_entry(dst);
        break;
    }
    }
    _exit(0);
}

static void file_request(uint32_t id, uint16_t type, const char *p, size_t len) {
    if (id == 0)
        return error_to_host(id, "bad_request", "stream 0 is the connection's");
    if (find(id))
        return error_to_host(id, "bad_request", "the stream is in use");
    if (nstreams >= MAX_STREAMS)
        return error_to_host(id, "too_many", "too many streams");
    struct user u;
    const char *user = get_field(p, len, "user", NULL);
    if (user == NULL)
        return error_to_host(id, "bad_request", "no user");
    if (resolve_user(user, &u) < 0)
        return error_to_host(id, "no_such_user", user);
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
        return error_to_host(id, "too_many", strerror(errno));
    pid_t pid = fork();
    if (pid == 0) {
        child_signals();
        /* only its socket: no other stream's pipe or terminal, no port */
        fsock = dup2(sv[1], 3) == 3 ? 3 : -1;
        if (fsock < 0 || close_range(4, ~0u, 0) < 0)
            _exit(1);
        if (take_user(&u) < 0)
            child_error("permission_denied", "cannot take the user");
        file_child(type, p, len);
    }
    int saved = errno;
    close(sv[1]);
    if (pid < 0) {
        close(sv[0]);
        return error_to_host(id, "too_many", strerror(saved));
    }
    struct stream *s = new_stream(id, K_FILE);
    s->pid = pid;
    s->out[0] = sv[0];
    set_nonblock(sv[0]);
}

/* ---- frames from the host ---------------------------------------------------------- */

/* 0, or -1: a protocol error (the connection ends) */
static int ctl_frame(uint32_t id, uint16_t type, const char *p, size_t len) {
    struct stream *s = find(id);
    const char *v;
    unsigned long long n;
    switch (type) {
    case T_HELLO:
        hello(id, p, len);
        return 0;
    case T_PING:
        frame_to(&ctl, id, T_PONG, "", 0);
        return 0;
    case T_EXEC:
        exec_request(id, p, len);
        return 0;
    case T_SIGNAL:
        if (s && s->kind == K_EXEC && parse_u64(get_field(p, len, "signal", NULL), 64, &n) == 0)
            kill_session(s, (int)n);
        return 0;
    case T_RESIZE:
        if (s == NULL || s->kind != K_EXEC)
            return 0;
        if (s->pty < 0) {
            error_to_host(id, "not_a_terminal", "the command has no terminal");
            return 0;
        }
        {
            unsigned long long c, r;
            if (parse_u64(get_field(p, len, "cols", NULL), 65535, &c) < 0 ||
                parse_u64(get_field(p, len, "rows", NULL), 65535, &r) < 0) {
                error_to_host(id, "bad_request", "cols, rows");
                return 0;
            }
            struct winsize ws = {.ws_row = (unsigned short)r, .ws_col = (unsigned short)c};
            ioctl(s->pty, TIOCSWINSZ, &ws);
        }
        return 0;
    case T_RELEASE:
        if (s)
            forget(s, 1);
        return 0;
    case T_CREDIT:
        v = get_field(p, len, "bytes", NULL);
        if (parse_u64(v, 1ull << 40, &n) < 0)
            return -1;
        if (s) {
            s->out_credit += n;
            if (s->out_credit > (1ull << 41))
                return -1;
        }
        return 0;
    case T_FILE_READ: case T_FILE_WRITE: case T_STAT: case T_LIST: case T_MKDIR:
    case T_REMOVE: case T_MOVE:
        file_request(id, type, p, len);
        return 0;
    default:
        return -1;
    }
}

static int data_frame(uint32_t id, uint16_t type, const char *p, size_t len) {
    struct stream *s = find(id);
    int exec_in = type == T_STDIN || type == T_STDIN_CLOSE;
    if (!exec_in && type != T_FILE_DATA && type != T_FILE_END)
        return -1;
    if (s == NULL || (s->kind == K_EXEC) != exec_in)
        return 0; /* a stream already forgotten */
    if (type == T_STDIN || type == T_FILE_DATA) {
        if (len > s->in_window)
            return -1; /* beyond the window we granted */
        s->in_window -= len;
        if (s->in_closed)
            return 0;
        if (s->kind == K_EXEC && s->in < 0) {
            credit_to_host(id, len); /* nobody will read it: consumed */
            s->in_window += len;
            return 0;
        }
        buf_add(&s->inbuf, p, len);
    } else {
        s->in_closed = 1;
    }
    return 0;
}

static void read_port(struct port *pt, int is_ctl) {
    for (;;) {
        ssize_t n = read(pt->fd, pt->in + pt->inlen, sizeof pt->in - pt->inlen);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return;
        if (n <= 0)
            return drop_connection(n == 0 ? "end of file" : strerror(errno));
        pt->inlen += (size_t)n;
        size_t off = 0;
        while (pt->inlen - off >= HDR) {
            const char *h = pt->in + off;
            uint32_t len = get_u32(h);
            if (len > MAX_PAYLOAD)
                return drop_connection("a frame too large");
            if (pt->inlen - off < HDR + len)
                break;
            const char *p = h + HDR;
            if (is_ctl && len > 0 && p[len - 1] != 0)
                return drop_connection("a field list without its NUL");
            uint32_t id = get_u32(h + 4);
            uint16_t type = get_u16(h + 8);
            conn_used = 1;
            unsigned epoch = conn_epoch;
            int rc = is_ctl ? ctl_frame(id, type, p, len) : data_frame(id, type, p, len);
            if (rc < 0)
                return drop_connection("a frame the protocol does not allow");
            if (epoch != conn_epoch)
                return;
            off += HDR + len;
        }
        memmove(pt->in, pt->in + off, pt->inlen - off);
        pt->inlen -= off;
        if (is_ctl && ctl.out.len > CTL_PAUSE)
            return;
    }
}

static void write_port(struct port *pt) {
    while (pt->out.len > 0) {
        ssize_t n = write(pt->fd, pt->out.p + pt->out.off, pt->out.len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return;
        if (n <= 0)
            return drop_connection(strerror(errno));
        buf_eat(&pt->out, (size_t)n);
    }
}

/* ---- streams' sources -------------------------------------------------------------- */

static int ready_to_emit(void) {
    return data.out.len < QUEUE_HIGH && ctl.out.len < QUEUE_HIGH;
}

static void maybe_exit(struct stream *s) {
    if (s->kind == K_EXEC && s->exited && !s->exit_sent && s->out[0] < 0 && s->out[1] < 0) {
        struct fields f = {0};
        fieldf(&f, "status", "%d", s->status);
        fields_to(&data, s->id, T_EXIT, &f);
        s->exit_sent = 1;
    }
}

/* Reads once from an exec stream's output k (if credit allows). */
static void pump_output(struct stream *s, int k) {
    static char chunk[MAX_PAYLOAD];
    if (s->out[k] < 0 || s->out_credit == 0)
        return;
    size_t want = s->out_credit < MAX_PAYLOAD ? (size_t)s->out_credit : MAX_PAYLOAD;
    if (s->drain[k] >= 0 && (unsigned long long)s->drain[k] < want)
        want = (size_t)s->drain[k];
    ssize_t n = want ? read(s->out[k], chunk, want) : 0;
    if (n < 0 && errno == EINTR)
        return;
    if (n < 0 && errno == EAGAIN && s->drain[k] < 0)
        return;
    if (n <= 0) { /* EOF, EIO (a terminal whose other side closed), or drained */
        close_fd(&s->out[k]);
        return maybe_exit(s);
    }
    frame_to(&data, s->id, k == 0 ? T_STDOUT : T_STDERR, chunk, (size_t)n);
    s->out_credit -= (unsigned long long)n;
    if (s->drain[k] >= 0) {
        s->drain[k] -= n;
        if (s->drain[k] == 0) {
            close_fd(&s->out[k]);
            maybe_exit(s);
        }
    }
}

static void push_input(struct stream *s) {
    if (s->kind == K_EXEC) {
        while (s->in >= 0 && s->inbuf.len > 0) {
            ssize_t n = write(s->in, s->inbuf.p + s->inbuf.off, s->inbuf.len);
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0 && errno == EAGAIN)
                return;
            size_t done = n < 0 ? s->inbuf.len : (size_t)n; /* EPIPE: dropped, consumed */
            buf_eat(&s->inbuf, done);
            credit_to_host(s->id, done);
            s->in_window += done;
            if (n < 0)
                close_fd(&s->in);
        }
        if (s->in_closed && s->inbuf.len == 0 && s->in >= 0 && !s->in_close_done) {
            close_fd(&s->in);
            s->in_close_done = 1;
        }
        return;
    }
    static char pkt[HDR + MAX_PAYLOAD];
    while (s->out[0] >= 0 && (s->inbuf.len > 0 || (s->in_closed && !s->in_close_done))) {
        size_t n = s->inbuf.len < MAX_PAYLOAD ? s->inbuf.len : MAX_PAYLOAD;
        uint16_t type = n ? T_FILE_DATA : T_FILE_END;
        header(pkt, (uint32_t)n, s->id, type);
        if (n)
            memcpy(pkt + HDR, s->inbuf.p + s->inbuf.off, n);
        if (send(s->out[0], pkt, HDR + n, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
            if (errno == EAGAIN || errno == EINTR)
                return;
            buf_free(&s->inbuf); /* the child ended: its reply or EOF tells the host */
            s->in_close_done = 1;
            return;
        }
        if (n) {
            buf_eat(&s->inbuf, n);
            credit_to_host(s->id, n);
            s->in_window += n;
        } else {
            s->in_close_done = 1;
        }
    }
}

static void flush_held(struct stream *s) {
    size_t n = s->held.len;
    if (n > s->out_credit)
        n = (size_t)s->out_credit;
    if (n == 0)
        return;
    frame_to(&data, s->id, T_FILE_DATA, s->held.p + s->held.off, n);
    buf_eat(&s->held, n);
    s->out_credit -= n;
}

/* Reads one packet from a file child. Returns 1 when the stream was forgotten. */
static int pump_file(struct stream *s) {
    static char pkt[HDR + MAX_PAYLOAD + 1];
    ssize_t n = recv(s->out[0], pkt, sizeof pkt, MSG_DONTWAIT);
    if (n < 0 && errno == ECONNRESET) /* the child ended with our bytes unread: the */
        n = recv(s->out[0], pkt, sizeof pkt, MSG_DONTWAIT); /* error comes before its packets */
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return 0;
    if (n <= 0) {
        /* the child is gone; if it never answered, the host must not wait for ever (when
         * it did, the host is done with the stream and drops this) */
        if (!s->answered)
            error_to_host(s->id, "internal", "the file call ended without an answer");
        forget(s, 0);
        return 1;
    }
    uint32_t len = get_u32(pkt);
    uint16_t type = get_u16(pkt + 8);
    if (n < HDR || len != (size_t)n - HDR) {
        error_to_host(s->id, "internal", "a file child's packet is malformed");
        forget(s, 1);
        return 1;
    }
    if (type == T_FILE_DATA) {
        buf_add(&s->held, pkt + HDR, len);
        flush_held(s);
    } else if (type == T_FILE_END) {
        s->answered = 1;
        frame_to(&data, s->id, type, pkt + HDR, len);
    } else {
        if (type == T_ERROR || type == T_LIST_END)
            s->answered = 1; /* its last word (an ENTRY may be one of a listing's) */
        if (type == T_CREDIT) {
            unsigned long long c;
            if (parse_u64(get_field(pkt + HDR, len, "bytes", NULL), WINDOW, &c) == 0)
                s->in_window += c;
        }
        frame_to(&ctl, s->id, type, pkt + HDR, len);
    }
    return 0;
}

static void child_exited(pid_t pid, int status) {
    for (int i = 0; i < nstreams; i++) {
        struct stream *s = streams[i];
        if (s->pid != pid || s->exited)
            continue;
        s->exited = 1;
        s->status = status;
        if (s->kind != K_EXEC)
            return;
        for (int k = 0; k < 2; k++) {
            if (s->out[k] < 0)
                continue;
            int avail = 0;
            if (s->pty >= 0)
                s->drain[k] = PTY_DRAIN; /* until EAGAIN: a read flushes the terminal */
            else
                s->drain[k] = ioctl(s->out[k], FIONREAD, &avail) == 0 && avail > 0 ? avail : 0;
        }
        close_fd(&s->in);
        buf_free(&s->inbuf);
        for (int k = 0; k < 2; k++)
            if (s->drain[k] == 0)
                close_fd(&s->out[k]);
        maybe_exit(s);
        return;
    }
}

/* ---- main ------------------------------------------------------------------------- */

static void usage(void) {
    fprintf(stderr, "usage: corral-vmagent (--ctl PATH --data PATH | --ctl-fd N --data-fd M)"
                    " [--no-system]\n");
    exit(2);
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--no-system")) {
            no_system = 1;
            continue;
        }
        if (v == NULL)
            usage();
        i++;
        if (!strcmp(a, "--ctl"))
            ctl.path = v;
        else if (!strcmp(a, "--data"))
            data.path = v;
        else if (!strcmp(a, "--ctl-fd"))
            ctl.fd = atoi(v), fd_mode = 1;
        else if (!strcmp(a, "--data-fd"))
            data.fd = atoi(v), fd_mode = 1;
        else
            usage();
    }
    if (fd_mode ? ctl.fd < 0 || data.fd < 0 || ctl.path || data.path : !ctl.path || !data.path)
        usage();

    for (int s = 1; s < NSIG; s++)
        if (s != SIGKILL && s != SIGSTOP && s != SIGCHLD)
            signal(s, SIG_IGN);
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, NULL);
    int sfd = signalfd(-1, &chld, SFD_NONBLOCK | SFD_CLOEXEC);
    if (sfd < 0) {
        perror("corral-vmagent: signalfd");
        return 1;
    }
    if (getpid() != 1)
        prctl(PR_SET_CHILD_SUBREAPER, 1);
    make_commands_cgroup();
    if (fd_mode) {
        fcntl(ctl.fd, F_SETFD, FD_CLOEXEC);
        fcntl(data.fd, F_SETFD, FD_CLOEXEC);
        set_nonblock(ctl.fd);
        set_nonblock(data.fd);
    } else {
        open_ports();
    }

    static struct pollfd pfd[3 + 3 * MAX_STREAMS];
    static struct stream *owner[3 + 3 * MAX_STREAMS];
    static int which[3 + 3 * MAX_STREAMS];
    for (;;) {
        int n = 0;
        pfd[n++] = (struct pollfd){sfd, POLLIN, 0};
        pfd[n++] = (struct pollfd){ctl.fd, (short)((ctl.out.len < CTL_PAUSE ? POLLIN : 0) |
                                                   (ctl.out.len ? POLLOUT : 0)), 0};
        pfd[n++] = (struct pollfd){data.fd, (short)(POLLIN | (data.out.len ? POLLOUT : 0)), 0};
        int emit = ready_to_emit();
        for (int i = 0; i < nstreams; i++) {
            struct stream *s = streams[i];
            for (int k = 0; k < 2; k++) {
                short ev = 0;
                if (s->out[k] < 0)
                    continue;
                if (s->kind == K_EXEC) {
                    ev = emit && s->out_credit > 0 ? POLLIN : 0;
                } else {
                    ev = emit && s->held.len == 0 ? POLLIN : 0;
                    if (s->inbuf.len > 0 || (s->in_closed && !s->in_close_done))
                        ev |= POLLOUT;
                }
                owner[n] = s, which[n] = k;
                /* nothing wanted: not polled at all (a hangup would wake poll for ever) */
                pfd[n++] = (struct pollfd){ev ? s->out[k] : -1, ev, 0};
            }
            if (s->kind == K_EXEC && s->in >= 0 &&
                (s->inbuf.len > 0 || (s->in_closed && !s->in_close_done))) {
                owner[n] = s, which[n] = 2;
                pfd[n++] = (struct pollfd){s->in, POLLOUT, 0};
            }
        }
        if (poll(pfd, (nfds_t)n, -1) < 0) {
            if (errno != EINTR)
                usleep(10000);
            continue;
        }
        if (pfd[0].revents) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof si) > 0) {
            }
            int status;
            pid_t pid;
            while ((pid = waitpid(-1, &status, WNOHANG)) > 0)
                child_exited(pid, status);
        }
        unsigned conn0 = conn_epoch, table0 = table_epoch;
        if (pfd[1].revents & POLLOUT)
            write_port(&ctl);
        if (conn0 == conn_epoch && pfd[2].revents & POLLOUT)
            write_port(&data);
        if (conn0 == conn_epoch && pfd[1].revents & (POLLIN | POLLHUP | POLLERR))
            read_port(&ctl, 1);
        if (conn0 == conn_epoch && pfd[2].revents & (POLLIN | POLLHUP | POLLERR))
            read_port(&data, 0);
        if (conn0 != conn_epoch)
            continue; /* the connection was reset: nothing polled is current */
        for (int i = 3; i < n && table0 == table_epoch; i++) {
            struct stream *s = owner[i];
            short re = pfd[i].revents;
            if (!re)
                continue;
            if (s->kind == K_FILE) {
                if (re & POLLOUT)
                    push_input(s);
                if ((re & (POLLIN | POLLHUP | POLLERR)) && s->held.len == 0)
                    pump_file(s); /* may forget it: the loop ends then */
            } else if (which[i] == 2) {
                push_input(s);
            } else if (re & (POLLIN | POLLHUP | POLLERR)) {
                pump_output(s, which[i]);
            }
        }
        /* after an exit: drain what is readable, whether or not poll says so */
        for (int i = 0; i < nstreams; i++) {
            struct stream *s = streams[i];
            if (s->kind == K_FILE && s->held.len)
                flush_held(s);
            if (s->kind == K_EXEC && s->exited)
                for (int k = 0; k < 2; k++)
                    while (s->out[k] >= 0 && s->out_credit > 0 && ready_to_emit())
                        pump_output(s, k);
            if (s->kind == K_EXEC && s->in >= 0 && s->inbuf.len == 0 && s->in_closed &&
                !s->in_close_done)
                push_input(s);
        }
        if (ctl.out.len)
            write_port(&ctl);
        if (conn0 == conn_epoch && data.out.len)
            write_port(&data);
    }
}
