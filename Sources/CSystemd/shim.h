// libsystemd's journal and notification calls. The location macros of sd-journal.h are not used:
// Swift cannot expand them, so callers add CODE_FILE/CODE_LINE/CODE_FUNC fields themselves.
#define SD_JOURNAL_SUPPRESS_LOCATION 1
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>
#include <systemd/sd-journal.h>
#include <systemd/sd-daemon.h>

/// sendmmsg's message header (struct mmsghdr is only declared with _GNU_SOURCE, which Swift's Glibc is built without).
struct opq_mmsghdr {
    struct msghdr msg_hdr;
    unsigned int msg_len;
};

/// Sends up to 64 datagrams, one buffer each, in one sendmmsg without blocking (JournalSocket): how many went,
/// or -errno for the first one.
static inline int opq_send_datagrams(int fd, const struct iovec *datagrams, unsigned int count) {
    struct opq_mmsghdr messages[64];
    if (count > 64) count = 64;
    memset(messages, 0, sizeof messages[0] * count);
    for (unsigned int i = 0; i < count; i++) {
        messages[i].msg_hdr.msg_iov = (struct iovec *)&datagrams[i];
        messages[i].msg_hdr.msg_iovlen = 1;
    }
    long sent = syscall(SYS_sendmmsg, fd, messages, count, MSG_DONTWAIT | MSG_NOSIGNAL);
    return sent < 0 ? -errno : (int)sent;
}
