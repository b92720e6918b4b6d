#!/usr/bin/env bash
# gpu_suite.sh [WHEELS]: the GPU suite on a machine with an NVIDIA GPU, CUDA 13 and no
# network (issue 29 item 4). WHEELS (default .gpu) holds the staged cudf wheel set made
# by shared/gpu/wheels.sh: its c1..cN folders and install.sh. Installs it into $SITE
# (default /tmp/site), prints what runs where, runs every test marked gpu, then the
# ETL benchmark on the arrow and cudf backends of the same machine. Logs go to $OUT
# (default gpu_out); each step has its own time limit so a hang still leaves logs.
set -uo pipefail
wheels=${1:-.gpu}; out=${OUT:-gpu_out}; site=${SITE:-/tmp/site}
mkdir -p "$out"
t0=$(date +%s)
bash "$wheels/install.sh" "$site" >"$out/install.log" 2>&1 || { tail -30 "$out/install.log"; exit 1; }
echo "install: $(( $(date +%s) - t0 )) s"
# numba-cuda in the image still registers np.row_stack, which numpy 2.5 removed, so
# `import cudf` fails there; an alias in the target's sitecustomize lets it import.
python3 -c "import numpy, sys; sys.exit(0 if hasattr(numpy, 'row_stack') else 1)" \
  || printf 'import numpy as _np\nif not hasattr(_np, "row_stack"):\n    _np.row_stack = _np.vstack\n' >"$site/sitecustomize.py"
export PYTHONPATH="$site:$PWD" PATH="$site/bin:$PATH" PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -V
  python3 - <<'PY'
import importlib
for m in ("cudf", "dask_cudf", "rmm", "cupy", "numba", "torch", "pandas", "pyarrow", "dask", "distributed"):
    try:
        print(m, importlib.import_module(m).__version__)
    except Exception as e:  # the report says what failed to import, and why
        print(m, "IMPORT FAILED:", type(e).__name__, e)
import tabstream.backends as b
print("cudf backend:", b.gpu_status() or "available")
n = b.gpu_count()
print("GPUs:", n, "-> tasks run on", b.scheduler_for("cudf", n, False))
PY
} 2>&1 | tee "$out/env.txt"
tests=(tests/backends/test_dictionary_kernels.py tests/backends/test_gpu_dask.py
       tests/backends/test_kernels.py tests/backends/test_op_contract.py
       tests/loaders/test_loader_cuda.py tests/loaders/test_loader_torch.py)
timeout "${TEST_LIMIT:-330}" python3 -m pytest -m gpu -rs -p no:cacheprovider --timeout 120 \
  --junitxml "$out/gpu-junit.xml" "${tests[@]}" >"$out/pytest.log" 2>&1
echo "pytest rc $? after $(( $(date +%s) - t0 )) s"
grep -E "^(FAILED|ERROR)|passed|failed" "$out/pytest.log" | tail -40
[ "${BENCH_LIMIT:-150}" = 0 ] && exit 0  # BENCH_LIMIT=0: the tests only
timeout "${BENCH_LIMIT:-150}" python3 benchmarks/etl.py --rows 1000000 --only tabstream --backend arrow,cudf \
  --repeats 1 --formats "${BENCH_FORMATS:-parquet,tsv}" --idle-wait 0 --data-dir /tmp/bench --json "$out/etl.json" >"$out/etl.log" 2>&1
echo "etl rc $? after $(( $(date +%s) - t0 )) s"
tail -25 "$out/etl.log"
