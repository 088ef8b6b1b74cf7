"""Joining a multi-process job through `jax.distributed` with a bounded wait and a one-line error,
sending the output of every process but the first to a log file in the run dir, and leaving the
process quickly once its work is done.

Nothing here imports jax until `join` runs, after `meshrun.placement.devices.prepare`. Whether this
process has joined is jax's own state (jax.distributed can be initialised once per process: a
multirun inside an srun step runs every job in the same processes).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from meshrun.errors import ConfigError
from meshrun.placement.identity import Identity
from meshrun.specs.rundir import process_log
from meshrun.system import process

log = logging.getLogger("meshrun")


def join(
    identity: Identity, timeout_s: int, on_timeout: Callable[[str], None], listen: str | None = None
) -> None:
    """Joins the job: process 0 checks its port is free and starts the coordinator, listening on
    `listen` (HOST:PORT, listen_address; None: jax's choice), the others wait for it to answer;
    then jax.distributed forms the job. If that takes longer than `timeout_s`,
    `on_timeout(message)` is called and the process exits with status 2 (jax would otherwise abort
    with a C++ stack trace)."""
    if not identity.several or joined():
        return
    started = time.monotonic()
    if identity.coordinator is not None:
        host, port = split_address(identity.coordinator)
        if identity.is_first:
            check_port_free(port, "distributed.coordinator", identity.coordinator)
        else:
            _wait_for_coordinator(host, port, identity, timeout_s)
    left = max(1.0, timeout_s - (time.monotonic() - started))
    watchdog = threading.Timer(left, _give_up, args=(identity, timeout_s, on_timeout))
    watchdog.daemon = True
    watchdog.start()
    import jax

    listening = (
        f"; its coordinator listens on {listen or 'the address jax picks'}" if identity.is_first else ""
    )
    log.info(
        f"process {identity.process_id} of {identity.num_processes} "
        f"joining the job ({identity.source}){listening}"
    )
    jax.distributed.initialize(
        coordinator_address=identity.coordinator,
        coordinator_bind_address=listen if identity.is_first else None,
        num_processes=identity.num_processes,
        process_id=identity.process_id,
        local_device_ids=list(identity.local_device_ids) if identity.local_device_ids else None,
        # Longer than the watchdog, so that meshrun, not jax's abort, reports a job that never forms.
        initialization_timeout=int(left) + 30,
    )
    watchdog.cancel()


def joined() -> bool:
    """Whether this process has joined a multi-process job."""
    jax = sys.modules.get("jax")
    return jax is not None and jax.distributed.is_initialized()


def follows() -> bool:
    """Whether this process has joined a job as a process other than 0 (which reports for all)."""
    return joined() and sys.modules["jax"].process_index() != 0


def exit_now(status: int) -> None:
    """Ends the process at once, once its output and logs are flushed: the interpreter's own exit
    (jax's and TensorFlow's clean-up, about 1.5 s) is work nobody waits for. Also how a failed
    process of a job leaves: a normal exit would wait in jax's shutdown barrier for the other
    processes, which wait in a collective for this one, so nobody would ever exit."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _give_up(identity: Identity, timeout_s: int, on_timeout: Callable[[str], None]) -> None:
    where = identity.coordinator or "the coordinator SLURM's environment names"
    message = (
        f"distributed.num_processes: process {identity.process_id} of {identity.num_processes} waited "
        f"{timeout_s} s at {where} but the job did not form; start all {identity.num_processes} processes, "
        "each with its own distributed.process_id (or raise distributed.timeout_s)"
    )
    try:
        on_timeout(message)
    finally:
        exit_now(2)


def listen_address(identity: Identity, given: str | None, local: bool) -> str | None:
    """Where process 0's coordinator listens, no wider than the job: `given`
    (distributed.bind_address) when set, which must be an address of this host; loopback for a job
    whose processes all run on this machine (`local`, or a coordinator on a loopback address);
    else the address the coordinator names where it is one of this host's, else every interface.
    None where jax finds the coordinator itself (SLURM). ConfigError for a `given` address this
    host does not have."""
    if given is not None:
        check_bind_address(given, identity.coordinator)
        return given
    if identity.coordinator is None:
        return None
    host, port = split_address(identity.coordinator)
    if local or _is_loopback(host):
        return f"{_loopback(host)}:{port}"
    own = next((address for address in _addresses(host) if _is_own(address)), None)
    if own is None:
        return f"[::]:{port}"
    return f"[{own}]:{port}" if ":" in own else f"{own}:{port}"


def check_bind_address(given: str, coordinator: str | None) -> None:
    """ConfigError unless distributed.bind_address `given` is an address of this host (or every
    interface) on the coordinator's port."""
    host, port = split_address(given)
    if not _is_own(host):
        raise ConfigError(
            "distributed.bind_address",
            f"got {given!r}, but {host} is not an address of this host "
            f"({socket.gethostname()}); give one of its own "
            "addresses, or [::] (or 0.0.0.0) for every interface",
        )
    if coordinator is not None and split_address(coordinator)[1] != port:
        raise ConfigError(
            "distributed.bind_address",
            f"got {given!r}, but the coordinator is {coordinator}; listen on its port, "
            f"{split_address(coordinator)[1]}",
        )


def _addresses(host: str) -> list[str]:
    """The IP addresses `host` resolves to (none when it does not resolve)."""
    try:
        return list(
            dict.fromkeys(info[4][0] for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP))
        )
    except OSError:
        return []


