/* check_lite.c - the runner of check_lite (check.h says what it is): a
 * suite's test cases in order, each test (and loop iteration) forked, its
 * end judged as Check judges it in fork mode. */
#define _GNU_SOURCE
#include "check.h"

#include <signal.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

struct ck_test {
    const TTest *t;
    int signal, start, end;
};

struct TCase {
    const char *name;
    double timeout; /* seconds */
    struct ck_test *tests;
    int n, cap;
    TCase *next;
};

struct Suite {
    const char *name;
    TCase *first, *last;
};

struct SRunner {
    Suite *s;
    int n_run, n_failed;
};

static void *ck_alloc(size_t n) {
    void *p = calloc(1, n);
    if (!p) {
        fprintf(stderr, "check_lite: out of memory\n");
        abort();
    }
    return p;
}

Suite *suite_create(const char *name) {
    Suite *s = ck_alloc(sizeof *s);
    s->name = name;
    return s;
}

void suite_add_tcase(Suite *s, TCase *tc) {
    if (s->last)
        s->last->next = tc;
    else
        s->first = tc;
    s->last = tc;
}

TCase *tcase_create(const char *name) {
    TCase *tc = ck_alloc(sizeof *tc);
    tc->name = name;
    const char *def = getenv("CK_DEFAULT_TIMEOUT");
    tc->timeout = def && *def ? atof(def) : 4.0;
    return tc;
}

void tcase_set_timeout(TCase *tc, double timeout) { tc->timeout = timeout; }

void _tcase_add_test(TCase *tc, const TTest *t, int signal, int start, int end) {
    if (tc->n == tc->cap) {
        tc->cap = tc->cap ? 2 * tc->cap : 16;
        struct ck_test *p = realloc(tc->tests, (size_t)tc->cap * sizeof *p);
        if (!p) {
            fprintf(stderr, "check_lite: out of memory\n");
            abort();
        }
        tc->tests = p;
    }
    tc->tests[tc->n++] = (struct ck_test){t, signal, start, end};
}

SRunner *srunner_create(Suite *s) {
    SRunner *sr = ck_alloc(sizeof *sr);
    sr->s = s;
    return sr;
}

void _ck_assert_failed(const char *file, int line, const char *expr, const char *msg, ...) {
    fprintf(stderr, "%s:%d: ", file, line);
    if (msg) {
        va_list ap;
        va_start(ap, msg);
        vfprintf(stderr, msg, ap);
        va_end(ap);
    } else {
        fputs(expr, stderr);
    }
    fputc('\n', stderr);
    fflush(NULL);
    _exit(1);
}

/* one iteration in a child; true when it ended as the test expects */
static bool run_one(const TCase *tc, const struct ck_test *ct, int i) {
    fflush(NULL);
    const pid_t pid = fork();
    if (pid < 0) {
        perror("check_lite: fork");
        return false;
    }
    if (pid == 0) {
        const char *mul = getenv("CK_TIMEOUT_MULTIPLIER");
        const double t = tc->timeout * (mul && *mul ? atof(mul) : 1.0);
        if (t > 0) alarm((unsigned)(t + 0.999));
        ct->t->fn(i);
        fflush(NULL);
        _exit(0);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0) {
    }
    const char *what = NULL;
    char buf[128];
    if (ct->signal) {
        if (WIFSIGNALED(st) && WTERMSIG(st) == ct->signal) return true;
        snprintf(buf, sizeof buf, "expected signal %d (%s)", ct->signal, strsignal(ct->signal));
        what = buf;
    } else if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
        return true;
    } else if (WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM) {
        what = "test timeout expired";
    } else if (WIFSIGNALED(st)) {
        snprintf(buf, sizeof buf, "received signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
        what = buf;
    } else {
        what = "failed";
    }
    fprintf(stderr, "%s:%d: %s: %s (iteration %d): %s\n", ct->t->file, ct->t->line, tc->name, ct->t->name, i, what);
    return false;
}

void srunner_run_all(SRunner *sr, enum print_output print_mode) {
    sr->n_run = sr->n_failed = 0;
    if (print_mode != CK_SILENT) printf("Running suite(s): %s\n", sr->s->name);
    for (const TCase *tc = sr->s->first; tc; tc = tc->next)
        for (int k = 0; k < tc->n; k++)
            for (int i = tc->tests[k].start; i < tc->tests[k].end; i++) {
                sr->n_run++;
                if (!run_one(tc, &tc->tests[k], i)) sr->n_failed++;
            }
    if (print_mode != CK_SILENT)
        printf("%d%%: Checks: %d, Failures: %d\n", sr->n_run ? 100 * (sr->n_run - sr->n_failed) / sr->n_run : 0,
               sr->n_run, sr->n_failed);
}

int srunner_ntests_failed(SRunner *sr) { return sr->n_failed; }

void srunner_free(SRunner *sr) {
    if (!sr) return;
    TCase *tc = sr->s->first;
    while (tc) {
        TCase *next = tc->next;
        free(tc->tests);
        free(tc);
        tc = next;
    }
    free(sr->s);
    free(sr);
}
