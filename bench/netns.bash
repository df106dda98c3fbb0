# bench/netns.bash — network-namespace settings for the slow-link benchmarks (REFERENCE.md's
# recipe; root): sourced by bench/compression.sh and bench/planner.sh, which set $ns (the
# namespace's name) and $ROOT. Only loopback and the namespace's own veths are used.
#   netns_one_link RATE   every rank's traffic through the namespace's loopback, shaped by tc
#   netns_two_hosts RATE  two emulated hosts (10.9.1.1 on veth va, 10.9.2.1 on vb;
#                         bench/host_of_rank.sh picks Open MPI's interface per rank): ranks of one
#                         host meet over the unshaped loopback, ranks of different hosts through an
#                         htb class shaped to the rate
#   netns_mpirun NP HOSTS COMMAND...   mpirun in the namespace ("" HOSTS: the one link; else
#                         the host of each rank, e.g. 0,0,1,1)
# NETNS_QUEUE (50ms): how long a packet may wait in the one link's queue before it is dropped;
# NETNS_TCP_RETRIES: the namespace's net.ipv4.tcp_retries2 (the kernel's 15 ends a connection
# whose data has not got through for about 15 minutes: at 10 Mbit/s a data-parallel step's
# flows can starve that long)
netns_one_link() { # rate
    ip netns add "$ns"
    ip netns exec "$ns" ip link set lo up
    ip netns exec "$ns" tc qdisc add dev lo root tbf rate "$1" burst 256kb latency "${NETNS_QUEUE:-50ms}"
    [ -z "${NETNS_TCP_RETRIES:-}" ] || ip netns exec "$ns" sysctl -qw net.ipv4.tcp_retries2="$NETNS_TCP_RETRIES"
}
netns_two_hosts() { # rate
    ip netns add "$ns"
    ip netns exec "$ns" sh -c "ip link set lo up && ip link add va type veth peer name vb &&
        ip addr add 10.9.1.1/16 dev va && ip addr add 10.9.2.1/16 dev vb && ip link set va up &&
        ip link set vb up && tc qdisc add dev lo root handle 1: htb default 10 r2q 100000 &&
        tc class add dev lo parent 1: classid 1:10 htb rate 40gbit &&
        tc class add dev lo parent 1: classid 1:20 htb rate $1 &&
        tc filter add dev lo parent 1: protocol ip u32 match ip src 10.9.1.0/24 match ip dst 10.9.2.0/24 flowid 1:20 &&
        tc filter add dev lo parent 1: protocol ip u32 match ip src 10.9.2.0/24 match ip dst 10.9.1.0/24 flowid 1:20"
}
netns_mpirun() { # np hosts command...
    local np=$1 hosts=$2 wrap=()
    shift 2
    [ -n "$hosts" ] && wrap=(bash "$ROOT/bench/host_of_rank.sh")
    # shellcheck disable=SC2046
    LOOM_HOSTS=$hosts ip netns exec "$ns" mpirun -np "$np" -x LOOM_HOSTS --mca btl tcp,self \
        --mca oob_tcp_if_include lo $([ -z "$hosts" ] && echo --mca btl_tcp_if_include lo) \
        "${wrap[@]}" "$@"
}
netns_mpirun_text() { # np hosts: the command line, for the log
    echo "ip netns exec $ns mpirun -np $1 --mca btl tcp,self${2:+ (hosts $2)}"
}
