#pragma once

/// Linked into opqueued only. Before main runs, a constructor has opened /dev/null on any of descriptors 0-2 that
/// was closed (opq_open_standard_descriptors), and made SIGTERM, SIGINT, SIGHUP, SIGUSR1 and SIGUSR2 noted rather
/// than ending the process (opq_note_termination_signals): a stop or a reload that comes while the daemon starts —
/// even while the Swift runtime loads and the arguments are parsed — is kept for its service group. `--once` gives
/// them back their default actions (opq_default_termination_signals).
/// Called from main so that this object is linked (and its constructor run); does nothing.
void opq_start_linked(void);
