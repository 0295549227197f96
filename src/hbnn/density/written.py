""":mod:`hbnn.density.kernel`'s log density with the network's pass written out for one network's widths.

The generic kernel loops over layers, units and rows with sizes it reads at run time, so every (input, output) pair
of units is its own loop over a group's rows, which loads and stores the activations each time: on small networks
many short loops per group, whose set-up costs more than their arithmetic (measured: benchmarks/FINDINGS.md, section
'Measurements behind code comments'). With the widths known when the code is written, each layer is one loop over
rows that holds every unit of a row in registers, and the backward pass is one loop that keeps the gradient of every
weight as its own accumulator; LLVM vectorises both over rows. Each group's weights from the sampler's coordinates
and their gradient back to them (``_group_weights``, ``_group_chain_rule``) are loops of constant length too.

:func:`logp_grad_for` writes the functions for a network (features, hidden widths, bias) as Python
source into a module file under :func:`hbnn.density.modules.cache_dir`, named by a hash of that source, and imports it:
the module compiles :mod:`hbnn.density.kernel`'s own ``_group_loglik`` and ``logp_grad`` (their source, unchanged)
around the written-out ``_forward``, ``_backward``, ``_group_weights`` and ``_group_chain_rule``, so the
density and its checks are the kernel's, and numba's disk cache serves every process after the first.
Networks past :data:`MAX_WEIGHTS` weights per group (one accumulator each) get a module of the generic loops.

:func:`callback_for` writes nutpie's callback around a network's ``logp_grad`` into a module of its own (one per
network and position of the buffer in ``user_data``), and :func:`expand_callback` nutpie's expand callback, so
numba's disk cache serves them too instead of a compile in every process that samples.

Every fit samples code written here, and only here, loaded by :func:`hbnn.density.modules.load`.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import logging
from collections.abc import Sequence
from pathlib import Path

from hbnn.density import callbacks, kernel, modules, numerics
from hbnn.model import activations, likelihoods
from hbnn.model.network import LayerSpec, layer_specs

log = logging.getLogger(__name__)


MAX_WEIGHTS = 128  # per group; past it the generic loops (written out, the backward pass keeps an accumulator a weight)


_DECORATOR = modules.INLINE


def _layers(specs: Sequence[LayerSpec], bias: bool) -> list[tuple[int, int]]:
    """Each layer's ``(inputs without the bias row, outputs)`` of ``specs`` (:func:`hbnn.model.network.layer_specs`)."""
    return [(s.shape[0] - int(bias), s.shape[1] if len(s.shape) == 2 else 1) for s in specs]


def _forward_source(specs: Sequence[LayerSpec], bias: bool) -> str:
    """``_forward`` with :func:`hbnn.density.kernel._forward`'s signature and result (``H[1:]``)."""
    layers = _layers(specs, bias)
    lines = [_DECORATOR, "def _forward(W, H, X, g, n8, R, D, lay, n_layers, bias):",
             "    x = X[g * D * R: (g + 1) * D * R]"]
    w_at = 0
    for li, (n_in, n_out) in enumerate(layers):
        # The weights as locals: stores into H could alias W, so LLVM would reload them in every row.
        for k in range((n_in + int(bias)) * n_out):
            lines.append(f"    w{li}_{k} = W[{w_at + k}]")
        source = "x" if li == 0 else f"H[{li}]"
        lines.append("    for r in range(n8):")
        for i in range(n_in):
            lines.append(f"        v{i} = {source}[{i} * R + r]")
        for j in range(n_out):
            terms = [f"w{li}_{i * n_out + j} * v{i}" for i in range(n_in)]
            if bias:
                terms.append(f"w{li}_{n_in * n_out + j}")
            lines.append(f"        H[{li + 1}, {j} * R + r] = {' + '.join(terms)}")
        if li < len(layers) - 1:
            lines.append(f"    _activation_inplace(H[{li + 1}], {n_out} * R)")
        w_at += (n_in + int(bias)) * n_out
    return "\n".join(lines) + "\n"


