// A spare supervisor's one message (see spare.c).
#ifndef OPQ_SUPERVISE_SPARE_H
#define OPQ_SUPERVISE_SPARE_H

#include <sys/types.h>

struct spare_command {
    const char *path;
    char **argv;
};

/// Waits on `socket` for the daemon's message, then takes its descriptors as standard output and error, its
/// priority, working directory and environment (`socket` stays open, close-on-exec). 1: `command` is ready to run; 0:
/// the daemon closed the socket without a message (this spare is not needed, or no longer); -1: the message cannot be
/// followed (said on standard error).
int spare_receive(int socket, struct spare_command *command);

/// The command and everything it started have ended with wait status `status`: lets go of its descriptors (standard
/// output and error become /dev/null) and its folder, then tells the daemon, in one message: 'x', the status and this
/// process's nice value as native ints, then 1 if it runs in SCHED_IDLE, else 0. 0 when sent: this process may be given
/// another command; -1: it must exit.
int spare_report(int socket, int status);

/// The factory's loop on `socket` (descriptor 3): for each message carrying a spare's socket, makes a spare, a copy of
/// this process whose parent is this one's (the daemon), and answers with its pid (or -errno). Returns 0 in this process
/// when the daemon closes the socket; returns 1 in each spare, with its socket as descriptor 3 and `name` ("--factory",
/// in its command line) now reading "--spare".
int spare_factory(int socket, char *name);

#endif
