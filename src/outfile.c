/* outfile.c - a file written whole or not at all (see outfile.h): the plan
 * dumps, the Chrome trace. */
#define _POSIX_C_SOURCE 200809L
#include "outfile.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

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
    if ((size_t)snprintf(o->tmp, sizeof o->tmp, "%s.tmp.XXXXXX", path) >= sizeof o->tmp) {
        snprintf(err, n_err, "%s: cannot write %s: the path is too long", path, what);
        return BT_ERR_IO;
    }
    const int fd = mkstemp(o->tmp);
    if (fd < 0) {
        snprintf(err, n_err, "%s: cannot write %s: %s", path, what, strerror(errno));
        return BT_ERR_IO;
    }
    /* mkstemp makes it 0600: a plain file's mode, as fopen would have */
    const mode_t mask = umask(0);
    umask(mask);
    if (fchmod(fd, 0666 & ~mask) != 0 || !(o->f = fdopen(fd, "w"))) {
        snprintf(err, n_err, "%s: cannot write %s: %s", path, what, strerror(errno));
        close(fd);
        unlink(o->tmp);
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
