"""Recurrent networks as layer graphs, after plain PyTorch ``nn`` modules.

Every builder returns ``(inputs, layers)``; :mod:`app.domain.zoo` wraps them into zoo entries.
"""

from __future__ import annotations

from typing import Any

from app.domain.graph.analysis import InputDecl
from app.domain.graph.ops import TensorKind

Layer = dict[str, Any]
Graph = tuple[tuple[InputDecl, ...], list[Layer]]

TOKENS = InputDecl(name="input_ids", shape=("batch", "seq"), kind=TensorKind.INDEX)


def lstm_classifier(
    *,
    vocab: int = 20000,
    embed: int = 128,
    hidden: int = 256,
    layers: int = 1,
    classes: int = 2,
    bidirectional: bool = False,
    cell: str = "lstm",
) -> Graph:
    """``nn.Embedding`` -> ``nn.LSTM(batch_first=True)`` (or ``nn.GRU`` / ``nn.RNN``: ``cell``
    ``gru`` / ``rnn``) -> last time step -> ``nn.Linear``."""
    lstm: Layer = {"name": cell, "op": cell, "hidden_size": hidden}
    if layers != 1:
        lstm["num_layers"] = layers
    if bidirectional:
        lstm["bidirectional"] = True
    graph = [
        {"name": "embedding", "op": "embedding", "num_embeddings": vocab, "embedding_dim": embed},
        lstm,
        {"name": "last_step", "op": "select", "dim": 1, "index": -1},
        {"name": "fc", "op": "linear", "out_features": classes},
    ]
    return (TOKENS,), graph
