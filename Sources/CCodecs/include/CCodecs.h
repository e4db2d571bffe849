// CCodecs: JPEG (libjpeg-turbo) and PNG (libpng) behind plain functions that return an error code and
// message. setjmp/longjmp and the libraries' error callbacks stay in C: Swift must never be unwound
// through. Warnings are errors (a truncated photo must not pass as a grey-filled one).
#ifndef OPQ_CCODECS_H
#define OPQ_CCODECS_H

#include <stddef.h>
#include <stdint.h>

enum {
    OPQ_CODEC_OK = 0,
    OPQ_CODEC_CORRUPT = 1,      // the codec refused the data; message says why
    OPQ_CODEC_TOO_LARGE = 2,    // width × height exceeds max_pixels (checked before pixels are allocated)
    OPQ_CODEC_UNKNOWN = 3,      // neither a PNG nor a JPEG signature
    OPQ_CODEC_NO_MEMORY = 4,
};

/// An 8-bit image, rows top to bottom, `channels` 3 (RGB) or 4 (RGBA), no padding. `pixels` is malloc'd.
typedef struct {
    uint8_t *pixels;
    int width;
    int height;
    int channels;
} opq_image;

/// Decodes PNG or JPEG bytes. `max_pixels` bounds width × height (as stored, before any scaling).
/// For JPEG, `min_side` > 0 asks for libjpeg-turbo's scaled decoding: the largest reduction (1/8 … 1)
/// that keeps the longest side at least `min_side`. EXIF orientation is applied.
/// Returns OPQ_CODEC_*; on failure `message` (of `message_size` bytes) says why.
int opq_decode(const uint8_t *data, size_t size, uint64_t max_pixels, int min_side, opq_image *out,
               char *message, size_t message_size);

/// Encodes to PNG or JPEG (`quality` 1…100; alpha is dropped for JPEG). `*out` is malloc'd.
int opq_encode_png(const opq_image *image, uint8_t **out, size_t *out_size, char *message, size_t message_size);
int opq_encode_jpeg(const opq_image *image, int quality, uint8_t **out, size_t *out_size, char *message, size_t message_size);

void opq_free(void *pointer);

#endif
