"""Drafters: cheap proposers of the next few tokens (see base.Drafter)."""

from draftwise.drafters.base import BaseDrafter, Drafter
from draftwise.drafters.model import ModelDrafter
from draftwise.drafters.ngram import NgramDrafter

__all__ = ["BaseDrafter", "Drafter", "ModelDrafter", "NgramDrafter"]
