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

void opq_note_termination_signals(void) {
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = opq_note_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &action, NULL);
    sigaction(SIGINT, &action, NULL);
}

int opq_noted_termination_signal(void) { return opq_noted_signal; }

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
