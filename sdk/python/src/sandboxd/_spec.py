"""What ``Sandbox(...)`` was given, checked and turned into the daemon's
create body (``POST /v1/sandboxes``, src/api/types.rs ``CreateSandbox``).
Shared by the sync and asyncio ``Sandbox``."""

from __future__ import annotations

import math
import re
import uuid
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from .image import Image, image_spec

__all__ = ["parse_memory", "parse_cpu", "SandboxOptions"]

_MEMORY = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")
_MIB = 1024 * 1024
# Binary units (Kubernetes' Ki/Mi/Gi/Ti, also written KiB...), decimal ones
# (K/M/G/T, KB...), all case-insensitive; a bare number is MiB.
_UNITS = {
    "": _MIB,
    "b": 1,
    "ki": 1 << 10,
    "kib": 1 << 10,
    "mi": 1 << 20,
    "mib": 1 << 20,
    "gi": 1 << 30,
    "gib": 1 << 30,
    "ti": 1 << 40,
    "tib": 1 << 40,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
}


def parse_memory(memory: Union[int, float, str]) -> int:
    """MiB from an int (MiB, as Beam takes it) or a string with a unit:
    ``"1Gi"`` -> 1024, ``"512Mi"`` -> 512, ``"1.5Gi"`` -> 1536, ``"1G"`` ->
    954 (10**9 bytes, rounded up to whole MiB), ``"256"`` -> 256."""
    if isinstance(memory, bool):
        raise ValueError("memory must be MiB (an int) or a string like \"1Gi\", not a bool")
    if isinstance(memory, int):
        mib = memory
    elif isinstance(memory, float):
        if not memory.is_integer():
            raise ValueError(f"memory {memory!r} must be whole MiB; write e.g. \"1.5Gi\" for fractions of a GiB")
        mib = int(memory)
    elif isinstance(memory, str):
        match = _MEMORY.match(memory)
        unit = match.group(2).lower() if match else None
        if not match or unit not in _UNITS:
            raise ValueError(f"memory {memory!r} is not a size like \"1Gi\", \"512Mi\" or 1024 (MiB)")
        value = float(match.group(1))
        mib = math.ceil(value * _UNITS[unit] / _MIB)
    else:
        raise ValueError(f"memory must be MiB (an int) or a string like \"1Gi\", not {type(memory).__name__}")
    if mib <= 0:
        raise ValueError(f"memory {memory!r} must be above 0")
    return mib


def parse_cpu(cpu: Union[int, float, str]) -> float:
    """Cores from a number (``1``, ``0.5``) or a string (``"2"``, ``"500m"``
    millicores)."""
    if isinstance(cpu, bool):
        raise ValueError("cpu must be a number of cores, not a bool")
    if isinstance(cpu, (int, float)):
        cores = float(cpu)
    elif isinstance(cpu, str):
        text = cpu.strip().lower()
        try:
            cores = float(text[:-1]) / 1000 if text.endswith("m") else float(text)
        except ValueError:
            raise ValueError(f"cpu {cpu!r} is not a number of cores like 1, 0.5 or \"500m\"") from None
    else:
        raise ValueError(f"cpu must be a number of cores, not {type(cpu).__name__}")
    if not math.isfinite(cores) or cores <= 0:
        raise ValueError(f"cpu {cpu!r} must be above 0")
    return cores


def _str_list(values: Optional[Sequence[str]], what: str) -> Optional[List[str]]:
    if values is None:
        return None
    if isinstance(values, str):
        values = [values]
    out = [str(v) for v in values]
    for v in out:
        if not v:
            raise ValueError(f"{what} entries must not be empty")
    return out


def _str_map(values: Optional[Mapping[str, Any]], what: str) -> Dict[str, str]:
    if not values:
        return {}
    if not isinstance(values, Mapping):
        raise ValueError(f"{what} must be a dict of strings")
    return {str(k): str(v) for k, v in values.items()}


def new_idempotency_key() -> str:
    return "sdk-py-" + uuid.uuid4().hex


