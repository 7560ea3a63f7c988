"""The chart's tests: render it with helm and assert on the manifests (issue 31: a chart
safe by default). Run by deploy/check.sh after the tools are built:

    python deploy/helm/ci/chart_test.py --helm build/deploy-tools/bin/helm

Each test renders the chart for some values and checks what a cluster would be given:
egress only to named peers, an Ingress that publishes the APIs alone, bounded scratch
space, TLS to Kafka and PostgreSQL unless opted out, the refusals that keep an
unsafe value from rendering at all, and the durability ledger's one scraped pod.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "deploy/helm/gristmill"
FULL = REPO / "deploy/helm/ci/full.yaml"
K8S_VERSION = "1.31.0"
WORKLOADS = ("Deployment", "Job")
# Routes that must stay inside the cluster unless opted in (api.ingress.extraPaths).
PRIVATE = ("/", "/metrics", "/docs", "/redoc", "/openapi.json", "/dashboard", "/healthz")

HELM = "helm"
TESTS: list[Callable[[], None]] = []


def test(fn: Callable[[], None]) -> Callable[[], None]:
    TESTS.append(fn)
    return fn


class RenderError(Exception):
    pass


def render(*files: Path, **sets: str) -> list[dict[str, Any]]:
    """The chart's objects for these value files and ``--set`` values."""
    args = [HELM, "template", "gristmill", str(CHART), "--namespace", "gristmill"]
    args += ["--kube-version", K8S_VERSION]
    for f in files:
        args += ["-f", str(f)]
    for k, v in sets.items():
        args += ["--set-json", f"{k.replace('__', '.')}={v}"]
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        raise RenderError(r.stderr)
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def values_file(text: str) -> Path:
    f = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)  # noqa: SIM115
    f.write(text)
    f.close()
    return Path(f.name)


def refused(*files: Path, **sets: str) -> str:
    try:
        render(*files, **sets)
    except RenderError as exc:
        return str(exc)
    raise AssertionError(f"rendered, but should be refused: {files} {sets}")


def of_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def named(objs: list[dict[str, Any]], kind: str, suffix: str) -> dict[str, Any]:
    (o,) = [o for o in of_kind(objs, kind) if o["metadata"]["name"].endswith(suffix)]
    return o


def pod_specs(objs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for o in objs:
        if o["kind"] in WORKLOADS:
            yield o["metadata"]["name"], o["spec"]["template"]["spec"]


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "<from secret>") for e in container.get("env", [])}


def containers(objs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for name, spec in pod_specs(objs):
        for c in spec["containers"]:
            yield f"{name}/{c['name']}", c


def quantity(q: str | int) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
    s = str(q)
    for u, m in units.items():
        if s.endswith(u):
            return int(s[: -len(u)]) * m
    return int(s)


# ---- egress --------------------------------------------------------------------------
def egress_rules(objs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (p["metadata"]["name"], rule)
        for p in of_kind(objs, "NetworkPolicy")
        for rule in p["spec"].get("egress", [])
    ]


@test
def every_egress_rule_names_its_peers() -> None:
    for objs in (render(), render(FULL), strimzi_cnpg()):
        for name, rule in egress_rules(objs):
            assert rule.get("to"), f"{name}: an egress rule without peers reaches every address"
            assert rule.get("ports"), f"{name}: an egress rule without ports"
            for peer in rule["to"]:
                block = peer.get("ipBlock")
                if block and block["cidr"] in ("0.0.0.0/0", "::/0"):
                    # Only the webhook rule may name the internet, and only without
                    # the private ranges (full.yaml's example).
                    assert name.endswith("-api") and block.get("except"), (name, block)


@test
def by_default_pods_reach_dns_kafka_and_postgres_only() -> None:
    objs = render()
    ports = sorted(p["port"] for _, r in egress_rules(objs) for p in r["ports"])
    assert ports == [53, 53, 5432, 9093], ports
    policies = {p["metadata"]["name"]: p["spec"] for p in of_kind(objs, "NetworkPolicy")}
    api = policies["gristmill-api"]
    assert "Egress" not in api["policyTypes"] and "egress" not in api, api
    for spec in policies.values():
        assert spec["policyTypes"][0] == "Ingress"
    common = policies["gristmill"]
    kafka_rule, pg_rule = common["egress"][1], common["egress"][2]
    assert kafka_rule["to"] == [
        {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "kafka"}}}
    ]
    assert pg_rule["to"] == [
        {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "postgresql"}}}
    ]


