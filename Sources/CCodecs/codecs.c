// JPEG and PNG through libjpeg-turbo and libpng. Every libjpeg/libpng call that can fail runs under a
// setjmp in this file; the error (and warning) callbacks copy the library's message and longjmp back.
#include "CCodecs.h"

#include <stdio.h> // before jpeglib.h, which uses FILE
#include <jpeglib.h>
#include <jerror.h>
#include <png.h>
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>

void opq_free(void *pointer) { free(pointer); }

static void set_message(char *message, size_t size, const char *text) {
    if (message && size) snprintf(message, size, "%s", text);
}

/// Whether width × height exceeds max_pixels; if so, says so in `message`. Checked from the header, before
/// any pixel is allocated.
static int exceeds_max_pixels(uint64_t width, uint64_t height, uint64_t max_pixels, char *message, size_t message_size) {
    if (width * height <= max_pixels) return 0;
    char text[160];
    snprintf(text, sizeof text, "%llu×%llu pixels is more than maxPixels (%llu)", (unsigned long long)width,
             (unsigned long long)height, (unsigned long long)max_pixels);
    set_message(message, message_size, text);
    return 1;
}

// MARK: EXIF orientation

static unsigned read16(const uint8_t *p, int little) { return little ? (unsigned)(p[0] | p[1] << 8) : (unsigned)(p[0] << 8 | p[1]); }
static uint32_t read32(const uint8_t *p, int little) {
    return little ? (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24
                  : (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/// Tag 0x0112 of IFD0 in an APP1 "Exif" payload; 1 when absent or malformed.
static int exif_orientation(const uint8_t *data, size_t size) {
    if (size < 14 || memcmp(data, "Exif\0\0", 6) != 0) return 1;
    const uint8_t *tiff = data + 6;
    size_t n = size - 6;
    int little;
    if (tiff[0] == 'I' && tiff[1] == 'I') little = 1;
    else if (tiff[0] == 'M' && tiff[1] == 'M') little = 0;
    else return 1;
    if (read16(tiff + 2, little) != 42) return 1;
    uint32_t ifd = read32(tiff + 4, little);
    if (ifd > n || n - ifd < 2) return 1;
    unsigned count = read16(tiff + ifd, little);
    for (unsigned i = 0; i < count; i++) {
        size_t at = (size_t)ifd + 2 + (size_t)i * 12;
        if (at + 12 > n) return 1;
        if (read16(tiff + at, little) == 0x0112) {
            unsigned value = read16(tiff + at + 8, little);
            return value >= 1 && value <= 8 ? (int)value : 1;
        }
    }
    return 1;
}

/// Applies an EXIF orientation (2…8) to `image`, replacing its pixels.
static int orient(opq_image *image, int orientation) {
    if (orientation <= 1) return OPQ_CODEC_OK;
    int w = image->width, h = image->height, c = image->channels;
    int swap = orientation >= 5;
    int ow = swap ? h : w, oh = swap ? w : h;
    uint8_t *out = malloc((size_t)w * h * c);
    if (!out) return OPQ_CODEC_NO_MEMORY;
    for (int y = 0; y < oh; y++) {
        for (int x = 0; x < ow; x++) {
            int sx, sy;
            switch (orientation) {
            case 2: sx = w - 1 - x; sy = y; break;
            case 3: sx = w - 1 - x; sy = h - 1 - y; break;
            case 4: sx = x; sy = h - 1 - y; break;
            case 5: sx = y; sy = x; break;
            case 6: sx = y; sy = h - 1 - x; break;
            case 7: sx = w - 1 - y; sy = h - 1 - x; break;
            default: sx = w - 1 - y; sy = x; break; // 8
            }
            memcpy(out + ((size_t)y * ow + x) * c, image->pixels + ((size_t)sy * w + sx) * c, (size_t)c);
        }
    }
    free(image->pixels);
    image->pixels = out;
    image->width = ow;
    image->height = oh;
    return OPQ_CODEC_OK;
}

// MARK: JPEG

struct jpeg_failure {
    struct jpeg_error_mgr manager;
    jmp_buf jump;
    char *message;
    size_t message_size;
};

static void jpeg_fail(j_common_ptr info) {
    struct jpeg_failure *failure = (struct jpeg_failure *)info->err;
    char text[JMSG_LENGTH_MAX];
    (*info->err->format_message)(info, text);
    set_message(failure->message, failure->message_size, text);
    longjmp(failure->jump, 1);
}

/// Level -1 is a warning (corrupt data the library would paper over): an error here. Trace levels are ignored.
static void jpeg_message(j_common_ptr info, int level) {
    if (level < 0) jpeg_fail(info);
}

static void jpeg_silent(j_common_ptr info) { (void)info; }

/// The error manager of a (de)compression: errors, and warnings too, longjmp to the caller's setjmp.
static struct jpeg_error_mgr *jpeg_failure_init(struct jpeg_failure *failure, char *message, size_t message_size) {
    struct jpeg_error_mgr *manager = jpeg_std_error(&failure->manager);
    manager->error_exit = jpeg_fail;
    manager->emit_message = jpeg_message;
    manager->output_message = jpeg_silent;
    failure->message = message;
    failure->message_size = message_size;
    return manager;
}

int opq_encode_jpeg(const opq_image *image, int quality, uint8_t **out, size_t *out_size, char *message, size_t message_size) {
    struct jpeg_compress_struct info;
    struct jpeg_failure failure;
    unsigned char *volatile buffer = NULL;
    unsigned long length = 0;
    info.err = jpeg_failure_init(&failure, message, message_size);
    if (setjmp(failure.jump)) {
        jpeg_destroy_compress(&info);
        free(buffer);
        return OPQ_CODEC_CORRUPT;
    }
    jpeg_create_compress(&info);
    unsigned char *destination = NULL;
    jpeg_mem_dest(&info, &destination, &length);
    info.image_width = (JDIMENSION)image->width;
    info.image_height = (JDIMENSION)image->height;
    info.input_components = image->channels;
    info.in_color_space = image->channels == 4 ? JCS_EXT_RGBA : JCS_RGB; // libjpeg-turbo ignores the alpha byte
    jpeg_set_defaults(&info);
    jpeg_set_quality(&info, quality, TRUE);
    jpeg_start_compress(&info, TRUE);
    size_t stride = (size_t)image->width * image->channels;
    while (info.next_scanline < info.image_height) {
        JSAMPROW row = image->pixels + stride * info.next_scanline;
        jpeg_write_scanlines(&info, &row, 1);
    }
    jpeg_finish_compress(&info);
    buffer = destination;
    jpeg_destroy_compress(&info);
    *out = destination;
    *out_size = length;
    return OPQ_CODEC_OK;
}

// MARK: PNG

struct png_context {
    jmp_buf jump;
    char *message;
    size_t message_size;
    const uint8_t *data;
    size_t size;
    size_t position;
    // Writing.
    uint8_t *buffer;
    size_t length;
    size_t capacity;
};

static void png_fail(png_structp png, png_const_charp text) {
    struct png_context *context = png_get_error_ptr(png);
    set_message(context->message, context->message_size, text);
    longjmp(context->jump, 1);
}

/// Warnings are errors (a CRC error, a truncated chunk), except about colour profiles, which are metadata.
static void png_warn(png_structp png, png_const_charp text) {
    if (strstr(text, "iCCP") || strstr(text, "sRGB") || strstr(text, "profile")) return;
    png_fail(png, text);
}

static void png_read_memory(png_structp png, png_bytep out, size_t length) {
    struct png_context *context = png_get_io_ptr(png);
    if (length > context->size - context->position) png_error(png, "the data ends before the image does (truncated)");
    memcpy(out, context->data + context->position, length);
    context->position += length;
}

static void png_write_memory(png_structp png, png_bytep data, size_t length) {
    struct png_context *context = png_get_io_ptr(png);
    if (context->length + length > context->capacity) {
        size_t capacity = context->capacity ? context->capacity : 65536;
        while (capacity < context->length + length) capacity *= 2;
        uint8_t *grown = realloc(context->buffer, capacity);
        if (!grown) png_error(png, "out of memory for the encoded image");
        context->buffer = grown;
        context->capacity = capacity;
    }
    memcpy(context->buffer + context->length, data, length);
    context->length += length;
}

static void png_flush_memory(png_structp png) { (void)png; }

int opq_encode_png(const opq_image *image, uint8_t **out, size_t *out_size, char *message, size_t message_size) {
    struct png_context context = { .message = message, .message_size = message_size };
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &context, png_fail, png_fail);
    if (!png) { set_message(message, message_size, "libpng could not start"); return OPQ_CODEC_NO_MEMORY; }
    png_infop info = png_create_info_struct(png);
    if (!info || setjmp(context.jump)) {
        png_destroy_write_struct(&png, &info);
        free(context.buffer);
        return OPQ_CODEC_CORRUPT;
    }
    png_set_write_fn(png, &context, png_write_memory, png_flush_memory);
    png_set_IHDR(png, info, (png_uint_32)image->width, (png_uint_32)image->height, 8,
                 image->channels == 4 ? PNG_COLOR_TYPE_RGB_ALPHA : PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    size_t stride = (size_t)image->width * image->channels;
    for (int y = 0; y < image->height; y++) png_write_row(png, image->pixels + stride * y);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    *out = context.buffer;
    *out_size = context.length;
    return OPQ_CODEC_OK;
}

// MARK: Incremental decoding (rows on demand)

struct opq_reader {
    const uint8_t *data;
    size_t size;
    int is_png;
    int started, finished, failed;
    int orientation;                  // EXIF (JPEG only); 1 = as stored
    int width, height, channels;      // of the rows handed out (after scaling and orientation)
    int next_row;
    uint8_t *whole;                   // a materialised image (EXIF rotation or flip, interlaced PNG)
    png_bytep *rows;                  // row pointers while an interlaced PNG is read whole
    uint8_t *ink;                     // a CMYK or YCCK JPEG: one row as the library gives it (4 inks), made RGB
    int ink_inverted;                 // its inks stored inverted (an Adobe marker: Photoshop's and most others')
    struct jpeg_decompress_struct jpeg;
    struct jpeg_failure failure;
    int jpeg_created;
    png_structp png;
    png_infop info;
    struct png_context context;
};

/// The jump buffer the library's error callback returns to, with the caller's message buffer installed.
static jmp_buf *reader_jump(opq_reader *r, char *message, size_t message_size) {
    if (r->is_png) {
        r->context.message = message;
        r->context.message_size = message_size;
        return &r->context.jump;
    }
    r->failure.message = message;
    r->failure.message_size = message_size;
    return &r->failure.jump;
}

static int reader_misuse(char *message, size_t message_size, const char *what) {
    set_message(message, message_size, what);
    return OPQ_CODEC_CORRUPT;
}

void opq_reader_close(opq_reader *r) {
    if (!r) return;
    if (r->png) png_destroy_read_struct(&r->png, r->info ? &r->info : NULL, NULL);
    if (r->jpeg_created) jpeg_destroy_decompress(&r->jpeg);
    free(r->whole);
    free(r->rows);
    free(r->ink);
    free(r);
}

/// One JPEG row into `rgb`. A CMYK or YCCK JPEG (print work, as Photoshop saves it) comes from the library as four
/// inks, which libjpeg-turbo does not turn into RGB: here each channel is the paper left by its ink and black's,
/// (255 − C)(255 − K)/255 — what libvips and ImageMagick give such a file without a colour profile.
static void read_jpeg_row(opq_reader *r, uint8_t *rgb) {
    JSAMPROW row = r->ink ? r->ink : rgb;
    // The memory source never suspends: no row means the library gave up.
    if (jpeg_read_scanlines(&r->jpeg, &row, 1) != 1) ERREXIT(&r->jpeg, JERR_INPUT_EMPTY);
    if (!r->ink) return;
    for (int x = 0; x < r->width; x++) {
        const uint8_t *p = r->ink + 4 * (size_t)x;
        unsigned c = p[0], m = p[1], y = p[2], k = p[3];
        if (!r->ink_inverted) { c = 255 - c; m = 255 - m; y = 255 - y; k = 255 - k; }
        // c, m, y, k are now what each ink leaves of the paper (255: no ink).
        rgb[3 * (size_t)x] = (uint8_t)((c * k + 127) / 255);
        rgb[3 * (size_t)x + 1] = (uint8_t)((m * k + 127) / 255);
        rgb[3 * (size_t)x + 2] = (uint8_t)((y * k + 127) / 255);
    }
}

int opq_reader_open(const uint8_t *data, size_t size, uint64_t max_pixels, opq_reader **out, int *width, int *height,
                    char *message, size_t message_size) {
    *out = NULL;
    static const uint8_t png_signature[8] = { 0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n' };
    int is_png = size >= 8 && memcmp(data, png_signature, 8) == 0;
    int is_jpeg = size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF;
    if (!is_png && !is_jpeg) {
        set_message(message, message_size, "not a PNG or JPEG image (unknown signature)");
        return OPQ_CODEC_UNKNOWN;
    }
    opq_reader *r = calloc(1, sizeof *r);
    if (!r) { set_message(message, message_size, "out of memory for the decoder"); return OPQ_CODEC_NO_MEMORY; }
    r->data = data;
    r->size = size;
    r->is_png = is_png;
    r->orientation = 1;
    jmp_buf *jump = reader_jump(r, message, message_size);
    if (is_png) {
        r->context.data = data;
        r->context.size = size;
        r->png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &r->context, png_fail, png_warn);
        if (r->png) r->info = png_create_info_struct(r->png);
        if (!r->png || !r->info) {
            opq_reader_close(r);
            set_message(message, message_size, "libpng could not start");
            return OPQ_CODEC_NO_MEMORY;
        }
    } else {
        r->jpeg.err = jpeg_failure_init(&r->failure, message, message_size);
    }
    if (setjmp(*jump)) {
        opq_reader_close(r);
        return OPQ_CODEC_CORRUPT;
    }
    uint64_t w, h;
    if (is_png) {
        // Our own bound (maxPixels) applies, with its own message, instead of libpng's default 1,000,000 per side.
        png_set_user_limits(r->png, 0x7fffffffL, 0x7fffffffL);
        png_set_read_fn(r->png, &r->context, png_read_memory);
        png_read_info(r->png, r->info);
        w = png_get_image_width(r->png, r->info);
        h = png_get_image_height(r->png, r->info);
    } else {
        r->jpeg_created = 1;
        jpeg_create_decompress(&r->jpeg);
        jpeg_mem_src(&r->jpeg, data, (unsigned long)size);
        jpeg_save_markers(&r->jpeg, JPEG_APP0 + 1, 0xFFFF);
        jpeg_read_header(&r->jpeg, TRUE);
        w = r->jpeg.image_width;
        h = r->jpeg.image_height;
        for (jpeg_saved_marker_ptr marker = r->jpeg.marker_list; marker; marker = marker->next) {
            if (marker->marker == JPEG_APP0 + 1) {
                int found = exif_orientation(marker->data, marker->data_length);
                if (found != 1) { r->orientation = found; break; }
            }
        }
    }
    if (exceeds_max_pixels(w, h, max_pixels, message, message_size)) {
        opq_reader_close(r);
        return OPQ_CODEC_TOO_LARGE;
    }
    int swap = r->orientation >= 5;
    *width = (int)(swap ? h : w);
    *height = (int)(swap ? w : h);
    *out = r;
    return OPQ_CODEC_OK;
}

/// The DCT scale n/8 (n = 1…8) with the smallest n whose output keeps every requested minimum.
static unsigned jpeg_scale(unsigned w, unsigned h, int min_width, int min_height, int min_side) {
    unsigned longest = w > h ? w : h;
    for (unsigned n = 1; n < 8; n++) {
        if (min_side > 0 && (longest * n + 7) / 8 < (unsigned)min_side) continue;
        if (min_width > 0 && (w * n + 7) / 8 < (unsigned)min_width) continue;
        if (min_height > 0 && (h * n + 7) / 8 < (unsigned)min_height) continue;
        return n;
    }
    return 8;
}

int opq_reader_start(opq_reader *r, int min_width, int min_height, int min_side, int *width, int *height, int *channels,
                     char *message, size_t message_size) {
    if (r->failed || r->started) return reader_misuse(message, message_size, "the decoder was already started");
    r->started = 1;
    jmp_buf *jump = reader_jump(r, message, message_size);
    if (setjmp(*jump)) {
        r->failed = 1;
        return OPQ_CODEC_CORRUPT;
    }
    int whole;
    if (r->is_png) {
        png_structp png = r->png;
        png_infop info = r->info;
        int color = png_get_color_type(png, info), depth = png_get_bit_depth(png, info);
        if (depth == 16) png_set_scale_16(png); // rounds, where strip_16 would truncate
        if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
        if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
        if (png_get_valid(png, info, PNG_INFO_tRNS)) png_set_tRNS_to_alpha(png);
        if (color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
        int passes = png_set_interlace_handling(png);
        png_read_update_info(png, info);
        r->width = (int)png_get_image_width(png, info);
        r->height = (int)png_get_image_height(png, info);
        r->channels = png_get_channels(png, info);
        if ((r->channels != 3 && r->channels != 4) || png_get_rowbytes(png, info) != (size_t)r->width * r->channels)
            png_error(png, "unsupported PNG pixel layout");
        whole = passes > 1; // Adam7 hands out every row seven times: only a whole image can take them
    } else {
        int inks = r->jpeg.jpeg_color_space == JCS_CMYK || r->jpeg.jpeg_color_space == JCS_YCCK;
        r->jpeg.out_color_space = inks ? JCS_CMYK : JCS_RGB;
        if (min_width > 0 || min_height > 0 || min_side > 0) {
            // The minimums are for the image as displayed; a 90° orientation swaps the sides.
            int mw = r->orientation >= 5 ? min_height : min_width, mh = r->orientation >= 5 ? min_width : min_height;
            r->jpeg.scale_num = jpeg_scale(r->jpeg.image_width, r->jpeg.image_height, mw, mh, min_side);
            r->jpeg.scale_denom = 8;
        }
        jpeg_start_decompress(&r->jpeg);
        r->width = (int)r->jpeg.output_width;
        r->height = (int)r->jpeg.output_height;
        r->channels = r->jpeg.output_components;
        if (inks) {
            if (r->channels != 4) ERREXIT(&r->jpeg, JERR_CONVERSION_NOTIMPL);
            r->ink = malloc((size_t)r->width * 4);
            if (!r->ink) ERREXIT1(&r->jpeg, JERR_OUT_OF_MEMORY, 0);
            r->ink_inverted = r->jpeg.saw_Adobe_marker;
            r->channels = 3;
        }
        whole = r->orientation > 1; // every EXIF transform but "as stored" reorders rows or columns
    }
    if (whole) {
        size_t stride = (size_t)r->width * r->channels;
        r->whole = malloc(stride * (size_t)r->height);
        if (!r->whole) {
            r->failed = 1;
            set_message(message, message_size, "out of memory for the decoded image");
            return OPQ_CODEC_NO_MEMORY;
        }
        if (r->is_png) {
            r->rows = malloc(sizeof(png_bytep) * (size_t)r->height);
            if (!r->rows) png_error(r->png, "out of memory for the decoded image");
            for (int y = 0; y < r->height; y++) r->rows[y] = r->whole + stride * (size_t)y;
            png_read_image(r->png, r->rows);
            png_read_end(r->png, NULL);
        } else {
            while (r->jpeg.output_scanline < r->jpeg.output_height) read_jpeg_row(r, r->whole + stride * r->jpeg.output_scanline);
            jpeg_finish_decompress(&r->jpeg);
        }
        r->finished = 1;
        opq_image image = { .pixels = r->whole, .width = r->width, .height = r->height, .channels = r->channels };
        if (orient(&image, r->orientation) != OPQ_CODEC_OK) {
            r->failed = 1;
            set_message(message, message_size, "out of memory for the oriented image");
            return OPQ_CODEC_NO_MEMORY;
        }
        r->whole = image.pixels;
        r->width = image.width;
        r->height = image.height;
    }
    *width = r->width;
    *height = r->height;
    *channels = r->channels;
    return OPQ_CODEC_OK;
}

int opq_reader_read(opq_reader *r, uint8_t *pixels, int count, char *message, size_t message_size) {
    if (!r->started || r->failed) return reader_misuse(message, message_size, "the decoder is not running");
    if (count < 0 || count > r->height - r->next_row) return reader_misuse(message, message_size, "rows asked for past the end of the image");
    size_t stride = (size_t)r->width * r->channels;
    if (r->whole) {
        memcpy(pixels, r->whole + stride * (size_t)r->next_row, stride * (size_t)count);
        r->next_row += count;
        return OPQ_CODEC_OK;
    }
    jmp_buf *jump = reader_jump(r, message, message_size);
    if (setjmp(*jump)) {
        r->failed = 1;
        return OPQ_CODEC_CORRUPT;
    }
    for (int i = 0; i < count; i++) {
        uint8_t *row = pixels + stride * (size_t)i;
        if (r->is_png) {
            png_read_row(r->png, row, NULL);
        } else {
            read_jpeg_row(r, row);
        }
        r->next_row++;
    }
    return OPQ_CODEC_OK;
}

int opq_reader_finish(opq_reader *r, char *message, size_t message_size) {
    if (!r->started || r->failed) return reader_misuse(message, message_size, "the decoder is not running");
    if (r->finished) return OPQ_CODEC_OK;
    if (r->next_row != r->height) return reader_misuse(message, message_size, "the decoder was finished before its last row");
    jmp_buf *jump = reader_jump(r, message, message_size);
    if (setjmp(*jump)) {
        r->failed = 1;
        return OPQ_CODEC_CORRUPT;
    }
    // The trailer is checked too (a PNG's last CRCs, a JPEG's end marker): corrupt data fails even past the pixels.
    if (r->is_png) png_read_end(r->png, NULL);
    else jpeg_finish_decompress(&r->jpeg);
    r->finished = 1;
    return OPQ_CODEC_OK;
}

// MARK: Whole images

int opq_decode(const uint8_t *data, size_t size, uint64_t max_pixels, int min_side, opq_image *out, char *message, size_t message_size) {
    memset(out, 0, sizeof *out);
    opq_reader *r;
    int width, height, channels;
    int code = opq_reader_open(data, size, max_pixels, &r, &width, &height, message, message_size);
    if (code != OPQ_CODEC_OK) return code;
    code = opq_reader_start(r, 0, 0, min_side, &width, &height, &channels, message, message_size);
    uint8_t *pixels = NULL;
    if (code == OPQ_CODEC_OK && r->whole) {
        pixels = r->whole;
        r->whole = NULL;
    } else if (code == OPQ_CODEC_OK) {
        pixels = malloc((size_t)width * channels * (size_t)height);
        if (!pixels) {
            set_message(message, message_size, "out of memory for the decoded image");
            code = OPQ_CODEC_NO_MEMORY;
        }
        if (code == OPQ_CODEC_OK) code = opq_reader_read(r, pixels, height, message, message_size);
        if (code == OPQ_CODEC_OK) code = opq_reader_finish(r, message, message_size);
    }
    opq_reader_close(r);
    if (code != OPQ_CODEC_OK) {
        free(pixels);
        return code;
    }
    out->pixels = pixels;
    out->width = width;
    out->height = height;
    out->channels = channels;
    return OPQ_CODEC_OK;
}

// MARK: Incremental encoding (rows as they come, straight to a file)

struct opq_writer {
    int is_png;
    int failed, finished;
    FILE *file;
    int width, height, channels;
    int next_row;
    struct jpeg_compress_struct jpeg;
    struct jpeg_failure failure;
    int jpeg_created;
    png_structp png;
    png_infop info;
    struct png_context context;
};

static jmp_buf *writer_jump(opq_writer *w, char *message, size_t message_size) {
    if (w->is_png) {
        w->context.message = message;
        w->context.message_size = message_size;
        return &w->context.jump;
    }
    w->failure.message = message;
    w->failure.message_size = message_size;
    return &w->failure.jump;
}

void opq_writer_close(opq_writer *w) {
    if (!w) return;
    if (w->png) png_destroy_write_struct(&w->png, w->info ? &w->info : NULL);
    if (w->jpeg_created) jpeg_destroy_compress(&w->jpeg);
    if (w->file) fclose(w->file);
    free(w);
}

int opq_writer_open(int fd, int png, int width, int height, int channels, int quality, opq_writer **out,
                    char *message, size_t message_size) {
    *out = NULL;
    opq_writer *w = calloc(1, sizeof *w);
    if (!w) { set_message(message, message_size, "out of memory for the encoder"); return OPQ_CODEC_NO_MEMORY; }
    w->is_png = png;
    w->width = width;
    w->height = height;
    w->channels = channels;
    int copy = dup(fd); // the caller keeps its descriptor (to fsync and close it)
    w->file = copy >= 0 ? fdopen(copy, "wb") : NULL;
    if (!w->file) {
        if (copy >= 0) close(copy);
        free(w);
        set_message(message, message_size, "cannot open the output for writing");
        return OPQ_CODEC_NO_MEMORY;
    }
    setvbuf(w->file, NULL, _IOFBF, 1 << 16);
    jmp_buf *jump = writer_jump(w, message, message_size);
    if (png) {
        w->png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &w->context, png_fail, png_fail);
        if (w->png) w->info = png_create_info_struct(w->png);
        if (!w->png || !w->info) {
            opq_writer_close(w);
            set_message(message, message_size, "libpng could not start");
            return OPQ_CODEC_NO_MEMORY;
        }
    } else {
        w->jpeg.err = jpeg_failure_init(&w->failure, message, message_size);
    }
    if (setjmp(*jump)) {
        opq_writer_close(w);
        return OPQ_CODEC_CORRUPT;
    }
    // The same settings as the whole-image encoders: the same bytes come out.
    if (png) {
        png_init_io(w->png, w->file);
        png_set_IHDR(w->png, w->info, (png_uint_32)width, (png_uint_32)height, 8,
                     channels == 4 ? PNG_COLOR_TYPE_RGB_ALPHA : PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
                     PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
        png_write_info(w->png, w->info);
    } else {
        w->jpeg_created = 1;
        jpeg_create_compress(&w->jpeg);
        jpeg_stdio_dest(&w->jpeg, w->file);
        w->jpeg.image_width = (JDIMENSION)width;
        w->jpeg.image_height = (JDIMENSION)height;
        w->jpeg.input_components = channels;
        w->jpeg.in_color_space = channels == 4 ? JCS_EXT_RGBA : JCS_RGB; // libjpeg-turbo ignores the alpha byte
        jpeg_set_defaults(&w->jpeg);
        jpeg_set_quality(&w->jpeg, quality, TRUE);
        jpeg_start_compress(&w->jpeg, TRUE);
    }
    *out = w;
    return OPQ_CODEC_OK;
}

int opq_writer_write(opq_writer *w, const uint8_t *pixels, int count, char *message, size_t message_size) {
    if (w->failed || w->finished) { set_message(message, message_size, "the encoder is not running"); return OPQ_CODEC_CORRUPT; }
    if (count < 0 || count > w->height - w->next_row) { set_message(message, message_size, "rows written past the end of the image"); return OPQ_CODEC_CORRUPT; }
    jmp_buf *jump = writer_jump(w, message, message_size);
    if (setjmp(*jump)) {
        w->failed = 1;
        return OPQ_CODEC_CORRUPT;
    }
    size_t stride = (size_t)w->width * w->channels;
    for (int i = 0; i < count; i++) {
        JSAMPROW row = (JSAMPROW)(pixels + stride * (size_t)i);
        if (w->is_png) png_write_row(w->png, row);
        else jpeg_write_scanlines(&w->jpeg, &row, 1);
        w->next_row++;
    }
    return OPQ_CODEC_OK;
}

int opq_writer_finish(opq_writer *w, char *message, size_t message_size) {
    if (w->failed || w->finished || w->next_row != w->height) {
        set_message(message, message_size, "the encoder was finished before its last row");
        return OPQ_CODEC_CORRUPT;
    }
    jmp_buf *jump = writer_jump(w, message, message_size);
    if (setjmp(*jump)) {
        w->failed = 1;
        return OPQ_CODEC_CORRUPT;
    }
    if (w->is_png) png_write_end(w->png, NULL);
    else jpeg_finish_compress(&w->jpeg);
    w->finished = 1;
    if (fflush(w->file) != 0 || ferror(w->file)) {
        w->failed = 1;
        char text[160];
        snprintf(text, sizeof text, "writing the encoded image: %s", strerror(errno));
        set_message(message, message_size, text);
        return OPQ_CODEC_CORRUPT;
    }
    return OPQ_CODEC_OK;
}
