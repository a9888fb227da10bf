"""Starting or joining Ray: the address Ray will dial, token authentication, start and stop.

Joining a cluster, pgpong first asks the cluster's GCS who it is (one gRPC call, a few
seconds at most) with the token Ray's own commands would use. So a wrong address, a
port where something else listens, or a missing or refused token is reported at once in
one line, instead of ray.init's minutes of retries and C++ log lines.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import math
import os
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pgpong.errors import PgpongError

CONNECT_SECONDS = 5.0
LEFTOVER_SECONDS = 5.0  # how long a local Ray's processes may outlive its shutdown before they are killed
# Settings of the Ray instance pgpong starts itself (a cluster it joins keeps its own).
# An episode's result (its gradient: at most 5 MB, 0.6-0.9 MB when losing) comes back
# in the task's reply instead of through the object store, which halves the raylet's
# work and shortens a worker's pause between episodes (about 3.8 -> 3.1 ms here); and
# no task events are sent for the dashboard, which pgpong does not start.
LOCAL_SYSTEM_CONFIG = {"max_direct_call_object_size": 8 * 2**20, "task_events_report_interval_ms": 0}
TOKEN_HELP = (
    "copy the head node's ~/.ray/auth_token to this machine (or point RAY_AUTH_TOKEN_PATH at a copy, "
    "or set RAY_AUTH_TOKEN)"
)


class ClusterError(PgpongError, RuntimeError):
    """Ray could not be started or the cluster could not be reached."""


@dataclass(frozen=True)
class Token:
    value: str
    source: str  # where it was found, for messages


def find_token() -> Token | None:
    """The cluster token, looked for where Ray's own commands look: RAY_AUTH_TOKEN,
    the file RAY_AUTH_TOKEN_PATH names, then ~/.ray/auth_token."""
    value = os.environ.get("RAY_AUTH_TOKEN", "").strip()
    if value:
        return Token(value, "RAY_AUTH_TOKEN")
    named = os.environ.get("RAY_AUTH_TOKEN_PATH")
    path = Path(named).expanduser() if named else Path.home() / ".ray" / "auth_token"
    try:
        value = path.read_text(errors="replace").strip() if path.is_file() and path.stat().st_size < 4096 else ""
    except OSError:
        value = ""
    if value:
        return Token(value, str(path))
    if named:
        raise ClusterError(f"RAY_AUTH_TOKEN_PATH is {named}, but there is no readable token there")
    return None


def parse_address(address: str) -> tuple[str, int]:
    """HOST:PORT of a Ray cluster's GCS, checked; a few common mistakes named."""
    text = address.strip()
    if text.startswith(("ray://", "http://", "https://")):
        scheme = text.split("://", 1)[0]
        what = "a Ray Client address" if scheme == "ray" else "a dashboard (HTTP) address"
        raise ClusterError(
            f"cluster address {address!r} is {what}; pgpong joins a cluster at the head's GCS address "
            "HOST:PORT (the port given to `ray start --head --port`, 6379 by default)"
        )
    host, sep, port = text.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]") and len(host) > 1  # [IPv6]:PORT
    host = host[1:-1] if bracketed else host
    if not sep or not host or not port.isdecimal() or "[" in host or "]" in host:
        raise ClusterError(f"cluster address {address!r} is not HOST:PORT (e.g. 192.168.1.10:6379)")
    if not 1 <= int(port) <= 65535:
        raise ClusterError(f"cluster address {address!r}: port {port} is out of range (1-65535)")
    if not host_name_valid(host):
        raise ClusterError(f"cluster address {address!r}: {host!r} is not a host name or IP address")
    return host, int(port)


def host_name_valid(host: str) -> bool:
    """Whether `host` is an IP address or a name the resolver can be asked for (labels of
    1-63 characters, non-ASCII ones as IDNA can spell them): "a..b" or a 64-letter label is not."""
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    if any(c in host for c in ":/@[] \t"):  # (an IPv6 address would have been one above)
        return False
    try:
        host.encode("idna")
    except UnicodeError:
        return False
    return all(0 < len(label) <= 63 for label in host.rstrip(".").split("."))


def dialled_host(host: str) -> str:
    """The host Ray will actually dial: it replaces a loopback name or address by this
    node's own IP (so a cluster listening on 127.0.0.1 only is not reachable)."""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        return host
    from ray._private.services import get_node_ip_address

    return get_node_ip_address()


