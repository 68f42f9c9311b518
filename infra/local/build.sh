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

mode="${1:-build}"
case "$mode" in
  build|--print-dir|--check) ;;
  *) echo "usage: $0 [--print-dir|--check]" >&2; exit 2 ;;
esac

BINARIES=(etcd kube-apiserver kube-controller-manager kube-scheduler workflow-controller argoexec argo)
# The key: the versions, then a hash of what decides the binaries' content. Comment lines of this script
# are left out of the hash, so editing a comment does not cost a rebuild.
sums="$( { cat "$here/versions.env" "$here/etcd/main.go"; \
           cat "$here/kube/go.mod" "$here/kube/go.sum" "$here/etcd/go.mod" "$here/etcd/go.sum"; \
           grep -v '^[[:space:]]*#' "$here/build.sh"; } | sha256sum | cut -c1-12)"
key="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_argo-${ARGO_VERSION}_${sums}"
root="${BATON_CLUSTER_CACHE:-$HOME/.cache/baton/cluster}"
dest="$root/$key"

# complete DIR: empty if DIR is a finished build, else why not (one phrase).
complete() {
  local d="$1" b
  [ -d "$d" ] || { echo "not built"; return; }
  [ -f "$d/.complete" ] || { echo "incomplete (no .complete stamp: a build cut short)"; return; }
  for b in "${BINARIES[@]}"; do
    [ -x "$d/bin/$b" ] || { echo "incomplete (bin/$b is missing)"; return; }
  done
  [ -n "$(ls "$d/crds/" 2>/dev/null)" ] || { echo "incomplete (crds/ is empty)"; return; }
}

case "$mode" in
  --print-dir) echo "$dest"; exit 0 ;;
  --check)
    why="$(complete "$dest")"
    if [ -n "$why" ]; then
      echo "error: cluster binaries in $dest: $why; run: bash infra/local/build.sh" >&2
      exit 1
    fi
    exit 0 ;;
esac

if [ -z "$(complete "$dest")" ]; then
  echo "cluster binaries: cached in $dest"
  exit 0
fi

# The toolchain: one line if it is missing or too old.
if ! command -v go >/dev/null 2>&1; then
  echo "error: no 'go' on PATH: the local control plane is built from Go modules and needs Go >= $GO_MIN" >&2
  exit 2
fi
have_go="$(go env GOVERSION 2>/dev/null | sed 's/^go//')"
if [ -z "$have_go" ] || [ "$(printf '%s\n%s\n' "$GO_MIN" "$have_go" | sort -V | head -1)" != "$GO_MIN" ]; then
  echo "error: Go ${have_go:-of unknown version} is older than $GO_MIN, the newest 'go' line among the go.mod files of Kubernetes $K8S_VERSION, etcd $ETCD_VERSION and Argo $ARGO_VERSION" >&2
  exit 2
fi
# GOTOOLCHAIN=local: use this Go, never download another (etcd's go.mod names a newer toolchain as a
# suggestion). CGO_ENABLED=0: static binaries, as the three projects' own release builds are.
export GOTOOLCHAIN=local CGO_ENABLED=0
export GOFLAGS="-mod=readonly -buildvcs=false -trimpath -p=${BATON_BUILD_JOBS:-2}"

mkdir -p "$root"
# One build per key at a time. A second one waits, then finds the first one's result.
exec 9>"$root/.lock-$key"
if ! flock -n 9; then
  echo "cluster binaries: another build of $key is running; waiting for it"
  flock 9
  if [ -z "$(complete "$dest")" ]; then
    echo "cluster binaries: cached in $dest"
    exit 0
  fi
fi
# The lock is held, so no other build of this key is alive: what it left behind can go.
rm -rf "$root/.build-$key".*
if [ -e "$dest" ]; then
  echo "cluster binaries: $dest is $(complete "$dest"): building it again"
  rm -rf "$dest"
fi

work="$(mktemp -d "$root/.build-$key.XXXXXX")"
child=""
# On any exit before the end: stop the go command still running (by its process ids), drop the work folder.
cleanup() {
  if [ -n "$child" ] && kill -0 "$child" 2>/dev/null; then
    # shellcheck disable=SC2046
    kill -TERM $(descendants "$child") "$child" 2>/dev/null || true
    # shellcheck disable=SC2046
    kill -CONT $(descendants "$child") "$child" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
mkdir -p "$work/bin" "$work/crds"
figures="$work/build-figures.txt"
row='%-24s %7s %8s %7s %16s %12s %8s\n'
timer=""
if [ -x /usr/bin/time ]; then
  timer=/usr/bin/time
else
  echo "warning: /usr/bin/time is missing (Debian package 'time'): peak RSS of the largest process is not recorded"
fi
{
  echo "# $key"
  echo "# Go $have_go, $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GB", $2/1048576}' /proc/meminfo), go build -p=${BATON_BUILD_JOBS:-2}, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "# wall_s: wall time of the go command; paused_s: the part of it during which it was seen stopped (SIGSTOP"
  echo "# from outside, or this script itself stopped); cpu_s: user+system CPU of the go command and its children;"
  echo "# max_proc_rss_mb: the largest single process (compile or link; /usr/bin/time); tree_rss_mb: the summed RSS"
  echo "# of the go command's process tree, sampled every second; size_mb: the binary"
  printf "$row" binary wall_s paused_s cpu_s max_proc_rss_mb tree_rss_mb size_mb
} > "$figures"

