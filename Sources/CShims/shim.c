#define _GNU_SOURCE
#include "CShims.h"

#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <unistd.h>

#define OPQ_IOPRIO_CLASS_SHIFT 13
#define OPQ_IOPRIO_WHO_PROCESS 1
#define OPQ_IOPRIO_CLASS_BE 2
#define OPQ_IOPRIO_CLASS_IDLE 3

pid_t opq_gettid(void) { return (pid_t)syscall(SYS_gettid); }

int opq_set_thread_priority(int nice_value, int idle) {
    pid_t tid = opq_gettid();
    int result = 0;
    struct sched_param param = { .sched_priority = 0 };
    if (sched_setscheduler(tid, idle ? SCHED_IDLE : SCHED_OTHER, &param) != 0 && result == 0) result = -errno;
    int ioprio = idle ? (OPQ_IOPRIO_CLASS_IDLE << OPQ_IOPRIO_CLASS_SHIFT)
                      : ((OPQ_IOPRIO_CLASS_BE << OPQ_IOPRIO_CLASS_SHIFT) | 4);
    if (syscall(SYS_ioprio_set, OPQ_IOPRIO_WHO_PROCESS, tid, ioprio) != 0 && result == 0) result = -errno;
    if (setpriority(PRIO_PROCESS, (id_t)tid, nice_value) != 0) {
        int err = errno;
        // Raising above 0 needs CAP_SYS_NICE; fall back to 0 rather than leaving a lower priority.
        if (nice_value < 0) setpriority(PRIO_PROCESS, (id_t)tid, 0);
        if (result == 0) result = -err;
    }
    return result;
}

int opq_get_thread_nice(void) {
    errno = 0;
    return getpriority(PRIO_PROCESS, (id_t)opq_gettid());
}

int opq_thread_is_idle(void) { return sched_getscheduler(opq_gettid()) == SCHED_IDLE; }

int opq_syncfs(int fd) { return syncfs(fd) == 0 ? 0 : -errno; }

long long opq_fs_type(int fd) {
    struct statfs fs;
    return fstatfs(fd, &fs) == 0 ? (long long)fs.f_type : -errno;
}

int opq_write_out(int fd, int wait) {
    unsigned flags = wait ? SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER
                          : SYNC_FILE_RANGE_WRITE;
    return sync_file_range(fd, 0, 0, flags) == 0 ? 0 : -errno;
}

int opq_rename_noreplace(int dirfd, const char *from, const char *to) {
    return syscall(SYS_renameat2, dirfd, from, dirfd, to, 1 /* RENAME_NOREPLACE */) == 0 ? 0 : -errno;
}

void opq_release_free_memory(void) {
    malloc_trim(0);
}

void opq_tune_allocator(void) {
    mallopt(M_MMAP_THRESHOLD, 4 << 20);
    mallopt(M_TRIM_THRESHOLD, 8 << 20);
}

unsigned long long opq_heap_bytes_in_use(void) {
    struct mallinfo2 info = mallinfo2();
    return (unsigned long long)info.uordblks + (unsigned long long)info.hblkhd;
}

static volatile sig_atomic_t opq_noted_signal = 0;

static void opq_note_signal(int signal) { opq_noted_signal = signal; }

static volatile sig_atomic_t opq_noted_hangup_flag = 0;

static void opq_note_hangup(int signal) { (void)signal; opq_noted_hangup_flag = 1; }

static volatile sig_atomic_t opq_noted_usr1 = 0, opq_noted_usr2 = 0;

static void opq_note_user(int signal) {
    if (signal == SIGUSR1) opq_noted_usr1 = 1;
    else opq_noted_usr2 = 1;
}

static void opq_handle(int signal, void (*handler)(int)) {
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = handler;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(signal, &action, NULL);
}

