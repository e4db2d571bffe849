// opqueued-supervise: the small process between the daemon and each command it runs (SPEC §3.6, §8). A command may
// leave its process group (setsid, a daemonising script); a group kill no longer reaches such a process, and outside
// systemd no cgroup does. This process is the command's parent and a child subreaper (PR_SET_CHILD_SUBREAPER): every
// process the command starts, however it left its group, stays its descendant, and it ends them all when the
// operation ends.
//
//   opqueued-supervise GRACE PARENT PATH ARG0 ARGS...
//   opqueued-supervise --spare GRACE PARENT        (descriptor 3: a SOCK_SEQPACKET socket from the daemon)
//   opqueued-supervise --factory GRACE PARENT      (the same: the daemon asks it for spares)
//
// Runs PATH with ARG0 ARGS... (environment, descriptors, working directory and scheduling as it was given them) and
// exits as the command did once the command and everything it started have ended. A spare is started ahead of need
// (spare.c): it waits for a message saying the command, then does the same, except that at the end it reports the
// command's status on its socket and waits for the next command rather than exit (a supervisor serves many commands
// one after another: no new process per command); the daemon closing the socket ends it.
// A factory makes spares as copies of itself, children of the daemon, without an exec each (spare.c says why).
// - the command exits: what it left running gets SIGKILL (waited for), then this process exits with its status (or
//   by its signal);
// - SIGTERM (the operation cancelled or timed out): SIGTERM to every descendant, SIGKILL to all GRACE seconds later;
// - SIGUSR1 (the daemon stopping, or its watchdog: the daemon died or froze past its lease): SIGKILL to all at once;
// - the daemon (PARENT) dies: the same as SIGUSR1 — PR_SET_PDEATHSIG sends SIGHUP, and getppid() says whether the
//   parent process died or only the thread that started this one; a poll each second catches anything missed.
// Errors it meets itself are written to standard error (the command's log) and end it with status 127, as a shell's.
//
// What it trusts: its arguments (the daemon's). It never reads what the command writes.

#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "spare.h"

extern char **environ;

static pid_t self;

/// The pids of this process's descendants (every process whose chain of parents leads here), from /proc; their count
/// in *count. NULL when none (or /proc cannot be read).
static pid_t *descendants(size_t *count) {
    *count = 0;
    DIR *proc = opendir("/proc");
    if (proc == NULL) return NULL;
    size_t n = 0, capacity = 256;
    pid_t *pids = malloc(capacity * sizeof *pids), *parents = malloc(capacity * sizeof *parents);
    struct dirent *entry;
    while (pids != NULL && parents != NULL && (entry = readdir(proc)) != NULL) {
        char *end;
        long pid = strtol(entry->d_name, &end, 10);
        if (*end != '\0' || pid <= 0) continue;
        char path[64], buffer[512];
        snprintf(path, sizeof path, "/proc/%ld/stat", pid);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        ssize_t got = read(fd, buffer, sizeof buffer - 1);
        close(fd);
        if (got <= 0) continue;
        buffer[got] = '\0';
        // After "pid (comm) ": the state, then the parent's pid. comm may hold ')' itself: the last one counts.
        char *close_paren = strrchr(buffer, ')');
        long parent;
        char state;
        if (close_paren == NULL || sscanf(close_paren + 1, " %c %ld", &state, &parent) != 2) continue;
        if (n == capacity) {
            capacity *= 2;
            pid_t *p = realloc(pids, capacity * sizeof *pids), *q = realloc(parents, capacity * sizeof *parents);
            if (p != NULL) pids = p;
            if (q != NULL) parents = q;
            if (p == NULL || q == NULL) break;
        }
        pids[n] = (pid_t)pid;
        parents[n] = (pid_t)parent;
        n++;
    }
    closedir(proc);
    if (pids == NULL || parents == NULL) { free(pids); free(parents); return NULL; }
    // Marked in rounds: a process whose parent is this one or a marked one is marked.
    char *marked = calloc(n > 0 ? n : 1, 1);
    for (int changed = 1; marked != NULL && changed;) {
        changed = 0;
        for (size_t i = 0; i < n; i++) {
            if (marked[i]) continue;
            int mine = parents[i] == self;
            for (size_t j = 0; !mine && j < n; j++) mine = marked[j] && pids[j] == parents[i];
            if (mine) { marked[i] = 1; changed = 1; }
        }
    }
    size_t k = 0;
    for (size_t i = 0; marked != NULL && i < n; i++) if (marked[i]) pids[k++] = pids[i];
    free(marked);
    free(parents);
    if (k == 0) { free(pids); return NULL; }
    *count = k;
    return pids;
}

/// Sends `signal` to every descendant.
static void signal_all(int signal) {
    size_t count;
    pid_t *pids = descendants(&count);
    for (size_t i = 0; i < count; i++) kill(pids[i], signal);
    free(pids);
}

