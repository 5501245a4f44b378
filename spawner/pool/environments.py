"""Environments: the software choices a profile offers, as KubeSpawner's ``profile_options`` offer images.

A researcher picks the devices (the profile) and then what runs on them: on Kubernetes a container image, on
one host a Python environment (its ``bin`` folder goes first on the server's and the job's ``PATH``, so
``python`` and ``jupyterhub-singleuser`` are that environment's). An environment may need a least CUDA
version or compute capability (:mod:`.software`); placement then honours it, and one that no GPU of the pool
can ever run is shown disabled in the form, saying why, and refused naming the field
(:func:`.profiles.environments_never_fit`, the same rule as placement's). A server's environment is in its
``GPUPOOL_ENVIRONMENT``, so a job can ask for the same one as the notebook it came from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .software import ANY_SOFTWARE, Software

FIELD = "environment"  # the REST body key, the job field and user_options key that name the choice
ENV_VAR = "GPUPOOL_ENVIRONMENT"  # the environment a server or job runs in, as the slug


class UnknownEnvironment(LookupError):
    """An environment the profile does not offer; the message lists the ones it does."""


class UnrunnableEnvironment(ValueError):
    """An environment the profile offers that no GPU of the pool can ever run; the message names the ones it
    can and why not this one."""


@dataclass(frozen=True)
class Environment:
    """One choice: its slug and name, where its software is (``bin`` on one host, ``image`` on Kubernetes),
    and what it needs of a GPU."""

    slug: str
    display_name: str
    bin: str = ""
    image: str = ""
    software: Software = ANY_SOFTWARE
    default: bool = False

    def describe(self) -> str:
        """``PyTorch 2.5 (needs CUDA 12.4)``: the name and what it needs, as the form lists it."""
        needs = [f"CUDA {self.software.min_cuda}"] if self.software.min_cuda else []
        if self.software.min_compute_capability:
            needs.append(f"compute capability {self.software.min_compute_capability}")
        return self.display_name + (f" (needs {' and '.join(needs)})" if needs else "")


def choose(environments: Sequence[Environment], slug: str | None, profile: str) -> Environment | None:
    """The environment ``slug`` names among ``environments`` (the default one, else the first, when it names
    none); None for a profile that offers none. :class:`UnknownEnvironment` names the valid ones."""
    if not environments:
        if slug:
            raise UnknownEnvironment(f"{FIELD}: profile {profile} offers no environments, got {slug!r}")
        return None
    if not slug:
        return next((e for e in environments if e.default), environments[0])
    found = next((e for e in environments if e.slug == slug), None)
    if found is None:
        valid = ", ".join(e.slug for e in environments)
        raise UnknownEnvironment(f"{FIELD}: profile {profile} offers {valid}; got {slug!r}")
    return found


def merged(software: Software, environment: Environment | None) -> Software:
    """The profile's own needs with the environment's on top (each field the environment sets wins)."""
    if environment is None or not environment.software:
        return software
    wanted = environment.software
    return Software(
        wanted.min_cuda or software.min_cuda,
        wanted.min_compute_capability or software.min_compute_capability,
    )
