"""Issue 28, points 1 and 3: what a platform team's admission policies and the KubeRay
operator (v1.7) refuse, checked on the chart rendered by the real ``helm``.

Point 1: no head PodDisruptionBudget by default (the standard PDB policies deny
``maxUnavailable: 0``); ``auth.mode=disabled`` refused with an external address; a
NetworkPolicy on by default that admits and emits only what Ray needs (evaluated with
``chart_check.network_allows``); SidecarMode refused (KubeRay's submitter sidecar has no
securityContext, and the PSS port now sees it). Point 3: the overrides the operator rejects
after a successful ``helm install`` either render what it accepts or fail at install naming
the value; and the operator-rule port corrected against v1.7's validation.go."""

from __future__ import annotations

import copy

import pytest

from tests.deploy import chart_check
from tests.deploy.chart_check import problems, render
from tests.deploy.test_helm import by_kind, container, head_and_groups

NGINX = ("networkPolicy.ingressFrom[0].namespaceSelector.matchLabels"
         ".kubernetes\\.io/metadata\\.name=ingress-nginx")



@pytest.fixture(scope="module")
def helm_bin(pytestconfig):
    return chart_check.helm_binary(chart_check.tools_dir(pytestconfig))


# --- point 1: admission policies ----------------------------------------------------------


def test_no_head_pdb_by_default_and_the_policy_port_denies_the_one_asked_for(helm_bin):
    assert "PodDisruptionBudget" not in by_kind(render(helm_bin))
    objects = render(helm_bin, None, "headDisruptionBudget.enabled=true")
    (pdb,) = by_kind(objects)["PodDisruptionBudget"]
    assert pdb["spec"]["maxUnavailable"] == 0
    (error,) = chart_check.pdb_policy_errors(objects)
    assert "maxUnavailable 0 blocks every voluntary eviction" in error
    assert chart_check.pdb_policy_errors(render(helm_bin)) == []
    assert any("Gatekeeper" in p for p in problems(helm_bin, None,
                                                    "headDisruptionBudget.enabled=true"))