/// Kills every descendant and reaps them all (a descendant orphaned meanwhile comes here, and is killed in turn).
/// The command's status, if it is among them, is stored in *status.
static void kill_all(pid_t command, int *status, int *command_done) {
    for (;;) {
        // No child left, so no descendant either (an orphan comes here): done, without a look at /proc — the usual end
        // of a command that left nothing behind.
        siginfo_t info;
        memset(&info, 0, sizeof info);
        if (waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0 && errno == ECHILD) return;
        signal_all(SIGKILL);
        int s;
        pid_t r = waitpid(-1, &s, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return; // ECHILD: nothing is left
        if (r == command) { *status = s; *command_done = 1; }
    }
}

/// Reaps what has ended; notes the command's end.
static void reap(pid_t command, int *status, int *command_done) {
    int s;
    pid_t r;
    while ((r = waitpid(-1, &s, WNOHANG)) > 0) {
        if (r == command) { *status = s; *command_done = 1; }
    }
}

/// Ends this process as the command ended: its exit status, or its signal (without a core file).
__attribute__((noreturn)) static void exit_as(int status) {
    if (WIFEXITED(status)) exit(WEXITSTATUS(status));
    int signal = WTERMSIG(status);
    struct rlimit none = { 0, 0 };
    setrlimit(RLIMIT_CORE, &none);
    struct sigaction action = { 0 };
    action.sa_handler = SIG_DFL;
    sigaction(signal, &action, NULL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, signal);
    sigprocmask(SIG_UNBLOCK, &set, NULL);
    raise(signal);
    exit(128 + signal); // a signal whose default is not to end a process
}

static double monotonic(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/// Blocks the signals it waits for (their previous mask in *previous), becomes a subreaper with a parent-death signal;
/// 0, or 127 (said on standard error) when that fails or PARENT has already died.
static int prepare(pid_t parent, sigset_t *watched, sigset_t *previous) {
    self = getpid();
    sigemptyset(watched);
    sigaddset(watched, SIGCHLD);
    sigaddset(watched, SIGTERM);
    sigaddset(watched, SIGUSR1);
    sigaddset(watched, SIGHUP);
    sigprocmask(SIG_BLOCK, watched, previous);
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0 || prctl(PR_SET_PDEATHSIG, SIGHUP) != 0) {
        fprintf(stderr, "opqueued-supervise: prctl: %s\n", strerror(errno));
        return 127;
    }
    return getppid() != parent ? 127 : 0; // the daemon died before the death signal was set
}

/// Runs the command and supervises it to the end: its wait status in *status (exit 127 when it cannot be started, said on
/// standard error). 1 when it ended on its own or by its operation's cancel or timeout; 0 when the daemon stops or died
/// (SIGUSR1, or PARENT gone): this process must then exit.
static int supervise(double grace, pid_t parent, const char *path, char *const *command_argv, sigset_t *watched,
                     sigset_t *previous, int *status) {
    // posix_spawn (a vfork underneath): no copy of this process, and an exec that fails says why here.
    posix_spawnattr_t attributes;
    posix_spawnattr_init(&attributes);
    posix_spawnattr_setsigmask(&attributes, previous);
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK);
    pid_t command;
    int failed = posix_spawn(&command, path, NULL, &attributes, command_argv, environ);
    posix_spawnattr_destroy(&attributes);
    if (failed != 0) {
        fprintf(stderr, "cannot run %s: %s\n", path, strerror(failed));
        *status = 127 << 8;
        return 1;
    }

    int command_done = 0;
    double kill_at = -1;
    *status = 0;
    for (;;) {
        reap(command, status, &command_done);
        if (command_done) {
            // Whatever the command left behind ends with it.
            int ignored;
            kill_all(-1, &ignored, &command_done);
            return 1;
        }
        double now = monotonic();
        if (kill_at >= 0 && now >= kill_at) {
            kill_all(command, status, &command_done);
            return 1;
        }
        double wait = kill_at >= 0 && kill_at - now < 1 ? kill_at - now : 1;
        struct timespec timeout = { (time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9) };
        siginfo_t info;
        int signal = sigtimedwait(watched, &info, &timeout);
        if (signal == SIGTERM && kill_at < 0) {
            signal_all(SIGTERM);
            kill_at = monotonic() + grace;
        } else if (signal == SIGUSR1 || getppid() != parent) {
            kill_all(command, status, &command_done);
            if (!command_done) *status = SIGKILL & 0x7f;
            return 0;
        }
    }
}

/// A spare: waits for a command on descriptor 3 and supervises it; then reports its end there and waits for the next,
/// so that one process serves many commands one after another (each in this process's group, alone: the last one's
/// processes are all gone). Signals meant for the last command (a cancel that crossed its end) are dropped first.
static int run_spare(double grace, pid_t parent) {
    sigset_t watched, previous;
    int refused = prepare(parent, &watched, &previous);
    if (refused != 0) return refused;
    for (;;) {
        struct spare_command command;
        int received = spare_receive(3, &command);
        if (received <= 0) return received == 0 ? 0 : 127; // 0: the daemon let this spare go
        struct timespec now = { 0, 0 };
        while (sigtimedwait(&watched, NULL, &now) > 0) {}
        if (getppid() != parent) exit_as(SIGKILL & 0x7f);
        int status;
        int reusable = supervise(grace, parent, command.path, command.argv, &watched, &previous, &status);
        if (!reusable || spare_report(3, status) != 0) exit_as(status);
    }
}

int main(int argc, char **argv) {
    int spare = argc == 4 && strcmp(argv[1], "--spare") == 0, factory = argc == 4 && strcmp(argv[1], "--factory") == 0;
    if (argc < 5 && !spare && !factory) {
        fprintf(stderr, "usage: opqueued-supervise GRACE PARENT PATH ARG0 [ARGS...]\n");
        return 127;
    }
    double grace = strtod(argv[spare || factory ? 2 : 1], NULL);
    pid_t parent = (pid_t)strtol(argv[spare || factory ? 3 : 2], NULL, 10);
    if (spare) return run_spare(grace, parent);
    if (factory) {
        // Returns in each spare it makes (a copy of this process), with its socket as descriptor 3.
        if (spare_factory(3, argv[1]) == 0) return 0;
        return run_spare(grace, parent);
    }
    sigset_t watched, previous;
    int refused = prepare(parent, &watched, &previous);
    if (refused != 0) return refused;
    int status;
    supervise(grace, parent, argv[3], argv + 4, &watched, &previous, &status);
    exit_as(status);
}
