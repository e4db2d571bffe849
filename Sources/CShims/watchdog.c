// The command watchdog: a process forked from the daemon that kills the daemon's commands when the daemon
// cannot (it died, or it is frozen past its kill deadline). See CShims.h and docs/pending/issue-17-watchdog.md.
//
// Why a process of its own rather than PR_SET_PDEATHSIG: the death signal is sent when the *thread* that
// spawned the child exits (the engine's worker threads come and go), and only to that direct child — a
// command's grandchildren (`sh -c 'sleep 300 & sleep 300'`) would survive. The watchdog kills whole process
// groups, whatever ended the daemon, and its clock keeps running while the daemon is stopped.
//
// After fork the child runs only what is below: system calls, no malloc, no locks (the daemon has threads
// whose locks may be held at the fork). What it trusts: the messages of its pipe, whose only writer is the
// daemon that forked it (the write end is close-on-exec and was never in any other process).
#define _GNU_SOURCE
#include "CShims.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int64_t opq_monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/// The recorded groups: an array in pages of its own (mmap, never malloc after fork).
struct opq_groups {
    pid_t *pgids;
    size_t count;
    size_t capacity;
};

static void opq_groups_add(struct opq_groups *g, pid_t pgid) {
    if (g->count == g->capacity) {
        size_t capacity = g->capacity ? g->capacity * 2 : 4096;
        pid_t *grown = mmap(NULL, capacity * sizeof(pid_t), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        // Out of memory: this group is not covered (the next start still kills it from active/.commands).
        if (grown == MAP_FAILED) return;
        if (g->pgids) {
            memcpy(grown, g->pgids, g->count * sizeof(pid_t));
            munmap(g->pgids, g->capacity * sizeof(pid_t));
        }
        g->pgids = grown;
        g->capacity = capacity;
    }
    g->pgids[g->count++] = pgid;
}

static void opq_groups_remove(struct opq_groups *g, pid_t pgid) {
    for (size_t i = 0; i < g->count; i++) {
        if (g->pgids[i] == pgid) {
            g->pgids[i] = g->pgids[--g->count];
            return;
        }
    }
}

/// Each group's leader is a command's supervisor (opqueued-supervise): SIGUSR1 has it SIGKILL everything the command
/// started, in its group or not; 200 ms later the group gets SIGKILL, should a leader not have ended it.
static void opq_groups_kill(const struct opq_groups *g) {
    if (g->count == 0) return;
    for (size_t i = 0; i < g->count; i++) kill(g->pgids[i], SIGUSR1);
    struct timespec pause = { 0, 200 * 1000000L };
    while (nanosleep(&pause, &pause) != 0 && errno == EINTR) {}
    for (size_t i = 0; i < g->count; i++) kill(-g->pgids[i], SIGKILL);
}

/// Reads every message the pipe holds now. Returns 1 at the end of the pipe (the daemon is gone), else 0.
static int opq_watchdog_drain(int fd, struct opq_groups *groups, int64_t *deadline, int *expired,
                              char *carry, size_t *carried) {
    char buffer[4096];
    for (;;) {
        memcpy(buffer, carry, *carried);
        ssize_t n = read(fd, buffer + *carried, sizeof buffer - *carried);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) return 0;
        if (n <= 0) return 1; // EOF, or an error no daemon could repair: both mean "kill and go"
        size_t total = *carried + (size_t)n, used = 0;
        while (total - used >= sizeof(struct opq_watchdog_message)) {
            struct opq_watchdog_message m;
            memcpy(&m, buffer + used, sizeof m);
            used += sizeof m;
            switch (m.type) {
            case OPQ_WATCHDOG_ADD:
                if (m.pgid > 1) {
                    opq_groups_add(groups, m.pgid);
                    // Started while the deadline has passed unrenewed: it is not covered by a lease either.
                    if (*expired) kill(-m.pgid, SIGKILL);
                }
                break;
            case OPQ_WATCHDOG_REMOVE:
                opq_groups_remove(groups, m.pgid);
                break;
            case OPQ_WATCHDOG_DEADLINE:
                *deadline = m.value;
                *expired = 0;
                break;
            default:
                break;
            }
        }
        *carried = total - used;
        memcpy(carry, buffer + used, *carried);
    }
}