REFUSED = {
    "auth-off-ingress": (["auth.mode=disabled", "ingress.enabled=true", NGINX],
                         "auth.mode=disabled with ingress.enabled=true"),
    "auth-off-loadbalancer": (["auth.mode=disabled", "dashboardService.type=LoadBalancer",
                               "networkPolicy.dashboardFrom[0].ipBlock.cidr=10.0.0.0/8"],
                              "auth.mode=disabled with dashboardService.type=LoadBalancer"),
    "auth-off-nodeport": (["auth.mode=disabled", "dashboardService.type=NodePort",
                           "networkPolicy.enabled=false"],
                          "auth.mode=disabled with dashboardService.type=NodePort"),
    "auth-off-head-service-lb": (["auth.mode=disabled", "head.headService.spec.type=LoadBalancer"],
                                 "auth.mode=disabled with head.headService.spec.type=LoadBalancer"),
    "ingress-blocked-by-policy": (["ingress.enabled=true"], "needs networkPolicy.ingressFrom"),
    "loadbalancer-blocked-by-policy": (["dashboardService.type=LoadBalancer"],
                                       "needs networkPolicy.dashboardFrom"),
    "sidecar-mode": (["rayJob.enabled=true", "rayJob.submissionMode=SidecarMode"],
                     "rayJob.submissionMode=SidecarMode: KubeRay"),
    # point 3
    "group-name-collision": (["worker.groupName=gpu", "additionalWorkerGroups.gpu.disabled=false"],
                             "worker.groupName=gpu is also the name of additionalWorkerGroups.gpu"),
    "num-cpus-and-rayresources-cpu": (["worker.rayStartParams.num-cpus=4",
                                       "worker.rayResources.CPU=4"],
                                      "worker: rayStartParams.num-cpus and rayResources.CPU"),
    "num-gpus-and-gpu-resource": (["additionalWorkerGroups.gpu.disabled=false",
                                   "additionalWorkerGroups.gpu.rayStartParams.num-gpus=1",
                                   "additionalWorkerGroups.gpu.rayResources.GPU=1"],
                                  "additionalWorkerGroups.gpu: rayStartParams.num-gpus"),
    "autoscaler-unknown-option": (["head.autoscalerOptions.idleTimeout=60"],
                                  "additional properties 'idleTimeout' not allowed"),
    "autoscaler-negative-idle": (["head.autoscalerOptions.idleTimeoutSeconds=-1"],
                                 "autoscalerOptions/idleTimeoutSeconds"),
    "autoscaler-start-cmd-env": (["head.autoscalerOptions.env[0].name=KUBERAY_GEN_AUTOSCALER_START_CMD",
                                  "head.autoscalerOptions.env[0].value=x"],
                                 "must not set KUBERAY_GEN_AUTOSCALER_START_CMD"),
    "deletion-none-with-shutdown": (["rayJob.enabled=true",
                                     "rayJob.deletionStrategy.onSuccess.policy=DeleteNone",
                                     "rayJob.deletionStrategy.onFailure.policy=DeleteCluster"],
                                    "onSuccess.policy=DeleteNone contradicts"),
    "deletion-legacy-delete-workers": (["rayJob.enabled=true",
                                        "rayJob.deletionStrategy.onSuccess.policy=DeleteCluster",
                                        "rayJob.deletionStrategy.onFailure.policy=DeleteWorkers"],
                                       "onFailure.policy=DeleteWorkers is not supported with autoscaling"),
    "deletion-legacy-without-policy": (["rayJob.enabled=true",
                                        "rayJob.deletionStrategy.onSuccess.policy=DeleteCluster",
                                        "rayJob.deletionStrategy.onFailure.x=1"],
                                       "onFailure': missing property 'policy'"),
    "deletion-legacy-selector": (["rayJob.enabled=true", "rayJob.backoffLimit=0",
                                  "rayJob.clusterSelector.ray\\.io/cluster=mmpipe",
                                  "rayJob.deletionStrategy.onSuccess.policy=DeleteCluster",
                                  "rayJob.deletionStrategy.onFailure.policy=DeleteSelf"],
                                 "onSuccess.policy=DeleteCluster is not supported with rayJob.clusterSelector"),
    "deletion-rule-selector": (["rayJob.enabled=true", "rayJob.backoffLimit=0",
                                "rayJob.shutdownAfterJobFinishes=false",
                                "rayJob.clusterSelector.ray\\.io/cluster=mmpipe",
                                "rayJob.deletionStrategy.deletionRules[0].policy=DeleteCluster",
                                "rayJob.deletionStrategy.deletionRules[0].condition.jobStatus=FAILED"],
                               "deletionRules[0]: DeleteCluster is not supported with rayJob.clusterSelector"),
    "deletion-rule-duplicate": (["rayJob.enabled=true", "rayJob.shutdownAfterJobFinishes=false",
                                 "rayJob.deletionStrategy.deletionRules[0].policy=DeleteCluster",
                                 "rayJob.deletionStrategy.deletionRules[0].condition.jobStatus=FAILED",
                                 "rayJob.deletionStrategy.deletionRules[1].policy=DeleteCluster",
                                 "rayJob.deletionStrategy.deletionRules[1].condition.jobStatus=FAILED",
                                 "rayJob.deletionStrategy.deletionRules[1].condition.ttlSeconds=60"],
                                "deletionRules[1]: a second DeleteCluster rule for jobStatus FAILED"),
    "deletion-rule-ttl-order": (["rayJob.enabled=true", "rayJob.shutdownAfterJobFinishes=false",
                                 "rayJob.deletionStrategy.deletionRules[0].policy=DeleteSelf",
                                 "rayJob.deletionStrategy.deletionRules[0].condition.jobStatus=FAILED",
                                 "rayJob.deletionStrategy.deletionRules[0].condition.ttlSeconds=10",
                                 "rayJob.deletionStrategy.deletionRules[1].policy=DeleteCluster",
                                 "rayJob.deletionStrategy.deletionRules[1].condition.jobStatus=FAILED",
                                 "rayJob.deletionStrategy.deletionRules[1].condition.ttlSeconds=60"],
                                ("for jobStatus FAILED the DeleteSelf ttlSeconds (10) must be at "
                                 "least the DeleteCluster one (60)")),
    "deletion-rule-negative-ttl": (["rayJob.enabled=true", "rayJob.shutdownAfterJobFinishes=false",
                                    "rayJob.deletionStrategy.deletionRules[0].policy=DeleteCluster",
                                    "rayJob.deletionStrategy.deletionRules[0].condition.jobStatus=FAILED",
                                    "rayJob.deletionStrategy.deletionRules[0].condition.ttlSeconds=-5"],
                                   "condition/ttlSeconds"),
    "deletion-rule-both-statuses": (["rayJob.enabled=true", "rayJob.shutdownAfterJobFinishes=false",
                                     "rayJob.deletionStrategy.deletionRules[0].policy=DeleteCluster",
                                     "rayJob.deletionStrategy.deletionRules[0].condition.jobStatus=FAILED",
                                     "rayJob.deletionStrategy.deletionRules[0].condition.jobDeploymentStatus=Failed"],
                                    "needs exactly one of jobStatus and jobDeploymentStatus"),
    "deletion-rule-unknown-policy": (["rayJob.enabled=true", "rayJob.shutdownAfterJobFinishes=false",
                                      "rayJob.deletionStrategy.deletionRules[0].policy=Delete",
                                      "rayJob.deletionStrategy.deletionRules[0].condition.jobStatus=FAILED"],
                                     "deletionRules/0/policy"),
}