void opq_open_standard_descriptors(void) {
    for (int fd = 0; fd <= 2; fd++) {
        if (fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
        // The lowest free descriptor is this one: the lower ones are open (or were just opened here).
        int null = open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
        if (null >= 0 && null != fd) {
            dup2(null, fd);
            close(null);
        }
    }
}

void opq_note_termination_signals(void) {
    opq_handle(SIGTERM, opq_note_signal);
    opq_handle(SIGINT, opq_note_signal);
    opq_handle(SIGHUP, opq_note_hangup);
    opq_handle(SIGUSR1, opq_note_user);
    opq_handle(SIGUSR2, opq_note_user);
}

int opq_noted_termination_signal(void) { return opq_noted_signal; }

int opq_noted_hangup(void) { return opq_noted_hangup_flag; }

int opq_noted_user_signals(void) { return (opq_noted_usr1 ? 1 : 0) | (opq_noted_usr2 ? 2 : 0); }

void opq_default_termination_signals(void) {
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    signal(SIGUSR1, SIG_DFL);
    signal(SIGUSR2, SIG_DFL);
    if (opq_noted_signal) raise(opq_noted_signal);
    if (opq_noted_hangup_flag) raise(SIGHUP);
    if (opq_noted_usr1) raise(SIGUSR1);
    if (opq_noted_usr2) raise(SIGUSR2);
}

int64_t opq_copy_file(int in, int out, int64_t limit) {
    int64_t copied = 0;
    int fallback = 0;
    char buffer[65536];
    while (copied < limit) {
        size_t want = (size_t)(limit - copied);
        ssize_t n;
        if (!fallback) {
            n = copy_file_range(in, NULL, out, NULL, want, 0);
            if (n < 0 && (errno == EXDEV || errno == ENOSYS || errno == EINVAL || errno == EOPNOTSUPP) && copied == 0) {
                fallback = 1;
                continue;
            }
        } else {
            n = read(in, buffer, want < sizeof buffer ? want : sizeof buffer);
            for (ssize_t done = 0; n > 0 && done < n;) {
                ssize_t w = write(out, buffer + done, (size_t)(n - done));
                if (w < 0) {
                    if (errno == EINTR) continue;
                    return -errno;
                }
                done += w;
            }
        }
        if (n < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        if (n == 0) break;
        copied += n;
    }
    return copied;
}

int opq_lease(int fd, int type) {
    return fcntl(fd, F_SETLEASE, type == 0 ? F_RDLCK : F_UNLCK) == 0 ? 0 : -errno;
}

void opq_ignore_lease_breaks(void) { signal(SIGIO, SIG_IGN); }

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <sys/socket.h>

/// A process group of its own, the signal mask emptied and every signal at its default: how the daemon starts a
/// command's leader (the daemon ignores or blocks some signals). 0 or an error number.
static int leader_attributes(posix_spawnattr_t *attr) {
    sigset_t empty, all;
    sigemptyset(&empty);
    sigfillset(&all);
    int err = posix_spawnattr_setflags(attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    if (err == 0) err = posix_spawnattr_setpgroup(attr, 0);
    if (err == 0) err = posix_spawnattr_setsigmask(attr, &empty);
    if (err == 0) err = posix_spawnattr_setsigdefault(attr, &all);
    return err;
}

/// A started leader's pid and pidfd (close-on-exec) stored, 0; without a pidfd its exit cannot be watched, so it is
/// killed and reaped, and -errno returned.
static int watched(pid_t pid, pid_t *pid_out, int *pidfd_out) {
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pidfd < 0) {
        int e = errno;
        kill(-pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return -e;
    }
    *pid_out = pid;
    *pidfd_out = pidfd;
    return 0;
}

// CShims.h, opq_spawn: why a thread that starts children leaves SIGCHLD unblocked.
static void unblock_child_signal(void) {
    sigset_t child;
    sigemptyset(&child);
    sigaddset(&child, SIGCHLD);
    pthread_sigmask(SIG_UNBLOCK, &child, NULL);
}

int opq_spawn(const char *path, char *const argv[], char *const envp[], const char *cwd,
              int stdout_fd, int stderr_fd, pid_t *pid_out, int *pidfd_out) {
    unblock_child_signal();
    posix_spawnattr_t attr;
    posix_spawn_file_actions_t actions;
    int err = posix_spawnattr_init(&attr);
    if (err != 0) return -err;
    err = posix_spawn_file_actions_init(&actions);
    if (err != 0) { posix_spawnattr_destroy(&attr); return -err; }
    if (err == 0) err = leader_attributes(&attr);
    if (err == 0) err = posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    if (err == 0) err = stdout_fd >= 0 ? posix_spawn_file_actions_adddup2(&actions, stdout_fd, 1)
                                       : posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    if (err == 0) err = stderr_fd >= 0 ? posix_spawn_file_actions_adddup2(&actions, stderr_fd, 2)
                                       : posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
    if (err == 0 && cwd != NULL) err = posix_spawn_file_actions_addchdir_np(&actions, cwd);
    if (err == 0) err = posix_spawn_file_actions_addclosefrom_np(&actions, 3);
    pid_t pid = -1;
    if (err == 0) err = posix_spawn(&pid, path, &actions, &attr, argv, envp);
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    return err != 0 ? -err : watched(pid, pid_out, pidfd_out);
}

int opq_spawn_spare(const char *path, char *const argv[], int socket, pid_t *pid_out, int *pidfd_out) {
    unblock_child_signal();
    // Descriptor 3 is the socket's: moved above the standard ones first if it is 3 itself (dup2 onto itself would
    // keep its close-on-exec flag).
    int moved = -1;
    if (socket == 3) {
        moved = fcntl(socket, F_DUPFD_CLOEXEC, 10);
        if (moved < 0) return -errno;
        socket = moved;
    }
    posix_spawnattr_t attr;
    posix_spawn_file_actions_t actions;
    int err = posix_spawnattr_init(&attr);
    if (err != 0) { if (moved >= 0) close(moved); return -err; }
    err = posix_spawn_file_actions_init(&actions);
    if (err != 0) { posix_spawnattr_destroy(&attr); if (moved >= 0) close(moved); return -err; }
    err = leader_attributes(&attr);
    if (err == 0) err = posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    if (err == 0) err = posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    if (err == 0) err = posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
    if (err == 0) err = posix_spawn_file_actions_adddup2(&actions, socket, 3);
    if (err == 0) err = posix_spawn_file_actions_addclosefrom_np(&actions, 4);
    char *const no_environment[] = { NULL };
    pid_t pid = -1;
    if (err == 0) err = posix_spawn(&pid, path, &actions, &attr, argv, no_environment);
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    if (moved >= 0) close(moved);
    return err != 0 ? -err : watched(pid, pid_out, pidfd_out);
}

int opq_send_with_descriptors(int socket, const void *bytes, size_t length, int first, int second) {
    char control[CMSG_SPACE(2 * sizeof(int))];
    memset(control, 0, sizeof control);
    struct iovec part = { (void *)bytes, length };
    struct msghdr header = { .msg_iov = &part, .msg_iovlen = 1, .msg_control = control, .msg_controllen = sizeof control };
    struct cmsghdr *c = CMSG_FIRSTHDR(&header);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(2 * sizeof(int));
    int fds[2] = { first, second };
    memcpy(CMSG_DATA(c), fds, sizeof fds);
    ssize_t n;
    do n = sendmsg(socket, &header, MSG_NOSIGNAL); while (n < 0 && errno == EINTR);
    if (n < 0) return -errno;
    return (size_t)n == length ? 0 : -EMSGSIZE;
}

int opq_pidfd_open(pid_t pid) {
    int fd = (int)syscall(SYS_pidfd_open, pid, 0);
    return fd >= 0 ? fd : -errno;
}

int opq_seqpacket_pair(int fds[2]) {
    return socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) == 0 ? 0 : -errno;
}

int opq_pipe2(int fds[2], int flags) { return pipe2(fds, flags) == 0 ? 0 : -errno; }

#include <sys/epoll.h>

int opq_epoll_create(void) { int fd = epoll_create1(EPOLL_CLOEXEC); return fd >= 0 ? fd : -errno; }

int opq_epoll_add(int epfd, int fd, unsigned long long token) {
    struct epoll_event event = { .events = EPOLLIN, .data.u64 = token };
    return epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &event) == 0 ? 0 : -errno;
}

int opq_epoll_remove(int epfd, int fd) {
    return epoll_ctl(epfd, EPOLL_CTL_DEL, fd, NULL) == 0 ? 0 : -errno;
}

int opq_epoll_wait(int epfd, unsigned long long *tokens, int max, int timeout_ms) {
    struct epoll_event events[256];
    if (max > 256) max = 256;
    int n = epoll_wait(epfd, events, max, timeout_ms);
    if (n < 0) return -errno;
    for (int i = 0; i < n; i++) tokens[i] = events[i].data.u64;
    return n;
}

const char *opq_signal_name(int sig) { return sigabbrev_np(sig); }

int opq_process_policy(pid_t pid) { return sched_getscheduler(pid); }

const char *opq_dirent_name(const struct dirent *entry) {
    return entry->d_name;
}

int opq_spawn_actions_close_from(posix_spawn_file_actions_t *actions, int low) {
    return posix_spawn_file_actions_addclosefrom_np(actions, low);
}
