// CShims: the few Linux calls Swift cannot make directly.
//
// `syscall(2)` is variadic, so Swift cannot call it; `gettid` and `ioprio_set` have no glibc
// wrapper on every distribution. Each function returns 0 or -errno and never aborts.
#ifndef OPQ_CSHIMS_H
#define OPQ_CSHIMS_H

#include <stdint.h>
#include <dirent.h>
#include <spawn.h>
#include <sys/types.h>
#include <sys/xattr.h>  /* setxattr/getxattr for Swift: the spool keeps claim records as attributes */

/// The calling thread's kernel id.
pid_t opq_gettid(void);

/// Sets the calling thread's scheduling to match a quality-of-service class.
/// `nice_value` is applied with setpriority(PRIO_PROCESS, tid); `idle` non-zero switches the thread
/// to SCHED_IDLE and the idle I/O class. Returns 0, or -errno of the first call that failed
/// (a lower priority than asked is kept when raising is not permitted).
int opq_set_thread_priority(int nice_value, int idle);

/// The calling thread's nice value and whether it runs SCHED_IDLE (for tests).
int opq_get_thread_nice(void);
int opq_thread_is_idle(void);

/// syncfs(2) on the file system holding `fd` (glibc declares it only under _GNU_SOURCE).
/// Returns 0 or -errno.
int opq_syncfs(int fd);

/// sync_file_range(2) over the whole of `fd`'s file: with `wait` 0 starts writing its dirty pages out; with 1 also
/// waits for what was under way and for what it wrote. Data only (no metadata, no disk cache flush). 0 or -errno.
int opq_write_out(int fd, int wait);

/// The magic number of the file system holding `fd` (statfs's f_type: 0xEF53 for ext2/3/4), or -errno.
long long opq_fs_type(int fd);

/// The name of a directory entry readdir(3) returned. Only the name's own bytes may be read: glibc packs entries
/// at their record length, so a whole `struct dirent` (its 256-byte d_name) read by value can run past the end
/// of readdir's buffer into an unmapped page (a crash seen on a spool's inbox with thousands of entries).
const char *opq_dirent_name(const struct dirent *entry);

/// posix_spawn_file_actions_addclosefrom_np (glibc 2.34; hidden from Swift by its feature macro): the child
/// closes every descriptor from `low` up. Returns 0 or an errno value.
int opq_spawn_actions_close_from(posix_spawn_file_actions_t *actions, int low);

/// rename(2) that fails with -EEXIST rather than replace `to` (renameat2 with RENAME_NOREPLACE, relative
/// to the folder open as `dirfd`). Returns 0 or -errno.
int opq_rename_noreplace(int dirfd, const char *from, const char *to);

/// Gives memory the allocator holds free back to the system (glibc malloc_trim; malloc.h is not in
/// Swift's Glibc module).
void opq_release_free_memory(void);

/// Fixes glibc's thresholds, which otherwise rise with the largest block freed (up to a 32 MB mmap
/// threshold and a 64 MB trim threshold per arena): blocks of 4 MB and more are mapped and unmapped on
/// their own, and an arena's free top is given back beyond 8 MB. A daemon that once decoded a big
/// image or parsed a big manifest then does not keep that memory resident in every arena.
void opq_tune_allocator(void);

/// Bytes the allocator has handed out and not had back (glibc mallinfo2, all arenas and mmapped
/// blocks): what the program holds, as against RSS, which also counts freed memory the allocator kept.
unsigned long long opq_heap_bytes_in_use(void);

/// Opens /dev/null on whichever of descriptors 0, 1 and 2 is closed (a program started with `>&-`, or by a careless
/// supervisor): otherwise the next descriptors opened — the runtime's epoll and timer descriptors, the spool's lock
/// or progress log, the control socket — would take those numbers, and what is written to standard output or
/// standard error (log lines, a command's report) would go into them. Called before anything else opens one.
void opq_open_standard_descriptors(void);

/// Until something else takes them, SIGTERM and SIGINT are noted instead of ending the process: the
/// daemon calls this first thing, and hands a noted signal to its service group once that has taken
/// them (a stop that comes while the daemon starts is then as graceful as a later one). SIGHUP, SIGUSR1
/// and SIGUSR2 are noted too (their default actions would end the process as well).
void opq_note_termination_signals(void);

/// The signal noted since `opq_note_termination_signals`, or 0.
int opq_noted_termination_signal(void);

/// Whether a SIGHUP came since `opq_note_termination_signals` (which also notes SIGHUP rather than letting its
/// default action end the process while it starts).
int opq_noted_hangup(void);

/// Which of SIGUSR1 (1) and SIGUSR2 (2) came since `opq_note_termination_signals`.
int opq_noted_user_signals(void);

/// Gives SIGTERM, SIGINT, SIGHUP, SIGUSR1 and SIGUSR2 back their default actions, then raises what was noted
/// meanwhile (`--once`, which has no service group to hand them to, ends as it would have).
void opq_default_termination_signals(void);

/// Copies from `in` to `out` (each at its current offset) until the end of `in` or `limit` bytes:
/// copy_file_range (no bytes through user space; shared extents where the file system can), falling
/// back to read/write where it cannot. Returns the bytes copied or -errno.
int64_t opq_copy_file(int in, int out, int64_t limit);

/// fcntl(F_SETLEASE) (glibc declares it only under _GNU_SOURCE): `type` 0 takes a read lease (fails with
/// -EAGAIN while anyone has the file open for writing; -EACCES for another user's file without
/// CAP_LEASE), 1 releases it. Returns 0 or -errno.
int opq_lease(int fd, int type);

/// Sets SIGIO to be ignored: a lease break signals the holder with SIGIO, whose default action ends
/// the process.
void opq_ignore_lease_breaks(void);