# descendants PID: the process ids below PID.
descendants() {
  ps -e -o pid=,ppid= | awk -v top="$1" '
    { parent[$1] = $2 }
    END { for (p in parent) { q = parent[p]; while (q != "" && q != top && q > 1) q = parent[q];
                              if (q == top) print p } }'
}

# tree_rss PID: the summed RSS (kB) of PID and all its descendants.
tree_rss() {
  ps -e -o pid=,ppid=,rss= | awk -v top="$1" '
    { parent[$1] = $2; rss[$1] = $3 }
    END { for (p in parent) { q = p; while (q != "" && q != top && q != 1 && q != 0) q = parent[q];
                              if (q == top) sum += rss[p] } print sum + 0 }'
}

# run_timed NAME DIR CMD...: run CMD in DIR; set $secs, $paused, $cpu (s), $max_rss and $tree_peak (kB).
run_timed() {
  local name="$1" dir="$2"; shift 2
  local t0 pid peak=0 r rc=0 now last state u sy
  t0=$(date +%s); last=$t0; paused=0
  if [ -n "$timer" ]; then
    (cd "$dir" && exec "$timer" -f "%U %S %M" -o "$work/$name.time" "$@") &
  else
    (cd "$dir" && exec "$@") &
  fi
  pid=$!
  child="$pid"
  while kill -0 "$pid" 2>/dev/null; do
    r="$(tree_rss "$pid")"
    [ "$r" -le "$peak" ] || peak="$r"
    # Paused: a gap in this loop (the script was stopped), or the go command seen stopped.
    now=$(date +%s)
    [ $(( now - last )) -le 3 ] || paused=$(( paused + now - last - 1 ))
    last=$now
    state="$(ps -o stat= -p "$pid" --ppid "$pid" 2>/dev/null || true)"
    case "$state" in *T*) paused=$(( paused + 1 )) ;; esac
    sleep 1
  done
  wait "$pid" || rc=$?
  child=""
  secs=$(( $(date +%s) - t0 ))
  cpu="n/a"; max_rss="n/a"
  if [ -n "$timer" ] && [ -s "$work/$name.time" ]; then
    read -r u sy max_rss < <(tail -1 "$work/$name.time")
    cpu="$(awk -v u="$u" -v s="$sy" 'BEGIN { printf "%.0f", u + s }')"
  fi
  tree_peak="$peak"
  return "$rc"
}

# build NAME DIR PACKAGE LDFLAGS: one binary into $work/bin, timed, its memory and size recorded.
build() {
  local name="$1" dir="$2" pkg="$3" ldflags="$4" mb size
  echo "[build] $name: building $pkg"
  if ! run_timed "$name" "$dir" go build -ldflags "$ldflags" -o "$work/bin/$name" "$pkg"; then
    echo "error: building $name ($pkg in $dir) failed after ${secs} s; the cache was left untouched" >&2
    exit 1
  fi
  size=$(stat -c %s "$work/bin/$name")
  mb="n/a"; [ "$max_rss" = "n/a" ] || mb=$(( max_rss / 1024 ))
  # shellcheck disable=SC2059
  printf "$row" "$name" "$secs" "$paused" "$cpu" "$mb" "$(( tree_peak / 1024 ))" "$(( size / 1048576 ))" >> "$figures"
  echo "[build] $name: done in ${secs} s (${paused} s of it paused; CPU ${cpu} s; largest process ${mb} MB, process tree $(( tree_peak / 1024 )) MB), $(( size / 1048576 )) MB"
}

# fetch NAME DIR PACKAGES...: download the modules the packages need, timed apart from the compiling.
fetch() {
  local name="$1" dir="$2"; shift 2
  echo "[build] $name: fetching modules"
  if ! run_timed "fetch-$name" "$dir" sh -c 'go list -deps "$@" > /dev/null' sh "$@"; then
    echo "error: fetching the modules of $name failed (in $dir)" >&2
    exit 1
  fi
  # shellcheck disable=SC2059
  printf "$row" "(fetch $name)" "$secs" "$paused" "$cpu" - - - >> "$figures"
  echo "[build] $name: modules fetched in ${secs} s"
}

# json_field FILE NAME: a top-level string field of `go mod download -json` output.
json_field() { sed -n "s/^\t\"$2\": \"\(.*\)\",*$/\1/p" "$1" | head -1; }
# info_time MODULE VERSION: the release time the module proxy gives the version (its .info), for buildDate.
info_time() {
  local j="$work/info.json"
  go mod download -json "$1@$2" > "$j"
  sed -n 's/.*"Time": *"\([^"]*\)".*/\1/p' "$(json_field "$j" Info)" | head -1
}

start=$(date +%s)

