"""How dagster-k8s 0.29.27 combines, for one run pod, the run launcher's config (values.yaml
runLauncher.config.k8sRunLauncher, as the chart's _run-launcher.tpl renders it) with the code
location's container context (the user deployment's envConfigMaps/envSecrets/volumes/volumeMounts,
as the subchart's k8sContainerContext helper renders it). Prints the run pod's resulting lists."""
import pathlib, yaml
from dagster_k8s.container_context import K8sContainerContext
from dagster_k8s.job import UserDefinedDagsterK8sConfig

v = yaml.safe_load((pathlib.Path(__file__).parent.parent / "values.yaml").read_text())
rl = v["runLauncher"]["config"]["k8sRunLauncher"]
dep = v["dagster-user-deployments"]["deployments"][0]

launcher = K8sContainerContext(  # what K8sRunLauncher.get_container_context starts from
    env_config_maps=["<release>-pipeline-env"] + [c["name"] for c in rl["envConfigMaps"]],
    env_secrets=[s["name"] for s in rl["envSecrets"]],
    volume_mounts=rl["volumeMounts"], volumes=rl["volumes"],
    run_k8s_config=UserDefinedDagsterK8sConfig.from_dict({"pod_spec_config": rl["runK8sConfig"]["podSpecConfig"]}),
)
location = K8sContainerContext(  # DAGSTER_CLI_API_GRPC_CONTAINER_CONTEXT of the code server
    env_config_maps=[f"<subchart-fullname>-{dep['name']}-user-env"] + [c["name"] for c in dep["envConfigMaps"]],
    env_secrets=[s["name"] for s in dep["envSecrets"]],
    volume_mounts=dep["volumeMounts"], volumes=dep["volumes"], namespace="aip",
)
merged = launcher.merge(location)
rk = merged.run_k8s_config
print("container_config:", rk.container_config)
print("pod_spec_config:", rk.pod_spec_config)
vols = rk.pod_spec_config.get("volumes", [])
assert [x["name"] for x in vols] == ["aip-shared"], vols
assert len(rk.container_config.get("volume_mounts", [])) == 1
