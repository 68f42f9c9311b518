#!/usr/bin/env bash
# Build Kueue's controller manager (and JobSet's) from their Go modules, pinned (infra/local/kueue.env), into
# a cache entry of their own beside the control plane's: kueue-<v>_jobset-<v>_<hash>/. The control plane's
# entry (build.sh, versions.env) is not touched, and neither is its key. A warm cache costs nothing.
#
#   bash infra/local/build-kueue.sh                build, or say in one line that the cache holds it already
#   bash infra/local/build-kueue.sh --print-dir    print the cache folder (built or not), nothing else
#   bash infra/local/build-kueue.sh --check        exit 0 if that folder is complete, else one line and exit 1
#
#   BATON_CLUSTER_CACHE=DIR    the cache's root (default ~/.cache/baton/cluster), shared with build.sh
#   BATON_BUILD_JOBS=N         packages compiled at once (go build -p; default 2)
#
# Output: DIR/bin/{kueue,jobset}, DIR/crds/ (Kueue's CRDs, config/components/crd/bases),
# DIR/rbac/ (Kueue's config/components/rbac), DIR/webhook/manifests.yaml (Kueue's webhook configurations
# as the module ships them: infra/local/kueue.py rewrites them to loopback URLs), DIR/jobset-crds/ and
# DIR/jobset-config/ (JobSet's CRD and config/components), DIR/build-figures.txt, DIR/.complete (last).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=kueue.env
source "$here/kueue.env"

mode="${1:-build}"
case "$mode" in
  build|--print-dir|--check) ;;
  *) echo "usage: $0 [--print-dir|--check]" >&2; exit 2 ;;
esac

BINARIES=(kueue jobset)
# Comment lines are left out of the hash, so editing a comment does not cost a rebuild.
sums="$( { cat "$here/kueue.env"; grep -v '^[[:space:]]*#' "$here/build-kueue.sh"; } | sha256sum | cut -c1-12)"
key="kueue-${KUEUE_VERSION}_jobset-${JOBSET_VERSION}_${sums}"
root="${BATON_CLUSTER_CACHE:-$HOME/.cache/baton/cluster}"
dest="$root/$key"

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
      echo "error: Kueue binaries in $dest: $why; run: make cluster-build-kueue" >&2
      exit 1
    fi
    exit 0 ;;
esac

if [ -z "$(complete "$dest")" ]; then
  echo "kueue binaries: cached in $dest"
  exit 0
fi

if ! command -v go >/dev/null 2>&1; then
  echo "error: no 'go' on PATH: Kueue is built from its Go module and needs Go >= $KUEUE_GO_MIN" >&2
  exit 2
fi
have_go="$(go env GOVERSION 2>/dev/null | sed 's/^go//')"
if [ -z "$have_go" ] || [ "$(printf '%s\n%s\n' "$KUEUE_GO_MIN" "$have_go" | sort -V | head -1)" != "$KUEUE_GO_MIN" ]; then
  echo "error: Go ${have_go:-of unknown version} is older than $KUEUE_GO_MIN, the 'go' line of Kueue $KUEUE_VERSION's go.mod" >&2
  exit 2
fi
export GOTOOLCHAIN=local CGO_ENABLED=0
export GOFLAGS="-mod=readonly -buildvcs=false -trimpath -p=${BATON_BUILD_JOBS:-2}"

mkdir -p "$root"
exec 9>"$root/.lock-$key"
if ! flock -n 9; then
  echo "kueue binaries: another build of $key is running; waiting for it"
  flock 9
  if [ -z "$(complete "$dest")" ]; then
    echo "kueue binaries: cached in $dest"
    exit 0
  fi
fi
rm -rf "$root/.build-$key".*
if [ -e "$dest" ]; then
  echo "kueue binaries: $dest is $(complete "$dest"): building it again"
  rm -rf "$dest"
fi

work="$(mktemp -d "$root/.build-$key.XXXXXX")"
child=""
descendants() {
  ps -e -o pid=,ppid= | awk -v top="$1" '
    { parent[$1] = $2 }
    END { for (p in parent) { q = parent[p]; while (q != "" && q != top && q > 1) q = parent[q];
                              if (q == top) print p } }'
}
tree_rss() {
  ps -e -o pid=,ppid=,rss= | awk -v top="$1" '
    { parent[$1] = $2; rss[$1] = $3 }
    END { for (p in parent) { q = p; while (q != "" && q != top && q != 1 && q != 0) q = parent[q];
                              if (q == top) sum += rss[p] } print sum + 0 }'
}
cleanup() {
  if [ -n "$child" ] && kill -0 "$child" 2>/dev/null; then
    # shellcheck disable=SC2046
    kill -TERM $(descendants "$child") "$child" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
mkdir -p "$work/bin" "$work/crds" "$work/jobset-crds" "$work/webhook" "$work/rbac"
figures="$work/build-figures.txt"
row='%-24s %7s %8s %16s %12s %8s\n'
timer=""
[ -x /usr/bin/time ] && timer=/usr/bin/time
{
  echo "# $key"
  echo "# Go $have_go, $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GB", $2/1048576}' /proc/meminfo), go build -p=${BATON_BUILD_JOBS:-2}, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "# wall_s: wall time of the go command; cpu_s: user+system CPU of it and its children; max_proc_rss_mb:"
  echo "# the largest single process (/usr/bin/time); tree_rss_mb: the summed RSS of the go command's process"
  echo "# tree, sampled every second; size_mb: the binary"
  printf "$row" binary wall_s cpu_s max_proc_rss_mb tree_rss_mb size_mb
} > "$figures"

