#!/usr/bin/env bash
# Smoke check of the cached control plane (infra/local/build.sh): every binary says its version; then etcd
# and kube-apiserver start on 127.0.0.1 only (free high ports, a temporary folder), /version and /readyz
# answer an admin token over TLS checked against the serving certificate, and both are stopped and their
# folder removed, whatever happens (trap).
#
#   bash infra/local/smoke.sh              (after bash infra/local/build.sh)
#   BATON_SMOKE_KEEP=1                     keep the temporary folder (logs, certificates) for a look
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
bash "$here/build.sh" --check
bin="$(bash "$here/build.sh" --print-dir)/bin"

for cmd in openssl curl ss; do
  command -v "$cmd" >/dev/null 2>&1 || { echo "error: smoke.sh needs '$cmd' on PATH" >&2; exit 2; }
done

# --- The binaries' versions (no server started).
echo "[smoke] versions"
"$bin/etcd" --version | sed 's/^/  /'
for cmd in kube-apiserver kube-controller-manager kube-scheduler; do
  echo "  $cmd: $("$bin/$cmd" --version)"
done
echo "  $("$bin/argo" version 2>/dev/null | head -1)"
echo "  $("$bin/argoexec" version 2>/dev/null | head -1)"
echo "  workflow-controller --help: $("$bin/workflow-controller" --help 2>/dev/null | head -1)"

