// A spare supervisor's one message (see spare.c).
#ifndef OPQ_SUPERVISE_SPARE_H
#define OPQ_SUPERVISE_SPARE_H

#include <sys/types.h>

struct spare_command {
    const char *path;
    char **argv;
};

/// Waits on `socket` for the daemon's message, then takes its descriptors as standard output and error, its
/// priority, working directory and environment (closing `socket`). 1: `command` is ready to run; 0: the daemon closed
/// the socket without a message (this spare is not needed); -1: the message cannot be followed (said on standard error).
int spare_receive(int socket, struct spare_command *command);

/// The factory's loop on `socket` (descriptor 3): for each message carrying a spare's socket, makes a spare, a copy of
/// this process whose parent is this one's (the daemon), and answers with its pid (or -errno). Returns 0 in this process
/// when the daemon closes the socket; returns 1 in each spare, with its socket as descriptor 3 and `name` ("--factory",
/// in its command line) now reading "--spare".
int spare_factory(int socket, char *name);

#endif
