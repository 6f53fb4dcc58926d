"""The README's figures and examples are the service's: the catalog and zoo sizes, the MIG profiles
scaled from the 2g profile, the VGG-16 walk-through, every request of the API tour (sent to the
real app), the CLI example's quoted output and exit codes (tests/test_capplan.py); and every
relative link and anchor of the README, the docs/ pages and the pages beside the code resolves."""

from __future__ import annotations

import io
import re
import shlex
import unicodedata
from pathlib import Path
from urllib.parse import urlsplit

from fastapi.testclient import TestClient

from app.client.cli import main
from app.config import PROJECT_ROOT
from app.domain.zoo import ZOO
from app.main import create_app
from app.services.catalog import load_catalog
from tests.support import ApiClient, settings_for

README = (PROJECT_ROOT / "README.md").read_text()
DOCS = sorted((PROJECT_ROOT / "docs").glob("*.md"))
HF_CONFIG = PROJECT_ROOT / "tests" / "fixtures" / "hf_configs" / "llama-3-8b.json"
ONNX_FILE = PROJECT_ROOT / "tests" / "fixtures" / "onnx" / "conv_batchnorm_dynamo_eval.onnx"


def _section(heading: str) -> str:
    start = README.index(f"\n## {heading}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end != -1 else None]


def _fenced(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


# -- figures -----------------------------------------------------------------------------------


def test_the_catalog_size_is_the_number_of_catalog_devices() -> None:
    match = re.search(
        r"The hardware catalog holds (\d+) devices: (\d+) from `shared/reference/` and (\d+) ",
        README,
    )
    assert match, "README's Notes no longer state the catalog size"
    total, reference, xeons = (int(g) for g in match.groups())
    entries = load_catalog(PROJECT_ROOT / "hardware_catalog")
    assert total == len(entries)
    assert reference + xeons == total
    # The Xeons that only the CPU calibration file names are its devices missing from no file.
    cpu_rows = (PROJECT_ROOT / "benchmarks" / "calibration" / "calibration_cpu.yaml").read_text()
    named = {m.replace("_", "-") for m in re.findall(r"^- device: (\S+)$", cpu_rows, re.M)}
    assert len(named & {e.slug for e in entries}) >= xeons


def test_the_scaled_mig_profiles_are_the_catalogs() -> None:
    match = re.search(r"no observed driver value in the reference \(([^)]*)\);", README)
    assert match, "README's Notes no longer name the MIG profiles scaled from the 2g profile"
    named = {  # "B200 3g/4g/7g" -> nvidia-b200: {"3g", "4g", "7g"}
        "nvidia-" + gpu.lower().replace(" ", "-"): set(sizes.split("/"))
        for gpu, sizes in re.findall(r"(\w+(?: \w+)?) ((?:\dg/?)+)", " ".join(match[1].split()))
    }
    assert len(named) == 2  # the README names two GPUs: both parsed
    entries = {entry.slug: entry for entry in load_catalog(PROJECT_ROOT / "hardware_catalog")}
    for slug, sizes in named.items():
        mig = entries[slug].mig
        assert mig is not None, slug
        (two,) = (p for p in mig.profiles if p.name.startswith("2g.") and "+" not in p.name)
        scaled = [p for p in mig.profiles if "memory_mib" in p.unconfirmed]
        assert {p.name.split(".")[0] for p in scaled} == sizes, slug
        for profile in scaled:
            assert profile.memory_mib * two.memory_slices == two.memory_mib * profile.memory_slices


def test_the_zoo_list_is_the_built_in_zoo() -> None:
    (bullet,) = re.findall(r"\* The built-in zoo \(.*?\n(?=\* )", README, re.S)
    slugs = re.findall(r"`([a-z0-9.-]+)`", bullet.split(":", 1)[1])
    assert slugs == list(ZOO)  # every model, in the order catalog-sync seeds them
    assert len(ZOO) == 13


def test_the_vgg16_walk_through_is_the_summary_endpoints(client: ApiClient) -> None:
    match = re.search(
        r"VGG-16 walk-through: ([\d,]+) and ([\d,]+) parameters in\s+the first two convs, "
        r"([\d,]+) values after flattening",
        README,
    )
    assert match, "README's tour no longer quotes the VGG-16 walk-through"
    first, second, flattened = (int(g.replace(",", "")) for g in match.groups())
    response = client.get("/v1/models/vgg-16/summary", params={"batch_size": 1})
    assert response.status_code == 200, response.text
    layers = response.json()["layers"]
    convs = [row["params"] for row in layers if row["op"] == "conv2d"]
    flatten = next(row for row in layers if row["op"] == "flatten")
    assert (first, second, flattened) == (convs[0], convs[1], flatten["activation_elements"])


# -- the API tour ------------------------------------------------------------------------------


def _curl_commands() -> list[list[str]]:
    (block,) = _fenced(_section("A tour of the API"), "bash")
    joined = block.replace("\\\n", " ")
    return [shlex.split(line) for line in joined.splitlines() if line.startswith("curl ")]


def _send(client: ApiClient, argv: list[str]) -> tuple[str, int, bytes]:
    assert argv[0] == "curl"
    method, headers, data, files, fields, url = "GET", {}, None, {}, {}, None
    args = iter(argv[1:])
    for arg in args:
        if arg == "-s":
            continue
        if arg == "-X":
            method = next(args)
        elif arg == "-H":
            name, value = next(args).split(": ", 1)
            headers[name] = value
        elif arg == "-d":
            method = "POST" if method == "GET" else method
            data = next(args).replace("$(cat config.json)", HF_CONFIG.read_text())
        elif arg == "-F":
            method = "POST"
            name, value = next(args).split("=", 1)
            if value.startswith("@"):
                assert value == "@model.onnx"
                files[name] = ("model.onnx", ONNX_FILE.read_bytes())
            else:
                fields[name] = value
        else:
            assert url is None, f"unexpected curl argument {arg!r}"
            url = arg
    assert url is not None
    assert url.startswith("http://127.0.0.1:8000/")
    parts = urlsplit(url)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    if files:
        response = client.request(method, target, files=files, data=fields)
    else:
        response = client.request(method, target, content=data, headers=headers)
    return target, response.status_code, response.content


def test_every_request_of_the_api_tour_is_answered(client: ApiClient) -> None:
    commands = _curl_commands()
    assert len(commands) >= 10
    answered = {}
    for argv in commands:  # in order: the workload exists before the admission check names it
        target, status, body = _send(client, argv)
        assert 200 <= status < 300, (target, status, body[:500])
        answered[target.split("?")[0]] = status
    # Every family the tour names has its request.
    for path in ("/v1/hardware", "/v1/estimates/memory", "/v1/mig/fit", "/v1/workloads",
                 "/v1/recommendations/inference", "/v1/admission/check",
                 "/v1/models/import/hf-config", "/v1/models/import/onnx"):  # fmt: skip
        assert path in answered, path
    assert answered["/v1/workloads"] == answered["/v1/models/import/onnx"] == 201


def test_the_cli_example_prints_the_quoted_verdict(db_url: str) -> None:
    (block,) = _fenced(_section("A tour of the API"), "text")
    command, *quoted = block.strip().splitlines()
    assert command.startswith("$ capplan ")
    verdict = quoted[-1]
    assert verdict.startswith("does NOT fit nvidia-a10: needs ")
    app = create_app(settings_for(db_url))
    out, err = io.StringIO(), io.StringIO()
    with TestClient(app, raise_server_exceptions=False) as http:
        code = main(shlex.split(command.removeprefix("$ capplan ")), http=http, out=out, err=err)
    app.state.engine.dispose()
    assert code == 1, err.getvalue()  # exit 1: the answer is no
    assert verdict in out.getvalue().splitlines(), out.getvalue()


# -- links -------------------------------------------------------------------------------------


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = unicodedata.normalize("NFKC", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {_anchor(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def _pages() -> list[Path]:
    """The README, the docs/ pages and the Markdown pages beside the code that link to them."""
    beside = [
        page
        for folder in ("benchmarks", "deploy", "hardware_catalog", "migrations")
        for page in (PROJECT_ROOT / folder).rglob("*.md")
        if not any(part.startswith(".") for part in page.relative_to(PROJECT_ROOT).parts)
    ]
    return [PROJECT_ROOT / "README.md", *DOCS, *sorted(beside)]


def test_every_relative_link_and_anchor_of_the_readme_and_docs_resolves() -> None:
    pages = _pages()
    assert len(pages) >= 12
    broken = []
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto: not checked here
            file_part, _, anchor = target.partition("#")
            linked = (page.parent / file_part).resolve() if file_part else page
            if not linked.exists():
                broken.append(f"{page.relative_to(PROJECT_ROOT)}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
                broken.append(f"{page.relative_to(PROJECT_ROOT)}: {target} (no such heading)")
    assert broken == []


def test_the_readme_links_every_docs_page() -> None:
    index = _section("Documentation")
    for page in DOCS:
        assert f"](docs/{page.name})" in index, page.name
