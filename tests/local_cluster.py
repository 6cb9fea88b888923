"""A cluster on this machine that is honest about being one (issue 34).

Each node is a network, mount and host-name (UTS) namespace of its own:
- its one address on a private bridge that this module creates (no default route, so traffic goes only between the
  nodes' addresses and each node's loopback; the host itself has no address on the bridge);
- a private directory that the other nodes cannot see (an empty tmpfs is mounted over it in theirs), holding the
  node's Docker engine (data root, exec root), its Ray session and its logs;
- the shared storage at one path, `shared`: the head's disk, exported over SSH and mounted with sshfs (FUSE) on each
  worker. This kernel has no NFS client; sshfs is the network file system it can mount. Over the head's disk, the
  workers see an empty tmpfs, so the only way a worker reaches the data is the network file system.

Worker nodes run a Docker engine on `tcp://<address>:2375` and a Ray worker joined to the head's `ray start --head`;
each Ray worker's environment names its own node's engine (DOCKER_HOST). The head runs Ray's head (no CPUs, so no
task is scheduled there), sshd for the storage, and Prefect's server.

What the nodes share with the host is the installation: this repository, its virtual environment, and the machine's
cache (~/.cache/lego: the base image's rootfs, the harness installs), as machines started from one image would.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
ENGINE_PORT = 2375
PREFECT_PORT = 4200
RAY_PORT = 6379
OWNERS = Path("/run/lego-clusters")  # <tag>: the pid of the process that built that cluster
POSTGRES_PORT = 5432
MLFLOW_PORT = 5000
NEEDS = ["ip", "unshare", "nsenter", "sshfs", "/usr/sbin/sshd", "ssh-keygen", "dockerd", "fusermount3", "runuser"]


class ClusterError(RuntimeError):
    pass


def postgres_bin() -> Path | None:
    """The newest PostgreSQL server's directory of programs (Debian's layout: /usr/lib/postgresql/<major>/bin)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"), key=lambda path: int(path.parts[-3]))
    return found[-1].parent if found else None


def missing_tools() -> list[str]:
    missing = [tool for tool in NEEDS if shutil.which(tool) is None and not Path(tool).exists()]
    return missing + (["postgresql"] if postgres_bin() is None else [])


