// A spare supervisor: started by the daemon before a command needs it, so that a command's start is one message to a
// process already running rather than an exec on the operation's path (Sources/OperationKinds/Commands/
// SpareSupervisors.swift is the daemon's side). The message, on a SOCK_SEQPACKET socket (one message, whole):
//   two descriptors (SCM_RIGHTS): the command's standard output and error;
//   NUL-terminated strings: nice, idle (0 or 1), working directory ("" for none), PATH, ARGC, then ARGC arguments,
//   then the environment, one VAR=value each.
// What a direct spawn gets from the daemon's posix_spawn and its worker thread, this process sets on itself before it
// starts the command the usual way (main.c): descriptors, the thread's nice value and SCHED_IDLE with the idle I/O
// class, the folder and the environment.

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "spare.h"

extern char **environ;

enum { message_limit = 1 << 17, ioprio_class_shift = 13, ioprio_who_process = 1, ioprio_best_effort = 2, ioprio_idle = 3 };

static char message[message_limit];

/// The next string of message[*at..<end], or NULL when none is left.
static char *next_string(size_t *at, size_t end) {
    if (*at >= end) return NULL;
    char *start = message + *at;
    char *nul = memchr(start, 0, end - *at);
    if (nul == NULL) return NULL;
    *at = (size_t)(nul - message) + 1;
    return start;
}

/// Receives one message and its two descriptors; its length, 0 at the end of the socket, -1 on an error.
static ssize_t receive(int socket, int fds[2]) {
    char control[CMSG_SPACE(2 * sizeof(int))];
    struct iovec part = { message, sizeof message };
    struct msghdr header = { .msg_iov = &part, .msg_iovlen = 1, .msg_control = control, .msg_controllen = sizeof control };
    ssize_t n;
    do n = recvmsg(socket, &header, MSG_CMSG_CLOEXEC); while (n < 0 && errno == EINTR);
    if (n <= 0) return n;
    struct cmsghdr *c = CMSG_FIRSTHDR(&header);
    if (c == NULL || c->cmsg_type != SCM_RIGHTS || c->cmsg_len != CMSG_LEN(2 * sizeof(int))) return -1;
    memcpy(fds, CMSG_DATA(c), 2 * sizeof(int));
    return (header.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0 ? -1 : n;
}

/// The operation's priority, as the daemon's worker thread had it (raising it may be refused: then it stays as it is).
static void take_priority(int nice_value, int idle) {
    struct sched_param param = { .sched_priority = 0 };
    if (idle) sched_setscheduler(0, SCHED_IDLE, &param);
    int ioprio = idle ? (ioprio_idle << ioprio_class_shift) : ((ioprio_best_effort << ioprio_class_shift) | 4);
    syscall(SYS_ioprio_set, ioprio_who_process, 0, ioprio);
    setpriority(PRIO_PROCESS, 0, nice_value);
}

/// The strings of the last message (argv and environment point into `message`); freed when the next one comes.
static char **last_strings;

int spare_receive(int socket, struct spare_command *command) {
    int fds[2] = { -1, -1 };
    ssize_t n = receive(socket, fds);
    if (n == 0) return 0;
    // From here on the daemon counts this process as the command's supervisor: whatever goes wrong is a failure (127),
    // said on the command's standard error when its descriptor came. The socket stays open, close-on-exec (the command
    // must not be able to write on it): the end is reported on it, and the next command may come.
    fcntl(socket, F_SETFD, FD_CLOEXEC);
    if (fds[0] >= 0 && dup2(fds[0], 1) < 0) return -1;
    if (fds[1] >= 0 && dup2(fds[1], 2) < 0) return -1;
    for (int i = 0; i < 2; i++) if (fds[i] > 2) close(fds[i]);
    if (n < 0) {
        fprintf(stderr, "opqueued-supervise: the daemon's message was cut short\n");
        return -1;
    }
    size_t at = 0, end = (size_t)n;
    char *nice_text = next_string(&at, end), *idle = next_string(&at, end), *folder = next_string(&at, end);
    char *path = next_string(&at, end), *count_text = next_string(&at, end);
    long count = count_text != NULL ? strtol(count_text, NULL, 10) : -1;
    if (path == NULL || count < 1 || count > (long)end) {
        fprintf(stderr, "opqueued-supervise: the daemon's message is malformed\n");
        return -1;
    }
    // At most one pointer per byte of the message, and the terminating NULLs.
    free(last_strings);
    char **strings = last_strings = calloc(end + 2, sizeof *strings);
    if (strings == NULL) return -1;
    char **argv = strings, **env = strings + count + 1;
    for (long i = 0; i < count; i++) {
        if ((argv[i] = next_string(&at, end)) == NULL) {
            fprintf(stderr, "opqueued-supervise: the daemon's message is malformed\n");
            return -1;
        }
    }
    for (char **slot = env; (*slot = next_string(&at, end)) != NULL; slot++) {}
    take_priority((int)strtol(nice_text, NULL, 10), idle[0] == '1');
    if (folder[0] != '\0' && chdir(folder) != 0) {
        fprintf(stderr, "cannot run %s: cannot enter %s: %s\n", path, folder, strerror(errno));
        return -1;
    }
    environ = env;
    command->path = path;
    command->argv = argv;
    return 1;
}

int spare_report(int socket, int status) {
    // Nothing of the command's is held any more: its descriptors, its folder, its environment.
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null < 0 || dup2(null, 1) < 0 || dup2(null, 2) < 0) return -1;
    close(null);
    if (chdir("/") != 0) return -1;
    // Its priority as it is now (what the daemon matches the next command to; a command may have changed it).
    errno = 0;
    int nice_value = getpriority(PRIO_PROCESS, 0);
    if (nice_value == -1 && errno != 0) return -1;
    char idle = sched_getscheduler(0) == SCHED_IDLE;
    char report[1 + 2 * sizeof(int) + 1];
    report[0] = 'x';
    memcpy(report + 1, &status, sizeof status);
    memcpy(report + 1 + sizeof status, &nice_value, sizeof nice_value);
    report[sizeof report - 1] = idle;
    ssize_t sent;
    do sent = send(socket, report, sizeof report, MSG_NOSIGNAL); while (sent < 0 && errno == EINTR);
    return sent == (ssize_t)sizeof report ? 0 : -1;
}

