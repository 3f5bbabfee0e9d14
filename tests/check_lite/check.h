/* check.h (check_lite) - the part of Check's API (https://libcheck.github.io)
 * that baton's kernel and model suites use, for builds where Check itself
 * is not installed for the target (the aarch64 cross build, whose tests run
 * under qemu-user: CMakeLists.txt, BATON_CORE_ONLY).
 *
 * It behaves as Check does in its default fork mode: every test (every
 * iteration of a loop test) runs in a child process; a failed assertion
 * prints FILE:LINE and its message and ends the child, a test expecting a
 * signal passes only if the child dies of that signal, and a test that runs
 * past its case's timeout (Check's default 4 s, tcase_set_timeout, times
 * CK_TIMEOUT_MULTIPLIER) is killed and fails.  srunner_ntests_failed counts
 * the failures. */
#ifndef CHECK_H
#define CHECK_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef struct Suite Suite;
typedef struct TCase TCase;
typedef struct SRunner SRunner;
typedef void (*TFun)(int);

typedef struct TTest {
    const char *name;
    TFun fn;
    const char *file;
    int line;
} TTest;

enum print_output { CK_SILENT, CK_MINIMAL, CK_NORMAL, CK_VERBOSE, CK_ENV, CK_LAST };

Suite *suite_create(const char *name);
void suite_add_tcase(Suite *s, TCase *tc);
TCase *tcase_create(const char *name);
void tcase_set_timeout(TCase *tc, double timeout);
void _tcase_add_test(TCase *tc, const TTest *t, int signal, int start, int end);
SRunner *srunner_create(Suite *s);
void srunner_run_all(SRunner *sr, enum print_output print_mode);
int srunner_ntests_failed(SRunner *sr);
void srunner_free(SRunner *sr);

#define tcase_add_test(tc, tf) _tcase_add_test(tc, tf, 0, 0, 1)
#define tcase_add_test_raise_signal(tc, tf, signal) _tcase_add_test(tc, tf, signal, 0, 1)
#define tcase_add_loop_test(tc, tf, s, e) _tcase_add_test(tc, tf, 0, s, e)
#define tcase_add_loop_test_raise_signal(tc, tf, signal, s, e) _tcase_add_test(tc, tf, signal, s, e)

#define START_TEST(name)                                                      \
    static void name##_fn(int _i __attribute__((unused)));                    \
    static const TTest name##_ttest = {#name, name##_fn, __FILE__, __LINE__}; \
    static const TTest *name = &name##_ttest;                                 \
    static void name##_fn(int _i __attribute__((unused)))
#define END_TEST

/* prints FILE:LINE: the message (msg, a printf format, or else expr) and
 * ends the test's process */
void _ck_assert_failed(const char *file, int line, const char *expr, const char *msg, ...)
    __attribute__((noreturn));

