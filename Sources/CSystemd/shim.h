// libsystemd's journal and notification calls. The location macros of sd-journal.h are not used:
// Swift cannot expand them, so callers add CODE_FILE/CODE_LINE/CODE_FUNC fields themselves.
#define SD_JOURNAL_SUPPRESS_LOCATION 1
#include <sys/uio.h>
#include <systemd/sd-journal.h>
#include <systemd/sd-daemon.h>
