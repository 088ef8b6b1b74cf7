"""`meshrun k8s --apply`: creates the rendered objects in the cluster of the current kubeconfig context
with the official `kubernetes` client (`pip install 'meshrun[k8s]'`), then says how to follow the job
with kubectl. No client, no usable kubeconfig, or an object the API server refuses is one line
(a ConfigError on --apply, exit status 2), naming what was created before it."""

from __future__ import annotations

import json
import os
import textwrap

from meshrun.errors import ConfigError
from meshrun.kube.options import KubeOptions
from meshrun.kube.render import TRAINER_API, pod_labels
from meshrun.wording import first_line

FLAG = "--apply"
TRAINJOB_PLURAL = "trainjobs"


def apply(documents: list[dict], options: KubeOptions) -> str:
    """Creates `documents` in order in the current context's cluster (in --namespace, else the
    context's namespace, else `default`); returns what to print: what was created and the kubectl
    commands that follow the job."""
    kubernetes = _client()
    context = _load_kubeconfig(kubernetes)
    namespace = options.namespace or context.get("context", {}).get("namespace") or "default"
    api = kubernetes.client.ApiClient()
    created: list[str] = []
    for document in documents:
        what = named(document)
        try:
            _create(kubernetes, api, document, namespace)
        except _api_errors(kubernetes) as err:
            before = f" (already created: {', '.join(created)})" if created else ""
            raise ConfigError(
                FLAG,
                f"got an error from the cluster of context {context.get('name')!r} creating {what} in "
                f"namespace {namespace!r}: {_reason(err)}{before}",
            ) from None
        created.append(what)
    return following(options, namespace, context.get("name"), documents)


def named(document: dict) -> str:
    """An object as messages name it: its kind and name."""
    return f"{document['kind']} {document['metadata']['name']}"


def _client():
    """The `kubernetes` package, or a ConfigError saying how to install it."""
    try:
        import kubernetes
    except ImportError:
        raise ConfigError(
            FLAG,
            "got it, but the kubernetes client is not installed: pip install 'meshrun[k8s]' "
            "(or leave --apply out and submit the YAML with kubectl apply -f)",
        ) from None
    return kubernetes


def _load_kubeconfig(kubernetes) -> dict:
    """Loads the kubeconfig (KUBECONFIG, else ~/.kube/config) for the client; returns its current
    context. A ConfigError when there is none or it does not load."""
    from kubernetes.config.config_exception import ConfigException

    # Read now, not when the client was imported (it reads KUBECONFIG once, at import).
    where = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    try:
        kubernetes.config.load_kube_config(config_file=where)
        _, context = kubernetes.config.list_kube_config_contexts(config_file=where)
    except (ConfigException, OSError, ValueError, TypeError, KeyError) as err:
        raise ConfigError(
            FLAG,
            f"got kubeconfig {where}, which gives no cluster to submit to ({first_line(err)}); point "
            "KUBECONFIG at your cluster's config (kubectl config current-context must name one), or leave "
            "--apply out and submit the YAML with kubectl apply -f",
        ) from None
    return context or {}


def _create(kubernetes, api, document: dict, namespace: str) -> None:
    """Creates one object through the API that serves its kind."""
    kind = document["kind"]
    if kind == "NetworkPolicy":
        kubernetes.client.NetworkingV1Api(api).create_namespaced_network_policy(namespace, document)
    elif kind == "ServiceAccount":
        kubernetes.client.CoreV1Api(api).create_namespaced_service_account(namespace, document)
    elif kind == "Service":
        kubernetes.client.CoreV1Api(api).create_namespaced_service(namespace, document)
    elif kind == "Job":
        kubernetes.client.BatchV1Api(api).create_namespaced_job(namespace, document)
    else:
        group, version = TRAINER_API.split("/")
        kubernetes.client.CustomObjectsApi(api).create_namespaced_custom_object(
            group, version, namespace, TRAINJOB_PLURAL, document
        )


def _api_errors(kubernetes) -> tuple[type[Exception], ...]:
    """The errors of the API server's answer (the client's ApiException) or of the way to it
    (urllib3's and the OS's): the cluster's doing, not a bug here."""
    import urllib3

    return (kubernetes.client.exceptions.ApiException, urllib3.exceptions.HTTPError, OSError)


def _reason(err: Exception) -> str:
    """The API server's own words for a refusal (status, reason, message), or the connection's error."""
    status = getattr(err, "status", None)
    if status is None:
        return textwrap.shorten(first_line(err), 300, placeholder=" ...")
    try:
        message = json.loads(err.body).get("message", "")
    except (TypeError, ValueError, AttributeError):
        message = ""
    return f"{status} {err.reason}" + (f": {message}" if message else "")


def following(options: KubeOptions, namespace: str, context: str | None, documents: list[dict]) -> str:
    """What was created (`documents`, the job last), and the kubectl commands that watch the job, read
    its pods' output and delete it: the job first, waiting for its pods to save a checkpoint and end,
    then the objects that served it (its NetworkPolicy among them, which guards the pods till then)."""
    kubectl = f"kubectl -n {namespace}"
    kinds = [document["kind"].lower() for document in documents]
    job = kinds[-1]
    selector = ",".join(f"{k}={v}" for k, v in pod_labels(options).items())
    delete = (
        f"{kubectl} delete {job} {options.name} --cascade=foreground && "
        f"{kubectl} delete {','.join(kinds[:-1])} {options.name}"
    )
    commands = [
        ("its status", f"{kubectl} get {job} {options.name}"),
        ("its pods", f"{kubectl} get pods -l {selector} -w"),
        ("their output", f"{kubectl} logs -f -l {selector} --prefix --max-log-requests {options.nodes}"),
        ("to stop it", f"{delete}   (the pods get SIGTERM and save a checkpoint first)"),
    ]
    width = max(len(what) for what, _ in commands) + 1
    created = [named(document) for document in documents]
    lines = [
        f"meshrun k8s: created {', '.join(created[:-1])} and {created[-1]} in "
        f"namespace {namespace} (context {context}); follow it:"
    ]
    return "\n".join([*lines, *(f"  {what + ':':<{width}} {command}" for what, command in commands)])