// The factory: an exec costs a static C program like this one about 0.7 ms of CPU where `cpuid` traps to the
// hypervisor (glibc's start-up asks it for the caches, over and over) — in a virtual machine, most servers. A copy
// made by clone(CLONE_PARENT) starts nothing and costs a fork of a 1 MB process; CLONE_PARENT makes it the daemon's
// child, so that the daemon waits for it, holds its pidfd and is watched by its parent-death signal, as with a spare
// it started itself. The factory is single-threaded and holds no lock, so a raw clone leaves the copy sound.

int spare_factory(int socket, char *name) {
    // The daemon's death closes the socket: the loop ends.
    for (;;) {
        int fds[2] = { -1, -1 };
        ssize_t n = receive(socket, fds);
        if (n == 0 || (n < 0 && fds[0] < 0)) return 0;
        if (fds[1] != fds[0] && fds[1] >= 0) close(fds[1]);
        pid_t pid = (pid_t)syscall(SYS_clone, CLONE_PARENT | SIGCHLD, 0, NULL, NULL, 0);
        if (pid == 0) {
            // The spare: its own process group (as posix_spawn's POSIX_SPAWN_SETPGROUP gives a spare it starts), its
            // socket as descriptor 3, and "--spare" in its command line.
            setpgid(0, 0);
            if (fds[0] != 3) {
                dup2(fds[0], 3);
                close(fds[0]);
            }
            size_t length = strlen(name);
            memset(name, 0, length);
            memcpy(name, "--spare", length < 7 ? length : 7);
            return 1;
        }
        close(fds[0]);
        char answer[32];
        int length = snprintf(answer, sizeof answer, "%d", pid > 0 ? (int)pid : -errno);
        if (send(socket, answer, (size_t)length, MSG_NOSIGNAL) < 0) return 0;
    }
}
