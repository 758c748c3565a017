"""The deployment files under docker/, checked offline: the Kubernetes manifests and their
kustomization, the compose file, the Dockerfile, .dockerignore and the entrypoint script.

Every command line in them is parsed by the real `replaygpu` parser (the learner's flags also
build its config, so a bad value fails here, not in a pod), and the ports, volumes, users,
probes and Secrets that must agree across files are compared. docker/smoke.sh builds and runs
the image for real; it needs podman and is not part of this suite.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pytest
import yaml

from replaygpu.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
K8S = DOCKER / "k8s"
ENTRYPOINT = DOCKER / "entrypoint.sh"
IMAGE_UID = 10001
#: what ${REPLAYGPU_TOKEN:?...} and friends stand for when a compose command is parsed
COMPOSE_ENV = {"REPLAYGPU_TOKEN": "test-token"}


# -- loading ------------------------------------------------------------------------------------


def _kustomization() -> dict[str, Any]:
    return yaml.safe_load((K8S / "kustomization.yaml").read_text())


def _k8s_docs() -> dict[tuple[str, str], dict[str, Any]]:
    """``(kind, metadata.name) -> document`` of every resource the kustomization applies."""
    docs: dict[tuple[str, str], dict[str, Any]] = {}
    for resource in _kustomization()["resources"]:
        for doc in yaml.safe_load_all((K8S / resource).read_text()):
            if doc is None:
                continue
            key = (doc["kind"], doc["metadata"]["name"])
            assert key not in docs, f"{resource}: {key} defined twice"
            docs[key] = doc
    return docs


def _pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def _container(workload: dict[str, Any], name: str) -> dict[str, Any]:
    containers = {c["name"]: c for c in _pod_spec(workload)["containers"]}
    assert name in containers, f"{workload['metadata']['name']}: no container {name!r}"
    return containers[name]


def _all_containers(docs: dict[tuple[str, str], dict[str, Any]]) -> list[dict[str, Any]]:
    found = []
    for doc in docs.values():
        if "template" in doc.get("spec", {}):
            spec = _pod_spec(doc)
            found += spec.get("initContainers", []) + spec["containers"]
    return found


def _compose() -> dict[str, Any]:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def _interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's ``${VAR}``, ``${VAR:-default}`` and ``${VAR:?error}`` with ``env``."""

    def one(match: re.Match[str]) -> str:
        name, op, word = match.group(1), match.group(2), match.group(3)
        if name in env:
            return env[name]
        if op == ":-":
            return word
        raise AssertionError(f"compose needs ${name} ({word or 'no default'}) in {value!r}")

    return re.sub(r"\$\{(\w+)(?:(:[-?])([^}]*))?\}", one, value)