/// Starts a command for the daemon (SPEC §3.6) with posix_spawn(3), no shell: `path` with `argv` and
/// exactly `envp`, in its own process group (POSIX_SPAWN_SETPGROUP), working directory `cwd`, standard
/// input /dev/null, standard output and error on `stdout_fd`/`stderr_fd` (-1: /dev/null), every other
/// descriptor closed, signal mask empty and every signal at its default action (the daemon ignores or
/// blocks some). The child inherits the calling thread's nice value, scheduling policy and I/O priority
/// (Linux keeps them per thread): the daemon spawns from a worker thread of the operation's QoS.
/// On success stores the pid and a pidfd (pidfd_open, close-on-exec) and returns 0; else -errno
/// (an exec failure such as ENOENT or EACCES is reported here, as glibc's posix_spawn does).
/// Unblocks SIGCHLD in the calling thread (as `opq_spawn_spare` does): a child's end signals the thread that started
/// it (a spare's copies: the thread that started their factory, by CLONE_PARENT), and the kernel drops a SIGCHLD at
/// its default disposition only when that thread does not block it. libdispatch's threads block it: queued instead,
/// it woke the main thread (libdispatch's sigsuspend) and libdispatch's manager for every command. Children are waited
/// for by pidfd, never by the signal.
int opq_spawn(const char *path, char *const argv[], char *const envp[], const char *cwd,
              int stdout_fd, int stderr_fd, pid_t *pid_out, int *pidfd_out);

/// Starts a spare supervisor (SpareSupervisors.swift): `path` with `argv` and an empty environment, in its own process
/// group, standard streams /dev/null, `socket` as descriptor 3 and every other descriptor closed, signals as
/// `opq_spawn` sets them. Stores the pid and a pidfd; 0 or -errno.
int opq_spawn_spare(const char *path, char *const argv[], int socket, pid_t *pid_out, int *pidfd_out);

/// Sends one message of `length` bytes with two descriptors (SCM_RIGHTS) on a SOCK_SEQPACKET socket, without
/// SIGPIPE. 0, or -errno (-EPIPE: the other end is gone).
int opq_send_with_descriptors(int socket, const void *bytes, size_t length, int first, int second);

/// pidfd_open(2) of a child: the descriptor (close-on-exec), or -errno.
int opq_pidfd_open(pid_t pid);

/// A SOCK_SEQPACKET socketpair, both ends close-on-exec. 0 or -errno.
int opq_seqpacket_pair(int fds[2]);

/// pipe2(2) (declared by glibc only under _GNU_SOURCE). Returns 0 or -errno.
int opq_pipe2(int fds[2], int flags);

/// epoll for the daemon's command loop (struct epoll_event is packed, which Swift does not import
/// reliably): watch `fd` for input (level-triggered) under `token`; stop watching it; wait for up to
/// `max` tokens (`timeout_ms` -1: forever). Each returns 0 / a count, or -errno.
int opq_epoll_create(void);
int opq_epoll_add(int epfd, int fd, unsigned long long token);
int opq_epoll_remove(int epfd, int fd);
int opq_epoll_wait(int epfd, unsigned long long *tokens, int max, int timeout_ms);

/// A signal's abbreviation without "SIG" (sigabbrev_np), or NULL if unknown.
const char *opq_signal_name(int sig);

/// The scheduling policy (SCHED_OTHER 0, SCHED_IDLE 5, …) and nice value of a process, for tests.
int opq_process_policy(pid_t pid);

/// The command watchdog (docs/pending/issue-17-watchdog.md): a small process forked from the daemon that
/// SIGKILLs every command process group the daemon told it of when the daemon dies (however: kill -9, a
/// crash), and at a kill deadline the daemon did not renew (a node frozen past its cluster lease).
/// It runs only this file's C code after fork (system calls, no allocation, no locks), so it may be forked
/// from a process with threads; it starts a session of its own (setsid: no terminal job control, not in the
/// daemon's process group), ignores the terminal and termination signals (only SIGKILL, or the end of its
/// pipe, ends it), keeps no descriptor but its pipe, and names itself "opq-watchdog".
/// Messages are `struct opq_watchdog_message`, written whole (16 bytes, atomic on a pipe).
struct opq_watchdog_message {
    int32_t type;   /* OPQ_WATCHDOG_ADD, _REMOVE or _DEADLINE */
    int32_t pgid;   /* ADD and REMOVE: the process group */
    int64_t value;  /* DEADLINE: CLOCK_MONOTONIC nanoseconds, or -1 for none */
};
enum { OPQ_WATCHDOG_ADD = 1, OPQ_WATCHDOG_REMOVE = 2, OPQ_WATCHDOG_DEADLINE = 3 };

/// Forks the watchdog. On success stores the write end of its pipe (close-on-exec, non-blocking, so no
/// command inherits it and a stuck watchdog never blocks the daemon) and its pid, and returns 0; else -errno.
int opq_watchdog_start(int *write_fd_out, pid_t *pid_out);

/// Writes one message; 0, or -errno (-EAGAIN: the pipe is full; -EPIPE: the watchdog is gone).
int opq_watchdog_send(int fd, int type, pid_t pgid, int64_t value);

/// CLOCK_MONOTONIC in nanoseconds: the clock of kill deadlines.
int64_t opq_monotonic_ns(void);

/// 1 when the child `pid` has exited and is not yet reaped (waitid with WNOWAIT: it stays a zombie, so its
/// pid and process group id cannot be reused yet), 0 when it runs (only without `block`: with it, waits for
/// the exit), -errno on error.
int opq_child_exited(pid_t pid, int block);

#endif
