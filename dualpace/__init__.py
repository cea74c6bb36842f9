"""DualPace: LLM serving with an independently scheduled CPU decode tier beside the GPU."""

from dualpace.sampling.params import SamplingParams

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "__version__"]


def __getattr__(name: str):
    # LLM pulls in torch and the model code; import it only when asked for.
    if name == "LLM":
        from dualpace.llm import LLM

        return LLM
    raise AttributeError(f"module 'dualpace' has no attribute {name!r}")
