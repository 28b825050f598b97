/* corral-init: PID 1 of every container sandbox, the node's command spawner inside it,
 * and the wrapper of each command the runtime's own exec runs.
 *
 *   corral-init            PID 1: ignores every signal it can (so nothing inside the
 *                          sandbox can stop it: the kernel drops SIGKILL and SIGSTOP sent
 *                          to a namespace's init from inside), is not dumpable (so root
 *                          inside cannot write its memory or read its descriptors through
 *                          /proc/1), reaps every orphan, never exits on its own. When the node handed it a listening Unix
 *                          socket as fd 3 (`crun run --preserve-fds 1`), it also starts
 *                          the node's commands: see "spawning" below.
 *   corral-init exec CMD   a command run by `crun exec`: starts a session of its own (so
 *                          that the whole tree of the command can be signalled by session),
 *                          then execs CMD.
 *   corral-init fdexec N CMD
 *                          on the host: moves descriptor N to 3 and execs CMD (the node
 *                          starts `crun run --preserve-fds 1` so, without running Python
 *                          code between fork and exec).
 *
 * Spawning. The socket is the node's (bound at a host path outside the sandbox's root, so
 * no process inside can connect to it; fd 3 is close-on-exec, so no command inherits it).
 * One connection per command. The node sends one message: a little-endian u32 length,
 * then NUL-terminated fields "uid", "gid", "cwd", "argc", argv[argc], then "KEY=VALUE"
 * environment entries to the end, with the command's stdin, stdout and stderr as three
 * SCM_RIGHTS descriptors. corral-init forks; the child starts a session, takes the user
 * (groups, gid, uid: a non-root uid keeps no capability), its stdio and its cwd, sends
 * 'P' with SCM_CREDENTIALS (the kernel shows the node the child's pid as the host sees
 * it) and execs the command with exactly that environment (PATH searched as given). When
 * the child ends, corral-init sends 'X' and the 4-byte wait status, and closes the
 * connection. A command that cannot start says why on its stderr and exits 126 (127: not
 * found). corral-init never blocks on a command: it only waits for the node's request,
 * bounded by a receive timeout. A request whose first field is "file" is a file
 * operation instead, done by a child that never execs ("file operations" below). One
 * whose first fields are "pty", COLS, ROWS, with no descriptor, is a command on a
 * terminal the child allocates inside the sandbox (pty_child): its master comes back
 * with 'P' (SCM_RIGHTS beside the credentials).
 *
 * Static, so it runs in any image.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <limits.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#define LISTEN_FD 3
#define MAX_REQUEST (4u << 20)
#define MAX_FIELDS 65536
#define MAX_COMMANDS 4096
#define PTY_REQUEST "pty"

extern char **environ;

struct command {
    pid_t pid;
    int conn;
};

static struct command commands[MAX_COMMANDS];
static int ncommands;

static _Noreturn void reap_forever(void) {
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, NULL); /* SIGCHLD too: collected with sigwaitinfo */
    for (;;) {
        siginfo_t info;
        if (sigwaitinfo(&all, &info) < 0 && errno != EINTR)
            continue;
        while (waitpid(-1, NULL, WNOHANG) > 0) {
        }
    }
}

static int is_listening(int fd) {
    int on = 0;
    socklen_t len = sizeof on;
    return getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &on, &len) == 0 && on;
}

/* The request on `conn`: its bytes (malloc'd, NUL-terminated fields) and the descriptors
 * that came with them (at most 3; their number in *nfds). */
static char *receive(int conn, int fds[3], int *nfds, uint32_t *size) {
    uint32_t length = 0;
    char control[CMSG_SPACE(3 * sizeof(int))];
    struct iovec iov = {&length, sizeof length};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1,
                         .msg_control = control, .msg_controllen = sizeof control};
    *nfds = 0;
    ssize_t got_head = recvmsg(conn, &msg, MSG_WAITALL | MSG_CMSG_CLOEXEC);
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm != NULL; cm = CMSG_NXTHDR(&msg, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
            continue;
        int n = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        for (int i = 0; i < n; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
            if (*nfds < 3)
                fds[(*nfds)++] = fd;
            else
                close(fd);
        }
    }
    char *data = NULL;
    if (got_head == sizeof length && !(msg.msg_flags & MSG_CTRUNC) && length > 0 &&
        length <= MAX_REQUEST)
        data = malloc(length + 1);
    uint32_t got = 0;
    while (data != NULL && got < length) {
        ssize_t n = recv(conn, data + got, length - got, 0);
        if (n <= 0) {
            free(data);
            data = NULL;
            break;
        }
        got += (uint32_t)n;
    }
    if (data == NULL) {
        for (int i = 0; i < *nfds; i++)
            close(fds[i]);
        *nfds = 0;
        return NULL;
    }
    data[length] = '\0';
    *size = length;
    return data;
}

