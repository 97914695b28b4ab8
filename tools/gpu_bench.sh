#!/usr/bin/env bash
# `rematopt bench device` on a lent GPU machine, whose image has JAX with CUDA but neither OR-Tools
# nor Keras: they travel as Python 3.12 wheels in .whl/ (ignored by git). Two steps, from the
# checkout's root (docs/device.md, "On a GPU"):
#
#   tools/gpu_bench.sh fetch                  here, where pip reaches the registries: the wheels into .whl/
#   tools/gpu_bench.sh run [BENCH OPTIONS]    there: install them under /tmp/site, name the device, run
#                                             the bench; report and log to $OUT (default reports/device)
#
# `run` passes its options to the bench (default: --models gpt --time-limit 450, the issue's GPU
# target first, finished inside one 10-minute command with time to spare for the install and JAX's
# start). Without .whl/ it runs on what is installed (how it is tried on CPU).
set -uo pipefail
cd "$(dirname "$0")/.."

# What travels: the versions installed here (what the suite runs with), as CPython 3.12 wheels for
# x86-64. The image has absl, h5py, regex, rich, sentencepiece, tokenizers, pandas and
# typing-extensions, which these need; keras-hub's kagglehub and tensorflow-text are not imported on
# the JAX backend.
PACKAGES=(ortools protobuf immutabledict keras keras-hub namex optree)

case "${1:-}" in
fetch)
    wheels=()
    for name in "${PACKAGES[@]}"; do
        version=$(python3 -c "import importlib.metadata as m; print(m.version('$name'))" 2>/dev/null) \
            || { echo "tools/gpu_bench.sh: $name is not installed here (install what the README's test command needs first)" >&2; exit 2; }
        wheels+=("$name==$version")
    done
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${wheels[@]}" || exit 2
    ls .whl
    ;;
run)
    shift
    out="${OUT:-reports/device}"
    mkdir -p "$out"
    site=""
    if [ -d .whl ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            .whl/*.whl || exit 2
        site="/tmp/site:"
    fi
    export PYTHONPATH="$site$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    export PYTHONUNBUFFERED=1 KERAS_BACKEND=jax
    [ $# -gt 0 ] || set -- --models gpt --time-limit 450
    {
        nvidia-smi -L 2>/dev/null || echo "no nvidia-smi: $(python3 -c 'import jax; print(jax.devices())')"
        python3 -m rematopt bench device --out "$out" "$@"
    } 2>&1 | tee "$out/bench.log"
    ;;
*)
    echo "usage: tools/gpu_bench.sh fetch | run [rematopt bench device options]" >&2
    exit 2
    ;;
esac
