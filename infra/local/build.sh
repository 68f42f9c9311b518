#!/usr/bin/env bash
# Build the local control plane from its Go modules, pinned (infra/local/versions.env), into a cache outside
# the repository keyed by every version and the go.sum files: a second run with a warm cache costs nothing.
#
#   bash infra/local/build.sh            (make cluster-build)
#   BATON_CLUSTER_CACHE=DIR              the cache's root (default ~/.cache/baton/cluster)
#   bash infra/local/build.sh --print-dir    the folder the binaries are (or would be) in, and nothing else
#
# Binaries: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, workflow-controller, argoexec,
# argo (CLI and server), and Argo's CRDs beside them. Built in a temporary folder and moved into place
# whole, with a stamp last: a build cut short leaves no cache that looks complete.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

need_go="1.26"
if ! command -v go >/dev/null 2>&1; then
  echo "error: no Go toolchain on PATH: the local control plane is built from Go modules (Go >= $need_go)" >&2
  exit 2
fi
have_go="$(go env GOVERSION | sed 's/^go//')"
if [ "$(printf '%s\n%s\n' "$need_go" "$have_go" | sort -V | head -1)" != "$need_go" ]; then
  echo "error: Go $have_go is older than $need_go, which k8s.io/kubernetes $K8S_VERSION needs" >&2
  exit 2
fi
export GOTOOLCHAIN=local GOFLAGS="${GOFLAGS:--buildvcs=false} -p=2"

sums="$(cat "$here/versions.env" "$here/kube/go.mod" "$here/kube/go.sum" "$here/etcd/go.mod" "$here/etcd/go.sum" \
        | sha256sum | cut -c1-12)"
key="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_argo-${ARGO_VERSION}_${sums}"
root="${BATON_CLUSTER_CACHE:-$HOME/.cache/baton/cluster}"
dest="$root/$key"
if [ "${1:-}" = "--print-dir" ]; then
  echo "$dest"
  exit 0
fi
BINARIES=(etcd kube-apiserver kube-controller-manager kube-scheduler workflow-controller argoexec argo)
if [ -f "$dest/.complete" ]; then
  echo "cluster binaries: cached in $dest"
  exit 0
fi
if [ -d "$dest" ]; then
  echo "cluster binaries: $dest is incomplete (a build cut short): building it again"
  rm -rf "$dest"
fi
mkdir -p "$root"
work="$(mktemp -d "$root/.build-XXXXXX")"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bin" "$work/crds"
figures="$work/build-figures.txt"
echo "# binary seconds peak_rss_kb size_bytes (Go $have_go, $(nproc) cores)" > "$figures"

ldflags_kube() {
  local v="$K8S_VERSION" major minor
  major="${v#v}"; major="${major%%.*}"
  minor="${v#v*.}"; minor="${minor%%.*}"
  local pkg=k8s.io/component-base/version
  echo "-s -w -X $pkg.gitVersion=$v -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean \
-X $pkg.buildDate=1970-01-01T00:00:00Z -X $pkg.gitCommit=module-$v"
}

# build NAME DIR PACKAGE [LDFLAGS]: one binary, timed, its peak memory recorded.
build() {
  local name="$1" dir="$2" pkg="$3" ldflags="${4:--s -w}" t0 rss
  echo "[build] $name: building ($pkg)"
  t0=$(date +%s)
  (cd "$dir" && /usr/bin/time -f "%M" -o "$work/$name.rss" go build -trimpath -ldflags "$ldflags" -o "$work/bin/$name" "$pkg")
  rss="$(tail -1 "$work/$name.rss")"
  echo "$name $(( $(date +%s) - t0 )) $rss $(stat -c %s "$work/bin/$name")" >> "$figures"
  echo "[build] $name: done in $(( $(date +%s) - t0 )) s, peak RSS $(( rss / 1024 )) MB"
}

if [ ! -x /usr/bin/time ]; then
  echo "error: /usr/bin/time is missing (Debian package 'time'): it records each build's peak memory" >&2
  exit 2
fi
start=$(date +%s)
build etcd "$here/etcd" .
for cmd in kube-apiserver kube-controller-manager kube-scheduler; do
  build "$cmd" "$here/kube" "k8s.io/kubernetes/cmd/$cmd" "$(ldflags_kube)"
done

# Argo is built as its own main module (its go.mod and go.sum), from a writable copy: its UI is embedded
# from ui/dist/app, which the module zip lacks (it is built by yarn), so the copy gets the placeholder page
# Argo's own Makefile makes when the UI is not built.
echo "[build] argo: fetching github.com/argoproj/argo-workflows/v3@$ARGO_VERSION"
argo_mod="$(go mod download -json "github.com/argoproj/argo-workflows/v3@$ARGO_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
cp -r "$argo_mod" "$work/argo-src"
chmod -R u+w "$work/argo-src"
mkdir -p "$work/argo-src/ui/dist/app"
echo "Argo's UI is not built in this local cluster (infra/local/README.md)." > "$work/argo-src/ui/dist/app/index.html"
argo_ldflags="-s -w -X github.com/argoproj/argo-workflows/v3.version=$ARGO_VERSION -X github.com/argoproj/argo-workflows/v3.gitTreeState=clean"
for cmd in workflow-controller argoexec argo; do
  build "$cmd" "$work/argo-src" "./cmd/$cmd" "$argo_ldflags"
done
cp "$work/argo-src/manifests/base/crds/full/"argoproj.io_*.yaml "$work/crds/"
rm -rf "$work/argo-src"

for b in "${BINARIES[@]}"; do
  test -x "$work/bin/$b" || { echo "error: $b was not built" >&2; exit 1; }
done
echo "total $(( $(date +%s) - start ))" >> "$figures"
touch "$work/.complete"
mv "$work" "$dest"
trap - EXIT
echo "cluster binaries: built in $(( $(date +%s) - start )) s into $dest"
cat "$dest/build-figures.txt"
