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
# shellcheck source=build-lib.sh
source "$here/build-lib.sh"

BINARIES=(kueue jobset)
LABEL="kueue binaries" BUILD_CMD="make cluster-build-kueue" PINS=kueue.env
key="kueue-${KUEUE_VERSION}_jobset-${JOBSET_VERSION}_$(cache_key "$here/build-kueue.sh" "$here/kueue.env")"
cache_entry "$key" "${1:-build}"
need_go "$KUEUE_GO_MIN" "Kueue is built from its Go module" \
  "the 'go' line of Kueue $KUEUE_VERSION's go.mod"
start_work "$key" crds jobset-crds webhook rbac

# --- Kueue: its own main module. The version variables are the ones its Makefile sets (LD_FLAGS).
module kueue sigs.k8s.io/kueue "$KUEUE_VERSION" "$KUEUE_SUM" "$KUEUE_GOMOD_SUM" "$KUEUE_COMMIT"
k=sigs.k8s.io/kueue/pkg/version
fetch kueue "$work/kueue-src" ./cmd/kueue
build kueue "$work/kueue-src" ./cmd/kueue \
  "-s -w -X $k.GitVersion=$KUEUE_VERSION -X $k.GitCommit=$KUEUE_COMMIT -X $k.BuildDate=$mod_date"
cp "$work/kueue-src/config/components/crd/bases/"*.yaml "$work/crds/"
cp "$work/kueue-src/config/components/webhook/manifests.yaml" "$work/webhook/manifests.yaml"
cp "$work/kueue-src/config/components/rbac/"*.yaml "$work/rbac/"
rm -rf "$work/kueue-src"

# --- JobSet: its own main module, main.go at its root.
module jobset sigs.k8s.io/jobset "$JOBSET_VERSION" "$JOBSET_SUM" "$JOBSET_GOMOD_SUM" "$JOBSET_COMMIT"
j=sigs.k8s.io/jobset/pkg/version
fetch jobset "$work/jobset-src" .
build jobset "$work/jobset-src" . "-s -w -X $j.GitVersion=$JOBSET_VERSION -X $j.GitCommit=$JOBSET_COMMIT"
cp "$work/jobset-src/config/components/crd/bases/"*.yaml "$work/jobset-crds/"
cp -r "$work/jobset-src/config/components" "$work/jobset-config"
rm -rf "$work/jobset-src"

finish "$key" "kueue=$KUEUE_VERSION jobset=$JOBSET_VERSION"
