// libFuzzer harness for the C codec shim (Sources/CCodecs): any bytes → opq_decode (full size and scaled),
// and what decodes is encoded again to PNG and JPEG. AddressSanitizer catches every out-of-bounds access,
// use after free and leak; libjpeg/libpng errors must come back as codes, never as a crash or an exit.
// Built and run by `make fuzz-codecs` (clang's -fsanitize=fuzzer,address).
#include "CCodecs.h"
#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char message[256];
    for (int min_side = 0; min_side <= 16; min_side += 16) {
        opq_image image = {0};
        // 4M pixels: big enough for real photos, small enough that a forged header fails fast.
        if (opq_decode(data, size, 1 << 22, min_side, &image, message, sizeof message) != 0) continue;
        uint8_t *out = NULL;
        size_t out_size = 0;
        if (opq_encode_png(&image, &out, &out_size, message, sizeof message) == 0) opq_free(out);
        out = NULL;
        if (opq_encode_jpeg(&image, 75, &out, &out_size, message, sizeof message) == 0) opq_free(out);
        opq_free(image.pixels);
    }
    return 0;
}