tmp="$(mktemp -d /tmp/baton-smoke.XXXXXX)"
pids=()
cleanup() {
  local rc=$? p i
  # Stop what this script started, by process id, the API server first; SIGKILL after 10 s.
  for (( i=${#pids[@]}-1; i>=0; i-- )); do
    p="${pids[$i]}"
    kill -TERM "$p" 2>/dev/null || continue
    for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  if [ "$rc" -ne 0 ]; then
    for log in "$tmp"/*.log; do
      [ -f "$log" ] || continue
      echo "--- last lines of $(basename "$log")" >&2
      tail -15 "$log" >&2
    done
  fi
  if [ -n "${BATON_SMOKE_KEEP:-}" ]; then echo "[smoke] kept $tmp"; else rm -rf "$tmp"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# free_port: a TCP port in 20000-60999 that nothing listens on at 127.0.0.1 (checked, then used: a race
# with another program is possible but unlikely; the start then fails with a clear log).
used=" "
free_port() {
  local p
  for _ in $(seq 1 200); do
    p=$(( 20000 + RANDOM % 41000 ))
    case "$used" in *" $p "*) continue ;; esac
    if ! ss -Htln "sport = :$p" | grep -q .; then echo "$p"; return; fi
  done
  echo "error: no free port found" >&2; return 1
}
etcd_client=$(free_port); used="$used$etcd_client "
etcd_peer=$(free_port); used="$used$etcd_peer "
api_port=$(free_port)

# --- Certificates and keys: a self-signed serving certificate for 127.0.0.1, the service-account key pair,
# and an admin token (group system:masters, which RBAC lets do everything).
echo "[smoke] certificates in $tmp"
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj "/CN=127.0.0.1" \
  -addext "subjectAltName=IP:127.0.0.1,DNS:localhost" \
  -keyout "$tmp/serving.key" -out "$tmp/serving.crt" 2>/dev/null
openssl genrsa -out "$tmp/sa.key" 2048 2>/dev/null
openssl rsa -in "$tmp/sa.key" -pubout -out "$tmp/sa.pub" 2>/dev/null
token="$(openssl rand -hex 24)"
echo "$token,smoke-admin,smoke-admin-uid,system:masters" > "$tmp/tokens.csv"
chmod 600 "$tmp"/*.key "$tmp/tokens.csv"

# --- etcd.
echo "[smoke] etcd on 127.0.0.1:$etcd_client (peer $etcd_peer)"
"$bin/etcd" --name smoke --data-dir "$tmp/etcd" \
  --listen-client-urls "http://127.0.0.1:$etcd_client" --advertise-client-urls "http://127.0.0.1:$etcd_client" \
  --listen-peer-urls "http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
  --initial-cluster "smoke=http://127.0.0.1:$etcd_peer" --initial-cluster-state new \
  > "$tmp/etcd.log" 2>&1 &
pids+=($!)
for i in $(seq 1 100); do
  curl -sf "http://127.0.0.1:$etcd_client/health" 2>/dev/null | grep -q '"health":"true"' && break
  kill -0 "${pids[0]}" 2>/dev/null || { echo "error: etcd exited (log below)" >&2; exit 1; }
  [ "$i" -lt 100 ] || { echo "error: etcd not healthy after 20 s" >&2; exit 1; }
  sleep 0.2
done
echo "[smoke] etcd healthy: $(curl -s "http://127.0.0.1:$etcd_client/version")"

# --- kube-apiserver. --endpoint-reconciler-type none: the default (lease) reconciler refuses a loopback
# --advertise-address ("may not be in the loopback range"); with none, the default/kubernetes Service gets
# no endpoints, which nothing in this check needs.
echo "[smoke] kube-apiserver on 127.0.0.1:$api_port"
t0=$(date +%s)
"$bin/kube-apiserver" \
  --etcd-servers "http://127.0.0.1:$etcd_client" \
  --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" \
  --tls-cert-file "$tmp/serving.crt" --tls-private-key-file "$tmp/serving.key" --cert-dir "$tmp/certs" \
  --service-account-issuer "https://127.0.0.1:$api_port" \
  --service-account-key-file "$tmp/sa.pub" --service-account-signing-key-file "$tmp/sa.key" \
  --service-cluster-ip-range 10.96.0.0/24 \
  --endpoint-reconciler-type none \
  --authorization-mode RBAC --token-auth-file "$tmp/tokens.csv" \
  --profiling=false \
  > "$tmp/kube-apiserver.log" 2>&1 &
pids+=($!)
api() { curl -s --cacert "$tmp/serving.crt" -H "Authorization: Bearer $token" "https://127.0.0.1:$api_port$1"; }
ready=""
for i in $(seq 1 240); do
  ready="$(api /readyz 2>/dev/null || true)"
  [ "$ready" = ok ] && break
  kill -0 "${pids[1]}" 2>/dev/null || { echo "error: kube-apiserver exited (log below)" >&2; exit 1; }
  [ "$i" -lt 240 ] || { echo "error: kube-apiserver /readyz not ok after 120 s: $ready" >&2; exit 1; }
  sleep 0.5
done
echo "[smoke] /readyz: $ready (after $(( $(date +%s) - t0 )) s)"
version="$(api /version)"
echo "[smoke] /version: $(echo "$version" | tr -d ' \n')"
echo "$version" | grep -q "\"gitVersion\": \"$K8S_VERSION\"" \
  || { echo "error: /version does not say gitVersion $K8S_VERSION" >&2; exit 1; }
# Without the token, RBAC must refuse (anonymous may read /version and /readyz, not the API).
code="$(curl -s -o /dev/null -w '%{http_code}' --cacert "$tmp/serving.crt" "https://127.0.0.1:$api_port/api/v1/namespaces")"
[ "$code" = 401 ] || [ "$code" = 403 ] || { echo "error: anonymous GET /api/v1/namespaces gave $code, not 401/403" >&2; exit 1; }
echo "[smoke] anonymous GET /api/v1/namespaces: $code; with the token: $(api /api/v1/namespaces | grep -c '"name":') namespaces"

# --- Everything they listen on is on 127.0.0.1.
listening="$(ss -Htlnp | grep -E "pid=($(IFS='|'; echo "${pids[*]}"))," | awk '{print $4}' | sort -u)"
echo "[smoke] listening: $(echo "$listening" | tr '\n' ' ')"
if echo "$listening" | grep -qv '^127\.0\.0\.1:'; then
  echo "error: something listens beyond 127.0.0.1: $(echo "$listening" | grep -v '^127\.0\.0\.1:' | tr '\n' ' ')" >&2
  exit 1
fi
echo "[smoke] ok: etcd ${ETCD_VERSION} and kube-apiserver ${K8S_VERSION} answered on 127.0.0.1; stopping both"