/* Split `data` into its NUL-terminated fields; their number, or -1. */
static int fields(char *data, uint32_t size, char **out, int most) {
    int n = 0;
    for (uint32_t at = 0; at < size;) {
        if (n == most)
            return -1;
        out[n++] = data + at;
        at += (uint32_t)strlen(data + at) + 1;
    }
    return n;
}

static int number(const char *text, unsigned long long most, unsigned long long *out);

static _Noreturn void fail(const char *what, const char *detail, int code) {
    dprintf(2, "corral-init: %s %s: %s\n", what, detail, strerror(errno));
    _exit(code);
}

/* The command of a request (fields from "uid" on), its stdio and session in place: take
 * the user, send 'P' (with `master`, a terminal's, if not -1), exec. */
static _Noreturn void run_command(int conn, char **f, int nf, int master) {
    uid_t uid = (uid_t)strtoul(f[0], NULL, 10);
    gid_t gid = (gid_t)strtoul(f[1], NULL, 10);
    if (setgroups(1, &gid) < 0 || setgid(gid) < 0 || setuid(uid) < 0)
        fail("cannot become", f[0], 126);
    struct ucred cred = {getpid(), getuid(), getgid()};
    char control[CMSG_SPACE(sizeof cred) + CMSG_SPACE(sizeof master)];
    memset(control, 0, sizeof control);
    char tag = 'P';
    struct iovec iov = {&tag, 1};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                         .msg_controllen = CMSG_SPACE(sizeof cred)};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_CREDENTIALS;
    cm->cmsg_len = CMSG_LEN(sizeof cred);
    memcpy(CMSG_DATA(cm), &cred, sizeof cred);
    if (master >= 0) {
        msg.msg_controllen = sizeof control;
        cm = CMSG_NXTHDR(&msg, cm);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof master);
        memcpy(CMSG_DATA(cm), &master, sizeof master);
    }
    sendmsg(conn, &msg, MSG_NOSIGNAL);
    if (master >= 0)
        close(master);
    if (chdir(f[2]) < 0)
        fail("cannot enter", f[2], 126);
    int argc = atoi(f[3]);
    if (argc < 1 || 4 + argc > nf)
        _exit(126);
    char **args = calloc((size_t)argc + 1, sizeof(char *));
    char **env = calloc((size_t)(nf - 4 - argc) + 1, sizeof(char *));
    if (args == NULL || env == NULL)
        _exit(126);
    memcpy(args, &f[4], (size_t)argc * sizeof(char *));
    memcpy(env, &f[4 + argc], (size_t)(nf - 4 - argc) * sizeof(char *));
    environ = env; /* execvp searches the command's own PATH */
    execvp(args[0], args);
    fail("cannot run", args[0], errno == ENOENT ? 127 : 126);
}

static void unblock_signals(void) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
}

/* A command with the node's pipes as its stdio. */
static _Noreturn void child(int conn, int fds[3], char **f, int nf) {
    unblock_signals();
    for (int i = 0; i < 3; i++) {
        if (dup2(fds[i], i) < 0)
            _exit(126);
    }
    for (int i = 0; i < 3; i++) {
        if (fds[i] > 2)
            close(fds[i]);
    }
    setsid();
    run_command(conn, f, nf, -1);
}

/* A command on a terminal of its own (a request "pty", COLS, ROWS, then a command's
 * fields, with no descriptor). The terminal is the sandbox's: a pair of its own devpts
 * instance (/dev/ptmx, the slave opened through the master, never by a path), the
 * slave given to the user, sized, made the new session's controlling terminal and the
 * command's stdin, stdout and stderr. The master goes to the node with 'P' (the node
 * checks it is one before it uses it); nothing else of the sandbox reaches the node. */
static _Noreturn void pty_child(int conn, char **f, int nf) {
    unblock_signals();
    unsigned long long cols, rows;
    if (nf < 8 || number(f[1], 0xffff, &cols) < 0 || number(f[2], 0xffff, &rows) < 0)
        _exit(126);
    f += 3;
    nf -= 3;
    setsid();
    int master = open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC);
    int unlock = 0, slave = -1;
    if (master >= 0 && ioctl(master, TIOCSPTLCK, &unlock) == 0)
        slave = ioctl(master, TIOCGPTPEER, O_RDWR | O_NOCTTY);
    if (slave < 0)
        _exit(126);
    struct winsize size = {.ws_row = (unsigned short)rows, .ws_col = (unsigned short)cols};
    uid_t uid = (uid_t)strtoul(f[0], NULL, 10);
    gid_t gid = (gid_t)strtoul(f[1], NULL, 10);
    if (fchown(slave, uid, gid) < 0 || ioctl(slave, TIOCSWINSZ, &size) < 0 ||
        ioctl(slave, TIOCSCTTY, 0) < 0)
        _exit(126);
    for (int i = 0; i < 3; i++) {
        if (dup2(slave, i) < 0)
            _exit(126);
    }
    if (slave > 2)
        close(slave);
    run_command(conn, f, nf, master);
}

