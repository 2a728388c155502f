"""Resolve a validated Deployment into the Plan: what gets installed, why, and what runs.

The plan is what `provision plan` prints and what the Ansible roles consume as the `dflash_plan`
fact, so both paths act on one decision.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import PurePosixPath

from provision.model.deployment import LIBEXEC_DIR, SERVING_STATE_DIR, Deployment, RuleError, check_init_addr
from provision.model.tables import builds, compat, version_tuple
from provision.planning.render import argv_for, env_file_text, launcher, unit_text
from provision.planning.types import (
    CudaPlan,
    DriverPlan,
    FlashinferPlan,
    GpuPlan,
    HostPaths,
    ManagedPath,
    NodePlan,
    Plan,
    PythonEnvPlan,
    SglangPlan,
    SystemdPlan,
    TritonPlan,
)

# What `provision plan` renders for when service.systemd_version is unset (Ubuntu 24.04's); the play
# renders for the version each host reports.
ASSUMED_SYSTEMD = 255


def choose_cuda(dep: Deployment) -> CudaPlan:
    """The toolkit: the pin if any, else the torch build's CUDA, raised to the arch's minimum."""
    first = compat().archs[dep.gpu.arch].first_cuda
    torch_cuda = dep.torch_cuda
    sm = dep.gpu.sm
    if dep.cuda.version is not None:
        version = dep.cuda.version
        reason = f"pinned (cuda.version); {sm} needs >= {first}"
    else:
        same_major = [
            v
            for v in compat().toolkits
            if version_tuple(v)[0] == version_tuple(torch_cuda)[0] and version_tuple(v) >= version_tuple(first)
        ]
        if not same_major:
            raise RuleError(
                "cuda.version",
                f"no supported toolkit compiles {sm} (needs >= {first}) and matches torch's CUDA {torch_cuda}",
            )
        version = torch_cuda if torch_cuda in same_major else min(same_major, key=version_tuple)
        reason = (
            f"{sm} needs >= {first}; SGLang {dep.sglang.release_name} runs torch built for CUDA {torch_cuda}, "
            f"so kernels are JIT-built with CUDA {version}"
        )
    wheels = compat().toolkits[version].pip
    if dep.cuda.method == "pip" and wheels is None:
        with_wheels = [v for v, t in compat().toolkits.items() if t.pip]
        raise RuleError(
            "cuda.method",
            f"NVIDIA's CUDA {version} wheels ship ptxas without nvcc; use nvidia_repo or preinstalled, "
            f"or a toolkit with full wheels: {', '.join(with_wheels)}",
        )
    return CudaPlan(
        version=version,
        home=dep.cuda.home or f"/usr/local/cuda-{version}",
        method=dep.cuda.method,
        arch_min=first,
        reason=reason,
        pip_requirements=wheels.requirements if wheels else [],
        pip_prefix_subdir=wheels.prefix_subdir if wheels else None,
    )


def driver_floor(dep: Deployment, cuda: CudaPlan) -> DriverPlan:
    """The newest floor of the toolkit and of torch's CUDA build: both run on this driver."""
    toolkits = compat().toolkits
    needs = {cuda.version, dep.torch_cuda} & set(toolkits)
    top = max(needs, key=lambda v: version_tuple(toolkits[v].driver_min))
    info = toolkits[top]
    return DriverPlan(
        min=info.driver_min,
        branch=info.driver_branch,
        reason=f"CUDA {top} ships with {info.driver_branch} (>= {info.driver_min})",
    )


def _bundled_ptxas(dep: Deployment, triton_version: str) -> tuple[str, str | None]:
    """(which binary Triton uses for this arch, the CUDA version it comes from, if known)."""
    minor = ".".join(triton_version.split(".")[:2])
    entry = compat().triton_ptxas.get(minor)
    if entry is None:
        return "ptxas", None
    if version_tuple(dep.gpu.arch) >= (10, 0) and entry.ptxas_blackwell:
        return "ptxas-blackwell", entry.ptxas_blackwell
    return "ptxas", entry.ptxas


