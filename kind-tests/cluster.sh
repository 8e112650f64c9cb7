#!/usr/bin/env bash
# A real Kubernetes control plane on this machine, no Docker needed:
# etcd, kube-apiserver, kube-controller-manager and kube-scheduler built from
# their pinned Go modules (kind-tests/k8s, built once by k8s/build.sh), all on
# loopback with real TLS, plus two Node objects that look like KAI GPU nodes.
#
#   cluster.sh up [DIR]     start one in DIR (default: a new temp dir); prints DIR
#   cluster.sh down DIR     stop what DIR's cluster started and remove DIR
#   cluster.sh restart-apiserver DIR | stop-apiserver DIR | start-apiserver DIR
#              | stop-etcd DIR | start-etcd DIR
#
# It touches nothing outside DIR and signals only the PIDs it started (DIR/pids).
# DIR/env holds KUBECONFIG (admin), BIN (the binaries), NODE_IP, the ports and
# the node names; DIR/users/<name>.kubeconfig is a kubeconfig per test user
# (client certificates of the cluster CA: tenant-a, tenant-b, viewer).
# KAI_FAKE_NODES="" (set and empty) starts it without the two fake nodes.
# KAI_API_BIND=0.0.0.0 has the API server listen beyond loopback: node.sh's
# pods reach it through the `kubernetes` Service, whose endpoint is NODE_IP.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

die() { echo "cluster.sh: $*" >&2; exit 1; }
log() { echo "cluster.sh: $*" >&2; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# A local address that is not loopback: EndpointSlice validation refuses
# loopback, and the webhook Service must resolve to an address here.
node_ip() {
  local ip
  ip="$(ip -4 -o addr show scope global 2>/dev/null | awk '{split($4,a,"/"); print a[1]; exit}')"
  [ -n "$ip" ] || ip="$(hostname -I 2>/dev/null | awk '{print $1}')"
  [ -n "$ip" ] || die "no non-loopback IPv4 address on this machine (needed for the webhook's EndpointSlice)"
  echo "$ip"
}

# --- PKI -------------------------------------------------------------------
cert() { # name CN O [SAN] : a client or server certificate signed by the CA
  local name=$1 cn=$2 o=$3 san=${4:-}
  local subj="/CN=$cn"; [ -n "$o" ] && subj="/O=$o$subj"
  openssl req -new -newkey rsa:2048 -nodes -keyout "$pki/$name.key" -subj "$subj" \
    -out "$pki/$name.csr" 2>/dev/null
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    if [ -n "$san" ]; then echo "extendedKeyUsage=serverAuth,clientAuth"; echo "subjectAltName=$san"
    else echo "extendedKeyUsage=clientAuth"; fi
  } > "$pki/$name.ext"
  openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 2 -sha256 -extfile "$pki/$name.ext" -out "$pki/$name.crt" 2>/dev/null
  rm -f "$pki/$name.csr" "$pki/$name.ext"
}

kubeconfig() { # file user cert-name
  local file=$1 user=$2 c=$3
  cat > "$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: kai-test
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority: $pki/ca.crt
users:
- name: $user
  user:
    client-certificate: $pki/$c.crt
    client-key: $pki/$c.key
contexts:
- name: kai-test
  context: {cluster: kai-test, user: $user}
current-context: kai-test
EOF
}

# --- processes --------------------------------------------------------------
start() { # name cmd... : run in the background, log to DIR/logs/name.log
  local name=$1; shift
  "$@" >> "$dir/logs/$name.log" 2>&1 &
  echo "$name $!" >> "$dir/pids"
}

. "$(dirname "${BASH_SOURCE[0]}")/pids.sh"  # pid_of, stop (over $PIDS)

wait_for() { # what url [cert args] : poll until it answers 200 "ok"
  local what=$1 url=$2; shift 2
  for _ in $(seq 600); do
    if [ "$(curl -sk --max-time 2 "$@" "$url" 2>/dev/null)" = ok ]; then return 0; fi
    sleep 0.2
  done
  tail -30 "$dir/logs/$what.log" >&2 || true
  die "$what did not become healthy at $url"
}