ACCEPTED = {
    "num-cpus-override": ["worker.rayStartParams.num-cpus=4"],
    "num-cpus-memory-override": ["worker.rayStartParams.num-cpus=6",
                                 "worker.rayStartParams.memory=17179869184"],
    "num-gpus-override": ["additionalWorkerGroups.gpu.disabled=false",
                          "additionalWorkerGroups.gpu.rayStartParams.num-gpus=1",
                          "additionalWorkerGroups.gpu.rayResources.mmpipe_model=1"],
    "num-gpus-without-rayresources": ["additionalWorkerGroups.gpu.disabled=false",
                                      "additionalWorkerGroups.gpu.rayStartParams.num-gpus=1"],
    "worker-group-renamed": ["worker.groupName=gpu"],           # the GPU group is off
    "auth-off-in-cluster": ["auth.mode=disabled"],
    "ingress-with-controller": ["ingress.enabled=true", NGINX],
    "loadbalancer-with-sources": ["dashboardService.type=LoadBalancer",
                                  "networkPolicy.dashboardFrom[0].ipBlock.cidr=10.0.0.0/8"],
    "no-network-policy": ["networkPolicy.enabled=false"],
    "autoscaler-options": ["head.autoscalerOptions.upscalingMode=Conservative",
                           "head.autoscalerOptions.env[0].name=A",
                           "head.autoscalerOptions.env[0].value=b"],
    "deletion-legacy": ["rayJob.enabled=true", "rayJob.shutdownAfterJobFinishes=false",
                        "rayJob.ttlSecondsAfterFinished=0",
                        "rayJob.deletionStrategy.onSuccess.policy=DeleteCluster",
                        "rayJob.deletionStrategy.onFailure.policy=DeleteNone"],
    "deletion-rules-ordered": ["rayJob.enabled=true", "rayJob.shutdownAfterJobFinishes=false",
                               "rayJob.deletionStrategy.deletionRules[0].policy=DeleteCluster",
                               "rayJob.deletionStrategy.deletionRules[0].condition.jobStatus=FAILED",
                               "rayJob.deletionStrategy.deletionRules[0].condition.ttlSeconds=60",
                               "rayJob.deletionStrategy.deletionRules[1].policy=DeleteSelf",
                               "rayJob.deletionStrategy.deletionRules[1].condition.jobStatus=FAILED",
                               "rayJob.deletionStrategy.deletionRules[1].condition.ttlSeconds=600",
                               "rayJob.deletionStrategy.deletionRules[2].policy=DeleteCluster",
                               ("rayJob.deletionStrategy.deletionRules[2].condition"
                                ".jobDeploymentStatus=Failed")],
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_values_the_platform_or_the_operator_refuses_fail_at_install(helm_bin, name):
    sets, message = REFUSED[name]
    found = problems(helm_bin, None, *sets)
    assert found and any(message in p for p in found), found


@pytest.mark.parametrize("name", list(ACCEPTED))
def test_overrides_render_what_the_operator_and_pss_accept(helm_bin, name):
    assert problems(helm_bin, None, *ACCEPTED[name]) == []


# --- point 1: the NetworkPolicy, evaluated -----------------------------------------------

HEAD = {"app.kubernetes.io/name": "mmpipe", "app.kubernetes.io/instance": "mmpipe",
        "app.kubernetes.io/component": "ray-head"}
WORKER = {**HEAD, "app.kubernetes.io/component": "ray-worker-cpu"}
SUBMITTER = {**HEAD, "app.kubernetes.io/component": "ray-job-submitter"}
OWN = {"namespace": "default", "labels": WORKER}
STRANGER = {"namespace": "default", "labels": {"app": "other"}}
ELSEWHERE = {"namespace": "team-b", "labels": {"app": "x"}}
OPERATOR = {"namespace": "kuberay-system", "labels": {"app.kubernetes.io/name": "kuberay-operator"}}
PROMETHEUS = {"namespace": "monitoring", "labels": {"app": "prometheus"}}
NGINX_POD = {"namespace": "ingress-nginx", "labels": {"app": "ingress-nginx"}}
DNS = {"namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}}
OUTSIDE = {"ip": "203.0.113.7"}


def allows(objects, pod, direction, peer, port, protocol="TCP"):
    return chart_check.network_allows(objects, pod, direction, peer, port, protocol)


def test_the_default_network_policy_admits_and_emits_only_what_ray_needs(helm_bin):
    objects = render(helm_bin)
    policies = by_kind(objects)["NetworkPolicy"]
    assert {tuple(p["spec"]["policyTypes"]) for p in policies} == {("Ingress", "Egress"),
                                                                   ("Egress",)}
    expected = [   # (pod, direction, peer, port, protocol, allowed)
        (HEAD, "ingress", OWN, 6379, "TCP", True),            # workers reach the GCS
        (WORKER, "ingress", {"namespace": "default", "labels": HEAD}, 12345, "TCP", True),
        (HEAD, "ingress", STRANGER, 6379, "TCP", False),       # other pods of the namespace
        (HEAD, "ingress", ELSEWHERE, 8265, "TCP", False),
        (HEAD, "ingress", OUTSIDE, 8265, "TCP", False),
        (HEAD, "ingress", OPERATOR, 8265, "TCP", True),        # the operator: job API
        (HEAD, "ingress", OPERATOR, 6379, "TCP", False),
        (WORKER, "ingress", PROMETHEUS, 8080, "TCP", True),    # metrics
        (WORKER, "ingress", PROMETHEUS, 8265, "TCP", False),
        (HEAD, "ingress", NGINX_POD, 8265, "TCP", False),      # no Ingress: no controller
        (WORKER, "egress", OWN, 40000, "TCP", True),           # Ray's own ports
        (SUBMITTER, "egress", {"namespace": "default", "labels": HEAD}, 8265, "TCP", True),
        (WORKER, "egress", DNS, 53, "UDP", True),
        (WORKER, "egress", DNS, 53, "TCP", True),
        (WORKER, "egress", ELSEWHERE, 53, "UDP", False),
        (WORKER, "egress", {"ip": "52.216.8.1"}, 443, "TCP", True),   # S3 over https
        (WORKER, "egress", {"ip": "52.216.8.1"}, 80, "TCP", False),
        (WORKER, "egress", ELSEWHERE, 5432, "TCP", False),     # anything else
        (WORKER, "egress", {"ip": "10.0.0.1"}, 6443, "TCP", False),   # workers: no API server
        (HEAD, "egress", {"ip": "10.0.0.1"}, 6443, "TCP", True),      # the autoscaler
        (HEAD, "egress", {"ip": "10.0.0.1"}, 22, "TCP", False),
    ]
    wrong = [case for case in expected if allows(objects, *case[:5]) != case[5]]
    assert wrong == []


def test_network_policy_values_admit_the_ingress_controller_and_widen_egress(helm_bin):
    objects = render(helm_bin, None, "ingress.enabled=true", NGINX,
                     "s3.endpointUrl=http://minio.storage:9000",
                     "networkPolicy.s3To[0].namespaceSelector.matchLabels"
                     ".kubernetes\\.io/metadata\\.name=storage",
                     "networkPolicy.extraEgress[0].to[0].namespaceSelector.matchLabels"
                     ".kubernetes\\.io/metadata\\.name=monitoring",
                     "networkPolicy.extraEgress[0].ports[0].port=9090",
                     "networkPolicy.apiServerTo[0].ipBlock.cidr=10.0.0.1/32")
    minio = {"namespace": "storage", "labels": {"app": "minio"}}
    expected = [
        (HEAD, "ingress", NGINX_POD, 8265, "TCP", True),
        (HEAD, "ingress", NGINX_POD, 10001, "TCP", False),
        (WORKER, "egress", minio, 9000, "TCP", True),          # the endpoint's port
        (WORKER, "egress", minio, 443, "TCP", False),
        (WORKER, "egress", {"ip": "52.216.8.1"}, 9000, "TCP", False),  # s3To narrows it
        (HEAD, "egress", PROMETHEUS, 9090, "TCP", True),       # extraEgress
        (HEAD, "egress", {"ip": "10.0.0.1"}, 443, "TCP", True),
        (HEAD, "egress", {"ip": "10.0.0.2"}, 443, "TCP", False),
    ]
    wrong = [case for case in expected if allows(objects, *case[:5]) != case[5]]
    assert wrong == []
    # a RayJob on an existing cluster: its submitter reaches that cluster's head job API
    selector = render(helm_bin, None, "rayJob.enabled=true", "rayJob.backoffLimit=0",
                      "rayJob.clusterSelector.ray\\.io/cluster=shared")
    shared_head = {"namespace": "default",
                   "labels": {"ray.io/cluster": "shared", "ray.io/node-type": "head"}}
    assert allows(selector, SUBMITTER, "egress", shared_head, 8265)
    assert not allows(selector, SUBMITTER, "egress", shared_head, 6379)
    assert not allows(objects, SUBMITTER, "egress", shared_head, 8265)
    off = render(helm_bin, None, "networkPolicy.enabled=false")
    assert "NetworkPolicy" not in by_kind(off)
    assert allows(off, HEAD, "ingress", OUTSIDE, 6379)         # not isolated without it


def test_network_policy_evaluator_follows_the_api_semantics():
    policy = {"kind": "NetworkPolicy", "spec": {
        "podSelector": {"matchExpressions": [{"key": "tier", "operator": "In",
                                              "values": ["db"]}]},
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}},
                              {"namespaceSelector": {"matchLabels": {"team": "a"}},
                               "podSelector": {"matchLabels": {"role": "api"}}}],
                     "ports": [{"port": 5000, "endPort": 5010}]}]}}
    db = {"tier": "db"}
    assert allows([policy], db, "ingress", {"ip": "10.2.0.1"}, 5005)
    assert not allows([policy], db, "ingress", {"ip": "10.1.0.1"}, 5005)      # except
    assert not allows([policy], db, "ingress", {"ip": "10.2.0.1"}, 5011)      # port range
    team_a = {"namespace": "a", "namespace_labels": {"team": "a"}, "labels": {"role": "api"}}
    assert allows([policy], db, "ingress", team_a, 5000)
    assert not allows([policy], db, "ingress", {**team_a, "labels": {"role": "web"}}, 5000)
    assert not allows([policy], db, "ingress", team_a, 5000, "UDP")
    assert allows([policy], {"tier": "web"}, "ingress", {"ip": "8.8.8.8"}, 1)  # not selected
    assert allows([policy], db, "egress", {"ip": "8.8.8.8"}, 1)              # Ingress only


