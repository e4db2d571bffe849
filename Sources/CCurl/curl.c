#include "CCurl.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

struct opq_transfer {
    CURL *easy;
    uint64_t tag;
    int64_t max_bytes;
    int fd;
    int64_t size;
    int too_large;
    int write_errno;
    opq_network *allowed;
    size_t allowed_count;
    /// Addresses refused so far ("127.0.0.1 (loopback), ..."), and how many connections were let through.
    char refused[512];
    int opened;
    char error[CURL_ERROR_SIZE];
};

struct opq_multi {
    CURLM *multi;
};

int opq_curl_global_init(void) { return (int)curl_global_init(CURL_GLOBAL_DEFAULT); }

// The ranges refused unless download.allowNetworks opens them (SPEC §6), IPv4 ones in IPv4-mapped form.
#define V4(a, b, c, d, bits) {{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, a, b, c, d}, 96 + (bits)}
static const struct {
    opq_network network;
    const char *name;
} refused_ranges[] = {
    {V4(0, 0, 0, 0, 8), "unspecified"},
    {V4(127, 0, 0, 0, 8), "loopback"},
    {V4(10, 0, 0, 0, 8), "private"},
    {V4(172, 16, 0, 0, 12), "private"},
    {V4(192, 168, 0, 0, 16), "private"},
    {V4(100, 64, 0, 0, 10), "shared (carrier-grade NAT)"},
    {V4(169, 254, 0, 0, 16), "link-local"},
    {V4(224, 0, 0, 0, 4), "multicast"},
    {V4(255, 255, 255, 255, 32), "broadcast"},
    {{{0}, 128}, "unspecified"},
    {{{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, 128}, "loopback"},
    {{{0xfc}, 7}, "private"},
    {{{0xfe, 0x80}, 10}, "link-local"},
    {{{0xff}, 8}, "multicast"},
};
#undef V4

static int contains(const opq_network *network, const uint8_t address[16]) {
    int bits = network->prefix < 0 ? 0 : network->prefix > 128 ? 128 : network->prefix;
    int whole = bits / 8, rest = bits % 8;
    if (memcmp(network->address, address, (size_t)whole) != 0) return 0;
    if (rest == 0) return 1;
    uint8_t mask = (uint8_t)(0xff << (8 - rest));
    return (network->address[whole] & mask) == (address[whole] & mask);
}

int opq_address_allowed(const uint8_t address[16], const opq_network *allowed, size_t allowed_count, const char **range) {
    for (size_t i = 0; i < allowed_count; i++) {
        if (contains(&allowed[i], address)) return 1;
    }
    for (size_t i = 0; i < sizeof refused_ranges / sizeof refused_ranges[0]; i++) {
        if (contains(&refused_ranges[i].network, address)) {
            if (range) *range = refused_ranges[i].name;
            return 0;
        }
    }
    return 1;
}

// CURLOPT_OPENSOCKETFUNCTION: libcurl calls this with each address it is about to connect to (every
// address DNS gave, every redirect hop), so the check is on the address actually used.
static curl_socket_t open_checked(void *user, curlsocktype purpose, struct curl_sockaddr *address) {
    (void)purpose;
    opq_transfer *transfer = user;
    uint8_t mapped[16] = {0};
    char shown[INET6_ADDRSTRLEN] = "?";
    if (address->family == AF_INET && address->addrlen >= sizeof(struct sockaddr_in)) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)&address->addr;
        mapped[10] = mapped[11] = 0xff;
        memcpy(mapped + 12, &in->sin_addr, 4);
        inet_ntop(AF_INET, &in->sin_addr, shown, sizeof shown);
    } else if (address->family == AF_INET6 && address->addrlen >= sizeof(struct sockaddr_in6)) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)&address->addr;
        memcpy(mapped, &in6->sin6_addr, 16);
        inet_ntop(AF_INET6, &in6->sin6_addr, shown, sizeof shown);
    } else {
        return CURL_SOCKET_BAD; // http and https over anything but IP: not expected, not allowed
    }
    const char *range = "refused";
    if (!opq_address_allowed(mapped, transfer->allowed, transfer->allowed_count, &range)) {
        size_t used = strlen(transfer->refused);
        char entry[INET6_ADDRSTRLEN + 64];
        snprintf(entry, sizeof entry, "%s (%s)", shown, range);
        if (!strstr(transfer->refused, entry))
            snprintf(transfer->refused + used, sizeof transfer->refused - used, "%s%s", used ? ", " : "", entry);
        return CURL_SOCKET_BAD;
    }
    transfer->opened++;
    return socket(address->family, address->socktype | SOCK_CLOEXEC, address->protocol);
}

static size_t collect(char *data, size_t one, size_t count, void *user) {
    opq_transfer *transfer = user;
    size_t length = one * count;
    if (transfer->size + (int64_t)length > transfer->max_bytes) {
        transfer->too_large = 1;
        return 0; // aborts the transfer: CURLE_WRITE_ERROR
    }
    size_t offset = 0;
    while (offset < length) {
        ssize_t n = write(transfer->fd, data + offset, length - offset);
        if (n < 0) {
            if (errno == EINTR) continue;
            transfer->write_errno = errno;
            return 0;
        }
        offset += (size_t)n;
    }
    transfer->size += (int64_t)length;
    return length;
}