def _backward_source(specs: Sequence[LayerSpec], bias: bool) -> str:
    """``_backward`` with :func:`hbnn.density.kernel._backward`'s signature and effect on ``gW``: one loop over rows,
    every unit's backpropagated gradient in registers, every weight's gradient its own accumulator."""
    layers = _layers(specs, bias)
    sizes = _sizes(specs)
    starts, at = [w_at for _, w_at in sizes], sum(size for size, _ in sizes)
    lines = [_DECORATOR, "def _backward(W, gW, H, delta, back, X, g, n8, R, D, lay, n_layers, bias):",
             "    x = X[g * D * R: (g + 1) * D * R]"]
    lines += [f"    w{k} = W[{k}]" for k in range(at)]
    lines += [f"    acc{k} = _F0" for k in range(at)]
    lines.append("    for r in range(n8):")
    lines.append(f"        d{len(layers) - 1}_0 = delta[r]")
    for li in range(len(layers) - 1, -1, -1):
        n_in, n_out = layers[li]
        source = "x" if li == 0 else f"H[{li}]"
        for i in range(n_in):
            lines.append(f"        a{li}_{i} = {source}[{i} * R + r]")
        for j in range(n_out):
            for i in range(n_in):
                lines.append(f"        acc{starts[li] + i * n_out + j} += a{li}_{i} * d{li}_{j}")
            if bias:
                lines.append(f"        acc{starts[li] + n_in * n_out + j} += d{li}_{j}")
        if li > 0:
            for i in range(n_in):
                total = " + ".join(f"w{starts[li] + i * n_out + j} * d{li}_{j}" for j in range(n_out))
                lines.append(f"        d{li - 1}_{i} = ({total}) * _activation_slope(a{li}_{i})")
    lines += [f"    gW[{k}] += acc{k}" for k in range(at)]
    return "\n".join(lines) + "\n"


def _sizes(specs: Sequence[LayerSpec]) -> list[tuple[int, int]]:
    """Each layer's ``(weights, start in a group's weights)`` of ``specs``."""
    sizes = [s.size for s in specs]
    return list(zip(sizes, itertools.accumulate(sizes[:-1], initial=0), strict=True))


def _layer_at(li: int, size: int, z: bool) -> list[str]:
    """Lines that read layer ``li``'s start in the flat vector (``a``) and, with ``z``, its group sd and group
    ``g``'s ``z`` (hierarchical)."""
    lines = [f"        a = int(lay[_PER_LAYER * {li} + 2])"]
    if z:
        lines += [f"        z = int(lay[_PER_LAYER * {li} + 4]) + g * {size}", f"        sd = sds[{li}]"]
    return lines


def _by_kind(signature: str, sizes: list[tuple[int, int]], hierarchical, flat, informed, tail: tuple = ()) -> str:
    """A function of the kernel's three kinds: ``signature``, then one branch per kind whose lines for each layer
    ``li`` (``size`` weights from ``w_at`` in a group's) are ``branch(li, size, w_at)``, after the layer's start
    in the flat vector (``a``; hierarchical: also ``z`` and ``sd``); then ``tail``."""
    lines = [_DECORATOR, signature]
    for test, branch, z in (("if kind == HIERARCHICAL:", hierarchical, True), ("elif kind == FLAT:", flat, False),
                            ("else:", informed, False)):
        lines.append(f"    {test}")
        for li, (size, w_at) in enumerate(sizes):
            lines += _layer_at(li, size, z) + branch(li, size, w_at)
    return "\n".join([*lines, *tail]) + "\n"


