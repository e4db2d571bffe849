// A model of the spool's commit, to compare ways of making a batch durable while journald writes to the same file
// system: batches of PER jobs, each a new folder with a 2 KB result.plist, renamed into place (as a publication),
// then made durable by one syncfs(2) (the daemon's way on file systems other than ext4), by `range` (what it does on
// ext4 with a journal: sync_file_range on every file, all started before any is waited for, then one fsync, of the
// folder the batch renamed into, which commits ext4's transaction), by an fdatasync of each file and folder in turn,
// or by the same fdatasyncs on THREADS threads at once (so that the file system can serve them with one commit).
// With RATE > 0 a child sends RATE entries a second to journald (a trivial job's fields) the whole time.
//
//   cc -O2 -o /tmp/syncmodel Benchmarks/anchors/syncmodel.c -lsystemd -lpthread
//   mkdir -p /var/tmp/sm && /tmp/syncmodel /var/tmp/sm syncfs|range|seq|par BATCHES PER THREADS RATE
//
// It prints the mean and worst time of a batch's sync. Put DIR on journald's file system (journalctl --header says
// where its files are) to see what the daemon's syncfs pays there.
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <systemd/sd-journal.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int fds[4096], isfile[4096];
static int count, next;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void *syncer(void *unused) {
    (void)unused;
    for (;;) {
        pthread_mutex_lock(&lock);
        int i = next++;
        pthread_mutex_unlock(&lock);
        if (i >= count) return NULL;
        fdatasync(fds[i]);
    }
}

static void journal_load(int rate) {
    double start = now();
    for (long sent = 0;;) {
        while (sent < (now() - start) * rate) {
            sd_journal_send("MESSAGE=job j operation o succeeded", "OPQ_EVENT=operation", "OPQ_JOB=job-%ld", sent,
                            "OPQ_OPERATION=o", "OPQ_STATE=succeeded", "OPQ_QUEUE=default", "OPQ_QOS=utility",
                            "PRIORITY=6", "SYSLOG_IDENTIFIER=opq-syncmodel", NULL);
            sent++;
        }
        usleep(1000);
    }
}

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: %s DIR syncfs|range|seq|par BATCHES PER THREADS RATE\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1], *mode = argv[2];
    int batches = atoi(argv[3]), per = atoi(argv[4]), threads = atoi(argv[5]), rate = atoi(argv[6]);
    if (per < 1 || per > 2000 || threads < 1 || threads > 64) return 2;
    pid_t load = rate > 0 ? fork() : 0;
    if (rate > 0 && load == 0) journal_load(rate);
    char data[2048], path[512], target[560];
    memset(data, 'x', sizeof data);
    int folder = open(dir, O_RDONLY | O_DIRECTORY);
    if (folder < 0) return 1;
    double total = 0, worst = 0;
    long job = 0;
    for (int b = 0; b < batches; b++) {
        count = 0;
        for (int k = 0; k < per; k++, job++) {
            snprintf(path, sizeof path, "%s/active-%ld", dir, job);
            mkdir(path, 0755);
            snprintf(target, sizeof target, "%s/result.plist", path);
            int fd = open(target, O_CREAT | O_WRONLY | O_TRUNC, 0644);
            if (fd < 0 || write(fd, data, sizeof data) != (ssize_t)sizeof data) return 1;
            snprintf(target, sizeof target, "%s/outbox-%ld", dir, job);
            rename(path, target);
            isfile[count] = 1;
            fds[count++] = fd;
            isfile[count] = 0;
            fds[count++] = open(target, O_RDONLY | O_DIRECTORY);
        }
        isfile[count] = 0;
        fds[count++] = dup(folder);
        double start = now();
        if (strcmp(mode, "syncfs") == 0) {
            syncfs(folder);
        } else if (strcmp(mode, "seq") == 0) {
            for (int i = 0; i < count; i++) fdatasync(fds[i]);
        } else if (strcmp(mode, "range") == 0) {
            for (int i = 0; i < count; i++)
                if (isfile[i]) sync_file_range(fds[i], 0, 0, SYNC_FILE_RANGE_WRITE);
            unsigned wait = SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER;
            for (int i = 0; i < count; i++)
                if (isfile[i]) sync_file_range(fds[i], 0, 0, wait);
            fsync(folder);
        } else {
            pthread_t pool[64];
            next = 0;
            for (int i = 0; i < threads; i++) pthread_create(&pool[i], NULL, syncer, NULL);
            for (int i = 0; i < threads; i++) pthread_join(pool[i], NULL);
        }
        double took = now() - start;
        total += took;
        if (took > worst) worst = took;
        for (int i = 0; i < count; i++) close(fds[i]);
        usleep(2000);
    }
    printf("%-6s %d jobs a batch, %d threads, %d entries/s: sync mean %.2f ms, worst %.2f ms\n", mode, per, threads,
           rate, total / batches * 1e3, worst * 1e3);
    if (load > 0) kill(load, SIGKILL);
    return 0;
}
