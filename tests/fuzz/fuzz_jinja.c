/* fuzz_jinja.c - libFuzzer harness for the Jinja interpreter (src/text/jinja.c;
 * tests/fuzz/run_jinja.sh).
 *
 * An input is a template, optionally followed by a NUL and the context as
 * JSON (else a chat's context: messages with a tool call, tools,
 * add_generation_prompt, bos_token).  It is parsed from an exact-size heap
 * copy (so AddressSanitizer sees a read one byte past it) and, when it
 * parses, rendered under small bounds, so that a loop or a recursion ends in
 * its message quickly.  Whatever the input, the result is an output or one
 * message: never a crash, a leak or a hang.
 *
 * Built with -DBT_FUZZ_STANDALONE it is a plain program that runs the same
 * function over the files and folders given on the command line: ctest runs
 * it over tests/data/chat_templates/ and tests/fuzz/jinja_crashes/ under
 * ASan and UBSan. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "text/jinja.h"

static const char k_ctx[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hi\"},"
    " {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"a1b2c3d4e\", \"type\": \"function\","
    " \"function\": {\"name\": \"f\", \"arguments\": {\"x\": 1.5, \"y\": [true, null, \"s\"]}}}]},"
    " {\"role\": \"tool\", \"tool_call_id\": \"a1b2c3d4e\", \"content\": \"42\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}}],"
    " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t tn = nul ? (size_t)(nul - data) : size;
    char *src = malloc(tn ? tn : 1), *ctx = NULL;
    if (!src) return 0;
    memcpy(src, data, tn);
    if (nul) {
        size_t cn = size - tn - 1;
        if (!(ctx = malloc(cn + 1))) {
            free(src);
            return 0;
        }
        memcpy(ctx, nul + 1, cn);
        ctx[cn] = 0;
    }
    char err[512];
    bt_jinja *t;
    if (bt_jinja_parse(src, tn, &t, err, sizeof err) == BT_OK) {
        bt_jinja_opts o = {.now = 1735787045, .max_steps = 20000, .max_bytes = (size_t)32 << 20};
        char *out;
        size_t n;
        if (bt_jinja_render(t, ctx ? ctx : k_ctx, &o, &out, &n, err, sizeof err) == BT_OK) {
            if (strlen(out) > n) abort(); /* the length given is the text's */
            free(out);
        } else if (!err[0]) abort(); /* every failure says why */
        bt_jinja_free(t);
    } else if (!err[0]) abort();
    free(src);
    free(ctx);
    return 0;
}

#ifdef BT_FUZZ_STANDALONE
static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return 1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    size_t got = buf && n > 0 ? fread(buf, 1, (size_t)n, f) : 0;
    fclose(f);
    if (!buf) return 1;
    LLVMFuzzerTestOneInput(buf, got);
    free(buf);
    return 0;
}

int main(int argc, char **argv) {
    int files = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st)) continue;
        if (!S_ISDIR(st.st_mode)) {
            files += !run_file(argv[i]);
            continue;
        }
        DIR *d = opendir(argv[i]);
        for (struct dirent *e; d && (e = readdir(d));) {
            if (e->d_name[0] == '.') continue;
            char p[4096];
            snprintf(p, sizeof p, "%s/%s", argv[i], e->d_name);
            files += !run_file(p);
        }
        if (d) closedir(d);
    }
    printf("fuzz_jinja: %d inputs ran\n", files);
    return files ? 0 : 1;
}
#endif
