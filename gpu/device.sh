#!/usr/bin/env bash
# The GPU check on a bare machine that has PyTorch with CUDA but no network (see gpu/README.md).
#
#   bash gpu/device.sh fetch            here, with network: the wheels that image lacks, into .whl/
#   bash gpu/device.sh run [ARGS...]    there: install .whl/*.whl, run gpu/check.py ARGS, copy the
#                                       results to $OUT when it is set
#
# The packages are baton's runtime needs beyond PyTorch, transformers, fsspec, pyyaml, matplotlib and
# pytest (which such an image holds): torchdata for the loader, hera (and pydantic) for the drill.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
PY=${PYTHON:-python3}
WHEELS=(torchdata==0.11.0 hera==7.1.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0
        typing-inspection==0.4.5)
RESULTS=(gpu-check.json gpu-check.md drill-report.md drill-loss.png preflight.log drill.log model.log)

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
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl || exit 1
    fi
    export PYTHONUNBUFFERED=1
    "$PY" gpu/check.py --out out/gpu-check "$@"
    rc=$?
    if [ -n "${OUT:-}" ]; then
        for f in "${RESULTS[@]}"; do
            [ -f "out/gpu-check/$f" ] && cp "out/gpu-check/$f" "$OUT/"
        done
    fi
    exit "$rc"
    ;;
*)
    sed -n '2,9p' "$0" >&2
    exit 2
    ;;
esac
