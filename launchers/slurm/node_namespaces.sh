# Sourced by local_cluster.sh: the network side of a multi-node cluster. Each node is a network
# namespace named after it, joined to the bridge $BRIDGE (the controller's address, $CTLD_ADDR) by a
# veth pair (dpo-h<i> on the bridge, dpo-c<i> in the node), and named in /etc/hosts for every namespace.
# Uses the variables and helpers of local_cluster.sh (NODES, NODE_NAMES, NODE_ADDRS, say, die, ...).


netns_exists() { [ -e "/run/netns/$1" ]; }

# Every namespace, link and /etc/hosts line of a multi-node layout goes; processes left in a node's
# namespace (a job's tasks whose slurmd is gone) are killed first.
remove_node_network() {
    local ns pids
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$NODE_PREFIX[0-9]+$" || true); do
        pids=$(ip netns pids "$ns" 2>/dev/null || true)
        if [ -n "$pids" ]; then
            say "killing processes left in namespace $ns: $(echo $pids)"
            kill -KILL $pids 2>/dev/null || true
            wait_until 10 eval "[ -z \"\$(ip netns pids $ns 2>/dev/null)\" ]" || say "some processes of $ns survive"
        fi
        ip netns delete "$ns" && say "namespace $ns: removed"
    done
    # a namespace's veth pair goes with it, but the kernel does that asynchronously: delete the host ends
    local link
    for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E '^dpo-h[0-9]+$' || true); do
        ip link delete "$link" 2>/dev/null || true
    done
    if ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link delete "$BRIDGE" && say "bridge $BRIDGE: removed"
    fi
    if grep -q "$HOSTS_TAG" /etc/hosts 2>/dev/null; then
        # /etc/hosts may be a bind mount: rewrite it in place rather than replacing the file
        local kept
        kept=$(grep -v "$HOSTS_TAG" /etc/hosts || true)
        printf '%s\n' "$kept" >/etc/hosts
        say "/etc/hosts: node lines removed"
    fi
}

# The subnet must be free: an address or route of it that this script did not make means another use.
check_subnet_free() {
    local other
    other=$(ip -o route show 2>/dev/null | grep -F "$SUBNET." | grep -vw "$BRIDGE" || true)
    [ -z "$other" ] || die "$SUBNET.0/24 is already routed here ($other): pick another with SLURM_LOCAL_SUBNET"
}

setup_node_network() {
    local i ns host_if node_if
    check_subnet_free
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link add "$BRIDGE" type bridge
        ip addr add "$CTLD_ADDR/24" dev "$BRIDGE"
        say "bridge $BRIDGE: $CTLD_ADDR/24"
    fi
    ip link set "$BRIDGE" up
    for i in $(seq 1 "$NODES"); do
        ns=${NODE_NAMES[$((i - 1))]}
        host_if=dpo-h$i
        node_if=dpo-c$i
        if ! netns_exists "$ns"; then
            ip netns add "$ns"
            ip link delete "$host_if" 2>/dev/null || true
            ip link add "$host_if" type veth peer name "$node_if"
            ip link set "$node_if" netns "$ns"
            ip link set "$host_if" master "$BRIDGE" up
            ip -n "$ns" link set lo up
            ip -n "$ns" addr add "${NODE_ADDRS[$((i - 1))]}/24" dev "$node_if"
            ip -n "$ns" link set "$node_if" up
            say "namespace $ns: ${NODE_ADDRS[$((i - 1))]} (veth $host_if on $BRIDGE)"
        else
            ip link set "$host_if" up  # cut by `kill-node --silent`
        fi
        if ! grep -q "^${NODE_ADDRS[$((i - 1))]} $ns $HOSTS_TAG" /etc/hosts; then
            local kept
            kept=$(grep -v " $ns $HOSTS_TAG" /etc/hosts || true)
            printf '%s\n%s %s %s\n' "$kept" "${NODE_ADDRS[$((i - 1))]}" "$ns" "$HOSTS_TAG" >/etc/hosts
        fi
    done
    # Namespaces beyond the node count (an earlier, larger cluster) go.
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$NODE_PREFIX[0-9]+$" || true); do
        if [ "${ns#"$NODE_PREFIX"}" -gt "$NODES" ]; then
            ip netns pids "$ns" 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
            ip netns delete "$ns"
            say "namespace $ns: removed (not in a $NODES-node cluster)"
        fi
    done
}
