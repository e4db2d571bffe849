#pragma once

/// Linked into opqueued only. Before main runs, a constructor has made SIGTERM, SIGINT and SIGHUP noted rather
/// than ending the process (opq_note_termination_signals): a stop or a reload that comes while the daemon starts —
/// even while the Swift runtime loads and the arguments are parsed — is kept for its service group. `--once` gives
/// them back their default actions (opq_default_termination_signals).
/// Called from main so that this object is linked (and its constructor run); does nothing.
void opq_start_linked(void);
