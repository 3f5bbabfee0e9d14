/* outfile.h - a file written whole or not at all: the text goes to a
 * temporary file beside the destination (PATH.tmp.XXXXXX) and is renamed
 * over PATH only once every byte is written and closed; on any failure the
 * temporary file is removed and PATH keeps what it had (or stays absent).
 * A PATH that exists and is no regular file (a symbolic link such as
 * /dev/stdout, a pipe, a terminal) is written directly, as it comes. */
#ifndef BATON_OUTFILE_H
#define BATON_OUTFILE_H

#include <stdio.h>

#include "baton/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

struct bt_outfile {
    FILE *f; /* write here between open and commit */
    const char *path;
    char tmp[4096]; /* empty: PATH is written directly */
};

/* Whether PATH can be written, found before any work goes into it: BT_OK, or
 * BT_ERR_IO and one of "the file name is empty", "PATH: is a directory",
 * "PATH: cannot write there: reason" in err.  For a PATH that is a regular
 * file or absent, a temporary file is made beside it and removed (the same
 * step bt_outfile_open and the GGUF writer take); a PATH that exists and is
 * no regular file is asked for write access as it is. */
enum bt_status bt_outfile_check(const char *path, char *err, size_t n_err);

/* BT_ERR_IO and "PATH: cannot write WHAT: reason" in err when the temporary
 * file cannot be made (o->f is then NULL and nothing needs undoing). */
enum bt_status bt_outfile_open(struct bt_outfile *o, const char *path, const char *what, char *err, size_t n_err);

/* Flush, close and rename into place.  BT_ERR_IO and the message when any
 * write failed (a full disk, a file size limit) or the rename did: nothing
 * is left behind. */
enum bt_status bt_outfile_commit(struct bt_outfile *o, const char *what, char *err, size_t n_err);

#ifdef __cplusplus
}
#endif

#endif