etcd_cmd() {
  # exec: the background job is etcd itself, so its PID is the one recorded.
  exec "$BIN/etcd" --name kai-test --data-dir "$dir/etcd" \
    --listen-client-urls "https://127.0.0.1:$ETCD_PORT" --advertise-client-urls "https://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "kai-test=http://127.0.0.1:$ETCD_PEER_PORT" \
    --listen-metrics-urls "http://127.0.0.1:$ETCD_METRICS_PORT" \
    --cert-file "$pki/etcd.crt" --key-file "$pki/etcd.key" \
    --client-cert-auth --trusted-ca-file "$pki/ca.crt" --log-level warn
}

start_etcd() {
  start etcd etcd_cmd
  for _ in $(seq 300); do
    curl -s --max-time 2 "http://127.0.0.1:$ETCD_METRICS_PORT/health" | grep -q '"health":"true"' && return 0
    sleep 0.2
  done
  tail -30 "$dir/logs/etcd.log" >&2 || true
  die "etcd did not become healthy"
}

apiserver_cmd() {
  # The admission plugins are the API server's defaults plus NodeRestriction
  # and PodSecurity named explicitly (both are what a kubeadm/GKE cluster
  # runs). --enable-aggregator-routing sends webhook calls to the Service's
  # EndpointSlice addresses rather than its ClusterIP (nothing here routes
  # ClusterIPs). A real kubelet (node.sh) is reached at its InternalIP: its
  # node name resolves nowhere here.
  exec "$BIN/kube-apiserver" \
    --bind-address "${API_BIND:-127.0.0.1}" --secure-port "$API_PORT" --advertise-address "$NODE_IP" \
    --etcd-servers "https://127.0.0.1:$ETCD_PORT" \
    --etcd-cafile "$pki/ca.crt" --etcd-certfile "$pki/apiserver-etcd.crt" --etcd-keyfile "$pki/apiserver-etcd.key" \
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
    --client-ca-file "$pki/ca.crt" \
    --requestheader-client-ca-file "$pki/front-proxy-ca.crt" --requestheader-allowed-names front-proxy-client \
    --requestheader-username-headers X-Remote-User --requestheader-group-headers X-Remote-Group \
    --requestheader-extra-headers-prefix X-Remote-Extra- \
    --proxy-client-cert-file "$pki/front-proxy-client.crt" --proxy-client-key-file "$pki/front-proxy-client.key" \
    --kubelet-client-certificate "$pki/apiserver-kubelet.crt" --kubelet-client-key "$pki/apiserver-kubelet.key" \
    --kubelet-preferred-address-types InternalIP,Hostname \
    --authorization-mode Node,RBAC \
    --enable-admission-plugins NodeRestriction,PodSecurity \
    --service-account-issuer "https://kubernetes.default.svc.cluster.local" \
    --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
    --api-audiences "https://kubernetes.default.svc.cluster.local" \
    --service-cluster-ip-range 10.96.0.0/16 \
    --enable-aggregator-routing=true \
    --allow-privileged=true \
    --feature-gates "$FEATURE_GATES" \
    --profiling=false --v=1
}

start_apiserver() {
  start kube-apiserver apiserver_cmd
  wait_for kube-apiserver "https://127.0.0.1:$API_PORT/readyz" \
    --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key"
}

kc() { "$BIN/kubectl" --kubeconfig "$dir/admin.kubeconfig" "$@"; }

# Two nodes shaped like KAI GPU nodes, one of each kind the chart selects:
# gpu-node-a as the GPU operator / GPU feature discovery labels it,
# gpu-node-b as a GKE GPU node pool (no GPU operator there). Both carry
# nvidia.com/gpu.memory (KAI reads it) and nvidia.com/gpu allocatable. The
# node-lifecycle controller is off (no kubelet heartbeats here), so they stay
# Ready, and untainted once the creation taint is lifted.
add_nodes() {
  for n in $NODES; do
    local kind_labels
    case "$n" in
      *-a) kind_labels='    nvidia.com/gpu.present: "true"
    nvidia.com/gpu.count: "2"
    nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3
    nvidia.com/gpu.deploy.container-toolkit: "true"' ;;
      *) kind_labels='    cloud.google.com/gke-accelerator: nvidia-h100-80gb
    cloud.google.com/gke-gpu: "true"
    cloud.google.com/gke-nodepool: gpu-pool' ;;
    esac
    kc apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Node