def _run(args: list[str], check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(args, capture_output=True, text=True, **kwargs)
    if check and result.returncode != 0:
        raise ClusterError(f"{' '.join(map(str, args))} exited {result.returncode}: {result.stderr.strip()[-2000:]}")
    return result


@dataclass
class Node:
    name: str
    address: str
    netns: str
    private: Path
    holder: subprocess.Popen | None = None
    services: dict[str, subprocess.Popen] = field(default_factory=dict)

    def _enter(self) -> list[str]:
        assert self.holder is not None
        return ["nsenter", f"--target={self.holder.pid}", "--net", "--mount", "--uts", "--"]

    def run(self, args: list[str], check: bool = True, env: dict | None = None, timeout: float = 120,
            ) -> subprocess.CompletedProcess:
        return _run(self._enter() + [str(arg) for arg in args], check=check, env=env, timeout=timeout)

    def start(self, name: str, args: list[str], env: dict | None = None) -> subprocess.Popen:
        """A long-running service of this node, its output in the node's private directory."""
        log = open(self.private / f"{name}.log", "ab")  # noqa: SIM115  (the service holds it)
        process = subprocess.Popen(self._enter() + [str(arg) for arg in args], stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        log.close()
        self.services[name] = process
        return process

    def log(self, name: str, tail: int = 3000) -> str:
        path = self.private / f"{name}.log"
        return path.read_text(errors="replace")[-tail:] if path.exists() else ""

    @property
    def cgroup_parent(self) -> str:
        """The cgroup its engine puts its containers under (their processes are in namespaces of their own)."""
        return f"lego-cluster-{self.netns}"

    def cgroups(self) -> list[Path]:
        """That cgroup in each hierarchy it exists in (cgroup v1: one per controller; v2: one)."""
        root = Path("/sys/fs/cgroup")
        return [path for path in [root / self.cgroup_parent, *root.glob(f"*/{self.cgroup_parent}")] if path.is_dir()]

    def pids(self) -> list[int]:
        """Every process of this node: in its network namespace, or in a container of its engine."""
        out = _run(["ip", "netns", "pids", self.netns], check=False).stdout
        pids = {int(pid) for pid in out.split()}
        for cgroup in self.cgroups():
            for procs in cgroup.rglob("cgroup.procs"):
                with contextlib.suppress(OSError):
                    pids.update(int(pid) for pid in procs.read_text().split())
        return sorted(pids)

    @property
    def tmp(self) -> Path:
        """The node's TMPDIR, a tmpfs of its own: one short path (for the unix sockets under it) on every node, as
        Ray's workers take the head's temp dir (`<TMPDIR>/ray`) for theirs."""
        return Path("/tmp") / f"{self.netns.rsplit('-', 1)[0]}-tmp"

    @property
    def docker_host(self) -> str:
        return f"tcp://{self.address}:{ENGINE_PORT}"


class LocalCluster:
    """A head and `workers` worker nodes; `up()` builds them, `down()` removes every trace."""

    def __init__(self, root: Path, workers: int = 2):
        self.root = root
        self.tag = f"{os.getpid() % 10000:04d}{random.randrange(16 ** 2):02x}"
        self.bridge = f"lgc{self.tag}"
        self.subnet = self._free_subnet()
        self.shared = root / "shared"  # the path every node sees the storage at
        self.disk = root / "head-disk"  # the head's disk, exported
        names = ["head"] + [f"worker{index}" for index in range(1, workers + 1)]
        self.nodes = [Node(name, f"{self.subnet}.{index + 1}", f"lgc{self.tag}-{name}", root / "nodes" / name)
                      for index, name in enumerate(names)]
        self.key = root / "keys" / "id_ed25519"
        self.ray_token = secrets.token_hex(32)
        self.db_password = secrets.token_hex(16)
        self.ray_env: dict[str, str] = {}

    @property
    def head(self) -> Node:
        return self.nodes[0]

    @property
    def workers(self) -> list[Node]:
        return self.nodes[1:]

    @staticmethod
    def _free_subnet() -> str:
        routes = _run(["ip", "-4", "route"]).stdout + _run(["ip", "-4", "addr"]).stdout
        for _ in range(200):
            candidate = f"10.{random.randrange(200, 250)}.{random.randrange(1, 250)}"
            if f"{candidate}." not in routes:
                return candidate
        raise ClusterError("no free 10.x.y.0/24 subnet for the cluster's bridge")

    # ------------------------------------------------------------------------------------------ building
    def up(self, *, prefect: bool = True, ray_env: dict[str, str] | None = None) -> None:
        missing = missing_tools()
        if missing:
            raise ClusterError(f"the cluster needs {', '.join(missing)} (scripts/setup.sh -c test installs them)")
        for path in [self.shared, self.disk, self.key.parent, *[node.private for node in self.nodes],
                     *[node.tmp for node in self.nodes]]:
            path.mkdir(parents=True, exist_ok=True)
        self._network()
        for node in self.nodes:
            self._namespace(node)
        self._storage()
        # The services start together and are waited for after: one at a time, their start-ups add up to a minute.
        if prefect:
            self._start_databases()
            self._start_prefect()
            self._start_mlflow()
        for worker in self.workers:
            self._start_engine(worker)
        self._ray(ray_env or {})
        for worker in self.workers:
            self._wait(lambda w=worker: w.run(["docker", "-H", w.docker_host, "version"], check=False).returncode == 0,
                       f"{worker.name}'s Docker engine", worker, "dockerd", timeout=60)
        if prefect:
            probe = [VENV_BIN / "python", "-c", f"import urllib.request; urllib.request.urlopen("
                     f"'http://{self.head.address}:{PREFECT_PORT}/api/health', timeout=2)"]
            self._wait(lambda: self.head.run(probe, check=False).returncode == 0, "Prefect's server", self.head,
                       "prefect", timeout=120)
            probe = [VENV_BIN / "python", "-c", f"import urllib.request; urllib.request.urlopen("
                     f"'{self.mlflow_uri}/health', timeout=2)"]
            self._wait(lambda: self.head.run(probe, check=False).returncode == 0, "MLflow's tracking server",
                       self.head, "mlflow", timeout=120)

    def _network(self) -> None:
        OWNERS.mkdir(parents=True, exist_ok=True)
        (OWNERS / self.tag).write_text(str(os.getpid()))
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        _run(["ip", "link", "set", self.bridge, "up"])
        for index, node in enumerate(self.nodes):
            outside, inside = f"{self.bridge}v{index}", f"{self.bridge}n{index}"
            _run(["ip", "netns", "add", node.netns])
            _run(["ip", "link", "add", outside, "type", "veth", "peer", "name", inside])
            _run(["ip", "link", "set", outside, "master", self.bridge, "up"])
            _run(["ip", "link", "set", inside, "netns", node.netns])
            inner = ["ip", "netns", "exec", node.netns]
            _run(inner + ["ip", "link", "set", inside, "name", "eth0"])
            _run(inner + ["ip", "addr", "add", f"{node.address}/24", "dev", "eth0"])
            _run(inner + ["ip", "link", "set", "eth0", "up"])
            _run(inner + ["ip", "link", "set", "lo", "up"])

    def _namespace(self, node: Node) -> None:
        """A process that holds the node's mount namespace (private propagation), then the node's mounts."""
        node.holder = subprocess.Popen(
            # Not `ip netns exec`: it remounts /sys for the namespace, hiding the cgroup tree the engine needs.
            ["nsenter", f"--net=/run/netns/{node.netns}", "--", "unshare", "--mount", "--uts", "--propagation",
             "private", "sleep", "infinity"],
            stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 10
        while os.readlink(f"/proc/{node.holder.pid}/ns/mnt") == os.readlink("/proc/self/ns/mnt"):
            if time.monotonic() > deadline or node.holder.poll() is not None:
                raise ClusterError(f"node {node.name}'s mount namespace did not come up")
            time.sleep(0.05)
        node.run(["hostname", node.name])
        # The node's TMPDIR (Ray's sessions and sockets, the proxy's session sockets) and /dev/shm (Ray's object
        # store): one of each per node.
        node.run(["mount", "-t", "tmpfs", "tmpfs", node.tmp])
        node.run(["mount", "-t", "tmpfs", "tmpfs", "/dev/shm"])
        for other in self.nodes:
            if other is not node:
                node.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", other.private])

    def _storage(self) -> None:
        """The head's disk, served by sshd on the head; sshfs on each worker, a bind mount on the head itself."""
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", self.key])
        host_key = self.head.private / "ssh_host_ed25519_key"
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", host_key])
        authorized = self.head.private / "authorized_keys"
        shutil.copy(self.key.with_suffix(".pub"), authorized)
        authorized.chmod(0o600)
        config = self.head.private / "sshd_config"
        config.write_text("\n".join([
            f"ListenAddress {self.head.address}", "Port 22", f"HostKey {host_key}", f"AuthorizedKeysFile {authorized}",
            "PermitRootLogin prohibit-password", "PasswordAuthentication no", "UsePAM no", "StrictModes no",
            f"PidFile {self.head.private / 'sshd.pid'}", "Subsystem sftp internal-sftp", ""]))
        Path("/run/sshd").mkdir(exist_ok=True)
        self.head.start("sshd", ["/usr/sbin/sshd", "-D", "-e", "-f", config])
        self.head.run(["mount", "--bind", self.disk, self.shared])
        for worker in self.workers:
            worker.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", self.disk])
            self._wait(lambda w=worker: w.run(["bash", "-c", f"exec 3<>/dev/tcp/{self.head.address}/22"],
                                              check=False).returncode == 0, "sshd on the head", self.head, "sshd")
            worker.run(["sshfs", f"root@{self.head.address}:{self.disk}", self.shared, "-o",
                        ",".join([f"IdentityFile={self.key}", "StrictHostKeyChecking=no", "UserKnownHostsFile=/dev/null",
                                  "LogLevel=ERROR", "reconnect", "ServerAliveInterval=5", "dir_cache=no",
                                  "attr_timeout=0", "entry_timeout=0", "negative_timeout=0"])])

    def _start_engine(self, node: Node) -> None:
        node.start("dockerd", [
            "dockerd", "--host", node.docker_host, "--data-root", node.private / "docker",
            "--exec-root", node.private / "x", "--pidfile", node.private / "dockerd.pid",
            "--bridge=none", "--iptables=false", "--ip6tables=false", "--ip-forward=false", "--ip-masq=false",
            "--cgroup-parent", node.cgroup_parent])

    def _ray(self, extra_env: dict[str, str]) -> None:
        """The head, then every worker joining it at once."""
        self.ray_env = extra_env
        ray = VENV_BIN / "ray"
        env = self.node_env(self.head)
        self.head.run([ray, "start", "--head", "--node-ip-address", self.head.address, "--port", RAY_PORT,
                       "--num-cpus", "0", "--include-dashboard", "false", "--disable-usage-stats"], env=env,
                      timeout=180)
        joining = {worker.name: worker.start("ray-start", [
            ray, "start", "--address", f"{self.head.address}:{RAY_PORT}", "--node-ip-address", worker.address,
            "--num-cpus", "1", "--resources", f'{{"{worker.name}": 1}}', "--disable-usage-stats"],
            env=self.node_env(worker)) for worker in self.workers}
        for worker in self.workers:
            try:
                code = joining[worker.name].wait(timeout=180)
            except subprocess.TimeoutExpired:
                code = None
            worker.services.pop("ray-start")
            if code != 0:
                raise ClusterError(f"Ray on {worker.name} did not join the head:\n{worker.log('ray-start')}")

    def database_url(self, database: str, driver: str = "postgresql") -> str:
        return f"{driver}://lego:{self.db_password}@{self.head.address}:{POSTGRES_PORT}/{database}"

    @property
    def mlflow_uri(self) -> str:
        return f"http://{self.head.address}:{MLFLOW_PORT}"

    def psql(self, database: str, sql: str) -> str:
        """One query's rows, as psql prints them unaligned, run on the head."""
        return self.head.run([postgres_bin() / "psql", "-h", self.head.address, "-U", "lego", "-d", database, "-tAc",
                              sql], env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PGPASSWORD": self.db_password}).stdout

    def _start_databases(self) -> None:
        """PostgreSQL on the head, with a database each for Prefect's server and MLflow's tracking server, as a team
        deploys them (SQLite takes one writer at a time, on one machine). Password authentication from the nodes'
        subnet only; its data on the head's tmpfs, gone with the node."""
        programs = postgres_bin()
        data = self.head.tmp / "postgres"
        self.head.run(["install", "-d", "-o", "postgres", "-g", "postgres", "-m", "700", data])
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PGPASSWORD": self.db_password}
        self.head.run(["runuser", "-u", "postgres", "--", "sh", "-c",
                       f'umask 077 && printf %s "$PGPASSWORD" > {data}.pw && {programs}/initdb -D {data} -U lego '
                       f"-A scram-sha-256 --pwfile={data}.pw -E UTF8 && rm {data}.pw"], env=env)
        self.head.run(["sh", "-c", f"echo 'host all lego {self.subnet}.0/24 scram-sha-256' >> {data}/pg_hba.conf"])
        self.head.start("postgres", ["runuser", "-u", "postgres", "--", programs / "postgres", "-D", data, "-h",
                                     self.head.address, "-p", POSTGRES_PORT, "-k", ""], env=env)
        self._wait(lambda: self.head.run([programs / "pg_isready", "-q", "-h", self.head.address, "-p", POSTGRES_PORT],
                                         check=False).returncode == 0, "PostgreSQL", self.head, "postgres")
        for database in ("prefect", "mlflow"):
            self.head.run([programs / "createdb", "-h", self.head.address, "-U", "lego", database], env=env)

    def _start_mlflow(self) -> None:
        """MLflow's tracking server on the head: runs and metrics in PostgreSQL, artifacts uploaded through it to the
        shared storage (the nodes need no credentials or path of their own for them)."""
        env = self.node_env(self.head)
        self.head.start("mlflow", [
            VENV_BIN / "mlflow", "server", "--host", self.head.address, "--port", MLFLOW_PORT, "--workers", "1",
            "--backend-store-uri", self.database_url("mlflow", "postgresql+psycopg2"), "--serve-artifacts",
            "--artifacts-destination", self.shared / "mlflow-artifacts",
            "--allowed-hosts", f"{self.head.address}:{MLFLOW_PORT},{self.head.address}"], env=env)

    def _start_prefect(self) -> None:
        env = self.node_env(self.head) | {"PREFECT_HOME": str(self.head.private / "prefect"),
                                          "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                                          "PREFECT_UI_ENABLED": "false",
                                          "PREFECT_API_DATABASE_CONNECTION_URL":
                                              self.database_url("prefect", "postgresql+asyncpg")}
        env.pop("PREFECT_API_URL")
        self.head.start("prefect", [VENV_BIN / "prefect", "server", "start", "--host", self.head.address, "--port",
                                    PREFECT_PORT], env=env)

    def node_env(self, node: Node) -> dict[str, str]:
        """The environment of Lego's processes on `node`: its own engine, the head's Prefect server, and none of this
        process's Lego settings (a test worker's LEGO_WORK_DIR would move the nodes' work dir off the storage)."""
        env = {key: value for key, value in os.environ.items()
               if not key.startswith(("DOCKER_", "PREFECT_", "RAY_", "PYTEST_", "LEGO_", "MLFLOW_"))}
        env.update({"PATH": f"{VENV_BIN}:{env.get('PATH', '/usr/bin:/bin')}",
                    "PREFECT_API_URL": f"http://{self.head.address}:{PREFECT_PORT}/api",
                    "MLFLOW_TRACKING_URI": self.mlflow_uri,
                    "PYTHONPATH": str(REPO), "TMPDIR": str(node.tmp),
                    # Ray's token authentication, as a cluster reachable from other machines should run it.
                    "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.ray_token})
        if node is not self.head:
            env["DOCKER_HOST"] = node.docker_host
        return env | self.ray_env

    @staticmethod
    def _wait(ready, what: str, node: Node, service: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            process = node.services.get(service)
            if time.monotonic() > deadline or (process is not None and process.poll() is not None):
                raise ClusterError(f"{what} did not come up on {node.name}; its log ends with:\n{node.log(service)}")
            time.sleep(0.3)

    # ------------------------------------------------------------------------------------------ tearing down
    def kill_node(self, node: Node) -> None:
        """Lose a node: every process in it killed at once (the kernel closes their connections), then its link
        cut."""
        for pid in node.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(1)
        _run(["ip", "link", "del", f"{self.bridge}v{self.nodes.index(node)}"], check=False)

    def down(self) -> list[str]:
        """Kill every process of every node, delete the namespaces and the bridge; returns what could not be."""
        problems = []
        for node in self.workers:
            if node.holder is not None and node.holder.poll() is None:
                # Unmount the network file system first: a FUSE mount whose server is gone blocks its readers.
                node.run(["fusermount3", "-u", "-z", self.shared], check=False)
        # All nodes at once: SIGTERM (an engine stops its containers), then SIGKILL what is left.
        for signum, grace in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
            for node in self.nodes:
                for pid in node.pids():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signum)
            deadline = time.monotonic() + grace
            while any(node.pids() for node in self.nodes) and time.monotonic() < deadline:
                time.sleep(0.2)
        for node in self.nodes:
            for process in [node.holder, *node.services.values()]:
                if process is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        process.wait(timeout=5)
            if node.pids():
                problems.append(f"{node.name}: processes left {node.pids()}")
            _run(["ip", "netns", "del", node.netns], check=False)
        _run(["ip", "link", "del", self.bridge], check=False)
        (OWNERS / self.tag).unlink(missing_ok=True)
        for node in self.nodes:
            with contextlib.suppress(OSError):
                node.tmp.rmdir()  # empty on the host: the node's files were in its own tmpfs
        # The engines' container cgroups, left when an engine died with containers running.
        for node in self.nodes:
            for cgroup in node.cgroups():
                for child in sorted(cgroup.rglob("*"), key=lambda p: len(p.parts), reverse=True):
                    if child.is_dir():
                        with contextlib.suppress(OSError):
                            child.rmdir()
                with contextlib.suppress(OSError):
                    cgroup.rmdir()
                if cgroup.exists():
                    problems.append(f"cgroup left: {cgroup}")
        left = _run(["ip", "netns", "list"]).stdout
        problems += [f"namespace left: {line}" for line in left.splitlines() if f"lgc{self.tag}" in line]
        # A namespace's veth pairs go when it is deleted, asynchronously.
        deadline = time.monotonic() + 10
        while self.bridge in _run(["ip", "-o", "link"]).stdout and time.monotonic() < deadline:
            time.sleep(0.2)
        links = [line.split(":")[1].strip() for line in _run(["ip", "-o", "link"]).stdout.splitlines()]
        problems += [f"link left: {link}" for link in links if link.split("@")[0].startswith(self.bridge)]
        return problems


def reap_stale_clusters() -> list[str]:
    """Tear down the clusters whose builder died without doing it (a killed test run); returns their tags."""
    reaped = []
    for owner in OWNERS.glob("*") if OWNERS.exists() else []:
        with contextlib.suppress(ValueError, OSError):
            pid = int(owner.read_text())
            if Path(f"/proc/{pid}").exists():
                continue
        cluster = LocalCluster.__new__(LocalCluster)
        cluster.tag, cluster.bridge = owner.name, f"lgc{owner.name}"
        names = [line.split()[0] for line in _run(["ip", "netns", "list"]).stdout.splitlines()
                 if line.startswith(f"lgc{owner.name}-")]
        cluster.nodes = [Node(name.split("-", 1)[1], "", name, Path("/nonexistent")) for name in names]
        cluster.down()
        reaped.append(owner.name)
    return reaped