/* --- file operations ------------------------------------------------------------------
 * A request whose first field is "file" asks for one file operation, done by a child of
 * corral-init that never execs: it keeps only the connection (as fd 3) and the request's
 * descriptor (fd 4, if any), becomes non-dumpable, takes the user (groups, gid, uid)
 * before it touches any file, and so sees the sandbox's files exactly as that user does,
 * inside the sandbox's mount namespace and root, charged to its cgroups (and the OOM
 * killer's first choice there: an upload that fills the sandbox's memory ends itself, not
 * the sandbox). Fields: "file",
 * OP, UID, GID, then OP's:
 *
 *   read PATH MAX        fd: a pipe's write end. 'O' u64 size, the bytes on the pipe,
 *                        then 'D' u64 bytes sent (refused past MAX: EFBIG)
 *   write PATH MODE      fd: a pipe's read end. 'O' once the file is open (created with
 *                        MODE, else truncated: it keeps its owner); the bytes until the
 *                        pipe's end; then the node's 'C' u64 total on the connection
 *                        (anything else: the upload was abandoned); 'S' of the file
 *   stat PATH            'S' (not following a last symlink)
 *   list PATH DEPTH LIMIT CURSOR
 *                        'S' per entry, pre-order, by name at each level (bytes), at most
 *                        LIMIT of those after CURSOR (a path relative to PATH, "" for
 *                        the first page), down to DEPTH levels; then 'D' u8 more
 *   mkdir PATH           parents as needed; EEXIST if PATH was there; 'S'
 *   remove PATH          the file, or the whole tree; 'D'
 *   move FROM TO         TO's parents as needed, then rename; 'S' of TO
 *   opendir PATH         'F' with the directory open for reading (SCM_RIGHTS)
 *
 * Each answer is a record: a tag byte, a u32 length, that many bytes. 'E' carries the
 * errno (i32) that ended the operation (NOT_REGULAR: the path is no regular file; it
 * was never opened); 'E' with no bytes is corral-init's refusal (no child forked). 'S'
 * is an entry: type u8 (0 other, 1 file, 2 dir, 3 symlink), st_mode u32, uid u32, gid
 * u32, size i64, mtime i64 s + u32 ns, path length u16, target length u16, then the path
 * (relative to the operation's PATH, "" for PATH itself) and a symlink's target. A file
 * is opened only once O_PATH and fstat showed a regular file (reopened through
 * /proc/self/fd, then checked to be the same one), so no device, FIFO or socket is ever
 * opened. Nothing is chowned: a file the operation creates is the user's by
 * construction, any other keeps its owner.
 */
#define FILE_REQUEST "file"
#define NOT_REGULAR 1000
#define LIST_DEPTH 16
#define LIST_LIMIT 1000
#define REMOVE_DEPTH 1024
#define COPY_CHUNK (1 << 16)
#define CONN_FD 3
#define DATA_FD 4

struct __attribute__((packed)) entry_head {
    uint8_t type;
    uint32_t mode, uid, gid;
    int64_t size, mtime_s;
    uint32_t mtime_ns;
    uint16_t path_len, target_len;
};

