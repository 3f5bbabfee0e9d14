/* standalone.c - the harnesses of tests/fuzz/ as plain programs: main runs
 * LLVMFuzzerTestOneInput over every file named on the command line and every
 * file of every folder named there (their regression inputs and seeds), so
 * ctest runs them under ASan and UBSan without libFuzzer.  A name that does
 * not exist, a file that cannot be read, or no input at all is exit code 1;
 * a fault in the harness ends the program as it would end the fuzzer. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: cannot open\n", path);
        return 1;
    }
    size_t cap = 1 << 16, n = 0, k;
    uint8_t *b = malloc(cap);
    while (b && (k = fread(b + n, 1, cap - n, f)) > 0) {
        n += k;
        if (n == cap) {
            uint8_t *g = realloc(b, cap *= 2);
            if (!g) free(b);
            b = g;
        }
    }
    fclose(f);
    if (!b) {
        fprintf(stderr, "%s: out of memory\n", path);
        return 1;
    }
    LLVMFuzzerTestOneInput(b, n);
    free(b);
    return 0;
}

int main(int argc, char **argv) {
    int files = 0, bad = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "%s: not found\n", argv[i]);
            return 1;
        }
        if (!S_ISDIR(st.st_mode)) {
            bad |= run_file(argv[i]);
            files++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        if (!d) {
            fprintf(stderr, "%s: cannot open the folder\n", argv[i]);
            return 1;
        }
        for (struct dirent *e; (e = readdir(d));) {
            if (e->d_name[0] == '.') continue;
            char p[4096];
            snprintf(p, sizeof p, "%s/%s", argv[i], e->d_name);
            bad |= run_file(p);
            files++;
        }
        closedir(d);
    }
    const char *name = strrchr(argv[0], '/');
    printf("%s: %d inputs ran without a fault\n", name ? name + 1 : argv[0], files);
    return bad || files == 0;
}
