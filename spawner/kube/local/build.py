"""Build the control plane's programs from Kubernetes' and etcd's own Go modules, at pinned versions.

Nothing prebuilt is downloaded: the Go module proxy serves the sources, ``go build`` compiles them. The programs
land in ``<cache>/<versions>/bin`` (``GPUPOOL_KUBE_CACHE``, default ``~/.cache/gpupool/kube``), outside the
repository, and are reused while the pinned versions stay the same. Go's own module and build caches
(``GOMODCACHE``, ``GOCACHE``) are Go's defaults, so a second build after a version change reuses most work.

``k8s.io/kubernetes`` is not meant to be imported as a library: its ``go.mod`` points the ``k8s.io/*``
staging modules at folders of its own repository. A module that builds its commands therefore repeats those
``replace`` lines, naming each staging module at the matching ``v0.x`` release.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

KUBERNETES_VERSION = "1.34.4"
ETCD_VERSION = "3.6.5"

# The staging modules k8s.io/kubernetes replaces with folders of its own (its go.mod at KUBERNETES_VERSION).
STAGING_MODULES = (
    "api", "apiextensions-apiserver", "apimachinery", "apiserver", "cli-runtime", "client-go",
    "cloud-provider", "cluster-bootstrap", "code-generator", "component-base", "component-helpers",
    "controller-manager", "cri-api", "cri-client", "csi-translation-lib", "dynamic-resource-allocation",
    "endpointslice", "externaljwt", "kms", "kube-aggregator", "kube-controller-manager", "kube-proxy",
    "kube-scheduler", "kubectl", "kubelet", "metrics", "mount-utils", "pod-security-admission",
    "sample-apiserver", "sample-cli-plugin", "sample-controller",
)  # fmt: skip
KUBE_COMMANDS = ("kube-apiserver", "kube-scheduler", "kube-controller-manager")


class BuildError(RuntimeError):
    """The control plane could not be built; the message says which step and why."""


@dataclass(frozen=True)
class Programs:
    """Paths of the built programs."""

    etcd: Path
    kube_apiserver: Path
    kube_scheduler: Path
    kube_controller_manager: Path


def cache_root() -> Path:
    configured = os.environ.get("GPUPOOL_KUBE_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "gpupool" / "kube"


def build_dir(root: Path | None = None) -> Path:
    return (root or cache_root()) / f"kubernetes-{KUBERNETES_VERSION}-etcd-{ETCD_VERSION}"


def programs(root: Path | None = None) -> Programs:
    bin_dir = build_dir(root) / "bin"
    return Programs(
        bin_dir / "etcd",
        bin_dir / "kube-apiserver",
        bin_dir / "kube-scheduler",
        bin_dir / "kube-controller-manager",
    )


def is_built(root: Path | None = None) -> bool:
    return all(path.is_file() for path in vars(programs(root)).values())


def kubernetes_go_mod() -> str:
    minor = "0." + KUBERNETES_VERSION.split(".", 1)[1]
    replaces = "\n".join(f"\tk8s.io/{m} => k8s.io/{m} v{minor}" for m in STAGING_MODULES)
    return (
        "module gpupool.local/kubernetes\n\ngo 1.24.0\n\n"
        f"require k8s.io/kubernetes v{KUBERNETES_VERSION}\n\nreplace (\n{replaces}\n)\n"
    )


# The commands are packages of k8s.io/kubernetes; a build-tagged file keeps them in the module's graph.
KUBERNETES_TOOLS_GO = (
    "//go:build tools\n\npackage tools\n\nimport (\n"
    + "".join(f'\t_ "k8s.io/kubernetes/cmd/{c}"\n' for c in KUBE_COMMANDS)
    + ")\n"
)

ETCD_GO_MOD = f"module gpupool.local/etcd\n\ngo 1.24.0\n\nrequire go.etcd.io/etcd/server/v3 v{ETCD_VERSION}\n"
# etcd's own main package lives in the repository's root module; its server module exposes the same entry.
ETCD_MAIN_GO = (
    'package main\n\nimport (\n\t"os"\n\n\t"go.etcd.io/etcd/server/v3/etcdmain"\n)\n\n'
    "func main() { etcdmain.Main(os.Args) }\n"
)


def ensure_built(root: Path | None = None, log: Path | None = None) -> Programs:
    """The programs, building them first when this version pair has not been built yet.

    The first build takes a while (see the README); its output goes to ``log`` (default: ``build.log`` in
    the build folder). A failure raises :class:`BuildError` with the end of that log.
    """
    target = build_dir(root)
    if is_built(root):
        return programs(root)
    go = shutil.which("go")
    if go is None:
        raise BuildError("building the Kubernetes control plane needs Go (go 1.24 or newer on PATH)")
    log = log or target / "build.log"
    target.mkdir(parents=True, exist_ok=True)
    bin_dir = target / "bin"
    staging = target / "bin.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    kube_src, etcd_src = target / "src-kubernetes", target / "src-etcd"
    _write(kube_src, {"go.mod": kubernetes_go_mod(), "tools.go": KUBERNETES_TOOLS_GO})
    _write(etcd_src, {"go.mod": ETCD_GO_MOD, "main.go": ETCD_MAIN_GO})
    build = [go, "build", "-trimpath", "-ldflags=-s -w", "-o", str(staging) + "/"]
    steps = [
        (etcd_src, [go, "mod", "tidy"], "resolving etcd's modules"),
        (etcd_src, [*build[:-2], "-o", str(staging / "etcd"), "."], f"building etcd v{ETCD_VERSION}"),
        (kube_src, [go, "mod", "tidy"], "resolving Kubernetes' modules"),
        (
            kube_src,
            [*build, *(f"k8s.io/kubernetes/cmd/{c}" for c in KUBE_COMMANDS)],
            f"building Kubernetes v{KUBERNETES_VERSION}",
        ),
    ]
    with log.open("a") as out:
        for cwd, command, what in steps:
            print(f"gpupool: {what} (go, into {target})", file=sys.stderr, flush=True)
            out.write(f"$ {' '.join(command)}\n")
            out.flush()
            env = os.environ | {"GOFLAGS": "-mod=mod", "CGO_ENABLED": "0"}
            done = subprocess.run(command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env)
            if done.returncode != 0:
                out.flush()
                tail = log.read_text(errors="replace")[-3000:]
                raise BuildError(f"{what} failed (exit {done.returncode}); the end of {log}:\n{tail}")
    shutil.rmtree(bin_dir, ignore_errors=True)
    staging.rename(bin_dir)  # all four or none: a half-finished build is never taken for a build
    return programs(root)


def _write(folder: Path, files: dict[str, str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)


def main() -> int:
    """``python -m gpupool.spawner.kube.local.build``: build (or find) the programs and print their folder."""
    try:
        built = ensure_built()
    except BuildError as error:
        print(f"gpupool: {error}", file=sys.stderr)
        return 1
    print(built.etcd.parent)
    return 0


if __name__ == "__main__":
    sys.exit(main())
