"""What accounts reads of inference's rows, which it cannot import (accounts is the lower layer)."""

from __future__ import annotations

from typing import Protocol


class Deployment(Protocol):
    """A model deployment, as a plan's limits and prices see it."""

    @property
    def id(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def max_context(self) -> int: ...
    @property
    def default_max_tokens(self) -> int: ...


class ListedDeployment(Deployment, Protocol):
    """A deployment as a model picker lists it: its public model name and its label."""

    @property
    def public_model(self) -> str: ...
    @property
    def label(self) -> str: ...
