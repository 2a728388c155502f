"""selected: which of the play's role tags this run's --tags and --skip-tags select, by Ansible's own rule
(Taggable.evaluate_tags), so that the play's own steps around the roles (the look, the claim, the record) run
whenever any role does: tagged with every role's tag, `--skip-tags driver` skipped them too, and the roles
ran without their paths being claimed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ansible.playbook.base import Base
from ansible.playbook.taggable import Taggable


class _Tagged(Base, Taggable):
    """A task that carries only the given tags: no parent block, role or play to inherit more from."""

    def _get_all_taggable_objects(self) -> tuple[Taggable, ...]:
        return (self,)


def selected(tags: Sequence[str], run_tags: Sequence[str], skip_tags: Sequence[str]) -> list[str]:
    """The tags among tags whose tasks run under ansible_run_tags and ansible_skip_tags."""
    chosen = []
    for tag in tags:
        task = _Tagged()
        task.tags = [tag]
        if task.evaluate_tags(list(run_tags), list(skip_tags), {}):
            chosen.append(tag)
    return chosen


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"selected": selected}
