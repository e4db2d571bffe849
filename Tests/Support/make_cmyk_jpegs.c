// Writes two 64×48 CMYK JPEGs into the folder given, with libjpeg (ImageTests compiles and runs this): four vertical
// bands of 16 pixels, from the left: cyan ink alone, magenta and yellow (red), half black, no ink (white paper).
//   cmyk.jpg         the inks as amounts (0: none), no Adobe marker
//   cmyk-adobe.jpg   the inks inverted (255: none) under an Adobe marker, as Photoshop and most programs write them
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jpeglib.h>

static int write_cmyk(const char *path, int adobe) {
    FILE *file = fopen(path, "wb");
    if (!file) return 1;
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr e;
    c.err = jpeg_std_error(&e);
    jpeg_create_compress(&c);
    jpeg_stdio_dest(&c, file);
    c.image_width = 64;
    c.image_height = 48;
    c.input_components = 4;
    c.in_color_space = JCS_CMYK;
    jpeg_set_defaults(&c);
    c.write_Adobe_marker = adobe;
    jpeg_set_quality(&c, 95, TRUE);
    jpeg_start_compress(&c, TRUE);
    static const unsigned char bands[4][4] = { {255, 0, 0, 0}, {0, 255, 255, 0}, {0, 0, 0, 128}, {0, 0, 0, 0} };
    unsigned char row[64 * 4];
    while (c.next_scanline < c.image_height) {
        for (int x = 0; x < 64; x++) {
            for (int i = 0; i < 4; i++) row[4 * x + i] = adobe ? 255 - bands[x / 16][i] : bands[x / 16][i];
        }
        JSAMPROW p = row;
        jpeg_write_scanlines(&c, &p, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    return fclose(file) != 0;
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    char path[4096];
    snprintf(path, sizeof path, "%s/cmyk.jpg", argv[1]);
    if (write_cmyk(path, 0)) return 1;
    snprintf(path, sizeof path, "%s/cmyk-adobe.jpg", argv[1]);
    return write_cmyk(path, 1);
}
