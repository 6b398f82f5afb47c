"""The ``Image`` builder, in Beam's words, serialised to the daemon's image
spec (issue 15)::

    {"base": "<name or reference>", "python_version": "3.11",
     "python_packages": [...], "system_packages": [...], "commands": [...],
     "env": {...}, "workdir": "..."}

``Image()`` with nothing set is the daemon's default image (the create sends
no ``image``); ``Image().from_registry("node:20")`` alone is the reference
string. Daemons without declarative images refuse a spec with a 400, which
the SDK raises as ``BadRequestError``.
"""

from __future__ import annotations

import copy
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Union

from ._hybrid import hybridmethod

__all__ = ["Image", "ImageSpec"]

ImageSpec = Union[None, str, Dict[str, Any]]


def _python_version(version: str) -> str:
    text = str(version).strip()
    if text.lower().startswith("python"):
        text = text[len("python") :]
    if not text:
        raise ValueError(f"python_version {version!r} names no version; write e.g. \"3.11\"")
    return text


def _strings(values: Union[str, Iterable[str]], what: str) -> List[str]:
    if isinstance(values, str):
        values = [values]
    out = []
    for v in values:
        if not isinstance(v, str) or not v:
            raise ValueError(f"{what} must be non-empty strings, got {v!r}")
        out.append(v)
    return out


def _env(values: Union[Mapping[str, str], Sequence[str], None]) -> Dict[str, str]:
    if values is None:
        return {}
    if isinstance(values, Mapping):
        return {str(k): str(v) for k, v in values.items()}
    out = {}
    for item in values:
        key, sep, value = str(item).partition("=")
        if not sep or not key:
            raise ValueError(f"environment entry {item!r} must be KEY=VALUE")
        out[key] = value
    return out


class Image:
    """An image to create sandboxes from: a base (the daemon's image name, an
    OCI reference, or a filesystem snapshot id) plus Python version,
    packages, commands, environment and working directory.

    The builder methods change this image and return it, as Beam's do.
    """

    def __init__(
        self,
        python_version: Optional[str] = None,
        python_packages: Union[Sequence[str], str, None] = None,
        commands: Union[Sequence[str], str, None] = None,
        base_image: Optional[str] = None,
        system_packages: Union[Sequence[str], str, None] = None,
        env_vars: Union[Mapping[str, str], Sequence[str], None] = None,
        workdir: Optional[str] = None,
    ) -> None:
        self.base_image: Optional[str] = base_image
        self.python_version: Optional[str] = _python_version(python_version) if python_version else None
        self.python_packages: List[str] = _strings(python_packages, "python_packages") if python_packages else []
        self.system_packages: List[str] = _strings(system_packages, "system_packages") if system_packages else []
        self.commands: List[str] = _strings(commands, "commands") if commands else []
        self.env_vars: Dict[str, str] = _env(env_vars)
        self.workdir: Optional[str] = workdir

    @hybridmethod
    def from_registry(self_or_cls, reference: str) -> "Image":  # type: ignore[misc]
        """Base this image on an OCI reference (``node:20``,
        ``docker.io/library/python:3.12-slim``, ``host:5000/app@sha256:...``).
        Works on an instance (Beam's ``Image().from_registry(...)``) and on
        the class."""
        image = self_or_cls() if isinstance(self_or_cls, type) else self_or_cls
        if not isinstance(reference, str) or not reference.strip():
            raise ValueError("from_registry needs an image reference like \"node:20\"")
        image.base_image = reference.strip()
        return image

    def add_python_version(self, version: str) -> "Image":
        self.python_version = _python_version(version)
        return self

    def add_python_packages(self, packages: Union[Sequence[str], str]) -> "Image":
        """pip requirement strings (``"pandas==2.2.3"``)."""
        self.python_packages.extend(_strings(packages, "python_packages"))
        return self

    def add_system_packages(self, packages: Union[Sequence[str], str]) -> "Image":
        """Debian package names (``"git"``)."""
        self.system_packages.extend(_strings(packages, "system_packages"))
        return self

    def add_commands(self, commands: Union[Sequence[str], str]) -> "Image":
        """Shell commands run at build time, in order."""
        self.commands.extend(_strings(commands, "commands"))
        return self

    def with_envs(self, env_vars: Union[Mapping[str, str], Sequence[str]]) -> "Image":
        """Environment of every process (a dict, or ``"KEY=VALUE"`` strings)."""
        self.env_vars.update(_env(env_vars))
        return self

    def with_workdir(self, workdir: str) -> "Image":
        self.workdir = workdir
        return self

    def is_default(self) -> bool:
        return self.to_spec() is None

    def to_spec(self) -> ImageSpec:
        """What a create sends as ``image``: None (the daemon's default
        image), the base alone as a string, or the spec object."""
        spec: Dict[str, Any] = {}
        if self.base_image:
            spec["base"] = self.base_image
        if self.python_version:
            spec["python_version"] = self.python_version
        if self.python_packages:
            spec["python_packages"] = list(self.python_packages)
        if self.system_packages:
            spec["system_packages"] = list(self.system_packages)
        if self.commands:
            spec["commands"] = list(self.commands)
        if self.env_vars:
            spec["env"] = dict(self.env_vars)
        if self.workdir:
            spec["workdir"] = self.workdir
        if not spec:
            return None
        if list(spec) == ["base"]:
            return spec["base"]
        return spec

    def to_dict(self) -> Dict[str, Any]:
        """The spec as an object, even when it is only a base (``{}`` for
        the default image)."""
        spec = self.to_spec()
        if spec is None:
            return {}
        if isinstance(spec, str):
            return {"base": spec}
        return copy.deepcopy(spec)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Image) and self.to_spec() == other.to_spec()

    def __repr__(self) -> str:
        return f"Image({self.to_spec()!r})"


def image_spec(image: Union[None, str, Image, Mapping[str, Any]]) -> ImageSpec:
    """The ``image`` member of a create from what a caller gave."""
    if image is None:
        return None
    if isinstance(image, Image):
        return image.to_spec()
    if isinstance(image, str):
        if not image.strip():
            raise ValueError("image must not be empty")
        return image.strip()
    if isinstance(image, Mapping):
        return dict(image)
    raise TypeError(f"image must be a name, a reference, an Image or a spec dict, not {type(image).__name__}")