@test
def webhooks_leave_only_to_the_listed_peers() -> None:
    api = named(render(FULL), "NetworkPolicy", "-api")["spec"]
    assert api["policyTypes"] == ["Ingress", "Egress"]
    (rule,) = api["egress"]
    assert [p["port"] for p in rule["ports"]] == [443]
    assert rule["to"][0]["ipBlock"]["except"][0] == "10.0.0.0/8"
    own = render(webhooks__egressPeers='[{"ipBlock": {"cidr": "198.51.100.0/24"}}]')
    (rule,) = named(own, "NetworkPolicy", "-api")["spec"]["egress"]
    assert rule["to"] == [{"ipBlock": {"cidr": "198.51.100.0/24"}}]


@test
def operators_bring_their_own_peers_and_nothing_else() -> None:
    common = named(strimzi_cnpg(), "NetworkPolicy", "gristmill")["spec"]
    kafka_rule, pg_rule = common["egress"][1], common["egress"][2]
    assert kafka_rule["to"] == [
        {
            "podSelector": {
                "matchLabels": {"strimzi.io/cluster": "kafka", "strimzi.io/kind": "Kafka"}
            }
        }
    ]
    assert pg_rule["to"] == [{"podSelector": {"matchLabels": {"cnpg.io/cluster": "postgres"}}}]


@test
def no_peers_is_refused_not_opened() -> None:
    assert "kafka.networkPeers is empty" in refused(kafka__networkPeers="[]")
    assert "postgres.networkPeers is empty" in refused(postgres__networkPeers="[]")


# ---- the Ingress ---------------------------------------------------------------------
def ingress_paths(objs: list[dict[str, Any]]) -> list[str]:
    (ing,) = of_kind(objs, "Ingress")
    return [p["path"] for rule in ing["spec"]["rules"] for p in rule["http"]["paths"]]


@test
def the_ingress_publishes_the_apis_alone() -> None:
    paths = ingress_paths(render(FULL))
    assert paths == ["/v1", "/v2"], paths
    for p in PRIVATE:
        assert not any(p == q or (q != "/" and p.startswith(q + "/")) for q in paths), p
    assert not of_kind(render(), "Ingress"), "the Ingress is off by default"


@test
def the_dashboard_is_published_only_when_asked() -> None:
    paths = ingress_paths(render(FULL, api__ingress__extraPaths='["/dashboard"]'))
    assert paths == ["/v1", "/v2", "/dashboard"], paths


@test
def publishing_everything_is_refused() -> None:
    assert "is not a path prefix below /" in refused(FULL, api__ingress__paths='["/"]')
    assert "is not a path prefix below /" in refused(FULL, api__ingress__extraPaths='["metrics"]')


# ---- scratch space -------------------------------------------------------------------
@test
def every_scratch_volume_is_bounded() -> None:
    for objs in (render(), render(FULL), strimzi_cnpg()):
        for name, spec in pod_specs(objs):
            for v in spec["volumes"]:
                if "emptyDir" in v and v["name"] in ("tmp", "home"):
                    assert v["emptyDir"].get("sizeLimit"), f"{name}: {v['name']} unbounded"