# --- point 1: SidecarMode and the PSS port ------------------------------------------------


def test_pss_port_sees_kuberays_sidecar_submitter_and_wait_gcs_init_container(helm_bin):
    objects = render(helm_bin, None, "rayJob.enabled=true", "rayCluster.enabled=false")
    assert chart_check.pss_restricted_errors(objects) == []
    where = dict(chart_check.pod_templates(objects))
    (worker,) = [t for w, t in where.items() if " group cpu" in w]
    (init,) = worker["spec"]["initContainers"]
    assert init["name"] == "wait-gcs-ready"
    assert init["securityContext"] == container(
        head_and_groups(by_kind(objects)["RayJob"][0]["spec"]["rayClusterSpec"])[1]["cpu"]
    )["securityContext"]
    # what the chart used to render for SidecarMode: KubeRay's submitter joins the head pod
    sidecar = copy.deepcopy(objects)
    (job,) = by_kind(sidecar)["RayJob"]
    job["spec"]["submissionMode"] = "SidecarMode"
    del job["spec"]["submitterPodTemplate"]
    assert chart_check.operator_errors(job) == []           # the operator accepts it ...
    errors = chart_check.pss_restricted_errors(sidecar)     # ... the namespace does not
    assert any("head container ray-job-submitter: allowPrivilegeEscalation" in e for e in errors)
    assert any("head container ray-job-submitter: capabilities must drop ALL" in e
               for e in errors)