# run_timed NAME DIR CMD...: sets $secs, $cpu, $max_rss (kB), $tree_peak (kB).
run_timed() {
  local name="$1" dir="$2"; shift 2
  local t0 pid peak=0 r rc=0 u sy
  t0=$(date +%s)
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

json_field() { sed -n "s/^\t\"$2\": \"\(.*\)\",*$/\1/p" "$1" | head -1; }

# module NAME PATH VERSION SUM GOMOD_SUM COMMIT: download the module, check it is the one pinned, copy it to
# $work/NAME-src (writable); set $mod_date (the proxy's release time).
module() {
  local name="$1" path="$2" version="$3" want_sum="$4" want_gomod="$5" want_commit="$6" j sum gomod dir info commit
  j="$work/$name.json"
  echo "[build] $name: fetching $path@$version"
  if ! (cd "$work" && go mod download -json "$path@$version" > "$j"); then
    echo "error: cannot download $path@$version: $(grep '"Error"' "$j" | head -1)" >&2
    exit 1
  fi
  sum="$(json_field "$j" Sum)"; gomod="$(json_field "$j" GoModSum)"; dir="$(json_field "$j" Dir)"
  info="$(json_field "$j" Info)"
  commit="$(sed -n 's/.*"Hash": *"\([^"]*\)".*/\1/p' "$info" | head -1)"
  if [ "$sum" != "$want_sum" ] || [ "$gomod" != "$want_gomod" ] || [ "$commit" != "$want_commit" ]; then
    echo "error: $path@$version is not the module pinned in kueue.env (sum $sum, go.mod sum $gomod, commit ${commit:-none})" >&2
    exit 1
  fi
  mod_date="$(sed -n 's/.*"Time": *"\([^"]*\)".*/\1/p' "$info" | head -1)"
  cp -r "$dir" "$work/$name-src"
  chmod -R u+w "$work/$name-src"
}

# build NAME SRC PACKAGE LDFLAGS: fetch its modules (timed apart), then build it into $work/bin.
build() {
  local name="$1" src="$2" pkg="$3" ldflags="$4" mb size
  echo "[build] $name: fetching the modules of $pkg"
  if ! run_timed "fetch-$name" "$src" go list -deps "$pkg" > /dev/null; then
    echo "error: fetching the modules of $name failed" >&2; exit 1
  fi
  # shellcheck disable=SC2059
  printf "$row" "(fetch $name)" "$secs" "$cpu" - - - >> "$figures"
  echo "[build] $name: building $pkg"
  if ! run_timed "$name" "$src" nice go build -ldflags "$ldflags" -o "$work/bin/$name" "$pkg"; then
    echo "error: building $name ($pkg) failed after ${secs} s; the cache was left untouched" >&2
    exit 1
  fi
  size=$(stat -c %s "$work/bin/$name")
  mb="n/a"; [ "$max_rss" = "n/a" ] || mb=$(( max_rss / 1024 ))
  # shellcheck disable=SC2059
  printf "$row" "$name" "$secs" "$cpu" "$mb" "$(( tree_peak / 1024 ))" "$(( size / 1048576 ))" >> "$figures"
  echo "[build] $name: done in ${secs} s (CPU ${cpu} s; largest process ${mb} MB, process tree $(( tree_peak / 1024 )) MB), $(( size / 1048576 )) MB"
}

start=$(date +%s)

# --- Kueue: its own main module. The version variables are the ones its Makefile sets (LD_FLAGS).
module kueue sigs.k8s.io/kueue "$KUEUE_VERSION" "$KUEUE_SUM" "$KUEUE_GOMOD_SUM" "$KUEUE_COMMIT"
k=sigs.k8s.io/kueue/pkg/version
build kueue "$work/kueue-src" ./cmd/kueue \
  "-s -w -X $k.GitVersion=$KUEUE_VERSION -X $k.GitCommit=$KUEUE_COMMIT -X $k.BuildDate=$mod_date"
cp "$work/kueue-src/config/components/crd/bases/"*.yaml "$work/crds/"
cp "$work/kueue-src/config/components/webhook/manifests.yaml" "$work/webhook/manifests.yaml"
cp "$work/kueue-src/config/components/rbac/"*.yaml "$work/rbac/"
rm -rf "$work/kueue-src"

# --- JobSet: its own main module, main.go at its root.
module jobset sigs.k8s.io/jobset "$JOBSET_VERSION" "$JOBSET_SUM" "$JOBSET_GOMOD_SUM" "$JOBSET_COMMIT"
j=sigs.k8s.io/jobset/pkg/version
build jobset "$work/jobset-src" . "-s -w -X $j.GitVersion=$JOBSET_VERSION -X $j.GitCommit=$JOBSET_COMMIT"
cp "$work/jobset-src/config/components/crd/bases/"*.yaml "$work/jobset-crds/"
cp -r "$work/jobset-src/config/components" "$work/jobset-config"
rm -rf "$work/jobset-src" "$work"/*.time "$work"/*.json

total=$(( $(date +%s) - start ))
# shellcheck disable=SC2059
printf "$row" total "$total" - - - - >> "$figures"
{
  echo "key=$key"
  echo "kueue=$KUEUE_VERSION jobset=$JOBSET_VERSION go=$have_go"
  echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  (cd "$work/bin" && sha256sum "${BINARIES[@]}")
} > "$work/.complete.tmp"
mv "$work/.complete.tmp" "$work/.complete"
mv "$work" "$dest"
trap - EXIT
echo "kueue binaries: built in ${total} s into $dest"
cat "$dest/build-figures.txt"
