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

/// An incremental decoder over PNG or JPEG bytes (which must stay mapped until it is closed): open reads the
/// header (signature, size, max_pixels, EXIF orientation) and nothing else; start chooses the JPEG DCT scale
/// and begins; read hands out the next `count` rows (RGB or RGBA, 8-bit, `width × channels` bytes each);
/// finish checks the trailer. An EXIF orientation other than 1 and an interlaced PNG are decoded whole in
/// start (their rows do not come out in order) and served from that buffer. After an error only close is allowed.
typedef struct opq_reader opq_reader;

/// `width`/`height`: the image as displayed (EXIF orientation applied), before any scaling.
int opq_reader_open(const uint8_t *data, size_t size, uint64_t max_pixels, opq_reader **reader, int *width, int *height,
                    char *message, size_t message_size);
/// Minimums (0 = none) for JPEG's scaled decoding, as displayed: the largest reduction 1/8 … 1 whose output keeps
/// width ≥ `min_width`, height ≥ `min_height` and the longest side ≥ `min_side`. PNG ignores them.
int opq_reader_start(opq_reader *reader, int min_width, int min_height, int min_side, int *width, int *height,
                     int *channels, char *message, size_t message_size);
int opq_reader_read(opq_reader *reader, uint8_t *pixels, int count, char *message, size_t message_size);
int opq_reader_finish(opq_reader *reader, char *message, size_t message_size);
void opq_reader_close(opq_reader *reader);

/// An incremental encoder writing to `fd` (duplicated; the caller still owns and closes `fd`), with the same
/// settings as opq_encode_png / opq_encode_jpeg, so the same rows give the same bytes. `png` 1: PNG, else JPEG.
typedef struct opq_writer opq_writer;
int opq_writer_open(int fd, int png, int width, int height, int channels, int quality, opq_writer **writer,
                    char *message, size_t message_size);
int opq_writer_write(opq_writer *writer, const uint8_t *pixels, int count, char *message, size_t message_size);
/// Ends the image and flushes it to the descriptor (no fsync).
int opq_writer_finish(opq_writer *writer, char *message, size_t message_size);
void opq_writer_close(opq_writer *writer);

void opq_free(void *pointer);

#endif