class SandboxOptions:
    """The checked arguments of ``Sandbox(...)``. None means: the daemon's
    default (its ``default_cpu``, ``default_memory_mib``, ``default_image``,
    ``default_ttl_seconds``, ``default_egress``)."""

    def __init__(
        self,
        cpu: Union[int, float, str, None] = None,
        memory: Union[int, float, str, None] = None,
        image: Union[None, str, Image, Mapping[str, Any]] = None,
        gpu: Optional[str] = None,
        gpu_count: Optional[int] = None,
        block_network: Optional[bool] = None,
        allow_list: Optional[Sequence[str]] = None,
        secrets: Optional[Sequence[str]] = None,
        env: Optional[Mapping[str, str]] = None,
        ports: Optional[Sequence[int]] = None,
        keep_warm_seconds: Optional[int] = None,
        use_vm: bool = False,
        labels: Optional[Mapping[str, str]] = None,
        disk: Union[int, float, str, None] = None,
        cpu_shares: Optional[int] = None,
    ) -> None:
        self.cpu = parse_cpu(cpu) if cpu is not None else None
        if cpu_shares is not None and (
            isinstance(cpu_shares, bool) or not isinstance(cpu_shares, int) or not 2 <= cpu_shares <= 262144
        ):
            raise ValueError(f"cpu_shares must be a whole number from 2 to 262144 (1024 is the default), got {cpu_shares!r}")
        self.cpu_shares = cpu_shares
        self.memory_mib = parse_memory(memory) if memory is not None else None
        self.disk_mib = parse_memory(disk) if disk is not None else None
        self.image = image
        self.image_spec = image_spec(image)
        if isinstance(gpu, (list, tuple)):
            # Beam takes a list of acceptable types; the daemon takes one.
            if len(gpu) != 1:
                raise ValueError("sandboxd takes one GPU model per sandbox (gpu=\"H100\"), or gpu=\"any\"")
            gpu = gpu[0]
        gpu = str(gpu) if gpu else None
        if gpu is not None and gpu.lower() in ("", "nogpu", "none"):
            gpu = None
        self.gpu = gpu
        if gpu_count is not None and (isinstance(gpu_count, bool) or int(gpu_count) < 0):
            raise ValueError("gpu_count must be a whole number >= 0")
        # Beam's default gpu_count is 0, meaning "no GPU".
        self.gpu_count = int(gpu_count) if gpu_count else None
        if block_network is not None and not isinstance(block_network, bool):
            raise ValueError("block_network must be True, False or None")
        self.allow_list = _str_list(allow_list, "allow_list")
        if block_network and self.allow_list is not None:
            raise ValueError("give block_network=True or an allow_list, not both")
        self.block_network = block_network
        self.secrets = _str_list(secrets, "secrets") or []
        self.env = _str_map(env, "env")
        self.ports = [int(p) for p in ports] if ports else []
        for p in self.ports:
            if not 0 < p < 65536:
                raise ValueError(f"port {p} must be between 1 and 65535")
        if keep_warm_seconds is not None:
            if isinstance(keep_warm_seconds, bool) or int(keep_warm_seconds) != keep_warm_seconds:
                raise ValueError("keep_warm_seconds must be whole seconds, or -1 for no TTL")
            keep_warm_seconds = int(keep_warm_seconds)
            if keep_warm_seconds < -1 or keep_warm_seconds == 0:
                raise ValueError("keep_warm_seconds must be -1 (no TTL) or a positive number of seconds")
        self.keep_warm_seconds = keep_warm_seconds
        self.use_vm = bool(use_vm)
        self.labels = _str_map(labels, "labels")

    def create_body(self, idempotency_key: Optional[str] = None) -> Dict[str, Any]:
        """The JSON object of ``POST /v1/sandboxes`` (only what was given)."""
        body: Dict[str, Any] = {}
        if self.image_spec is not None:
            body["image"] = self.image_spec
        if self.use_vm:
            body["runtime"] = "vm"
        if self.cpu is not None:
            body["cpu"] = self.cpu
        if self.memory_mib is not None:
            body["memory_mib"] = self.memory_mib
        if self.disk_mib is not None:
            body["disk_mib"] = self.disk_mib
        if self.cpu_shares is not None:
            body["cpu_shares"] = self.cpu_shares
        if self.keep_warm_seconds is not None:
            body["ttl_seconds"] = self.keep_warm_seconds
        if self.env:
            body["env"] = dict(self.env)
        if self.labels:
            body["labels"] = dict(self.labels)
        if self.gpu is not None:
            body["gpu"] = self.gpu
        if self.gpu_count is not None:
            body["gpu_count"] = self.gpu_count
        if self.allow_list is not None:
            body["allow_list"] = list(self.allow_list)
        elif self.block_network is not None:
            body["block_network"] = self.block_network
        if self.secrets:
            body["secrets"] = list(self.secrets)
        if self.ports:
            # Preview URLs; a daemon without them refuses the field, one without
            # an ingress answers ingress_disabled (both FeatureUnavailableError).
            body["ports"] = list(self.ports)
        body["idempotency_key"] = idempotency_key or new_idempotency_key()
        return body

    def fork_body(self, snapshot_id: str, idempotency_key: Optional[str] = None) -> Dict[str, Any]:
        """A create from a memory snapshot: the fork keeps the snapshot's
        image, limits and runtime, so only what may differ is sent."""
        if not isinstance(snapshot_id, str) or not snapshot_id:
            raise ValueError("create_from_memory_snapshot needs a snapshot id")
        full = self.create_body(idempotency_key)
        body = {"from_snapshot": snapshot_id}
        for key in ("ttl_seconds", "env", "labels", "allow_list", "block_network", "secrets", "ports",
                    "cpu", "memory_mib", "disk_mib", "cpu_shares", "idempotency_key"):
            if key in full:
                body[key] = full[key]
        return body


