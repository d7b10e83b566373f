"""Observability in the chart: the PodMonitor, the PrometheusRule and the Grafana dashboard
ConfigMap are rendered from the chart's own files (one copy, no loose duplicates), the alert
rules pass their promtool unit tests (tests/deploy/promtool/; promtool from Debian's
``prometheus`` package, fetched and cached like helm), and the log-shipping sidecar sees
Ray's logs in every Ray pod."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO
from tests.deploy import chart_check
from tests.deploy.chart_check import CHART, render
from tests.deploy.test_helm import by_kind, head_and_groups

PROMTOOL_TESTS = Path(__file__).parent / "promtool" / "mmpipe-rules.test.yaml"
RULES = CHART / "files" / "mmpipe-rules.yaml"
DASHBOARD = CHART / "files" / "mmpipe-dashboard.json"
OBSERVABILITY = CHART / "ci" / "observability-values.yaml"
ALL_ON = ("monitoring.podMonitor.enabled=true", "monitoring.prometheusRule.enabled=true",
          "monitoring.grafanaDashboard.enabled=true")
UNREACHABLE = re.compile(r"Could not resolve|Temporary failure|Failed to fetch|Could not connect|"
                         r"Connection (timed out|refused)|Network is unreachable", re.IGNORECASE)


def promtool_binary(cache_dir: Path) -> Path:
    """``promtool`` from Debian's ``prometheus`` package, extracted once into ``cache_dir``.

    ``MMPIPE_PROMTOOL`` names another binary. Otherwise ``apt-get download prometheus`` (apt
    checks the .deb against the signed archive index) and ``dpkg-deb -x``; when apt has no
    package lists, they are fetched into ``cache_dir`` first (no root needed). Skips the test
    only when there is no apt or the Debian archive cannot be reached.
    """
    if os.environ.get("MMPIPE_PROMTOOL"):
        return Path(os.environ["MMPIPE_PROMTOOL"])
    target = cache_dir / "promtool-debian" / "promtool"
    with chart_check.extract_lock(cache_dir, "promtool"):
        if not target.exists():
            _download_promtool(cache_dir, target)
    return target


def _download_promtool(cache_dir: Path, target: Path) -> None:
    """``apt-get download prometheus`` and ``dpkg-deb -x`` its promtool to ``target``."""
    if not (shutil.which("apt-get") and shutil.which("dpkg-deb")):
        pytest.skip("promtool comes from Debian's prometheus package: no apt-get/dpkg-deb here "
                    "(or set MMPIPE_PROMTOOL)")
    work = cache_dir / "promtool-download"
    shutil.rmtree(work, ignore_errors=True)
    (work / "lists" / "partial").mkdir(parents=True)

    def apt(*args: str, private: bool = False) -> subprocess.CompletedProcess:
        opts = ["-o", f"Dir::State::Lists={work / 'lists'}", "-o",
                f"Dir::Cache={work / 'cache'}"] if private else []
        done = subprocess.run(["apt-get", "-q", *opts, *args], cwd=work, capture_output=True,
                              text=True, timeout=300, check=False)
        if done.returncode != 0 and UNREACHABLE.search(done.stdout + done.stderr):
            pytest.skip(f"the Debian archive is unreachable: {done.stderr.strip()[-300:]}")
        return done

    done = apt("download", "prometheus")
    if done.returncode != 0:                       # no package lists: fetch them privately
        (work / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
        update = apt("update", private=True)
        assert update.returncode == 0, update.stderr
        done = apt("download", "prometheus", private=True)
    assert done.returncode == 0, done.stderr
    (deb,) = work.glob("prometheus_*.deb")
    extract = work / "extract"
    subprocess.run(["dpkg-deb", "-x", str(deb), str(extract)], check=True, timeout=120)
    target.parent.mkdir(parents=True, exist_ok=True)
    (extract / "usr" / "bin" / "promtool").replace(target)
    shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="session")
def helm_bin(pytestconfig) -> Path:
    return chart_check.helm_binary(pytestconfig.cache.mkdir("mmpipe-tools"))


@pytest.fixture(scope="session")
def promtool(pytestconfig) -> Path:
    binary = promtool_binary(pytestconfig.cache.mkdir("mmpipe-tools"))
    done = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0 and "promtool" in done.stdout + done.stderr
    return binary


def kind_of(objects: list[dict], kind: str) -> dict:
    (obj,) = [o for o in objects if o["kind"] == kind]
    return obj


def rule_file_groups() -> list[dict]:
    return yaml.safe_load(RULES.read_text())["groups"]


def test_alert_rules_pass_their_promtool_unit_tests(helm_bin, promtool, tmp_path):
    """The rendered PrometheusRule's groups, checked and unit-tested by promtool: among them
    "progress stalled" fires exactly 30 minutes after the start of a run that commits nothing
    (not at 15 or 29: the old rule fired at 15) and 30 after the last commit, and a run's
    first failed partition (a counter series that appears at 1) fires MmpipePartitionsFailed."""
    rule = kind_of(render(helm_bin, None, *ALL_ON), "PrometheusRule")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    shutil.copy(PROMTOOL_TESTS, tmp_path / "rules.test.yaml")
    check = subprocess.run([str(promtool), "check", "rules", "rules.yaml"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=120, check=False)
    assert check.returncode == 0 and "SUCCESS: 5 rules found" in check.stdout, check
    done = subprocess.run([str(promtool), "test", "rules", "rules.test.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr
    tested = yaml.safe_load(PROMTOOL_TESTS.read_text())["tests"]
    alerts = {t["alertname"] for case in tested for t in case["alert_rule_test"]}
    assert alerts == {r["alert"] for g in rule_file_groups() for r in g["rules"]}


def test_progress_stalled_has_its_window_in_the_expression():
    (stalled,) = [r for g in rule_file_groups() for r in g["rules"]
                  if r["alert"] == "MmpipeProgressStalled"]
    assert "for" not in stalled                      # `for` would add to the 30 minutes
    assert "ray_mmpipe_partitions_remaining offset 30m" in stalled["expr"]
    assert "increase(ray_mmpipe_partitions_committed_total[30m])" in stalled["expr"]
    assert "30 minutes" in stalled["annotations"]["summary"]


def test_monitoring_objects_are_optional_and_rendered_from_the_chart_files(helm_bin):
    assert not {"PodMonitor", "PrometheusRule"} & set(by_kind(render(helm_bin)))
    objects = render(helm_bin, OBSERVABILITY)
    rule = kind_of(objects, "PrometheusRule")
    assert (rule["apiVersion"], rule["metadata"]["labels"]["release"]) == (
        "monitoring.coreos.com/v1", "prometheus")
    expected = rule_file_groups()
    for group in expected:
        for r in group["rules"]:
            r["labels"] = {"team": "data", **r["labels"]}
    assert rule["spec"]["groups"] == expected
    severities = {r["alert"]: r["labels"]["severity"] for g in expected for r in g["rules"]}
    assert severities["MmpipeProgressStalled"] == "critical"
    # an alert's own severity wins over alertLabels
    clash = kind_of(render(helm_bin, None, *ALL_ON,
                           "monitoring.prometheusRule.alertLabels.severity=page"),
                    "PrometheusRule")
    assert {r["alert"]: r["labels"]["severity"] for g in clash["spec"]["groups"]
            for r in g["rules"]} == severities
    (dash,) = [o for o in objects if o["kind"] == "ConfigMap"
               and "mmpipe-dashboard.json" in o.get("data", {})]
    assert dash["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dash["metadata"]["annotations"] == {"grafana_folder": "mmpipe"}
    assert json.loads(dash["data"]["mmpipe-dashboard.json"]) == json.loads(DASHBOARD.read_text())
    (moved,) = [o for o in render(helm_bin, None, *ALL_ON,
                                  "monitoring.grafanaDashboard.namespace=monitoring")
                if o["metadata"]["name"].endswith("-grafana-dashboard")]
    assert moved["metadata"]["namespace"] == "monitoring"     # where Grafana's sidecar looks


def test_podmonitor_scrapes_every_ray_pod_on_its_metrics_port(helm_bin):
    for values, sets, kind in [(OBSERVABILITY, ("additionalWorkerGroups.gpu.disabled=false",),
                                "RayCluster"),
                               (CHART / "ci" / "rayjob-values.yaml", ALL_ON, "RayJob")]:
        objects = render(helm_bin, values, *sets)
        monitor = kind_of(objects, "PodMonitor")
        selector = monitor["spec"]["selector"]["matchLabels"]
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        relabelled = {r["targetLabel"]: r["sourceLabels"] for r in endpoint["relabelings"]}
        assert relabelled["ray_io_cluster"] == ["__meta_kubernetes_pod_label_ray_io_cluster"]
        spec = kind_of(objects, kind)["spec"]
        head, groups = head_and_groups(spec if kind == "RayCluster" else spec["rayClusterSpec"])
        assert len(groups) == (2 if kind == "RayCluster" else 1)          # gpu, cpu / cpu
        for group in [head, *groups.values()]:
            assert group["template"]["metadata"]["labels"].items() >= selector.items()
            ray = group["template"]["spec"]["containers"][0]
            ports = {p["name"]: p["containerPort"] for p in ray["ports"]}
            assert ports[endpoint["port"]] == int(head["rayStartParams"]["metrics-export-port"])


def test_no_loose_copies_of_the_rules_or_the_dashboard():
    """The chart's files are the only copy: no PrometheusRule, PodMonitor or dashboard JSON
    elsewhere in the repository to drift from them."""
    skip = {".venv", ".git", "data", ".pytest_cache", "node_modules", "mmpipe.egg-info"}
    mine = {CHART / "files", CHART / "templates", PROMTOOL_TESTS.parent}
    loose = []
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in skip and Path(root, d) not in mine]
        for name in files:
            if not name.endswith((".yaml", ".yml", ".json")):
                continue
            text = Path(root, name).read_text(errors="replace")
            if re.search(r"^kind: (PrometheusRule|PodMonitor)\b|alert: Mmpipe|"
                         r"\"uid\": \"mmpipe-jobs\"", text, re.MULTILINE):
                loose.append(str(Path(root, name).relative_to(REPO)))
    assert loose == []


def pods(objects: list[dict]) -> list[dict]:
    out = []
    for obj in objects:
        if obj["kind"] in ("RayCluster", "RayJob"):
            spec = obj["spec"] if obj["kind"] == "RayCluster" else obj["spec"]["rayClusterSpec"]
            head, groups = head_and_groups(spec)
            out += [g["template"]["spec"] for g in [head, *groups.values()]]
    return out


def test_log_sidecar_reads_ray_logs_in_every_ray_pod(helm_bin, tmp_path):
    sidecar_sets = ("logShipping.sidecar.name=vector", "logShipping.sidecar.image=vector:0.43",
                    "logShipping.config.vector\\.yaml=sources: {}")
    for values, sets in [(OBSERVABILITY, ("additionalWorkerGroups.gpu.disabled=false",)),
                         (CHART / "ci" / "rayjob-values.yaml", sidecar_sets)]:
        objects = render(helm_bin, values, *sets)
        config = [o for o in objects if o["kind"] == "ConfigMap"
                  and o["metadata"]["name"].endswith("-log-shipping")]
        (config,) = config
        specs = pods(objects)
        assert len(specs) >= 2
        for spec in specs:
            ray, shipper = spec["containers"][0], spec["containers"][-1]
            assert len(spec["containers"]) == 2
            assert shipper["name"] in ("fluent-bit", "vector")
            ray_logs = {m["mountPath"] for m in ray["volumeMounts"] if m["name"] == "ray-logs"}
            assert ray_logs == {"/tmp/ray"}
            assert {"name": "ray-logs", "mountPath": "/tmp/ray", "readOnly": True} in \
                shipper["volumeMounts"]
            assert {"name": "log-shipping-config", "mountPath": "/fluent-bit/etc/",
                    "readOnly": True} in shipper["volumeMounts"]
            assert shipper["securityContext"]["allowPrivilegeEscalation"] is False
            volumes = {v["name"]: v for v in spec["volumes"]}
            assert volumes["log-shipping-config"]["configMap"]["name"] == \
                config["metadata"]["name"]
    fluent = kind_of([o for o in render(helm_bin, OBSERVABILITY)
                      if o["metadata"]["name"].endswith("-log-shipping")], "ConfigMap")
    assert "Path          /tmp/ray/session_latest/logs/*" in fluent["data"]["fluent-bit.conf"]
    # off by default: one container (Ray's) per pod
    assert all(len(s["containers"]) == 1 for s in pods(render(helm_bin)))
    # the node-agent path (README): Ray logs to stderr in every Ray container
    values = tmp_path / "stderr.yaml"
    values.write_text(yaml.safe_dump({"common": {"containerEnv": [
        {"name": "RAY_LOG_TO_STDERR", "value": "1"}]}}))
    stderr = pods(render(helm_bin, values, "additionalWorkerGroups.gpu.disabled=false"))
    assert len(stderr) == 3
    for spec in stderr:
        assert {"name": "RAY_LOG_TO_STDERR", "value": "1"} in spec["containers"][0]["env"]


@pytest.mark.parametrize("sets, message", [
    (("logShipping.config.a\\.conf=x",), "logShipping.config is set but logShipping.sidecar"),
    (("logShipping.sidecar.name=fb",), "logShipping.sidecar.image is required"),
    (("logShipping.sidecar.image=fb:1",), "logShipping.sidecar.name is required"),
    (("logShipping.sidecar.name=ray-worker", "logShipping.sidecar.image=fb:1"),
     'logShipping.sidecar.name "ray-worker"'),
    (("monitoring.podMonitor.interval=often",), "interval"),
], ids=["config-without-sidecar", "no-image", "no-name", "name-clash", "bad-interval"])
def test_bad_observability_values_fail_at_helm_time(helm_bin, sets, message):
    with pytest.raises(RuntimeError, match=re.escape(message)):
        render(helm_bin, None, *sets)