opq_transfer *opq_transfer_new(const char *url, int fd, int64_t max_bytes, long connect_timeout_ms, long timeout_ms,
                               long max_redirects, const opq_network *allowed, size_t allowed_count, uint64_t tag) {
    opq_transfer *transfer = calloc(1, sizeof *transfer);
    if (!transfer) return NULL;
    transfer->fd = -1;
    transfer->easy = curl_easy_init();
    if (allowed_count > 0) {
        transfer->allowed = calloc(allowed_count, sizeof *allowed);
        if (transfer->allowed) {
            memcpy(transfer->allowed, allowed, allowed_count * sizeof *allowed);
            transfer->allowed_count = allowed_count;
        }
    }
    if (!transfer->easy || (allowed_count > 0 && !transfer->allowed)) { opq_transfer_free(transfer); return NULL; }
    transfer->fd = fd;
    transfer->tag = tag;
    transfer->max_bytes = max_bytes;
    CURL *e = transfer->easy;
    curl_easy_setopt(e, CURLOPT_OPENSOCKETFUNCTION, open_checked);
    curl_easy_setopt(e, CURLOPT_OPENSOCKETDATA, transfer);
    curl_easy_setopt(e, CURLOPT_PROXY, ""); // not even from http_proxy: the address check must see the destination
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_PRIVATE, transfer);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, transfer);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, transfer->error);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(e, CURLOPT_MAXREDIRS, max_redirects);
    curl_easy_setopt(e, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)max_bytes);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, connect_timeout_ms);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(e, CURLOPT_ACCEPT_ENCODING, ""); // whatever libcurl can decode; maxBytes counts decoded bytes
    curl_easy_setopt(e, CURLOPT_USERAGENT, "opqueued/0.3");
    return transfer;
}

void opq_transfer_free(opq_transfer *transfer) {
    if (!transfer) return;
    if (transfer->easy) curl_easy_cleanup(transfer->easy);
    if (transfer->fd >= 0) close(transfer->fd);
    free(transfer->allowed);
    free(transfer);
}

uint64_t opq_transfer_tag(const opq_transfer *transfer) { return transfer->tag; }

int64_t opq_transfer_size(const opq_transfer *transfer) { return transfer->size; }

int opq_transfer_result(const opq_transfer *transfer, int curl_code, char *message, size_t message_size) {
    long status = 0;
    curl_easy_getinfo(transfer->easy, CURLINFO_RESPONSE_CODE, &status);
    if (transfer->too_large || curl_code == CURLE_FILESIZE_EXCEEDED) {
        snprintf(message, message_size, "the response is larger than maxBytes (%lld bytes)", (long long)transfer->max_bytes);
        return 1;
    }
    if (transfer->write_errno) {
        snprintf(message, message_size, "the download could not be stored: %s", strerror(transfer->write_errno));
        return 1;
    }
    if (curl_code != CURLE_OK && transfer->refused[0]) {
        // The address check refused every address tried (or some, and the others failed on their own).
        snprintf(message, message_size, "refused to connect to %s: download.allowNetworks does not open %s%s%s", transfer->refused,
                 strchr(transfer->refused, ',') ? "them" : "it", transfer->opened ? "; " : "",
                 transfer->opened ? (transfer->error[0] ? transfer->error : curl_easy_strerror((CURLcode)curl_code)) : "");
        return 1;
    }
    if (curl_code != CURLE_OK) {
        snprintf(message, message_size, "%s", transfer->error[0] ? transfer->error : curl_easy_strerror((CURLcode)curl_code));
        return 1;
    }
    if (status >= 400) {
        snprintf(message, message_size, "HTTP status %ld", status);
        return 1;
    }
    return 0;
}

opq_multi *opq_multi_new(void) {
    opq_multi *multi = calloc(1, sizeof *multi);
    if (!multi) return NULL;
    multi->multi = curl_multi_init();
    if (!multi->multi) { free(multi); return NULL; }
    return multi;
}

void opq_multi_free(opq_multi *multi) {
    if (!multi) return;
    curl_multi_cleanup(multi->multi);
    free(multi);
}

int opq_multi_add(opq_multi *multi, opq_transfer *transfer) { return (int)curl_multi_add_handle(multi->multi, transfer->easy); }
int opq_multi_remove(opq_multi *multi, opq_transfer *transfer) { return (int)curl_multi_remove_handle(multi->multi, transfer->easy); }

int opq_multi_run(opq_multi *multi, int timeout_ms) {
    int running = 0;
    CURLMcode code = curl_multi_perform(multi->multi, &running);
    if (code != CURLM_OK) return (int)code;
    return (int)curl_multi_poll(multi->multi, NULL, 0, timeout_ms, NULL);
}

void opq_multi_wakeup(opq_multi *multi) { curl_multi_wakeup(multi->multi); }

opq_transfer *opq_multi_next_done(opq_multi *multi, int *curl_code) {
    int left = 0;
    CURLMsg *message;
    while ((message = curl_multi_info_read(multi->multi, &left))) {
        if (message->msg != CURLMSG_DONE) continue;
        opq_transfer *transfer = NULL;
        curl_easy_getinfo(message->easy_handle, CURLINFO_PRIVATE, (char **)&transfer);
        *curl_code = (int)message->data.result;
        return transfer;
    }
    return NULL;
}