def _dockerfile() -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` of docker/Dockerfile, continuation lines joined."""
    lines: list[str] = []
    pending = ""
    for raw in (DOCKER / "Dockerfile").read_text().splitlines():
        if raw.lstrip().startswith("#"):
            continue
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        lines.append(pending + raw)
        pending = ""
    out = []
    for line in lines:
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _final_stage() -> list[tuple[str, str]]:
    instructions = _dockerfile()
    last_from = max(i for i, (word, _) in enumerate(instructions) if word == "FROM")
    return instructions[last_from:]


# -- the real command line ---------------------------------------------------------------------


def _parse(argv: list[str]) -> argparse.Namespace:
    """Parse ``replaygpu ARGV`` as `replaygpu.cli.main` does, the learner's own flags included;
    a learner's flags also build its config (whose checks then run)."""
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra and not getattr(args, "pass_unknown", False):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        if args.command != "learner":
            return args
        from replaygpu.agents.configs import config_from_args
        from replaygpu.agents.distributed import learner_cli
        from replaygpu.agents.registry import algorithm, served

        options = extra + list(args.options)
        pre = argparse.ArgumentParser(add_help=False)
        pre.add_argument("--agent", default="dqn")
        pre.add_argument("--env", "--env-id", dest="env_id", default=None)
        known = pre.parse_known_args(options)[0]
        opts = _learner_parser(learner_cli, known.agent, known.env_id).parse_args(options)
        config_from_args(algorithm(served(known.agent, known.env_id)).config_class(), opts)
        return opts
    except SystemExit as err:
        pytest.fail(f"`replaygpu {' '.join(argv)}` does not parse (exit {err.code})")


def _learner_parser(module: Any, agent: str, env_id: str | None) -> argparse.ArgumentParser:
    if not hasattr(module, "learner_parser"):
        pytest.skip("replaygpu.agents.distributed.learner_cli has no learner_parser(agent) yet")
    return module.learner_parser(agent, env_id)


def _subcommands() -> set[str]:
    parser = build_parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(sub.choices)


def _require_subcommand(name: str) -> None:
    if name not in _subcommands():
        pytest.skip(f"the CLI has no `replaygpu {name}` subcommand yet")


def _flag(argv: list[str], flag: str) -> str:
    """The value of ``flag`` in ``argv`` (``--flag V`` or ``--flag=V``)."""
    for i, arg in enumerate(argv):
        if arg == flag:
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"{flag} missing from {argv}")


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


# -- Kubernetes ---------------------------------------------------------------------------------


def test_kustomization_lists_only_existing_files_and_every_manifest_in_the_folder():
    kustomization = _kustomization()
    assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    assert kustomization["kind"] == "Kustomization"
    listed = kustomization["resources"]
    missing = [name for name in listed if not (K8S / name).is_file()]
    assert not missing, f"kustomization.yaml lists files that do not exist: {missing}"
    manifests = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    # the example Secret stays out: `kubectl apply -k` would overwrite the real token with it
    assert set(listed) == manifests - {"secret.example.yaml"}
    assert "secret.example.yaml" in manifests


def test_every_k8s_document_has_api_version_kind_and_name():
    for path in K8S.glob("*.yaml"):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            assert doc is not None, f"{path.name}: an empty document"
            where = f"{path.name}: {doc.get('kind')}"
            assert isinstance(doc.get("apiVersion"), str) and doc["apiVersion"], where
            assert isinstance(doc.get("kind"), str) and doc["kind"], where
            assert isinstance(doc.get("metadata", {}).get("name"), str), where


def test_kustomize_image_name_is_the_one_every_container_uses():
    docs = _k8s_docs()
    images = {c["image"] for c in _all_containers(docs)}
    assert images == {entry["name"] for entry in _kustomization()["images"]} == {"replaygpu"}


def test_learner_is_one_statefulset_whose_claim_is_mounted_at_the_checkpoint_dir():
    docs = _k8s_docs()
    learner = docs[("StatefulSet", "replaygpu-learner")]
    assert learner["spec"]["replicas"] == 1
    claims = {t["metadata"]["name"]: t for t in learner["spec"]["volumeClaimTemplates"]}
    container = _container(learner, "learner")
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert set(claims) <= set(mounts), f"claims {set(claims)} not mounted (mounts {mounts})"
    ckpt_dir = _flag(container["args"], "--checkpoint-dir")
    assert ckpt_dir in {mounts[name] for name in claims}
    pod_volumes = {v["name"] for v in _pod_spec(learner).get("volumes", [])}
    assert set(mounts) <= set(claims) | pod_volumes, "a mount without a volume"
    for claim in claims.values():
        assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
        assert claim["spec"]["resources"]["requests"]["storage"]


def test_learner_probes_are_grpc_on_the_port_its_service_targets_and_it_binds():
    docs = _k8s_docs()
    learner = docs[("StatefulSet", "replaygpu-learner")]
    container = _container(learner, "learner")
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    service = docs[("Service", learner["spec"]["serviceName"])]
    by_name = {p["name"]: p for p in service["spec"]["ports"]}
    grpc_port = ports[by_name["grpc"]["targetPort"]]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"]["port"] == grpc_port, probe
        assert set(container[probe]) & {"httpGet", "tcpSocket", "exec"} == set(), probe
    # readiness: the append path (NOT_SERVING while a full disk refuses appends); liveness:
    # the whole server, which a full disk never fails (a restart would not free the disk)
    assert container["readinessProbe"]["grpc"]["service"] == "replaygpu.v1.ReplayService"
    assert container["livenessProbe"]["grpc"].get("service", "") == ""
    args = container["args"]
    assert _port(_flag(args, "--address")) == grpc_port
    assert _flag(args, "--address").startswith("0.0.0.0:"), "a pod must listen beyond loopback"
    assert int(_flag(args, "--metrics-port")) == ports[by_name["metrics"]["targetPort"]]
    pod_labels = learner["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert learner["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_pods_run_as_uid_10001_and_fsgroup_makes_the_checkpoint_volume_writable():
    docs = _k8s_docs()
    for name in ("replaygpu-learner", "replaygpu-actor"):
        context = _pod_spec(docs[("StatefulSet", name)])["securityContext"]
        assert context["runAsUser"] == IMAGE_UID, name
        assert context["runAsNonRoot"] is True, name
    learner = _pod_spec(docs[("StatefulSet", "replaygpu-learner")])["securityContext"]
    assert learner["fsGroup"] == IMAGE_UID
    for container in _all_containers(docs):
        assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_learner_grace_period_leaves_time_for_the_final_checkpoint():
    docs = _k8s_docs()
    learner = _pod_spec(docs[("StatefulSet", "replaygpu-learner")])
    actor = _pod_spec(docs[("StatefulSet", "replaygpu-actor")])
    assert learner["terminationGracePeriodSeconds"] >= 300
    assert actor["terminationGracePeriodSeconds"] >= 30


def test_every_token_comes_from_the_secret_that_the_example_shows():
    docs = _k8s_docs()
    example = yaml.safe_load((K8S / "secret.example.yaml").read_text())
    assert example["kind"] == "Secret"
    refs = []
    for container in _all_containers(docs):
        for env in container.get("env", []):
            if env["name"] == "REPLAYGPU_TOKEN":
                assert "value" not in env, f"{container['name']}: a token in plain text"
                refs.append(env["valueFrom"]["secretKeyRef"])
    workloads = [doc for doc in docs.values() if "template" in doc.get("spec", {})]
    assert len(refs) == len(workloads), "every learner and actor container needs the token"
    for ref in refs:
        assert ref["name"] == example["metadata"]["name"]
        assert ref["key"] in example["stringData"]
        assert ref.get("optional", False) is False


def test_actors_get_distinct_indices_from_their_ordinal_and_reach_the_learner_service():
    docs = _k8s_docs()
    actors = docs[("StatefulSet", "replaygpu-actor")]
    assert ("Service", actors["spec"]["serviceName"]) in docs
    assert actors["spec"]["podManagementPolicy"] == "Parallel"
    container = _container(actors, "actor")
    args = container["args"]
    env = {e["name"]: e for e in container["env"]}
    index_ref = env["ACTOR_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert index_ref == "metadata.labels['apps.kubernetes.io/pod-index']"
    assert _flag(args, "--actor-index") == "$(ACTOR_INDEX)"
    assert int(_flag(args, "--num-actors")) == actors["spec"]["replicas"]
    assert _flag(args, "--processes") == "1"
    learner_service = docs[("Service", "replaygpu-learner")]
    grpc = next(p for p in learner_service["spec"]["ports"] if p["name"] == "grpc")
    assert args[1] == f"replaygpu-learner:{grpc['port']}"
    (wait,) = _pod_spec(actors)["initContainers"]
    assert f"replaygpu health {args[1]}" in wait["args"][-1]


def test_k8s_command_lines_parse_with_the_cli():
    docs = _k8s_docs()
    learner = _container(docs[("StatefulSet", "replaygpu-learner")], "learner")
    actor = _container(docs[("StatefulSet", "replaygpu-actor")], "actor")
    (wait,) = _pod_spec(docs[("StatefulSet", "replaygpu-actor")])["initContainers"]
    health = wait["args"][-1].split(";")[0].removeprefix("until ").split()
    _require_subcommand("health")
    assert health[0] == "replaygpu"
    assert _parse(health[1:]).command == "health"
    actor_args = [a.replace("$(ACTOR_INDEX)", "7") for a in actor["args"]]
    assert _parse(actor_args).command == "actor"
    _require_subcommand("learner")
    opts = _parse(learner["args"])
    assert opts.checkpoint_dir == "/ckpt"


# -- compose ------------------------------------------------------------------------------------


def test_compose_actors_wait_for_a_healthy_learner_and_the_volumes_are_declared():
    compose = _compose()
    learner, actor = compose["services"]["learner"], compose["services"]["actor"]
    assert actor["depends_on"]["learner"]["condition"] == "service_healthy"
    test = learner["healthcheck"]["test"]
    assert test[:3] == ["CMD", "replaygpu", "health"]
    assert _port(test[3]) == _port(_flag(learner["command"], "--address"))
    assert actor["healthcheck"] == {"disable": True}
    declared = set(compose["volumes"])
    mounts = {}
    for service in (learner, actor):
        for volume in service["volumes"]:
            source, target = volume.split(":")[:2]
            assert source in declared, f"volume {source!r} is not declared at the top level"
            mounts[source] = target
    assert mounts["checkpoints"] == _flag(learner["command"], "--checkpoint-dir")
    assert mounts["actor-slots"] == actor["environment"]["REPLAYGPU_ACTOR_SLOTS"]
    assert learner["build"]["dockerfile"] == "docker/Dockerfile"
    assert (DOCKER / learner["build"]["context"] / learner["build"]["dockerfile"]).is_file()


def test_compose_gives_the_learner_a_stop_grace_period_and_requires_a_token():
    services = _compose()["services"]
    assert re.fullmatch(r"\d+m", services["learner"]["stop_grace_period"])
    assert int(services["learner"]["stop_grace_period"][:-1]) >= 2
    for name, service in services.items():
        token = service["environment"]["REPLAYGPU_TOKEN"]
        assert token.startswith("${REPLAYGPU_TOKEN:?"), f"{name}: the token must be required"
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"


def test_compose_command_lines_parse_with_the_cli():
    services = _compose()["services"]
    actor = [_interpolate(a, COMPOSE_ENV) for a in services["actor"]["command"]]
    assert _parse(actor).command == "actor"
    assert _flag(actor, "--processes") == "1"
    assert actor[1] == f"learner:{_port(_flag(services['learner']['command'], '--address'))}"
    _require_subcommand("health")
    assert _parse(services["learner"]["healthcheck"]["test"][2:]).command == "health"
    _require_subcommand("learner")
    learner = [_interpolate(a, COMPOSE_ENV) for a in services["learner"]["command"]]
    assert _parse(learner).checkpoint_dir == "/ckpt"


def _env_example() -> dict[str, str]:
    """``NAME -> value`` of docker/.env.example (comments and blank lines aside)."""
    lines = (DOCKER / ".env.example").read_text().splitlines()
    pairs = [line.split("=", 1) for line in lines if line.strip() and not line.startswith("#")]
    return {name.strip(): value.strip() for name, value in pairs}


def _shell_blocks(doc: Path) -> list[str]:
    """The shell blocks of a Markdown file, or of every page of a folder of them."""
    pages = sorted(doc.glob("*.md")) if doc.is_dir() else [doc]
    text = "\n".join(page.read_text(encoding="utf-8") for page in pages)
    return re.findall(r"```(?:bash|sh)\n(.*?)\n```", text, re.S)


#: the documents that tell how to deploy: the docs site's deployment pages, the image's README
DEPLOY_DOCS = (ROOT / "docs" / "deployment", DOCKER / "README.md")


def test_compose_reads_its_settings_from_docker_env_whose_example_lists_each_one():
    text = (DOCKER / "compose.yaml").read_text()
    example = _env_example()
    assert set(example) == set(re.findall(r"\$\{(\w+)", text)), "compose.yaml vs .env.example"
    for name, default in re.findall(r"\$\{(\w+):-([^}]*)\}", text):
        assert example[name] == default, f"{name}: the example shows {example[name]!r}"
    assert example["REPLAYGPU_TOKEN"] == "", "the example must not carry a token"
    # compose reads .env from the compose file's folder; the real one never goes into git
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert "docker/.env" in ignored and "docker/.env.example" not in ignored
    env = {**example, **COMPOSE_ENV}
    learner = [_interpolate(a, env) for a in _compose()["services"]["learner"]["command"]]
    assert _parse(learner).checkpoint_dir == "/ckpt"


def test_docs_put_the_compose_token_in_docker_env():
    for doc in DEPLOY_DOCS:
        blocks = [b for b in _shell_blocks(doc) if "docker compose" in b]
        assert blocks, f"{doc.name}: no compose instructions"
        for block in blocks:
            assert "docker/.env" in block, f"{doc.name}: the token goes in docker/.env:\n{block}"
            assert not re.search(r"REPLAYGPU_TOKEN=\S+ docker compose", block), block


def test_docs_build_and_ship_the_image_before_applying_the_kustomization():
    name = _kustomization()["images"][0]["name"]
    for doc in DEPLOY_DOCS:
        (block,) = [b for b in _shell_blocks(doc) if "kubectl apply -k docker/k8s" in b]
        image = re.search(rf"kustomize edit set image {name}=(\S+)\)?", block)
        assert image, f"{doc.name}: the Kubernetes steps do not point the kustomization at an image"
        tag = image.group(1).rstrip(")")
        # a tag of its own: Kubernetes always pulls :latest, which a kind-loaded image is not in
        assert ":" in tag.rsplit("/", 1)[-1] and not tag.endswith(":latest"), tag
        shipped = [block.find(f"{how} {tag}") for how in ("docker push", "kind load docker-image")]
        assert max(shipped) >= 0, f"{doc.name}: the image is neither pushed nor loaded"
        steps = [
            block.index(f"docker build -f docker/Dockerfile -t {tag} "),
            min(i for i in shipped if i >= 0),
            image.start(),
            block.index("kubectl apply -k docker/k8s"),
        ]
        assert steps == sorted(steps), f"{doc.name}: build, push or load, set image, apply"


# -- Dockerfile, .dockerignore ----------------------------------------------------------------


def test_dockerfile_runs_the_entrypoint_as_uid_10001_and_its_commands_exist():
    final = _final_stage()
    words = dict(final)
    assert words["USER"].split(":")[0] == str(IMAGE_UID)
    assert words["STOPSIGNAL"] == "SIGTERM"
    entrypoint = json.loads(words["ENTRYPOINT"])
    copies = [rest.split() for word, rest in final if word == "COPY"]
    assert ["docker/entrypoint.sh", f"/usr/local/bin/{entrypoint[0]}"] in copies
    cmd = json.loads(words["CMD"])
    assert cmd[0] in _subcommands()
    exposed = {int(p) for p in words["EXPOSE"].split()}
    assert _port(_flag(cmd, "--address")) in exposed
    assert int(_flag(cmd, "--metrics-port")) in exposed
    ckpt = _flag(cmd, "--checkpoint-dir")
    base_setup = next(rest for word, rest in _dockerfile() if word == "RUN" and "useradd" in rest)
    assert (
        f"mkdir -p {ckpt}" in base_setup and f"chown {IMAGE_UID}:{IMAGE_UID} {ckpt}" in base_setup
    )
    health = json.loads(words["HEALTHCHECK"].split(" CMD ", 1)[1])
    assert health[:2] == ["replaygpu", "health"]
    assert _port(health[2]) == _port(_flag(cmd, "--address"))
    _require_subcommand("health")
    assert _parse(health[1:]).command == "health"
    _require_subcommand(cmd[0])
    assert _parse(cmd).checkpoint_dir == "/ckpt"


def test_dockerfile_installs_an_extra_of_pyproject_from_the_files_it_copies():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = project["project"]["optional-dependencies"]
    instructions = _dockerfile()
    args = dict(rest.split("=", 1) for word, rest in instructions if word == "ARG" and "=" in rest)
    assert args["TF_EXTRA"] in extras
    assert args["BASE"]
    assert any(word == "RUN" and "cpu|gpu)" in rest for word, rest in instructions)
    assert {"cpu", "gpu"} <= set(extras)
    for extra in ("cpu", "gpu"):  # installed with pip -r: a self-reference would go to PyPI
        requirements = project["project"]["dependencies"] + extras[extra]
        assert not [r for r in requirements if re.match(r"replaygpu\b", r)], extra
    copied = {rest.split()[0] for word, rest in instructions if word == "COPY" and "--" not in rest}
    setuptools = project["tool"]["setuptools"]
    package_dirs = {
        setuptools.get("package-dir", {}).get(name, name.replace(".", "/")).split("/")[0]
        for name in setuptools["packages"]
    }
    needed = {"pyproject.toml", project["project"]["readme"], *package_dirs}
    assert needed <= copied, f"the image build misses {needed - copied}"


def _ignored(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore's ``patterns`` drop ``path`` or a folder holding it (a subset of
    the syntax: globs, ``**/`` prefixes, ``!`` exceptions)."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for pattern in patterns:
        keep = pattern.startswith("!")
        glob = pattern.lstrip("!").strip("/")
        names = [glob, glob.removeprefix("**/")] if glob.startswith("**/") else [glob]
        hit = any(
            fnmatch(prefix, name) or (name != glob and fnmatch(prefix.split("/")[-1], name))
            for prefix in prefixes
            for name in names
        )
        if hit:
            ignored = not keep
    return ignored


def test_dockerignore_keeps_what_the_image_copies_and_drops_local_state():
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    copied = [
        rest.split()[0] for word, rest in _dockerfile() if word == "COPY" and "--" not in rest
    ]
    for path in [*copied, "replaygpu/cli.py", "replaygpu/v1/replay_pb2.py", "agents/dqn/agent.py"]:
        assert not _ignored(path, patterns), f".dockerignore drops {path}, which the image needs"
    for path in [
        ".git",
        ".venv",
        "runs",
        "tests",
        "benchmarks",
        "replaygpu.egg-info",
        "replaygpu/__pycache__",
        ".ruff_cache",
        ".pytest_cache",
        "docker/.env",
    ]:
        assert _ignored(path, patterns), f".dockerignore lets {path} into the build context"


# -- the entrypoint script ----------------------------------------------------------------------

needs_posix_tools = pytest.mark.skipif(
    sys.platform != "linux" or not all(shutil.which(t) for t in ("sh", "flock", "stat")),
    reason="the entrypoint needs a Linux sh, flock and stat",
)


def _stub_replaygpu(tmp_path: Path, body: str = "") -> dict[str, str]:
    """An environment whose PATH starts with a fake `replaygpu` that prints its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "replaygpu"
    stub.write_text(f'#!/bin/sh\necho "replaygpu $*"\n{body}\n')
    stub.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "REPLAYGPU_ACTOR_SLOTS"}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    return env


def _entrypoint(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", str(ENTRYPOINT), *args], env=env, capture_output=True, text=True, timeout=30
    )


def test_entrypoint_routes_only_subcommands_that_exist():
    script = ENTRYPOINT.read_text()
    (line,) = re.findall(r"^\s*-\* \| ([\w |]+)\) ;;$", script, flags=re.MULTILINE)
    routed = {name.strip() for name in line.split("|")}
    (noted,) = re.findall(r"^\s*([\w |]+)\) subcommand=", script, flags=re.MULTILINE)
    assert {name.strip() for name in noted.split("|")} == routed
    assert {"learner", "actor", "serve", "health"} <= routed
    missing = routed - _subcommands()
    if missing <= {"learner", "health"} and missing:
        pytest.skip(f"the CLI has no {sorted(missing)} subcommand yet")
    assert not missing, f"the entrypoint routes {sorted(missing)}, which the CLI lacks"


@needs_posix_tools
def test_entrypoint_passes_commands_to_replaygpu_and_runs_other_programs_as_is(tmp_path):
    env = _stub_replaygpu(tmp_path)
    ckpt = tmp_path / "ckpt"
    done = _entrypoint("serve", "--env", "CartPole-v1", "--checkpoint-dir", str(ckpt), env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"replaygpu serve --env CartPole-v1 --checkpoint-dir {ckpt}\n"
    assert ckpt.is_dir() and not list(ckpt.iterdir()), "the write check left a file behind"
    assert _entrypoint("replaygpu", "--version", env=env).stdout == "replaygpu --version\n"
    assert _entrypoint("sh", "-c", "echo as-is", env=env).stdout == "as-is\n"


@needs_posix_tools
@pytest.mark.parametrize("form", ["separate", "equals"])
def test_entrypoint_refuses_an_unwritable_checkpoint_dir_in_one_line_and_exits_2(tmp_path, form):
    env = _stub_replaygpu(tmp_path)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    bad = str(blocker / "ckpt")  # under a regular file: not creatable, even by root
    flags = ["--checkpoint-dir", bad] if form == "separate" else [f"--checkpoint-dir={bad}"]
    done = _entrypoint("learner", "--agent", "dqn", *flags, env=env)
    assert done.returncode == 2
    assert done.stdout == "", "replaygpu must not start"
    (line,) = done.stderr.splitlines()
    uid, gid = os.getuid(), os.getgid()
    assert f"--checkpoint-dir {bad} is not writable by uid {uid} gid {gid}" in line
    for fix in (
        f"chown -R {uid}:{gid}",
        "--user $(id -u):$(id -g)",
        "--userns=keep-id",
        f"fsGroup: {gid}",
    ):
        assert fix in line


@needs_posix_tools
@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes anywhere")
def test_entrypoint_names_the_owner_of_a_read_only_checkpoint_dir(tmp_path):
    env = _stub_replaygpu(tmp_path)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir(mode=0o555)
    done = _entrypoint("serve", "--journal-dir", str(ckpt), env=env)
    assert done.returncode == 2
    assert f"owned by uid {os.getuid()}" in done.stderr and "mode 555" in done.stderr


@needs_posix_tools
def test_entrypoint_gives_actor_replicas_distinct_indices_and_refuses_one_too_many(tmp_path):
    release = tmp_path / "release"
    env = _stub_replaygpu(tmp_path, f'while [ ! -e "{release}" ]; do sleep 0.05; done')
    env["REPLAYGPU_ACTOR_SLOTS"] = str(tmp_path / "slots")
    argv = ["sh", str(ENTRYPOINT), "actor", "learner:50051", "--num-actors", "2"]
    holders = []
    try:
        for _ in range(2):
            holders.append(
                subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            )
            deadline = time.monotonic() + 10
            while len(list((tmp_path / "slots").glob("*.lock"))) < len(holders):
                assert time.monotonic() < deadline, "the replica claimed no slot"
                time.sleep(0.05)
        third = _entrypoint(*argv[2:], env=env)
        assert third.returncode == 2
        assert "all 2 actor indices" in third.stderr and third.stdout == ""
    finally:
        release.write_text("")
        outputs = [p.communicate(timeout=10)[0].decode() for p in holders]
    assert sorted(outputs) == [
        "replaygpu actor learner:50051 --num-actors 2 --actor-index 0 --processes 1\n",
        "replaygpu actor learner:50051 --num-actors 2 --actor-index 1 --processes 1\n",
    ]
    # a stopped replica frees its index for the next one
    again = _entrypoint(*argv[2:], env=env)
    assert again.returncode == 0 and "--actor-index 0 " in again.stdout


@needs_posix_tools
def test_entrypoint_claims_an_index_when_global_options_come_first(tmp_path):
    env = _stub_replaygpu(tmp_path)
    env["REPLAYGPU_ACTOR_SLOTS"] = str(tmp_path / "slots")
    done = _entrypoint("--log-level", "DEBUG", "actor", "l:1", "--num-actors", "3", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        "replaygpu --log-level DEBUG actor l:1 --num-actors 3 --actor-index 0 --processes 1\n"
    )


@needs_posix_tools
def test_entrypoint_leaves_an_explicit_actor_index_alone(tmp_path):
    env = _stub_replaygpu(tmp_path)
    env["REPLAYGPU_ACTOR_SLOTS"] = str(tmp_path / "slots")
    done = _entrypoint("actor", "l:1", "--num-actors", "4", "--actor-index", "3", env=env)
    assert done.stdout == "replaygpu actor l:1 --num-actors 4 --actor-index 3\n"
    assert not (tmp_path / "slots").exists()
    refused = _entrypoint("actor", "l:1", "--num-actors", "4", "--processes", "2", env=env)
    assert refused.returncode == 2 and "--processes 1" in refused.stderr