def probe_cluster(host: str, port: int, token: Token | None, timeout: float = CONNECT_SECONDS, given: str = "") -> bool:
    """Ask the GCS at host:port for the cluster id, as ray.init would, with the token if
    any. Return False if it answered, True if it wants a token and none was sent; raise
    ClusterError saying what is wrong otherwise (naming `given`, the address as written)."""
    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    request = gcs_service_pb2.GetClusterIdRequest()  # type: ignore[attr-defined]  # generated, no stubs

    target = where = f"{host}:{port}"
    if given and given != target:
        where = f"{given} (dialled as {target}: Ray replaces a loopback address by this node's IP)"
    try:
        socket.create_connection((host, port), timeout=timeout).close()  # the cheap check first
    except (OSError, UnicodeError) as exc:  # UnicodeError: a name IDNA cannot spell, should one pass parse_address
        raise ClusterError(
            f"cannot reach a Ray cluster at {where} ({getattr(exc, 'strerror', None) or exc}); "
            "is `ray start --head` running there and the port open?"
        ) from None
    metadata = [("authorization", f"Bearer {token.value}")] if token else []
    with grpc.insecure_channel(target) as channel:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        try:
            stub.GetClusterId(request, timeout=timeout, metadata=metadata)
            return False
        except grpc.RpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.UNAUTHENTICATED:
                if token is None:
                    return True
                raise ClusterError(
                    f"the Ray cluster at {where} refused the authentication token from {token.source}: "
                    "use the head node's ~/.ray/auth_token"
                ) from None
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise ClusterError(f"no Ray cluster answered at {where} within {timeout:.0f} s") from None
            raise ClusterError(
                f"no Ray cluster answers at {where}: something else listens on that port "
                f"({code.name.lower()}: {_first_line(Exception(exc.details() or ''))}); "
                "give the head's GCS address (the port of `ray start --head --port`)"
            ) from None


def check_address(address: str, timeout: float = CONNECT_SECONDS) -> str:
    """Check that a Ray cluster answers at `address`, and with a token where it wants
    one (found where Ray's own commands look); set this process's token mode to match
    the cluster's. Return the address Ray will dial."""
    host, port = parse_address(address)
    dialled = dialled_host(host)
    given = address.strip()
    if probe_cluster(dialled, port, None, timeout, given):
        token = find_token()
        if token is None:
            raise ClusterError(
                f"the Ray cluster at {given} requires an authentication token and none was found: {TOKEN_HELP}"
            )
        probe_cluster(dialled, port, token, timeout, given)
        set_auth_mode("token")
    else:
        # A cluster without authentication: a driver in token mode would start
        # workers that cannot run there.
        set_auth_mode("disabled")
    return f"{dialled}:{port}"


def set_auth_mode(mode: str) -> None:
    """Ray's token mode for this process and the workers it starts. Ray caches its
    settings when imported (the probe imported it), so they are read again, as Ray's
    own `ray start` does when it turns token mode on."""
    os.environ["RAY_AUTH_MODE"] = mode
    from ray._raylet import Config  # type: ignore[attr-defined]  # compiled module, no stubs

    Config.initialize("")


def ensure_local_token() -> None:
    """The token a new local cluster in token mode needs. ray.init makes one
    (~/.ray/auth_token) when none is found; ray.cluster_utils' Cluster, which bench's
    simulation and the tests' multi-node clusters use, does not, and without one its
    GCS stops at start. Ray's own function, the one ray.init calls."""
    from ray._private.authentication.authentication_token_setup import ensure_token_if_auth_enabled

    ensure_token_if_auth_enabled(None, create_token_if_missing=True)


def start_ray(address: str | None, num_cpus: int | None = None, log_to_driver: bool = True) -> None:
    """Join the cluster at `address`, or start a local Ray instance when it is None.
    A process already connected to Ray (a test's shared instance) stays as it is.
    log_to_driver=False: what the workers print stays in Ray's logs."""
    # Ray reads these when it is imported (and its C++ core when it starts), so they
    # are decided first.
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if not (_is_terminal(sys.stdout) and _is_terminal(sys.stderr)):  # a file, a pipe, a notebook: the lines
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")  # Ray forwards from workers carry no colour codes there
    if address is None:
        os.environ.setdefault("RAY_AUTH_MODE", "token")  # our own instance: Ray's default, chosen explicitly
    else:
        address = check_address(address)
    # In a notebook without ipywidgets, importing Ray logs a suggestion to install it.
    logging.getLogger("ray.widgets.util").setLevel(logging.WARNING)
    import ray

    if ray.is_initialized():
        return
    try:
        with new_raylets() as started:
            ray.init(
                # "local": a Ray instance of our own, even when another one runs on this
                # machine (with None, ray.init would join whichever it finds).
                address=address or "local",
                num_cpus=num_cpus if address is None else None,
                include_dashboard=False,
                logging_level=logging.WARNING,
                log_to_driver=log_to_driver,
                _system_config=LOCAL_SYSTEM_CONFIG if address is None else None,
            )
        _local_raylets[:] = started  # none when it joined a cluster
    except ConnectionError as exc:
        raise ClusterError(f"cannot connect to the Ray cluster at {address}: {_first_line(exc)}") from None
    except Exception as exc:  # Ray raises many kinds; all mean the same to the user here
        if "authentication token" in str(exc).lower():
            raise ClusterError(f"the Ray cluster requires an authentication token: {TOKEN_HELP}") from None
        raise ClusterError(f"could not start Ray: {_first_line(exc)}") from None


