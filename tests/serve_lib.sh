# serve_lib.sh - sourced by the tests that start `baton serve` (serve_test.sh,
# serve_json_test.sh, conversation_test.sh): baton (their first argument),
# here, a temporary folder tmp removed at exit with the server (pid in
# server) killed if still running, the MPI environment for oversubscribed
# local ranks, mpirun ($MPIEXEC when ctest gives it), fail MESSAGE
# counting into fails, and listening LOG WHAT (below).
baton=$1
here=$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)
tmp=$(mktemp -d)
server=""
trap 'if [ -n "$server" ]; then kill -9 $server 2>/dev/null; fi; rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_base_warn_component_unused=0
mpirun=${MPIEXEC:-mpirun}
fails=0
fail() {
    echo "FAIL: $*"
    fails=$((fails + 1))
}

# listening LOG WHAT: once the server started in the background (pid in
# server, output in LOG.out and LOG.err) says "listening on", its line in
# line, its port and rank 0's pid in port and pid0; if it ends or stays
# silent for 60 s, the failure (naming WHAT) and its output, and exit 1
listening() {
    local log=$1
    for _ in $(seq 1 600); do
        if grep -q "listening on" "$log.out" 2>/dev/null || ! kill -0 "$server" 2>/dev/null; then break; fi
        sleep 0.1
    done
    line=$(grep "listening on" "$log.out")
    if [ -z "$line" ]; then
        echo "FAIL: the server did not start$2:"
        cat "$log.out" "$log.err"
        exit 1
    fi
    port=$(sed -E 's/.*:([0-9]+) \(model.*/\1/' <<<"$line")
    pid0=$(sed -E 's/.*pid ([0-9]+)\).*/\1/' <<<"$line")
}
