"""Start a built image's processes and check they work, without a container engine:
the OCI image is unpacked (umoci) and each process runs as the image says (entrypoint,
user, environment, working directory) in its root file system, mounted read-only with
tmpfs on /tmp and the home folder as the chart does, in its own mount and PID namespaces
(tini is PID 1), on the host's network so it reaches a throwaway Kafka and PostgreSQL on
loopback (the project's own devservices).

    sudo .venv/bin/python docker/image/smoke.py build/images/gristmill-cpu [--work DIR]
    sudo .venv/bin/python docker/image/smoke.py build/images/gristmill-cuda \
        --model all-minilm-l6-v2      (the embedding model; on the CPU without a GPU)

Checks: no compiler, pip or apt lists in the image; the processes run as uid 10001;
migrate; compose's bootstrap (a key); the API (a request through a scheduler and its
worker; for an embedding model also /v1/embeddings; HEALTHCHECK); a scheduler without
workers and a worker container on its socket; the doctor; a scheduler's SIGTERM drain
exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from gristmill.devservices import KafkaCluster, PostgresServer, free_port  # noqa: E402
from gristmill.devservices.procs import children  # noqa: E402

EMBED_DIM = 384  # all-minilm-l6-v2's vector
# What the worker's PyTorch is built for and sees: a CUDA build runs on the CPU without a GPU.
TORCH_PROBE = (
    "import torch; print(f'torch {torch.__version__}, CUDA build {torch.version.cuda}, "
    "GPU visible: {torch.cuda.is_available()}')"
)
BUILD_TOOLS = ("usr/bin/gcc", "usr/bin/cc", "usr/bin/make", "opt/gristmill/bin/pip")


class Image:
    def __init__(self, layout: Path, work: Path):
        self.bundle = work / "bundle"
        subprocess.run(
            ["umoci", "unpack", "--image", f"{layout}:latest", str(self.bundle)], check=True
        )
        cfg = json.loads((self.bundle / "config.json").read_text())["process"]
        self.args: list[str] = cfg["args"]
        self.env = dict(e.split("=", 1) for e in cfg["env"])
        self.cwd: str = cfg["cwd"]
        self.uid, self.gid = cfg["user"]["uid"], cfg["user"]["gid"]
        self.rootfs = self.bundle / "rootfs"
        self.mount_points: list[str] = []  # empty folders once each namespace is gone
        self.entrypoint = self.args[: self.args.index("gristmill") + 1]  # tini -- gristmill

    def size_mb(self, layout: Path) -> float:
        return sum(f.stat().st_size for f in (layout / "blobs").rglob("*") if f.is_file()) / 1e6

    def start(
        self,
        args: list[str],
        env: dict[str, str],
        log: Path,
        entry: list[str] | None = None,
        sockets: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        """One process, as a container of this image would run it; ``sockets`` is a host
        folder shared as /run/gristmill (a pod's emptyDir shared by its containers)."""
        cmd = [*(entry if entry is not None else self.entrypoint), *args]
        mnt = tempfile.mkdtemp(prefix="gm-root-")
        self.mount_points.append(mnt)
        envs = " ".join(f"{k}={_q(v)}" for k, v in {**self.env, **env}.items())
        owner = f"uid={self.uid},gid={self.gid}"
        run_dir = (
            f"mount --bind {sockets} {mnt}/run/gristmill"
            if sockets
            else f"mount -t tmpfs -o {owner} tmpfs {mnt}/run/gristmill"
        )
        steps = [
            "set -e",
            f"mount --bind {self.rootfs} {mnt}",
            f"mount -o remount,bind,ro {mnt}",  # readOnlyRootFilesystem, as in the chart
            f"mount -t proc proc {mnt}/proc",
            f"mount --rbind /dev {mnt}/dev",
            f"mount -t tmpfs -o mode=1777 tmpfs {mnt}/tmp",
            f"mount -t tmpfs -o {owner} tmpfs {mnt}{self.cwd}",
            run_dir,
            f"cd {mnt}",
            f"exec chroot --userspec={self.uid}:{self.gid} {mnt} /usr/bin/env -i {envs}"
            f" sh -c 'cd {self.cwd} && exec \"$@\"' - {' '.join(_q(c) for c in cmd)}",
        ]
        script = "; ".join(steps)
        out = log.open("ab")
        return subprocess.Popen(
            ["unshare", "--mount", "--pid", "--fork", "--kill-child", "sh", "-c", script],
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    def run(self, args: list[str], env: dict[str, str], log: Path, **kw: object) -> str:
        p = self.start(args, env, log, **kw)  # type: ignore[arg-type]
        rc = p.wait(timeout=300)
        if rc != 0:
            raise SystemExit(f"{args} exited {rc}:\n{log.read_text()[-3000:]}")
        return log.read_text()


def _q(s: str) -> str:
    return "'" + s.replace("'", "'\"'\"'") + "'"


def pid1(p: subprocess.Popen[bytes]) -> int:
    """The container's PID 1 (tini): unshare's forked child."""
    for _ in range(100):
        kids = children(p.pid)
        if kids:
            return kids[0]
        time.sleep(0.05)
    raise RuntimeError("no PID 1")


def exec_in(p: subprocess.Popen[bytes], image: Image, cmd: list[str]) -> int:
    """Like `docker exec`: the command in the process's mount and PID namespaces."""
    t = pid1(p)
    return subprocess.run(
        [
            "nsenter",
            "-t",
            str(t),
            "-m",
            "-p",
            "-r",
            "-w",
            "-S",
            str(image.uid),
            "-G",
            str(image.gid),
            *cmd,
        ],
        env={**image.env},
        check=False,
    ).returncode


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("layout", type=Path, help="OCI layout folder (docker/image/build.sh)")
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument(
        "--model", default="sim", help="what the workers serve (all-minilm-l6-v2: cuda image)"
    )
    a = ap.parse_args(argv)
    work = a.work or Path(tempfile.mkdtemp(prefix="gristmill-smoke-"))
    work.mkdir(parents=True, exist_ok=True)
    work.chmod(0o711)
    image = Image(a.layout.resolve(), work)
    results: list[tuple[str, str]] = []
    results.append(("image size (compressed layers)", f"{image.size_mb(a.layout):.0f} MB"))
    present = [t for t in BUILD_TOOLS if (image.rootfs / t).exists()]
    lists = list((image.rootfs / "var/lib/apt/lists").glob("*_Packages"))
    assert not present and not lists, (present, lists)
    results.append(("build tools in the image", "none (no gcc, cc, make, pip, apt lists)"))
    assert image.uid == 10001, image.uid
    kafka = KafkaCluster(work / "kafka", partitions=3)
    pg = PostgresServer(work / "pg")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        kafka.start()
        pg.start()
        env = {
            "KAFKA_BOOTSTRAP": kafka.bootstrap,
            "DATABASE_URL": pg.url,
            "GRISTMILL_TOPIC_PARTITIONS": "3",
            "GRISTMILL_SIM_BATCH_MS": "20",
            # One broker: the start-up durability check (decision 20) cannot pass.
            "GRISTMILL_ALLOW_WEAK_DURABILITY": "true",
        }
        logs = work / "logs"
        logs.mkdir()
        uid = image.run([], env, logs / "id.log", entry=["id", "-u"]).strip()
        assert uid == "10001", uid
        results.append(("user", f"uid {uid}, read-only root, tmpfs /tmp and home"))
        image.run(["migrate"], env, logs / "migrate.log")
        results.append(("gristmill migrate", "exit 0"))
        # docker/compose.yaml's bootstrap, as compose runs it: a tenant and a key, then
        # (a second `up`) another key for the same tenant.
        boot = yaml.safe_load((REPO / "docker" / "compose.yaml").read_text())["services"][
            "bootstrap"
        ]
        command = [c.replace("$$", "$") for c in boot["command"]]
        keys = []
        for i in range(2):
            out = image.run(command, env, logs / f"bootstrap-{i}.log", entry=boot["entrypoint"])
            line = out.strip().splitlines()[-1]
            assert line.startswith("GRISTMILL_API_KEY=gm_"), out
            keys.append(line.split("=", 1)[1])
        assert keys[0] != keys[1]
        key = keys[0]
        results.append(("compose bootstrap (twice)", "printed GRISTMILL_API_KEY=gm_... each time"))
        sched = image.start(
            ["scheduler", "--workers", "1", "--models", a.model, "--socket-dir", "/run/gristmill"],
            env,
            logs / "scheduler.log",
        )
        procs.append(sched)
        port = free_port()
        api = image.start(["api", "--port", str(port), "--workers", "1"], env, logs / "api.log")
        procs.append(api)
        url = f"http://127.0.0.1:{port}"
        started = time.monotonic()
        answer = None
        while time.monotonic() - started < 300:  # an embedding worker loads PyTorch first
            try:
                r = httpx.post(
                    f"{url}/v1/infer",
                    headers={"Authorization": f"Bearer {key}"},
                    json={"model": a.model, "input": "from the image"},
                    timeout=10,
                )
                if r.status_code == 200:
                    answer = r.json()
                    break
            except httpx.HTTPError:
                pass
            for p in procs:
                if p.poll() is not None:
                    raise SystemExit(
                        f"a process exited: {(logs / 'api.log').read_text()[-2000:]}"
                        f"{(logs / 'scheduler.log').read_text()[-2000:]}"
                    )
            time.sleep(1)
        assert answer is not None and answer["model"] == a.model, answer
        results.append((f"POST /v1/infer through api + scheduler + {a.model} worker",
                        f"200 after {time.monotonic() - started:.0f} s"))  # fmt: skip
        if a.model != "sim":
            # An embedding model: a vector back from /v1/infer, and OpenAI's shape too.
            assert len(answer["output"]) == EMBED_DIM, answer
            r = httpx.post(
                f"{url}/v1/embeddings",
                headers={"Authorization": f"Bearer {key}"},
                json={"model": a.model, "input": ["from the image", "a second text"]},
                timeout=120,
            )
            assert r.status_code == 200, r.text
            vectors = [d["embedding"] for d in r.json()["data"]]
            assert [len(v) for v in vectors] == [EMBED_DIM, EMBED_DIM], r.text[:300]
            assert vectors[0] != vectors[1]
            results.append(("POST /v1/embeddings (2 texts)", f"200, 2 x {EMBED_DIM} floats"))
            torch_log = logs / "torch.log"
            image.run(
                [],
                env,
                torch_log,
                entry=["python3", "-c", TORCH_PROBE],
            )
            results.append(("PyTorch in the image", torch_log.read_text().strip()))
        hc = "/usr/local/bin/gristmill-healthcheck"
        assert exec_in(api, image, ["python3", hc]) == 0
        assert exec_in(sched, image, ["python3", hc]) == 0
        results.append(("HEALTHCHECK in the api and scheduler containers", "exit 0"))
        # A GPU pod's shape: a scheduler without workers and a worker started on its own
        # in another container, sharing the socket folder.
        shared = work / "sockets"
        shared.mkdir()
        os.chown(shared, image.uid, image.gid)
        procs.append(
            image.start(
                ["scheduler", "--workers", "0", "--models", a.model, "--socket-dir",
                 "/run/gristmill/s0"],
                env,
                logs / "scheduler-0.log",
                sockets=shared,
            )
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while not (shared / "s0" / "workers.sock").exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        procs.append(
            image.start(
                ["worker", "--models", a.model, "--socket", "/run/gristmill/s0/workers.sock"],
                env,
                logs / "worker.log",
                sockets=shared,
            )
        )
        # Both schedulers report live workers within a few load reports.
        for attempt in range(30):
            log = logs / f"doctor-{attempt}.log"
            doc = image.start([], env, log, entry=["python3", "-m", "gristmill.cli.doctor"])
            doc.wait(timeout=120)
            text = log.read_text()
            if "live workers under 2 scheduler(s)" in text:
                break
            time.sleep(2)
        assert "live workers under 2 scheduler(s)" in text and doc.returncode == 0, text
        results.append(("scheduler --workers 0 + a worker container on its socket", "serving"))
        results.append(("gristmill doctor", f"exit 0 ({text.strip().splitlines()[-1]})"))
        t0 = time.monotonic()
        os.kill(pid1(sched), signal.SIGTERM)
        rc = sched.wait(timeout=90)
        assert rc == 0, (logs / "scheduler.log").read_text()[-2000:]
        results.append(("scheduler SIGTERM (tini forwards, drains)",
                        f"exit 0 in {time.monotonic() - t0:.1f} s"))  # fmt: skip
    finally:
        for p in procs:
            if p.poll() is None:
                os.kill(pid1(p), signal.SIGTERM)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
        kafka.stop()
        pg.stop()
        for mnt in image.mount_points:
            shutil.rmtree(mnt, ignore_errors=True)
    for what, outcome in results:
        print(f"{what:<55} {outcome}")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
