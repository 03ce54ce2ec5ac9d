"""What a server of several models (pool.py) answers about them: OpenAI's /v1/models, Ollama's
/api/tags and /api/ps, /health's figures, and /metrics, every loaded model's series with a
`served_model` label beside the server's own (errors answered before a model was chosen).

The label is `served_model`, not `model`: two series already say `model` for which of a
served model's models (target or draft) they count.
"""

from __future__ import annotations

import hashlib
import time

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric

from draftwise.server import ollama_protocol as o
from draftwise.server import protocol as p
from draftwise.server.keep_alive import MAX_DURATION_S
from draftwise.server.metrics import ServerMetrics
from draftwise.server.ollama_answers import timestamp
from draftwise.server.pool import ModelPool, ModelSource

LABEL = "served_model"


def model_cards(pool: ModelPool, created: int) -> p.ModelList:
    """Each model once, by its served name, with the other names it answers to."""
    return p.ModelList(data=[model_card(pool, s.name, created) for s in pool.sources])


def model_card(pool: ModelPool, name: str, created: int | None = None) -> p.ModelCard:
    created = pool.created if created is None else created
    return p.ModelCard(id=name, created=created, aliases=list(pool.names_of(name)))


def _details(source: ModelSource) -> o.ModelDetails:
    d = source.details
    family = str(d.get("family", ""))
    return o.ModelDetails(
        format=str(d.get("format", "gguf")),
        family=family,
        families=[family] if family else [],
        parameter_size=str(d.get("parameter_size", "")),
        quantization_level=str(d.get("quantization_level", "")),
    )


def _digest(source: ModelSource) -> str:
    return str(source.details.get("digest") or hashlib.sha256(source.name.encode()).hexdigest())


def ollama_tags(pool: ModelPool, created: float) -> dict:
    listed = []
    for s in pool.sources:
        name = o.tagged(s.name)
        listed.append(
            o.ListedModel(
                name=name,
                model=name,
                modified_at=timestamp(created),
                size=s.size_bytes,
                digest=_digest(s),
                details=_details(s),
                aliases=[alias for alias in pool.names_of(s.name) if alias != name],
            ).model_dump()
        )
    return {"models": listed}


def ollama_ps(pool: ModelPool) -> dict:
    """The loaded models, their memory and until when they stay (kept for ever: Ollama's far
    future, its longest duration from now, about 292 years)."""
    sources = {s.name: s for s in pool.sources}
    running = []
    for loaded in pool.loaded():
        source, state = sources[loaded.name], pool.state_of(loaded.name)
        expires = loaded.expires_at if loaded.expires_at is not None else time.time() + MAX_DURATION_S
        name = o.tagged(loaded.name)
        running.append(
            o.RunningModel(
                name=name,
                model=name,
                size=loaded.memory_bytes,
                digest=_digest(source),
                details=_details(source),
                expires_at=timestamp(expires),
                size_vram=0,
                context_length=state.engine.target.n_ctx if state is not None else 0,
            ).model_dump()
        )
    return {"models": running}


def health(pool: ModelPool) -> p.Health:
    """The loaded models' slots and queues together; `model` is the default one's name."""
    states = [s for s in (pool.state_of(m.name) for m in pool.loaded()) if s is not None]
    return p.Health(
        model=pool.default,
        queue_length=sum(s.serving.queue_length for s in states),
        running=any(s.serving.running for s in states),
        slots=sum(s.engine.num_slots for s in states),
        active=sum(len(s.serving.running) for s in states),
        models=[s.model_name for s in states],
    )


class _Merged:
    """A collector of the server's own registry and every loaded model's, each model's samples
    labelled with its name (prometheus_client's exposition reads any object with collect())."""

    def __init__(self, own: ServerMetrics, pool: ModelPool) -> None:
        self.own, self.pool = own, pool

    def collect(self):
        families: dict[str, Metric] = {}
        sources = [(None, self.own.registry)]
        sources += [(m.name, s.metrics.registry) for m in self.pool.loaded() if (s := self.pool.state_of(m.name))]
        for model, registry in sources:
            for family in registry.collect():
                merged = families.get(family.name)
                if merged is None:
                    merged = families[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                elif family.name.startswith("process_"):
                    continue  # one process: its memory and CPU once
                for sample in family.samples:
                    labels = sample.labels if model is None else {**sample.labels, LABEL: model}
                    merged.samples.append(sample._replace(labels=labels))
        return list(families.values())


def render_metrics(own: ServerMetrics, pool: ModelPool) -> bytes:
    return generate_latest(_Merged(own, pool))


def ollama_show(pool: ModelPool, name: str) -> o.ShowResponse:
    """/api/show of a model, loaded or not, the same: what its source says (its GGUF header's
    facts), never what the loaded engine would (a client reading its capabilities before and
    after the load must see one answer)."""
    source = next(s for s in pool.sources if s.name == name)
    d = source.details
    n_ctx = int(d.get("context_length") or 0)
    return o.ShowResponse(
        modelfile=f"# draftwise serves this model; it has no Modelfile\nFROM {o.tagged(name)}\n",
        parameters=f"num_ctx {n_ctx}" if n_ctx else "",
        template="",
        details=_details(source),
        model_info={
            "general.architecture": str(d.get("family", "")),
            "general.name": name,
            **({f"{d['family']}.context_length": n_ctx} if d.get("family") and n_ctx else {}),
        },
        capabilities=list(d.get("capabilities", ("completion",))),
        modified_at=timestamp(pool.created),
    )
