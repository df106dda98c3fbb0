#!/usr/bin/env bash
# host_of_rank.sh — run under mpirun inside bench/compression.sh's two-host namespace: gives this
# rank the address of its emulated host, so that Open MPI's TCP transport talks from it. Ranks
# on one host then meet over the unshaped loopback, ranks on different hosts through the shaped
# class between the hosts' subnets (10.9.1.0/24 and 10.9.2.0/24).
# usage: LOOM_HOSTS=0,0,1,1 mpirun ... bash bench/host_of_rank.sh loom train ...
set -euo pipefail
rank=${OMPI_COMM_WORLD_RANK:?run this under mpirun}
host=$(echo "${LOOM_HOSTS:?LOOM_HOSTS: the host of each rank, e.g. 0,0,1,1}" | cut -d, -f$((rank + 1)))
export OMPI_MCA_btl_tcp_if_include=$([ "$host" = 0 ] && echo va || echo vb)
exec "$@"
