/* matmul.c - a program outside baton's tree, built against the installed
 * package only (pkg-config or find_package): y = W x + b on the CPU backend
 * with 2 threads, checked against the same sum written out by hand.
 *
 *   W: [k = 3, m = 2] (ne0 = k: each of the m rows holds k weights)
 *   x: [k = 3, n = 1]      b: [m = 2, n = 1]      y: [m = 2, n = 1]
 */
#include <baton/baton.h>
#include <math.h>
#include <stdio.h>

int main(void) {
    bt_context *ctx = bt_init((struct bt_init_params){bt_tensor_overhead() * 16 + bt_graph_overhead(16), NULL, true});
    if (!ctx) return 1;
    struct bt_tensor *W = bt_new_tensor_2d(ctx, BT_TYPE_F32, 3, 2);
    struct bt_tensor *x = bt_new_tensor_2d(ctx, BT_TYPE_F32, 3, 1);
    struct bt_tensor *b = bt_new_tensor_2d(ctx, BT_TYPE_F32, 2, 1);
    struct bt_tensor *y = bt_add(ctx, bt_mul_mat(ctx, W, x), b);
    struct bt_graph *g = bt_graph_new(ctx, 16);
    if (!y || !g || bt_graph_build_forward_expand(g, y) != BT_OK) {
        fprintf(stderr, "matmul: %s\n", bt_context_error(ctx));
        return 1;
    }
    bt_backend_t cpu = bt_backend_cpu_init(2);
    bt_buffer_t buf = cpu ? bt_alloc_ctx_tensors(ctx, cpu) : NULL;
    if (!buf) {
        fprintf(stderr, "matmul: cannot start the CPU backend\n");
        return 1;
    }
    const float w[6] = {1, 2, 3, 4, 5, 6}, xv[3] = {1, -1, 2}, bv[2] = {0.5f, -0.5f};
    bt_tensor_set(W, w, 0, sizeof w);
    bt_tensor_set(x, xv, 0, sizeof xv);
    bt_tensor_set(b, bv, 0, sizeof bv);
    const enum bt_status st = bt_backend_graph_compute(cpu, g);
    float out[2] = {0, 0};
    if (st == BT_OK) bt_tensor_get(y, out, 0, sizeof out);
    const float want[2] = {1 - 2 + 6 + 0.5f, 4 - 5 + 12 - 0.5f};
    const int ok = st == BT_OK && fabsf(out[0] - want[0]) < 1e-6f && fabsf(out[1] - want[1]) < 1e-6f;
    printf("baton %s: y = [%g, %g] (want [%g, %g]) %s\n", BATON_VERSION, out[0], out[1], want[0], want[1],
           ok ? "ok" : "WRONG");
    bt_buffer_free(buf);
    bt_backend_free(cpu);
    bt_free(ctx);
    return ok ? 0 : 1;
}
