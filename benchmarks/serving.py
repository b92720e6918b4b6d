"""Serving latency: raw rows to scores through the one exported artifact (the
Workflow's in-graph transforms + the model) against ``Workflow.transform`` in
Python followed by the exported model alone, for torch and Keras.

    python benchmarks/serving.py                         # both frameworks
    python benchmarks/serving.py --framework torch --requests 300
    python benchmarks/serving.py --clock cpu     # this process's CPU time per request
    python benchmarks/serving.py --framework torch --aoti   # the artifact compiled by AOTInductor

A Criteo-like workflow (``--cats`` string columns through Categorify(freq_threshold=2),
one HashBucket column, ``--conts`` float columns through FillMissing >> Clip >> LogOp
>> Normalize, a TARGET label) is fitted on ``--fit-rows`` rows and a DLRM is built on
its output schema. Both paths are exported and loaded back from disk (torch.export
programs; SavedModels). Requests of 1 and 256 rows are drawn from fresh rows (unseen
values and nulls included). What is timed per request:

* artifact: the raw arrays -> tensors (``torch.from_numpy`` / ``tf.constant``) and
  one call of the loaded artifact;
* python: the raw pandas frame -> ``Workflow.transform`` -> tensors -> one call of
  the loaded model.

The scores of the two paths are checked equal (1e-6) on every request size.
``--clock cpu`` times each request in CPU seconds of this process
(``time.process_time``) instead of wall time: on a machine shared with other work
it counts what the request itself costs, not the time spent waiting for a core.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
import pandas as pd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import format_table, machine_note  # noqa: E402

import tabstream as ts  # noqa: E402
from tabstream import ops  # noqa: E402
from tabstream.core.schema import Tags  # noqa: E402
from tabstream.serving.inputs import raw_arrays  # noqa: E402


def _frame(rng: np.random.Generator, n: int, cats: int, conts: int) -> pd.DataFrame:
    data: dict[str, object] = {}
    for c in range(cats):
        ids = rng.zipf(1.3, n) % 50_000
        col = pd.Series([format(int(i), "x") for i in ids], dtype=object)
        col[rng.random(n) < 0.05] = None
        data[f"C{c}"] = col
    for c in range(conts):
        x = rng.exponential(10, n)
        x[rng.random(n) < 0.05] = np.nan
        data[f"I{c}"] = x
    data["label"] = rng.integers(0, 2, n)
    return pd.DataFrame(data)


def _workflow(cats: int, conts: int) -> ts.Workflow:
    cat_names = [f"C{c}" for c in range(cats)]
    cont_names = [f"I{c}" for c in range(conts)]
    cat = cat_names[1:] >> ops.Categorify(freq_threshold=2)
    hashed = cat_names[:1] >> ops.HashBucket(10_000)
    cont = cont_names >> ops.FillMissing(0) >> ops.Clip(min_value=0) >> ops.LogOp() >> ops.Normalize()
    return ts.Workflow(cat + hashed + cont + (["label"] >> ops.AddTags([Tags.TARGET])))


def _percentiles(times: list[float]) -> tuple[float, float]:
    ms = np.asarray(times) * 1e3
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


def _requests(args, size: int, seed: int) -> list[pd.DataFrame]:
    rng = np.random.default_rng(seed)
    pool = _frame(rng, size * args.requests, args.cats, args.conts).drop(columns=["label"])
    return [pool.iloc[i * size:(i + 1) * size].reset_index(drop=True) for i in range(args.requests)]


def bench_torch(args, wf: ts.Workflow, folder: str) -> list[list[object]]:
    import torch

    from tabstream.serving.torch import export
    from tabstream.train.torch import DLRM

    torch.manual_seed(0)
    schema = wf.output_schema
    model = DLRM(schema).eval()
    module = wf.to_torch()
    example = _requests(args, 64, 99)[0]
    tensors = {k: torch.from_numpy(v.copy()) for k, v in raw_arrays(example, module.plan.inputs, "torch").items()}
    torch.export.save(export(module, tensors, model=model), os.path.join(folder, "artifact.pt2"))
    features = _model_inputs_torch(wf, example, schema)
    batch = torch.export.Dim("batch", min=1)
    plain = torch.export.export(model, (features,), dynamic_shapes=({k: {0: batch} for k in features},))
    torch.export.save(plain, os.path.join(folder, "model.pt2"))
    artifact = torch.export.load(os.path.join(folder, "artifact.pt2")).module()
    label = "torch"
    if args.aoti:  # the same program compiled ahead of time (C++), loaded by torch alone
        t0 = time.perf_counter()
        path = torch._inductor.aoti_compile_and_package(torch.export.load(os.path.join(folder, "artifact.pt2")),
                                                        package_path=os.path.join(folder, "artifact_aoti.pt2"))
        print(f"AOTInductor compile: {time.perf_counter() - t0:.0f} s wall", flush=True)
        artifact = torch._inductor.aoti_load_package(path)
        label = "torch-aoti"
    served_model = torch.export.load(os.path.join(folder, "model.pt2")).module()

    def via_artifact(frame):
        arrays = raw_arrays(frame, module.plan.inputs, "torch")
        with torch.no_grad():
            return artifact({k: torch.from_numpy(v) for k, v in arrays.items()})

    def via_python(frame):
        with torch.no_grad():
            return served_model(_model_inputs_torch(wf, frame, schema))

    return _measure(args, label, via_artifact, via_python, lambda s: s.numpy())


def _model_inputs_torch(wf, frame, schema):
    import torch

    out = wf.transform(frame)
    return {c.name: torch.from_numpy(out[c.name].to_numpy(dtype=np.dtype(c.dtype), na_value=np.nan).copy())
            for c in schema}


def bench_keras(args, wf: ts.Workflow, folder: str) -> list[list[object]]:
    import tensorflow as tf

    from tabstream.serving.keras import export
    from tabstream.train.tensorflow import DLRM

    schema = wf.output_schema
    model = DLRM(schema, seed=0)
    layer = wf.to_keras()
    example = _requests(args, 64, 99)[0]
    model(_model_inputs_tf(wf, example, schema))  # built
    export(layer, os.path.join(folder, "artifact"), model=model)
    model.export(os.path.join(folder, "model"), verbose=False)
    artifact = tf.saved_model.load(os.path.join(folder, "artifact"))
    served_model = tf.saved_model.load(os.path.join(folder, "model"))

    def via_artifact(frame):
        arrays = raw_arrays(frame, layer.plan.inputs, "keras")
        return artifact.serve({k: tf.constant(v) for k, v in arrays.items()})

    def via_python(frame):
        return served_model.serve(_model_inputs_tf(wf, frame, schema))

    return _measure(args, "keras", via_artifact, via_python, lambda s: s.numpy())


def _model_inputs_tf(wf, frame, schema):
    import tensorflow as tf

    out = wf.transform(frame)
    return {c.name: tf.constant(out[c.name].to_numpy(dtype=np.dtype(c.dtype), na_value=np.nan))
            for c in schema}


def _measure(args, framework, via_artifact, via_python, to_numpy) -> list[list[object]]:
    rows = []
    for size in (1, 256):
        requests = _requests(args, size, size)
        for frame in requests[:3]:  # warm up, and the two paths agree
            np.testing.assert_allclose(to_numpy(via_artifact(frame)), to_numpy(via_python(frame)),
                                       rtol=0, atol=1e-6)
        times: dict[str, list[float]] = {"artifact": [], "python": []}
        for frame in requests:  # alternating, so load on the machine hits both alike
            for name, fn in (("artifact", via_artifact), ("python", via_python)):
                t0 = args.timer()
                fn(frame)
                times[name].append(args.timer() - t0)
        a50, a99 = _percentiles(times["artifact"])
        p50, p99 = _percentiles(times["python"])
        rows.append([framework, size, f"{a50:.2f}", f"{a99:.2f}", f"{p50:.2f}", f"{p99:.2f}",
                     f"{p50 / a50:.2f}"])
    return rows


def _set_threads(args) -> None:
    if args.framework in ("torch", "both"):
        import torch

        torch.set_num_threads(args.threads)
    if args.framework in ("keras", "both"):
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--framework", choices=["torch", "keras", "both"], default="both")
    parser.add_argument("--requests", type=int, default=200, help="requests per size and path")
    parser.add_argument("--fit-rows", type=int, default=50_000)
    parser.add_argument("--cats", type=int, default=6)
    parser.add_argument("--conts", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1,
                        help="intra-op threads of torch and TensorFlow (a server runs a request per thread; "
                             "on a loaded machine OpenMP's spinning threads cost tens of ms per op)")
    parser.add_argument("--aoti", action="store_true",
                        help="torch: time the artifact compiled by AOTInductor "
                             "(torch._inductor.aoti_compile_and_package; needs a C++ compiler, minutes)")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="wall: time.perf_counter; cpu: this process's CPU time (time.process_time)")
    args = parser.parse_args()
    args.timer = time.perf_counter if args.clock == "wall" else time.process_time
    _set_threads(args)
    wf = _workflow(args.cats, args.conts).fit(ts.Dataset(_frame(np.random.default_rng(0), args.fit_rows,
                                                                args.cats, args.conts)))
    wf = wf.remove_inputs(["label"])  # a request carries no label
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        if args.framework in ("torch", "both"):
            rows += bench_torch(args, wf, folder)
        if args.framework in ("keras", "both"):
            rows += bench_keras(args, wf, folder)
    print(machine_note(), f"threads={args.threads}", f"clock={args.clock}")
    print(format_table(["framework", "rows", "artifact p50 ms", "artifact p99 ms", "python p50 ms",
                        "python p99 ms", "python/artifact p50"], rows, markdown=True))


if __name__ == "__main__":
    main()
