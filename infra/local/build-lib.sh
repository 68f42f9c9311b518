# What build.sh and build-kueue.sh share: the cache entry and its --check, the Go toolchain check, the lock,
# the work folder, the timed build with its figures, a pinned module's download, and the final stamp.
# Sourced by both, never run. Its lines without comments enter both cache keys (cache_key).
#
# The caller sets, before cache_entry: BINARIES (array), LABEL ("cluster binaries"), BUILD_CMD (what --check
# tells the user to run) and PINS (the .env file the module pins are in, for module's error).

# cache_key NAME FILES...: a 12-hex hash of FILES, of this file and of the caller's script, comment lines of
# the two scripts left out (editing a comment does not cost a rebuild).
cache_key() {
  local script="$1"; shift
  { cat "$@"; grep -hv '^[[:space:]]*#' "$script" "${BASH_SOURCE[0]}"; } | sha256sum | cut -c1-12
}

# cache_entry KEY MODE: sets root and dest; answers --print-dir and --check, and exits when the entry is built.
cache_entry() {
  local key="$1" mode="$2" why
  root="${BATON_CLUSTER_CACHE:-$HOME/.cache/baton/cluster}"
  dest="$root/$key"
  case "$mode" in
    build) ;;
    --print-dir) echo "$dest"; exit 0 ;;
    --check)
      why="$(complete "$dest")"
      if [ -n "$why" ]; then
        echo "error: $LABEL in $dest: $why; run: $BUILD_CMD" >&2
        exit 1
      fi
      exit 0 ;;
    *) echo "usage: $0 [--print-dir|--check]" >&2; exit 2 ;;
  esac
  if [ -z "$(complete "$dest")" ]; then
    echo "$LABEL: cached in $dest"
    exit 0
  fi
}

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

# need_go MIN WHAT WHY_MIN: sets have_go, or exits 2 with one line if go is missing or older than MIN.
need_go() {
  local min="$1" what="$2" why_min="$3"
  if ! command -v go >/dev/null 2>&1; then
    echo "error: no 'go' on PATH: $what and needs Go >= $min" >&2
    exit 2
  fi
  have_go="$(go env GOVERSION 2>/dev/null | sed 's/^go//')"
  if [ -z "$have_go" ] || [ "$(printf '%s\n%s\n' "$min" "$have_go" | sort -V | head -1)" != "$min" ]; then
    echo "error: Go ${have_go:-of unknown version} is older than $min, $why_min" >&2
    exit 2
  fi
  # GOTOOLCHAIN=local: use this Go, never download another (etcd's go.mod names a newer toolchain as a
  # suggestion). CGO_ENABLED=0: static binaries, as the projects' own release builds are.
  export GOTOOLCHAIN=local CGO_ENABLED=0
  export GOFLAGS="-mod=readonly -buildvcs=false -trimpath -p=${BATON_BUILD_JOBS:-2}"
}

# start_work KEY SUBDIRS...: one build per key at a time (a second one waits, then finds the first one's
# result); sets work (a temporary folder beside dest, with SUBDIRS), figures, and the trap that stops the go
# command still running and drops the work folder on any exit before finish.
start_work() {
  local key="$1" d; shift
  mkdir -p "$root"
  exec 9>"$root/.lock-$key"
  if ! flock -n 9; then
    echo "$LABEL: another build of $key is running; waiting for it"
    flock 9
    if [ -z "$(complete "$dest")" ]; then
      echo "$LABEL: cached in $dest"
      exit 0
    fi
  fi
  # The lock is held, so no other build of this key is alive: what it left behind can go.
  rm -rf "$root/.build-$key".*
  if [ -e "$dest" ]; then
    echo "$LABEL: $dest is $(complete "$dest"): building it again"
    rm -rf "$dest"
  fi
  work="$(mktemp -d "$root/.build-$key.XXXXXX")"
  child=""
  trap cleanup EXIT
  trap 'exit 130' INT TERM
  for d in bin "$@"; do mkdir -p "$work/$d"; done
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
    # shellcheck disable=SC2059
    printf "$row" binary wall_s paused_s cpu_s max_proc_rss_mb tree_rss_mb size_mb
  } > "$figures"
  start=$(date +%s)
}

cleanup() {
  if [ -n "$child" ] && kill -0 "$child" 2>/dev/null; then
    # shellcheck disable=SC2046
    kill -TERM $(descendants "$child") "$child" 2>/dev/null || true
    # shellcheck disable=SC2046
    kill -CONT $(descendants "$child") "$child" 2>/dev/null || true
  fi
  rm -rf "$work"
}

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

# build NAME DIR PACKAGE LDFLAGS: one binary into $work/bin, timed, its memory and size recorded.
build() {
  local name="$1" dir="$2" pkg="$3" ldflags="$4" mb size
  echo "[build] $name: building $pkg"
  if ! run_timed "$name" "$dir" nice go build -ldflags "$ldflags" -o "$work/bin/$name" "$pkg"; then
    echo "error: building $name ($pkg in $dir) failed after ${secs} s; the cache was left untouched" >&2
    exit 1
  fi
  size=$(stat -c %s "$work/bin/$name")
  mb="n/a"; [ "$max_rss" = "n/a" ] || mb=$(( max_rss / 1024 ))
  # shellcheck disable=SC2059
  printf "$row" "$name" "$secs" "$paused" "$cpu" "$mb" "$(( tree_peak / 1024 ))" "$(( size / 1048576 ))" >> "$figures"
  echo "[build] $name: done in ${secs} s (${paused} s of it paused; CPU ${cpu} s; largest process ${mb} MB, process tree $(( tree_peak / 1024 )) MB), $(( size / 1048576 )) MB"
}

# json_field FILE NAME: a top-level string field of `go mod download -json` output.
json_field() { sed -n "s/^\t\"$2\": \"\(.*\)\",*$/\1/p" "$1" | head -1; }
# info_time MODULE VERSION: the release time the module proxy gives the version (its .info), for buildDate.
info_time() {
  local j="$work/info.json"
  go mod download -json "$1@$2" > "$j"
  sed -n 's/.*"Time": *"\([^"]*\)".*/\1/p' "$(json_field "$j" Info)" | head -1
}

# module NAME PATH VERSION SUM GOMOD_SUM COMMIT: download a main module, check it is the one pinned (its h1:
# hashes and the tag's commit from the proxy's .info), copy it to $work/NAME-src (writable); set $mod_date
# (the proxy's release time).
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
    echo "error: $path@$version is not the module pinned in $PINS (sum $sum, go.mod sum $gomod, commit ${commit:-none})" >&2
    exit 1
  fi
  mod_date="$(sed -n 's/.*"Time": *"\([^"]*\)".*/\1/p' "$info" | head -1)"
  cp -r "$dir" "$work/$name-src"
  chmod -R u+w "$work/$name-src"
}

# finish KEY VERSIONS: the total in the figures, the .complete stamp written last, the folder moved into place.
finish() {
  local key="$1" versions="$2" total
  rm -rf "$work"/*.time "$work"/*.json
  total=$(( $(date +%s) - start ))
  # shellcheck disable=SC2059
  printf "$row" total "$total" - - - - - >> "$figures"
  {
    echo "key=$key"
    echo "$versions go=$have_go"
    echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    (cd "$work/bin" && sha256sum "${BINARIES[@]}")
  } > "$work/.complete.tmp"
  mv "$work/.complete.tmp" "$work/.complete"
  mv "$work" "$dest"
  trap - EXIT
  echo "$LABEL: built in ${total} s into $dest"
  cat "$dest/build-figures.txt"
}
