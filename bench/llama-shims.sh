# bench/llama-shims.sh: sourced by the round scripts (prompt-rounds.sh, mem-rounds.sh) with NAME
# (the script, for messages) and T (threads, 1 or 2) set: finds llama.cpp's test-backend-ops ($L)
# and sets PRE, the libraries to preload into it: a get_nprocs reporting 2 T CPUs (it runs
# hardware_concurrency()/2 threads) and, at 1 thread, a ggml_time_us returning the process's
# CPU time (GFLOP per CPU-second, as baton's GF/cpu-s column).
L=${LLAMA_BIN:?set LLAMA_BIN to the build/bin of llama.cpp (bench/llama.sh builds it and prints the line)}/test-backend-ops
[ -x "$L" ] || { echo "$NAME: $L is missing (set LLAMA_BIN to llama.cpp's build/bin)" >&2; exit 1; }
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
printf 'int get_nprocs(void){return %d;}\n' $((2 * T)) > "$W"/np.c
printf '#include <stdint.h>\n#include <time.h>\nint64_t ggml_time_us(void){struct timespec t;clock_gettime(CLOCK_PROCESS_CPUTIME_ID,&t);return t.tv_sec*1000000+t.tv_nsec/1000;}\n' > "$W"/cput.c
cc -shared -fPIC -o "$W"/np.so "$W"/np.c && cc -shared -fPIC -o "$W"/cput.so "$W"/cput.c || exit 1
PRE="$W/np.so"; [ "$T" = 1 ] && PRE="$W/np.so $W/cput.so"
echo "threads $T; $([ "$T" = 1 ] && echo 'GFLOP per CPU-second' || echo 'wall-clock GFLOP/s'); $(uptime)"
