"""Failures at the edge of ghostgpu — the cluster, Prometheus, S3, a file — as one or two lines.

Every command runs inside `ghostgpu.cli.app`, whose `__call__` hands an escaping exception to
`explain()`. A failure it can name (no kubeconfig, an unreachable address, a 403, a missing file, a
bad config file) becomes `error: what is missing` and `fix: how to give it`, and the command exits
2 (the render command's standard); anything else is a bug and keeps its traceback. `--debug` keeps
the traceback for every failure.

The kube client is built by `kube_api()` so a credentials failure is diagnosed here, against the
same sources kr8s reads (`--kubeconfig`, `KUBECONFIG`, `~/.kube/config`, the in-cluster
ServiceAccount), and so every address a command talks to is named (`name_endpoint`): a refused
connection says "the Kubernetes apiserver https://...", not just a socket error.
"""

from __future__ import annotations

import errno
import os
import socket
import ssl
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

EXIT_CODE = 2
SERVICEACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
CREDENTIALS_FIX = (
    "fix: pass --kubeconfig FILE, set KUBECONFIG=FILE, write ~/.kube/config "
    "(e.g. `kubectl config view --raw`), or run in the cluster as a pod with a ServiceAccount"
)

# a server that cannot bind its address (in use, not this host's, a privileged port)
_LISTEN_ERRNOS = (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES)

# address prefix -> what it is ("the Kubernetes apiserver", "Prometheus (controller.prometheus.url)")
_ENDPOINTS: dict[str, str] = {}


class BoundaryError(Exception):
    """A failure ghostgpu can name: `lines` say what is missing and how to give it."""

    def __init__(self, *lines: str) -> None:
        super().__init__("\n".join(lines))
        self.lines = list(lines)


def name_endpoint(url: str, what: str) -> None:
    """Remember what lives at `url`, for the message when it cannot be reached."""
    _ENDPOINTS[url.rstrip("/")] = what


def _endpoint_name(url: str) -> str:
    match = max((u for u in _ENDPOINTS if url.startswith(u)), key=len, default=None)
    if match is None:
        parts = urlsplit(url)
        return f"{parts.scheme}://{parts.netloc}"
    return f"{_ENDPOINTS[match]} at {match}"


# ----- Kubernetes credentials -----


def kubeconfig_paths(
    kubeconfig: str | None, environ: Mapping[str, str], home: Path
) -> tuple[str, list[Path]]:
    """Where kr8s looks for a kubeconfig, in its order: (how it was given, the paths)."""
    if kubeconfig:
        return f"--kubeconfig {kubeconfig}", [Path(p).expanduser() for p in kubeconfig.split(":") if p]
    if environ.get("KUBECONFIG"):
        value = environ["KUBECONFIG"]
        return f"KUBECONFIG={value}", [Path(p).expanduser() for p in value.split(":") if p]
    return "~/.kube/config", [home / ".kube" / "config"]


def diagnose_credentials(
    kubeconfig: str | None,
    *,
    environ: Mapping[str, str] | None = None,
    home: Path | None = None,
    serviceaccount: Path = SERVICEACCOUNT_DIR,
) -> BoundaryError | None:
    """Why no client can be built from these sources, or None when they look usable."""
    environ = os.environ if environ is None else environ
    source, paths = kubeconfig_paths(kubeconfig, environ, home or Path.home())
    existing = [p for p in paths if p.is_file()]
    given = kubeconfig or environ.get("KUBECONFIG")
    if not existing:
        if given:
            missing = ", ".join(str(p) for p in paths) or "(empty)"
            return BoundaryError(
                f"error: {source}: no such file: {missing}",
                "fix: give the path of an existing kubeconfig file (`kubectl config view --raw > FILE`)",
            )
        if (serviceaccount / "token").is_file() and environ.get("KUBERNETES_SERVICE_HOST"):
            return None
        return BoundaryError(
            "error: no Kubernetes credentials: no --kubeconfig, KUBECONFIG is unset, ~/.kube/config "
            "does not exist, and this is not a pod with a ServiceAccount token",
            CREDENTIALS_FIX,
        )
    return _diagnose_files(existing)


