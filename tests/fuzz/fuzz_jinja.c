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
 * Linked with standalone.c it is a plain program that runs the same
 * function over the files and folders given on the command line: ctest runs
 * it over tests/data/chat_templates/ and tests/fuzz/jinja_crashes/ under
 * ASan and UBSan. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