static void send_all(const void *data, size_t size) {
    const char *at = data;
    while (size > 0) {
        ssize_t n = send(CONN_FD, at, size, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            _exit(1); /* the node went away */
        at += n;
        size -= (size_t)n;
    }
}

static void answer(char tag, const void *payload, uint32_t size) {
    char head[5] = {tag};
    memcpy(head + 1, &size, sizeof size);
    send_all(head, sizeof head);
    send_all(payload, size);
}

static _Noreturn void failed(int err) {
    int32_t code = err;
    answer('E', &code, sizeof code);
    _exit(0);
}

/* An 'S' record of `st` (named `name` in `dirfd`, for a symlink's target). */
static void send_entry(const char *rel, const struct stat *st, int dirfd, const char *name) {
    static char record[sizeof(struct entry_head) + 2 * PATH_MAX];
    struct entry_head head = {0};
    mode_t kind = st->st_mode & S_IFMT;
    head.type = kind == S_IFREG ? 1 : kind == S_IFDIR ? 2 : kind == S_IFLNK ? 3 : 0;
    head.mode = st->st_mode;
    head.uid = st->st_uid;
    head.gid = st->st_gid;
    head.size = st->st_size;
    head.mtime_s = st->st_mtim.tv_sec;
    head.mtime_ns = (uint32_t)st->st_mtim.tv_nsec;
    size_t path_len = strlen(rel);
    if (path_len >= PATH_MAX)
        return;
    head.path_len = (uint16_t)path_len;
    char *at = record + sizeof head;
    memcpy(at, rel, path_len);
    if (head.type == 3) {
        ssize_t n = readlinkat(dirfd, name, at + path_len, PATH_MAX - 1);
        head.target_len = n > 0 ? (uint16_t)n : 0;
    }
    memcpy(record, &head, sizeof head);
    answer('S', record, (uint32_t)(sizeof head + path_len + head.target_len));
}

static void send_path_entry(const char *path) {
    struct stat st;
    if (fstatat(AT_FDCWD, path, &st, AT_SYMLINK_NOFOLLOW) < 0)
        failed(errno);
    send_entry("", &st, AT_FDCWD, path);
}

/* `path` opened with `flags` if it is a regular file (-errno, or -NOT_REGULAR, if not):
 * looked at through O_PATH first, so nothing else is ever opened. */
static int open_regular(const char *path, int flags, struct stat *st) {
    int where = open(path, O_PATH | O_CLOEXEC);
    if (where < 0)
        return -errno;
    if (fstat(where, st) < 0) {
        int err = errno;
        close(where);
        return -err;
    }
    if (!S_ISREG(st->st_mode)) {
        close(where);
        return S_ISDIR(st->st_mode) ? -EISDIR : -NOT_REGULAR;
    }
    char again[64];
    snprintf(again, sizeof again, "/proc/self/fd/%d", where);
    int fd = open(again, flags | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    int err = errno;
    close(where);
    if (fd < 0)
        return -err;
    struct stat now;
    if (fstat(fd, &now) < 0 || now.st_dev != st->st_dev || now.st_ino != st->st_ino) {
        close(fd);
        return -NOT_REGULAR;
    }
    *st = now;
    return fd;
}

/* mkdir -p `path` (0755); -EEXIST if `fresh` and its last part was there already. */
static int make_dirs(const char *path, int fresh) {
    char buf[PATH_MAX];
    size_t len = strlen(path);
    if (len >= sizeof buf)
        return -ENAMETOOLONG;
    memcpy(buf, path, len + 1);
    int made = 0;
    for (size_t i = 1; i <= len; i++) {
        if (buf[i] != '/' && buf[i] != '\0')
            continue;
        char end = buf[i];
        buf[i] = '\0';
        made = mkdir(buf, 0755) == 0;
        if (!made) {
            struct stat st;
            if (errno != EEXIST)
                return -errno;
            if (stat(buf, &st) < 0)
                return -errno;
            if (!S_ISDIR(st.st_mode))
                return -ENOTDIR;
        }
        buf[i] = end;
    }
    return fresh && !made ? -EEXIST : 0;
}

static int make_parents(const char *path) {
    char parent[PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (slash == NULL || slash == path)
        return 0;
    size_t len = (size_t)(slash - path);
    if (len >= sizeof parent)
        return -ENAMETOOLONG;
    memcpy(parent, path, len);
    parent[len] = '\0';
    return make_dirs(parent, 0);
}

/* Copy `from` to `to` until `from` ends (or `most` bytes are past): the bytes copied,
 * or -errno. */
/* The sandbox's memory (its disk is a tmpfs counted in it) an upload leaves to everything
 * else: past this, the upload stops with ENOSPC, so the sandbox's init (which must fork
 * for the next call) is never left the only process the OOM killer can take. */
#define MEMORY_HEADROOM (16u << 20)
#define ROOM_EVERY (1u << 20)

static long long cgroup_value(const char *name) {
    char path[128], text[32];
    snprintf(path, sizeof path, "/sys/fs/cgroup/memory/%s", name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, text, sizeof text - 1);
    close(fd);
    if (n <= 0)
        return -1;
    text[n] = '\0';
    return strtoll(text, NULL, 10);
}

/* Whether the sandbox's memory cgroup (its namespace's root) has room for more upload. */
static int memory_has_room(void) {
    long long limit = cgroup_value("memory.limit_in_bytes");
    long long usage = cgroup_value("memory.usage_in_bytes");
    return limit < 0 || usage < 0 || usage + (long long)MEMORY_HEADROOM < limit;
}

/* Up to EOF (or past ``most``) from ``from`` to ``to``; with ``guarded``, stops with
 * -ENOSPC when the sandbox's memory runs short (an upload into its tmpfs). */
static int64_t copy(int from, int to, uint64_t most, int guarded) {
    static char buf[COPY_CHUNK];
    uint64_t done = 0, checked = 0;
    int spliced = 1;
    while (done <= most) {
        ssize_t n;
        if (guarded && done >= checked) {
            if (!memory_has_room())
                return -ENOSPC;
            checked = done + ROOM_EVERY;
        }
        if (spliced) {
            n = splice(from, NULL, to, NULL, COPY_CHUNK, SPLICE_F_MOVE);
            if (n < 0 && errno == EINVAL) {
                spliced = 0;
                continue;
            }
        } else {
            n = read(from, buf, sizeof buf);
            for (ssize_t off = 0; n > 0 && off < n;) {
                ssize_t w = write(to, buf + off, (size_t)(n - off));
                if (w < 0 && errno != EINTR)
                    return -errno;
                off += w > 0 ? w : 0;
            }
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        if (n == 0)
            break;
        done += (uint64_t)n;
    }
    return (int64_t)done;
}

static _Noreturn void file_read(const char *path, uint64_t most, int out) {
    struct stat st;
    int fd = open_regular(path, O_RDONLY, &st);
    if (fd < 0)
        failed(-fd);
    if ((uint64_t)st.st_size > most)
        failed(EFBIG);
    uint64_t size = (uint64_t)st.st_size;
    answer('O', &size, sizeof size);
    int64_t sent = copy(fd, out, most, 0);
    close(out); /* the node sees the end of the bytes */
    if (sent < 0)
        failed((int)-sent);
    answer('D', &sent, sizeof sent);
    _exit(0);
}

/* `requested` open for writing: created (with `mode`; its parents made first if they are
 * missing) or, if it is a regular file, truncated; a symlink with no target is followed
 * as the kernel would, to create its target. */
static int open_for_writing(const char *requested, mode_t mode) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s", requested);
    int parents_made = 0;
    for (int hops = 0; hops <= 40; hops++) {
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOCTTY, mode);
        if (fd >= 0)
            return fd;
        if (errno == ENOENT && !parents_made) {
            parents_made = 1;
            int made = make_parents(path);
            if (made < 0)
                return made;
            continue;
        }
        if (errno != EEXIST)
            return -errno;
        struct stat st;
        fd = open_regular(path, O_WRONLY | O_TRUNC, &st);
        if (fd != -ENOENT)
            return fd;
        char target[PATH_MAX];
        ssize_t n = readlink(path, target, sizeof target - 1);
        if (n < 0)
            continue; /* replaced meanwhile: again */
        target[n] = '\0';
        parents_made = 1; /* a symlink's target is created where it points, or not at all */
        if (target[0] == '/') {
            memcpy(path, target, (size_t)n + 1);
            continue;
        }
        char *slash = strrchr(path, '/');
        size_t dir = slash == NULL ? 0 : (size_t)(slash - path);
        if (dir + 1 + (size_t)n >= sizeof path)
            return -ENAMETOOLONG;
        path[dir] = '/';
        memcpy(path + dir + 1, target, (size_t)n + 1);
    }
    return -ELOOP;
}

static _Noreturn void file_write(const char *path, mode_t mode, int in) {
    struct stat st;
    int fd = open_for_writing(path, mode);
    if (fd < 0)
        failed(-fd);
    answer('O', NULL, 0);
    int64_t got = copy(in, fd, UINT64_MAX - 1, 1);
    if (got < 0)
        failed((int)-got);
    char commit[9];
    struct timeval wait = {30, 0};
    setsockopt(CONN_FD, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
    uint64_t total;
    if (recv(CONN_FD, commit, sizeof commit, MSG_WAITALL) != sizeof commit || commit[0] != 'C')
        _exit(1); /* abandoned: the node answers its caller */
    memcpy(&total, commit + 1, sizeof total);
    if (total != (uint64_t)got)
        _exit(1);
    if (fstat(fd, &st) < 0)
        failed(errno);
    send_entry("", &st, fd, "");
    _exit(0);
}

struct walk {
    long limit, sent;
    int more;
    char path[PATH_MAX];
};

static int by_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void heap_down(char **heap, int n, int i) {
    for (;;) {
        int top = i, l = 2 * i + 1, r = l + 1;
        if (l < n && strcmp(heap[l], heap[top]) > 0)
            top = l;
        if (r < n && strcmp(heap[r], heap[top]) > 0)
            top = r;
        if (top == i)
            return;
        char *t = heap[i];
        heap[i] = heap[top];
        heap[top] = t;
        i = top;
    }
}

/* The `most` smallest names in the directory `fd` from `from` on (NULL: all), sorted
 * (a max-heap of them while reading: memory for `most` names, whatever the directory's
 * size); their number, or -errno. */
static int smallest_names(int fd, const char *from, int most, char ***out) {
    int copy_fd = dup(fd);
    DIR *dir = copy_fd < 0 ? NULL : fdopendir(copy_fd);
    char **heap = calloc((size_t)most + 1, sizeof(char *));
    if (dir == NULL || heap == NULL) {
        int err = errno;
        if (dir != NULL)
            closedir(dir);
        else if (copy_fd >= 0)
            close(copy_fd);
        free(heap);
        return -err;
    }
    int n = 0, err = 0;
    struct dirent *e;
    for (errno = 0; (e = readdir(dir)) != NULL; errno = 0) {
        const char *name = e->d_name;
        if (name[0] == '.' && (name[1] == '\0' || (name[1] == '.' && name[2] == '\0')))
            continue;
        if (from != NULL && strcmp(name, from) < 0)
            continue;
        if (n == most && (n == 0 || strcmp(name, heap[0]) >= 0))
            continue;
        char *kept = strdup(name);
        if (kept == NULL) {
            err = ENOMEM;
            break;
        }
        if (n == most) {
            free(heap[0]);
            heap[0] = kept;
            heap_down(heap, n, 0);
            continue;
        }
        int i = n++;
        heap[i] = kept;
        while (i > 0 && strcmp(heap[(i - 1) / 2], heap[i]) < 0) {
            char *t = heap[i];
            heap[i] = heap[(i - 1) / 2];
            heap[(i - 1) / 2] = t;
            i = (i - 1) / 2;
        }
    }
    if (err == 0 && errno != 0)
        err = errno;
    closedir(dir);
    if (err != 0) {
        for (int i = 0; i < n; i++)
            free(heap[i]);
        free(heap);
        return -err;
    }
    qsort(heap, (size_t)n, sizeof *heap, by_name);
    *out = heap;
    return n;
}

/* The entries below the directory `fd` (w->path[0:len] relative to the listed one), in
 * pre-order, by name; `cursor` the parts of the last path already sent (ncursor of them):
 * what is not after it is passed over. -1 once the page is full. */
static int walk(struct walk *w, int fd, size_t len, int depth, char **cursor, int ncursor) {
    const char *from = ncursor > 0 ? cursor[0] : NULL;
    char **names = NULL;
    int n = smallest_names(fd, from, (int)(w->limit - w->sent) + 2, &names);
    if (n < 0)
        return 0; /* unreadable below the listed directory: its entry says what it is */
    int stop = 0;
    for (int i = 0; i < n && !stop; i++) {
        const char *name = names[i];
        size_t name_len = strlen(name), at = len + (len > 0);
        int on_cursor = from != NULL && strcmp(name, from) == 0;
        struct stat st;
        if (at + name_len >= PATH_MAX || fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
            continue;
        if (len > 0)
            w->path[len] = '/';
        memcpy(w->path + at, name, name_len + 1);
        if (!on_cursor) {
            if (w->sent == w->limit) {
                w->more = 1;
                stop = 1;
                break;
            }
            send_entry(w->path, &st, fd, name);
            w->sent++;
        }
        if (S_ISDIR(st.st_mode) && depth > 1) {
            int sub = openat(fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub >= 0) {
                stop = walk(w, sub, at + name_len, depth - 1, on_cursor ? cursor + 1 : NULL,
                            on_cursor ? ncursor - 1 : 0) < 0;
                close(sub);
            }
        }
        w->path[len] = '\0';
    }
    for (int i = 0; i < n; i++)
        free(names[i]);
    free(names);
    return stop ? -1 : 0;
}

static _Noreturn void file_list(const char *path, long depth, long limit, char *cursor) {
    static struct walk w;
    char *parts[LIST_DEPTH];
    int nparts = 0;
    for (char *part = cursor; *cursor != '\0' && part != NULL && nparts < LIST_DEPTH;) {
        char *slash = strchr(part, '/');
        if (slash != NULL)
            *slash = '\0';
        parts[nparts++] = part;
        part = slash != NULL ? slash + 1 : NULL;
    }
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        failed(errno);
    w.limit = limit;
    walk(&w, fd, 0, (int)depth, parts, nparts);
    uint8_t more = (uint8_t)w.more;
    answer('D', &more, sizeof more);
    _exit(0);
}

/* rm -rf `name` in `dirfd` (never following a symlink); 0 or -errno. */
static int remove_tree(int dirfd, const char *name, int depth) {
    if (unlinkat(dirfd, name, 0) == 0)
        return 0;
    if (errno != EISDIR && errno != EPERM)
        return -errno;
    int unlink_err = errno;
    if (depth > REMOVE_DEPTH)
        return -ELOOP;
    for (int attempt = 0; attempt < 4; attempt++) {
        int sub = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sub < 0)
            return errno == ENOTDIR || errno == ELOOP ? -unlink_err : -errno;
        DIR *dir = fdopendir(sub);
        if (dir == NULL) {
            close(sub);
            return -errno;
        }
        struct dirent *e;
        int err = 0;
        while (err == 0 && (e = readdir(dir)) != NULL) {
            const char *n = e->d_name;
            if (n[0] == '.' && (n[1] == '\0' || (n[1] == '.' && n[2] == '\0')))
                continue;
            err = remove_tree(sub, n, depth + 1);
        }
        closedir(dir);
        if (err < 0 && err != -ENOENT)
            return err;
        if (unlinkat(dirfd, name, AT_REMOVEDIR) == 0 || errno == ENOENT)
            return 0;
        if (errno != ENOTEMPTY)
            return -errno;
    }
    return -ENOTEMPTY; /* refilled while being emptied */
}

static _Noreturn void file_remove(const char *path) {
    char parent[PATH_MAX];
    const char *slash = strrchr(path, '/');
    size_t len = slash == NULL ? 0 : (size_t)(slash - path);
    if (slash == NULL || slash[1] == '\0' || len >= sizeof parent)
        failed(EINVAL);
    memcpy(parent, path, len);
    parent[len] = '\0';
    int dirfd = open(len > 0 ? parent : "/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dirfd < 0)
        failed(errno);
    int err = remove_tree(dirfd, slash + 1, 0);
    if (err < 0)
        failed(-err);
    answer('D', NULL, 0);
    _exit(0);
}

static _Noreturn void file_opendir(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        failed(errno);
    char head[5] = {'F'};
    char control[CMSG_SPACE(sizeof fd)];
    memset(control, 0, sizeof control);
    struct iovec iov = {head, sizeof head};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1,
                         .msg_control = control, .msg_controllen = sizeof control};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof fd);
    memcpy(CMSG_DATA(cm), &fd, sizeof fd);
    if (sendmsg(CONN_FD, &msg, MSG_NOSIGNAL) != sizeof head)
        _exit(1);
    _exit(0);
}

static int number(const char *text, unsigned long long most, unsigned long long *out) {
    char *end;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 10);
    if (*text < '0' || *text > '9' || *end != '\0' || errno != 0 || value > most)
        return -1;
    *out = value;
    return 0;
}

/* Keep only `conn` (as CONN_FD) and `fd` (as DATA_FD, if any): the child holds none of
 * init's other connections, nor its listening socket. */
static void keep_only(int conn, int fd) {
    int c = fcntl(conn, F_DUPFD_CLOEXEC, 16);
    int d = fd >= 0 ? fcntl(fd, F_DUPFD_CLOEXEC, 16) : -1;
    if (c < 0 || (fd >= 0 && d < 0) || dup3(c, CONN_FD, O_CLOEXEC) < 0 ||
        (d >= 0 && dup3(d, DATA_FD, O_CLOEXEC) < 0))
        _exit(1);
    int first = d >= 0 ? DATA_FD + 1 : DATA_FD;
    if (syscall(SYS_close_range, first, ~0U, 0) < 0) {
        for (int i = first; i < 65536; i++)
            close(i);
    }
}

/* The OOM killer's first choice in the sandbox: an upload that fills the sandbox's memory
 * ends this call, not the sandbox's init (or a command). */
static void first_to_go(void) {
    int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (fd >= 0) {
        if (write(fd, "1000", 4) != 4) {
        }
        close(fd);
    }
}

static _Noreturn void file_child(int conn, int fd, char **f, int nf) {
    keep_only(conn, fd);
    prctl(PR_SET_DUMPABLE, 0);
    first_to_go();
    umask(0);
    unsigned long long uid, gid, a, b;
    if (nf < 5 || number(f[2], UINT32_MAX - 1, &uid) < 0 || number(f[3], UINT32_MAX - 1, &gid) < 0)
        failed(EINVAL);
    gid_t group = (gid_t)gid;
    if (setgroups(1, &group) < 0 || setgid(group) < 0 || setuid((uid_t)uid) < 0)
        failed(errno);
    const char *op = f[1], *path = f[4];
    if (path[0] != '/')
        failed(EINVAL);
    int has_fd = fd >= 0;
    if (strcmp(op, "read") == 0 && nf == 6 && has_fd && number(f[5], UINT64_MAX - 1, &a) == 0)
        file_read(path, a, DATA_FD);
    if (strcmp(op, "write") == 0 && nf == 6 && has_fd && number(f[5], 07777, &a) == 0)
        file_write(path, (mode_t)a, DATA_FD);
    if (has_fd)
        failed(EINVAL);
    if (strcmp(op, "stat") == 0 && nf == 5) {
        send_path_entry(path);
        _exit(0);
    }
    if (strcmp(op, "list") == 0 && nf == 8 && number(f[5], LIST_DEPTH, &a) == 0 && a >= 1 &&
        number(f[6], LIST_LIMIT, &b) == 0 && b >= 1)
        file_list(path, (long)a, (long)b, f[7]);
    if (strcmp(op, "mkdir") == 0 && nf == 5) {
        int made = make_dirs(path, 1);
        if (made < 0)
            failed(-made);
        send_path_entry(path);
        _exit(0);
    }
    if (strcmp(op, "remove") == 0 && nf == 5)
        file_remove(path);
    if (strcmp(op, "move") == 0 && nf == 6 && f[5][0] == '/') {
        int made = make_parents(f[5]);
        if (made < 0)
            failed(-made);
        if (rename(path, f[5]) < 0)
            failed(errno);
        send_path_entry(f[5]);
        _exit(0);
    }
    if (strcmp(op, "opendir") == 0 && nf == 5)
        file_opendir(path);
    failed(EINVAL);
}

/* A file operation: forked (the child talks to the node itself; init keeps nothing of
 * it but the zombie it reaps), or refused ('E', no errno). */
static void file_request(int conn, int fd, int nfds, char **f, int nf) {
    pid_t pid = nfds <= 1 && nf >= 5 ? fork() : -1;
    if (pid == 0)
        file_child(conn, fd, f, nf);
    if (pid < 0) {
        char refused[5] = {'E', 0, 0, 0, 0};
        send(conn, refused, sizeof refused, MSG_NOSIGNAL);
    }
    close(conn);
}

/* One request: fork its command (or its file operation: file_request), or drop the
 * connection. */
static void spawn(int conn) {
    struct timeval wait = {2, 0};
    setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
    int fds[3];
    int nfds = 0;
    uint32_t size = 0;
    char *data = receive(conn, fds, &nfds, &size);
    if (data == NULL) {
        close(conn);
        return;
    }
    static char *f[MAX_FIELDS];
    int nf = fields(data, size, f, MAX_FIELDS);
    if (nf >= 1 && strcmp(f[0], FILE_REQUEST) == 0) {
        file_request(conn, nfds == 1 ? fds[0] : -1, nfds, f, nf);
        for (int i = 0; i < nfds; i++)
            close(fds[i]);
        free(data);
        return;
    }
    int pty = nf >= 1 && strcmp(f[0], PTY_REQUEST) == 0;
    int ok = pty ? nfds == 0 && nf >= 8 : nfds == 3 && nf >= 5;
    pid_t pid = (ok && ncommands < MAX_COMMANDS) ? fork() : -1;
    if (pid == 0 && pty)
        pty_child(conn, f, nf);
    if (pid == 0)
        child(conn, fds, f, nf);
    for (int i = 0; i < nfds; i++)
        close(fds[i]);
    free(data);
    if (pid < 0) {
        char refused[5] = {'E', 0, 0, 0, 0};
        send(conn, refused, sizeof refused, MSG_NOSIGNAL);
        close(conn);
        return;
    }
    commands[ncommands++] = (struct command){pid, conn};
}

/* Reap every child that ended; tell the node of its own commands. */
static void reap(void) {
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (int i = 0; i < ncommands; i++) {
            if (commands[i].pid != pid)
                continue;
            char ended[5] = {'X'};
            memcpy(ended + 1, &status, sizeof status);
            send(commands[i].conn, ended, sizeof ended, MSG_NOSIGNAL);
            close(commands[i].conn);
            commands[i] = commands[--ncommands];
            break;
        }
    }
}