# --- etcd: a main of our own (etcd/main.go, the same as go.etcd.io/etcd/server/v3's own main.go, which
# cannot be `go install`ed: its go.mod replaces api, client and pkg with ../ paths).
fetch etcd "$here/etcd" .
build etcd "$here/etcd" . "-s -w"

# --- Kubernetes: k8s.io/kubernetes through kube/go.mod (the staging modules replaced by their tags).
K8S_CMDS=(kube-apiserver kube-controller-manager kube-scheduler)
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

# --- Argo: its own main module (its go.mod and go.sum), from a writable copy of the module, since the UI is
# embedded from ui/dist/app, which the module zip lacks (yarn builds it). The copy gets a placeholder page
# there, as Argo's Makefile does when the UI is not built (STATIC_FILES=false).
echo "[build] argo: fetching github.com/argoproj/argo-workflows/v3@$ARGO_VERSION"
if ! (cd "$work" && go mod download -json "github.com/argoproj/argo-workflows/v3@$ARGO_VERSION" > "$work/argo.json"); then
  echo "error: cannot download github.com/argoproj/argo-workflows/v3@$ARGO_VERSION: $(grep '"Error"' "$work/argo.json" | head -1)" >&2
  exit 1
fi
argo_sum="$(json_field "$work/argo.json" Sum)"
argo_gomod_sum="$(json_field "$work/argo.json" GoModSum)"
argo_mod="$(json_field "$work/argo.json" Dir)"
argo_commit="$(sed -n 's/.*"Hash": *"\([^"]*\)".*/\1/p' "$(json_field "$work/argo.json" Info)" | head -1)"
if [ "$argo_sum" != "$ARGO_SUM" ] || [ "$argo_gomod_sum" != "$ARGO_GOMOD_SUM" ] || [ "$argo_commit" != "$ARGO_COMMIT" ]; then
  echo "error: github.com/argoproj/argo-workflows/v3@$ARGO_VERSION is not the module pinned in versions.env (sum $argo_sum, go.mod sum $argo_gomod_sum, commit ${argo_commit:-none})" >&2
  exit 1
fi
argo_date="$(sed -n 's/.*"Time": *"\([^"]*\)".*/\1/p' "$(json_field "$work/argo.json" Info)" | head -1)"
cp -r "$argo_mod" "$work/argo-src"
chmod -R u+w "$work/argo-src"
# In Argo's repository workflow/executor/osspecific/signal_linux.go is a symbolic link to signal_darwin.go.
# Module zips leave symbolic links out, so without it argoexec fails on Linux with "undefined: Setpgid"
# (argoproj/argo-workflows#9590 shows the link). Put the link back, as it is in the tagged tree.
osdir="$work/argo-src/workflow/executor/osspecific"
if [ ! -e "$osdir/signal_linux.go" ]; then
  [ -f "$osdir/signal_darwin.go" ] || { echo "error: Argo $ARGO_VERSION has no $osdir/signal_darwin.go to link signal_linux.go to; see infra/local/README.md" >&2; exit 1; }
  ln -s signal_darwin.go "$osdir/signal_linux.go"
fi
mkdir -p "$work/argo-src/ui/dist/app"
cat > "$work/argo-src/ui/dist/app/index.html" <<'EOF'
<!doctype html><title>Argo Workflows</title>
<p>Argo's web UI is not built in baton's local cluster (infra/local/README.md); the API answers under /api/v1/.</p>
EOF
ARGO_CMDS=(workflow-controller argoexec argo)
fetch argo "$work/argo-src" "${ARGO_CMDS[@]/#/./cmd/}"
# The variables Argo's Makefile sets. With gitCommit, gitTag and gitTreeState=clean, `argo version` reports
# the tag, as a release build does.
a=github.com/argoproj/argo-workflows/v3
argo_ldflags="-s -w -X $a.version=$ARGO_VERSION -X $a.buildDate=$argo_date -X $a.gitCommit=$ARGO_COMMIT \
-X $a.gitTag=$ARGO_VERSION -X $a.gitTreeState=clean"
for cmd in "${ARGO_CMDS[@]}"; do
  build "$cmd" "$work/argo-src" "./cmd/$cmd" "$argo_ldflags"
done
cp "$work/argo-src/manifests/base/crds/full/"argoproj.io_*.yaml "$work/crds/"
cp -r "$work/argo-src/manifests" "$work/argo-manifests"
rm -rf "$work/argo-src" "$work"/*.time "$work"/*.json

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
check_version argo "argo: $ARGO_VERSION" version
check_version argoexec "argoexec: $ARGO_VERSION" version

total=$(( $(date +%s) - start ))
# shellcheck disable=SC2059
printf "$row" total "$total" - - - - - >> "$figures"
{
  echo "key=$key"
  echo "k8s=$K8S_VERSION etcd=$ETCD_VERSION argo=$ARGO_VERSION go=$have_go"
  echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  (cd "$work/bin" && sha256sum "${BINARIES[@]}")
} > "$work/.complete.tmp"
mv "$work/.complete.tmp" "$work/.complete"
mv "$work" "$dest"
trap - EXIT
echo "cluster binaries: built in ${total} s into $dest"
cat "$dest/build-figures.txt"
