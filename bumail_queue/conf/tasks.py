"""``TASKS``: the framework the delivery tasks are sent to (docs/tasks.md)."""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Mapping
from typing import Any, Final

from django.conf import settings as django_settings

#: The task frameworks ``TASKS`` may name, each with the module of its delivery task.
TASK_FRAMEWORKS: Final = {
    "django": "bumail_queue.tasks.django",
    "celery": "bumail_queue.tasks.celery",
}
#: What each framework needs importable: Django 6's own module, or the backport.
_TASK_FRAMEWORK_MODULES: Final = {"django": ("django.tasks", "django_tasks"), "celery": ("celery",)}
_TASK_KEYS: Final = {
    "django": {"FRAMEWORK", "BACKEND", "QUEUE", "CLAIM_SECONDS"},
    "celery": {"FRAMEWORK", "QUEUE", "CLAIM_SECONDS"},
}
DEFAULT_TASK_CLAIM_SECONDS: Final = 60.0


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class TaskSettings:
    """``TASKS``: the framework the delivery tasks are sent to, and how (docs/tasks.md)."""

    framework: str  # a key of TASK_FRAMEWORKS
    module: str  # the module of its delivery task
    backend: str = "default"  # the django.tasks backend alias
    queue: str | None = None  # None: the framework's own default (or Celery's routes)
    claim_seconds: float = DEFAULT_TASK_CLAIM_SECONDS


def task_problems(value: Any) -> list[str]:
    """What is wrong with ``TASKS``; finding the framework imports nothing of it."""
    if value is None:
        return []
    if isinstance(value, str):
        value = {"FRAMEWORK": value}
    if not isinstance(value, Mapping):
        return [f"must be None, 'django', 'celery' or a dict with 'FRAMEWORK'; got {value!r}"]
    framework = value.get("FRAMEWORK")
    if framework not in TASK_FRAMEWORKS:
        return [f"names the framework {framework!r}; it must be one of {', '.join(map(repr, TASK_FRAMEWORKS))}"]
    problems = [
        f"has a key a {framework!r} set-up does not take: {key!r} (allowed: {', '.join(sorted(_TASK_KEYS[framework]))})"
        for key in sorted(set(value) - _TASK_KEYS[framework], key=repr)
    ]
    for key in ("BACKEND", "QUEUE"):
        if key in value and not (isinstance(value[key], str) and value[key]):
            problems.append(f"['{key}'] must be a non-empty string; got {value[key]!r}")
    seconds = value.get("CLAIM_SECONDS", DEFAULT_TASK_CLAIM_SECONDS)
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 < seconds <= 3600:
        problems.append(f"['CLAIM_SECONDS'] must be a number of seconds above 0 and at most 3600; got {seconds!r}")
    if not any(_importable(module) for module in _TASK_FRAMEWORK_MODULES[framework]):
        problems.append(_missing_framework(framework))
    elif framework == "django":
        problems += _django_task_backend_problems(value.get("BACKEND", "default"))
    return problems


def task_framework(raw: Any) -> str | None:
    """The framework a raw ``BUMAIL_QUEUE`` names in ``TASKS``, read without validating
    the rest (``None``: off, or a value ``validate()`` refuses)."""
    value = raw.get("TASKS") if isinstance(raw, Mapping) else None
    framework = value.get("FRAMEWORK") if isinstance(value, Mapping) else value
    return framework if isinstance(framework, str) and framework in TASK_FRAMEWORKS else None


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # its parent package is missing
        return False


def _missing_framework(framework: str) -> str:
    if framework == "celery":
        return "names Celery, which is not installed: pip install 'bumail_queue[celery]'"
    return (
        "names django.tasks, which Django 6.0 brings and Django 5.2 has from the django-tasks package: "
        "pip install 'bumail_queue[tasks]', or upgrade Django"
    )


def _django_task_backend_problems(backend: Any) -> list[str]:
    if not isinstance(backend, str) or not backend:
        return []  # said above
    # Django's TASKS (and the backport's) default to one "default" backend.
    aliases = getattr(django_settings, "TASKS", None) or {"default": {}}
    if backend in aliases:
        return []
    return [f"['BACKEND'] is {backend!r}, which is not an alias of the TASKS setting ({', '.join(map(repr, aliases))})"]


def tasks_from(raw: Any) -> TaskSettings | None:
    if raw is None:
        return None
    value = {"FRAMEWORK": raw} if isinstance(raw, str) else raw
    return TaskSettings(
        framework=value["FRAMEWORK"],
        module=TASK_FRAMEWORKS[value["FRAMEWORK"]],
        backend=value.get("BACKEND", "default"),
        queue=value.get("QUEUE"),
        claim_seconds=float(value.get("CLAIM_SECONDS", DEFAULT_TASK_CLAIM_SECONDS)),
    )