metadata:
  name: $n
  labels:
    kubernetes.io/hostname: $n
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    nvidia.com/gpu.memory: "81559"
$kind_labels
EOF
    kc patch node "$n" --subresource=status --type=merge -p "$(cat <<EOF
{"status":{
  "capacity":{"cpu":"64","memory":"512Gi","pods":"250","nvidia.com/gpu":"2","ephemeral-storage":"1Ti"},
  "allocatable":{"cpu":"63","memory":"500Gi","pods":"250","nvidia.com/gpu":"2","ephemeral-storage":"1Ti"},
  "conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","message":"fake node of kind-tests/cluster.sh",
                 "lastHeartbeatTime":"$(date -u +%FT%TZ)","lastTransitionTime":"$(date -u +%FT%TZ)"}],
  "addresses":[{"type":"InternalIP","address":"$NODE_IP"},{"type":"Hostname","address":"$n"}],
  "nodeInfo":{"machineID":"","systemUUID":"","bootID":"","kernelVersion":"","osImage":"","containerRuntimeVersion":"containerd://1.6.20",
              "kubeletVersion":"$K8S_VERSION","kubeProxyVersion":"","operatingSystem":"linux","architecture":"amd64"}}}
EOF
)" >/dev/null
    # The API server taints every new node not-ready; the node-lifecycle
    # controller would lift it on the first Ready heartbeat.
    kc taint nodes "$n" node.kubernetes.io/not-ready:NoSchedule- >/dev/null 2>&1 || true
  done
}

