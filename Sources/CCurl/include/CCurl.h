// CCurl: libcurl's multi interface for opqueued's downloads. curl_easy_setopt is variadic (Swift cannot
// call it), so transfers are configured here with typed arguments. The body is written to a file
// descriptor as it arrives, with the size bound enforced while streaming; every connection's address
// is checked against the network policy before libcurl connects (after DNS, at each redirect hop).
#ifndef OPQ_CCURL_H
#define OPQ_CCURL_H

#include <stddef.h>
#include <stdint.h>

typedef struct opq_transfer opq_transfer;
typedef struct opq_multi opq_multi;

/// A network in IPv6 form: an IPv4 address a.b.c.d is ::ffff:a.b.c.d and its prefix counts the 96
/// bits before it, so one network covers an IPv4 address and its IPv4-mapped IPv6 form alike.
typedef struct opq_network {
    uint8_t address[16];
    int prefix;
} opq_network;

/// Process-wide libcurl set-up; call once before any other function. Returns 0 or a CURLcode.
int opq_curl_global_init(void);

/// Whether a connection to `address` (16 bytes, IPv4 as IPv4-mapped) may be made: 1 when one of
/// `allowed` contains it or it is in none of the refused ranges (loopback, private, shared, link-local,
/// unspecified, multicast); 0 otherwise, with `*range` naming the refused range it is in.
int opq_address_allowed(const uint8_t address[16], const opq_network *allowed, size_t allowed_count, const char **range);

/// A transfer of `url` (http and https only, also after redirects; at most `max_redirects`), whose body
/// is written to `fd` (the transfer closes it when freed: pass a dup), failing once more than
/// `max_bytes` arrive (before the body when Content-Length says so), or after the timeouts. Connections
/// go only to addresses `opq_address_allowed` accepts with `allowed` (copied). No proxy is used (the
/// check would see the proxy's address, not the destination's). `tag` is the caller's. NULL when
/// libcurl cannot make a handle.
opq_transfer *opq_transfer_new(const char *url, int fd, int64_t max_bytes, long connect_timeout_ms, long timeout_ms,
                               long max_redirects, const opq_network *allowed, size_t allowed_count, uint64_t tag);
void opq_transfer_free(opq_transfer *transfer);
uint64_t opq_transfer_tag(const opq_transfer *transfer);
/// Bytes of the body written so far.
int64_t opq_transfer_size(const opq_transfer *transfer);
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
