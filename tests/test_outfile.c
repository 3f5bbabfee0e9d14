/* test_outfile.c - the file written whole or not at all (src/outfile.c):
 * its mode is what the user's umask gives any new file, and making it leaves
 * the process's umask alone, even for a moment, so another thread that
 * creates a file meanwhile gets its own mode. */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "outfile.h"
#include "baton/tensor.h"

static char DIR_[64];

static void make_dir(void) {
    snprintf(DIR_, sizeof DIR_, "/tmp/bt_outfile_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(DIR_));
}

static void remove_dir(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", DIR_);
    ck_assert_int_eq(system(cmd), 0);
}

/* Write "hello\n" to path through bt_outfile; its mode bits. */
static mode_t write_one(const char *path) {
    struct bt_outfile o;
    char err[256];
    ck_assert_msg(bt_outfile_open(&o, path, "the test", err, sizeof err) == BT_OK, "%s", err);
    fputs("hello\n", o.f);
    ck_assert_msg(bt_outfile_commit(&o, "the test", err, sizeof err) == BT_OK, "%s", err);
    struct stat sb;
    ck_assert_int_eq(stat(path, &sb), 0);
    ck_assert_int_eq((int)sb.st_size, 6);
    return sb.st_mode & 07777;
}

START_TEST(test_mode_follows_umask) {
    make_dir();
    const mode_t masks[] = {022, 027, 077, 0, 002};
    for (size_t i = 0; i < sizeof masks / sizeof masks[0]; i++) {
        char path[128];
        snprintf(path, sizeof path, "%s/f%zu", DIR_, i);
        umask(masks[i]);
        const mode_t got = write_one(path);
        ck_assert_msg(got == (0666 & ~masks[i]), "umask %03o: mode %03o, a new file gets %03o", (unsigned)masks[i],
                      (unsigned)got, (unsigned)(0666 & ~masks[i]));
        /* over an existing file too, and the umask is as it was */
        ck_assert_int_eq(write_one(path), 0666 & ~masks[i]);
        ck_assert_int_eq(umask(masks[i]), masks[i]);
    }
    remove_dir();
}
END_TEST

static atomic_int stop_, bad_, made_;

/* Create files with mode 0666 until told to stop: each must get 0644 under
 * umask 022; the writer once set the umask to 0 for a moment to read it. */
static void *creator(void *arg) {
    (void)arg;
    char path[128];
    for (int i = 0; !atomic_load(&stop_); i++) {
        snprintf(path, sizeof path, "%s/c/%d", DIR_, i % 64); /* another directory: no lock shared with the writer */
        unlink(path);
        const int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0666);
        if (fd < 0) continue;
        struct stat sb;
        if (fstat(fd, &sb) == 0 && (sb.st_mode & 07777) != 0644) atomic_store(&bad_, (int)(sb.st_mode & 07777));
        close(fd);
        atomic_fetch_add(&made_, 1);
    }
    return NULL;
}

START_TEST(test_umask_left_alone) {
    make_dir();
    umask(022);
    char sub[128];
    snprintf(sub, sizeof sub, "%s/c", DIR_);
    ck_assert_int_eq(mkdir(sub, 0755), 0);
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, creator, NULL), 0);
    char path[128];
    snprintf(path, sizeof path, "%s/out", DIR_);
    /* up to 2 s of writes (the old window was two system calls wide) */
    const double t0 = bt_now_s();
    do {
        for (int i = 0; i < 100; i++) ck_assert_int_eq(write_one(path), 0644);
    } while (!atomic_load(&bad_) && bt_now_s() - t0 < 2.0);
    atomic_store(&stop_, 1);
    pthread_join(th, NULL);
    ck_assert_int_gt(atomic_load(&made_), 0);
    ck_assert_msg(atomic_load(&bad_) == 0, "a file another thread created got mode %03o under umask 022",
                  (unsigned)atomic_load(&bad_));
    remove_dir();
}
END_TEST

int main(void) {
    Suite *s = suite_create("outfile");
    TCase *tc = tcase_create("outfile");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_mode_follows_umask);
    tcase_add_test(tc, test_umask_left_alone);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    const int f = srunner_ntests_failed(sr);
    srunner_free(sr);
    return f == 0 ? 0 : 1;
}