up() {
  dir="${1:-$(mktemp -d "${TMPDIR:-/tmp}/kai-cluster.XXXXXX")}"
  mkdir -p "$dir"/{pki,logs,users}
  dir="$(cd "$dir" && pwd)"
  PIDS="$dir/pids"
  pki="$dir/pki"
  : > "$dir/pids"
  BIN="$(bash "$here/k8s/build.sh" | tail -n1)"
  K8S_VERSION="$(grep -Eo 'k8s.io/kubernetes v[0-9][^ ]*' "$here/k8s/go.mod" | head -n1 | cut -d' ' -f2)"
  NODE_IP="$(node_ip)"
  API_PORT="$(free_port)"; ETCD_PORT="$(free_port)"; ETCD_PEER_PORT="$(free_port)"; ETCD_METRICS_PORT="$(free_port)"
  # KAI_FAKE_NODES="" starts no fake node (node.sh registers a real kubelet).
  NODES="${KAI_FAKE_NODES-gpu-node-a gpu-node-b}"
  # DRA (GA) with consumable capacity: devices shared by claims that each
  # consume part of a capacity (the CSI/DRA issue uses it). Named explicitly
  # so a release that still gates it fails here, loudly.
  FEATURE_GATES="${KAI_FEATURE_GATES:-DRAConsumableCapacity=true}"
  API_BIND="${KAI_API_BIND:-127.0.0.1}"

  log "PKI in $pki"
  openssl req -x509 -new -newkey rsa:2048 -nodes -keyout "$pki/ca.key" -out "$pki/ca.crt" \
    -subj "/CN=kai-test-ca" -days 2 -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" 2>/dev/null
  # The front proxy (aggregated APIs, requestheader authentication) has a CA
  # of its own, as on a kubeadm cluster.
  openssl req -x509 -new -newkey rsa:2048 -nodes -keyout "$pki/front-proxy-ca.key" -out "$pki/front-proxy-ca.crt" \
    -subj "/CN=kai-test-front-proxy-ca" -days 2 -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" 2>/dev/null
  openssl req -new -newkey rsa:2048 -nodes -keyout "$pki/front-proxy-client.key" -subj "/CN=front-proxy-client" \
    -out "$pki/front-proxy-client.csr" 2>/dev/null
  printf 'basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n' > "$pki/front-proxy-client.ext"
  openssl x509 -req -in "$pki/front-proxy-client.csr" -CA "$pki/front-proxy-ca.crt" -CAkey "$pki/front-proxy-ca.key" \
    -CAcreateserial -days 2 -sha256 -extfile "$pki/front-proxy-client.ext" -out "$pki/front-proxy-client.crt" 2>/dev/null
  rm -f "$pki/front-proxy-client.csr" "$pki/front-proxy-client.ext"
  openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
  cert etcd etcd "" "IP:127.0.0.1,DNS:localhost"
  cert apiserver kube-apiserver "" \
    "IP:127.0.0.1,IP:$NODE_IP,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  cert apiserver-etcd kube-apiserver-etcd-client ""
  cert apiserver-kubelet kube-apiserver-kubelet-client "kubeadm:cluster-admins"
  cert admin kubernetes-admin "system:masters"
  cert controller-manager system:kube-controller-manager ""
  cert scheduler system:kube-scheduler ""
  kubeconfig "$dir/admin.kubeconfig" kubernetes-admin admin
  kubeconfig "$dir/controller-manager.kubeconfig" system:kube-controller-manager controller-manager
  kubeconfig "$dir/scheduler.kubeconfig" system:kube-scheduler scheduler
  # Test users: plain identities with no rights until a test binds some.
  for u in tenant-a tenant-b viewer; do
    cert "user-$u" "$u" "kai-test-users"
    kubeconfig "$dir/users/$u.kubeconfig" "$u" "user-$u"
  done

  cat > "$dir/env" <<EOF
export KUBECONFIG=$dir/admin.kubeconfig
BIN=$BIN
K8S_VERSION=$K8S_VERSION
NODE_IP=$NODE_IP
API_PORT=$API_PORT
ETCD_PORT=$ETCD_PORT
ETCD_PEER_PORT=$ETCD_PEER_PORT
ETCD_METRICS_PORT=$ETCD_METRICS_PORT
NODES="$NODES"
FEATURE_GATES=$FEATURE_GATES
API_BIND=$API_BIND
EOF

  local t0=$SECONDS
  start_etcd
  start_apiserver
  # Service-account tokens, Deployments/ReplicaSets/DaemonSets, the garbage
  # collector, namespaces, EndpointSlices... everything but the node
  # lifecycle controller (no kubelets post heartbeats here).
  start kube-controller-manager "$BIN/kube-controller-manager" \
    --kubeconfig "$dir/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$dir/controller-manager.kubeconfig" \
    --authorization-kubeconfig "$dir/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$(free_port)" \
    --controllers '*,-node-lifecycle-controller' \
    --use-service-account-credentials=true \
    --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
    --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key" \
    --feature-gates "$FEATURE_GATES" \
    --leader-elect=false --v=1
  start kube-scheduler "$BIN/kube-scheduler" \
    --kubeconfig "$dir/scheduler.kubeconfig" \
    --authentication-kubeconfig "$dir/scheduler.kubeconfig" \
    --authorization-kubeconfig "$dir/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$(free_port)" \
    --feature-gates "$FEATURE_GATES" \
    --leader-elect=false --v=1
  add_nodes
  # The RuntimeClass the NVIDIA GPU operator installs (monitor.runtimeClassName
  # names it; a pod naming a missing one is refused at admission).
  kc apply -f - >/dev/null <<EOF
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata:
  name: nvidia
handler: nvidia
EOF
  # The controller-manager is up when it has made the default namespace's
  # ServiceAccount (token signing works); the scheduler when its lease-free
  # health answers.
  for _ in $(seq 600); do
    kc get serviceaccount default -n default >/dev/null 2>&1 && break
    sleep 0.2
  done
  kc get serviceaccount default -n default >/dev/null 2>&1 \
    || { tail -30 "$dir/logs/kube-controller-manager.log" >&2; die "controller-manager made no ServiceAccount"; }
  log "control plane $K8S_VERSION up in $((SECONDS - t0)) s: export KUBECONFIG=$dir/admin.kubeconfig"
  echo "$dir"
}

load() {
  dir="$(cd "${1:?usage: cluster.sh $2 DIR}" && pwd)"
  PIDS="$dir/pids"
  pki="$dir/pki"
  [ -f "$dir/env" ] || die "$dir holds no cluster (no env file)"
  # shellcheck disable=SC1091
  . "$dir/env"
}

down() {
  load "$1" down
  # Reverse order of start; only our own PIDs.
  for name in $(awk '{print $1}' "$dir/pids" | tac | awk '!seen[$0]++'); do stop "$name"; done
  rm -rf "$dir"
}

case "${1:-}" in
  up) up "${2:-}" ;;
  down) down "${2:?usage: cluster.sh down DIR}" ;;
  restart-apiserver) load "${2:-}" restart-apiserver; stop kube-apiserver; start_apiserver ;;
  stop-apiserver) load "${2:-}" stop-apiserver; stop kube-apiserver ;;
  start-apiserver) load "${2:-}" start-apiserver; start_apiserver ;;
  stop-etcd) load "${2:-}" stop-etcd; stop etcd ;;
  start-etcd) load "${2:-}" start-etcd; start_etcd ;;
  *) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
