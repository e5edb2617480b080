"""controller.image: REPO:TAG, REPO@sha256:<hex>, REPO:TAG@sha256:<hex>; anything else a ConfigError."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ghostgpu.config import load_config_text
from ghostgpu.config_errors import ConfigError
from ghostgpu.image_ref import ImageRef, parse_image_ref
from ghostgpu.render import render_objects

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = (REPO / "examples" / "ghostgpu.yaml").read_text()
DEFAULT = "image: ghcr.io/ghostgpu/ghostgpu:0.1.0\n"
SHA = "sha256:" + "0123456789abcdef" * 4


def with_image(image: str) -> str:
    assert EXAMPLE.count(DEFAULT) == 1
    return EXAMPLE.replace(DEFAULT, f"image: {image!r}\n")


def image_error(image: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config_text(with_image(image), "cluster.yaml")
    [line] = info.value.lines()
    assert line.startswith("cluster.yaml: controller.image: ")
    image_line = EXAMPLE[: EXAMPLE.index(DEFAULT)].count("\n") + 1
    assert f"(line {image_line})" in line, "the error names the line of the image key"
    return line


@pytest.mark.parametrize(
    ("image", "parsed"),
    [
        ("ghcr.io/ghostgpu/ghostgpu:0.1.0", ImageRef("ghcr.io/ghostgpu/ghostgpu", "0.1.0", None)),
        (f"ghcr.io/ghostgpu/ghostgpu@{SHA}", ImageRef("ghcr.io/ghostgpu/ghostgpu", None, SHA)),
        (f"ghcr.io/ghostgpu/ghostgpu:0.1.0@{SHA}", ImageRef("ghcr.io/ghostgpu/ghostgpu", "0.1.0", SHA)),
        ("localhost:5000/ghostgpu:dev", ImageRef("localhost:5000/ghostgpu", "dev", None)),
        ("registry.example.com:443/team/sub_path/ghost-gpu:v1.2_rc", None),
        ("ghostgpu:1", ImageRef("ghostgpu", "1", None)),
    ],
)
def test_accepted_references(image: str, parsed: ImageRef | None) -> None:
    got = parse_image_ref(image)
    if parsed is not None:
        assert got == parsed
    assert load_config_text(with_image(image)).controller.image == image


@pytest.mark.parametrize(
    "image", [f"ghcr.io/ghostgpu/ghostgpu@{SHA}", f"ghcr.io/ghostgpu/ghostgpu:0.1.0@{SHA}"]
)
def test_rendered_deployment_uses_the_reference_as_given(image: str) -> None:
    objs = render_objects(load_config_text(with_image(image)))
    [dep] = [o for o in objs if o["kind"] == "Deployment"]
    [container] = dep["spec"]["template"]["spec"]["containers"]
    assert container["image"] == image


@pytest.mark.parametrize(
    ("image", "says"),
    [
        ("ghcr.io/ghostgpu/ghostgpu", "names neither a tag nor a digest"),
        ("ghcr.io/ghostgpu/ghostgpu@sha256:abc", "got 3 characters"),
        (f"ghcr.io/ghostgpu/ghostgpu@{SHA.upper().replace('SHA256', 'sha256')}", "lower-case hex"),
        ("ghcr.io/ghostgpu/ghostgpu@md5:" + "a" * 32, "expected sha256:"),
        (f"ghcr.io/ghostgpu/ghostgpu:0.1.0@{SHA}0", "got 65 characters"),
        ("ghcr.io/GhostGPU/ghostgpu:0.1.0", "repository path component 'GhostGPU'"),
        ("ghcr.io/ghostgpu/ghostgpu:.hidden", "tag '.hidden'"),
        ("ghcr.io/ghostgpu/ghostgpu:", "tag ''"),
        ("ghcr.io/ghostgpu/ghost gpu:0.1.0", "expected an image reference"),
        ("", "expected an image reference"),
        ("bad_host.io:x/ghostgpu:1", "registry 'bad_host.io:x'"),
        ("ghcr.io//ghostgpu:1", "repository path component ''"),
        (":1", "the repository name is empty"),
    ],
)
def test_rejected_references_say_why(image: str, says: str) -> None:
    assert says in image_error(image)


@given(st.text(max_size=40))
def test_any_string_either_parses_or_raises_value_error(text: str) -> None:
    try:
        ref = parse_image_ref(text)
    except ValueError:
        return
    assert ref.tag is not None or ref.digest is not None
    rebuilt = ref.repository + (f":{ref.tag}" if ref.tag else "") + (f"@{ref.digest}" if ref.digest else "")
    assert rebuilt == text
