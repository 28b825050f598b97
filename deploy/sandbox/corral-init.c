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
 * bounded by a receive timeout.
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
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#define LISTEN_FD 3
#define MAX_REQUEST (4u << 20)
#define MAX_FIELDS 65536
#define MAX_COMMANDS 4096

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

/* The request on `conn`: its bytes (malloc'd, NUL-terminated fields) and its 3 fds. */
static char *receive(int conn, int fds[3], uint32_t *size) {
    uint32_t length = 0;
    char control[CMSG_SPACE(3 * sizeof(int))];
    struct iovec iov = {&length, sizeof length};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1,
                         .msg_control = control, .msg_controllen = sizeof control};
    if (recvmsg(conn, &msg, MSG_WAITALL | MSG_CMSG_CLOEXEC) != sizeof length)
        return NULL;
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    if (cm == NULL || cm->cmsg_type != SCM_RIGHTS || cm->cmsg_len != CMSG_LEN(3 * sizeof(int)))
        return NULL;
    memcpy(fds, CMSG_DATA(cm), 3 * sizeof(int));
    if (length == 0 || length > MAX_REQUEST) {
        for (int i = 0; i < 3; i++)
            close(fds[i]);
        return NULL;
    }
    char *data = malloc(length + 1);
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
        for (int i = 0; i < 3; i++)
            close(fds[i]);
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

static _Noreturn void fail(const char *what, const char *detail, int code) {
    dprintf(2, "corral-init: %s %s: %s\n", what, detail, strerror(errno));
    _exit(code);
}

static _Noreturn void child(int conn, int fds[3], char **f, int nf) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    for (int i = 0; i < 3; i++) {
        if (dup2(fds[i], i) < 0)
            _exit(126);
    }
    for (int i = 0; i < 3; i++) {
        if (fds[i] > 2)
            close(fds[i]);
    }
    setsid();
    uid_t uid = (uid_t)strtoul(f[0], NULL, 10);
    gid_t gid = (gid_t)strtoul(f[1], NULL, 10);
    if (setgroups(1, &gid) < 0 || setgid(gid) < 0 || setuid(uid) < 0)
        fail("cannot become", f[0], 126);
    struct ucred cred = {getpid(), getuid(), getgid()};
    char control[CMSG_SPACE(sizeof cred)];
    memset(control, 0, sizeof control);
    char tag = 'P';
    struct iovec iov = {&tag, 1};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1,
                         .msg_control = control, .msg_controllen = sizeof control};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_CREDENTIALS;
    cm->cmsg_len = CMSG_LEN(sizeof cred);
    memcpy(CMSG_DATA(cm), &cred, sizeof cred);
    sendmsg(conn, &msg, MSG_NOSIGNAL);
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

/* One request: fork its command, or drop the connection. */
static void spawn(int conn) {
    struct timeval wait = {2, 0};
    setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
    int fds[3];
    uint32_t size = 0;
    char *data = receive(conn, fds, &size);
    if (data == NULL) {
        close(conn);
        return;
    }
    static char *f[MAX_FIELDS];
    int nf = fields(data, size, f, MAX_FIELDS);
    pid_t pid = (nf >= 5 && ncommands < MAX_COMMANDS) ? fork() : -1;
    if (pid == 0)
        child(conn, fds, f, nf);
    for (int i = 0; i < 3; i++)
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