static _Noreturn void serve(int listener) {
    fcntl(listener, F_SETFD, FD_CLOEXEC);
    fcntl(listener, F_SETFL, fcntl(listener, F_GETFL) | O_NONBLOCK);
    sigset_t all, chld;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, NULL);
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0)
        reap_forever();
    for (;;) {
        struct pollfd p[2] = {{listener, POLLIN, 0}, {sfd, POLLIN, 0}};
        if (poll(p, 2, -1) < 0)
            continue;
        if (p[1].revents) {
            struct signalfd_siginfo info;
            while (read(sfd, &info, sizeof info) > 0) {
            }
            reap();
        }
        if (p[0].revents) {
            int conn;
            while ((conn = accept4(listener, NULL, NULL, SOCK_CLOEXEC)) >= 0)
                spawn(conn);
        }
    }
}

int main(int argc, char **argv) {
    /* Not dumpable: root inside shares PID 1's ids, so without this it could open
     * /proc/1/mem for writing (no ptrace call needed), read init's fds and environment,
     * and rewrite the agent that runs the node's commands. The children it forks inherit
     * it until they exec. */
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0)
        return 125;
    if (argc >= 3 && strcmp(argv[1], "exec") == 0) {
        setsid();
        execvp(argv[2], &argv[2]);
        fprintf(stderr, "corral-init: cannot run %s: %s\n", argv[2], strerror(errno));
        return errno == ENOENT ? 127 : 126;
    }
    if (argc >= 4 && strcmp(argv[1], "fdexec") == 0) {
        int fd = atoi(argv[2]);
        if (fd < 3 || (fd != LISTEN_FD && (dup2(fd, LISTEN_FD) < 0 || close(fd) < 0))) {
            fprintf(stderr, "corral-init: bad descriptor %s\n", argv[2]);
            return 2;
        }
        execvp(argv[3], &argv[3]);
        fprintf(stderr, "corral-init: cannot run %s: %s\n", argv[3], strerror(errno));
        return 127;
    }
    if (argc != 1) {
        fprintf(stderr, "usage: corral-init | corral-init exec CMD [ARG...] | "
                        "corral-init fdexec N CMD [ARG...]\n");
        return 2;
    }
    if (is_listening(LISTEN_FD))
        serve(LISTEN_FD);
    reap_forever();
}