__attribute__((noreturn)) static void opq_watchdog_run(int fd) {
    struct opq_groups groups = { NULL, 0, 0 };
    int64_t deadline = -1;
    int expired = 0;
    char carry[sizeof(struct opq_watchdog_message)];
    size_t carried = 0;
    for (;;) {
        struct timespec timeout, *tp = NULL;
        if (deadline >= 0 && !expired) {
            int64_t left = deadline - opq_monotonic_ns();
            if (left < 0) left = 0;
            timeout.tv_sec = (time_t)(left / 1000000000LL);
            timeout.tv_nsec = (long)(left % 1000000000LL);
            tp = &timeout;
        }
        struct pollfd pfd = { .fd = fd, .events = POLLIN };
        int r = ppoll(&pfd, 1, tp, NULL);
        if (r < 0 && errno != EINTR) break;
        // Every message already written counts before a deadline is judged: a renewal (or the end of a
        // group) the daemon sent just in time is read first.
        if (opq_watchdog_drain(fd, &groups, &deadline, &expired, carry, &carried)) break;
        if (deadline >= 0 && !expired && opq_monotonic_ns() >= deadline) {
            expired = 1;
            opq_groups_kill(&groups);
        }
    }
    opq_groups_kill(&groups);
    _exit(0);
}

/// In the forked child: a session of its own, quiet signals, only the pipe open. Never returns.
__attribute__((noreturn)) static void opq_watchdog_child(int read_fd) {
    setsid();
    prctl(PR_SET_NAME, "opq-watchdog", 0, 0, 0);
    // Handlers installed by the daemon point into code that must not run here: defaults, except what a
    // terminal, a service manager's stop or a closed pipe would send — those must not end the watchdog
    // before the daemon's exit tells it to kill.
    struct sigaction action;
    memset(&action, 0, sizeof action);
    sigemptyset(&action.sa_mask);
    for (int sig = 1; sig < NSIG; sig++) {
        if (sig == SIGKILL || sig == SIGSTOP) continue;
        int quiet = sig == SIGHUP || sig == SIGINT || sig == SIGQUIT || sig == SIGTERM || sig == SIGPIPE || sig == SIGTSTP
                    || sig == SIGTTIN || sig == SIGTTOU || sig == SIGUSR1 || sig == SIGUSR2 || sig == SIGALRM;
        action.sa_handler = quiet ? SIG_IGN : SIG_DFL;
        sigaction(sig, &action, NULL); // fails harmlessly for the signals glibc reserves
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    int fd = fcntl(read_fd, F_DUPFD, 3);
    if (fd < 0) _exit(1);
    int null = open("/dev/null", O_RDWR);
    if (null >= 0) {
        dup2(null, 0);
        dup2(null, 1);
        dup2(null, 2);
    }
    if (fd != 3) {
        if (dup2(fd, 3) < 0) _exit(1);
        fd = 3;
    }
    // Nothing else of the daemon's stays open here (sockets, the spool lock, log files).
    if (syscall(SYS_close_range, 4U, ~0U, 0U) != 0) {
        long max = sysconf(_SC_OPEN_MAX);
        if (max < 0 || max > 65536) max = 65536;
        for (int other = 4; other < max; other++) close(other);
    }
    fcntl(fd, F_SETFD, 0);
    fcntl(fd, F_SETFL, O_NONBLOCK);
    // Not holding the daemon's working folder (a mount) busy.
    if (chdir("/") != 0) { /* harmless */ }
    opq_watchdog_run(fd);
}

int opq_watchdog_start(int *write_fd_out, pid_t *pid_out) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return -errno;
    // Room for 65,536 messages where the kernel allows (1 MB is the default ceiling for anyone).
    fcntl(fds[1], F_SETPIPE_SZ, 1 << 20);
    // _Fork: no atfork handlers (the daemon's libraries must not run theirs in a child that only does this).
    pid_t pid = _Fork();
    if (pid < 0) {
        int e = errno;
        close(fds[0]);
        close(fds[1]);
        return -e;
    }
    if (pid == 0) {
        close(fds[1]);
        opq_watchdog_child(fds[0]);
    }
    close(fds[0]);
    int flags = fcntl(fds[1], F_GETFL);
    fcntl(fds[1], F_SETFL, flags | O_NONBLOCK);
    *write_fd_out = fds[1];
    *pid_out = pid;
    return 0;
}

int opq_watchdog_send(int fd, int type, pid_t pgid, int64_t value) {
    struct opq_watchdog_message m = { .type = type, .pgid = pgid, .value = value };
    for (;;) {
        ssize_t n = write(fd, &m, sizeof m);
        if (n == (ssize_t)sizeof m) return 0;
        if (n < 0 && errno == EINTR) continue;
        return n < 0 ? -errno : -EIO;
    }
}

int opq_child_exited(pid_t pid, int block) {
    siginfo_t info;
    memset(&info, 0, sizeof info);
    int r;
    do r = waitid(P_PID, (id_t)pid, &info, WEXITED | WNOWAIT | (block ? 0 : WNOHANG)); while (r < 0 && errno == EINTR);
    if (r < 0) return -errno;
    return info.si_pid == pid ? 1 : 0;
}
