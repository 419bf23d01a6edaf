"""llama.cpp (through llama-cpp-python's low-level API) as a reference engine, with per-tensor graph capture.

``LlamaCppEngine`` implements :class:`inference_engine.protocol.Engine`; ``GraphNode`` describes one node of the
graph llama.cpp evaluated (``LlamaCppEngine.graph_nodes``).
"""

from validation.llamacpp.capture import GraphNode, is_graph_name
from validation.llamacpp.engine import LlamaCppEngine

__all__ = ["GraphNode", "LlamaCppEngine", "is_graph_name"]
