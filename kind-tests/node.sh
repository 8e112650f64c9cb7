#!/usr/bin/env bash
# A real node on this machine: the control plane of cluster.sh (no fake
# nodes), plus containerd (Debian's package) and the kubelet and kube-proxy
# built from the same pinned k8s.io/kubernetes (k8s/build.sh kubelet), so
# injected pods run in real containers and the chart's pods reach the API
# server. The suites on it are pytest modules that bring it up and take it
# down themselves (kaitest/node.py): test_node.py (`pytest -c
# kind-tests/pytest.ini -m node`) asserts the preload, the read-only
# library, the writable region directory of a non-root container and
# libsync's recovery in those containers, with libsync, the agent, the
# aggregator and kai-csi as the chart's real pods; test_kai.py (`-m kai`)
# runs KAI-Scheduler's e2e specs there (see README.md, "node.sh").
#
#   kind-tests/node.sh --up [TARGET_DIR]     # bring the node up, return; last line: NODE_DIR=<dir>
#   kind-tests/node.sh --down NODE_DIR       # take down what --up left
#
# --up brings the node up (the node Ready, kube-proxy programmed,
# NODE_DIR/node.env and NODE_DIR/cluster/env written) and leaves it running
# for a suite; on failure it tears down what it started (KEEP_NODE=1 leaves
# it, and prints how to stop it).
#
# TARGET_DIR holds the built kai-webhook, kai-node, kai-csi, kai-aggregator and
# libkai_fake_vgpu.so (cargo build --bins; cargo build -p kai-fake-vgpu).
# Needs root, a kernel with overlayfs, unshare/nsenter (util-linux), openssl,
# curl, python3 + PyYAML, helm (HELM), go, cc; containerd, runc,
# containernetworking-plugins, debootstrap and iptables are installed with
# apt-get when missing.
#
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
case "${1:-}" in
  --down) mode=down ;;
  --up)
    mode=up
    target="${2:-$root/target/debug}"
    target="$(cd "$target" && pwd)" ;;
  *)
    echo "usage: node.sh --up [TARGET_DIR] | node.sh --down NODE_DIR (the node's suite: pytest -c kind-tests/pytest.ini -m node)" >&2
    exit 2 ;;
esac
HELM="${HELM:-${XDG_CACHE_HOME:-$HOME/.cache}/kai-tools/helm/helm}"
NODE_NAME="${NODE_NAME:-kai-node-1}"
BRIDGE=kai-cni0
KAI_IMAGE=kai.test/kai-resource-isolator:dev
REGISTRAR_IMAGE=kai.test/csi-node-driver-registrar:dev
POD_SUBNET=10.88.77.0/24

die() { echo "node.sh: NODE NOT STARTED: $*" >&2; exit 1; }
log() { echo "node.sh: $*" >&2; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("",0)); print(s.getsockname()[1])'; }

SYSCTLS="vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes"
. "$(dirname "${BASH_SOURCE[0]}")/pids.sh"  # pid_of, stop (over $PIDS)
in_ns() { nsenter -t "$(pid_of holder)" -m -- "$@"; }
# A daemon in that namespace, in the background, whose PID ($!) is the
# daemon's own: nsenter execs it, and the subshell execs nsenter (a
# backgrounded function would leave $! naming a bash that only waits on it,
# and `stop` would orphan the daemon).
bg_in_ns() { ( exec nsenter -t "$(pid_of holder)" -m -- "$@" ) & }
ctr_() { in_ns ctr --address "$T/containerd/containerd.sock" -n k8s.io "$@"; }
kc() { "$BIN/kubectl" --kubeconfig "$T/cluster/admin.kubeconfig" "$@"; }

teardown() {
  local rc=$?
  if [ "$mode" = up ] && [ "$rc" = 0 ]; then exit 0; fi
  if [ "${KEEP_NODE:-0}" = 1 ]; then
    echo "node left running: NODE_DIR=$T, KUBECONFIG=$T/cluster/admin.kubeconfig; stop it with: bash $here/node.sh --down $T" >&2
    exit "$rc"
  fi
  down
  exit "$rc"
}

