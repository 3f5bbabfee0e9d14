# serve_lib.sh - sourced by the tests that start `baton serve` (serve_test.sh,
# serve_json_test.sh, conversation_test.sh): baton (their first argument),
# here, a temporary folder tmp removed at exit with the server (pid in
# server) killed if still running, the MPI environment for oversubscribed
# local ranks, mpirun ($MPIEXEC when ctest gives it), and fail MESSAGE
# counting into fails.
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
