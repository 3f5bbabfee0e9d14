/* test_topology.c - topology files: every mistake a user can make is a small
 * YAML file written to a temporary folder, and the test asserts the exact
 * message the user sees ("FILE:LINE:COLUMN: what is wrong"); valid files load
 * with the right values; the files in configs/ load; check_world and
 * check_layers explain a mismatch. */
#include <check.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "topology.h"
#include "testutil.h"

static char g_dir[PATH_MAX]; /* temporary folder, one per test */
static char g_path[PATH_MAX + 16];

static void setup(void) {
    snprintf(g_dir, sizeof g_dir, "%s/baton-topo-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    ck_assert_ptr_nonnull(mkdtemp(g_dir));
    snprintf(g_path, sizeof g_path, "%s/t.yaml", g_dir);
}

static void teardown(void) {
    unlink(g_path);
    rmdir(g_dir);
}

static void write_file(const char *text) {
    FILE *f = fopen(g_path, "wb");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

/* Load text; expect BT_ERR_INVALID and err == "<path>:" + tail. */
static void expect_err(const char *text, const char *tail) {
    struct bt_topology t;
    char err[1024], want[PATH_MAX + 512];
    write_file(text);
    memset(&t, 0x5a, sizeof t);
    enum bt_status st = bt_topology_load(g_path, &t, err, sizeof err);
    snprintf(want, sizeof want, "%s:%s", g_path, tail);
    ck_assert_msg(st == BT_ERR_INVALID, "status %d for:\n%s\nerr: %s", st, text, err);
    ck_assert_str_eq(err, want);
    /* nothing half-initialised */
    ck_assert_ptr_null(t.hosts);
    ck_assert_ptr_null(t.ranks);
    ck_assert_ptr_null(t.path);
    ck_assert_int_eq(t.n_ranks, 0);
    bt_topology_free(&t);
}

static void load_ok(const char *text, struct bt_topology *t) {
    char err[1024] = "";
    write_file(text);
    enum bt_status st = bt_topology_load(g_path, t, err, sizeof err);
    ck_assert_msg(st == BT_OK, "load failed: %s", err);
}

/* A valid prefix: two hosts, used by most cases. */
#define HOSTS                                                                                      \
    "hosts:\n"                                                                                     \
    "  - name: cpu01\n"                                                                            \
    "    slots: 2\n"                                                                               \
    "  - name: gpu01\n"                                                                            \
    "    slots: 16\n"                                                                              \
    "    gpus: 8\n"
/* lines 1-6 are HOSTS; line 7 "ranks:" */
#define RANKS2                                                                                     \
    "ranks:\n"                                                                                     \
    "  - {rank: 0, host: cpu01, backend: cpu, threads: 2}\n"                                       \
    "  - {rank: 1, host: cpu01, backend: cpu}\n"

/* ---- files that cannot be read ---- */

START_TEST(test_missing_file) {
    struct bt_topology t;
    char err[PATH_MAX + 128], want[PATH_MAX + 128];
    snprintf(want, sizeof want, "%s/nope.yaml: cannot open: No such file or directory", g_dir);
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/nope.yaml", g_dir);
    ck_assert_int_eq(bt_topology_load(path, &t, err, sizeof err), BT_ERR_IO);
    ck_assert_str_eq(err, want);
    ck_assert_ptr_null(t.path);
}
END_TEST

START_TEST(test_directory) {
    struct bt_topology t;
    char err[512], want[PATH_MAX + 64];
    snprintf(want, sizeof want, "%s: cannot read: is a directory", g_dir);
    ck_assert_int_eq(bt_topology_load(g_dir, &t, err, sizeof err), BT_ERR_IO);
    ck_assert_str_eq(err, want);
}
END_TEST

START_TEST(test_empty) {
    const char *msg = "1:1: the file is empty; a topology needs at least hosts: and ranks: (see "
                      "configs/README.md)";
    expect_err("", msg);
    expect_err("# only a comment\n\n", msg);
}
END_TEST

/* ---- YAML syntax and structure ---- */

START_TEST(test_yaml_syntax) {
    expect_err("hosts:\n  - name: a\n   slots: 2\n",
               "3:4: invalid YAML: did not find expected '-' indicator (while parsing a block "
               "collection at 2:3)");
    expect_err("hosts: [a, b\nranks: []\n",
               "2:6: invalid YAML: did not find expected ',' or ']' (while parsing a flow "
               "sequence at 1:8)");
    expect_err("hosts:\n\t- name: a\n",
               "2:1: invalid YAML: found character that cannot start any token (while scanning "
               "for the next token at 2:1)");
    expect_err("hosts:\n  - name: a\xff\n",
               "2:12: invalid YAML: invalid leading UTF-8 octet (byte offset 18)");
}
END_TEST

START_TEST(test_two_documents) {
    expect_err(HOSTS RANKS2 "---\nhosts: []\n",
               "10:1: a second YAML document; a topology file holds one");
}
END_TEST

START_TEST(test_root_and_sections) {
    expect_err("- a\n- b\n", "1:1: expected a mapping with hosts, ranks, pipeline, transport and "
                             "mpi at the top level, got a list");
    expect_err(HOSTS, "1:1: missing key 'ranks' (a list saying where each MPI rank runs)");
    expect_err(RANKS2, "1:1: missing key 'hosts' (a list of the machines ranks run on)");
    expect_err("hosts: localhost\n" RANKS2,
               "1:8: hosts: expected a list of hosts, got 'localhost'");
    expect_err("hosts: []\n" RANKS2, "1:8: hosts: the list is empty; give at least one host");
    expect_err(HOSTS "ranks:\n", "7:7: ranks: expected a list of ranks, got nothing");
    expect_err(HOSTS "ranks: []\n", "7:8: ranks: the list is empty; give at least one rank");
    expect_err(HOSTS RANKS2 "pipeline: 4\n",
               "10:11: pipeline: expected a mapping with micro_batches, partition, pin, expert_groups, divide, "
               "expert_overlap or model, got '4'");
    expect_err(HOSTS "ranks:\n  - 0\n", "8:5: ranks[0]: expected a mapping with rank, host and "
                                        "backend, got '0'");
}
END_TEST

/* ---- keys ---- */

START_TEST(test_unknown_keys) {
    expect_err(HOSTS RANKS2 "pipline:\n  micro_batches: 2\n",
               "10:1: unknown key 'pipline' (allowed: hosts, ranks, pipeline, transport, mpi)");
    expect_err(
        HOSTS "ranks:\n  - {rank: 0, host: cpu01, backend: cpu, thread: 2}\n",
        "8:42: rank 0: unknown key 'thread' (allowed: rank, host, backend, threads, memory)");
    expect_err("hosts:\n  - name: a\n    slot: 2\n" RANKS2,
               "3:5: hosts[0]: unknown key 'slot' (allowed: name, slots, gpus, address, gpu_memory, model)");
    expect_err(HOSTS RANKS2 "mpi:\n  pml: ob1\n  btl: tcp\n",
               "12:3: mpi: unknown key 'btl' (allowed: pml, single_copy, extra_args)");
    expect_err(HOSTS RANKS2 "transport:\n  nccl: true\n",
               "11:3: transport: unknown key 'nccl' (allowed: host, device, edges)");
}
END_TEST

START_TEST(test_duplicate_key) {
    expect_err(HOSTS "ranks:\n  - rank: 0\n    host: cpu01\n    backend: cpu\n    host: gpu01\n",
               "11:5: rank 0: host: given twice (first at 9:5)");
    expect_err(HOSTS RANKS2 RANKS2, "10:1: ranks: given twice (first at 7:1)");
}
END_TEST

START_TEST(test_missing_keys) {
    expect_err("hosts:\n  - name: a\n" RANKS2,
               "2:5: host a: missing key 'slots' (process slots on the host, usually its cores)");
    expect_err("hosts:\n  - slots: 2\n" RANKS2,
               "2:5: hosts[0]: missing key 'name' (the host's name, used by ranks: host:)");
    expect_err(HOSTS "ranks:\n  - {host: cpu01, backend: cpu}\n",
               "8:5: ranks[0]: missing key 'rank' (this entry's MPI rank, 0..)");
    expect_err(HOSTS "ranks:\n  - {rank: 0, backend: cpu}\n",
               "8:5: rank 0: missing key 'host' (a name from hosts)");
    expect_err(HOSTS "ranks:\n  - {rank: 0, host: cpu01}\n",
               "8:5: rank 0: missing key 'backend' (cpu or cuda:N)");
}
END_TEST

/* ---- values ---- */

START_TEST(test_wrong_types) {
    expect_err(HOSTS "ranks:\n  - {rank: 0, host: cpu01, backend: cpu, threads: abc}\n",
               "8:51: rank 0: threads: expected an integer, got 'abc'");
    expect_err(HOSTS "ranks:\n  - {rank: 0, host: cpu01, backend: cpu, threads: 2.5}\n",
               "8:51: rank 0: threads: expected an integer, got '2.5'");
    expect_err(HOSTS "ranks:\n  - {rank: 0, host: cpu01, backend: cpu, threads: [1]}\n",
               "8:51: rank 0: threads: expected an integer, got a list");
    expect_err(HOSTS "ranks:\n  - {rank: x, host: cpu01, backend: cpu}\n",
               "8:12: ranks[0]: rank: expected an integer, got 'x'");
    expect_err("hosts:\n  - name: a\n    slots:\n" RANKS2,
               "3:11: host a: slots: expected an integer, got nothing");
    expect_err(HOSTS "ranks:\n  - {rank: 0, host: [cpu01], backend: cpu}\n",
               "8:21: rank 0: host: expected a string, got a list");
    expect_err(HOSTS RANKS2 "pipeline:\n  micro_batches: many\n",
               "11:18: pipeline.micro_batches: expected an integer, got 'many'");
    expect_err(HOSTS RANKS2 "pipeline:\n  partition: even\n",
               "11:14: pipeline.partition: expected auto or a list of layer counts (one per rank), "
               "got 'even'");
    expect_err(HOSTS RANKS2 "mpi:\n  pml: tcp\n", "11:8: mpi.pml: expected ucx or ob1, got 'tcp'");
    expect_err(HOSTS RANKS2 "mpi:\n  single_copy: xpmem\n",
               "11:16: mpi.single_copy: expected cma or none, got 'xpmem'");
    expect_err(HOSTS RANKS2 "mpi:\n  extra_args: --mca\n",
               "11:15: mpi.extra_args: expected a list of strings, got '--mca'");
    expect_err(HOSTS RANKS2 "transport:\n  host: tcp\n",
               "11:9: transport.host: expected mpi, got 'tcp'");
    expect_err(HOSTS RANKS2 "transport:\n  device: gloo\n",
               "11:11: transport.device: expected mpi or nccl, got 'gloo'");
    expect_err(HOSTS "ranks:\n  - {rank: 0, host: cpu01, backend: tpu}\n",
               "8:37: rank 0: backend: expected cpu or cuda:N, got 'tpu'");
    expect_err(HOSTS "ranks:\n  - {rank: 0, host: gpu01, backend: cuda}\n",
               "8:37: rank 0: backend \"cuda\": name the device, e.g. cuda:0");
    expect_err(HOSTS "ranks:\n  - {rank: 0, host: gpu01, backend: \"cuda:x\"}\n",
               "8:37: rank 0: backend \"cuda:x\": the device index must be an integer >= 0");
    expect_err("hosts:\n  - {name: \"a b\", slots: 1}\n" RANKS2,
               "2:12: hosts[0]: name: 'a b' is not a host name (letters, digits, '.', '_', '-')");
}
END_TEST

START_TEST(test_not_positive) {
    expect_err(HOSTS "ranks:\n  - {rank: 0, host: cpu01, backend: cpu, threads: 0}\n",
               "8:51: rank 0: threads: must be at least 1, got '0'");
    expect_err(HOSTS "ranks:\n  - {rank: 0, host: cpu01, backend: cpu, threads: -3}\n",
               "8:51: rank 0: threads: must be at least 1, got '-3'");
    expect_err("hosts:\n  - {name: a, slots: 0}\n" RANKS2,
               "2:22: host a: slots: must be at least 1, got '0'");
    expect_err("hosts:\n  - {name: a, slots: 1, gpus: -1}\n" RANKS2,
               "2:31: host a: gpus: must be at least 0, got '-1'");
    expect_err(HOSTS RANKS2 "pipeline:\n  micro_batches: 0\n",
               "11:18: pipeline.micro_batches: must be at least 1, got '0'");
    expect_err(HOSTS RANKS2 "pipeline:\n  micro_batches: 17\n",
               "11:18: pipeline.micro_batches: '17' is too large (at most 16)");
    expect_err(HOSTS RANKS2 "pipeline:\n  partition: [4, 0]\n",
               "11:18: pipeline.partition[1]: must be at least 1, got '0'");
    expect_err(HOSTS RANKS2 "pipeline:\n  partition: [4, -4]\n",
               "11:18: pipeline.partition[1]: must be at least 1, got '-4'");
    expect_err(HOSTS "ranks:\n  - {rank: 0, host: cpu01, backend: cpu, memory: 0GiB}\n",
               "8:50: rank 0: memory: must be more than 0 bytes, got '0GiB'");
    expect_err(HOSTS "ranks:\n  - {rank: 0, host: cpu01, backend: cpu, memory: -1GiB}\n",
               "8:50: rank 0: memory: expected a size like 16GiB (units B, KiB, MiB, GiB, TiB, "
               "KB, MB, GB, TB), got '-1GiB'");
    expect_err(HOSTS "ranks:\n  - {rank: 0, host: cpu01, backend: cpu, memory: 16gb}\n",
               "8:50: rank 0: memory: expected a size like 16GiB (units B, KiB, MiB, GiB, TiB, "
               "KB, MB, GB, TB), got '16gb'");
}
END_TEST

START_TEST(test_overflow) {
    expect_err(HOSTS
               "ranks:\n  - {rank: 0, host: cpu01, backend: cpu, threads: 99999999999999999999}\n",
               "8:51: rank 0: threads: '99999999999999999999' is too large (at most 4096)");
    expect_err(HOSTS
               "ranks:\n  - {rank: 0, host: cpu01, backend: cpu, threads: -99999999999999999999}\n",
               "8:51: rank 0: threads: must be at least 1, got '-99999999999999999999'");
    expect_err(HOSTS "ranks:\n  - {rank: 0, host: cpu01, backend: cpu, threads: 4097}\n",
               "8:51: rank 0: threads: '4097' is too large (at most 4096)");
    expect_err(HOSTS "ranks:\n  - {rank: 4294967296, host: cpu01, backend: cpu}\n",
               "8:12: rank 4294967296: rank: '4294967296' is too large (at most 2147483647)");
    expect_err("hosts:\n  - {name: a, slots: 2147483648}\n" RANKS2,
               "2:22: host a: slots: '2147483648' is too large (at most 1048576)");
    expect_err(HOSTS "ranks:\n  - {rank: 0, host: cpu01, backend: cpu, memory: 16777216TiB}\n",
               "8:50: rank 0: memory: '16777216TiB' is too large (at most 2^63-1 bytes)");
    expect_err(
        HOSTS "ranks:\n  - {rank: 0, host: cpu01, backend: cpu, memory: 99999999999999999999}\n",
        "8:50: rank 0: memory: '99999999999999999999' is too large (at most 2^63-1 bytes)");
    /* 2^63 bytes and above would become negative int64_t sizes */
    expect_err(HOSTS "ranks:\n  - {rank: 0, host: cpu01, backend: cpu, memory: 8388608TiB}\n",
               "8:50: rank 0: memory: '8388608TiB' is too large (at most 2^63-1 bytes)");
    expect_err(HOSTS "ranks:\n  - {rank: 0, host: cpu01, backend: cpu, memory: 9223372036854775808}\n",
               "8:50: rank 0: memory: '9223372036854775808' is too large (at most 2^63-1 bytes)");
    struct bt_topology t;
    load_ok(HOSTS "ranks:\n  - {rank: 0, host: cpu01, backend: cpu, memory: 9223372036854775807}\n", &t);
    ck_assert_uint_eq(t.ranks[0].memory, (uint64_t)INT64_MAX);
    bt_topology_free(&t);
    expect_err(
        HOSTS RANKS2 "pipeline:\n  partition: [2147483647, 1]\n",
        "11:14: pipeline.partition: layer counts add up to 2147483648, more than 2147483647");
    expect_err(HOSTS RANKS2 "pipeline:\n  partition: [2147483648, 1]\n",
               "11:15: pipeline.partition[0]: '2147483648' is too large (at most 2147483647)");
    expect_err(HOSTS "ranks:\n  - {rank: 0, host: gpu01, backend: \"cuda:99999999999999\"}\n",
               "8:37: rank 0: backend \"cuda:99999999999999\": host gpu01 has 8 GPUs (0-7)");
}
END_TEST

/* ---- limits checked before the work they bound ---- */

/* More ranks than the runtime runs (BT_SCHED_MAX_BACKENDS): refused at the
 * list, before any entry is read (so entry 17 being broken does not matter). */
START_TEST(test_rank_limit) {
    /* sized for the limit, whatever BT_SCHED_MAX_BACKENDS is */
    const size_t text_cap = 64 * (size_t)(BT_TOPO_MAX_RANKS + 2);
    char *text = malloc(text_cap);
    ck_assert_ptr_nonnull(text);
    int o = snprintf(text, text_cap, "hosts:\n  - {name: a, slots: 4}\nranks:\n");
    for (int r = 0; r <= BT_TOPO_MAX_RANKS; r++)
        o += snprintf(text + o, text_cap - (size_t)o, "  - {rank: %d, host: a, backend: %s}\n", r,
                      r == BT_TOPO_MAX_RANKS ? "broken" : "cpu");
    char tail[160];
    snprintf(tail, sizeof tail, "4:3: ranks: %d ranks, more than the %d baton runs (BT_SCHED_MAX_BACKENDS)",
             BT_TOPO_MAX_RANKS + 1, BT_TOPO_MAX_RANKS);
    expect_err(text, tail);
    /* exactly the limit loads */
    o = snprintf(text, text_cap, "hosts:\n  - {name: a, slots: 4}\nranks:\n");
    for (int r = 0; r < BT_TOPO_MAX_RANKS; r++)
        o += snprintf(text + o, text_cap - (size_t)o, "  - {rank: %d, host: a, backend: cpu}\n", r);
    struct bt_topology t;
    load_ok(text, &t);
    ck_assert_int_eq(t.n_ranks, BT_TOPO_MAX_RANKS);
    bt_topology_free(&t);
    free(text);
    /* hosts (their names are compared pairwise): refused at the list too */
    const size_t cap = 64 * (size_t)(BT_TOPO_MAX_HOSTS + 2);
    char *big = malloc(cap);
    ck_assert_ptr_nonnull(big);
    size_t k = (size_t)snprintf(big, cap, "hosts:\n");
    for (int h = 0; h <= BT_TOPO_MAX_HOSTS; h++) k += (size_t)snprintf(big + k, cap - k, "  - {name: h%d, slots: 1}\n", h);
    snprintf(big + k, cap - k, "ranks:\n  - {rank: 0, host: h0, backend: cpu}\n");
    snprintf(tail, sizeof tail, "2:3: hosts: %d hosts, more than the %d baton supports", BT_TOPO_MAX_HOSTS + 1,
             BT_TOPO_MAX_HOSTS);
    expect_err(big, tail);
    free(big);
}
END_TEST

/* Deep nesting makes libyaml quadratic: refused at the first level too deep,
 * quickly even for a million levels. */
START_TEST(test_nesting_limit) {
    char text[256];
    int o = snprintf(text, sizeof text, "hosts: ");
    for (int i = 0; i < BT_TOPO_MAX_DEPTH; i++) text[o++] = '[';
    text[o] = '\0';
    char tail[160];
    snprintf(tail, sizeof tail, "1:%d: lists and mappings nested more than %d deep (a topology needs 5)",
             7 + BT_TOPO_MAX_DEPTH, BT_TOPO_MAX_DEPTH);
    expect_err(text, tail);
    /* a million levels in a 1 MiB file: refused at once (seconds of libyaml before) */
    const size_t n = 1000000;
    char *big = malloc(n + 2);
    ck_assert_ptr_nonnull(big);
    memset(big, '[', n);
    big[n] = '\n';
    big[n + 1] = '\0';
    snprintf(tail, sizeof tail, "1:%d: lists and mappings nested more than %d deep (a topology needs 5)",
             BT_TOPO_MAX_DEPTH + 1, BT_TOPO_MAX_DEPTH);
    expect_err(big, tail);
    /* the deepest real file (transport.edges[i].ranks) loads */
    struct bt_topology t;
    load_ok(HOSTS "ranks:\n  - {rank: 0, host: gpu01, backend: \"cuda:0\"}\n"
                  "  - {rank: 1, host: gpu01, backend: \"cuda:1\"}\n"
                  "transport:\n  edges:\n    - {ranks: [0, 1], device: mpi}\n",
            &t);
    bt_topology_free(&t);
    free(big);
}
END_TEST

START_TEST(test_file_size_limit) {
    const size_t n = (size_t)BT_TOPO_MAX_FILE_BYTES + 1;
    char *big = malloc(n + 1);
    ck_assert_ptr_nonnull(big);
    memset(big, '#', n);
    big[n] = '\0';
    write_file(big);
    free(big);
    struct bt_topology t;
    char err[512], want[PATH_MAX + 160];
    snprintf(want, sizeof want, "%s: %zu bytes, more than the %d a topology file may have (BT_TOPO_MAX_FILE_BYTES)",
             g_path, n, BT_TOPO_MAX_FILE_BYTES);
    ck_assert_int_eq(bt_topology_load(g_path, &t, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, want);
    ck_assert_ptr_null(t.ranks);
}
END_TEST

/* ---- ranks ---- */

/* A CUDA rank plans with its own memory:, else its host's
 * gpu_memory:; a CPU rank only with its own. */
START_TEST(test_gpu_memory) {
    struct bt_topology t;
    load_ok("hosts:\n  - {name: g, slots: 4, gpus: 2, gpu_memory: 16GiB}\n"
            "ranks:\n  - {rank: 0, host: g, backend: \"cuda:0\", memory: 1GiB}\n"
            "  - {rank: 1, host: g, backend: \"cuda:1\"}\n  - {rank: 2, host: g, backend: cpu}\n",
            &t);
    ck_assert_uint_eq(t.hosts[0].gpu_memory, (uint64_t)16 << 30);
    ck_assert_uint_eq(bt_topology_rank_memory(&t, 0), (uint64_t)1 << 30);
    ck_assert_uint_eq(bt_topology_rank_memory(&t, 1), (uint64_t)16 << 30);
    ck_assert_uint_eq(bt_topology_rank_memory(&t, 2), 0);
    ck_assert_uint_eq(bt_topology_rank_memory(&t, 3), 0);
    bt_topology_free(&t);
    expect_err("hosts:\n  - {name: g, slots: 4, gpus: 2, gpu_memory: 0}\nranks:\n  - {rank: 0, host: g, backend: cpu}\n",
               "2:46: host g: gpu_memory: must be more than 0 bytes, got '0'");
}
END_TEST

START_TEST(test_duplicate_rank) {
    expect_err(HOSTS "ranks:\n  - {rank: 0, host: cpu01, backend: cpu}\n"
                     "  - {rank: 0, host: cpu01, backend: cpu}\n",
               "9:12: rank 0 is listed twice (first at 8:12)");
}
END_TEST

START_TEST(test_missing_rank) {
    expect_err(HOSTS "ranks:\n  - {rank: 0, host: cpu01, backend: cpu}\n"
                     "  - {rank: 2, host: cpu01, backend: cpu}\n",
               "9:12: rank 2: out of range: 2 ranks are listed, so they are numbered 0..1 (rank 1 "
               "is missing)");
    expect_err(HOSTS "ranks:\n  - {rank: 1, host: cpu01, backend: cpu}\n",
               "8:12: rank 1: out of range: 1 ranks are listed, so they are numbered 0..0 (rank 0 "
               "is missing)");
}
END_TEST

START_TEST(test_unknown_host) {
    expect_err(HOSTS "ranks:\n  - {rank: 0, host: gpu03, backend: cpu}\n",
               "8:21: rank 0: host 'gpu03' is not in hosts (known: cpu01, gpu01)");
    expect_err("hosts:\n  - {name: a, slots: 1}\n  - {name: a, slots: 2}\n" RANKS2,
               "3:12: hosts[1]: name: host 'a' is listed twice (first at 2:12)");
}
END_TEST

START_TEST(test_cuda_device) {
    expect_err(HOSTS "ranks:\n"
                     "  - {rank: 0, host: gpu01, backend: \"cuda:0\"}\n"
                     "  - {rank: 1, host: gpu01, backend: \"cuda:1\"}\n"
                     "  - {rank: 2, host: gpu01, backend: \"cuda:2\"}\n"
                     "  - {rank: 3, host: gpu01, backend: \"cuda:9\"}\n",
               "11:37: rank 3: backend \"cuda:9\": host gpu01 has 8 GPUs (0-7)");
    expect_err(HOSTS "ranks:\n  - {rank: 0, host: cpu01, backend: cuda:0}\n",
               "8:37: rank 0: backend \"cuda:0\": host cpu01 has no GPUs (gpus: 0)");
    expect_err("hosts:\n  - {name: g, slots: 4, gpus: 1}\nranks:\n  - {rank: 0, host: g, backend: "
               "cuda:1}\n",
               "4:33: rank 0: backend \"cuda:1\": host g has 1 GPU (0)");
    expect_err(
        HOSTS "ranks:\n"
              "  - {rank: 1, host: gpu01, backend: cuda:3}\n"
              "  - {rank: 0, host: gpu01, backend: cuda:2}\n"
              "  - {rank: 2, host: gpu01, backend: cuda:3}\n",
        "10:37: rank 2: backend \"cuda:3\": device 3 of host gpu01 is already used by rank 1 "
        "(at 8:37); one rank per GPU");
    expect_err(HOSTS "ranks:\n  - {rank: 0, host: gpu01, backend: cuda:0, threads: 4}\n",
               "8:45: rank 0: threads: only cpu ranks take threads (this rank is cuda:0)");
}
END_TEST

/* ---- pipeline, transport ---- */

START_TEST(test_partition_and_pins) {
    expect_err(HOSTS RANKS2 "pipeline:\n  partition: [8]\n",
               "11:14: pipeline.partition: 1 layer count for 2 ranks; give one count per rank (or "
               "auto)");
    expect_err(HOSTS RANKS2 "pipeline:\n  pin:\n    - {pattern: \"blk.0.*\", rank: 2}\n",
               "12:34: pipeline.pin[0]: rank: rank 2 does not exist (ranks are 0..1)");
    expect_err(HOSTS RANKS2 "pipeline:\n  pin:\n    - {rank: 1}\n",
               "12:7: pipeline.pin[0]: missing key 'pattern' (a glob on tensor names, e.g. "
               "\"blk.0.*\")");
    expect_err(HOSTS RANKS2 "pipeline:\n  pin:\n    - {pattern: \"\", rank: 1}\n",
               "12:17: pipeline.pin[0]: pattern: expected a string, got ''");
    expect_err(HOSTS RANKS2 "pipeline:\n  pin:\n    - {pattern: \"*_exps*\", rank: 1, compute: here}\n",
               "12:46: pipeline.pin[0]: compute: expected pinned or layer, got 'here'");
}
END_TEST

#define RANKS4                                                                                     \
    "ranks:\n"                                                                                     \
    "  - {rank: 0, host: gpu01, backend: cpu}\n"                                                   \
    "  - {rank: 1, host: gpu01, backend: cpu}\n"                                                   \
    "  - {rank: 2, host: gpu01, backend: cpu}\n"                                                   \
    "  - {rank: 3, host: gpu01, backend: cpu}\n"

/* pipeline.expert_groups: lists of ranks, the first running the layers */
START_TEST(test_expert_groups) {
    struct bt_topology t;
    load_ok(HOSTS RANKS4 "pipeline:\n  partition: [2, 0, 2, 0]\n  expert_groups: [[0, 1], [2, 3]]\n", &t);
    ck_assert_int_eq(t.pipeline.n_groups, 2);
    ck_assert_int_eq(t.pipeline.groups[1].n_ranks, 2);
    ck_assert_int_eq(t.pipeline.groups[1].ranks[0], 2);
    ck_assert_int_eq(t.pipeline.groups[1].ranks[1], 3);
    ck_assert_int_eq(t.pipeline.layers[1], 0);
    bt_topology_free(&t);
    load_ok(HOSTS RANKS4 "pipeline:\n  expert_groups: [[0, 1, 2, 3]]\n", &t);
    ck_assert_int_eq(t.pipeline.groups[0].n_ranks, 4);
    ck_assert(!t.pipeline.divide_dense);
    bt_topology_free(&t);
    /* divide: all: the groups divide their dense products' rows too */
    load_ok(HOSTS RANKS4 "pipeline:\n  divide: all\n  expert_groups: [[0, 1, 2, 3]]\n", &t);
    ck_assert(t.pipeline.divide_dense);
    bt_topology_free(&t);
    load_ok(HOSTS RANKS4 "pipeline:\n  expert_groups: [[0, 1, 2, 3]]\n  divide: experts\n", &t);
    ck_assert(!t.pipeline.divide_dense);
    bt_topology_free(&t);
    /* divide: tokens: the dense products by a prompt's tokens, their weights whole on every rank */
    load_ok(HOSTS RANKS4 "pipeline:\n  expert_groups: [[0, 1]]\n  divide: tokens\n", &t);
    ck_assert(t.pipeline.divide_dense && t.pipeline.divide_tokens);
    bt_topology_free(&t);
    load_ok(HOSTS RANKS4 "pipeline:\n  divide: all\n  expert_groups: [[0, 1]]\n", &t);
    ck_assert(t.pipeline.divide_dense && !t.pipeline.divide_tokens);
    bt_topology_free(&t);
    expect_err(HOSTS "ranks:\n  - {rank: 0, host: gpu01, backend: cpu}\n  - {rank: 1, host: gpu01, backend: cuda:3}\n"
                     "pipeline:\n  expert_groups: [[0, 1]]\n  divide: tokens\n",
               "12:11: pipeline.divide: tokens: rank 1 of expert group 0 is cuda:3; only cpu ranks divide a product by "
               "tokens (divide: all divides its rows on any rank)");
    expect_err(HOSTS RANKS4 "pipeline:\n  divide: tokens\n",
               "13:11: pipeline.divide: tokens: there are no expert_groups to divide the products");
    expect_err(HOSTS RANKS4 "pipeline:\n  expert_groups: [[0, 1]]\n  divide: rows\n",
               "14:11: pipeline.divide: expected experts, all or tokens, got 'rows'");
    expect_err(HOSTS RANKS4 "pipeline:\n  divide: all\n",
               "13:11: pipeline.divide: all: there are no expert_groups to divide the products");
    /* expert_overlap: experts held past the share, for home to balance by */
    load_ok(HOSTS RANKS4 "pipeline:\n  expert_groups: [[0, 1]]\n  expert_overlap: 3\n", &t);
    ck_assert_int_eq(t.pipeline.expert_overlap, 3);
    bt_topology_free(&t);
    load_ok(HOSTS RANKS4 "pipeline:\n  expert_groups: [[0, 1]]\n", &t);
    ck_assert_int_eq(t.pipeline.expert_overlap, 0);
    bt_topology_free(&t);
    expect_err(HOSTS RANKS4 "pipeline:\n  expert_overlap: 2\n",
               "13:19: pipeline.expert_overlap: there are no expert_groups whose experts could overlap");
    expect_err(HOSTS RANKS4 "pipeline:\n  expert_groups: [[0, 1]]\n  expert_overlap: -1\n",
               "14:19: pipeline.expert_overlap: must be at least 0, got '-1'");
    expect_err(HOSTS RANKS4 "pipeline:\n  expert_groups: [[0, 1]]\n  expert_overlap: many\n",
               "14:19: pipeline.expert_overlap: expected an integer, got 'many'");
    expect_err(HOSTS RANKS4 "pipeline:\n  expert_groups: [0, 1]\n",
               "13:19: pipeline.expert_groups[0]: expected a list of ranks, got '0'");
    expect_err(HOSTS RANKS4 "pipeline:\n  expert_groups: [[0]]\n",
               "13:19: pipeline.expert_groups[0]: 1 rank; a group has 2 to 16");
    expect_err(HOSTS RANKS4 "pipeline:\n  expert_groups: [[0, 4]]\n",
               "13:23: pipeline.expert_groups[0]: rank 4 does not exist (ranks are 0..3)");
    expect_err(HOSTS RANKS4 "pipeline:\n  expert_groups: [[0, 1], [1, 2]]\n",
               "13:28: pipeline.expert_groups[1]: rank 1 is already in expert group 0 (at 13:19); a rank is in "
               "one group");
    expect_err(HOSTS RANKS4 "pipeline:\n  expert_groups: [[1, 0]]\n",
               "13:23: pipeline.expert_groups[0]: rank 0 runs the model's first layers: it can lead a group, not "
               "be a member after rank 1");
    expect_err(HOSTS RANKS4 "pipeline:\n  partition: [2, 1, 1, 0]\n  expert_groups: [[0, 1]]\n",
               "13:18: pipeline.partition[1]: rank 1 is a member of an expert group whose layers its first rank "
               "runs: its count must be 0");
    expect_err(HOSTS RANKS4 "pipeline:\n  partition: [2, 0, 2, 0]\n",
               "13:18: pipeline.partition[1]: must be at least 1, got '0'");
}
END_TEST

START_TEST(test_pipeline_model) {
    expect_err(HOSTS RANKS2 "pipeline:\n  model: \"\"\n", "11:10: pipeline.model: expected a string, got ''");
    expect_err(HOSTS RANKS2 "pipeline:\n  model: [a, b]\n", "11:10: pipeline.model: expected a string, got a list");
    struct bt_topology t;
    load_ok(HOSTS RANKS2 "pipeline:\n  model: /models/qwen3-0.6b.gguf\n", &t);
    ck_assert_str_eq(t.pipeline.model, "/models/qwen3-0.6b.gguf");
    ck_assert_int_eq(t.pipeline.model_pos.line, 11);
    bt_topology_free(&t);
    load_ok(HOSTS RANKS2, &t);
    ck_assert_ptr_null(t.pipeline.model);
    ck_assert_ptr_null(t.hosts[0].model);
    bt_topology_free(&t);
    /* a host's own path */
    load_ok("hosts:\n  - {name: a, slots: 2, model: /a/m.gguf}\n  - {name: b, slots: 2}\n"
            "ranks:\n  - {rank: 0, host: a, backend: cpu}\n  - {rank: 1, host: b, backend: cpu}\n",
            &t);
    ck_assert_str_eq(t.hosts[0].model, "/a/m.gguf");
    ck_assert_ptr_null(t.hosts[1].model);
    bt_topology_free(&t);
    expect_err("hosts:\n  - {name: a, slots: 2, model: 7}\n  - {name: b, slots: 2, model: \"\"}\n"
               "ranks:\n  - {rank: 0, host: a, backend: cpu}\n",
               "3:32: host b: model: expected a string, got ''");
}
END_TEST

START_TEST(test_nccl) {
    expect_err(HOSTS RANKS2 "transport:\n  device: nccl\n",
               "11:11: transport.device: nccl joins two CUDA ranks, but this file has no CUDA "
               "rank; use mpi (edges with a cpu rank always use MPI)");
    expect_err(HOSTS "ranks:\n  - {rank: 0, host: cpu01, backend: cpu}\n"
                     "  - {rank: 1, host: gpu01, backend: cuda:0}\n"
                     "transport:\n  device: nccl\n",
               "11:11: transport.device: nccl joins two CUDA ranks, but this file has only 1 CUDA "
               "rank; use mpi (edges with a cpu rank always use MPI)");
    expect_err(HOSTS "ranks:\n  - {rank: 0, host: cpu01, backend: cpu}\n"
                     "  - {rank: 1, host: gpu01, backend: cuda:0}\n"
                     "  - {rank: 2, host: gpu01, backend: cuda:1}\n"
                     "transport:\n  device: nccl\n  edges:\n    - {ranks: [0, 1], device: nccl}\n",
               "14:31: transport.edges[0]: device: nccl on edge 0-1, but rank 0 is a cpu rank; "
               "NCCL joins two CUDA ranks (edges with a cpu rank use MPI)");
    expect_err(HOSTS RANKS2 "transport:\n  edges:\n    - {ranks: [1, 1], device: mpi}\n",
               "12:15: transport.edges[0]: ranks: an edge joins two different ranks, got [1, 1]");
    expect_err(HOSTS RANKS2 "transport:\n  edges:\n    - {ranks: [0, 5], device: mpi}\n",
               "12:19: transport.edges[0]: rank 5 does not exist (ranks are 0..1)");
    expect_err(HOSTS RANKS2 "transport:\n  edges:\n    - {ranks: [0, 1], device: mpi}\n"
                            "    - {ranks: [1, 0], device: mpi}\n",
               "13:15: transport.edges[1]: edge 0-1 is listed twice (first at 12:15)");
}
END_TEST

/* ---- valid files ---- */

static const char *FULL = "# a full example\n"
                          "hosts:\n"
                          "  - name: cpu01\n"
                          "    slots: 2\n"
                          "  - name: gpu01\n"
                          "    slots: 16\n"
                          "    gpus: 8\n"
                          "    address: 10.0.0.11\n"
                          "ranks:\n"
                          "  - {rank: 2, host: gpu01, backend: \"cuda:5\", memory: 80GiB}\n"
                          "  - {rank: 0, host: cpu01, backend: cpu, threads: 2, memory: 512MiB}\n"
                          "  - {rank: 1, host: cpu01, backend: cpu}\n"
                          "  - {rank: 3, host: gpu01, backend: \"cuda:0\", memory: 1GB}\n"
                          "pipeline:\n"
                          "  micro_batches: 3\n"
                          "  partition: [1, 2, 3, 4]\n"
                          "  pin:\n"
                          "    - {pattern: \"blk.0.*\", rank: 3}\n"
                          "    - {pattern: \"blk.*.ffn_*_exps.weight\", rank: 0, compute: layer}\n"
                          "transport:\n"
                          "  host: mpi\n"
                          "  device: nccl\n"
                          "  edges:\n"
                          "    - {ranks: [3, 2], device: mpi}\n"
                          "mpi:\n"
                          "  pml: ucx\n"
                          "  single_copy: none\n"
                          "  extra_args: [--mca, btl_tcp_if_include, eth0]\n";

START_TEST(test_valid_full) {
    struct bt_topology t;
    load_ok(FULL, &t);
    ck_assert_str_eq(t.path, g_path);
    ck_assert_int_eq(t.n_hosts, 2);
    ck_assert_str_eq(t.hosts[0].name, "cpu01");
    ck_assert_ptr_null(t.hosts[0].address);
    ck_assert_int_eq(t.hosts[0].gpus, 0);
    ck_assert_str_eq(t.hosts[1].address, "10.0.0.11");
    ck_assert_str_eq(bt_topology_host_target(&t, 1), "10.0.0.11");
    ck_assert_str_eq(bt_topology_host_target(&t, 0), "cpu01");
    ck_assert_int_eq(t.hosts[1].slots, 16);
    ck_assert_int_eq(t.hosts[1].gpus, 8);
    ck_assert_int_eq(t.hosts[1].slots_pos.line, 6);
    ck_assert_int_eq(t.hosts[1].slots_pos.col, 12);

    ck_assert_int_eq(t.n_ranks, 4);
    for (int r = 0; r < 4; r++) ck_assert_int_eq(t.ranks[r].rank, r);
    ck_assert_int_eq(t.ranks[0].backend, BT_TOPO_BACKEND_CPU);
    ck_assert_int_eq(t.ranks[0].threads, 2);
    ck_assert_int_eq(t.ranks[0].device, -1);
    ck_assert_uint_eq(t.ranks[0].memory, 512ull << 20);
    ck_assert_int_eq(t.ranks[1].threads, 1);
    ck_assert_uint_eq(t.ranks[1].memory, 0);
    ck_assert_int_eq(t.ranks[2].backend, BT_TOPO_BACKEND_CUDA);
    ck_assert_int_eq(t.ranks[2].device, 5);
    ck_assert_int_eq(t.ranks[2].host, 1);
    ck_assert_uint_eq(t.ranks[2].memory, 80ull << 30);
    ck_assert_uint_eq(t.ranks[3].memory, 1000000000ull);
    ck_assert_int_eq(t.ranks[2].pos.line, 10);
    ck_assert_int_eq(t.ranks[2].backend_pos.line, 10);
    ck_assert_int_eq(t.ranks[2].backend_pos.col, 37);

    ck_assert_int_eq(bt_topology_local_rank(&t, 0), 0);
    ck_assert_int_eq(bt_topology_local_rank(&t, 1), 1);
    ck_assert_int_eq(bt_topology_local_rank(&t, 2), 0);
    ck_assert_int_eq(bt_topology_local_rank(&t, 3), 1);
    ck_assert_int_eq(bt_topology_local_rank(&t, 4), -1);
    ck_assert_int_eq(bt_topology_host_ranks(&t, 0), 2);
    ck_assert_int_eq(bt_topology_host_threads(&t, 0), 3);
    ck_assert(!bt_topology_host_oversubscribed(&t, 0));
    ck_assert(bt_topology_host_threads_exceed(&t, 0));
    ck_assert(!bt_topology_host_threads_exceed(&t, 1));
    ck_assert(bt_topology_any_threads_exceed(&t));
    ck_assert(!bt_topology_any_oversubscribed(&t));
    ck_assert_int_eq(bt_topology_n_cuda(&t), 2);
    ck_assert(bt_topology_has_cuda(&t));
    ck_assert_ptr_null(bt_topology_rank(&t, -1));
    ck_assert_int_eq(bt_topology_rank(&t, 3)->device, 0);

    ck_assert_int_eq(t.pipeline.micro_batches, 3);
    ck_assert(!t.pipeline.partition_auto);
    ck_assert_int_eq(t.pipeline.layers[3], 4);
    ck_assert_int_eq(t.pipeline.layers_sum, 10);
    ck_assert_int_eq(t.pipeline.n_pins, 2);
    ck_assert_str_eq(t.pipeline.pins[0].pattern, "blk.0.*");
    ck_assert_int_eq(t.pipeline.pins[0].rank, 3);
    ck_assert(!t.pipeline.pins[0].compute_at_layer);
    ck_assert_int_eq(t.pipeline.pins[1].rank, 0);
    ck_assert(t.pipeline.pins[1].compute_at_layer);

    ck_assert_int_eq(t.transport.host, BT_TOPO_LINK_MPI);
    ck_assert_int_eq(t.transport.device, BT_TOPO_LINK_NCCL);
    ck_assert_int_eq(t.transport.n_edges, 1);
    ck_assert_int_eq(t.transport.edges[0].a, 2);
    ck_assert_int_eq(t.transport.edges[0].b, 3);
    ck_assert_int_eq(bt_topology_edge_link(&t, 3, 2), BT_TOPO_LINK_MPI); /* the override */
    ck_assert_int_eq(bt_topology_edge_link(&t, 0, 2), BT_TOPO_LINK_MPI); /* a cpu rank */
    ck_assert_int_eq(bt_topology_edge_link(&t, 0, 1), BT_TOPO_LINK_MPI);

    ck_assert_int_eq(t.mpi.pml, BT_TOPO_PML_UCX);
    ck_assert_int_eq(t.mpi.single_copy, BT_TOPO_SINGLE_COPY_NONE);
    ck_assert_int_eq(t.mpi.n_extra_args, 3);
    ck_assert_str_eq(t.mpi.extra_args[2], "eth0");

    char err[512];
    ck_assert_int_eq(bt_topology_check_world(&t, 4, err, sizeof err), BT_OK);
    ck_assert_int_eq(bt_topology_check_layers(&t, 10, err, sizeof err), BT_OK);
    bt_topology_free(&t);
    ck_assert_ptr_null(t.ranks);
    bt_topology_free(&t); /* twice is harmless */
}
END_TEST

START_TEST(test_defaults) {
    struct bt_topology t;
    load_ok("hosts:\n  - {name: g, slots: 4, gpus: 2}\nranks:\n"
            "  - {rank: 0, host: g, backend: cuda:0}\n  - {rank: 1, host: g, backend: cuda:1}\n",
            &t);
    ck_assert_int_eq(t.pipeline.micro_batches, 1);
    ck_assert(t.pipeline.partition_auto);
    ck_assert_int_eq(t.pipeline.partition_pos.line, 0);
    ck_assert_int_eq(t.transport.device, BT_TOPO_LINK_NCCL); /* two CUDA ranks */
    ck_assert(!t.transport.device_given);
    ck_assert_int_eq(bt_topology_edge_link(&t, 0, 1), BT_TOPO_LINK_NCCL);
    ck_assert_int_eq(t.mpi.pml, BT_TOPO_PML_DEFAULT);
    ck_assert_int_eq(t.mpi.single_copy, BT_TOPO_SINGLE_COPY_DEFAULT);
    bt_topology_free(&t);

    load_ok(HOSTS RANKS2, &t);
    ck_assert_int_eq(t.transport.device, BT_TOPO_LINK_MPI); /* no CUDA rank */
    ck_assert(!bt_topology_has_cuda(&t));
    ck_assert(bt_topology_host_threads_exceed(&t, 0)); /* 2 + 1 threads on 2 slots */
    ck_assert(!bt_topology_host_oversubscribed(&t, 0));
    bt_topology_free(&t);
}
END_TEST

START_TEST(test_check_world) {
    struct bt_topology t;
    char err[512], want[PATH_MAX + 256];
    load_ok(HOSTS RANKS2, &t);
    ck_assert_int_eq(bt_topology_check_world(&t, 2, err, sizeof err), BT_OK);
    ck_assert_int_eq(bt_topology_check_world(&t, 4, err, sizeof err), BT_ERR_INVALID);
    snprintf(want, sizeof want,
             "%s:7:1: ranks: the file lists 2 ranks but MPI started 4 processes; run it with "
             "mpirun -np 2 (launch/baton-run does this)",
             g_path);
    ck_assert_str_eq(err, want);
    ck_assert_int_eq(bt_topology_check_world(&t, 1, err, sizeof err), BT_ERR_INVALID);
    snprintf(want, sizeof want,
             "%s:7:1: ranks: the file lists 2 ranks but MPI started 1 process; run it with "
             "mpirun -np 2 (launch/baton-run does this)",
             g_path);
    ck_assert_str_eq(err, want);
    bt_topology_free(&t);
}
END_TEST

START_TEST(test_check_layers) {
    struct bt_topology t;
    char err[512], want[PATH_MAX + 256];
    load_ok(HOSTS RANKS2 "pipeline:\n  partition: [4, 3]\n", &t);
    ck_assert_int_eq(bt_topology_check_layers(&t, 7, err, sizeof err), BT_OK);
    ck_assert_int_eq(bt_topology_check_layers(&t, 8, err, sizeof err), BT_ERR_INVALID);
    snprintf(want, sizeof want,
             "%s:11:14: pipeline.partition: layer counts add up to 7 (4 + 3) but the model has 8 "
             "layers",
             g_path);
    ck_assert_str_eq(err, want);
    bt_topology_free(&t);

    load_ok(HOSTS RANKS2 "pipeline:\n  partition: auto\n", &t);
    ck_assert_int_eq(bt_topology_check_layers(&t, 8, err, sizeof err), BT_OK);
    ck_assert_int_eq(bt_topology_check_layers(&t, 1, err, sizeof err), BT_OK);
    ck_assert_int_eq(bt_topology_check_layers(&t, 0, err, sizeof err), BT_ERR_INVALID);
    snprintf(want, sizeof want,
             "%s:11:14: pipeline.partition: the model has 0 layers; nothing to place", g_path);
    ck_assert_str_eq(err, want);
    bt_topology_free(&t);
}
END_TEST

/* ---- configs/ ---- */

static void config_path(char *buf, size_t n, const char *name) {
    /* __FILE__ is .../tests/test_topology.c (CMake compiles absolute paths) */
    const char *slash = strrchr(__FILE__, '/');
    int dir_len = slash ? (int)(slash - __FILE__) : 0;
    snprintf(buf, n, "%.*s/../configs/%s", dir_len, __FILE__, name);
}

static void load_config(const char *name, struct bt_topology *t) {
    char path[PATH_MAX], err[1024] = "";
    config_path(path, sizeof path, name);
    enum bt_status st = bt_topology_load(path, t, err, sizeof err);
    ck_assert_msg(st == BT_OK, "%s: %s", name, err);
    ck_assert_int_eq(bt_topology_check_world(t, t->n_ranks, err, sizeof err), BT_OK);
}

START_TEST(test_configs) {
    struct bt_topology t;
    load_config("local-cpu-1.yaml", &t);
    ck_assert_int_eq(t.n_ranks, 1);
    ck_assert(!bt_topology_any_threads_exceed(&t));
    bt_topology_free(&t);

    load_config("local-cpu-2.yaml", &t);
    ck_assert_int_eq(t.n_ranks, 2);
    ck_assert_int_eq(t.hosts[0].slots, 2);
    ck_assert(!bt_topology_any_oversubscribed(&t));
    ck_assert_int_eq(t.mpi.pml, BT_TOPO_PML_OB1);
    bt_topology_free(&t);

    load_config("local-cpu-4.yaml", &t);
    ck_assert_int_eq(t.n_ranks, 4);
    ck_assert(bt_topology_any_oversubscribed(&t));
    ck_assert(bt_topology_any_threads_exceed(&t));
    for (int r = 0; r < 4; r++) ck_assert_int_eq(t.ranks[r].threads, 1);
    bt_topology_free(&t);

    load_config("one-node-8gpu.yaml", &t);
    ck_assert_int_eq(t.n_ranks, 8);
    ck_assert_int_eq(bt_topology_n_cuda(&t), 8);
    ck_assert_int_eq(t.transport.device, BT_TOPO_LINK_NCCL);
    for (int r = 0; r < 8; r++) {
        ck_assert_int_eq(t.ranks[r].device, r);
        ck_assert_int_eq(bt_topology_local_rank(&t, r), r);
    }
    bt_topology_free(&t);

    load_config("two-nodes-16gpu.yaml", &t);
    ck_assert_int_eq(t.n_ranks, 16);
    ck_assert_int_eq(t.n_hosts, 2);
    ck_assert_int_eq(t.mpi.pml, BT_TOPO_PML_UCX);
    ck_assert_int_eq(t.ranks[9].host, 1);
    ck_assert_int_eq(t.ranks[9].device, 1);
    ck_assert_int_eq(bt_topology_local_rank(&t, 9), 1);
    ck_assert_int_eq(bt_topology_edge_link(&t, 7, 8), BT_TOPO_LINK_NCCL);
    bt_topology_free(&t);
}
END_TEST

static Suite *topology_suite(void) {
    Suite *s = suite_create("topology");
    TCase *tc = tcase_create("topology");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_missing_file);
    tcase_add_test(tc, test_directory);
    tcase_add_test(tc, test_empty);
    tcase_add_test(tc, test_yaml_syntax);
    tcase_add_test(tc, test_two_documents);
    tcase_add_test(tc, test_root_and_sections);
    tcase_add_test(tc, test_unknown_keys);
    tcase_add_test(tc, test_duplicate_key);
    tcase_add_test(tc, test_missing_keys);
    tcase_add_test(tc, test_wrong_types);
    tcase_add_test(tc, test_not_positive);
    tcase_add_test(tc, test_overflow);
    tcase_add_test(tc, test_duplicate_rank);
    tcase_add_test(tc, test_gpu_memory);
    tcase_add_test(tc, test_missing_rank);
    tcase_add_test(tc, test_unknown_host);
    tcase_add_test(tc, test_cuda_device);
    tcase_add_test(tc, test_partition_and_pins);
    tcase_add_test(tc, test_expert_groups);
    tcase_add_test(tc, test_pipeline_model);
    tcase_add_test(tc, test_nccl);
    tcase_add_test(tc, test_valid_full);
    tcase_add_test(tc, test_defaults);
    tcase_add_test(tc, test_check_world);
    tcase_add_test(tc, test_check_layers);
    tcase_add_test(tc, test_configs);
    tcase_add_test(tc, test_rank_limit);
    tcase_add_test(tc, test_nesting_limit);
    tcase_add_test(tc, test_file_size_limit);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return tu_run_suite(topology_suite());
}
