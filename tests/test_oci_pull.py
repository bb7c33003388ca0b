"""`localgen pull oci:NAME` from an OCI registry as Docker Model Runner packages models (models/oci.py,
models/ocipull.py): a loopback registry (tests/oci_server.py) that wants Docker Hub's anonymous bearer token and
serves SmolLM2's GGUF, pulled over http by the real CLI into localgen's data dir, then run, listed, shown and
removed; serve's /api/pull and /api/delete do the same for a client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import oci_server, test_registry_pull
from tests.conftest import ROOT
from tests.forkserver import ForkServer
from tests.hub_server import HubFile
from tests.oci_server import (
    DOCKER_MANIFEST,
    GGUF,
    LICENSE,
    OCI_INDEX,
    OCI_MANIFEST,
    SAFETENSORS,
    SERVICE,
    TEMPLATE,
    TOKEN,
    FakeOci,
    config_blob,
)

MY_TEMPLATE = b"{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}" \
              b"{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}{# from the OCI layer #}"


@pytest.fixture(scope="module")
def served() -> Iterator[FakeOci]:
    reg, server = oci_server.start()
    yield reg
    server.shutdown()
    server.cdn.shutdown()  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def gguf(smollm2_path: Path) -> HubFile:
    return HubFile(smollm2_path)


@pytest.fixture
def reg(served: FakeOci, gguf: HubFile) -> FakeOci:
    """ai/smollm2:latest (GGUF, license) and ai/smollm2:templated (the same GGUF with a chat template layer)."""
    served.reset()
    served.add("ai/smollm2", "latest", [(GGUF, gguf), (LICENSE, HubFile(b"Apache-2.0\n"))],
               config_blob(quantization="Q4_1", parameters="135M", size="94MB", context_size=2048))
    served.add("ai/smollm2", "templated", [(GGUF, gguf), (TEMPLATE, HubFile(MY_TEMPLATE))])
    return served


@pytest.fixture(scope="module")
def forks(cli_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForkServer]:
    """A fork server in this module's environment: online (no HF_HUB_OFFLINE)."""
    e = {k: v for k, v in cli_env.items() if k != "HF_HUB_OFFLINE"}
    server = ForkServer(e, ROOT, Path(tempfile.mkdtemp(prefix="localgen-forks-")))
    yield server
    server.close()


@pytest.fixture
def lg(forks: ForkServer, tmp_path: Path) -> Lg:
    return Lg(forks, {**forks.env, "LOCALGEN_HOME": str(tmp_path / "home")})


class Lg(test_registry_pull.Lg):
    """`localgen ARGS` in the test's environment, as the Ollama registry's tests run it; its pulls in oci/."""

    @property
    def pulled(self) -> Path:
        return Path(self.env["LOCALGEN_HOME"]) / "data" / "oci"


def name(reg: FakeOci, ref: str = "ai/smollm2") -> str:
    return f"oci:{reg.host}/{ref}"


def one_line(r: subprocess.CompletedProcess[str], rc: int, says: str) -> None:
    assert r.returncode == rc, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert says in lines[-1] and "Traceback" not in r.stderr, r.stderr
    assert sum("error" in x for x in lines) == 1, r.stderr


def test_pull_with_a_token_then_run_list_show_and_rm(lg: Lg, reg: FakeOci, gguf: HubFile) -> None:
    """docs/models.md "Models from OCI registries": the 401's challenge is answered with the realm's anonymous
    token (service and scope as the challenge names them), the manifest is asked for as an OCI or Docker manifest
    or an index, the layers land in localgen's data dir; run answers with SmolLM2, list and show name it (show with
    the config's quantization and size), rm takes every blob back."""
    r = lg("pull", name(reg))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[:3] == [name(reg) + ":latest", "Q4_1", "94"], r.stdout
    assert reg.token_requests == [{"service": [SERVICE], "scope": ["repository:ai/smollm2:pull"]}]
    first, *rest = reg.requests
    assert first[0] == "/v2/ai/smollm2/manifests/latest" and first[3] == ""  # asked without a token: the 401
    accept = rest[0][2]
    assert all(t in accept for t in (OCI_MANIFEST, DOCKER_MANIFEST, OCI_INDEX)), accept
    assert all(auth == f"Bearer {TOKEN}" for _, _, _, auth in rest), rest  # then every request with it
    stored = lg.pulled / "manifests" / reg.host / "ai" / "smollm2" / "@latest"
    assert stored.read_bytes() == reg.manifests["ai/smollm2:latest"][0]
    blobs = sorted(p.name for p in (lg.pulled / "blobs").iterdir())
    assert len(blobs) == 3 and f"sha256-{gguf.sha256}" in blobs, blobs  # config, GGUF, license
    r = lg("run", "-m", name(reg), "-p", "What is the capital of France?", "--json", "-n", "8", "--temp", "0")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["model"]["name"] == name(reg) + ":latest" and out["model"]["source"] == "oci" and out["text"].strip()
    r = lg("list", "--json")
    item = next(x for x in json.loads(r.stdout) if x["name"] == name(reg) + ":latest")
    assert item["source"] == "oci" and item["size"] == gguf.size, item
    r = lg("show", name(reg), "--json")
    doc = json.loads(r.stdout)
    assert doc["oci_config"] == {"format": "gguf", "quantization": "Q4_1", "parameters": "135M", "size": "94MB",
                                 "context_size": 2048}, doc
    assert doc["load"] == {"num_ctx": 2048} and doc["license_layers"] == 1, doc
    r = lg("show", name(reg))
    assert "OCI config" in r.stdout and "quantization Q4_1" in r.stdout, r.stdout
    r = lg("rm", name(reg), "--yes")
    assert r.returncode == 0 and "removed" in r.stdout, r.stderr
    assert not list((lg.pulled / "blobs").glob("sha256-*")) and not stored.exists()
    r = lg("list", "--json")
    assert name(reg) + ":latest" not in {x["name"] for x in json.loads(r.stdout)}


