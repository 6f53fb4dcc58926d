#!/usr/bin/env python3
"""Ask the capacity planner whether Kubernetes would admit a pod, before it is applied.

Reads a manifest (YAML or JSON): a Pod, a workload whose ``spec.template`` is a pod
(Deployment, StatefulSet, DaemonSet, ReplicaSet, Job, ...), a CronJob, or a ``List`` / multi-
document file of those. Every pod found is sent to ``POST /v1/admission/pods`` as the
``admission.k8s.io/v1`` AdmissionReview the API server would send for its CREATE, and the
decision, message and warnings are printed. Pods the webhook would not be called for (no
``nvidia.com/gpu`` or ``nvidia.com/mig-*`` limits, or labelled ``capacity-planner.io/skip:
"true"``) are reported as skipped unless ``--all`` is given.

Exit status: 0 every pod allowed, 1 at least one denied, 2 on any error (unreadable or
pod-less manifest, connection or HTTP error, malformed answer; the reason goes to stderr).

    admission-check.py pod.yaml --url https://capacity-planner.example --api-key "$KEY"

Needs only httpx and PyYAML.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import ssl
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

ADMISSION_PATH = "/v1/admission/pods"
DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_TIMEOUT_S = 10.0
REVIEW_API_VERSION = "admission.k8s.io/v1"
EXIT_ALLOWED, EXIT_DENIED, EXIT_ERROR = 0, 1, 2
POD_KIND = {"group": "", "version": "v1", "kind": "Pod"}
POD_RESOURCE = {"group": "", "version": "v1", "resource": "pods"}
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
SKIP_LABEL = "capacity-planner.io/skip"

Json = dict[str, Any]


class CheckError(Exception):
    """Anything that prevents a decision; reported on stderr with exit status 2."""


def _out(line: str) -> None:
    sys.stdout.write(line + "\n")


def _err(line: str) -> None:
    sys.stderr.write(line + "\n")


# -- manifest -----------------------------------------------------------------------------


def load_documents(path: Path) -> list[Any]:
    """Every document of a JSON or (multi-document) YAML file."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckError(f"cannot read {path}: {exc}") from exc
    try:
        return [json.loads(text)]
    except ValueError:
        pass
    try:
        return list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        raise CheckError(f"{path} is neither JSON nor YAML: {exc}") from exc


def _mapping(value: Any) -> Json:
    return value if isinstance(value, dict) else {}


def _pod_from_template(owner: Json, template: Json) -> Json:
    """The Pod a controller would create from ``template`` (owner's name and namespace)."""
    owner_meta = _mapping(owner.get("metadata"))
    metadata = copy.deepcopy(_mapping(template.get("metadata")))
    metadata.setdefault("name", owner_meta.get("name", ""))
    if "namespace" in owner_meta:
        metadata.setdefault("namespace", owner_meta["namespace"])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": copy.deepcopy(_mapping(template.get("spec"))),
    }


def pods_in(document: Any) -> Iterator[Json]:
    """The pods a document describes (none for Services, ConfigMaps, ...)."""
    if not isinstance(document, dict):
        return
    kind = document.get("kind")
    spec = _mapping(document.get("spec"))
    if kind == "List":
        for item in document.get("items") or []:
            yield from pods_in(item)
    elif kind == "Pod":
        yield copy.deepcopy(document)
    elif kind == "CronJob":
        job_spec = _mapping(_mapping(spec.get("jobTemplate")).get("spec"))
        if isinstance(job_spec.get("template"), dict):
            yield _pod_from_template(document, job_spec["template"])
    elif kind == "PodTemplate" and isinstance(document.get("template"), dict):
        yield _pod_from_template(document, document["template"])
    elif isinstance(spec.get("template"), dict):
        yield _pod_from_template(document, spec["template"])


def _requests_gpu(container: Any) -> bool:
    limits = _mapping(_mapping(_mapping(container).get("resources")).get("limits"))
    return any(key == GPU_RESOURCE or key.startswith(MIG_RESOURCE_PREFIX) for key in limits)


