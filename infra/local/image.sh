#!/usr/bin/env bash
# The local cluster's three images, built without a daemon (buildah), as OCI archives that `cluster up` imports
# into its containerd:
#
#   baton     the repository's Dockerfile, unchanged in what it runs, FROM a Debian bookworm base made here from
#             Debian's packages (mmdebstrap; the Dockerfile's BASE build arg), torch from PyPI (its CUDA build,
#             which runs on a CPU: the CPU wheel index is not reachable here)
#   argoexec  Argo's executor, the argoexec that infra/local/build.sh built, on an empty base
#   pause     the pod sandbox, Kubernetes' build/pause/linux/pause.c that build.sh compiled, as Kubernetes ships it
#
#   bash infra/local/image.sh               build what its key does not find, or say that it is there
#   bash infra/local/image.sh --print-dir   the folder of the archives (built or not), nothing else
#   bash infra/local/image.sh --check       exit 0 if every archive is there, else one line and exit 1
#
# Each archive's key is a hash of what it is made of: the base's recipe; the Dockerfile, .dockerignore and every
# file the build copies (git's index of the repository, so an edit to baton's code gives a new key); the binary.
# buildah keeps its layers (--layers) in BATON_CLUSTER_CACHE/buildah: a new key for the code rebuilds only the
# layers above the first COPY, and torch's layer is reused while the Dockerfile's lines above it do not change.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd -P)"
# shellcheck source=versions.env
source "$here/versions.env"
root="${BATON_CLUSTER_CACHE:-$HOME/.cache/baton/cluster}"
bh=(buildah --root "$root/buildah/root" --runroot "$root/buildah/run" --storage-driver overlay)
SUITE=bookworm
BASE_PACKAGES=python3,python3-pip,python-is-python3,passwd,ca-certificates
BASE_SOURCES=("deb http://deb.debian.org/debian $SUITE main" "deb http://deb.debian.org/debian $SUITE-updates main"
              "deb http://deb.debian.org/debian-security $SUITE-security main")
# The names the pods ask for: kubelet's normal form of baton:local, Argo's executor image at the pinned release,
# and the sandbox image of containerd's configuration (infra/local/kubelet.py's pause_image reads the same bin/pause.tag).
BATON_IMAGE=docker.io/library/baton:local
ARGOEXEC_IMAGE="quay.io/argoproj/argoexec:$ARGO_VERSION"

die() { echo "error: $*" >&2; exit 1; }
hash_of() { sha256sum | cut -c1-12; }
file_key() { if [ -f "$1" ]; then hash_of < "$1"; else echo missing; fi; }

bin_dir="$(bash "$here/build.sh" --print-dir)/bin"
pause_tag="$(cat "$bin_dir/pause.tag" 2>/dev/null || echo missing)"
PAUSE_IMAGE="registry.k8s.io/pause:$pause_tag"
base_key="$(printf '%s\n' "$SUITE" "$BASE_PACKAGES" "${BASE_SOURCES[@]}" | cat - <(sed -n '/^build_base()/,/^}/p' "$0") | hash_of)"
code_key="$( (cd "$repo" && git ls-files -co --exclude-standard -- Dockerfile .dockerignore pyproject.toml baton trainer \
  steps workflows examples infra/docker | LC_ALL=C sort | xargs -d '\n' sha256sum; echo "$base_key") | hash_of)"
dir="$root/images"
want=("baton-$code_key.tar" "argoexec-$(file_key "$bin_dir/argoexec").tar" "pause-$(file_key "$bin_dir/pause").tar")

case "${1:-build}" in
  --print-dir) echo "$dir"; exit 0 ;;
  --check)
    for f in "${want[@]}"; do
      [ -f "$dir/$f" ] || { echo "error: image archive $dir/$f is missing; run: make image" >&2; exit 1; }
    done
    exit 0 ;;
  build) ;;
  *) echo "usage: $0 [--print-dir|--check]" >&2; exit 2 ;;
esac

for tool in buildah mmdebstrap; do
  command -v "$tool" >/dev/null || die "no $tool on PATH: apt-get install buildah mmdebstrap (make cluster-build does it)"
done
mkdir -p "$dir" "$root/buildah"
exec 9>"$root/.lock-images"
flock 9

# step SLUG NAME COMMAND...: run one build step, its output in SLUG.log; on failure, the step and its last lines.
step() {
  local slug="$1" name="$2"; shift 2
  local log="$dir/$slug.log" t0=$SECONDS
  echo "image: $name ..."
  # A subshell of its own, so that `set -e` holds inside the step (it does not in an `if`'s condition).
  set +e
  (set -e; "$@") >"$log" 2>&1
  local rc=$?
  set -e
  if [ "$rc" != 0 ]; then
    echo "error: image step '$name' failed; its last lines ($log):" >&2
    tail -n 15 "$log" >&2
    exit 1
  fi
  echo "image: $name done in $((SECONDS - t0)) s"
  printf '%s %s s %s\n' "$slug" "$((SECONDS - t0))" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >> "$dir/figures.txt"
}