def _diagnose_files(files: list[Path]) -> BoundaryError | None:
    """kubectl's merge of several files, as far as choosing a server goes: the first
    current-context set wins, the first definition of a name wins."""
    current: str | None = None
    contexts: dict[str, dict[str, Any]] = {}
    clusters: dict[str, dict[str, Any]] = {}
    for f in files:
        try:
            doc = yaml.safe_load(f.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            return BoundaryError(f"error: {f}: not a readable kubeconfig: {exc}", _file_fix(f))
        if not isinstance(doc, dict):
            return BoundaryError(f"error: {f}: not a kubeconfig (expected a mapping)", _file_fix(f))
        current = current or doc.get("current-context") or None
        for item in doc.get("contexts") or []:
            if isinstance(item, dict) and item.get("name"):
                contexts.setdefault(item["name"], item.get("context") or {})
        for item in doc.get("clusters") or []:
            if isinstance(item, dict) and item.get("name"):
                clusters.setdefault(item["name"], item.get("cluster") or {})
    shown = ", ".join(str(f) for f in files)
    if not contexts:
        return BoundaryError(f"error: {shown}: the kubeconfig defines no context", _file_fix(files[0]))
    if current and current not in contexts:
        return BoundaryError(
            f"error: {shown}: current-context {current!r} is not one of its contexts "
            f"({', '.join(sorted(contexts))})",
            f"fix: `kubectl --kubeconfig {files[0]} config use-context NAME` with one of those",
        )
    name = current or next(iter(contexts))
    cluster = contexts[name].get("cluster")
    if cluster not in clusters:
        return BoundaryError(
            f"error: {shown}: context {name!r} names cluster {cluster!r}, which the file does not define",
            f"fix: add the cluster to {files[0]} or point the context at one of "
            f"{', '.join(sorted(clusters)) or '(none defined)'}",
        )
    if not clusters[cluster].get("server"):
        return BoundaryError(
            f"error: {shown}: cluster {cluster!r} has no server address",
            f"fix: `kubectl --kubeconfig {files[0]} config set-cluster {cluster} --server=https://HOST:PORT`",
        )
    return None


def _file_fix(f: Path) -> str:
    return f"fix: regenerate {f} (`kubectl config view --raw`) or point --kubeconfig at another file"


async def kube_api(kubeconfig: str | None) -> Any:
    """kr8s's asyncio client for these credentials; a BoundaryError when there are none usable.
    kr8s asks the apiserver for its version here already, so its address is named first."""
    import httpx
    import kr8s.asyncio

    try:
        api = await (kr8s.asyncio.api(kubeconfig=kubeconfig) if kubeconfig else kr8s.asyncio.api())
    except httpx.HTTPError as exc:
        if _has_request(exc):
            url = urlsplit(str(exc.request.url))
            name_endpoint(f"{url.scheme}://{url.netloc}", "the Kubernetes apiserver")
        raise
    except (ValueError, KeyError, OSError) as exc:
        found = diagnose_credentials(kubeconfig)
        if found is not None:
            raise found from exc
        raise BoundaryError(f"error: cannot load Kubernetes credentials: {exc}", CREDENTIALS_FIX) from exc
    name_endpoint(api.auth.server, "the Kubernetes apiserver")
    return api


# ----- exception -> lines -----

# HTTP method of a Kubernetes API request -> the RBAC verb it needs
_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def rbac_verb_and_resource(method: str, url: str) -> tuple[str, str]:
    """('list', 'pods in namespace team-a') for GET /api/v1/namespaces/team-a/pods."""
    parts = urlsplit(url)
    segs = [s for s in parts.path.split("/") if s]
    rest = segs[2:] if segs[:1] == ["api"] else segs[3:] if segs[:1] == ["apis"] else segs
    group = segs[1] if segs[:1] == ["apis"] and len(segs) > 1 else ""
    namespace = ""
    if len(rest) >= 2 and rest[0] == "namespaces" and len(rest) > 2:
        namespace, rest = rest[1], rest[2:]
    resource = "/".join(rest[:1] + rest[2:3]) if rest else parts.path
    named = len(rest) >= 2
    if method.upper() == "GET":
        verb = "watch" if "watch=" in parts.query and "watch=false" not in parts.query else "list"
        verb = "get" if named else verb
    else:
        verb = _VERBS.get(method.upper(), method.lower())
    where = f" in namespace {namespace}" if namespace else ""
    qualified = f"{resource}.{group}" if group else resource
    return verb, f"{qualified}{where}"


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """exc, the exceptions it was raised from, and the members of exception groups."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        if isinstance(e, BaseExceptionGroup):
            todo.extend(e.exceptions)
        # `raise ... from None` says the context is not the failure: do not explain by it.
        for nxt in (e.__cause__, None if e.__suppress_context__ else e.__context__):
            if nxt is not None:
                todo.append(nxt)


def explain(exc: BaseException) -> list[str] | None:
    """The lines for a failure ghostgpu can name, or None (a bug: keep the traceback)."""
    for e in _causes(exc):
        lines = _explain_one(e)
        if lines is not None:
            return lines
    return None


def _explain_one(e: BaseException) -> list[str] | None:
    import httpx

    from ghostgpu.config_errors import ConfigError

    if isinstance(e, BoundaryError):
        return e.lines
    if isinstance(e, ConfigError):
        return [f"error: {line}" for line in e.lines()] + [e.fix_line()]
    usage = _usage_error(e)
    if usage is not None:
        return usage
    response = getattr(e, "response", None)
    if type(e).__name__ == "ServerError" and isinstance(response, httpx.Response):
        return _server_error(e, response)
    if isinstance(e, httpx.HTTPStatusError):
        return _server_error(e, e.response)
    if isinstance(e, (httpx.TransportError, ssl.SSLError)):
        return _transport_error(e)
    if isinstance(e, httpx.InvalidURL):
        proxies = _proxy_variables()
        if proxies:
            return [
                f"error: an address is not a URL ({e}); the proxy variables set: {proxies}",
                "fix: give each proxy variable a URL such as http://proxy:3128, or unset it",
            ]
        return [f"error: an address is not a URL: {e}", "fix: check the URLs given (flags, the config)"]
    if type(e).__name__ == "APITimeoutError":
        return [f"error: {e}", "fix: check the apiserver's health and the network to it, then retry"]
    if type(e).__module__.startswith("botocore"):
        return [f"error: S3: {e}", "fix: check controller.s3 (endpoint, region) and the AWS_* credentials"]
    if type(e).__name__ == "PrometheusError":
        return [f"error: Prometheus: {e}", "fix: check controller.prometheus.url and the query in the config"]
    if isinstance(e, OSError) and e.errno in _LISTEN_ERRNOS and "address" in str(e):
        return [
            f"error: cannot listen: {e}",
            "fix: choose another address or port (--listen, --host, --port) or stop what holds it",
        ]
    if isinstance(e, socket.gaierror):
        return [f"error: cannot resolve a host name: {e}", "fix: check the host given (--host, --listen)"]
    if isinstance(e, FileNotFoundError) and e.filename:
        return [f"error: {e.filename}: no such file", "fix: give the path of an existing file"]
    if isinstance(e, PermissionError) and e.filename:
        return [f"error: {e.filename}: permission denied", "fix: make it readable by this user"]
    if isinstance(e, IsADirectoryError) and e.filename:
        return [f"error: {e.filename}: is a directory, expected a file", "fix: give the path of a file"]
    return None


def _usage_error(e: BaseException) -> list[str] | None:
    """A flag or argument the command line parser refused (`--port abc`, a missing argument, an
    unknown option). Typer vendors click since 0.24; `ghostgpu` alone (help) is not a failure."""
    try:
        from typer._click.exceptions import UsageError
    except ImportError:  # an older typer on click itself
        from click.exceptions import UsageError
    if not isinstance(e, UsageError) or type(e).__name__ == "NoArgsIsHelpError":
        return None
    command = e.ctx.command_path if e.ctx is not None else "ghostgpu"
    return [
        f"error: {command}: {e.format_message()}",
        f"fix: `{command} --help` lists its options and arguments and what each takes",
    ]


def input_error(what: str, fix: str) -> BoundaryError:
    """A flag, argument or environment variable that cannot be used: what it is, how to give it.
    A multi-line `what` (a parser's message with its pointer lines) is joined into one line."""
    what = "; ".join(line.strip() for line in what.splitlines() if line.strip())
    return BoundaryError(f"error: {what}", f"fix: {fix}")


@dataclass(frozen=True)
class Override:
    """A flag that replaces a config key: `--poll-interval 5x` for `pollInterval`. `value` is what
    the key gets when it differs from what was typed (a URL merged into its section)."""

    key: str
    flag: str
    given: Any
    value: Any = None


def validated_overrides(model: type[Any], base: Mapping[str, Any], overrides: list[Override]) -> Any:
    """`model` validated from `base` with the overrides applied; a refused value names its flag
    and what was typed, not the config key."""
    from pydantic import ValidationError

    from ghostgpu.config_errors import issues_from_validation

    merged = {**base, **{o.key: o.given if o.value is None else o.value for o in overrides}}
    try:
        return model.model_validate(merged)
    except ValidationError as exc:
        by_key = {o.key: o for o in overrides}
        lines, flags = [], []
        for issue in issues_from_validation(exc, model, None):
            o = by_key.get(issue.path.split(".")[0].split("[")[0])
            if o is not None:
                flags.append(o.flag)
            where = f"{o.flag} {o.given!r}: " if o else f"{issue.path}: " if issue.path else ""
            lines.append(f"error: {where}{issue.message}")
        shown = ", ".join(dict.fromkeys(flags or [o.flag for o in overrides]))
        raise BoundaryError(*lines, f"fix: give {shown} a value of the kind expected (see --help)") from None


def _server_error(e: BaseException, response: Any) -> list[str] | None:
    code = response.status_code
    request = response.request
    where = _endpoint_name(str(request.url))
    message = _status_message(response) or str(e)
    if code == 401:
        return [
            f"error: {where} answered 401 Unauthorized: it does not accept these credentials ({message})",
            "fix: refresh the kubeconfig's user (an expired token or certificate) or log in again",
        ]
    if code == 403:
        verb, resource = rbac_verb_and_resource(request.method, str(request.url))
        return [
            f"error: {where} answered 403 Forbidden to {verb} {resource}: {message}",
            f"fix: grant this identity `{verb}` on {resource.split(' ')[0]} with a Role or ClusterRole "
            "(the controller's are in the rendered controller/rbac.yaml)",
        ]
    if code == 404 and "prometheus" in where.lower():
        return [f"error: {where}: {request.url.path} not found (404)", "fix: is this a Prometheus base URL?"]
    if code in (400, 422) and "prometheus" in where.lower():
        return [f"error: {where} rejected the query: {message}", "fix: correct the query in the config"]
    return None


def _status_message(response: Any) -> str:
    try:
        body = response.json()
    except ValueError:  # a body that is not a JSON Status
        return response.text[:300].strip() if getattr(response, "is_stream_consumed", True) else ""
    if isinstance(body, dict):
        return str(body.get("message") or body.get("error") or "")[:300]
    return ""


def _transport_error(e: BaseException) -> list[str]:
    import httpx

    url = str(e.request.url) if isinstance(e, httpx.RequestError) and _has_request(e) else ""
    where = _endpoint_name(url) if url else "the server"
    if isinstance(e, ssl.SSLError) or "CERTIFICATE_VERIFY_FAILED" in str(e):
        return [
            f"error: {where}: TLS verification failed: {e}",
            "fix: the kubeconfig's certificate-authority must be the CA that signed the server's certificate",
        ]
    if isinstance(e, httpx.TimeoutException):
        return [f"error: {where} did not answer in time", "fix: check that it runs and the network to it"]
    reason = str(e) or type(e).__name__
    proxies = _proxy_variables()
    return [
        f"error: cannot reach {where}: {reason}" + (f" (through the proxy: {proxies})" if proxies else ""),
        "fix: check that it is running and that the address is right"
        + (", and the proxy variables (or NO_PROXY)" if proxies else ""),
    ]


def _proxy_variables() -> str:
    """The proxy environment variables httpx (and so kr8s) reads, as set: NAME=value, ..."""
    names = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy", "all_proxy")
    return ", ".join(f"{n}={os.environ[n]!r}" for n in names if os.environ.get(n))


def _has_request(e: Any) -> bool:
    try:
        e.request  # noqa: B018 (httpx raises RuntimeError when the error carries no request)
    except RuntimeError:
        return False
    return True
