"""Without a daemon: sizes, CPU, the Image builder's JSON, create bodies."""

from __future__ import annotations

import json

import pytest

from sandboxd import Image, Sandbox, parse_cpu, parse_memory
from sandboxd import aio


@pytest.mark.parametrize(
    "given, mib",
    [
        (512, 512),
        ("512", 512),
        ("1Gi", 1024),
        ("1gi", 1024),
        ("512Mi", 512),
        ("512MiB", 512),
        ("1.5Gi", 1536),
        ("2GiB", 2048),
        ("1Ti", 1024 * 1024),
        ("1G", 954),
        ("100M", 96),
        ("2048Ki", 2),
        (" 256 Mi ", 256),
        (1024.0, 1024),
    ],
)
def test_memory_sizes(given, mib):
    assert parse_memory(given) == mib


@pytest.mark.parametrize("bad", ["", "Gi", "1Xi", "-1Gi", "1,5Gi", 0, -5, "0", True, 1.5, None, [1]])
def test_bad_memory_sizes_are_refused(bad):
    with pytest.raises(ValueError):
        parse_memory(bad)


@pytest.mark.parametrize("given, cores", [(1, 1.0), (0.5, 0.5), ("2", 2.0), ("500m", 0.5), ("1500m", 1.5)])
def test_cpu(given, cores):
    assert parse_cpu(given) == cores


@pytest.mark.parametrize("bad", [0, -1, "x", "", float("nan"), float("inf"), True])
def test_bad_cpu_is_refused(bad):
    with pytest.raises(ValueError):
        parse_cpu(bad)


def test_the_issue_example_image_serialises_to_the_spec():
    image = Image(python_version="python3.11").add_python_packages(["pandas"])
    assert image.to_spec() == {"python_version": "3.11", "python_packages": ["pandas"]}
    body = Sandbox(cpu=1, memory="1Gi", image=image, block_network=True, keep_warm_seconds=120).create_request()
    key = body.pop("idempotency_key")
    assert key.startswith("sdk-py-") and len(key) > 20
    assert body == {
        "image": {"python_version": "3.11", "python_packages": ["pandas"]},
        "cpu": 1.0,
        "memory_mib": 1024,
        "ttl_seconds": 120,
        "block_network": True,
    }
    # It is JSON as sent.
    assert json.loads(json.dumps(body)) == body


def test_image_builder_full_spec():
    image = (
        Image(base_image="python", env_vars=["A=1"])
        .add_python_version("3.13")
        .add_python_packages("pandas==2.2.3")
        .add_python_packages(["numpy"])
        .add_system_packages(["git"])
        .add_commands(["echo hi", "mkdir -p /workspace"])
        .with_envs({"B": "2"})
        .with_workdir("/workspace")
    )
    assert image.to_spec() == {
        "base": "python",
        "python_version": "3.13",
        "python_packages": ["pandas==2.2.3", "numpy"],
        "system_packages": ["git"],
        "commands": ["echo hi", "mkdir -p /workspace"],
        "env": {"A": "1", "B": "2"},
        "workdir": "/workspace",
    }


def test_image_defaults_and_references():
    # Nothing set: the daemon's default image, so the create sends no image.
    assert Image().to_spec() is None
    assert Image().is_default()
    assert "image" not in Sandbox(image=Image()).create_request()
    assert Image().to_dict() == {}
    # A base alone is the reference string; both Beam's and the class form.
    assert Image().from_registry("node:20").to_spec() == "node:20"
    assert Image.from_registry("docker.io/library/python:3.12-slim").to_spec() == "docker.io/library/python:3.12-slim"
    assert Image.from_registry("node:20").to_dict() == {"base": "node:20"}
    assert Image.from_registry("node:20").add_commands("npm i -g x").to_spec() == {
        "base": "node:20",
        "commands": ["npm i -g x"],
    }
    assert Sandbox(image="python").create_request()["image"] == "python"
    with pytest.raises(ValueError):
        Image().from_registry("")
    with pytest.raises(ValueError):
        Image(python_version="python")


def test_create_body_maps_every_argument():
    body = Sandbox(
        cpu="250m",
        memory=256,
        image="busybox",
        gpu="RTX4090",
        gpu_count=2,
        allow_list=["pypi.org", "*.pythonhosted.org"],
        secrets=["OPENAI_API_KEY"],
        env={"A": 1},
        ports=[3000],
        keep_warm_seconds=-1,
        use_vm=True,
        labels={"team": "x"},
        disk="2Gi",
        cpu_shares=512,
    ).create_request()
    body.pop("idempotency_key")
    assert body == {
        "image": "busybox",
        "runtime": "vm",
        "cpu": 0.25,
        "memory_mib": 256,
        "disk_mib": 2048,
        "cpu_shares": 512,
        "ttl_seconds": -1,
        "env": {"A": "1"},
        "labels": {"team": "x"},
        "gpu": "RTX4090",
        "gpu_count": 2,
        "allow_list": ["pypi.org", "*.pythonhosted.org"],
        "secrets": ["OPENAI_API_KEY"],
        "ports": [3000],
    }
    for bad in (1, 262145, True, 1.5, "512"):
        with pytest.raises(ValueError, match="cpu_shares"):
            Sandbox(cpu_shares=bad)
    # Nothing given: only the key; the daemon's defaults decide the rest.
    assert list(Sandbox().create_request()) == ["idempotency_key"]
    # Beam's "no GPU" spellings send nothing.
    assert "gpu" not in Sandbox(gpu="", gpu_count=0).create_request()
    assert Sandbox(block_network=False).create_request()["block_network"] is False


def test_each_create_gets_a_fresh_key_and_async_builds_the_same_body():
    sb = Sandbox(image="python", cpu=1)
    a, b = sb.create_request(), sb.create_request()
    assert a["idempotency_key"] != b["idempotency_key"]
    c = aio.Sandbox(image="python", cpu=1).create_request()
    for body in (a, b, c):
        body.pop("idempotency_key")
    assert a == b == c


@pytest.mark.parametrize(
    "kwargs",
    [
        {"keep_warm_seconds": 0},
        {"keep_warm_seconds": -2},
        {"keep_warm_seconds": 1.5},
        {"block_network": True, "allow_list": ["x.org"]},
        {"ports": [0]},
        {"ports": [70000]},
        {"gpu": ["A100", "H100"]},
        {"image": ""},
        {"image": 5},
        {"memory": "lots"},
    ],
)
def test_bad_arguments_fail_before_any_request(kwargs):
    with pytest.raises((ValueError, TypeError)):
        Sandbox(**kwargs)


def test_fork_body_keeps_only_what_a_fork_may_change():
    sb = Sandbox(keep_warm_seconds=60, labels={"a": "b"}, image="python")
    body = sb.options.fork_body("snap-1")
    assert body.pop("idempotency_key")
    assert body == {"from_snapshot": "snap-1", "ttl_seconds": 60, "labels": {"a": "b"}}