def plan_triton(dep: Deployment) -> TritonPlan:
    version = dep.triton.version or builds().releases[dep.sglang.release_name].triton
    target = dep.gpu.sm + ("a" if version_tuple(dep.gpu.arch) >= (9, 0) else "")
    first = compat().archs[dep.gpu.arch].first_cuda
    binary, bundled = _bundled_ptxas(dep, version)
    knows = bundled is not None and version_tuple(bundled) >= version_tuple(first)
    mode = dep.triton.ptxas
    if bundled is None and mode == "auto":
        raise RuleError(
            "triton.version",
            f"no ptxas facts for Triton {version}; known: {', '.join(compat().triton_ptxas)}; "
            "or set triton.ptxas to toolkit or bundled",
        )
    if mode == "bundled" and not knows:
        raise RuleError(
            "triton.ptxas",
            f"Triton {version}'s bundled {binary} (CUDA {bundled}) cannot assemble {target}; allowed: auto, toolkit",
        )
    verdict = "knows" if knows else "is too old for"
    bundled_says = f"Triton {version}'s bundled {binary} (CUDA {bundled}) {verdict} {target}"
    if mode == "toolkit":
        override, reason = True, f"forced (triton.ptxas=toolkit); {bundled_says}"
    elif mode == "bundled":
        override, reason = False, f"bundled (triton.ptxas=bundled); {bundled_says}"
    else:
        override, reason = not knows, bundled_says
    return TritonPlan(
        version=version,
        target=target,
        cc=int(dep.gpu.arch.replace(".", "")),
        bundled_knows=knows if bundled is not None else None,
        ptxas_override=override,
        reason=reason,
    )


def sglang_requirement(dep: Deployment) -> str:
    """The pip requirement of the SGLang build (its package lives in the repository's python/)."""
    build = dep.sglang
    if build.source == "git":
        return f"sglang @ git+{build.git_url}@{build.git_ref}#subdirectory=python"
    if build.source == "wheel":
        assert build.wheel is not None  # the model requires it for this source
        # a path becomes a file: URL by pathlib's own quoting (spaces, #, ?, % survive; pip unquotes them)
        return build.wheel if "://" in build.wheel else f"sglang @ {PurePosixPath(build.wheel).as_uri()}"
    return f"sglang=={build.version}"


def plan_python_env(dep: Deployment, triton: TritonPlan) -> PythonEnvPlan:
    """torch and Triton pinned to the build; torch's index chosen for its CUDA build (or CPU)."""
    spec, release = dep.python_env, builds().releases[dep.sglang.release_name]
    index = spec.torch_index_url
    if index is None:
        # PyPI's torch is the release's CUDA build; another CUDA build or the CPU one has its own index
        if spec.torch_variant == "cpu":
            index = "https://download.pytorch.org/whl/cpu"
        elif dep.torch_cuda != release.torch_cuda:
            index = "https://download.pytorch.org/whl/cu" + dep.torch_cuda.replace(".", "")
    requirements = [f"torch=={spec.torch or release.torch}", f"triton=={triton.version}", *spec.extra_requirements]
    return PythonEnvPlan(
        venv=dep.service.venv,
        requirements=requirements,
        torch_index_url=index or None,
        index_url=spec.index_url,
        wheelhouse=spec.wheelhouse,
    )


def flashinfer_arch(arch: str, cuda_version: str) -> str:
    """FlashInfer's spelling: 10.x -> 10.xa; 12.x -> 12.xf from CUDA 12.9 on (12.xa before); 9.0 -> 9.0a."""
    cc = version_tuple(arch)
    if cc >= (12, 0):
        return arch + ("f" if version_tuple(cuda_version) >= (12, 9) else "a")
    return arch + ("a" if cc >= (9, 0) else "")


def plan_nodes(dep: Deployment, host: str, addresses: Mapping[str, str]) -> NodePlan | None:
    if dep.multinode is None:
        return None
    nodes = dep.multinode.nodes
    if host not in nodes:
        raise RuleError("multinode.nodes", f"{host} is not one of the instance's nodes ({', '.join(nodes)})")
    unknown = [n for n in nodes if n not in addresses]
    if unknown:
        raise RuleError("multinode.nodes", f"not in the inventory: {', '.join(unknown)}")
    head = dep.multinode.init_addr or addresses[nodes[0]]
    try:
        check_init_addr(head)
    except ValueError as err:
        raise RuleError("multinode.init_addr", f"{nodes[0]}'s address (ansible_host) {err}") from None
    return NodePlan(nnodes=len(nodes), node_rank=nodes.index(host), dist_init_addr=f"{head}:{dep.multinode.init_port}")