def _weights_source(specs: Sequence[LayerSpec]) -> str:
    """``_group_weights`` with :func:`hbnn.density.kernel._group_weights`' signature and effect, each layer's loop of a
    constant length: with lengths read at run time, short loops run mostly as scalar remainders (written out, the
    same values take less time: benchmarks/FINDINGS.md, section 'Measurements behind code comments'). The loops
    index slices from 0 (:func:`_slices`)."""
    sizes = _sizes(specs)
    return _by_kind(
        "def _group_weights(theta, W, gW, g, buf, lay, n_layers, bias, kind, sds):", sizes,
        lambda li, size, w_at: [*_slices(size, ta=("theta", "a"), tz=("theta", "z"), wl=("W", w_at)),
                                f"        for k in range({size}):", "            wl[k] = ta[k] + sd * tz[k]"],
        lambda li, size, w_at: [*_slices(size, ta=("theta", "a"), wl=("W", w_at)),
                                f"        for k in range({size}):", "            wl[k] = ta[k]"],
        _informed_weights,
        tail=(f"    for k in range({sum(size for size, _ in sizes)}):", "        gW[k] = _F0"))


def _chain_rule_source(specs: Sequence[LayerSpec]) -> str:
    """``_group_chain_rule`` with :func:`hbnn.density.kernel._group_chain_rule`'s signature and effect, each layer's
    loop of a constant length. (The hierarchical layers' loop does not use slices (:func:`_slices`): that is
    faster, but moves the first group's first ``z`` of each layer by an ulp, which would draw other chains.)"""
    return _by_kind(
        "def _group_chain_rule(theta, grad, gW, g, buf, lay, n_layers, bias, kind, sds, g_sd):",
        _sizes(specs),
        lambda li, size, w_at: ["        acc = 0.0", f"        for k in range({size}):",
                                f"            gw = gW[{w_at} + k]", "            grad[a + k] += gw",
                                "            grad[z + k] += sd * gw",
                                "            acc += gw * theta[z + k]", f"        g_sd[{li}] += sd * acc"],
        lambda li, size, w_at: [*_slices(size, ga=("grad", "a"), gl=("gW", w_at)),
                                f"        for k in range({size}):", "            ga[k] += gl[k]"],
        lambda li, size, w_at: [f"        chol = buf[int(lay[_PER_LAYER * {li} + 4]):]",  # d/dz = L^T gW
                                f"        for k in range({size}):", f"            gw = gW[{w_at} + k]",
                                "            for m in range(k + 1):",
                                f"                grad[a + m] += chol[k * {size} + m] * gw"])


def _slices(size: int, **starts: tuple[str, str | int]) -> list[str]:
    """Lines that bind each name to ``size`` values of an array from a start (``ta=("theta", "a")``: ``ta =
    theta[a: a + size]``). Loops over these, indexed from 0, are faster than loops that index ``theta[a + k]``
    with a start read at run time, with the same bits (measured: benchmarks/FINDINGS.md, section 'Measurements
    behind code comments')."""
    return [f"        {name} = {array}[{at}: {at} + {size}]" for name, (array, at) in starts.items()]


def _informed_weights(li: int, size: int, w_at: int) -> list[str]:
    """An informed layer's ``W = mean + L @ z`` (:func:`hbnn.density.kernel._mean_plus_chol`) with one accumulator per
    weight, over the columns of ``L``. Row by row, each weight's sum is a chain of dependent adds that bounds
    the loop; column by column the chains run side by side (measured: benchmarks/FINDINGS.md, section
    'Measurements behind code comments'). Each sum adds the same products in the same order (``L``'s zeros above
    the diagonal add exact zeros), but fastmath lets LLVM fuse other multiply-adds, so a float64 sum can differ in
    its last bit; rounded to the float32 weights that changes a gradient rarely (same section)."""
    lines = [f"        mean = buf[int(lay[_PER_LAYER * {li} + 3]):]",
             f"        chol = buf[int(lay[_PER_LAYER * {li} + 4]):]"]
    lines += [f"        m{k} = mean[{k}]" for k in range(size)]
    lines += [f"        for j in range({size}):", "            zj = theta[a + j]"]
    lines += [f"            m{k} += chol[{k * size} + j] * zj" for k in range(size)]
    return lines + [f"        W[{w_at + k}] = m{k}" for k in range(size)]