down() {
  [ -f "$T/pids" ] || return 0
  local t_down=$SECONDS holder ns
  # shellcheck disable=SC1091
  [ -n "${BIN:-}" ] || { [ -f "$T/cluster/env" ] && . "$T/cluster/env"; } || true
  holder="$(pid_of holder)"
  # The pods first, through the kubelet: their containers stop and their
  # volumes are torn down as on any node (their controllers first, which
  # would make them again). A grace period of 1 s: a suite's pods that sleep
  # (or KAI's, 30 s each) would otherwise hold the teardown for their full
  # period, over a minute in all.
  # Asked again every few rounds: an operator still running (KAI's makes
  # its Deployments again from its Config) or a Job's controller can make
  # pods after the first round, which would hold the loop to its end.
  if [ -n "$(pid_of kubelet)" ] && kill -0 "$(pid_of kubelet)" 2>/dev/null; then
    local left=unknown
    for i in $(seq 0 299); do
      if [ $((i % 15)) = 0 ]; then
        kc delete daemonsets,deployments,replicasets,statefulsets,jobs,cronjobs --all -A --wait=false >/dev/null 2>&1 || true
        kc delete pods --all -A --grace-period=1 --wait=false >/dev/null 2>&1 || true
      fi
      # ("No resources found" goes to stderr; a failed call is not "none")
      if left="$(kc get pods -A --field-selector "spec.nodeName=$NODE_NAME" -o name 2>/dev/null)"; then
        [ -z "$left" ] && break
      else
        left="(kubectl get pods failed)"
      fi
      sleep 0.2
    done
    if [ -z "$left" ]; then
      log "pods gone from the node after $((SECONDS - t_down)) s"
    else
      log "pods still on the node after $((SECONDS - t_down)) s (stopped with the kubelet below): $(echo "$left" | head -5 | tr '\n' ' ')"
    fi
  fi
  stop kubelet
  if [ -n "$(pid_of kube-proxy)" ]; then
    stop kube-proxy
    # Its own clean-up first; the tables as they were come back below.
    # shellcheck disable=SC1091
    [ -n "${KUBELET_DIR:-}" ] || { [ -f "$T/tools.env" ] && . "$T/tools.env"; } || true
    if [ -n "${KUBELET_DIR:-}" ]; then "$KUBELET_DIR/kube-proxy" --cleanup --v=0 >/dev/null 2>&1 || true; fi
  fi
  if [ -n "$holder" ] && kill -0 "$holder" 2>/dev/null && [ -S "$T/containerd/containerd.sock" ]; then
    for c in $(ctr_ containers ls -q 2>/dev/null); do
      ctr_ tasks kill -s KILL "$c" >/dev/null 2>&1 || true
      ctr_ tasks delete -f "$c" >/dev/null 2>&1 || true
      ctr_ containers delete "$c" >/dev/null 2>&1 || true
    done
  fi
  stop containerd
  # What is left: containerd's shims and anything else started in our mount
  # namespace (kai-csi), and container processes (in the kubepods cgroups our
  # kubelet made).
  if [ -n "$holder" ] && ns="$(readlink "/proc/$holder/ns/mnt" 2>/dev/null)"; then
    for p in /proc/[0-9]*; do
      p="${p#/proc/}"
      if [ "$p" != "$holder" ] && [ "$(readlink "/proc/$p/ns/mnt" 2>/dev/null)" = "$ns" ]; then kill -9 "$p" 2>/dev/null || true; fi
    done
  fi
  for procs in $(find /sys/fs/cgroup/*/kubepods -name cgroup.procs 2>/dev/null); do
    while read -r p; do kill -9 "$p" 2>/dev/null || true; done < "$procs"
  done
  stop holder
  # Cgroups go once empty (their processes may take a moment to be reaped).
  for _ in $(seq 100); do
    for c in /sys/fs/cgroup/*/kubepods; do
      if [ -d "$c" ]; then find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null || true; fi
    done
    ls -d /sys/fs/cgroup/*/kubepods >/dev/null 2>&1 || break
    sleep 0.1
  done
  ls -d /sys/fs/cgroup/*/kubepods 2>/dev/null | sed 's/^/node.sh: could not remove cgroup /' >&2 || true
  ip link del "$BRIDGE" 2>/dev/null || true
  for family in iptables ip6tables; do
    if [ -f "$T/$family.host" ]; then
      "$family-restore" < "$T/$family.host" || echo "node.sh: could not restore the host's $family ($T/$family.host)" >&2
    fi
  done
  if [ -d "$T/cluster" ]; then bash "$here/cluster.sh" down "$T/cluster" || true; fi
  # The host's kernel settings must be as they were (the kubelet saw files).
  if [ -f "$T/sysctl.host" ]; then
    local now; now="$(for k in $SYSCTLS; do echo "$k=$(sysctl -n "$k")"; done)"
    [ "$now" = "$(cat "$T/sysctl.host")" ] || { echo "node.sh: the host's kernel settings changed:" >&2; diff "$T/sysctl.host" <(echo "$now") >&2 || true; }
  fi
  rm -rf "$T"
  log "node and control plane down in $((SECONDS - t_down)) s"
}

if [ "$mode" = down ]; then
  T="$(cd "${2:?usage: node.sh --down NODE_DIR}" && pwd)"
  PIDS="$T/pids"
  down
  exit 0
fi

[ "$(id -u)" = 0 ] || die "needs root (containerd, kubelet, mount namespaces)"
need_apt=()
command -v containerd >/dev/null || need_apt+=(containerd)
command -v runc >/dev/null || need_apt+=(runc)
[ -x /usr/lib/cni/bridge ] || need_apt+=(containernetworking-plugins)
command -v debootstrap >/dev/null || need_apt+=(debootstrap)
command -v iptables-save >/dev/null || need_apt+=(iptables)  # kube-proxy's mode; saved and restored
if [ "${#need_apt[@]}" -gt 0 ]; then
  log "installing ${need_apt[*]} (Debian packages)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi
for tool in unshare nsenter openssl curl python3 cc ip ctr; do
  command -v "$tool" >/dev/null || die "'$tool' is missing"
done
[ -x "$HELM" ] || die "no helm at $HELM (set HELM; .ci/run installs one)"
for b in kai-webhook kai-node kai-csi kai-aggregator; do
  [ -x "$target/$b" ] || die "$target/$b is not built (cargo build --bins)"
done
[ -f "$target/libkai_fake_vgpu.so" ] || [ -f "$target/deps/libkai_fake_vgpu.so" ] \
  || die "$target/libkai_fake_vgpu.so is not built (cargo build -p kai-fake-vgpu): the stand-in for libvgpu.so"
grep -qw overlay /proc/filesystems || die "the kernel has no overlayfs (containerd's snapshotter here)"

# Refuse to run where another kubelet or our own leftovers live: both would
# be taken for ours by the clean-up.
for c in /sys/fs/cgroup/*/; do
  [ ! -e "$c/kubepods" ] || die "$c/kubepods exists (another kubelet on this machine, or a run killed with -9: remove it)"
done
if ip link show "$BRIDGE" >/dev/null 2>&1; then die "network device $BRIDGE exists (a run killed with -9? ip link del $BRIDGE)"; fi

t0=$SECONDS
BIN="$(bash "$here/k8s/build.sh" | tail -n1)"
KUBELET_DIR="$(bash "$here/k8s/build.sh" kubelet | tail -n1)"
[ -x "$KUBELET_DIR/kubelet" ] && [ -x "$KUBELET_DIR/kube-proxy" ] || die "k8s/build.sh kubelet built no kubelet and kube-proxy"
IMAGES="$(bash "$here/node/images.sh" | tail -n1)"
# node/registrar, node-driver-registrar's registration half with its flags:
# the chart's csi-registrar sidecar runs it (that image is in no registry
# here; kai-csi's own registration is refused by the kubelet, see
# node/registrar/main.go).
reg_pin="$(cat "$here/node/registrar/main.go" "$here/node/registrar/go.mod" "$here/node/registrar/go.sum" | sha256sum | cut -c1-12)"
REGISTRAR="${XDG_CACHE_HOME:-$HOME/.cache}/kai-tools/node-registrar-$reg_pin/registrar"
if [ ! -x "$REGISTRAR" ]; then
  (cd "$here/node/registrar" && CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -mod=readonly -trimpath" go build -o "$REGISTRAR.partial" . \
    && mv "$REGISTRAR.partial" "$REGISTRAR") || die "could not build node/registrar"
fi
log "binaries and images ready in $((SECONDS - t0)) s"

T="$(mktemp -d "${TMPDIR:-/tmp}/kai-node.XXXXXX")"
T="$(cd "$T" && pwd)"
PIDS="$T/pids"
mkdir -p "$T"/{ns/run,ns/varlog,ns/varlib/kubelet,sysctl,containerd/root,containerd/state,cni/net.d,cni/data,kubelet,podlogs,pki,host}
: > "$T/pids"
echo "KUBELET_DIR=$KUBELET_DIR" > "$T/tools.env"  # for node.sh --down
for k in $SYSCTLS; do echo "$k=$(sysctl -n "$k")"; done > "$T/sysctl.host"
# The kubelet and kube-proxy write iptables rules in the host's network
# namespace (this machine's), IPv4 and IPv6: the tables are put back as they
# were.
iptables-save > "$T/iptables.host"
if command -v ip6tables-save >/dev/null && ip6tables-save > "$T/ip6tables.save" 2>/dev/null; then
  mv "$T/ip6tables.save" "$T/ip6tables.host"
fi

trap teardown EXIT

# --- the control plane ------------------------------------------------------
t1=$SECONDS
KAI_FAKE_NODES="" KAI_API_BIND=0.0.0.0 bash "$here/cluster.sh" up "$T/cluster" >/dev/null
# shellcheck disable=SC1091
. "$T/cluster/env"
log "control plane up in $((SECONDS - t1)) s"

# --- the node's mount namespace ----------------------------------------------
t2=$SECONDS
# (Its stdio is not ours: with --up it outlives this script, and must not
# hold a caller's pipe open.)
unshare --mount --propagation private sleep infinity < /dev/null > /dev/null 2>&1 &
echo "holder $!" >> "$T/pids"
for _ in $(seq 50); do
  [ "$(readlink "/proc/$(pid_of holder)/ns/mnt" 2>/dev/null)" != "$(readlink /proc/self/ns/mnt)" ] && break
  sleep 0.1
done
in_ns mount --bind "$T/ns/run" /run
in_ns mount --bind "$T/ns/varlog" /var/log
# /var/lib is a temp dir too, with the kubelet's --root-dir ($T/kubelet,
# unchanged) bound at /var/lib/kubelet: pods written for a standard node
# find the kubelet there and their hostPaths under /var/lib land in NODE_DIR,
# never on the machine (fake-gpu-operator's device plugin registers through
# /var/lib/kubelet/device-plugins/kubelet.sock and writes /var/lib/runai;
# CNI's cache /var/lib/cni stays here too). A second, private mount of the
# directory: files and sockets are shared, the kubelet's mounts are not
# (a CSI driver's kubeletDir is still $T/kubelet).
in_ns mount --bind "$T/ns/varlib" /var/lib
in_ns mount --bind "$T/kubelet" /var/lib/kubelet
# The kubelet wants these values and writes them when they differ
# (container_manager_linux.go setupKernelTunables); it reads files here.
for kv in vm/overcommit_memory=1 vm/panic_on_oom=0 kernel/panic=10 kernel/panic_on_oops=1 \
          kernel/keys/root_maxkeys=1000000 kernel/keys/root_maxbytes=25000000; do
  f="$T/sysctl/$(echo "${kv%=*}" | tr / _)"
  echo "${kv#*=}" > "$f"
  in_ns mount --bind -o ro "$f" "/proc/sys/${kv%=*}"
done

# --- containerd ----------------------------------------------------------------
# restrict_oom_score_adj: this machine withholds CAP_SYS_RESOURCE, so no
# process may lower its oom_score_adj; containerd gives the sandbox -998, and
# runc then fails with "can't get final child's PID from pipe: EOF".
cat > "$T/containerd.toml" <<EOF
version = 2
root = "$T/containerd/root"
state = "$T/containerd/state"
[grpc]
  address = "$T/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "kai.test/pause:1"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "${SNAPSHOTTER:-overlayfs}"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$T/cni/net.d"
EOF
cat > "$T/cni/net.d/10-kai.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "kai-node",
 "plugins": [
  {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_SUBNET"}]], "routes": [{"dst": "0.0.0.0/0"}],
           "dataDir": "$T/cni/data"}},
  {"type": "loopback"}]}
EOF
bg_in_ns containerd --config "$T/containerd.toml" > "$T/containerd.log" 2>&1
echo "containerd $!" >> "$T/pids"
for _ in $(seq 100); do ctr_ version >/dev/null 2>&1 && break; sleep 0.2; done
ctr_ version >/dev/null 2>&1 || { tail -20 "$T/containerd.log" >&2; die "containerd did not answer on $T/containerd/containerd.sock"; }
for img in debian pause; do ctr_ images import "$IMAGES/$img.oci.tar" >/dev/null; done
# The project's own image, from TARGET_DIR's binaries (not cached: they change).
bash "$here/node/kai_image.sh" "$target" "$KAI_IMAGE" "$T/kai.oci.tar"
bash "$here/node/registrar_image.sh" "$REGISTRAR" "$REGISTRAR_IMAGE" "$T/registrar.oci.tar"
for img in kai registrar; do
  ctr_ images import "$T/$img.oci.tar" >/dev/null
  rm -f "$T/$img.oci.tar"
done
log "containerd $(containerd --version | awk '{print $3}') up, images imported"

# --- the kubelet ----------------------------------------------------------------
pki="$T/cluster/pki"
# client_kubeconfig NAME SUBJECT: a kubeconfig with a client certificate of
# the cluster CA for SUBJECT, in $T/NAME.kubeconfig.
client_kubeconfig() {
  local name=$1 subj=$2
  openssl req -new -newkey rsa:2048 -nodes -keyout "$T/pki/$name.key" -subj "$subj" -out "$T/pki/$name.csr" 2>/dev/null
  printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n' > "$T/pki/$name.ext"
  openssl x509 -req -in "$T/pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial -days 2 -sha256 \
    -extfile "$T/pki/$name.ext" -out "$T/pki/$name.crt" 2>/dev/null
  cat > "$T/$name.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:$API_PORT", certificate-authority: "$pki/ca.crt"}}]
users: [{name: $name, user: {client-certificate: "$T/pki/$name.crt", client-key: "$T/pki/$name.key"}}]
contexts: [{name: c, context: {cluster: c, user: $name}}]
current-context: c
EOF
}
# In group system:nodes: the Node authorizer and NodeRestriction treat it as
# the node's own kubelet.
client_kubeconfig kubelet "/O=system:nodes/CN=system:node:$NODE_NAME"
KUBELET_PORT="$(free_port)"
# failCgroupV1: false: this machine is cgroup v1 (hybrid); the kubelet
# refuses v1 by default since 1.35. cgroupfs: no systemd here. The API server
# (the cluster CA's apiserver-kubelet client) is the only client: x509 only,
# every request it makes allowed. Eviction thresholds low: the test must not
# depend on this machine's free disk.
cat > "$T/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
address: $NODE_IP
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: "$pki/ca.crt"}
authorization: {mode: AlwaysAllow}
podLogsDir: $T/podlogs
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "1Mi", nodefs.available: "1%", nodefs.inodesFree: "1%", imagefs.available: "1%"}
resolvConf: /etc/resolv.conf
clusterDomain: cluster.local
serializeImagePulls: false
containerRuntimeEndpoint: unix://$T/containerd/containerd.sock
EOF
bg_in_ns "$KUBELET_DIR/kubelet" --config "$T/kubelet.yaml" --kubeconfig "$T/kubelet.kubeconfig" \
  --root-dir "$T/kubelet" --hostname-override "$NODE_NAME" --node-ip "$NODE_IP" --v=2 > "$T/kubelet.log" 2>&1
echo "kubelet $!" >> "$T/pids"
ready() { [ "$(kc get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]; }
for _ in $(seq 600); do
  ready && break
  kill -0 "$(pid_of kubelet)" 2>/dev/null || break
  sleep 0.2
done
if ! ready; then
  grep -E '^[EF][0-9]{4}' "$T/kubelet.log" | tail -20 >&2 || true
  tail -5 "$T/kubelet.log" >&2
  die "the kubelet's node $NODE_NAME did not become Ready within 120 s (kubelet log above; $T/kubelet.log)"
fi
# The API server taints a new node not-ready; the node-lifecycle controller,
# which would lift it, is off in cluster.sh (its fake nodes post no
# heartbeats).
kc taint nodes "$NODE_NAME" node.kubernetes.io/not-ready:NoSchedule- >/dev/null 2>&1 || true
log "node $NODE_NAME Ready in $((SECONDS - t2)) s (kubelet $(kc get node "$NODE_NAME" -o jsonpath='{.status.nodeInfo.kubeletVersion}'), $(kc get node "$NODE_NAME" -o jsonpath='{.status.nodeInfo.containerRuntimeVersion}'))"

# --- kube-proxy -------------------------------------------------------------------
# Pods reach the API server (the agent, the aggregator, kai-csi) through the
# `kubernetes` Service's ClusterIP, as on any node: kube-proxy (the same
# pinned module, iptables mode) programs it, and the API server listens on
# NODE_IP (cluster.sh, KAI_API_BIND). Its user system:kube-proxy has the
# default ClusterRole system:node-proxier. It leaves the host's conntrack
# settings alone (maxPerCore 0, timeouts 0) and sets no route_localnet
# (localhostNodePorts false); its iptables rules go at teardown
# (kube-proxy --cleanup, then the tables as they were before the run).
client_kubeconfig kube-proxy "/CN=system:kube-proxy"
cat > "$T/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: "$T/kube-proxy.kubeconfig"}
hostnameOverride: $NODE_NAME
mode: iptables
clusterCIDR: $POD_SUBNET
bindAddress: $NODE_IP
healthzBindAddress: 127.0.0.1:$(free_port)
metricsBindAddress: 127.0.0.1:$(free_port)
iptables: {localhostNodePorts: false}
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
bg_in_ns "$KUBELET_DIR/kube-proxy" --config "$T/kube-proxy.yaml" --v=2 > "$T/kube-proxy.log" 2>&1
echo "kube-proxy $!" >> "$T/pids"
api_svc="$(kc get service kubernetes -n default -o jsonpath='{.spec.clusterIP}')"
# (grep to /dev/null, not -q: an early exit would fail iptables-save with SIGPIPE.)
proxied() { iptables-save -t nat 2>/dev/null | grep -- "-d $api_svc/32 .*default/kubernetes:https" >/dev/null; }
for _ in $(seq 300); do
  proxied && break
  kill -0 "$(pid_of kube-proxy)" 2>/dev/null || break
  sleep 0.2
done
proxied || { tail -20 "$T/kube-proxy.log" >&2; die "kube-proxy programmed no rule for the kubernetes Service ($api_svc) within 60 s ($T/kube-proxy.log)"; }
log "kube-proxy up: the kubernetes Service $api_svc leads to $NODE_IP:$API_PORT"

cat > "$T/node.env" <<EOF
NODE_NAME=$NODE_NAME
NODE_DIR=$T
KUBELET_ROOT=$T/kubelet
CONTAINERD_SOCK=$T/containerd/containerd.sock
HOLDER_PID=$(pid_of holder)
HOST_BASE=$T/host
POD_LOGS=$T/podlogs
KUBELET_LOG=$T/kubelet.log
KAI_IMAGE=$KAI_IMAGE
REGISTRAR_IMAGE=$REGISTRAR_IMAGE
EOF

log "node up in $((SECONDS - t0)) s; stop it with: bash $here/node.sh --down $T"
echo "NODE_DIR=$T"
