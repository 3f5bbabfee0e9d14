/* outfile.c - a file written whole or not at all (see outfile.h): the plan
 * dumps, the Chrome trace. */
#define _POSIX_C_SOURCE 200809L
#include "outfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Create PATH.tmp.XXXXXX (a new name) for writing, with the mode any new
 * file gets: 0666 less the umask, which open applies itself.  mkstemp would
 * make it 0600, and setting the mode afterwards needs the umask, which can
 * only be read by setting it: another thread creating a file at that moment
 * would get the wrong mode.  The fd, or -1 (errno) or -2 (the name does not
 * fit in tmp). */
static int create_tmp(char *tmp, size_t n, const char *path) {
    static const char digits[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    static atomic_uint counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ ((uint64_t)getpid() << 16) ^ (uintptr_t)tmp;
    for (int attempt = 0; attempt < 100; attempt++) {
        /* splitmix64 over the seed and a counter: a fresh name each try */
        uint64_t z = x + 0x9e3779b97f4a7c15ull * (1 + atomic_fetch_add(&counter, 1));
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        char suffix[7];
        for (int i = 0; i < 6; i++, z /= 62) suffix[i] = digits[z % 62];
        suffix[6] = '\0';
        if ((size_t)snprintf(tmp, n, "%s.tmp.%s", path, suffix) >= n) return -2;
        const int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd >= 0 || errno != EEXIST) return fd;
    }
    return -1; /* errno EEXIST */
}

enum bt_status bt_outfile_check(const char *path, char *err, size_t n_err) {
    if (!path[0]) {
        snprintf(err, n_err, "the file name is empty");
        return BT_ERR_IO;
    }
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        snprintf(err, n_err, "%s: is a directory", path);
        return BT_ERR_IO;
    }
    if (lstat(path, &sb) == 0 && !S_ISREG(sb.st_mode)) {
        if (access(path, W_OK) != 0) {
            snprintf(err, n_err, "%s: cannot write there: %s", path, strerror(errno));
            return BT_ERR_IO;
        }
        return BT_OK;
    }
    char tmp[4096];
    const int fd = create_tmp(tmp, sizeof tmp, path);
    if (fd < 0) {
        snprintf(err, n_err, "%s: cannot write there: %s", path, fd == -2 ? "the path is too long" : strerror(errno));
        return BT_ERR_IO;
    }
    close(fd);
    unlink(tmp);
    return BT_OK;
}

enum bt_status bt_outfile_open(struct bt_outfile *o, const char *path, const char *what, char *err, size_t n_err) {
    memset(o, 0, sizeof *o);
    o->path = path;
    struct stat sb;
    if (lstat(path, &sb) == 0 && !S_ISREG(sb.st_mode)) {
        /* a link (/dev/stdout, whatever it points at), a pipe, a terminal:
         * renaming over it would replace the link or the device, so it is
         * written as it comes (o->tmp stays empty) */
        if (!(o->f = fopen(path, "w"))) {
            snprintf(err, n_err, "%s: cannot write %s: %s", path, what, strerror(errno));
            return BT_ERR_IO;
        }
        return BT_OK;
    }
    const int fd = create_tmp(o->tmp, sizeof o->tmp, path);
    if (fd < 0) {
        snprintf(err, n_err, "%s: cannot write %s: %s", path, what, fd == -2 ? "the path is too long" : strerror(errno));
        return BT_ERR_IO;
    }
    if (!(o->f = fdopen(fd, "w"))) {
        snprintf(err, n_err, "%s: cannot write %s: %s", path, what, strerror(errno));
        close(fd);
        unlink(o->tmp);
        o->tmp[0] = '\0';
        return BT_ERR_IO;
    }
    return BT_OK;
}

enum bt_status bt_outfile_commit(struct bt_outfile *o, const char *what, char *err, size_t n_err) {
    BT_ASSERT(o->f);
    int e = 0;
    errno = 0;
    if (fflush(o->f) != 0) e = errno ? errno : EIO;
    else if (ferror(o->f)) e = EIO; /* an earlier write failed */
    errno = 0;
    if (fclose(o->f) != 0 && !e) e = errno ? errno : EIO;
    o->f = NULL;
    if (!e && o->tmp[0] && rename(o->tmp, o->path) != 0) e = errno;
    if (e) {
        if (o->tmp[0]) unlink(o->tmp);
        snprintf(err, n_err, "%s: cannot write %s: %s", o->path, what, strerror(e));
        return BT_ERR_IO;
    }
    return BT_OK;
}