def test_pss_port_checks_the_baseline_rules(helm_bin):
    objects = render(helm_bin)
    (cluster,) = by_kind(objects)["RayCluster"]
    pod = cluster["spec"]["workerGroupSpecs"][0]["template"]
    pod["metadata"].setdefault("annotations", {})[
        "container.apparmor.security.beta.kubernetes.io/ray-worker"] = "unconfined"
    pod["spec"]["securityContext"]["sysctls"] = [{"name": "kernel.msgmax", "value": "1"},
                                                 {"name": "net.ipv4.tcp_syncookies", "value": "1"}]
    ray = pod["spec"]["containers"][0]["securityContext"]
    ray.update({"seLinuxOptions": {"type": "spc_t"}, "procMount": "Unmasked",
                "appArmorProfile": {"type": "Unconfined"}})
    errors = "\n".join(chart_check.pss_restricted_errors(objects))
    for expected in ("AppArmor annotation", "unsafe sysctl kernel.msgmax", "seLinuxOptions.type spc_t",
                     "procMount Unmasked", "appArmorProfile Unconfined"):
        assert expected in errors, expected
    assert "tcp_syncookies" not in errors


# --- point 3: renders the operator accepts ------------------------------------------------


def test_ray_start_resources_move_into_the_groups_resources(helm_bin):
    (cluster,) = by_kind(render(helm_bin, None, *ACCEPTED["num-cpus-memory-override"]))[
        "RayCluster"]
    _, groups = head_and_groups(cluster["spec"])
    assert groups["cpu"]["resources"] == {"CPU": "6", "memory": "17179869184",
                                          "mmpipe_cpu": "1000"}
    assert not {"num-cpus", "memory"} & set(groups["cpu"]["rayStartParams"])
    (cluster,) = by_kind(render(helm_bin, None, *ACCEPTED["num-gpus-without-rayresources"]))[
        "RayCluster"]
    _, groups = head_and_groups(cluster["spec"])
    assert groups["gpu"]["rayStartParams"]["num-gpus"] == "1" and "resources" not in groups["gpu"]