# the passes, as hbnn.density.kernel loops them
GENERIC = ("_forward", "_backward", "_group_weights", "_group_chain_rule")


def module_source(n_features: int, hidden: tuple[int, ...], bias: bool, likelihood: str, activation: str,
                  generic: bool = False) -> str:
    """The module of one model's log density.

    Parameters
    ----------
    n_features, hidden, bias
        The network: features, hidden widths, bias rows.
    likelihood, activation : str
        Registered names whose compiled source the module binds (``_likelihood_rows``; ``_activation_inplace`` and
        ``_activation_slope``).
    generic : bool, default False
        Take :mod:`hbnn.density.kernel`'s own loops (:data:`GENERIC`) for the passes even where they could be written
        out (always past :data:`MAX_WEIGHTS` weights per group).

    Returns
    -------
    str
        The activation's and the likelihood's compiled source, the passes, then :mod:`hbnn.density.kernel`'s
        functions around them (from its source as imported, :data:`hbnn.density.kernel.SOURCE`, not as the file may
        read now).
    """
    specs = layer_specs(n_features, hidden, bias)
    if generic or sum(s.size for s in specs) > MAX_WEIGHTS:
        passes = [modules.function_source(kernel.SOURCE, name) for name in GENERIC]
    else:
        passes = [_forward_source(specs, bias), _backward_source(specs, bias), _weights_source(specs),
                  _chain_rule_source(specs)]
    return "\n".join([
        f'"""hbnn.density.kernel for {n_features} features, hidden layers {list(hidden)}, bias {bias}, likelihood '
        f'{likelihood}, activation {activation}: written by hbnn.density.written; do not edit."""',
        *_kernel_header(),
        "from hbnn.density.kernel import _HEADER, _PER_LAYER, FLAT, HIERARCHICAL, INFORMED, _mean_plus_chol",
        "from hbnn.density.numerics import _F0, _F1, ROW_DTYPE",
        "",
        modules.compiled(activations.get(activation).compiled_source),
        modules.compiled(likelihoods.get(likelihood).density_source),
        *passes,
        modules.function_source(kernel.SOURCE, "_output"),
        modules.function_source(kernel.SOURCE, "_group_loglik"),
        modules.function_source(kernel.SOURCE, "logp_grad"),
    ])


def _kernel_header() -> list[str]:
    """The lines every written module starts with: the hash of :mod:`hbnn.density.kernel`'s,
    :mod:`hbnn.density.callbacks`' and :mod:`hbnn.density.numerics`' whole sources (numba's cache checks the written
    file's time stamp only, not the functions it imports, so the module's name, a hash of its source, must change with
    anything in them) and the imports."""
    digest = hashlib.sha256(_KERNEL_SOURCES.encode()).hexdigest()
    return [f"# hbnn.density.kernel, callbacks and numerics source sha256 {digest}",
            "import math", "import numba", "import numpy as np"]


def expand_source() -> str:
    """The source of a module holding nutpie's expand callback, compiled with numba's disk cache.

    Returns
    -------
    str
        :func:`hbnn.density.callbacks.expand` behind :func:`hbnn.density.callbacks._expand_callback`: one module for
        every network, since the buffer describes the layout.
    """
    return "\n".join([
        '"""nutpie\'s expand callback: written by hbnn.density.written; do not edit."""',
        *_kernel_header(),
        "from hbnn.density.callbacks import _EXPAND_SIG",
        "from hbnn.density.kernel import _HEADER, _PER_LAYER, HIERARCHICAL, INFORMED, _mean_plus_chol",
        "",
        modules.function_source(callbacks.SOURCE, "expand"),
        modules.function_source(callbacks.SOURCE, "_expand_callback"),
        "expand_callback = numba.cfunc(_EXPAND_SIG, cache=True)(_expand_callback)",
        "",
    ])


# what the written modules compile or import: hbnn.density.kernel's and callbacks' functions and signatures and the
# numerics they inline, as imported
_KERNEL_SOURCES = kernel.SOURCE + callbacks.SOURCE + Path(numerics.__file__).read_text()


