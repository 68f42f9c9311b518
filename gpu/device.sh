#!/usr/bin/env bash
# The GPU check on a bare machine that has PyTorch with CUDA but no network (see gpu/README.md).
#
#   bash gpu/device.sh fetch            here, with network: the wheels that image lacks, into .whl/
#   bash gpu/device.sh run [ARGS...]    there: install .whl/*.whl, run gpu/check.py ARGS, copy the
#                                       results to $OUT when it is set
#
# The packages are baton's runtime needs beyond PyTorch, transformers, fsspec, pyyaml, matplotlib and
# pytest (which such an image holds): torchdata for the loader, hera (and pydantic) for the drill, and the
# typing-extensions that pydantic needs (>= 4.16, newer than an image may hold).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
PY=${PYTHON:-python3}
WHEELS=(torchdata==0.11.0 hera==7.1.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0
        typing-inspection==0.4.5 typing-extensions==4.16.0)
# The device tool brought back 8 files of a call (2026-11-30; the rest "left out (count)"): the main
# results travel as files, everything else in one archive.
RESULTS=(gpu-check.json gpu-check.md drill-report.md drill-loss.png preflight.log drill.log)
EXTRAS=(model.log drill-config.yaml preflight.xml drill/argo/logs)

case "${1:-}" in
fetch)
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
    exec "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "${WHEEL_PYTHON:-3.12}" \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl "${WHEELS[@]}"
    ;;
run)
    shift
    if compgen -G ".whl/*.whl" >/dev/null; then
        # --target: the image's own environment may be read-only; PYTHONPATH reaches every child
        # (the check, pytest, torchrun, the drill's pods all prepend the repo to it, never replace it).
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/baton-site .whl/*.whl || exit 1
        export PYTHONPATH=/tmp/baton-site${PYTHONPATH:+:$PYTHONPATH}
    fi
    # Nothing can be reached from that machine: no hub lookups (each would wait for a timeout).
    export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
    mirror() {  # the results so far into $OUT: they come back even when the device call is cut off
        for f in "${RESULTS[@]}"; do
            [ -f "out/gpu-check/$f" ] && cp "out/gpu-check/$f" "$OUT/" 2>/dev/null
        done
        local have=()
        for f in "${EXTRAS[@]}"; do [ -e "out/gpu-check/$f" ] && have+=("$f"); done
        [ ${#have[@]} -gt 0 ] && tar -czf "$OUT/extras.tar.gz.part" -C out/gpu-check "${have[@]}" 2>/dev/null &&
            mv "$OUT/extras.tar.gz.part" "$OUT/extras.tar.gz"
        return 0
    }
    if [ -n "${OUT:-}" ]; then
        (while sleep 10; do mirror; done) &
        mirror_pid=$!
    fi
    "$PY" -m gpu.check --out out/gpu-check "$@"
    rc=$?
    if [ -n "${OUT:-}" ]; then
        kill "$mirror_pid" 2>/dev/null
        mirror
    fi
    exit "$rc"
    ;;
*)
    sed -n '2,9p' "$0" >&2
    exit 2
    ;;
esac