build_base() {
  local tar="$dir/base-$base_key.tar" c
  # The host's own added certificate authorities go in too: where the network reaches PyPI through a proxy
  # that signs its own certificates (this machine's), pip in the build must trust what pip here trusts.
  mmdebstrap --variant=minbase --include="$BASE_PACKAGES" \
    --customize-hook='rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED; rm -rf "$1"/var/lib/apt/lists/*' \
    --customize-hook='cp /usr/local/share/ca-certificates/*.crt "$1"/usr/local/share/ca-certificates/ 2>/dev/null || true' \
    --customize-hook='chroot "$1" update-ca-certificates' \
    "$SUITE" "$tar" "${BASE_SOURCES[@]}"
  c="$("${bh[@]}" from scratch)"
  "${bh[@]}" add "$c" "$tar" /
  "${bh[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd /bin/bash "$c"
  "${bh[@]}" commit --rm "$c" "localhost/baton-base:$base_key"
  rm -f "$tar"
}

build_baton() {
  local old new
  "${bh[@]}" rm --all >/dev/null  # a build cut short leaves its working container (and its layer) behind
  old="$("${bh[@]}" images -q "$BATON_IMAGE" 2>/dev/null || true)"
  "${bh[@]}" bud --layers --network host --isolation chroot -f "$repo/Dockerfile" \
    --build-arg "BASE=localhost/baton-base:$base_key" --build-arg TORCH_VARIANT=cuda \
    -t "$BATON_IMAGE" "$repo"
  "${bh[@]}" push "$BATON_IMAGE" "oci-archive:$dir/${want[0]}.part:$BATON_IMAGE"
  mv "$dir/${want[0]}.part" "$dir/${want[0]}"
  # The image the tag moved from goes (its own top layers: six builds had grown the storage to 18 GB, 5.8 GB
  # after); the layer cache stays.
  new="$("${bh[@]}" images -q "$BATON_IMAGE" 2>/dev/null || true)"
  if [ -n "$old" ] && [ "$old" != "$new" ]; then "${bh[@]}" rmi "$old" >/dev/null 2>&1 || true; fi
}

# from_binary ARCHIVE NAME BINARY PATH USER ENTRYPOINT: an image of one static binary on an empty base.
from_binary() {
  local archive="$1" name="$2" binary="$3" path="$4" user="$5" entry="$6" c
  c="$("${bh[@]}" from scratch)"
  "${bh[@]}" copy --chmod 0755 "$c" "$binary" "$path"
  "${bh[@]}" copy --chmod 1777 "$c" "$(mktemp -d)" /tmp  # an empty /tmp, which Go's os.TempDir names
  "${bh[@]}" config --user "$user" --entrypoint "$entry" --env PATH=/usr/local/bin:/usr/bin:/bin "$c"
  "${bh[@]}" commit --rm "$c" "$name"
  "${bh[@]}" push "$name" "oci-archive:$dir/$archive.part:$name"
  mv "$dir/$archive.part" "$dir/$archive"
}

if ! "${bh[@]}" inspect --type image "localhost/baton-base:$base_key" >/dev/null 2>&1; then
  step base "base (mmdebstrap $SUITE: $BASE_PACKAGES)" build_base
fi
[ -f "$dir/${want[0]}" ] || step baton "baton (the Dockerfile, BASE=baton-base, torch from PyPI)" build_baton
[ -x "$bin_dir/argoexec" ] && [ -x "$bin_dir/pause" ] || die "no argoexec or pause in $bin_dir: run make cluster-build"
[ -f "$dir/${want[1]}" ] || step argoexec "argoexec" from_binary "${want[1]}" "$ARGOEXEC_IMAGE" "$bin_dir/argoexec" \
  /bin/argoexec 8737 '["/bin/argoexec"]'
[ -f "$dir/${want[2]}" ] || step pause "pause" from_binary "${want[2]}" "$PAUSE_IMAGE" "$bin_dir/pause" /pause \
  65535:65535 '["/pause"]'
# Older archives of the same image go: one of each is what cluster up imports.
for f in "$dir"/*.tar; do
  keep=0
  for w in "${want[@]}"; do [ "$(basename "$f")" = "$w" ] && keep=1; done
  [ "$keep" = 1 ] || rm -f "$f"
done
printf '%s\n' "${want[@]}" > "$dir/current"
echo "image: $(du -sh "$dir/${want[0]}" | cut -f1) baton, in $dir"
