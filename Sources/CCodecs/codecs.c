// JPEG and PNG through libjpeg-turbo and libpng. Every libjpeg/libpng call that can fail runs under a
// setjmp in this file; the error (and warning) callbacks copy the library's message and longjmp back.
#include "CCodecs.h"

#include <stdio.h> // before jpeglib.h, which uses FILE
#include <jpeglib.h>
#include <png.h>
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>

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

static int decode_jpeg(const uint8_t *data, size_t size, uint64_t max_pixels, int min_side, opq_image *out,
                       char *message, size_t message_size) {
    struct jpeg_decompress_struct info;
    struct jpeg_failure failure;
    uint8_t *volatile pixels = NULL;
    volatile int orientation = 1;
    info.err = jpeg_failure_init(&failure, message, message_size);
    if (setjmp(failure.jump)) {
        jpeg_destroy_decompress(&info);
        free(pixels);
        return OPQ_CODEC_CORRUPT;
    }
    jpeg_create_decompress(&info);
    jpeg_mem_src(&info, data, (unsigned long)size);
    jpeg_save_markers(&info, JPEG_APP0 + 1, 0xFFFF);
    jpeg_read_header(&info, TRUE);
    if (exceeds_max_pixels(info.image_width, info.image_height, max_pixels, message, message_size)) {
        jpeg_destroy_decompress(&info);
        return OPQ_CODEC_TOO_LARGE;
    }
    for (jpeg_saved_marker_ptr marker = info.marker_list; marker; marker = marker->next) {
        if (marker->marker == JPEG_APP0 + 1) {
            int found = exif_orientation(marker->data, marker->data_length);
            if (found != 1) { orientation = found; break; }
        }
    }
    info.out_color_space = JCS_RGB;
    if (min_side > 0) {
        unsigned longest = info.image_width > info.image_height ? info.image_width : info.image_height;
        unsigned num = 8;
        for (unsigned candidate = 1; candidate < 8; candidate++) {
            if ((longest * candidate + 7) / 8 >= (unsigned)min_side) { num = candidate; break; }
        }
        info.scale_num = num;
        info.scale_denom = 8;
    }
    jpeg_start_decompress(&info);
    size_t stride = (size_t)info.output_width * info.output_components;
    pixels = malloc(stride * info.output_height);
    if (!pixels) {
        set_message(message, message_size, "out of memory for the decoded image");
        jpeg_destroy_decompress(&info);
        return OPQ_CODEC_NO_MEMORY;
    }
    while (info.output_scanline < info.output_height) {
        JSAMPROW row = pixels + stride * info.output_scanline;
        jpeg_read_scanlines(&info, &row, 1);
    }
    jpeg_finish_decompress(&info);
    out->pixels = pixels;
    out->width = (int)info.output_width;
    out->height = (int)info.output_height;
    out->channels = info.output_components;
    jpeg_destroy_decompress(&info);
    int oriented = orient(out, orientation);
    if (oriented != OPQ_CODEC_OK) {
        free(out->pixels);
        out->pixels = NULL;
        set_message(message, message_size, "out of memory for the oriented image");
    }
    return oriented;
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

static int decode_png(const uint8_t *data, size_t size, uint64_t max_pixels, opq_image *out, char *message, size_t message_size) {
    struct png_context context = { .message = message, .message_size = message_size, .data = data, .size = size };
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &context, png_fail, png_warn);
    if (!png) { set_message(message, message_size, "libpng could not start"); return OPQ_CODEC_NO_MEMORY; }
    png_infop info = png_create_info_struct(png);
    uint8_t *volatile pixels = NULL;
    png_bytep *volatile rows = NULL;
    if (!info) { png_destroy_read_struct(&png, NULL, NULL); set_message(message, message_size, "libpng could not start"); return OPQ_CODEC_NO_MEMORY; }
    if (setjmp(context.jump)) {
        png_destroy_read_struct(&png, &info, NULL);
        free(pixels);
        free(rows);
        return OPQ_CODEC_CORRUPT;
    }
    // Our own bound (maxPixels) applies, with its own message, instead of libpng's default 1,000,000 per side.
    png_set_user_limits(png, 0x7fffffffL, 0x7fffffffL);
    png_set_read_fn(png, &context, png_read_memory);
    png_read_info(png, info);
    png_uint_32 width = png_get_image_width(png, info), height = png_get_image_height(png, info);
    if (exceeds_max_pixels(width, height, max_pixels, message, message_size)) {
        png_destroy_read_struct(&png, &info, NULL);
        return OPQ_CODEC_TOO_LARGE;
    }
    int color = png_get_color_type(png, info), depth = png_get_bit_depth(png, info);
    if (depth == 16) png_set_scale_16(png); // rounds, where strip_16 would truncate
    if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    if (png_get_valid(png, info, PNG_INFO_tRNS)) png_set_tRNS_to_alpha(png);
    if (color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    int channels = png_get_channels(png, info);
    size_t stride = (size_t)width * channels;
    if ((channels != 3 && channels != 4) || png_get_rowbytes(png, info) != stride) png_error(png, "unsupported PNG pixel layout");
    pixels = malloc(stride * height);
    rows = malloc(sizeof(png_bytep) * height);
    if (!pixels || !rows) png_error(png, "out of memory for the decoded image");
    for (png_uint_32 y = 0; y < height; y++) rows[y] = pixels + stride * y;
    png_read_image(png, rows);
    png_read_end(png, NULL);
    png_destroy_read_struct(&png, &info, NULL);
    free(rows);
    out->pixels = pixels;
    out->width = (int)width;
    out->height = (int)height;
    out->channels = channels;
    return OPQ_CODEC_OK;
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

// MARK: Either

int opq_decode(const uint8_t *data, size_t size, uint64_t max_pixels, int min_side, opq_image *out, char *message, size_t message_size) {
    memset(out, 0, sizeof *out);
    static const uint8_t png_signature[8] = { 0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n' };
    if (size >= 8 && memcmp(data, png_signature, 8) == 0) return decode_png(data, size, max_pixels, out, message, message_size);
    if (size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF) return decode_jpeg(data, size, max_pixels, min_side, out, message, message_size);
    set_message(message, message_size, "not a PNG or JPEG image (unknown signature)");
    return OPQ_CODEC_UNKNOWN;
}
