// opqueued's first code: see COpqueuedStart.h.
#include "COpqueuedStart.h"
#include "CShims.h"

__attribute__((constructor)) static void opq_before_main(void) {
    opq_open_standard_descriptors();
    opq_note_termination_signals();
}

void opq_start_linked(void) {}
