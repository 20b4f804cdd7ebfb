#!/usr/bin/env bash
# mpirun starts every rank in the root namespace; this moves rank r into namespace PREFIX<r>
# before exec'ing the program, so its TCP traffic leaves through that rank's shaped veth.
#   mpirun ... scripts/baselines/mpi_rank_wrapper.sh PREFIX program args...
set -euo pipefail
prefix=${1:?usage: mpi_rank_wrapper.sh PREFIX program args...}
shift
rank=${OMPI_COMM_WORLD_RANK:?not started by Open MPI mpirun (OMPI_COMM_WORLD_RANK unset)}
exec ip netns exec "$prefix$rank" "$@"
