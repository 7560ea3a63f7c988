"""Throwaway PostgreSQL server: initdb + pg_ctl in a work directory, on 127.0.0.1.

initdb and postgres refuse to run as root, so when we are root the server runs as an
unprivileged system user (``gristmill-pg``) through ``runuser``.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from gristmill.devservices.lifeline import PgData, lifeline, postmaster
from gristmill.devservices.ports import free_port
from gristmill.devservices.procs import alive, children
from gristmill.devservices.served import LOG_TAIL_LINES, Served, tail

HOST = "127.0.0.1"
DB_USER = "gristmill"
DB_NAME = "gristmill"
PG_SYSTEM_USER = "gristmill-pg"
# Linux limits a unix socket path (sun_path) to 108 bytes including the NUL.
_MAX_SOCKET_PATH = 107
_INCLUDE_LINE = "include_if_exists = 'gristmill.conf'"


class PostgresError(RuntimeError):
    """initdb/pg_ctl failed; the message carries the tail of the server log."""


def _version_key(name: str) -> tuple[int, ...]:
    parts = re.findall(r"\d+", name)
    return tuple(int(p) for p in parts) if parts else (-1,)


def find_pg_bindir() -> Path:
    """Directory holding initdb/pg_ctl: ``pg_config --bindir``, else the newest
    /usr/lib/postgresql/*/bin, else wherever initdb is on PATH."""
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config is not None:
        result = subprocess.run(
            [pg_config, "--bindir"], capture_output=True, text=True, check=False
        )
        if result.returncode == 0 and result.stdout.strip():
            candidates.append(Path(result.stdout.strip()))
    # pg_config may come from a client-only package (libpq-dev) without the server binaries.
    candidates += sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: _version_key(p.parent.name),
        reverse=True,
    )
    initdb = shutil.which("initdb")
    if initdb is not None:
        candidates.append(Path(initdb).parent)
    for bindir in candidates:
        if (bindir / "initdb").is_file() and (bindir / "pg_ctl").is_file():
            return bindir
    raise FileNotFoundError("PostgreSQL server binaries (initdb, pg_ctl) not found")


def ensure_system_user(name: str = PG_SYSTEM_USER) -> pwd.struct_passwd:
    """Create (once) the unprivileged system user the server runs as when we are root."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    result = subprocess.run(
        [
            "useradd",
            "--system",
            "--user-group",
            "--no-create-home",
            "--home-dir",
            "/nonexistent",
            "--shell",
            "/usr/sbin/nologin",
            name,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    # rc 9 = "already exists": another process created it between our check and useradd.
    if result.returncode not in (0, 9):
        raise PostgresError(f"useradd {name} failed (rc={result.returncode}): {result.stderr}")
    return pwd.getpwnam(name)


def _unsearchable_ancestor(path: Path, user: pwd.struct_passwd) -> Path | None:
    """The first ancestor of path the user may not traverse (no x bit for it), if any."""
    gids = set(os.getgrouplist(user.pw_name, user.pw_gid))
    for ancestor in path.parents:
        st = ancestor.stat()
        if st.st_uid == user.pw_uid:
            bit = stat.S_IXUSR
        elif st.st_gid in gids:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not st.st_mode & bit:
            return ancestor
    return None


class PostgresServer(Served):
    """A PostgreSQL cluster in ``workdir/data`` serving database ``gristmill`` on 127.0.0.1.

    Authentication is ``trust`` for user ``gristmill``; the port is fixed for the life of
    the object so ``restart()`` and ``kill()``+``start()`` keep the same URL.
    """

    def __init__(
        self,
        workdir: Path,
        port: int | None = None,
        *,
        fast: bool = False,
        max_connections: int = 200,
        settings: Mapping[str, str | int] | None = None,
    ) -> None:
        self.workdir = Path(workdir).resolve()
        self.port = port if port is not None else free_port(HOST)
        self.fast = fast
        self.max_connections = max_connections
        # More server settings (GUCs), written after the defaults above (they win).
        self.settings = dict(settings or {})
        self.data_dir = self.workdir / "data"
        self.log_path = self.workdir / "postgres.log"
        self._pg_ctl_out = self.workdir / "pg_ctl.out"
        self._bindir: Path | None = None
        self._as_root = os.geteuid() == 0
        self._user: pwd.struct_passwd | None = None
        self._held: PgData | None = None  # by the lifeline from start() to stop()

    # ----------------------------------------------------------------- public API

    @property
    def url(self) -> str:
        """SQLAlchemy URL (psycopg 3 driver)."""
        return f"postgresql+psycopg://{DB_USER}@{HOST}:{self.port}/{DB_NAME}"

    @property
    def dsn(self) -> str:
        """libpq URI, for psycopg.connect() and psql."""
        return f"postgresql://{DB_USER}@{HOST}:{self.port}/{DB_NAME}"

    @property
    def pid(self) -> int | None:
        """PID of the running postmaster, or None (a stale postmaster.pid after kill() may
        name a recycled PID: only a live postgres process counts)."""
        return postmaster(self.data_dir)

    @property
    def running(self) -> bool:
        return self.pid is not None

    def start(self, timeout_s: float = 60) -> None:
        """initdb on first use, start the server, and create database ``gristmill``."""
        self._prepare()
        # Held before it starts: if we die while pg_ctl waits, the server still goes.
        self._held = lifeline().hold_pgdata(self.data_dir, f"PostgreSQL (port {self.port})")
        if not self.running:
            self._remove_stale_locks()
            self._pg_ctl("start", "-w", "-t", str(int(timeout_s)), "-l", str(self.log_path))
        self._create_database(timeout_s)

    def stop(self, timeout_s: float = 30) -> None:
        """Fast shutdown (rolls back open transactions); SIGKILL if that fails."""
        if self.running:
            try:
                self._pg_ctl("stop", "-m", "fast", "-w", "-t", str(int(timeout_s)))
            except PostgresError:
                self.kill()
        if not self.running:
            lifeline().release(self._held)
            self._held = None

    def restart(self, timeout_s: float = 60) -> None:
        """``pg_ctl restart``: clean stop and start, data kept, same port."""
        if not self.running:
            self.start(timeout_s)
            return
        self._pg_ctl(
            "restart", "-m", "fast", "-w", "-t", str(int(timeout_s)), "-l", str(self.log_path)
        )

    def kill(self) -> None:
        """SIGKILL the postmaster and then its children: a crash, no shutdown checkpoint.

        The children are killed too so a following ``start()`` does not find the old
        shared memory still attached (and so clients see the outage at once).
        """
        pid = self.pid
        if pid is None:
            return
        kids = children(pid)
        for victim in (pid, *kids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(alive(p) for p in (pid, *kids)):
            if time.monotonic() > deadline:
                raise PostgresError(f"postgres processes {[pid, *kids]} survived SIGKILL")
            time.sleep(0.05)

    # ----------------------------------------------------------------- internals

    def _prepare(self) -> None:
        if self._bindir is None:
            self._bindir = find_pg_bindir()
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self._as_root:
            self._user = ensure_system_user()
            blocked = _unsearchable_ancestor(self.data_dir, self._user)
            if blocked is not None:
                raise PostgresError(
                    f"PostgreSQL runs as {PG_SYSTEM_USER!r} (initdb refuses root) and needs "
                    f"search (x) permission on every parent of {self.data_dir}, but {blocked} "
                    f"is mode {stat.filemode(blocked.stat().st_mode)}. Use a workdir under a "
                    f"traversable path or `chmod o+x {blocked}`."
                )
            # pg_ctl -l opens the log as the server user; pre-create it with the right owner.
            self.log_path.touch(exist_ok=True)
            os.chown(self.log_path, self._user.pw_uid, self._user.pw_gid)
        if not (self.data_dir / "PG_VERSION").is_file():
            self._initdb()
        self._write_conf()

    def _remove_stale_locks(self) -> None:
        """Drop the lock files a killed postmaster left behind. Only called when no live
        postmaster owns them: postgres itself would treat a not-yet-reaped zombie (PID 1
        may reap orphans lazily) as a running server and refuse to start."""
        for lock in [self.data_dir / "postmaster.pid", *self.data_dir.glob(".s.PGSQL.*.lock")]:
            with contextlib.suppress(FileNotFoundError):
                lock.unlink()

    def _initdb(self) -> None:
        self.data_dir.mkdir(mode=0o700, exist_ok=True)
        self._chown(self.data_dir)
        self._run(
            [
                str(self._bin("initdb")),
                "-D",
                str(self.data_dir),
                "-A",
                "trust",
                "-U",
                DB_USER,
                "--encoding",
                "UTF8",
                "--locale",
                "C",
                "--no-sync",
            ],
            what="initdb",
        )
        with open(self.data_dir / "postgresql.conf", "a") as conf:
            conf.write("\n# gristmill devservices overrides (rewritten on every start)\n")
            conf.write(f"{_INCLUDE_LINE}\n")

    def _write_conf(self) -> None:
        """Settings live in an included file so pg_ctl restart re-reads them unchanged."""
        socket_path = self.data_dir / f".s.PGSQL.{self.port}"
        # Deep temp dirs can exceed the socket path limit; then serve TCP only.
        socket_dir = str(self.data_dir) if len(str(socket_path)) <= _MAX_SOCKET_PATH else ""
        settings: dict[str, str | int] = {
            "listen_addresses": HOST,
            "port": self.port,
            "unix_socket_directories": socket_dir,
            "max_connections": self.max_connections,
        }
        if self.fast:
            # Durability is irrelevant for throwaway test data; these cut commit latency.
            settings.update(fsync="off", synchronous_commit="off", full_page_writes="off")
        settings.update(self.settings)
        lines = []
        for key, value in settings.items():
            if isinstance(value, int):
                lines.append(f"{key} = {value}\n")
            else:
                escaped = value.replace("'", "''")
                lines.append(f"{key} = '{escaped}'\n")
        conf = self.data_dir / "gristmill.conf"
        conf.write_text("".join(lines))
        self._chown(conf)

    def _create_database(self, timeout_s: float) -> None:
        import psycopg  # only needed once the server is up

        conninfo = f"host={HOST} port={self.port} user={DB_USER} dbname=postgres"
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with psycopg.connect(conninfo, autocommit=True, connect_timeout=5) as conn:
                    exists = conn.execute(
                        "SELECT 1 FROM pg_database WHERE datname = %s", (DB_NAME,)
                    ).fetchone()
                    if exists is None:
                        conn.execute(f'CREATE DATABASE "{DB_NAME}"')
                    return
            except psycopg.OperationalError as exc:
                if time.monotonic() > deadline:
                    raise PostgresError(
                        f"cannot connect to PostgreSQL on port {self.port}: {exc}\n"
                        f"--- last {LOG_TAIL_LINES} lines of {self.log_path} ---\n"
                        f"{tail(self.log_path)}"
                    ) from exc
                time.sleep(0.2)

    def _bin(self, name: str) -> Path:
        assert self._bindir is not None
        return self._bindir / name

    def _chown(self, path: Path) -> None:
        if self._user is not None:
            os.chown(path, self._user.pw_uid, self._user.pw_gid)

    def _pg_ctl(self, *args: str) -> None:
        if self._bindir is None:
            self._bindir = find_pg_bindir()
        self._run([str(self._bin("pg_ctl")), "-D", str(self.data_dir), *args], what="pg_ctl")

    def _run(self, cmd: list[str], *, what: str) -> None:
        if self._as_root:
            cmd = ["runuser", "-u", PG_SYSTEM_USER, "--", *cmd]
        # Stray PG* variables (PGDATA, PGPORT, ...) would override our explicit settings.
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        # Output to a file, not a pipe: the daemonised postmaster must not hold our pipe open.
        with open(self._pg_ctl_out, "ab") as out:
            out.write(f"==== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n".encode())
            out.flush()
            proc = subprocess.Popen(
                cmd,
                cwd=self.workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            held = lifeline().hold_group(proc.pid, f"{what} {proc.pid}")
            try:
                rc = proc.wait()
            finally:
                if proc.poll() is None:  # interrupted: do not leave it running
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                lifeline().release(held)
        if rc != 0:
            raise PostgresError(
                f"{what} failed (rc={rc}): {' '.join(cmd)}\n"
                f"--- last {LOG_TAIL_LINES} lines of {self._pg_ctl_out} ---\n"
                f"{tail(self._pg_ctl_out)}\n"
                f"--- last {LOG_TAIL_LINES} lines of {self.log_path} ---\n{tail(self.log_path)}"
            )
