/*
 * standalone_main.c - runs a libFuzzer target without libFuzzer, so that the
 * targets are built and exercised in every build:
 *   fuzz_X FILE...             each file is one input (a seed corpus)
 *   fuzz_X --random N [SEED]   N pseudo-random inputs, reproducible by seed
 * With -Dfuzz=true and clang, the same targets link against libFuzzer
 * instead and this file is not used.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint64_t next(uint64_t *s)
{
    uint64_t z = (*s += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "--random") == 0) {
        long n = atol(argv[2]);
        const uint64_t first_seed = argc > 3 ? strtoull(argv[3], NULL, 0) : 1;
        uint64_t seed = first_seed;
        static uint8_t buf[4096];
        /* Inputs are mostly printable when the target wants text, so mix
         * raw bytes with bytes from a CSV-ish alphabet. */
        static const char alphabet[] = "0123456789abcdefx,:\nallocatefreeThreadTimeActionPointerSizeStream (nil)";
        for (long i = 0; i < n; i++) {
            size_t len = next(&seed) % sizeof buf;
            int textual = next(&seed) & 1;
            for (size_t k = 0; k < len; k++) {
                uint64_t r = next(&seed);
                buf[k] = textual ? (uint8_t)alphabet[r % (sizeof alphabet - 1)] : (uint8_t)r;
            }
            LLVMFuzzerTestOneInput(buf, len);
        }
        printf("%ld random inputs, seed %llu: no crash\n", n, (unsigned long long)first_seed);
        return 0;
    }
    for (int i = 1; i < argc; i++) {
        FILE *f = fopen(argv[i], "rb");
        if (!f) {
            perror(argv[i]);
            return 1;
        }
        static uint8_t buf[1 << 20];
        size_t len = fread(buf, 1, sizeof buf, f);
        fclose(f);
        LLVMFuzzerTestOneInput(buf, len);
    }
    printf("%d corpus inputs: no crash\n", argc - 1);
    return 0;
}
