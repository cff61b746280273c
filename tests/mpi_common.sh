# What the MPI test scripts share (tests/test_mpi_*.sh source it): Open MPI's settings for tests,
# `fail MESSAGE` and `mpi N COMMAND...` (mpirun -np N, oversubscribed when N is more than the cores).
# Open MPI: leave to run as root (CI's fresh root), no single-copy shared memory (containers
# without ptrace rights); OpenMP threads that sleep while they wait, as ranks share the cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMP_WAIT_POLICY=passive
fail() {
  echo "FAILED: $*" >&2
  exit 1
}
mpi() {
  local n=$1
  shift
  mpirun -np "$n" --oversubscribe "$@"
}
