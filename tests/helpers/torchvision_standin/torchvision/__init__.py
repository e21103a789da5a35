"""A stand-in for torchvision in the engine matrix's SGLang 0.5.15/0.5.20 environments: their
import chain (sglang.srt.utils.common, transformers' image utilities) imports these names at
module level; nothing the index-K accessor runs uses them. No CPU build of torchvision for this
torch is served to CI; the PyPI wheel needs CUDA torch."""
__version__ = "0.0.0+stand-in"