def _network_module(n_features: int, hidden: tuple[int, ...], bias: bool, likelihood: str, activation: str,
                    generic: bool = False) -> tuple[str, str]:
    """``(name, source)`` of the written module for this model (:func:`module_source`)."""
    source = module_source(n_features, hidden, bias, likelihood, activation, generic)
    return "hbnn_kernel_" + hashlib.sha256(source.encode()).hexdigest()[:20], source


@functools.cache
def logp_grad_for(n_features: int, hidden: tuple[int, ...], bias: bool, likelihood: str, activation: str,
                  generic: bool = False):
    """``logp_grad`` for this model, from its written module (:func:`module_source`).

    Parameters
    ----------
    n_features, hidden, bias, likelihood, activation
        The model, as for :func:`module_source`.
    generic : bool, default False
        As for :func:`module_source`.

    Returns
    -------
    numba.core.registry.CPUDispatcher
        With :func:`hbnn.density.kernel.logp_grad`'s signature, loaded as :func:`hbnn.density.modules.load` says.
    """
    hidden = tuple(int(h) for h in hidden)
    with modules.LOADING:
        return modules.load(*_network_module(n_features, hidden, bias, likelihood, activation, generic),
                            "logp_grad").logp_grad


def callback_source(network: str, skip: int) -> str:
    """The source of a module holding nutpie's logp callback, compiled with numba's disk cache.

    Parameters
    ----------
    network : str
        The name of the written module whose ``logp_grad`` the callback calls.
    skip : int
        How many float64 slots into ``user_data`` the buffer starts.

    Returns
    -------
    str
        :data:`hbnn.density.callbacks.CALLBACK_SOURCE` with ``SKIP`` and ``logp_grad`` bound.
    """
    return "\n".join([
        f'"""nutpie\'s logp callback over {network}, buffer at slot {skip}: written by hbnn.density.written; '
        'do not edit."""',
        "import numba",
        "import numpy as np",
        "from hbnn.density.callbacks import _C_SIG",
        f"from {network} import logp_grad",
        "",
        f"SKIP = {int(skip)}",
        "",
        "",
        callbacks.CALLBACK_SOURCE,
        "",
        "logp_callback = numba.cfunc(_C_SIG, cache=True)(logp_callback)",
        "",
    ])


@functools.cache
def callback_for(n_features: int, hidden: tuple[int, ...], bias: bool, likelihood: str, activation: str, skip: int):
    """nutpie's logp callback for this model, loaded from numba's disk cache after its first compile.

    The callback is :func:`hbnn.density.callbacks.callback`'s around :func:`logp_grad_for`; later processes that sample
    skip its compile. The cached callback computes the same bits as the one compiled in the process that wrote the
    cache (tests/test_kernel.py runs three processes on one fresh cache).

    Parameters
    ----------
    n_features, hidden, bias, likelihood, activation
        The model, as for :func:`module_source`.
    skip : int
        How many float64 slots into ``user_data`` the buffer starts.

    Returns
    -------
    numba.core.ccallback.CFunc
    """
    hidden = tuple(int(h) for h in hidden)
    logp_grad_for(n_features, hidden, bias, likelihood, activation)  # the module the callback imports, loaded first
    network, _ = _network_module(n_features, hidden, bias, likelihood, activation)
    source = callback_source(network, skip)
    name = "hbnn_callback_" + hashlib.sha256(source.encode()).hexdigest()[:20]
    with modules.LOADING:
        return modules.load(name, source, "logp_callback", depends=(network,)).logp_callback


@functools.cache
def expand_callback():
    """nutpie's expand callback (:func:`expand_source`), loaded from numba's disk cache after its first compile.

    Returns
    -------
    numba.core.ccallback.CFunc
    """
    source = expand_source()
    name = "hbnn_expand_" + hashlib.sha256(source.encode()).hexdigest()[:20]
    with modules.LOADING:
        return modules.load(name, source, "expand_callback").expand_callback
