#!/usr/bin/env bash
# Build the local control plane from its Go modules, pinned (infra/local/versions.env), into a cache outside
# the repository keyed by every version, the go.mod/go.sum files and this script's commands. A second run
# with a warm cache costs nothing.
#
#   bash infra/local/build.sh                build, or say in one line that the cache holds it already
#   bash infra/local/build.sh --print-dir    print the cache folder (built or not), nothing else
#   bash infra/local/build.sh --check        exit 0 if that folder is complete, else one line and exit 1
#
#   BATON_CLUSTER_CACHE=DIR    the cache's root (default ~/.cache/baton/cluster)
#   BATON_BUILD_JOBS=N         packages compiled at once (go build -p; default 2, which keeps memory bounded)
#
# Output: DIR/bin/{etcd,kube-apiserver,kube-controller-manager,kube-scheduler,workflow-controller,argoexec,argo}
# DIR/crds/ (Argo's CRDs), DIR/argo-manifests/ (Argo's manifests/ tree), DIR/build-figures.txt, DIR/.complete.
# Everything is built in a temporary folder beside DIR and moved into place whole, with .complete (the
# stamp) written last: a build cut short leaves no folder that passes --check.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
# shellcheck source=build-lib.sh
source "$here/build-lib.sh"
# shellcheck source=build-ui.sh
source "$here/build-ui.sh"

BINARIES=(etcd kube-apiserver kube-controller-manager kube-scheduler kubelet pause workflow-controller argoexec argo)
LABEL="cluster binaries" BUILD_CMD="bash infra/local/build.sh" PINS=versions.env
# The key: the versions, then a hash of what decides the binaries' content (versions.env without the install
# manifest's digest, which no binary depends on).
mapfile -t ui_files < <(ui_inputs)
key="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_argo-${ARGO_VERSION}_$(cache_key "$here/build.sh" \
  <(grep -v '^ARGO_INSTALL_SHA256=' "$here/versions.env") "$here/etcd/main.go" "$here/kube/go.mod" "$here/kube/go.sum" "$here/etcd/go.mod" \
  "$here/etcd/go.sum" "$here/build-ui.sh" "${ui_files[@]}")"
cache_entry "$key" "${1:-build}"
need_go "$GO_MIN" "the local control plane is built from Go modules" \
  "the newest 'go' line among the go.mod files of Kubernetes $K8S_VERSION, etcd $ETCD_VERSION and Argo $ARGO_VERSION"
start_work "$key" crds

# --- etcd: a main of our own (etcd/main.go, the same as go.etcd.io/etcd/server/v3's own main.go, which
# cannot be `go install`ed: its go.mod replaces api, client and pkg with ../ paths).
fetch etcd "$here/etcd" .
build etcd "$here/etcd" . "-s -w"

# --- Kubernetes: k8s.io/kubernetes through kube/go.mod (the staging modules replaced by their tags).
K8S_CMDS=(kube-apiserver kube-controller-manager kube-scheduler kubelet)
fetch kubernetes "$here/kube" "${K8S_CMDS[@]/#/k8s.io/kubernetes/cmd/}"
k8s_date="$(cd "$here/kube" && info_time k8s.io/kubernetes "$K8S_VERSION")"
k8s_major="${K8S_VERSION#v}"; k8s_major="${k8s_major%%.*}"
k8s_minor="${K8S_VERSION#v*.}"; k8s_minor="${k8s_minor%%.*}"
# The variables that hack/lib/version.sh sets in Kubernetes' own builds. gitCommit is left empty: the module
# proxy gives no commit for k8s.io/kubernetes, and a made-up one would mislead.
v=k8s.io/component-base/version
k8s_ldflags="-s -w -X $v.gitVersion=$K8S_VERSION -X $v.gitMajor=$k8s_major -X $v.gitMinor=$k8s_minor \
-X $v.gitTreeState=clean -X $v.gitCommit= -X $v.buildDate=$k8s_date"
for cmd in "${K8S_CMDS[@]}"; do
  build "$cmd" "$here/kube" "k8s.io/kubernetes/cmd/$cmd" "$k8s_ldflags"