#define ck_assert_msg(expr, ...) \
    ((expr) ? (void)0 : _ck_assert_failed(__FILE__, __LINE__, "Assertion '" #expr "' failed", ##__VA_ARGS__, NULL))
#define ck_assert(expr) ck_assert_msg(expr, NULL)
#define ck_abort_msg(...) _ck_assert_failed(__FILE__, __LINE__, "Failed", ##__VA_ARGS__, NULL)
#define ck_abort() ck_abort_msg(NULL)

#define _ck_assert_int(X, OP, Y)                                                                                   \
    do {                                                                                                           \
        intmax_t _ck_x = (X), _ck_y = (Y);                                                                         \
        ck_assert_msg(_ck_x OP _ck_y, "Assertion '%s' failed: %s == %jd, %s == %jd", #X " " #OP " " #Y, #X, _ck_x, \
                      #Y, _ck_y);                                                                                  \
    } while (0)
#define ck_assert_int_eq(X, Y) _ck_assert_int(X, ==, Y)
#define ck_assert_int_ne(X, Y) _ck_assert_int(X, !=, Y)
#define ck_assert_int_lt(X, Y) _ck_assert_int(X, <, Y)
#define ck_assert_int_le(X, Y) _ck_assert_int(X, <=, Y)
#define ck_assert_int_gt(X, Y) _ck_assert_int(X, >, Y)
#define ck_assert_int_ge(X, Y) _ck_assert_int(X, >=, Y)

#define _ck_assert_uint(X, OP, Y)                                                                                  \
    do {                                                                                                           \
        uintmax_t _ck_x = (X), _ck_y = (Y);                                                                        \
        ck_assert_msg(_ck_x OP _ck_y, "Assertion '%s' failed: %s == %ju, %s == %ju", #X " " #OP " " #Y, #X, _ck_x, \
                      #Y, _ck_y);                                                                                  \
    } while (0)
#define ck_assert_uint_eq(X, Y) _ck_assert_uint(X, ==, Y)
#define ck_assert_uint_ne(X, Y) _ck_assert_uint(X, !=, Y)
#define ck_assert_uint_lt(X, Y) _ck_assert_uint(X, <, Y)
#define ck_assert_uint_le(X, Y) _ck_assert_uint(X, <=, Y)
#define ck_assert_uint_gt(X, Y) _ck_assert_uint(X, >, Y)
#define ck_assert_uint_ge(X, Y) _ck_assert_uint(X, >=, Y)

#define _ck_assert_floating(X, OP, Y, TP)                                                                         \
    do {                                                                                                          \
        TP _ck_x = (X), _ck_y = (Y);                                                                              \
        ck_assert_msg(_ck_x OP _ck_y, "Assertion '%s' failed: %s == %.9Lg, %s == %.9Lg", #X " " #OP " " #Y, #X, \
                      (long double)_ck_x, #Y, (long double)_ck_y);                                                \
    } while (0)
#define ck_assert_float_eq(X, Y) _ck_assert_floating(X, ==, Y, float)
#define ck_assert_float_ne(X, Y) _ck_assert_floating(X, !=, Y, float)
#define ck_assert_float_lt(X, Y) _ck_assert_floating(X, <, Y, float)
#define ck_assert_float_le(X, Y) _ck_assert_floating(X, <=, Y, float)
#define ck_assert_float_gt(X, Y) _ck_assert_floating(X, >, Y, float)
#define ck_assert_float_ge(X, Y) _ck_assert_floating(X, >=, Y, float)
#define ck_assert_double_eq(X, Y) _ck_assert_floating(X, ==, Y, double)
#define ck_assert_double_ne(X, Y) _ck_assert_floating(X, !=, Y, double)
#define ck_assert_double_lt(X, Y) _ck_assert_floating(X, <, Y, double)
#define ck_assert_double_le(X, Y) _ck_assert_floating(X, <=, Y, double)
#define ck_assert_double_gt(X, Y) _ck_assert_floating(X, >, Y, double)
#define ck_assert_double_ge(X, Y) _ck_assert_floating(X, >=, Y, double)

/* strings: NULL is an error on either side, as in Check */
#define _ck_assert_str(X, OP, Y)                                                                                   \
    do {                                                                                                           \
        const char *_ck_x = (X), *_ck_y = (Y);                                                                     \
        ck_assert_msg(_ck_x && _ck_y && strcmp(_ck_x, _ck_y) OP 0, "Assertion '%s' failed: %s == \"%s\", %s == \"%s\"", \
                      #X " " #OP " " #Y, #X, _ck_x ? _ck_x : "(null)", #Y, _ck_y ? _ck_y : "(null)");              \
    } while (0)
#define ck_assert_str_eq(X, Y) _ck_assert_str(X, ==, Y)
#define ck_assert_str_ne(X, Y) _ck_assert_str(X, !=, Y)
#define ck_assert_str_lt(X, Y) _ck_assert_str(X, <, Y)
#define ck_assert_str_le(X, Y) _ck_assert_str(X, <=, Y)
#define ck_assert_str_gt(X, Y) _ck_assert_str(X, >, Y)
#define ck_assert_str_ge(X, Y) _ck_assert_str(X, >=, Y)

#define _ck_assert_mem(X, OP, Y, L)                                                                          \
    do {                                                                                                     \
        const void *_ck_x = (X), *_ck_y = (Y);                                                               \
        size_t _ck_l = (L);                                                                                  \
        ck_assert_msg(memcmp(_ck_x, _ck_y, _ck_l) OP 0, "Assertion '%s' failed (%zu bytes)", #X " " #OP " " #Y, \
                      _ck_l);                                                                                \
    } while (0)
#define ck_assert_mem_eq(X, Y, L) _ck_assert_mem(X, ==, Y, L)
#define ck_assert_mem_ne(X, Y, L) _ck_assert_mem(X, !=, Y, L)

#define _ck_assert_ptr(X, OP, Y)                                                                          \
    do {                                                                                                  \
        const void *_ck_x = (X), *_ck_y = (Y);                                                            \
        ck_assert_msg(_ck_x OP _ck_y, "Assertion '%s' failed: %s == %p, %s == %p", #X " " #OP " " #Y, #X, \
                      _ck_x, #Y, _ck_y);                                                                  \
    } while (0)
#define ck_assert_ptr_eq(X, Y) _ck_assert_ptr(X, ==, Y)
#define ck_assert_ptr_ne(X, Y) _ck_assert_ptr(X, !=, Y)
#define ck_assert_ptr_null(X) _ck_assert_ptr(X, ==, NULL)
#define ck_assert_ptr_nonnull(X) _ck_assert_ptr(X, !=, NULL)

#endif