def build_plan(
    dep: Deployment, host: str, groups: list[str], addresses: Mapping[str, str], notes: list[str] | None = None
) -> Plan:
    """addresses: inventory host name -> the address it is reached at (for multi-node init); notes: what
    the caller found worth saying (settings without effect)."""
    cuda = choose_cuda(dep)
    triton = plan_triton(dep)
    release = builds().releases[dep.sglang.release_name]
    flashinfer = FlashinferPlan(
        version=release.flashinfer,
        arch_list=dep.flashinfer.arch_list or flashinfer_arch(dep.gpu.arch, cuda.version),
        workspace_base=dep.flashinfer.workspace_base,
        requirement=f"flashinfer-python=={release.flashinfer}",
        aot_modules=list(dep.flashinfer.aot_modules),
        max_jobs=dep.flashinfer.max_jobs,
    )
    nodes = plan_nodes(dep, host, addresses)
    dialect = builds().resolved_dialect(dep.sglang.dialect_name)
    spelling = dialect.algorithms.get(dep.serve.algorithm)
    notes = [*(notes or []), *([spelling.note] if spelling and spelling.note else [])]
    if dep.serve.speculative and dep.drafter and dep.serve.block_size > dep.drafter.block_size:
        notes.append(
            f"block size {dep.serve.block_size} exceeds the drafter's trained {dep.drafter.block_size} "
            "(allowed by serve.allow_untrained_depth): expect low acceptance at the untrained depths"
        )
    systemd = SystemdPlan(
        version=dep.service.systemd_version or ASSUMED_SYSTEMD, assumed=dep.service.systemd_version is None
    )
    if systemd.assumed:
        notes.append(
            f"the unit is rendered for systemd {ASSUMED_SYSTEMD} (assumed: service.systemd_version is unset); "
            "apply renders it for the version each host reports"
        )
    argv = argv_for(dep, dialect, nodes)
    env = _environment(dep, cuda, triton, flashinfer, argv.env)
    # where the host itself reaches the server (a wildcard bind is reached on loopback)
    address = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(dep.serve.host, dep.serve.host)
    plan_fields = dict(
        host=host,
        groups=groups,
        gpu=GpuPlan(**dep.gpu.model_dump(), sm=dep.gpu.sm),
        cuda=cuda,
        driver=driver_floor(dep, cuda),
        triton=triton,
        flashinfer=flashinfer,
        sglang=SglangPlan(
            source=dep.sglang.source,
            version=dep.sglang.release_name,
            git_url=dep.sglang.git_url if dep.sglang.source == "git" else None,
            git_ref=dep.sglang.git_ref if dep.sglang.source == "git" else None,
            wheel=dep.sglang.wheel if dep.sglang.source == "wheel" else None,
            dialect=dep.sglang.dialect_name,
            torch=dep.python_env.torch or release.torch,
            torch_cuda=dep.torch_cuda,
            requirement=sglang_requirement(dep),
            install_deps=dep.sglang.install_deps,
        ),
        python_env=plan_python_env(dep, triton),
        multinode=nodes,
        systemd=systemd,
        managed_paths=managed_paths(dep, cuda.home),
        paths=host_paths(dep),
        config=dep,
        env=env,
        argv=argv.argv,
        server_args=argv.argv[len(launcher(dep)) :],
        service_address=address,
        service_url=f"http://{url_host(address)}:{dep.serve.port}",
        notes=notes,
    )
    env_file = env_file_text(env, lambda name: ENV_FIELDS.get(name, f"serve.env.{name}"))
    return Plan(**plan_fields, env_file=env_file, unit=unit_text(dep, argv, systemd))


def host_paths(dep: Deployment) -> HostPaths:
    svc = dep.service
    return HostPaths(
        unit=svc.unit_path,
        env_file=svc.env_path,
        secrets_env=svc.secrets_path if dep.serve.api_key_file else None,
        build_json=svc.build_json_path,
        drafter_json=svc.drafter_json_path,
        state_dir=svc.state_dir,
        serving_state=SERVING_STATE_DIR,
        libexec=LIBEXEC_DIR,
        argcheck=f"{LIBEXEC_DIR}/sglang_argcheck.py",
        standin=svc.standin_path if svc.launcher == "standin" else None,
        watchdog_settings=svc.watchdog_settings_path,
        watchdog_dir=svc.watchdog_dir,
    )


def managed_paths(dep: Deployment, cuda_home: str) -> list[ManagedPath]:
    """What the play's ownership guard checks and records: the paths apply creates or changes."""
    return [
        ManagedPath(
            path=m.path,
            type=m.type,
            owner=m.owner,
            mode=m.mode,
            field=m.field,
            own_dir=dep.own_dir(m.path) if m.rooted else None,
        )  # fmt: skip
        for m in dep.managed(cuda_home)
        if m.guarded
    ]