@test
def the_api_scratch_holds_what_it_may_stage_and_the_api_knows_the_caps() -> None:
    for processes, uploads, max_bytes in ((2, 2, 1 << 30), (3, 1, 100 << 20)):
        objs = render(
            api__processes=str(processes),
            api__uploads__maxConcurrent=str(uploads),
            api__uploads__maxBytes=str(max_bytes),
            api__uploads__maxItems="100000",
        )
        spec = dict(pod_specs(objs))["gristmill-api"]
        (tmp,) = [v for v in spec["volumes"] if v["name"] == "tmp"]
        limit = quantity(tmp["emptyDir"]["sizeLimit"])
        staged = processes * uploads * (2 * max_bytes + 100_000 * 100)
        assert staged < limit <= staged + (256 << 20), (limit, staged)
        env = env_of(spec["containers"][0])
        assert env["GRISTMILL_MAX_UPLOADS"] == str(uploads)
        assert env["GRISTMILL_MAX_JOB_BYTES"] == str(max_bytes)
        assert env["GRISTMILL_MAX_JOB_ITEMS"] == "100000"
        assert int(env["GRISTMILL_MAX_UPLOADS_PER_TENANT"]) <= uploads
        assert int(env["GRISTMILL_MAX_JOB_JSON_BYTES"]) <= max_bytes
        mounts = {m["name"]: m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
        assert mounts["tmp"] == "/tmp"  # where uploads are staged (upload_dir "")


# ---- TLS -----------------------------------------------------------------------------
@test
def tls_to_kafka_and_postgres_by_default() -> None:
    for objs in (render(), strimzi_cnpg()):
        for name, c in containers(objs):
            env = env_of(c)
            assert env["PGSSLMODE"] == "verify-full", (name, env["PGSSLMODE"])
            assert env["PGSSLROOTCERT"].startswith("/etc/gristmill/postgres-ca/"), name
            assert env["GRISTMILL_KAFKA_SECURITY_PROTOCOL"] in ("SSL", "SASL_SSL"), name
            assert env["GRISTMILL_KAFKA_SSL_CA_LOCATION"].startswith("/etc/gristmill/kafka-ca/")
    spec = dict(pod_specs(render()))["gristmill-api"]
    secrets = {v["name"]: v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v}
    assert secrets == {"postgres-ca": "gristmill-postgres-ca", "kafka-ca": "gristmill-kafka-ca"}
    cnpg = dict(pod_specs(strimzi_cnpg()))["gristmill-api"]
    secrets = {v["name"]: v["secret"]["secretName"] for v in cnpg["volumes"] if "secret" in v}
    assert secrets == {"postgres-ca": "postgres-ca", "kafka-ca": "kafka-cluster-ca-cert"}


@test
def opting_out_of_tls_is_explicit() -> None:
    objs = render(
        kafka__securityProtocol='"PLAINTEXT"',
        postgres__sslmode='"disable"',
        postgres__caSecret='""',
    )
    for _, c in containers(objs):
        env = env_of(c)
        assert env["GRISTMILL_KAFKA_SECURITY_PROTOCOL"] == "PLAINTEXT"
        assert env["PGSSLMODE"] == "disable"
        assert "GRISTMILL_KAFKA_SSL_CA_LOCATION" not in env and "PGSSLROOTCERT" not in env
    text = notes(
        kafka__securityProtocol='"SASL_PLAINTEXT"',
        kafka__sasl__username='"u"',
        postgres__sslmode='"prefer"',
        postgres__caSecret='""',
    )
    assert "kafka.securityProtocol is SASL_PLAINTEXT: requests, outputs and\nthe SASL" in text
    assert "postgres.sslmode is prefer: connections to PostgreSQL may" in text
    text = notes(postgres__sslmode='"require"', postgres__caSecret='""')
    assert "require without postgres.caSecret" in text and "kafka.securityProtocol" not in text
    assert "WARNING" not in notes(), "the defaults warn about nothing"


@test
def verification_without_a_ca_is_refused() -> None:
    assert "needs the server's CA" in refused(postgres__caSecret='""')


def notes(**sets: str) -> str:
    """The install notes (NOTES.txt) for these values: ``helm template`` leaves them out,
    so a copy of the chart renders them as an object's field."""
    with tempfile.TemporaryDirectory() as d:
        chart = Path(d) / "gristmill"
        shutil.copytree(CHART, chart)
        shutil.copy(chart / "templates/NOTES.txt", chart / "notes.txt")
        (chart / "templates/zz-notes.yaml").write_text(
            'kind: Notes\ntext: {{ tpl (.Files.Get "notes.txt") . | toJson }}\n'
        )
        args = [HELM, "template", "gristmill", str(chart), "--kube-version", K8S_VERSION]
        args += ["--show-only", "templates/zz-notes.yaml"]
        for k, v in sets.items():
            args += ["--set-json", f"{k.replace('__', '.')}={v}"]
        r = subprocess.run(args, capture_output=True, text=True, check=True)
    return str(yaml.safe_load(r.stdout)["text"])


@test
def a_gpu_pod_has_the_hosts_shape() -> None:
    """Decision 51: six schedulers a GPU, each serving the model; one worker that dials
    a restarted scheduler again; every process (the migration included) at the GPU's
    batch limit."""
    objs = render(FULL)
    gpu = named(objs, "Deployment", "-gpu")["spec"]["template"]["spec"]["containers"]
    schedulers = [c for c in gpu if c["name"].startswith("scheduler-")]
    (worker,) = [c for c in gpu if c["name"] == "worker"]
    assert len(schedulers) == 6
    assert all("--models" in c["args"] for c in schedulers)
    assert "--redial" in worker["args"]
    assert worker["args"].count("--socket") == 6
    for name, c in containers(objs):
        assert env_of(c).get("GRISTMILL_EMBED_MAX_BATCH") == "1024", name
    cpu_only = render()  # no GPU pods: the CPU's own batch limit stays
    assert all("GRISTMILL_EMBED_MAX_BATCH" not in env_of(c) for _, c in containers(cpu_only))


# ---- the durability ledger -----------------------------------------------------------
def matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


@test
def the_ledger_runs_once_and_is_scraped() -> None:
    """Decision 54: one `gristmill ledger run` pod, its metrics port open to Prometheus
    (annotations and the common policy's metricsFrom), Kafka and PostgreSQL reached as
    every other pod's, with the chart's connection settings."""
    objs = render(FULL)
    ledger = named(objs, "Deployment", "-ledger")
    assert ledger["spec"]["replicas"] == 1
    pod = ledger["spec"]["template"]
    (c,) = pod["spec"]["containers"]
    assert c["args"] == ["ledger", "run"], c["args"]
    assert c["ports"] == [{"name": "metrics", "containerPort": 9465, "protocol": "TCP"}]
    env = env_of(c)
    assert env["GRISTMILL_LEDGER_METRICS_PORT"] == "9465"
    assert env["GRISTMILL_METRICS_HOST"] == "0.0.0.0"  # reachable from Prometheus
    scheduler = env_of(
        named(objs, "Deployment", "-scheduler")["spec"]["template"]["spec"]["containers"][0]
    )
    for name in (
        "KAFKA_BOOTSTRAP",
        "DATABASE_URL",
        "GRISTMILL_CONSUMER_GROUP",
        "GRISTMILL_TOPIC_PREFIX",
        "GRISTMILL_KAFKA_SASL_PASSWORD",
        "GRISTMILL_KAFKA_SSL_CA_LOCATION",
        "PGSSLROOTCERT",
    ):
        assert env[name] == scheduler[name], name
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "9465"
    assert c["livenessProbe"]["httpGet"] == {"path": "/metrics", "port": "metrics"}
    assert c["resources"]["limits"]["memory"], "the ledger's memory is bounded"
    common = named(objs, "NetworkPolicy", "gristmill")["spec"]
    assert matches(common["podSelector"], pod["metadata"]["labels"])
    (scrape,) = common["ingress"]
    assert scrape["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "monitoring"
    }
    moved = render(metrics__ledgerPort="9999", ledger__resources='{"limits": {"memory": "3Gi"}}')
    c = named(moved, "Deployment", "-ledger")["spec"]["template"]["spec"]["containers"][0]
    assert env_of(c)["GRISTMILL_LEDGER_METRICS_PORT"] == "9999"
    assert c["ports"][0]["containerPort"] == 9999
    assert c["resources"]["limits"] == {"memory": "3Gi"}


@test
def the_strimzi_user_may_read_as_the_ledger() -> None:
    """The ledger's group is <consumerGroup>.ledger: inside the user's group prefix ACL."""
    objs = strimzi_cnpg()
    (user,) = of_kind(objs, "KafkaUser")
    groups = [a for a in user["spec"]["authorization"]["acls"] if a["resource"]["type"] == "group"]
    ledger_env = env_of(
        named(objs, "Deployment", "-ledger")["spec"]["template"]["spec"]["containers"][0]
    )
    group = ledger_env["GRISTMILL_CONSUMER_GROUP"] + ".ledger"
    assert any(
        a["resource"]["patternType"] == "prefix"
        and group.startswith(a["resource"]["name"])
        and "Read" in a["operations"]
        for a in groups
    ), groups


@test
def the_ledger_is_absent_when_disabled() -> None:
    objs = render(ledger__enabled="false")
    assert not [o for o in of_kind(objs, "Deployment") if o["metadata"]["name"].endswith("-ledger")]
    assert named(objs, "Deployment", "-scheduler"), "only the ledger goes"


def strimzi_cnpg() -> list[dict[str, Any]]:
    return render(CHART / "values-strimzi.yaml", CHART / "values-cnpg.yaml")


def main() -> int:
    global HELM
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--helm", default="helm")
    HELM = ap.parse_args().helm
    failed = 0
    for t in TESTS:
        try:
            t()
            print(f"ok    {t.__name__}")
        except Exception:
            failed += 1
            print(f"FAIL  {t.__name__}\n{traceback.format_exc()}")
    print(f"chart: {len(TESTS) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