@pytest.mark.parametrize("release", [
    "a" * 47,                                                   # + "-mmpipe": 54 characters
    "nightly-curation-of-the-coco-dataset-for-training-v2",    # 52
    "b" * 53,                                                   # helm's longest release name
    "mmpipe-" + "c" * 46,                                       # contains the chart's name
])
def test_long_release_names_give_names_kuberay_and_the_api_accept(helm_bin, release):
    sets = ["rayJob.enabled=true", "ingress.enabled=true", NGINX]
    assert problems(helm_bin, None, *sets, release=release) == []
    objects = by_kind(render(helm_bin, None, *sets, release=release))
    (cluster,) = objects["RayCluster"]
    assert len(cluster["metadata"]["name"]) <= chart_check.MAX_RAYCLUSTER_NAME == 53
    assert cluster["metadata"]["name"].startswith(release[:40])
    (job,) = objects["RayJob"]
    assert len(job["metadata"]["name"]) <= chart_check.MAX_RAYJOB_NAME == 47


# --- the operator-rule port, against KubeRay v1.7.0 validation.go and the webhooks --------


def test_operator_port_matches_kuberay_1_7(helm_bin):
    (cluster,) = by_kind(render(helm_bin, None, "additionalWorkerGroups.gpu.disabled=false"))[
        "RayCluster"]
    assert chart_check.operator_errors(cluster) == []

    def errors(change, whole=False):
        """The port's findings after ``change`` (of the spec, or of the whole object)."""
        obj = copy.deepcopy(cluster)
        change(obj if whole else obj["spec"])
        return "\n".join(chart_check.operator_errors(obj))

    def rename(obj, n=54):
        obj["metadata"]["name"] = "x" * n
    assert "no more than 53 characters" in errors(rename, whole=True)
    assert errors(lambda obj: rename(obj, 53), whole=True) == ""
    # the webhook: unique group names
    assert "worker group names must be unique: 'cpu'" in errors(
        lambda s: s["workerGroupSpecs"].__setitem__(1, {**s["workerGroupSpecs"][1],
                                                         "groupName": "cpu"}))
    # IsAutoscalingV2Enabled reads autoscalerOptions.version alone: an idle timeout on a
    # cluster without the in-tree autoscaler is accepted (the old port refused it)
    assert errors(lambda s: (s.__setitem__("enableInTreeAutoscaling", False),
                             s["workerGroupSpecs"][0].__setitem__("idleTimeoutSeconds", 60))) == ""
    # restartPolicy is checked for v2 by version only (the env variable does not count)
    head_env = [{"name": "RAY_enable_autoscaler_v2", "value": "1"}]

    def env_v2(s, policy):
        del s["autoscalerOptions"]["version"]
        s["headGroupSpec"]["template"]["spec"]["containers"][0]["env"] += head_env
        s["workerGroupSpecs"][0]["template"]["spec"]["restartPolicy"] = policy
    assert errors(lambda s: env_v2(s, "Always")) == ""
    assert "restartPolicy for cpu Pod should be Never" in errors(
        lambda s: s["workerGroupSpecs"][0]["template"]["spec"].__setitem__("restartPolicy",
                                                                          "Always"))
    # RAY_REDIS_ADDRESS is allowed under the ray.io/ft-enabled annotation
    redis = [{"name": "RAY_REDIS_ADDRESS", "value": "redis:6379"}]

    def add_redis(obj, annotate):
        obj["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"] += redis
        if annotate:
            obj["metadata"]["annotations"] = {"ray.io/ft-enabled": "true"}
    assert "RAY_REDIS_ADDRESS is set" in errors(lambda obj: add_redis(obj, False), whole=True)
    assert errors(lambda obj: add_redis(obj, True), whole=True) == ""
    # Kubernetes token auth
    assert "enableK8sTokenAuth is enabled and authOptions.secretName" in errors(
        lambda s: s["authOptions"].update(enableK8sTokenAuth=True, secretName="t"))
    assert "authOptions.mode not set to 'token'" in errors(
        lambda s: s.__setitem__("authOptions", {"mode": "disabled", "enableK8sTokenAuth": True}))
    assert "RayVersion format is invalid" in errors(lambda s: s.__setitem__("rayVersion", "latest"))


def test_operator_port_rayjob_rules(helm_bin):
    (job,) = by_kind(render(helm_bin, None, "rayJob.enabled=true", "rayJob.backoffLimit=0"))[
        "RayJob"]
    job = copy.deepcopy(job)
    job["spec"]["submissionMode"] = "SidecarMode"
    del job["spec"]["submitterPodTemplate"]
    job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["restartPolicy"] = "Always"
    assert any("restartPolicy for head Pod should be Never or unset when using SidecarMode" in e
               for e in chart_check.operator_errors(job))
    job["spec"]["submissionMode"] = "K8sJobMode"
    job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"].pop("restartPolicy")
    job["spec"]["deletionStrategy"] = {"onSuccess": None, "onFailure": {"policy": "DeleteCluster"}}
    assert any("cannot be unset" in e for e in chart_check.operator_errors(job))   # no crash


def test_object_names_the_api_server_refuses_are_reported(helm_bin):
    objects = render(helm_bin)
    assert chart_check.object_name_errors(objects) == []
    service = copy.deepcopy(next(o for o in objects if o["kind"] == "Service"))
    service["metadata"]["name"] = "s" * 54 + "-dashboard"
    (error,) = chart_check.object_name_errors([service])
    assert "no more than 63 characters" in error