def url_host(address: str) -> str:
    """An address as a URL or an ssh forward spells it: IPv6 in brackets."""
    return f"[{address}]" if ":" in address else address


# What the plan itself puts in the environment, and the field to set instead of serve.env.
ENV_FIELDS = {
    "CUDA_HOME": "cuda.home", "PATH": "service.venv and cuda.home", "TORCH_CUDA_ARCH_LIST": "gpu.arch",
    "TRITON_CACHE_DIR": "triton.cache_dir", "FLASHINFER_CUDA_ARCH_LIST": "flashinfer.arch_list",
    "FLASHINFER_WORKSPACE_BASE": "flashinfer.workspace_base", "TRITON_PTXAS_PATH": "triton.ptxas",
    "TRITON_PTXAS_BLACKWELL_PATH": "triton.ptxas", "NCCL_P2P_DISABLE": "serve.nccl_p2p_disable",
    "HOME": "service.name (HOME is the state directory /var/lib/NAME)",
}  # fmt: skip


def _environment(
    dep: Deployment, cuda: CudaPlan, triton: TritonPlan, flashinfer: FlashinferPlan, algo_env: dict[str, str]
) -> dict[str, str]:
    env = {
        "CUDA_HOME": cuda.home,
        # ninja and nvcc must be found by FlashInfer's JIT; systemd's default PATH has neither.
        "PATH": f"{dep.service.venv}/bin:{cuda.home}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "TORCH_CUDA_ARCH_LIST": dep.gpu.arch + ("a" if version_tuple(dep.gpu.arch) >= (9, 0) else ""),
        "TRITON_CACHE_DIR": dep.triton.cache_dir,
        "FLASHINFER_CUDA_ARCH_LIST": flashinfer.arch_list,
        "FLASHINFER_WORKSPACE_BASE": flashinfer.workspace_base,
    }
    if triton.ptxas_override:
        env["TRITON_PTXAS_PATH"] = f"{cuda.home}/bin/ptxas"
        if version_tuple(dep.gpu.arch) >= (10, 0):
            env["TRITON_PTXAS_BLACKWELL_PATH"] = f"{cuda.home}/bin/ptxas"
    if dep.serve.nccl_p2p_disable:
        env["NCCL_P2P_DISABLE"] = "1"
    for name in dep.serve.env:
        owner = ENV_FIELDS.get(name) or ("serve.algorithm's settings (serve.ddtree)" if name in algo_env else None)
        if owner is None and name.startswith("SGLANG_DDTREE_"):
            owner = "serve.ddtree"
        if owner is not None:
            raise RuleError("serve.env", f"{name} is set by the deployment itself; set {owner} instead")
    return {**env, **algo_env, **dep.serve.env}


def check_instances(plans: list[Plan]) -> None:
    """Hosts that form one multi-node instance must agree on it and be planned together."""
    by_host = {p.host: p for p in plans}
    for plan in plans:
        mn = plan.config.multinode
        if mn is None:
            continue
        for node in mn.nodes:
            other = by_host.get(node)
            if other is None:
                continue
            if other.config.multinode != mn or other.config.serve != plan.config.serve:
                raise RuleError(
                    "multinode.nodes",
                    f"{plan.host} and {node} are nodes of one instance but their multinode or serve settings differ",
                )


def check_host_type(host: str, types: list[str]) -> None:
    if len(types) > 1:
        raise RuleError("groups", f"host {host} is in host types {' and '.join(types)}; a host has one type")


def check_fleet(plans: list[Plan], types_of: Callable[[str], list[str]]) -> None:
    """The rules across hosts, in one place for `provision plan` and the play (dflash.provision.fleet): a host has
    one host type (its groups with a playbook of their own); a multi-node instance agrees on itself and spans
    one host type. types_of: an inventory host's types."""
    for plan in plans:
        check_host_type(plan.host, types_of(plan.host))
    check_instances(plans)
    for plan in plans:
        nodes = plan.config.multinode.nodes if plan.config.multinode else []
        kinds = {node: types_of(node) for node in nodes}
        if len({tuple(k) for k in kinds.values()}) > 1:
            mixed = ", ".join(f"{node} ({'/'.join(k) or 'no type'})" for node, k in kinds.items())
            raise RuleError("multinode.nodes", f"one instance spans one host type; got {mixed}")