def webhook_skip_reason(pod: Json) -> str | None:
    """Why the webhook's objectSelector / matchConditions would not send ``pod`` (or None)."""
    labels = _mapping(_mapping(pod.get("metadata")).get("labels"))
    if labels.get(SKIP_LABEL) == "true":
        return f"labelled {SKIP_LABEL}=true"
    spec = _mapping(pod.get("spec"))
    containers = list(spec.get("containers") or []) + list(spec.get("initContainers") or [])
    if not any(_requests_gpu(container) for container in containers):
        return f"no {GPU_RESOURCE} or {MIG_RESOURCE_PREFIX}* limits"
    return None


# -- review -------------------------------------------------------------------------------


def build_review(pod: Json, namespace: str) -> Json:
    """The AdmissionReview the API server sends for ``CREATE`` of ``pod``."""
    metadata = pod.setdefault("metadata", {})
    namespace = metadata.get("namespace") or namespace
    metadata["namespace"] = namespace
    return {
        "apiVersion": REVIEW_API_VERSION,
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": dict(POD_KIND),
            "resource": dict(POD_RESOURCE),
            "requestKind": dict(POD_KIND),
            "requestResource": dict(POD_RESOURCE),
            "name": metadata.get("name", ""),
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "capacity-planner:admission-check"},
            "object": pod,
            "oldObject": None,
            "dryRun": True,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def _problem_detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:500]
    if isinstance(body, dict):
        detail = body.get("detail") or body.get("title")
        if detail:
            return str(detail)
    return response.text.strip()[:500]


def parse_answer(response: httpx.Response, uid: str) -> Json:
    """The ``response`` of a well-formed AdmissionReview answer, checked as the API server does."""
    if response.is_error:
        detail = _problem_detail(response)
        raise CheckError(f"HTTP {response.status_code} from {response.request.url}: {detail}")
    try:
        body = response.json()
    except ValueError as exc:
        raise CheckError(f"answer is not JSON (HTTP {response.status_code})") from exc
    if not isinstance(body, dict):
        raise CheckError("answer is not a JSON object")
    if body.get("apiVersion") != REVIEW_API_VERSION or body.get("kind") != "AdmissionReview":
        raise CheckError(
            f"answer is not an {REVIEW_API_VERSION} AdmissionReview "
            f"(apiVersion={body.get('apiVersion')!r}, kind={body.get('kind')!r})"
        )
    answer = body.get("response")
    if not isinstance(answer, dict):
        raise CheckError("AdmissionReview answer has no response object")
    if answer.get("uid") != uid:
        raise CheckError(f"response.uid {answer.get('uid')!r} does not match request uid {uid!r}")
    if not isinstance(answer.get("allowed"), bool):
        raise CheckError("response.allowed is missing or not a boolean")
    status = answer.get("status")
    if status is not None and not isinstance(status, dict):
        raise CheckError("response.status is not an object")
    warnings = answer.get("warnings")
    if warnings is not None and (
        not isinstance(warnings, list) or not all(isinstance(w, str) for w in warnings)
    ):
        raise CheckError("response.warnings is not a list of strings")
    return answer


def report(pod_ref: str, answer: Json) -> None:
    """Print the decision, its message and each warning."""
    allowed: bool = answer["allowed"]
    status = _mapping(answer.get("status"))
    _out(f"{pod_ref}: {'ALLOWED' if allowed else 'DENIED'}")
    message = status.get("message")
    if message:
        code = status.get("code")
        _out(f"  message: {message}" + (f" (code {code})" if code is not None else ""))
    for warning in answer.get("warnings") or []:
        _out(f"  warning: {warning}")


