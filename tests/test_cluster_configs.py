"""cluster/ configs checked offline, with the validators the tools themselves use."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.ray_heads import NODE_ENV

CLUSTER = Path(__file__).resolve().parent.parent / "cluster"


def test_gcp_yaml_passes_the_launchers_own_validation():
    from ray.autoscaler._private.util import prepare_config, validate_config

    raw = yaml.safe_load((CLUSTER / "gcp.yaml").read_text())
    cfg = prepare_config(raw)  # merges gcp/defaults.yaml, as `ray up` does
    validate_config(cfg)  # jsonschema (additionalProperties: false) + head/min/max checks
    types = cfg["available_node_types"]
    machines = {t: n["node_config"]["machineType"] for t, n in types.items()}
    assert any(m.startswith("c4d-highcpu") for m in machines.values())
    assert "c4a-highcpu-72" in machines.values()
    for name, node in types.items():
        if name == cfg["head_node_type"]:
            continue
        vcpus = int(node["node_config"]["machineType"].rsplit("-", 1)[1])
        assert node["resources"]["CPU"] == vcpus and node["min_workers"] == 0 and node["max_workers"] > 0
        disk = node["node_config"]["disks"][0]["initializeParams"]
        if node["node_config"]["machineType"].startswith(("c4d", "c4a")):  # Hyperdisk only
            assert disk["diskType"] == f"zones/{cfg['provider']['availability_zone']}/diskTypes/hyperdisk-balanced"
    assert types["arm_72"]["labels"] == {"arch": "aarch64"}
    gpu = types["gpu_l4"]  # the GPU worker type: only GPU-asking actors make the autoscaler start it
    assert gpu["resources"]["GPU"] == gpu["node_config"]["guestAccelerators"][0]["acceleratorCount"] == 1
    assert gpu["node_config"]["scheduling"]["onHostMaintenance"] == "TERMINATE"
    assert all("GPU" not in n["resources"] for t, n in types.items() if t != "gpu_l4")
    assert "arm64" in types["arm_72"]["node_config"]["disks"][0]["initializeParams"]["sourceImage"]
    assert any(n["node_config"].get("scheduling", {}).get("provisioningModel") == "SPOT" for n in types.values())
    assert any("make setup" in c for c in cfg["setup_commands"]) and cfg["idle_timeout_minutes"] > 0
    # Idle workers must survive beside a full pool (see cluster/README.md).
    for cmds in (cfg["head_start_ray_commands"], cfg["worker_start_ray_commands"]):
        for name, value in NODE_ENV.items():
            assert any(f"{name}={value}" in c for c in cmds)


def test_gcp_yaml_rejects_what_the_launcher_rejects():
    from ray.autoscaler._private.util import prepare_config, validate_config

    raw = yaml.safe_load((CLUSTER / "gcp.yaml").read_text())
    raw["available_node_types"]["x86_96"]["bogus_key"] = 1
    with pytest.raises(Exception, match="bogus_key|Additional properties"):
        validate_config(prepare_config(raw))


def kuberay_docs():
    docs = {}
    for path in sorted((CLUSTER / "kuberay").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            docs[doc["kind"]] = doc
    return docs


def check_cluster_spec(spec: dict) -> None:
    """The fields the KubeRay operator needs (RayCluster CRD, ray.io/v1)."""
    assert spec["rayVersion"] == "2.60.0" and spec["enableInTreeAutoscaling"] is True
    assert spec["autoscalerOptions"]["version"] == "v2"
    head = spec["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    assert head["template"]["spec"]["containers"][0]["image"]
    for group in spec["workerGroupSpecs"]:
        assert group["groupName"] and 0 <= group["minReplicas"] <= group["maxReplicas"]
        assert "rayStartParams" in group
        container = group["template"]["spec"]["containers"][0]
        assert container["resources"]["requests"]["cpu"] == container["resources"]["limits"]["cpu"]
        assert [{"name": k, "value": v} for k, v in NODE_ENV.items()] == [
            e for e in container["env"] if e["name"] in NODE_ENV
        ]
        gpus = container["resources"]["limits"].get("nvidia.com/gpu")
        assert gpus == container["resources"]["requests"].get("nvidia.com/gpu")
        if gpus:  # a GPU group lands on GPU nodes and tolerates their taint
            assert group["template"]["spec"]["nodeSelector"]["cloud.google.com/gke-accelerator"]
            assert any(t["key"] == "nvidia.com/gpu" for t in group["template"]["spec"]["tolerations"])


def test_kuberay_raycluster_and_rayjob():
    docs = kuberay_docs()
    assert set(docs) == {"RayCluster", "RayJob"}
    for doc in docs.values():
        assert doc["apiVersion"] == "ray.io/v1" and doc["metadata"]["name"]
    check_cluster_spec(docs["RayCluster"]["spec"])
    assert any(
        "nvidia.com/gpu" in g["template"]["spec"]["containers"][0]["resources"]["limits"]
        for g in docs["RayCluster"]["spec"]["workerGroupSpecs"]
    )
    job = docs["RayJob"]["spec"]
    check_cluster_spec(job["rayClusterSpec"])
    assert job["entrypoint"].startswith("maskray run") and job["shutdownAfterJobFinishes"] is True
    assert job["submissionMode"] in ("K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode")
    yaml.safe_load(job["runtimeEnvYAML"])
