"""Settings an ``-f`` file gives that nothing reads: ``c.Spawner.start_timout = 60`` is a typo, not a choice.

traitlets warns of an unknown name only when it makes an instance of the class, in the hub's log: for a
spawner that is at the first spawn, long after ``gpupool up`` said where to log in. A first-day trial's
misspelt ``start_timeout`` went unnoticed. So ``gpupool up`` stops at start on a name that no class the hub
runs with has, as it does for the gpupool service's own settings (``up_service_config``).

A section is judged only when it names one of those classes or a class they inherit from; a section for a
class the hub does not run with (``c.KubeGPUSpawner`` on one host, a plug-in's) is left alone.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from traitlets.config import Config, Configurable


def unknown_setting(config: Config, classes: Iterable[type[Configurable]]) -> str | None:
    """The first ``c.Section.name`` of ``config`` that no class of ``classes`` whose ancestry names
    ``Section`` can be set by, in words with the closest name it has; None when every judged one is known."""
    classes = list(classes)
    for section, settings in config.items():
        if not isinstance(settings, Config):
            continue
        readers = [cls for cls in classes if section in (k.__name__ for k in cls.mro())]
        if not readers:
            continue
        known = sorted({name for cls in readers for name in cls.class_trait_names(config=True)})
        for name in settings:
            if name not in known:
                close = difflib.get_close_matches(name, known, n=1)
                hint = f"; did you mean {close[0]}?" if close else ""
                return f"c.{section}.{name}: {section} has no such setting{hint}"
    return None