done
# The pod sandbox's process, as Kubernetes builds it (build/pause/Makefile: its TAG and CFLAGS), from the same
# module: infra/local/image.sh makes it the image registry.k8s.io/pause:TAG that containerd's CRI starts.
pause_src="$(cd "$here/kube" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause"
pause_tag="$(sed -n 's/^TAG ?= *//p' "$pause_src/Makefile")"
[ -n "$pause_tag" ] || { echo "error: no TAG in $pause_src/Makefile" >&2; exit 1; }
gcc -Os -Wall -Werror -static -DVERSION="v$pause_tag-baton" -o "$work/bin/pause" "$pause_src/linux/pause.c"
echo "$pause_tag" > "$work/bin/pause.tag"

# --- Argo: its own main module (its go.mod and go.sum), from a writable copy of the module, since the UI is
# embedded from ui/dist/app, which the module zip lacks (yarn builds it). The copy gets a placeholder page
# there, as Argo's Makefile does when the UI is not built (STATIC_FILES=false).
module argo github.com/argoproj/argo-workflows/v3 "$ARGO_VERSION" "$ARGO_SUM" "$ARGO_GOMOD_SUM" "$ARGO_COMMIT"
# In Argo's repository workflow/executor/osspecific/signal_linux.go is a symbolic link to signal_darwin.go.
# Module zips leave symbolic links out, so without it argoexec fails on Linux with "undefined: Setpgid"
# (argoproj/argo-workflows#9590 shows the link). Put the link back, as it is in the tagged tree.
osdir="$work/argo-src/workflow/executor/osspecific"
if [ ! -e "$osdir/signal_linux.go" ]; then
  [ -f "$osdir/signal_darwin.go" ] || { echo "error: Argo $ARGO_VERSION has no $osdir/signal_darwin.go to link signal_linux.go to; see infra/local/README.md" >&2; exit 1; }
  ln -s signal_darwin.go "$osdir/signal_linux.go"
fi
# --- Argo's UI into ui/dist/app, which ui/embed.go embeds in `argo` (build-ui.sh): the module zip has the UI's
# sources but not the built page.
build_ui "$work/argo-src/ui"
ARGO_CMDS=(workflow-controller argoexec argo)
fetch argo "$work/argo-src" "${ARGO_CMDS[@]/#/./cmd/}"
# The variables Argo's Makefile sets. With gitCommit, gitTag and gitTreeState=clean, `argo version` reports
# the tag, as a release build does.
a=github.com/argoproj/argo-workflows/v3
argo_ldflags="-s -w -X $a.version=$ARGO_VERSION -X $a.buildDate=$mod_date -X $a.gitCommit=$ARGO_COMMIT \
-X $a.gitTag=$ARGO_VERSION -X $a.gitTreeState=clean"
for cmd in "${ARGO_CMDS[@]}"; do
  build "$cmd" "$work/argo-src" "./cmd/$cmd" "$argo_ldflags"
done
cp "$work/argo-src/manifests/base/crds/full/"argoproj.io_*.yaml "$work/crds/"
cp -r "$work/argo-src/manifests" "$work/argo-manifests"
rm -rf "$work/argo-src"

# --- Each binary says the version it was built as, before the cache is stamped.
check_version() {
  local name="$1" want="$2" out
  out="$("$work/bin/$name" "${@:3}" 2>&1 | head -5)" || true
  case "$out" in
    *"$want"*) ;;
    *) echo "error: $name ${*:3} does not say $want: $(echo "$out" | head -1)" >&2; exit 1 ;;
  esac
}
check_version etcd "etcd Version: ${ETCD_VERSION#v}" --version
for cmd in "${K8S_CMDS[@]}"; do check_version "$cmd" "Kubernetes $K8S_VERSION" --version; done
check_version pause "v$pause_tag-baton" -v
check_version argo "argo: $ARGO_VERSION" version
check_version argoexec "argoexec: $ARGO_VERSION" version

finish "$key" "k8s=$K8S_VERSION etcd=$ETCD_VERSION argo=$ARGO_VERSION"
