// A spare supervisor's one message (see spare.c).
#ifndef OPQ_SUPERVISE_SPARE_H
#define OPQ_SUPERVISE_SPARE_H

struct spare_command {
    const char *path;
    char **argv;
};

/// Waits on `socket` for the daemon's message, then takes its descriptors as standard output and error, its
/// priority, working directory and environment (closing `socket`). 1: `command` is ready to run; 0: the daemon closed
/// the socket without a message (this spare is not needed); -1: the message cannot be followed (said on standard error).
int spare_receive(int socket, struct spare_command *command);

#endif