def _is_terminal(stream: object) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if callable(isatty) else False
    except ValueError:  # a closed stream
        return False


def cluster_cpus() -> int:
    import ray

    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def nodes_with_cpus() -> list[tuple[str, int]]:
    """(node id, CPUs) of the cluster's live nodes that have CPUs, head first."""
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) >= 1]
    nodes.sort(key=lambda n: not n.get("Resources", {}).get("node:__internal_head__"))
    return [(n["NodeID"], int(n["Resources"]["CPU"])) for n in nodes]


def ray_running() -> bool:
    """Whether this process is connected to Ray (without importing it when it was not)."""
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def stop_ray(grace: float = LEFTOVER_SECONDS) -> None:
    """Disconnect from Ray. A local instance this process started is stopped, and
    whatever of it outlives Ray's own shutdown by `grace` seconds is killed: a worker
    normally ends with its raylet, but one that hangs on its way out (seen after the
    notebook's run and after bench's) or misses the raylet's end (a raylet killed or
    crashed) would otherwise live on, holding its memory, its parent init."""
    ray = sys.modules.get("ray")  # never imported: nothing to stop (and no need to load it)
    if ray is None or not ray.is_initialized():
        return
    raylets, _local_raylets[:] = list(_local_raylets), []
    with ending_leftovers(raylets, grace):
        ray.shutdown()


@contextlib.contextmanager
def ending_leftovers(raylets: list, grace: float = LEFTOVER_SECONDS) -> Iterator[None]:
    """Around the end of a Ray instance this process started (its raylets, as
    psutil processes): once it is over, its processes still alive `grace` seconds later
    are killed. (A Ray 2.60 worker told to exit can hang in Ray's own exit handler, on
    a lock its thread holds; its raylet then no longer counts it, and it lives on
    under init.)"""
    import psutil

    before = _processes_of(raylets)
    try:
        yield
    finally:
        leftovers = {process.pid: process for process in before + _processes_of(raylets)}.values()
        _, alive = psutil.wait_procs(list(leftovers), timeout=grace)
        for process in alive:
            with contextlib.suppress(psutil.Error):
                process.kill()
        psutil.wait_procs(alive, timeout=grace)


_local_raylets: list = []  # the raylets of the local Ray instance this process started (psutil processes)


@contextlib.contextmanager
def new_raylets() -> Iterator[list]:
    """The raylets this process starts within the block (a local Ray instance, or a
    cluster of several on this machine): a list filled as the block ends, of psutil
    processes (each knows its start time, so a PID reused later is not taken for it)."""
    before = {raylet.pid for raylet in _raylet_children()}
    started: list = []
    yield started
    started += [raylet for raylet in _raylet_children() if raylet.pid not in before]


def _raylet_children() -> list:
    import psutil

    found = []
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process().children():
            with contextlib.suppress(psutil.Error):
                if child.name() == "raylet":
                    found.append(child)
    return found


def _processes_of(raylets: list) -> list:
    """The processes of these raylets, wherever they are now: the raylets, what runs
    under them, and every process their workers' environment names them in
    (RAY_RAYLET_PID), even once the raylet is gone: made after the raylet started,
    and before any other process took its PID."""
    import psutil

    found, started = [], {}  # started: a raylet's PID -> the span of start times of its processes
    for raylet in raylets:
        since = raylet.create_time()  # (kept from when it was first seen, alive)
        if raylet.is_running():  # the same process: psutil compares start times
            started[str(raylet.pid)] = (since, math.inf)
            with contextlib.suppress(psutil.Error):
                found += [raylet, *raylet.children(recursive=True)]
        else:
            try:
                started[str(raylet.pid)] = (since, psutil.Process(raylet.pid).create_time())
            except psutil.Error:  # no process has its PID now
                started[str(raylet.pid)] = (since, math.inf)
    if not started:
        return found
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            span = started.get(process.environ().get("RAY_RAYLET_PID", ""))
            if span and process.pid != os.getpid() and span[0] <= process.create_time() < span[1]:
                found.append(process)
    return found


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__
