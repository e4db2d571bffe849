// CCurl: libcurl's multi interface for opqueued's downloads. curl_easy_setopt is variadic (Swift cannot
// call it), so transfers are configured here with typed arguments; the body is collected in C with the
// size bound enforced while streaming.
#ifndef OPQ_CCURL_H
#define OPQ_CCURL_H

#include <stddef.h>
#include <stdint.h>

typedef struct opq_transfer opq_transfer;
typedef struct opq_multi opq_multi;

/// Process-wide libcurl set-up; call once before any other function. Returns 0 or a CURLcode.
int opq_curl_global_init(void);

/// A transfer of `url` (http and https only, also after redirects; at most `max_redirects`), failing once
/// more than `max_bytes` arrive (before the body when Content-Length says so), or after the timeouts.
/// `tag` is the caller's. NULL when libcurl cannot make a handle.
opq_transfer *opq_transfer_new(const char *url, int64_t max_bytes, long connect_timeout_ms, long timeout_ms,
                               long max_redirects, uint64_t tag);
void opq_transfer_free(opq_transfer *transfer);
uint64_t opq_transfer_tag(const opq_transfer *transfer);
/// The body received so far (owned by the transfer).
const uint8_t *opq_transfer_body(const opq_transfer *transfer, size_t *size);
/// After completion: 0 on success (HTTP status < 400), else non-zero with `message` filled.
int opq_transfer_result(const opq_transfer *transfer, int curl_code, char *message, size_t message_size);

opq_multi *opq_multi_new(void);
void opq_multi_free(opq_multi *multi);
int opq_multi_add(opq_multi *multi, opq_transfer *transfer);
int opq_multi_remove(opq_multi *multi, opq_transfer *transfer);
/// Runs transfers, waiting up to `timeout_ms` for activity (or a wakeup). Returns 0 or a CURLMcode.
int opq_multi_run(opq_multi *multi, int timeout_ms);
/// Interrupts a waiting opq_multi_run from another thread.
void opq_multi_wakeup(opq_multi *multi);
/// A finished transfer and its CURLcode, or NULL when none is pending.
opq_transfer *opq_multi_next_done(opq_multi *multi, int *curl_code);

#endif
