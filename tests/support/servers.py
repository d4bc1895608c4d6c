"""The servers the nemesis restarts (tests/support/nemesis.py, bench/nemesis.py): Debian's
PostgreSQL cluster commands and a Redis started by hand. No Django here: the bench makes its
own servers before Django is set up on them."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Servers:
    """The PostgreSQL cluster (Debian's `pg_ctlcluster VERSION CLUSTER`) and the Redis the
    restarts act on. The bench makes its own (`own_servers`), so nobody else's sessions end."""

    pg_cluster: str = "main"
    pg_port: int = 5432
    redis_port: int = 6379
    redis_dir: str = "/var/lib/redis"
    # The machine's Redis listens on loopback; the bench's own also where the namespaced
    # workers reach this host (it has no password, and lives only as long as the bench).
    redis_bind: str = "127.0.0.1 -::1"

    def redis_start(self) -> str:
        listen = self.redis_bind + (" --protected-mode no" if "0.0.0.0" in self.redis_bind else "")  # noqa: S104
        return (
            f"redis-server --daemonize yes --bind {listen} "
            f'--port {self.redis_port} --save "" --appendonly no --dir {self.redis_dir} '
            f"--logfile {self.redis_dir}/redis.log"
        )


SHARED = Servers()


def sh(command: str, *, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, shell=True, check=check, capture_output=True, text=True)  # noqa: S602


def pg_version() -> str:
    return sorted(os.listdir("/etc/postgresql"))[0]


def restart_postgres(servers: Servers, down_for: float) -> None:
    """Stop PostgreSQL (fast: sessions ended), wait, start it; it is started again whatever
    happens."""
    try:
        pg_ctl(servers, "stop -m fast")
        time.sleep(down_for)
    finally:
        ensure_postgres(servers)


def pg_ctl(servers: Servers, action: str, *, check: bool = True) -> None:
    cluster = f"{pg_version()} {servers.pg_cluster}"
    sh(f"pg_ctlcluster --skip-systemctl-redirect {cluster} {action}", check=check)


def ensure_postgres(servers: Servers = SHARED) -> None:
    ready = f"pg_isready -q -h 127.0.0.1 -p {servers.pg_port}"
    if sh(ready, check=False).returncode != 0:
        pg_ctl(servers, "start", check=False)
    for _ in range(100):
        if sh(ready, check=False).returncode == 0:
            return
        time.sleep(0.1)
    raise RuntimeError("PostgreSQL did not come back")


def restart_redis(servers: Servers, down_for: float) -> None:
    try:
        sh(f"redis-cli -h 127.0.0.1 -p {servers.redis_port} shutdown nosave", check=False)
        time.sleep(down_for)
    finally:
        ensure_redis(servers)


def ensure_redis(servers: Servers = SHARED) -> None:
    ping = f"redis-cli -h 127.0.0.1 -p {servers.redis_port} ping"
    if sh(ping, check=False).returncode != 0:
        os.makedirs(servers.redis_dir, exist_ok=True)
        sh(servers.redis_start(), check=False)
    for _ in range(100):
        if sh(ping, check=False).returncode == 0:
            return
        time.sleep(0.1)
    raise RuntimeError("Redis did not come back")


@contextlib.contextmanager
def own_servers(pg_port: int, redis_port: int, folder: Path) -> Iterator[Servers]:
    """A PostgreSQL cluster (trusted on 127.0.0.1, as the machine's) and a Redis of the
    bench's own, made here and removed afterwards: its restarts end no one else's sessions."""
    servers = Servers(
        pg_cluster=f"nemesis{pg_port}",
        pg_port=pg_port,
        redis_port=redis_port,
        redis_dir=str(folder / "redis"),
        redis_bind="0.0.0.0",  # noqa: S104
    )
    version = pg_version()
    sh(f"pg_dropcluster --stop {version} {servers.pg_cluster}", check=False)
    sh(
        f"pg_createcluster {version} {servers.pg_cluster} --port {pg_port} "
        "-- --auth-local=trust --auth-host=trust"
    )
    try:
        ensure_postgres(servers)
        ensure_redis(servers)
        yield servers
    finally:
        sh(f"redis-cli -h 127.0.0.1 -p {redis_port} shutdown nosave", check=False)
        sh(f"pg_dropcluster --stop {version} {servers.pg_cluster}", check=False)
