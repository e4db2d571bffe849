#include "CCurl.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct opq_transfer {
    CURL *easy;
    uint64_t tag;
    int64_t max_bytes;
    uint8_t *body;
    size_t size;
    size_t capacity;
    int too_large;
    char error[CURL_ERROR_SIZE];
};

struct opq_multi {
    CURLM *multi;
};

int opq_curl_global_init(void) { return (int)curl_global_init(CURL_GLOBAL_DEFAULT); }

static size_t collect(char *data, size_t one, size_t count, void *user) {
    opq_transfer *transfer = user;
    size_t length = one * count;
    if ((int64_t)(transfer->size + length) > transfer->max_bytes) {
        transfer->too_large = 1;
        return 0; // aborts the transfer: CURLE_WRITE_ERROR
    }
    if (transfer->size + length > transfer->capacity) {
        size_t capacity = transfer->capacity ? transfer->capacity : 65536;
        while (capacity < transfer->size + length) capacity *= 2;
        if ((int64_t)capacity > transfer->max_bytes + 1) capacity = (size_t)transfer->max_bytes + 1;
        uint8_t *grown = realloc(transfer->body, capacity);
        if (!grown) return 0;
        transfer->body = grown;
        transfer->capacity = capacity;
    }
    memcpy(transfer->body + transfer->size, data, length);
    transfer->size += length;
    return length;
}

opq_transfer *opq_transfer_new(const char *url, int64_t max_bytes, long connect_timeout_ms, long timeout_ms,
                               long max_redirects, uint64_t tag) {
    opq_transfer *transfer = calloc(1, sizeof *transfer);
    if (!transfer) return NULL;
    transfer->easy = curl_easy_init();
    if (!transfer->easy) { free(transfer); return NULL; }
    transfer->tag = tag;
    transfer->max_bytes = max_bytes;
    CURL *e = transfer->easy;
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
    curl_easy_cleanup(transfer->easy);
    free(transfer->body);
    free(transfer);
}

uint64_t opq_transfer_tag(const opq_transfer *transfer) { return transfer->tag; }

const uint8_t *opq_transfer_body(const opq_transfer *transfer, size_t *size) {
    *size = transfer->size;
    return transfer->body;
}

int opq_transfer_result(const opq_transfer *transfer, int curl_code, char *message, size_t message_size) {
    long status = 0;
    curl_easy_getinfo(transfer->easy, CURLINFO_RESPONSE_CODE, &status);
    if (transfer->too_large || curl_code == CURLE_FILESIZE_EXCEEDED) {
        snprintf(message, message_size, "the response is larger than maxBytes (%lld bytes)", (long long)transfer->max_bytes);
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