def test_run_of_a_name_not_pulled_pulls_it_and_uses_its_chat_template(lg: Lg, reg: FakeOci, gguf: HubFile) -> None:
    """run -m oci:... pulls a model first (as an ollama: name does); a chat template layer is the model's
    template in place of the GGUF's own; a second tag sharing the GGUF does not download it again."""
    r = lg("run", "-m", name(reg, "ai/smollm2:templated"), "-p", "Hi", "-n", "4", "--temp", "0")
    assert r.returncode == 0, r.stderr
    r = lg("show", name(reg, "ai/smollm2:templated"), "--template")
    assert r.stdout.strip() == MY_TEMPLATE.decode(), r.stdout
    before = len(reg.requests)
    r = lg("pull", name(reg))
    assert r.returncode == 0, r.stderr
    got = [p for p, _, _, _ in reg.requests[before:] if "/blobs/" in p]
    assert len(got) == 2 and not any(p.endswith(gguf.sha256) for p in got), got  # its config and license


def test_a_docker_v2_manifest_and_an_index_and_a_digest(lg: Lg, reg: FakeOci, gguf: HubFile) -> None:
    """A Docker v2 manifest is read as an OCI one; an image index's model entry (artifactType: Docker's model
    config) is taken, checked against its digest; a name @sha256:DIGEST is fetched by its digest."""
    raw = reg.add("ai/docker", "v2", [(GGUF, gguf)], media=DOCKER_MANIFEST)
    reg.token_key = "access_token"  # a realm may answer with OAuth's name for the token
    r = lg("pull", name(reg, "ai/docker:v2"))
    assert r.returncode == 0, r.stderr
    assert reg.token_requests and reg.requests[-1][3] == f"Bearer {TOKEN}"
    other = reg.add("ai/multi", "image", [("application/vnd.oci.image.layer.v1.tar+gzip", HubFile(b"x"))])
    model = reg.add("ai/multi", "model", [(GGUF, gguf)])
    reg.add_index("ai/multi", "latest", [(other, {"platform": {"os": "linux", "architecture": "amd64"}}),
                                         (model, {"artifactType": oci_server.CONFIG})])
    r = lg("pull", name(reg, "ai/multi"))
    assert r.returncode == 0, r.stderr
    stored = lg.pulled / "manifests" / reg.host / "ai" / "multi" / "@latest"
    assert stored.read_bytes() == model  # the model's manifest, not the index
    import hashlib

    digest = "sha256:" + hashlib.sha256(raw).hexdigest()
    r = lg("pull", name(reg, f"ai/docker@{digest}"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == name(reg, f"ai/docker@{digest}"), r.stdout
    assert f"/v2/ai/docker/manifests/{digest}" in [p for p, _, _, _ in reg.requests]


def test_index_without_a_model_and_manifest_without_gguf_are_one_line(lg: Lg, reg: FakeOci, gguf: HubFile) -> None:
    """An index with no model entry, and a safetensors-only model (vLLM's), are refused in one line, nothing
    downloaded; a missing tag is a 404 named."""
    a = reg.add("ai/img", "a", [("application/vnd.oci.image.layer.v1.tar", HubFile(b"a"))])
    b = reg.add("ai/img", "b", [("application/vnd.oci.image.layer.v1.tar", HubFile(b"b"))])
    reg.add_index("ai/img", "latest", [(a, {"platform": {"os": "linux"}}), (b, {"platform": {"os": "windows"}})])
    one_line(lg("pull", name(reg, "ai/img")), 1, "image index with no model entry")
    reg.add("ai/vllm", "latest", [(SAFETENSORS, HubFile(b"safetensors" * 100))])
    one_line(lg("pull", name(reg, "ai/vllm")), 1, "has no GGUF layer")
    assert not any("/blobs/" in p for p, _, _, _ in reg.requests)
    one_line(lg("pull", name(reg, "ai/smollm2:nope")), 1, "has no model ai/smollm2 with the tag nope (404)")
    assert not (lg.pulled / "blobs").exists() or not any((lg.pulled / "blobs").iterdir())


def test_cdn_redirect_goes_without_the_token_and_a_cut_blob_resumes(lg: Lg, reg: FakeOci, gguf: HubFile) -> None:
    """Blobs redirected to a CDN (another host) are fetched there without the registry's token; a connection cut
    mid-blob resumes with a Range from where it stopped."""
    reg.redirect_blobs = True
    reg.drop_after["sha256:" + gguf.sha256] = [gguf.size // 3]
    r = lg("pull", name(reg))
    assert r.returncode == 0, r.stderr
    assert reg.cdn_requests and all(auth == "" for _, _, auth in reg.cdn_requests), reg.cdn_requests
    assert all(auth == f"Bearer {TOKEN}" for p, _, _, auth in reg.requests if "/blobs/" in p)  # the registry's: it
    ranges = [a for p, a, _ in reg.cdn_requests if p.endswith(gguf.sha256)]
    assert len(ranges) == 2 and ranges[0] == "bytes=0-" and ranges[1] != "bytes=0-", ranges


def test_each_try_of_a_blob_asks_for_its_headers_again(reg: FakeOci, gguf: HubFile, tmp_path: Path) -> None:
    """A blob's retry after a cut connection asks the pull for its headers again, so that a registry token that ran
    out while the first try streamed (Docker Hub's last five minutes) is renewed, not sent stale into a 401."""
    from localgen.models import download
    from localgen.models.quant import RemoteFile

    reg.token = False
    reg.drop_after["sha256:" + gguf.sha256] = [gguf.size // 3]
    calls: list[int] = []

    def headers() -> dict[str, str]:
        calls.append(1)
        return {"Authorization": f"Bearer try-{len(calls)}"}

    blob = tmp_path / "blob"
    download.fetch_held(f"http://{reg.host}/v2/ai/smollm2/blobs/sha256:{gguf.sha256}", headers, blob,
                        RemoteFile("gguf", gguf.size, gguf.sha256), download.Quiet(),
                        download.Source("test", "its digest"))
    assert blob.stat().st_size == gguf.size
    sent = [auth for p, _, _, auth in reg.requests if p.endswith(gguf.sha256)]
    assert sent == ["Bearer try-1", "Bearer try-2"], sent


def test_a_wrong_blob_is_refused_and_not_kept(lg: Lg, reg: FakeOci, gguf: HubFile) -> None:
    """A blob whose bytes are not its digest fails the pull (one line), and no manifest is written."""
    reg.blobs["sha256:" + gguf.sha256] = HubFile(gguf.source, gguf.sha256, corrupt_at=gguf.size // 2)
    r = lg("pull", name(reg))
    assert r.returncode != 0 and "does not match" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (lg.pulled / "manifests").exists() or not list((lg.pulled / "manifests").rglob("@*"))
    assert not (lg.pulled / "blobs" / f"sha256-{gguf.sha256}").exists()
    assert list((lg.pulled / ".unfinished").rglob("@latest"))  # what rm of the pull that gave up takes
    r = lg("rm", name(reg), "--yes")
    assert r.returncode == 0 and not list((lg.pulled / "blobs").glob("sha256-*")), (r.stderr, r.stdout)
    assert not list((lg.pulled / ".unfinished").rglob("@*"))
    one_line(lg("rm", name(reg), "--yes"), 1, "localgen pulled no model")


def test_a_damaged_manifest_is_removed_and_layers_it_skips_are_not_read(lg: Lg, reg: FakeOci, gguf: HubFile) -> None:
    """A layer localgen does not use (safetensors) is not checked, as the pull skips it, so a pulled manifest with a
    bare one is used; a pulled manifest damaged afterwards is still removed by rm, its blobs with it; a manifest of
    more than 256 layers is refused before anything is downloaded."""
    import hashlib

    doc = json.loads(reg.manifests["ai/smollm2:latest"][0])
    doc["layers"].append({"mediaType": SAFETENSORS})  # no digest, no size: nothing localgen fetches
    raw = json.dumps(doc).encode()
    reg.manifests["ai/smollm2:bare"] = (raw, OCI_MANIFEST)
    r = lg("pull", name(reg, "ai/smollm2:bare"))
    assert r.returncode == 0, r.stderr
    r = lg("show", name(reg, "ai/smollm2:bare"))
    assert r.returncode == 0, r.stderr
    (manifest,) = (lg.pulled / "manifests").rglob("@bare")
    manifest.write_text("garbage")
    r = lg("rm", name(reg, "ai/smollm2:bare"), "--yes")
    assert r.returncode == 0, r.stderr
    assert not manifest.exists() and not list((lg.pulled / "blobs").glob("sha256-*")), r.stdout
    many = {**doc, "layers": [{"mediaType": GGUF, "digest": "sha256:" + hashlib.sha256(b"%d" % i).hexdigest(),
                               "size": 1} for i in range(257)]}
    reg.manifests["ai/smollm2:many"] = (json.dumps(many).encode(), OCI_MANIFEST)
    fetched = len([p for p, _, _, _ in reg.requests if "/blobs/" in p])
    one_line(lg("pull", name(reg, "ai/smollm2:many")), 1, "it has 257 layers, over the 256 localgen takes")
    assert len([p for p, _, _, _ in reg.requests if "/blobs/" in p]) == fetched


def test_a_moved_tag_prunes_the_blobs_no_manifest_names(lg: Lg, reg: FakeOci, gguf: HubFile) -> None:
    """pull of a tag that has moved (a new license layer) deletes the old blob no pulled manifest names, once
    the new manifest is written; the GGUF both name stays."""
    old = HubFile(b"Apache-2.0\n")
    assert lg("pull", name(reg)).returncode == 0
    reg.add("ai/smollm2", "latest", [(GGUF, gguf), (LICENSE, HubFile(b"MIT\n"))])
    assert lg("pull", name(reg)).returncode == 0
    blobs = {p.name for p in (lg.pulled / "blobs").glob("sha256-*")}
    assert f"sha256-{old.sha256}" not in blobs and f"sha256-{gguf.sha256}" in blobs, blobs


def test_split_gguf_over_several_layers_loads(lg: Lg, reg: FakeOci, smollm2_path: Path, tmp_path: Path) -> None:
    """A model split by gguf-split into several GGUF layers: every part is pulled in the manifest's order and linked
    as model-0000I-of-0000N.gguf (Docker Model Runner's names), which llama.cpp loads; run answers."""
    from tests.gguf_split import split_model

    parts = split_model(smollm2_path, tmp_path / "split", "smol", 100)
    assert len(parts) >= 2
    reg.add("ai/split", "latest", [(GGUF, HubFile(p)) for p in parts])
    r = lg("pull", name(reg, "ai/split"))
    assert r.returncode == 0, r.stderr
    links = sorted((lg.pulled / "splits").glob("*/*.gguf"))
    assert [p.name for p in links] == [f"model-{i:05d}-of-{len(parts):05d}.gguf" for i in range(1, len(parts) + 1)]
    assert [os.path.realpath(p) for p in links] == [
        str((lg.pulled / "blobs" / f"sha256-{HubFile(p).sha256}").resolve()) for p in parts]
    r = lg("run", "-m", name(reg, "ai/split"), "-p", "What is the capital of France?", "-n", "8", "--temp", "0")
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    r = lg("rm", name(reg, "ai/split"), "--yes")
    assert r.returncode == 0, r.stderr
    assert not list((lg.pulled / "splits").glob("*"))


def test_bad_names_are_usage_errors(lg: Lg) -> None:
    """A name Docker would not take (upper case in the repository, a bad digest) is a usage error (exit 2)."""
    one_line(lg("pull", "oci:ai/SmolLM2"), 2, "is not an OCI image reference")
    one_line(lg("pull", "oci:ai/smollm2@sha256:abc"), 2, "is not an OCI image reference")


def test_docker_hub_names_follow_docker_s_rules() -> None:
    """oci:ai/smollm2 is docker.io's ai/smollm2:latest, asked of registry-1.docker.io; oci:smollm2 is
    library/smollm2; a first part with a '.' or ':' (or localhost) is a host."""
    from localgen.models.oci import parse_name

    n = parse_name("ai/smollm2")
    assert (n.host, n.repo, n.tag, n.api_host, n.display) == (
        "docker.io", "ai/smollm2", "latest", "registry-1.docker.io", "oci:ai/smollm2:latest")
    assert parse_name("smollm2:135M-Q4_K_M").repo == "library/smollm2"
    assert parse_name("//quay.io/org/model:v1").host == "quay.io"
    assert parse_name("localhost:5000/m").host == "localhost:5000"
    assert parse_name("docker.io/ai/smollm2").display == "oci:ai/smollm2:latest"


def test_public_registry_may_not_redirect_to_this_machine() -> None:
    """registry.redirect_guard: a public registry host's redirect (or realm) to a loopback, private or
    link-local address is refused in one line, as is one from https to http; a registry on loopback may redirect
    there (the tests' CDN); a registry whose name does not resolve counts as public (a name that answers otherwise
    the next time cannot open the door), and so does any registry serve was told is public."""
    from localgen.errors import LocalgenError
    from localgen.models.registry import redirect_guard

    for guard, old in ((redirect_guard("8.8.8.8"), "http://8.8.8.8/v2/x/blobs/sha256:1"),
                       (redirect_guard("registry.does-not-resolve.invalid"), "http://registry.invalid/v2/x"),
                       (redirect_guard("127.0.0.1:5000", public=True), "http://127.0.0.1:5000/v2/x")):
        for target in ("http://127.0.0.2:9/blob", "http://10.0.0.1/blob", "http://169.254.169.254/latest"):
            with pytest.raises(LocalgenError, match="a public registry may not send localgen"):
                guard(old, target)
        guard(old, "https://1.1.1.1/blob")
    with pytest.raises(LocalgenError, match="must not leave https"):
        redirect_guard("8.8.8.8")("https://8.8.8.8/v2/x/blobs/sha256:1", "http://1.1.1.1/blob")
    redirect_guard("127.0.0.1:5000")("http://127.0.0.1:5000/v2/x", "http://127.0.0.2:9/blob")
    with pytest.raises(LocalgenError, match="not an http"):
        redirect_guard("127.0.0.1:5000")("http://127.0.0.1:5000/v2/x", "file:///etc/passwd")


def test_a_pull_asks_the_guard_about_its_realm_and_its_blobs(reg: FakeOci, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A pull told its registry is public (as serve's /api/pull is without --allow-private-urls) refuses a token
    realm and a blob redirect on 127.0.0.2, and downloads nothing: the guard is asked on both paths."""
    from localgen.errors import LocalgenError
    from localgen.models import download, oci, ocipull

    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path / "home"))
    target = oci.parse_name(f"{reg.host}/ai/smollm2")
    with pytest.raises(LocalgenError, match=r"127\.0\.0\.2, .*a public registry may not send localgen"):
        ocipull.pull(target, download.Quiet(), public=True)
    assert not reg.token_requests
    reg.token, reg.redirect_blobs = False, True
    with pytest.raises(LocalgenError, match=r"127\.0\.0\.2, .*a public registry may not send localgen"):
        ocipull.pull(target, download.Quiet(), public=True)
    assert not reg.cdn_requests
    assert ocipull.pull(target, download.Quiet()).is_file()  # a loopback registry, not said public: its CDN serves


def test_retry_after_http_date_is_honoured_and_capped() -> None:
    """hub.retry_after reads an HTTP-date as the seconds until it, capped (a registry's manifest: MAX_RETRY_AFTER) as
    the seconds form is."""
    import email.utils
    import time

    from localgen.models.hub import retry_after
    from localgen.models.registry import MAX_RETRY_AFTER

    assert retry_after("Thu, 01 Jan 1970 00:00:00 GMT", MAX_RETRY_AFTER) == 0.0
    soon = email.utils.formatdate(time.time() + 2, usegmt=True)
    assert 0.5 < (retry_after(soon, MAX_RETRY_AFTER) or 0) <= 2.0
    assert retry_after(email.utils.formatdate(time.time() + 3600, usegmt=True), MAX_RETRY_AFTER) == MAX_RETRY_AFTER
    assert retry_after("3", MAX_RETRY_AFTER) == 3.0 and retry_after("soon", MAX_RETRY_AFTER) is None
    # 5,000 digits: past int()'s 4,300, a ValueError traceback from `pull`; as absurd as any huge wait, so capped
    assert retry_after("9" * 5000, MAX_RETRY_AFTER) == MAX_RETRY_AFTER and retry_after("9" * 5000) == float(1 << 40)


def test_503_with_a_retry_after_date_is_retried(lg: Lg, reg: FakeOci) -> None:
    """A registry busy (503, Retry-After as an HTTP-date) is asked again, and the pull succeeds."""
    reg.fail_statuses[:] = [503]
    reg.token = False
    r = lg("pull", name(reg))
    assert r.returncode == 0, r.stderr
    assert [p for p, _, _, _ in reg.requests[:2]] == ["/v2/ai/smollm2/manifests/latest"] * 2
    assert reg.token_requests == []


def test_serve_pulls_an_oci_name_and_deletes_it(lg: Lg, reg: FakeOci, gguf: HubFile, tmp_path: Path) -> None:
    """serve's /api/pull takes an oci: name as `localgen pull` does (a loopback registry is a 403 without serve
    --allow-private-urls, as for ollama: names); the model then answers and is listed; /api/delete removes it."""
    import httpx
    import ollama

    from tests.test_serve import Server

    model = name(reg) + ":latest"
    home = str(tmp_path / "serve-home")
    s = Server({**lg.env, "LOCALGEN_HOME": home}, "-np", "1", "--ctx", "512")
    try:
        r = httpx.post(f"{s.url}/api/pull", json={"model": model, "stream": False}, timeout=60)
        assert r.status_code == 403 and "is a loopback address" in r.json()["error"], r.text
        assert reg.requests == []
    finally:
        assert s.stop() == 0
    s = Server({**lg.env, "LOCALGEN_HOME": home}, "-np", "1", "--ctx", "512", "--allow-private-urls")
    try:
        client = ollama.Client(host=s.url)
        lines = list(client.pull(model, stream=True))
        assert lines[0].status == "pulling manifest" and lines[-1].status == "success", lines
        assert any(x.total == gguf.size and x.completed == gguf.size for x in lines), lines
        assert model in [m.model for m in client.list().models]
        r = client.generate(model=model, prompt="Say hi.", options={"num_predict": 3, "temperature": 0})
        assert r.done and r.eval_count
        r2 = httpx.post(f"{s.url}/api/pull", json={"model": name(reg, "ai/smollm2:none"), "stream": False},
                        timeout=60)
        assert r2.status_code == 404 and "with the tag none (404)" in r2.json()["error"], r2.text
        client.delete(model)
        assert model not in [m.model for m in client.list().models]
        assert not list((Path(home) / "data" / "oci" / "blobs").glob("sha256-*"))
    finally:
        assert s.stop() == 0
        log = s.proc.stderr.read().decode() if s.proc.stderr else ""
    assert "Traceback" not in log, log


def test_offline_and_list_quants(lg: Lg, reg: FakeOci) -> None:
    """Offline, run of a model not pulled is one line naming the pull, and nothing is asked of the registry;
    pull --offline of a pulled one prints it without asking; pull --list of an oci: name is a usage error."""
    one_line(lg("run", "-m", name(reg), "-p", "Hi", "--offline"), 1, "no OCI model")
    r = lg("run", "-m", name(reg), "-p", "Hi", "--offline")
    assert f"localgen pull {name(reg)}:latest" in r.stderr and reg.requests == [], r.stderr
    one_line(lg("pull", name(reg), "--list"), 2, "an OCI model's tag names the one it has")
    assert lg("pull", name(reg)).returncode == 0
    before = len(reg.requests)
    r = lg("pull", name(reg), "--offline")
    assert r.returncode == 0 and "is pulled (not checked" in r.stderr and len(reg.requests) == before, r.stderr


def test_serve_m_serves_a_pulled_oci_model(lg: Lg, reg: FakeOci) -> None:
    """serve -m oci:NAME loads a pulled OCI model and answers with it under that name."""
    import httpx

    from tests.test_serve import Server

    assert lg("pull", name(reg)).returncode == 0
    model = name(reg) + ":latest"
    s = Server(lg.env, "-m", model, "-np", "1", "--ctx", "512")
    try:
        r = httpx.post(f"{s.url}/v1/chat/completions", timeout=120, json={
            "model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3})
        assert r.status_code == 200 and r.json()["model"] == model, r.text
    finally:
        assert s.stop() == 0


def test_a_projector_layer_is_the_model_s_projector(lg: Lg, reg: FakeOci, gguf: HubFile, tmp_path: Path) -> None:
    """An application/vnd.docker.ai.mmproj layer is pulled and is the model's projector: show names it and the
    image modality it gives."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from make_mmproj import write_mmproj

    proj = HubFile(write_mmproj(tmp_path / "mmproj.gguf"))
    reg.add("ai/seer", "latest", [(GGUF, gguf), (oci_server.MMPROJ, proj)])
    assert lg("pull", name(reg, "ai/seer")).returncode == 0
    doc = json.loads(lg("show", name(reg, "ai/seer"), "--json").stdout)
    assert doc["projector"] == str(lg.pulled / "blobs" / f"sha256-{proj.sha256}"), doc
    assert doc["modalities"] == ["text", "image"], doc


def _read_only(lg: Lg, folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`localgen ARGS` with `folder` read-only (a bind mount in a mount namespace of its own, as
    tests/test_collections.py makes a read-only disk: root writes through a chmod)."""
    import shutil

    if shutil.which("unshare") is None or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode:
        pytest.skip("mounting needs unshare and the right to use it (root)")
    env = {**lg.env, "D": str(folder), "PY": sys.executable}
    return subprocess.run(["unshare", "-m", "sh", "-c", 'mount --bind -o ro "$D" "$D" && exec "$PY" -m localgen "$@"',
                           "sh", *args], env=env, capture_output=True, text=True, timeout=600, cwd=ROOT,
                          stdin=subprocess.DEVNULL)


def test_a_split_model_lists_and_shows_from_a_read_only_data_dir(lg: Lg, reg: FakeOci, smollm2_path: Path,
                                                                 tmp_path: Path) -> None:
    """docs/models.md "Layers": the pull makes a split's links; list and show read the store as it is and write
    nothing in it, so they work on a read-only data dir, also where the links are missing (they made them there,
    and on a read-only one failed: "cannot write .../splits: Read-only file system"); a run makes missing links
    again, and says in one line when it cannot."""
    import shutil

    from tests.gguf_split import split_model

    parts = split_model(smollm2_path, tmp_path / "split", "smol", 100)
    reg.add("ai/split", "latest", [(GGUF, HubFile(p)) for p in parts])
    model = name(reg, "ai/split") + ":latest"
    assert lg("pull", model).returncode == 0
    splits = lg.pulled / "splits"
    made = sorted(str(p.relative_to(splits)) for p in splits.glob("*/*.gguf"))
    assert len(made) == len(parts), made
    whole = json.loads(lg("show", str(smollm2_path), "--json").stdout)
    data = lg.pulled.parent
    for missing in (False, True):
        if missing:  # links gone (a store copied without them, an older pull's): read through links of its own
            shutil.rmtree(splits)
        r = _read_only(lg, data, "list", "--json")
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
        item = next(x for x in json.loads(r.stdout) if x["name"] == model)
        assert item["parameters"] == whole["parameters"] and item["size"] == sum(p.stat().st_size for p in parts), item
        r = _read_only(lg, data, "show", model, "--json")
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["parameters"] == whole["parameters"] and doc["gguf_layers"] == len(parts), doc
    assert not splits.exists(), "list and show wrote nothing"
    r = _read_only(lg, data, "run", "-m", model, "-p", "Hi", "-n", "2", "--no-log")
    one_line(r, 1, "cannot make the links a split model loads through")
    r = lg("run", "-m", model, "-p", "What is the capital of France?", "-n", "4", "--temp", "0")
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    assert sorted(str(p.relative_to(splits)) for p in splits.glob("*/*.gguf")) == made
    assert [p.name for p in splits.iterdir()] == [Path(made[0]).parent.name], "no folder of a maker's own is left"


# what a run finds at the folder's path: its entries, counted where the folder read is still the one there once
# read (one renamed away meanwhile is what a later look finds gone: -1)
WATCH = """import os, sys
folder, stop = sys.argv[1], sys.argv[2]
seen = set()
while not os.path.exists(stop):
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        seen.add(-1)
        continue
    try:
        n = len(os.listdir(fd))
        seen.add(n if os.stat(folder).st_ino == os.fstat(fd).st_ino else -1)
    except FileNotFoundError:
        seen.add(-1)
    finally:
        os.close(fd)
print(sorted(seen))
"""


def test_a_split_folder_is_seen_whole_or_not_at_all(tmp_path: Path) -> None:
    """docs/models.md "Layers": a run starting while a split's links are made (a pull, a run after they went) or
    taken away (rm, a pull that moves a tag) finds all of them or none, never some: they are made in a folder of
    the maker's own, renamed into place, and a folder is renamed away before it is emptied. Another process
    watches the folder while it is made and pruned again and again."""
    from localgen.models import oci

    blobs = [tmp_path / "blobs" / f"sha256-{i:064x}" for i in range(12)]
    blobs[0].parent.mkdir()
    for b in blobs:
        b.write_bytes(b"x")
    folder, _ = oci.split_folder(tmp_path, blobs)
    stop = tmp_path / "stop"
    watcher = subprocess.Popen([sys.executable, "-c", WATCH, str(folder), str(stop)], stdout=subprocess.PIPE,
                               text=True)
    try:
        time.sleep(0.2)
        for _ in range(200):
            oci.split_links(tmp_path, blobs)
            blobs[3].rename(tmp_path / "aside")  # rm took a part: prune takes the folder
            oci.prune_splits(tmp_path)
            (tmp_path / "aside").rename(blobs[3])
    finally:
        stop.touch()
        out, _ = watcher.communicate(timeout=60)
    assert json.loads(out) in ([-1, len(blobs)], [len(blobs)], [-1]), out
    assert not folder.exists() and list((tmp_path / "splits").iterdir()) == []


def test_a_token_refused_mid_pull_is_one_line_and_the_same_command_resumes(lg: Lg, reg: FakeOci,
                                                                          gguf: HubFile) -> None:
    """docs/models.md "Sign-in": a registry that sent the manifest, then refuses the token on a blob (here after
    a cut connection, on the try that resumes it), and refuses the new token the realm gives too, stops the pull
    with one line naming the registry and the blob, saying what is kept and that the same command resumes; run
    again, the pull goes on from the bytes it had (it said "the model is private or needs a login")."""
    from localgen.units import format_bytes

    digest = "sha256:" + gguf.sha256
    cut = gguf.size // 2
    reg.drop_after[digest] = [cut]
    reg.refuse_from[digest] = cut
    r = lg("pull", name(reg))
    config = json.loads(reg.manifests["ai/smollm2:latest"][0])["config"]["size"]
    one_line(r, 1, f"localgen: error: {reg.host} refused localgen's token mid-pull: 401 for the model blob {digest} "
                   f"of {name(reg)}:latest, after it sent the manifest; the {format_bytes(config + cut)} downloaded "
                   "so far are kept (the same command resumes the pull where it stopped)")
    assert "private" not in r.stderr, r.stderr
    assert (lg.pulled / "blobs" / f"sha256-{gguf.sha256}.incomplete").stat().st_size == cut
    assert len(reg.token_requests) == 2, reg.token_requests  # a new token once, refused again: final
    del reg.refuse_from[digest]
    r = lg("pull", name(reg))
    assert r.returncode == 0, r.stderr
    assert reg.blob_requests(digest) == ["bytes=0-", f"bytes={cut}-", f"bytes={cut}-", f"bytes={cut}-"], \
        reg.blob_requests(digest)
    assert (lg.pulled / "blobs" / f"sha256-{gguf.sha256}").stat().st_size == gguf.size


def test_a_blob_refusing_the_token_gets_a_new_one_and_the_pull_goes_on(lg: Lg, reg: FakeOci, gguf: HubFile) -> None:
    """docs/models.md "Sign-in": a blob that refuses the token the pull holds (revoked mid-pull, once) is asked
    again with a new one from the realm, and the pull finishes from the bytes it had."""
    digest = "sha256:" + gguf.sha256
    cut = gguf.size // 2
    reg.drop_after[digest] = [cut]
    # the manifest without a token (the challenge's 401), then with it, the config, the GGUF's first try: as usual;
    # the try that resumes the GGUF refused
    reg.fail_statuses.extend([0, 0, 0, 0, 401])
    r = lg("pull", name(reg))
    assert r.returncode == 0, r.stderr
    assert len(reg.token_requests) == 2, reg.token_requests
    assert reg.blob_requests(digest) == ["bytes=0-", f"bytes={cut}-", f"bytes={cut}-"], reg.blob_requests(digest)
    assert (lg.pulled / "blobs" / f"sha256-{gguf.sha256}").stat().st_size == gguf.size


@pytest.mark.parametrize("status", [401, 403])
def test_a_new_token_refused_mid_pull_is_one_line_and_the_same_command_resumes(lg: Lg, reg: FakeOci, gguf: HubFile,
                                                                              status: int) -> None:
    """docs/models.md "Sign-in": the first token brought the manifest and part of a blob; the blob then refuses it
    and the token service refuses a new one (401 or 403): one line naming the registry, that its token service
    refused a new token mid-pull, what is kept, and that the same command resumes, which it does (it said "the
    model is private or needs a login")."""
    from localgen.units import format_bytes

    digest = "sha256:" + gguf.sha256
    cut = gguf.size // 2
    reg.drop_after[digest] = [cut]
    reg.refuse_from[digest] = cut
    reg.token_statuses.extend([0, status])  # the first token; the second refused
    r = lg("pull", name(reg))
    config = json.loads(reg.manifests["ai/smollm2:latest"][0])["config"]["size"]
    one_line(r, 1, f"localgen: error: {reg.host}'s token service 127.0.0.2 refused a new token "
                   f"mid-pull ({status}) for {name(reg)}:latest, wanted for the model blob {digest} after the first "
                   f"token brought the manifest; the {format_bytes(config + cut)} downloaded so far are kept (the "
                   "same command resumes the pull where it stopped)")
    assert "private" not in r.stderr and "login" not in r.stderr, r.stderr
    assert (lg.pulled / "blobs" / f"sha256-{gguf.sha256}.incomplete").stat().st_size == cut
    del reg.refuse_from[digest]
    r = lg("pull", name(reg))
    assert r.returncode == 0, r.stderr
    assert reg.blob_requests(digest)[-1] == f"bytes={cut}-", reg.blob_requests(digest)
    assert (lg.pulled / "blobs" / f"sha256-{gguf.sha256}").stat().st_size == gguf.size


def test_an_ollama_registry_refusing_a_blob_mid_pull_is_one_line(lg: Lg, gguf: HubFile, tmp_path: Path) -> None:
    """docs/models.md "What it asks for": an `ollama:` pull (no token is sent to Ollama's registry) whose blob is
    refused after the manifest came says so in one line, naming the registry and the blob (it said "refused the
    download (401)")."""
    from tests import registry_server

    reg, server = registry_server.start()
    try:
        reg.add("library/smollm2:135m", [("model", gguf)])
        reg.fail_statuses.extend([0, 0, 401])  # the manifest and the config answered (0: as usual), the GGUF refused
        r = lg("pull", f"ollama:{reg.host}/library/smollm2:135m", OLLAMA_MODELS=str(tmp_path / "ollama"))
    finally:
        server.shutdown()
        server.cdn.shutdown()  # type: ignore[attr-defined]
    one_line(r, 1, f"{reg.host} refused the download mid-pull: 401 for the model blob sha256:{gguf.sha256} of ")
    assert r.stderr.rstrip().endswith("downloaded so far are kept (the same command resumes the pull where it "
                                      "stopped)"), r.stderr