def check_pod(
    client: httpx.Client, endpoint: str, pod: Json, namespace: str, *, check_all: bool = False
) -> int:
    review = build_review(pod, namespace)
    request = review["request"]
    pod_ref = f"pod {request['namespace']}/{request['name'] or '<unnamed>'}"
    skip_reason = None if check_all else webhook_skip_reason(pod)
    if skip_reason is not None:
        _out(f"{pod_ref}: SKIPPED (the webhook would not review it: {skip_reason})")
        return EXIT_ALLOWED
    try:
        response = client.post(endpoint, json=review)
    except httpx.HTTPError as exc:
        raise CheckError(f"{pod_ref}: request to {endpoint} failed: {exc}") from exc
    try:
        answer = parse_answer(response, request["uid"])
    except CheckError as exc:
        raise CheckError(f"{pod_ref}: {exc}") from exc
    report(pod_ref, answer)
    return EXIT_ALLOWED if answer["allowed"] else EXIT_DENIED


# -- command line -------------------------------------------------------------------------


def endpoint_for(url: str) -> str:
    """The admission URL for a base URL (a URL already ending in the path is kept)."""
    url = url.rstrip("/")
    return url if url.endswith(ADMISSION_PATH) else url + ADMISSION_PATH


def _positive_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if not number > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {value!r}")
    return number


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="admission-check.py",
        description="Send a pod manifest to the capacity planner's admission endpoint.",
        epilog="Exit status: 0 allowed, 1 denied, 2 error.",
    )
    parser.add_argument("manifest", type=Path, metavar="POD_MANIFEST", help="YAML or JSON file")
    parser.add_argument(
        "--url",
        default=os.environ.get("CAPPLAN_URL") or DEFAULT_URL,
        help="base URL of the service (default: $CAPPLAN_URL or %(default)s)",
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get("CAPPLAN_API_KEY") or None,
        help="API key, sent as 'Authorization: Bearer' (default: $CAPPLAN_API_KEY)",
    )
    parser.add_argument(
        "--timeout",
        type=_positive_float,
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help="seconds to wait for the answer (default: %(default)s)",
    )
    parser.add_argument(
        "--namespace",
        "-n",
        default="default",
        help="namespace of pods whose manifest names none (default: %(default)s)",
    )
    parser.add_argument(
        "--all",
        action="store_true",
        help="also send pods the webhook skips (no GPU/MIG limits, or the skip label)",
    )
    tls = parser.add_mutually_exclusive_group()
    tls.add_argument(
        "--cacert", type=Path, help="CA bundle to verify an HTTPS service with (e.g. ca.crt)"
    )
    tls.add_argument(
        "--insecure",
        action="store_true",
        help="skip TLS verification (e.g. through `kubectl port-forward`, whose 127.0.0.1 "
        "is not in the certificate)",
    )
    return parser


def main(argv: list[str] | None = None, *, transport: httpx.BaseTransport | None = None) -> int:
    """Run the check; ``transport`` replaces the network (tests)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2, already printed)
        return exc.code if isinstance(exc.code, int) else EXIT_ERROR
    try:
        pods = [pod for document in load_documents(args.manifest) for pod in pods_in(document)]
        if not pods:
            raise CheckError(f"{args.manifest} holds no Pod and no workload with a pod template")
        headers = {"Accept": "application/json"}
        if args.api_key:
            headers["Authorization"] = f"Bearer {args.api_key}"
        verify: ssl.SSLContext | bool = not args.insecure
        if args.cacert is not None:
            try:
                verify = ssl.create_default_context(cafile=str(args.cacert))
            except (OSError, ssl.SSLError) as exc:
                raise CheckError(f"cannot load CA bundle {args.cacert}: {exc}") from exc
        endpoint = endpoint_for(args.url)
        worst = EXIT_ALLOWED
        with httpx.Client(
            transport=transport, headers=headers, timeout=args.timeout, verify=verify
        ) as client:
            for pod in pods:
                outcome = check_pod(client, endpoint, pod, args.namespace, check_all=args.all)
                worst = max(worst, outcome)
        return worst
    except CheckError as exc:
        _err(f"admission-check: error: {exc}")
        return EXIT_ERROR
    except httpx.InvalidURL as exc:
        _err(f"admission-check: error: invalid URL {args.url!r}: {exc}")
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
