"""Layer 2 — sampling rules and draws through Gaussian kernels."""

from .kernels import KernelDraws, draw_from_kernel
from .rules import GaussHermite, MonteCarlo, SamplingRule, ScrambledSobol, SymmetricSobol, get_rule

__all__ = [
    "GaussHermite",
    "KernelDraws",
    "MonteCarlo",
    "SamplingRule",
    "ScrambledSobol",
    "SymmetricSobol",
    "draw_from_kernel",
    "get_rule",
]