class SandboxArgs:
    """What to create. Every argument left None takes the daemon's default.

    - ``cpu``: cores (``1``, ``0.5``, ``"500m"``).
    - ``memory``: MiB as an int, or ``"1Gi"`` / ``"512Mi"``.
    - ``image``: the daemon's image name (``"python"``), an OCI reference, a
      filesystem snapshot id, or an :class:`Image`.
    - ``gpu`` / ``gpu_count``: a GPU model as users write it (``"H100"``,
      ``"RTX4090"``, ``"any"``) and how many.
    - ``block_network=True``: nothing leaves. ``allow_list``: only these
      hosts / ``*.wildcards`` / addresses. ``block_network=False``: open.
      Neither: the daemon's ``default_egress`` (block, as shipped).
    - ``secrets``: brokered secret names to bind; ``env``: environment.
    - ``ports``: ports to expose as preview URLs (HTTP, token auth) once it is
      ready; the instance holds their tokens (``list_urls()``, ``preview_url(port)``).
    - ``keep_warm_seconds``: the sandbox's TTL in seconds from now (the
      daemon removes it then); -1: no TTL, it runs until terminated; None:
      the daemon's ``default_ttl_seconds`` (600 as shipped, Beam's default).
    - ``use_vm``: a KVM microVM instead of a container.
    - ``labels``: caller labels, returned as given.
    - ``disk``: size of its writable layer (as ``memory``).
    - ``cpu_shares``: its CPU weight against other sandboxes when the CPUs
      are contended, in cgroup v1 shares (2 to 262144; 1024 is the
      default). A sandbox with another weight than 1024 is never a pool claim.

    Connection: ``client=`` (a :class:`Client`), or ``url=`` / ``token=`` /
    ``tls_fingerprint=`` / ``socket=`` (over the environment's
    ``SANDBOXD_*``).
    """

    def __init__(
        self,
        cpu: Union[int, float, str, None] = None,
        memory: Union[int, str, None] = None,
        image: Union[None, str, Image, Mapping[str, Any]] = None,
        gpu: Optional[str] = None,
        gpu_count: Optional[int] = None,
        block_network: Optional[bool] = None,
        allow_list: Optional[Sequence[str]] = None,
        secrets: Optional[Sequence[str]] = None,
        env: Optional[Mapping[str, str]] = None,
        ports: Optional[Sequence[int]] = None,
        keep_warm_seconds: Optional[int] = None,
        use_vm: bool = False,
        labels: Optional[Mapping[str, str]] = None,
        *,
        disk: Union[int, str, None] = None,
        cpu_shares: Optional[int] = None,
        client: Any = None,
        url: Optional[str] = None,
        token: Optional[str] = None,
        tls_fingerprint: Optional[str] = None,
        socket: Optional[str] = None,
    ) -> None:
        self.options = SandboxOptions(
            cpu=cpu,
            memory=memory,
            image=image,
            gpu=gpu,
            gpu_count=gpu_count,
            block_network=block_network,
            allow_list=allow_list,
            secrets=secrets,
            env=env,
            ports=ports,
            keep_warm_seconds=keep_warm_seconds,
            use_vm=use_vm,
            labels=labels,
            disk=disk,
            cpu_shares=cpu_shares,
        )
        self._client_arg = client
        self._conn = dict(url=url, token=token, tls_fingerprint=tls_fingerprint, socket=socket)

    @property
    def keep_warm_seconds(self) -> Optional[int]:
        return self.options.keep_warm_seconds

    def create_request(self) -> Dict[str, Any]:
        """The body ``create()`` sends (with a fresh idempotency key)."""
        return self.options.create_body()