def _loopback(host: str) -> str:
    """The loopback address to listen on for a coordinator named `host`: IPv6's where the name
    resolves to IPv6 addresses only (`[::1]`), else IPv4's, which the local launcher uses."""
    addresses = _addresses(host)
    return "[::1]" if addresses and all(":" in a for a in addresses) else "127.0.0.1"


def _is_loopback(host: str) -> bool:
    addresses = _addresses(host)
    return bool(addresses) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses)


def _is_own(host: str) -> bool:
    """Whether `host` is an address of this machine (or every interface): a socket binds to it."""
    for address in _addresses(host):
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((address, 0))
                return True
            except OSError:
                continue
    return False


def split_address(address: str) -> tuple[str, int]:
    """host:port (or [v6]:port) as (host, port)."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def check_port_free(port: int, key: str, given: object) -> None:
    """ConfigError when something on this machine already listens on `port` (the coordinator
    binds every address on it). A port that a job just closed (its connections in TIME_WAIT for a
    minute) is free: the coordinator's server reuses it, as the probe does."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError:
            raise ConfigError(
                key,
                f"got {given!r}, but port {port} is already in use on this machine; pick a free port"
                + (" or leave distributed.port unset to get one" if key == "distributed.port" else ""),
            ) from None


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def _wait_for_coordinator(host: str, port: int, identity: Identity, timeout_s: int) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=2):
                return
        except OSError:
            if time.monotonic() >= deadline:
                raise ConfigError(
                    "distributed.coordinator",
                    f"got {identity.coordinator!r}, but nothing answered there within {timeout_s} s "
                    f"(process {identity.process_id} of {identity.num_processes}); start process 0 and give "
                    "every process its host:port",
                ) from None
            time.sleep(0.25)


def log_path(run_dir: str, process_id: int) -> Path:
    """The log file of process `process_id` in the run dir."""
    return process_log(run_dir, process_id)


def route_output(run_dir: str, process_id: int) -> Path:
    """Sends this process's stdout, stderr and log records to its own log file in the run dir
    (appending), for every process but the first; returns the file."""
    path = log_path(run_dir, process_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    process.output_to_file(path)
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, logging.FileHandler):  # the run's main log belongs to process 0
            root.removeHandler(handler)
            handler.close()
    return path
