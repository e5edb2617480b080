"""`controller.image`: a container image reference pinned by a tag, a digest, or both.

Accepted: `REPO:TAG`, `REPO@sha256:<64 hex>` and `REPO:TAG@sha256:<64 hex>`, where REPO is
`[REGISTRY[:PORT]/]PATH` in the grammar of the OCI distribution reference (lower-case path
components separated by `/`, each `[a-z0-9]+` joined by `.`, `_`, `__` or dashes). A bare REPO is
refused: it means `:latest`, which moves under a running Deployment. The rendered Deployment uses
the string as given, so a digest pins the exact image that runs.
"""

from __future__ import annotations

import re
from typing import NamedTuple

_PATH_COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
_DOMAIN = re.compile(
    r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
    r"|\[[0-9A-Fa-f:]+\])(?::[0-9]+)?$"
)
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_SHA256 = re.compile(r"^[a-f0-9]{64}$")
_MAX_NAME = 255  # the distribution spec's limit on the repository name
EXAMPLE = "ghcr.io/ghostgpu/ghostgpu:0.1.0 or ghcr.io/ghostgpu/ghostgpu@sha256:<64 hex digits>"


class ImageRef(NamedTuple):
    repository: str
    tag: str | None
    digest: str | None  # "sha256:<hex>"


def parse_image_ref(value: str) -> ImageRef:
    """Split and check a reference; ValueError names what is wrong with it."""
    if not value or any(c.isspace() for c in value):
        raise ValueError(f"expected an image reference such as {EXAMPLE}, got {value!r}")
    rest, digest = value, None
    if "@" in value:
        rest, _, digest = value.partition("@")
        algorithm, _, hex_ = digest.partition(":")
        if algorithm != "sha256":
            raise ValueError(f"digest {digest!r}: expected sha256:<64 lower-case hex digits>")
        if not _SHA256.match(hex_):
            raise ValueError(
                f"digest {digest!r}: expected sha256: followed by 64 lower-case hex digits, "
                f"got {len(hex_)} characters"
            )
    repository, tag = rest, None
    last = rest.rsplit("/", 1)[-1]
    if ":" in last:  # a colon before the last '/' is a registry port, not a tag
        repository, _, tag = rest.rpartition(":")
        if not _TAG.match(tag):
            raise ValueError(
                f"tag {tag!r}: expected at most 128 letters, digits, '_', '.' or '-', "
                "not starting with '.' or '-'"
            )
    if tag is None and digest is None:
        raise ValueError(
            f"{value!r} names neither a tag nor a digest (that means ':latest', which moves); "
            f"pin one, e.g. {EXAMPLE}"
        )
    _check_repository(repository)
    return ImageRef(repository, tag, digest)


def _check_repository(repository: str) -> None:
    if not repository:
        raise ValueError(f"the repository name is empty; expected e.g. {EXAMPLE}")
    if len(repository) > _MAX_NAME:
        raise ValueError(f"repository name is {len(repository)} characters long, at most {_MAX_NAME}")
    parts = repository.split("/")
    # The first component is a registry when it looks like a host: a dot, a port, or localhost.
    if len(parts) > 1 and ("." in parts[0] or ":" in parts[0] or parts[0] == "localhost"):
        if not _DOMAIN.match(parts[0]):
            raise ValueError(f"registry {parts[0]!r} is not a valid host[:port]")
        parts = parts[1:]
    for part in parts:
        if not _PATH_COMPONENT.match(part):
            raise ValueError(
                f"repository path component {part!r}: expected lower-case letters and digits, "
                "separated by '.', '_', '__' or '-'"
            )


def validate_image_ref(value: str) -> str:
    """Pydantic AfterValidator: the reference as given, once it parses."""
    parse_image_ref(value)
    return value
