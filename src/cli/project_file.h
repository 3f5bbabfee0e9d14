/* project_file.h - reading the cluster file of `baton plan --project FILE`
 * (src/cli/project_file.c). */
#ifndef BATON_CLI_PROJECT_FILE_H
#define BATON_CLI_PROJECT_FILE_H

#include "model/random_model.h"
#include "project.h"

/* Fill c from the file and apply its model section to *model and *tokens (a
 * micro-batch's tokens), on top of what they hold.  measured_gflops: this machine's speed, for `speed:
 * measured`.  A message FILE:LINE:COLUMN: ... in err on failure. */
enum bt_status bt_cli_cluster_load(const char *path, double measured_gflops, struct bt_cluster *c,
                                   struct bt_random_model *model, long *tokens, char *err, size_t n);

#endif
